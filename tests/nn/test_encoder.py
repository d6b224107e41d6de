"""Encoder layer and stack: scan vs unrolled, remat gradients, dtypes, padding, sharing."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flaxdoc.nn.attention import DenseSelfAttention
from flaxdoc.nn.encoder import DenseGelu, Encoder, EncoderLayer, remat_policy_from_name
from flaxdoc.nn.etc_attention import EtcAttention
from flaxdoc.nn.layout_terms import GaussianTerm, PolarTerm, RichAttentionTerm, layout_geometry

B, G, N, E, H, L = 2, 1, 9, 16, 2, 2
DH = E // H

ETC = functools.partial(EtcAttention, num_heads=H, local_radius=2, num_globals=G,
                        relative_positions=True)
DENSE = functools.partial(DenseSelfAttention, num_heads=H)
RICH = functools.partial(RichAttentionTerm, num_heads=H, head_dim=DH)


def _inputs(seed=0):
  """`x [B, G+N, E]` (global first), mask with padding in row 1, geometry."""
  rng = np.random.default_rng(seed)
  t = G + N
  x0 = rng.integers(0, 900, (B, t))
  y0 = rng.integers(0, 950, (B, t))
  boxes = np.stack([x0, y0, x0 + 50, y0 + 20], -1).astype(np.float32)
  mask = np.ones((B, t), bool)
  mask[1, 7:] = False
  geom = layout_geometry(boxes, mask, distance_buckets=4)
  x = rng.normal(size=(B, t, E)).astype(np.float32)
  return rng, jnp.asarray(x), jnp.asarray(mask), geom


def _encoder(**kwargs):
  defaults = dict(num_layers=L, attention=ETC, mlp_dim=32, dropout_rate=0.1,
                  layer_terms=(RICH,), shared_terms=(GaussianTerm(num_heads=H),))
  defaults.update(kwargs)
  return Encoder(**defaults)


def _random_params(model, *args, seed=0):
  """Random parameters of the right shapes via `eval_shape` (no init compile)."""
  rng = np.random.default_rng(seed)
  shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), *args))
  return jax.tree_util.tree_map(
      lambda s: (0.2 * rng.normal(size=s.shape) + 0.05).astype(np.float32), shapes)


def _stack_layers(params):
  """Unrolled `layer_{i}` trees -> one `layers` tree with a leading [L] axis."""
  params = dict(params)
  layers = [params.pop(f"layer_{i}") for i in range(L)]
  params["layers"] = jax.tree_util.tree_map(lambda *xs: np.stack(xs), *layers)
  return params


def test_parameter_trees_and_logical_axes():
  _, x, mask, geom = _inputs()
  unrolled = jax.eval_shape(_encoder().init, jax.random.key(0), x, mask, geom)["params"]
  assert set(unrolled) == {"layer_0", "layer_1", "shared_term_0"}
  assert "shared_term_0" not in unrolled["layer_0"]  # shared: one copy, at the top
  assert set(unrolled["layer_0"]) == {"attention", "attention_norm", "mlp_in", "mlp_out",
                                      "mlp_norm", "term_0"}
  assert unrolled["layer_0"]["mlp_in"]["kernel"].names == ("embed", "mlp")
  assert unrolled["layer_0"]["attention"]["relative_table"].value.shape == (27, H, DH)
  scanned = jax.eval_shape(_encoder(scan_layers=True).init, jax.random.key(0), x, mask,
                           geom)["params"]
  assert set(scanned) == {"layers", "shared_term_0"}
  kernel = scanned["layers"]["mlp_in"]["kernel"]
  assert kernel.names == ("layers", "embed", "mlp") and kernel.value.shape == (L, E, 32)
  assert scanned["layers"]["term_0"]["w_q"].value.shape == (L, H, DH, 2)
  assert scanned["shared_term_0"]["mu_rho"].value.shape == (H,)


class _ScaledTerm(nn.Module):
  """A wrapper term whose inner term is made in `setup` and shares its scope."""
  make_term: functools.partial

  def setup(self):
    self.inner = self.make_term()
    nn.share_scope(self, self.inner)

  def __call__(self, q, k, q_geom, k_geom):
    return 0.5 * self.inner(q, k, q_geom, k_geom)


@pytest.mark.parametrize("scan", [False, True])
def test_shared_wrapper_terms_get_their_inner_parameters(scan):
  _, x, mask, geom = _inputs()
  wrapped = _ScaledTerm(make_term=functools.partial(GaussianTerm, num_heads=H))
  model = _encoder(shared_terms=(wrapped,), scan_layers=scan)
  variables = jax.eval_shape(model.init, jax.random.key(0), x, mask, geom)
  assert set(variables["params"]["shared_term_0"]) == {"mu_rho", "mu_theta", "sigma_rho",
                                                        "sigma_theta"}
  assert jax.eval_shape(model.apply, variables, x, mask, geom).shape == x.shape


@pytest.fixture(scope="module")
def etc_unrolled():
  """Random parameters and a jitted apply for the unrolled ETC encoder."""
  _, x, mask, geom = _inputs()
  model = _encoder()
  params = _random_params(model, x, mask, geom)
  return params, jax.jit(model.apply)


def test_scan_equals_unrolled_with_restacked_params(etc_unrolled):
  params, apply = etc_unrolled
  _, x, mask, geom = _inputs()
  unrolled = np.asarray(apply(params, x, mask, geom))
  scanned = jax.jit(_encoder(scan_layers=True).apply)(
      {"params": _stack_layers(params["params"])}, x, mask, geom)
  np.testing.assert_allclose(np.asarray(scanned), unrolled, rtol=1e-5, atol=1e-5)
  assert np.all(np.isfinite(unrolled))


def test_padded_tokens_never_change_real_outputs(etc_unrolled):
  params, apply = etc_unrolled
  rng, x, mask, geom = _inputs()
  base = np.asarray(apply(params, x, mask, geom))
  pad = ~np.asarray(mask)
  x2 = np.asarray(x).copy()
  x2[pad] = 50 * rng.normal(size=(int(pad.sum()), E))
  geom2 = {k: np.asarray(v).copy() for k, v in geom.items()}
  geom2["boxes"][pad] = [0, 0, 1000, 1000]
  geom2["centers"][pad] = 500
  other = np.asarray(apply(params, jnp.asarray(x2), mask, geom2))
  np.testing.assert_allclose(other[np.asarray(mask)], base[np.asarray(mask)], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("policy", ["nothing_saveable",
                                    pytest.param("dots_saveable", marks=pytest.mark.slow)])
def test_remat_gives_the_same_gradients_with_dropout(policy):
  """scan + remat vs scan alone, dense attention, per-layer and shared terms, dropout on."""
  _, x, mask, geom = _inputs(1)
  kwargs = dict(attention=DENSE, scan_layers=True, layer_terms=(RICH,),
                shared_terms=(PolarTerm(head_dim=DH),))
  plain = _encoder(**kwargs)
  params = _random_params(plain, x, mask, geom)
  # "rbg" keys: same semantics, much quicker to compile than threefry on CPU.
  rngs = {"dropout": jax.random.key(3, impl="rbg")}

  def grads(model):
    def loss(p):
      out = model.apply(p, x, mask, geom, deterministic=False, rngs=rngs)
      return jnp.sum(jnp.where(mask[..., None], out, 0.0) ** 2)
    return jax.tree_util.tree_map(np.asarray, jax.jit(jax.grad(loss))(params))

  want = grads(plain)
  got = grads(_encoder(remat=True, remat_policy=policy, **kwargs))
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                         got, want)
  # The shared Polar tables and the per-layer Rich parameters all receive gradient.
  assert np.any(want["params"]["shared_term_0"]["table_angle"] != 0)
  assert np.all(np.any(want["params"]["layers"]["term_0"]["w_q"] != 0, axis=(1, 2, 3)))


def test_bfloat16_forward_and_backward():
  _, x, mask, geom = _inputs(2)
  model = _encoder(dtype=jnp.bfloat16, num_layers=1)
  params = _random_params(model, x, mask, geom)

  def loss(p):
    out = model.apply(p, x, mask, geom)
    return jnp.sum(jnp.where(mask[..., None], out.astype(jnp.float32), 0.0) ** 2), out

  (value, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  assert out.dtype == jnp.bfloat16
  assert np.isfinite(float(value))
  for g in jax.tree_util.tree_leaves(grads):
    assert g.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(g)))


def test_standalone_layer_owns_its_shared_terms_and_dropout_is_seeded():
  _, x, mask, geom = _inputs(3)
  layer = EncoderLayer(attention=DENSE, mlp_dim=32, dropout_rate=0.5,
                       shared_terms=(GaussianTerm(num_heads=H),))
  shapes = jax.eval_shape(layer.init, jax.random.key(0), x, mask, geom)["params"]
  assert "shared_term_0" in shapes
  params = _random_params(layer, x, mask, geom)
  run = jax.jit(functools.partial(layer.apply, deterministic=False))
  key = functools.partial(jax.random.key, impl="rbg")
  a = np.asarray(run(params, x, mask, geom, rngs={"dropout": key(1)}))
  b = np.asarray(run(params, x, mask, geom, rngs={"dropout": key(1)}))
  c = np.asarray(run(params, x, mask, geom, rngs={"dropout": key(2)}))
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, c)


def test_clear_errors():
  _, x, mask, geom = _inputs()
  with pytest.raises(ValueError, match="remat policy"):
    remat_policy_from_name("save_everything_please")
  assert remat_policy_from_name("none") is None
  assert remat_policy_from_name("dots_saveable") is jax.checkpoint_policies.dots_saveable
  with pytest.raises(ValueError, match="mask"):
    jax.eval_shape(_encoder().init, jax.random.key(0), x, mask[:, :-1], geom)


def test_other_attention_modules_fit_the_layer_signature():
  linformer = pytest.importorskip("flaxdoc.nn.linformer")
  _, x, mask, _ = _inputs()
  model = Encoder(num_layers=1, mlp_dim=32, attention=functools.partial(
      linformer.LinformerAttention, num_heads=H, max_length=16, proj_length=4))
  out = jax.eval_shape(lambda: model.init_with_output(jax.random.key(0), x, mask)[0])
  assert out.shape == x.shape


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_dense_gelu_is_nn_dense_then_the_erf_gelu(dtype):
  """Same parameter tree (names, shapes, initial values) as `nn.Dense`, and the same values
  and gradients as `nn.gelu(nn.Dense(x))`: only what the backward keeps differs."""
  x = jax.random.normal(jax.random.key(0), (2, 5, 16))
  dense, fused = nn.Dense(24, dtype=dtype), DenseGelu(24, dtype=dtype)
  params = dense.init(jax.random.key(1), x)
  fused_params = fused.init(jax.random.key(1), x)
  assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, fused_params)
  assert jax.tree.all(jax.tree.map(jnp.array_equal, params, fused_params))
  params = jax.tree.map(lambda p: p + 0.1, params)  # a non-zero bias

  def loss(apply, p, x):
    return jnp.sum(jnp.sin(apply(p, x).astype(jnp.float32)))
  ref = lambda p, x: nn.gelu(dense.apply(p, x), approximate=False)  # noqa: E731
  (v, g), (rv, rg) = (jax.value_and_grad(loss, argnums=(1, 2))(f, params, x)
                      for f in (fused.apply, ref))
  tol = 1e-6 if dtype == jnp.float32 else 2e-2
  np.testing.assert_allclose(v, rv, rtol=tol)
  for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(rg)):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                               rtol=tol, atol=tol)
