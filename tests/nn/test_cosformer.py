"""Tests for flaxdoc.nn.cosformer: linear form vs explicit N x N re-weighted attention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from jax.extend import core as jex_core

from flaxdoc.nn.cosformer import CosformerAttention, combine_cross, linear_attention

BATCH, LENGTH, WIDTH, HEADS = 2, 10, 12, 3
EPS = 1e-4


def np_weighted_attention(p, x, mask, bias):
  """Quadratic reference: s_ij = relu(q_i).relu(k_j) B_ij over real keys, normalised.

  Returns the per-head context `[B, N, H, D]` (before the output projection).
  """
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
  proj = lambda name: np.einsum("bne,ehd->bnhd", x, p[name]["kernel"]) + p[name]["bias"]
  q = np.maximum(proj("query"), 0)
  k = np.maximum(proj("key"), 0)
  v = proj("value")
  ctx = np.zeros_like(v)
  for b in range(x.shape[0]):
    for h in range(HEADS):
      s = (q[b, :, h] @ k[b, :, h].T) * bias[b] * mask[b][None, :]  # [N, N]
      ctx[b, :, h] = (s @ v[b, :, h]) / np.maximum(s.sum(-1), EPS)[:, None]
  return ctx


def np_output(p, ctx):
  return (np.einsum("bnhd,hde->bne", ctx, np.asarray(p["out"]["kernel"], np.float64))
          + np.asarray(p["out"]["bias"], np.float64))


def bias_1d(positions, m):
  d = positions[:, :, None] - positions[:, None, :]
  return np.cos(np.pi / (2 * m) * d)


def bias_axis(coords, extent=1000.0):
  d = coords[:, :, None] - coords[:, None, :]
  return np.cos(np.pi / 2 * d / extent)


def make_case(seed=0, **kwargs):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(BATCH, LENGTH, WIDTH)).astype(np.float32)
  mask = np.ones((BATCH, LENGTH), bool)
  mask[1, -4:] = False
  centers = rng.uniform(0, 1000, (BATCH, LENGTH, 2)).astype(np.float32)
  module = CosformerAttention(num_heads=HEADS, **kwargs)
  geom = {"centers": centers}
  variables = jax.jit(module.init)(jax.random.key(seed), x, mask, geom=geom)
  variables = jax.tree.map(lambda a: a * 10.0, nn.unbox(variables))  # far from uniform
  return module, variables, x, mask, centers


@pytest.mark.parametrize("reweight", ["none", "1d", "squircle"])
def test_linear_form_equals_quadratic_reference(reweight):
  module, variables, x, mask, centers = make_case(1, reweight=reweight)
  got = np.asarray(jax.jit(module.apply)(variables, x, mask, geom={"centers": centers}))
  if reweight == "none":
    bias = np.ones((BATCH, LENGTH, LENGTH))
  elif reweight == "1d":
    bias = bias_1d(np.broadcast_to(np.arange(LENGTH, dtype=float), (BATCH, LENGTH)), LENGTH)
  else:
    bias = bias_axis(centers[..., 0].astype(float)) * bias_axis(centers[..., 1].astype(float))
  want = np_output(variables["params"], np_weighted_attention(variables["params"], x, mask, bias))
  np.testing.assert_allclose(got[mask], want[mask], rtol=2e-4, atol=2e-5)
  assert np.isfinite(got).all()


def test_squircle_extent_for_page_stacked_centres():
  module, variables, x, mask, centers = make_case(10, reweight="squircle", extent=3000.0)
  centers = centers.copy()
  centers[..., 1] += 1000.0 * np.random.default_rng(11).integers(0, 3, (BATCH, LENGTH))
  got = np.asarray(jax.jit(module.apply)(variables, x, mask, geom={"centers": centers}))
  c = centers.astype(float)
  bias = bias_axis(c[..., 0], 3000.0) * bias_axis(c[..., 1], 3000.0)
  assert bias.min() >= 0  # weights stay non-negative across pages
  want = np_output(variables["params"], np_weighted_attention(variables["params"], x, mask, bias))
  np.testing.assert_allclose(got[mask], want[mask], rtol=2e-4, atol=2e-5)


def test_1d_uses_geom_positions_and_configured_m():
  module, variables, x, mask, _ = make_case(2, reweight="1d", max_length=64)
  positions = np.random.default_rng(3).permutation(40)[:BATCH * LENGTH].reshape(BATCH, LENGTH)
  got = np.asarray(jax.jit(module.apply)(variables, x, mask, geom={"positions": positions}))
  bias = bias_1d(positions.astype(float), 64)
  want = np_output(variables["params"], np_weighted_attention(variables["params"], x, mask, bias))
  np.testing.assert_allclose(got[mask], want[mask], rtol=2e-4, atol=2e-5)


def test_cross_is_the_larger_magnitude_of_two_axis_attentions():
  module, variables, x, mask, centers = make_case(4, reweight="cross")
  got = np.asarray(jax.jit(module.apply)(variables, x, mask, geom={"centers": centers}))
  p = variables["params"]
  ctx_x = np_weighted_attention(p, x, mask, bias_axis(centers[..., 0].astype(float)))
  ctx_y = np_weighted_attention(p, x, mask, bias_axis(centers[..., 1].astype(float)))
  ctx = np.where(np.abs(ctx_x) >= np.abs(ctx_y), ctx_x, ctx_y)
  np.testing.assert_allclose(got[mask], np_output(p, ctx)[mask], rtol=2e-4, atol=2e-5)
  # It is an approximation of max(cos dx, cos dy), not the same thing.
  c = centers.astype(float)
  exact = np.maximum(bias_axis(c[..., 0]), bias_axis(c[..., 1]))
  ctx_exact = np_weighted_attention(p, x, mask, exact)
  assert not np.allclose(np_output(p, ctx_exact)[mask], got[mask], atol=1e-3)


@pytest.mark.parametrize("reweight", ["1d", "squircle", "cross"])
def test_padding_never_changes_real_outputs(reweight):
  module, variables, x, mask, centers = make_case(5, reweight=reweight)
  apply = jax.jit(module.apply)
  base = np.asarray(apply(variables, x, mask, geom={"centers": centers}))
  rng = np.random.default_rng(6)
  x2 = np.where(mask[..., None], x, 1e3 * rng.normal(size=x.shape)).astype(np.float32)
  c2 = np.where(mask[..., None], centers, np.nan).astype(np.float32)
  got = np.asarray(apply(variables, x2, mask, geom={"centers": c2}))
  np.testing.assert_array_equal(got[mask], base[mask])
  assert np.isfinite(got).all()


def test_linear_attention_matches_any_sum_of_products():
  rng = np.random.default_rng(7)
  q = np.maximum(rng.normal(size=(2, 6, 2, 3)), 0)
  k = np.maximum(rng.normal(size=(2, 8, 2, 3)), 0)
  v = rng.normal(size=(2, 8, 2, 5))
  fq = rng.uniform(0.1, 1, (2, 6, 3))
  fk = rng.uniform(0.1, 1, (2, 8, 3))
  got = linear_attention(*(jnp.asarray(a, jnp.float32) for a in (q, k, v, fq, fk)))
  s = np.einsum("bnhd,bmhd->bhnm", q, k) * np.einsum("bnr,bmr->bnm", fq, fk)[:, None]
  denominator = np.maximum(s.sum(-1), EPS).transpose(0, 2, 1)  # [B, N, H]
  want = np.einsum("bhnm,bmhe->bnhe", s, v) / denominator[..., None]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # A query with phi(q) = 0 has a clamped denominator: zero output, not NaN.
  zero = linear_attention(jnp.zeros_like(q, jnp.float32), *(jnp.asarray(a, jnp.float32)
                                                          for a in (k, v, fq, fk)))
  np.testing.assert_array_equal(zero, 0.0)


def test_combine_cross_keeps_larger_magnitude():
  a = jnp.array([1.0, -3.0, 0.5, -2.0])
  b = jnp.array([-2.0, 1.0, 0.5, 2.0])
  np.testing.assert_array_equal(combine_cross(a, b), [-2.0, -3.0, 0.5, -2.0])


def all_shapes(jaxpr):
  for eqn in jaxpr.eqns:
    yield from (v.aval.shape for v in eqn.outvars)
    for param in eqn.params.values():
      for sub in (param if isinstance(param, (tuple, list)) else (param,)):
        if isinstance(sub, jex_core.ClosedJaxpr):
          yield from all_shapes(sub.jaxpr)
        elif isinstance(sub, jex_core.Jaxpr):
          yield from all_shapes(sub)


@pytest.mark.parametrize("reweight", ["1d", "squircle", "cross"])
def test_cost_is_linear_no_n_by_n_intermediate(reweight):
  module, variables, x, mask, centers = make_case(8, reweight=reweight)
  jaxpr = jax.make_jaxpr(module.apply)(variables, x, mask, geom={"centers": centers})
  shapes = list(all_shapes(jaxpr.jaxpr))
  assert len(shapes) > 20
  assert not any(sum(d == LENGTH for d in s) >= 2 for s in shapes)


def test_errors_and_signature():
  module, variables, x, mask, centers = make_case(9, reweight="squircle")
  with pytest.raises(ValueError, match="geom\\['centers'\\]"):
    module.apply(variables, x, mask)
  with pytest.raises(ValueError, match="pairwise layout terms"):
    module.apply(variables, x, mask, terms=(object(),), geom={"centers": centers})
  with pytest.raises(ValueError, match="shape"):
    module.apply(variables, x, mask, geom={"centers": centers[:, :3]})
  with pytest.raises(ValueError, match="reweight"):
    CosformerAttention(num_heads=HEADS, reweight="gauss").init(jax.random.key(0), x, mask)
  bf16 = CosformerAttention(num_heads=HEADS, reweight="squircle", dtype=jnp.bfloat16)
  out = jax.jit(bf16.apply)(variables, x, mask, geom={"centers": centers})
  assert out.dtype == jnp.bfloat16 and out.shape == x.shape
