"""`flaxdoc.nn.dropout`: the hashed mask against a numpy reference, its statistics, the module's
flax.linen.Dropout semantics, and a backward that keeps only the seed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flaxdoc.nn import dropout as dp


def _fmix32_np(x):
  x = np.asarray(x, np.uint64) & 0xFFFFFFFF
  x ^= x >> 16
  x = (x * 0x85EBCA6B) & 0xFFFFFFFF
  x ^= x >> 13
  x = (x * 0xC2B2AE35) & 0xFFFFFFFF
  return x ^ (x >> 16)


def _keep_np(seed, shape, rate):
  """The mask by loops over rows and columns, in numpy's 64-bit integers."""
  rows, cols = int(np.prod(shape[:-1])), shape[-1]
  out = np.zeros((rows, cols), bool)
  base = _fmix32_np(seed)
  for r in range(rows):
    stream = _fmix32_np(base ^ ((r * 0x27D4EB2F) & 0xFFFFFFFF))
    for c in range(cols):
      bits = _fmix32_np(stream ^ ((c * 0x165667B1) & 0xFFFFFFFF))
      out[r, c] = bits >= round(rate * 2 ** 32)
  return out.reshape(shape)


@pytest.mark.parametrize("shape", [(3, 4, 5), (7,), (2, 1, 9)])
def test_keep_mask_matches_a_numpy_loop(shape):
  for seed in (0, 12345, 2 ** 32 - 1):
    got = np.asarray(dp.keep_mask(jnp.uint32(seed), shape, 0.3))
    np.testing.assert_array_equal(got, _keep_np(seed, shape, 0.3))


def test_keep_mask_statistics():
  rate, shape = 0.1, (64, 128, 96)
  masks = [np.asarray(dp.keep_mask(jnp.uint32(s), shape, rate)) for s in (1, 2)]
  n = masks[0].size
  sd = np.sqrt(rate * (1 - rate) / n)
  for m in masks:
    assert abs((1 - m.mean()) - rate) < 5 * sd
    # neighbours along the last axis and across rows are uncorrelated
    a = m.astype(np.float64) - m.mean()
    for x, y in ((a[..., 1:], a[..., :-1]), (a[:, 1:], a[:, :-1]), (a[1:], a[:-1])):
      corr = (x * y).mean() / a.var()
      assert abs(corr) < 5 / np.sqrt(x.size), corr
  # two seeds agree as independent masks would: (1 - r)^2 + r^2
  agree = (masks[0] == masks[1]).mean()
  assert abs(agree - ((1 - rate) ** 2 + rate ** 2)) < 5 * np.sqrt(0.18 * 0.82 / n)


def test_dropout_values_scale_and_gradient():
  x = jax.random.normal(jax.random.key(0), (4, 6, 32))
  seed, rate = jnp.uint32(99), 0.25
  keep = np.asarray(dp.keep_mask(seed, x.shape, rate))
  y = dp.dropout(x, rate, seed)
  np.testing.assert_allclose(y, np.where(keep, np.asarray(x) / (1 - rate), 0), rtol=1e-6)
  w = jax.random.normal(jax.random.key(1), x.shape)
  g = jax.grad(lambda x: jnp.sum(w * dp.dropout(x, rate, seed)))(x)
  np.testing.assert_allclose(g, np.where(keep, np.asarray(w) / (1 - rate), 0), rtol=1e-6)
  # the backward keeps the seed only: no mask, no copy of x
  residuals = jax.tree.leaves(jax.vjp(lambda x: dp.dropout(x, rate, seed), x)[1])
  assert [r.shape for r in residuals] == [()]


def test_dropout_keeps_dtype_and_scales_in_float32():
  """bfloat16 in and out; each kept element is `x / (1 - rate)` computed in float32 and
  rounded once (a scale rounded to bfloat16 first, 1.109375 for 1 / 0.9, would shrink
  every kept element by 0.16%), so the mean over many elements stays at `x`'s."""
  x = (jax.random.normal(jax.random.key(0), (256, 512)) + 3.0).astype(jnp.bfloat16)
  seed, rate = jnp.uint32(5), 0.1
  y = dp.dropout(x, rate, seed)
  assert y.dtype == jnp.bfloat16
  keep = np.asarray(dp.keep_mask(seed, x.shape, rate))
  want = np.where(keep, np.asarray(x, np.float32) / np.float32(1 - rate), 0)
  np.testing.assert_array_equal(np.asarray(y, np.float32),
                                np.asarray(jnp.asarray(want).astype(jnp.bfloat16), np.float32))
  ones = dp.dropout(jnp.ones((256, 512), jnp.bfloat16), rate, seed).astype(jnp.float32)
  assert abs(float(jnp.mean(ones)) - 1.0) < 5 * np.sqrt(rate / (1 - rate) / ones.size)


def test_rate_one_gives_zeros_and_bad_rates_or_dims_are_errors():
  x = jnp.ones((3, 4))
  np.testing.assert_array_equal(dp.dropout(x, 1.0, jnp.uint32(1)), 0 * x)
  with pytest.raises(ValueError, match="rate"):
    dp.dropout(x, 1.5, jnp.uint32(1))
  with pytest.raises(IndexError, match="broadcast dimension 2"):
    dp.dropout(x, 0.5, jnp.uint32(1), broadcast_dims=(2,))
  np.testing.assert_array_equal(dp.dropout(x, 0.5, jnp.uint32(1), broadcast_dims=(-1,)),
                                dp.dropout(x, 0.5, jnp.uint32(1), broadcast_dims=(1,)))


def test_broadcast_dims_share_the_mask():
  x = jnp.ones((3, 5, 8))
  y = np.asarray(dp.dropout(x, 0.5, jnp.uint32(3), broadcast_dims=(1,)))
  assert np.all(y == y[:, :1, :])
  assert 0 < (y == 0).mean() < 1


def test_rate_must_be_below_one_for_the_function():
  with pytest.raises(ValueError, match="rate"):
    dp.drop_threshold(1.0)
  with pytest.raises(ValueError, match="rate"):
    dp.drop_threshold(-0.1)


def test_module_has_flax_dropout_semantics():
  x = jax.random.normal(jax.random.key(0), (4, 16))
  key = jax.random.key(7)
  apply = lambda m, x, **kw: m.apply({}, x, rngs={"dropout": key}, **kw)  # noqa: E731
  np.testing.assert_array_equal(apply(dp.Dropout(0.5), x, deterministic=True), x)
  np.testing.assert_array_equal(apply(dp.Dropout(0.0), x, deterministic=False), x)
  np.testing.assert_array_equal(apply(dp.Dropout(1.0), x, deterministic=False), 0 * x)
  a = apply(dp.Dropout(0.5), x, deterministic=False)
  np.testing.assert_array_equal(a, apply(dp.Dropout(0.5), x, deterministic=False))  # same key
  b = dp.Dropout(0.5).apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(8)})
  assert not np.array_equal(a, b)
  assert set(np.unique(np.asarray(a) / np.asarray(x) * 0.5)) <= {0.0, 1.0}
  with pytest.raises(ValueError):
    dp.Dropout(0.5).apply({}, x, rngs={"dropout": key})  # deterministic given nowhere

  class Two(nn.Module):  # two dropouts in one module draw different masks
    @nn.compact
    def __call__(self, x):
      return dp.Dropout(0.5)(x, deterministic=False), dp.Dropout(0.5)(x, deterministic=False)

  first, second = Two().apply({}, x, rngs={"dropout": key})
  assert not np.array_equal(first, second)


def test_module_passes_broadcast_dims_rng_and_collection():
  x = jax.random.normal(jax.random.key(0), (4, 6, 8))
  key = jax.random.key(3)
  shared = dp.Dropout(0.5, broadcast_dims=(1,)).apply({}, x, deterministic=False,
                                                      rngs={"dropout": key})
  kept = np.asarray(shared) != 0
  assert np.all(kept == kept[:, :1, :]) and 0 < kept.mean() < 1
  # an explicit key, and another stream's name, give that key's mask
  direct = dp.Dropout(0.5).apply({}, x, deterministic=False, rng=key)
  np.testing.assert_array_equal(direct, dp.dropout(x, 0.5, dp.seed_from_key(key)))
  other = dp.Dropout(0.5, rng_collection="noise").apply({}, x, deterministic=False,
                                                        rngs={"noise": key})
  with pytest.raises(Exception, match="dropout"):  # the default stream is not given
    dp.Dropout(0.5).apply({}, x, deterministic=False, rngs={"noise": key})
  assert other.shape == x.shape and np.any(np.asarray(other) == 0)
