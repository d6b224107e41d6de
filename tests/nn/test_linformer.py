"""Tests for flaxdoc.nn.linformer: numpy reference, padding, no N x N intermediate."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from jax.extend import core as jex_core

from flaxdoc.nn.linformer import LinformerAttention

BATCH, WIDTH, HEADS, MAX_LEN, PROJ = 2, 12, 3, 16, 4


def np_linformer(p, x, mask, share_kv=False):
  """Per-batch, per-head Linformer attention in float64 numpy."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
  batch, length, _ = x.shape
  xp = np.zeros((batch, MAX_LEN, WIDTH))
  xp[:, :length] = x
  mp = np.zeros((batch, MAX_LEN), bool)
  mp[:, :length] = mask
  proj = lambda name: np.einsum("bne,ehd->bnhd", xp, p[name]["kernel"]) + p[name]["bias"]
  q, k, v = proj("query"), proj("key"), proj("value")
  k = k * mp[:, :, None, None]
  v = v * mp[:, :, None, None]
  e = p["proj_k"]
  f = e if share_kv else p["proj_v"]
  head_dim = WIDTH // HEADS
  ctx = np.zeros_like(q)
  for b in range(batch):
    for h in range(HEADS):
      k_low = e @ k[b, :, h]  # [k, d]
      v_low = f @ v[b, :, h]
      s = q[b, :, h] @ k_low.T / np.sqrt(head_dim)  # [N, k]
      w = np.exp(s - s.max(-1, keepdims=True))
      w /= w.sum(-1, keepdims=True)
      ctx[b, :, h] = w @ v_low
  out = np.einsum("bnhd,hde->bne", ctx, p["out"]["kernel"]) + p["out"]["bias"]
  return out[:, :length]


def setup_case(length, seed=0, **kwargs):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(BATCH, length, WIDTH)).astype(np.float32)
  mask = np.ones((BATCH, length), bool)
  mask[1, length - 3:] = False
  module = LinformerAttention(num_heads=HEADS, max_length=MAX_LEN, proj_length=PROJ, **kwargs)
  variables = jax.jit(module.init)(jax.random.key(seed), x, mask)
  # Scale the projections up so that the attention is far from uniform.
  variables = nn.unbox(variables)
  variables = jax.tree.map(lambda a: a * 4.0, variables)
  return module, variables, x, mask


@pytest.mark.parametrize("length,share_kv", [(MAX_LEN, False), (11, False), (11, True)])
def test_matches_numpy_reference(length, share_kv):
  module, variables, x, mask = setup_case(length, share_kv=share_kv)
  got = jax.jit(module.apply)(variables, x, mask)
  assert got.shape == (BATCH, length, WIDTH)
  want = np_linformer(variables["params"], x, mask, share_kv=share_kv)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert ("proj_v" in variables["params"]) != share_kv
  assert variables["params"]["proj_k"].shape == (PROJ, MAX_LEN)


def test_padded_tokens_cannot_influence_real_outputs():
  module, variables, x, mask = setup_case(13, seed=1)
  apply = jax.jit(module.apply)
  base = np.asarray(apply(variables, x, mask))
  noisy = np.where(mask[..., None], x, 1e3 * np.random.default_rng(2).normal(size=x.shape))
  got = np.asarray(apply(variables, noisy.astype(np.float32), mask))
  np.testing.assert_array_equal(got[mask], base[mask])


def test_internal_padding_equals_explicit_padding():
  module, variables, x, mask = setup_case(9, seed=3)
  apply = jax.jit(module.apply)
  short = np.asarray(apply(variables, x, mask))
  x_full = np.zeros((BATCH, MAX_LEN, WIDTH), np.float32)
  x_full[:, :9] = x
  m_full = np.zeros((BATCH, MAX_LEN), bool)
  m_full[:, :9] = mask
  full = np.asarray(apply(variables, x_full, m_full))
  np.testing.assert_allclose(full[:, :9], short, rtol=1e-6, atol=1e-6)


def all_shapes(jaxpr):
  """Shapes of every value computed in `jaxpr`, nested jaxprs (pjit, custom_jvp) included."""
  for eqn in jaxpr.eqns:
    yield from (v.aval.shape for v in eqn.outvars)
    for param in eqn.params.values():
      for sub in (param if isinstance(param, (tuple, list)) else (param,)):
        if isinstance(sub, jex_core.ClosedJaxpr):
          yield from all_shapes(sub.jaxpr)
        elif isinstance(sub, jex_core.Jaxpr):
          yield from all_shapes(sub)


def test_cost_is_linear_no_n_by_n_intermediate():
  module, variables, x, mask = setup_case(MAX_LEN, seed=4)
  shapes = list(all_shapes(jax.make_jaxpr(module.apply)(variables, x, mask).jaxpr))
  assert len(shapes) > 20
  assert not any(sum(d == MAX_LEN for d in s) >= 2 for s in shapes), shapes
  # The check itself can fail: a dense [N, N] score matrix is seen.
  dense = jax.make_jaxpr(lambda a: jax.nn.softmax(a @ a.T))(x[0])
  assert any(s == (MAX_LEN, MAX_LEN) for s in all_shapes(dense.jaxpr))


def test_rejects_terms_and_long_inputs():
  module, variables, x, mask = setup_case(MAX_LEN, seed=5)
  with pytest.raises(ValueError, match="pairwise layout terms"):
    module.apply(variables, x, mask, terms=(object(),))
  long_x = np.zeros((BATCH, MAX_LEN + 1, WIDTH), np.float32)
  with pytest.raises(ValueError, match="exceeds max_length"):
    module.apply(variables, long_x, np.ones((BATCH, MAX_LEN + 1), bool))
  with pytest.raises(ValueError, match="mask"):
    module.apply(variables, x, mask[:, :-1])


def test_geom_is_accepted_and_ignored_and_axes_are_annotated():
  module, _, x, mask = setup_case(MAX_LEN, seed=6)
  variables = module.init(jax.random.key(0), x, mask)
  assert variables["params"]["query"]["kernel"].names == ("embed", "heads", "kv")
  geom = {"centers": np.zeros((BATCH, MAX_LEN, 2), np.float32)}
  np.testing.assert_array_equal(module.apply(variables, x, mask, geom=geom),
                                module.apply(variables, x, mask))
  bf16 = LinformerAttention(num_heads=HEADS, max_length=MAX_LEN, proj_length=PROJ,
                            dtype=jnp.bfloat16)
  assert jax.jit(bf16.apply)(variables, x, mask).dtype == jnp.bfloat16
