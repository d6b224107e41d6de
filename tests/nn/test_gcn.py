"""Tests for flaxdoc.nn.gcn: per-node loop reference, masking, permutation equivariance."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from scipy.special import erf

from flaxdoc.layout.edge_features import node_features
from flaxdoc.nn import gcn as gcn_lib
from flaxdoc.nn.gcn import GCNLayer, SuperTokenEncoder, node_spatial_features

BATCH, NODES, K, WIDTH, FEATS = 2, 6, 3, 8, 5
LN_EPS = 1e-6


def np_gelu(x):
  return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def np_layer_norm(x, p):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + LN_EPS) * np.asarray(p["scale"]) + np.asarray(p["bias"])


def np_gcn_layer(p, h, ids, feats, mask):
  """The layer written node by node, edge by edge, from DESIGN §3.3."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
  out = np.zeros_like(h, dtype=np.float64)
  for b in range(h.shape[0]):
    for k in range(h.shape[1]):
      messages, scores = [], []
      for slot in range(ids.shape[2]):
        if not mask[b, k, slot]:
          continue
        l = ids[b, k, slot]
        inp = np.concatenate([h[b, k], h[b, l], feats[b, k, slot]])
        hidden = np_gelu(inp @ p["message_in_kernel"] + p["message_in_bias"])
        m = hidden @ p["message_out"]["kernel"] + p["message_out"]["bias"]
        messages.append(m)
        scores.append(m @ p["attention"]["kernel"][:, 0])
      agg = np.zeros(h.shape[-1])
      if messages:
        weights = np.exp(np.array(scores) - max(scores))
        weights /= weights.sum()
        agg = sum(w * m for w, m in zip(weights, messages))
      out[b, k] = np_layer_norm(h[b, k] + agg, p["layer_norm"])
  return out


def make_graph(seed=0, nodes=NODES):
  rng = np.random.default_rng(seed)
  h = rng.normal(size=(BATCH, nodes, WIDTH)).astype(np.float32)
  ids = rng.integers(0, nodes, (BATCH, nodes, K)).astype(np.int32)
  feats = rng.normal(size=(BATCH, nodes, K, FEATS)).astype(np.float32)
  mask = rng.random((BATCH, nodes, K)) < 0.7
  mask[0, 0] = False  # an isolated node
  mask[1, 2] = [True, False, True]
  ids = np.where(mask, ids, -1)  # padding slots as token_neighbours pads them
  return h, ids, feats, mask


def init_layer(h, ids, feats, mask, hidden_features=None):
  module = GCNLayer(hidden_features=hidden_features)
  variables = jax.jit(module.init)(jax.random.key(0), h, ids, feats, mask)
  # Larger random weights than the 0.02 init so the attention is far from uniform.
  rng = np.random.default_rng(1)
  variables = jax.tree.map(lambda a: a + rng.normal(size=a.shape).astype(np.float32) * 0.5,
                           nn.unbox(variables))
  return module, variables, jax.jit(module.apply)


@pytest.mark.parametrize("hidden_features", [None, 2 * WIDTH + FEATS])
def test_layer_matches_loop_reference(hidden_features):
  h, ids, feats, mask = make_graph(0)
  module, variables, apply = init_layer(h, ids, feats, mask, hidden_features)
  hidden = hidden_features or WIDTH
  assert variables["params"]["message_in_kernel"].shape == (2 * WIDTH + FEATS, hidden)
  assert variables["params"]["message_out"]["kernel"].shape == (hidden, WIDTH)
  got = apply(variables, h, ids, feats, mask)
  want = np_gcn_layer(variables["params"], h, ids, feats, mask)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_isolated_node_keeps_layer_norm_of_itself_without_nan():
  h, ids, feats, mask = make_graph(2)
  mask[:] = False
  module, variables, apply = init_layer(h, ids, feats, mask)
  got = np.asarray(apply(variables, h, ids, feats, mask))
  assert np.isfinite(got).all()
  np.testing.assert_allclose(got, np_layer_norm(h, variables["params"]["layer_norm"]),
                             rtol=1e-5, atol=1e-5)


def test_masked_neighbours_have_no_effect():
  h, ids, feats, mask = make_graph(3)
  module, variables, apply = init_layer(h, ids, feats, mask)
  base = apply(variables, h, ids, feats, mask)
  rng = np.random.default_rng(4)
  ids2 = np.where(mask, ids, rng.integers(0, NODES, ids.shape)).astype(np.int32)
  feats2 = np.where(mask[..., None], feats, rng.normal(size=feats.shape) * 100).astype(np.float32)
  np.testing.assert_array_equal(apply(variables, h, ids2, feats2, mask), base)
  feats_nan = np.where(mask[..., None], feats, np.nan).astype(np.float32)
  np.testing.assert_array_equal(apply(variables, h, ids, feats_nan, mask), base)


def test_permutation_equivariance():
  h, ids, feats, mask = make_graph(5)
  module, variables, apply = init_layer(h, ids, feats, mask)
  base = np.asarray(apply(variables, h, ids, feats, mask))
  perm = np.random.default_rng(6).permutation(NODES)
  inverse = np.argsort(perm)  # old index -> new index
  ids_p = np.where(mask[:, perm], inverse[np.clip(ids[:, perm], 0, None)], -1).astype(np.int32)
  got = apply(variables, h[:, perm], ids_p, feats[:, perm], mask[:, perm])
  np.testing.assert_allclose(got, base[:, perm], rtol=1e-5, atol=1e-5)


def test_node_mask_drops_edges_to_padded_nodes():
  h, ids, feats, mask = make_graph(7)
  module, variables, apply = init_layer(h, ids, feats, mask)
  node_mask = np.ones((BATCH, NODES), bool)
  node_mask[:, -2:] = False
  got = apply(variables, h, ids, feats, mask, node_mask)
  edge_ok = mask & np.take_along_axis(node_mask, np.clip(ids, 0, None).reshape(BATCH, -1),
                                      1).reshape(ids.shape)
  assert (edge_ok != mask).any()
  np.testing.assert_array_equal(got, apply(variables, h, ids, feats, edge_ok))


def test_super_token_encoder_composes_projection_and_layers():
  h, ids, feats, mask = make_graph(8)
  tokens = h[..., :5]  # token embeddings of another width
  rng = np.random.default_rng(9)
  x = np.sort(rng.integers(0, 1001, (BATCH, NODES, 2)), -1)
  y = np.sort(rng.integers(0, 1001, (BATCH, NODES, 2)), -1)
  boxes = np.stack([x[..., 0], y[..., 0], x[..., 1], y[..., 1]], -1).astype(np.float32)
  module = SuperTokenEncoder(features=WIDTH, num_layers=2, message_hidden="input")
  variables = jax.jit(module.init)(jax.random.key(0), tokens, boxes, ids, feats, mask)
  p = nn.unbox(variables)["params"]
  assert set(p) == {"node_input", "layer_0", "layer_1"}
  assert p["layer_1"]["message_in_bias"].shape == (2 * WIDTH + FEATS,)
  got = jax.jit(module.apply)(variables, tokens, boxes, ids, feats, mask)
  spatial = np.concatenate([boxes, boxes[..., 2:3] - boxes[..., 0:1],
                            boxes[..., 3:4] - boxes[..., 1:2]], -1) / 1000.0
  np.testing.assert_allclose(node_spatial_features(boxes), spatial, rtol=1e-6)
  # Same convention as the featuriser-side (numpy) node features.
  np.testing.assert_allclose(node_spatial_features(boxes), node_features(boxes), rtol=1e-6)
  state = (np.concatenate([tokens, spatial], -1) @ np.asarray(p["node_input"]["kernel"])
           + np.asarray(p["node_input"]["bias"]))
  for i in range(2):
    state = np_gcn_layer(p[f"layer_{i}"], state, ids, feats, mask)
  assert got.shape == (BATCH, NODES, WIDTH)
  np.testing.assert_allclose(got, state, rtol=1e-4, atol=1e-4)


def test_unknown_message_hidden_is_an_error():
  h, ids, feats, mask = make_graph(8)
  boxes = np.zeros((BATCH, NODES, 4), np.float32)
  with pytest.raises(ValueError, match="message_hidden"):
    SuperTokenEncoder(features=WIDTH, num_layers=1, message_hidden="wide").init(
        jax.random.key(0), h, boxes, ids, feats, mask)


def test_logical_axes_and_bfloat16():
  h, ids, feats, mask = make_graph(10)
  module = GCNLayer(dtype=jnp.bfloat16)
  variables = jax.jit(module.init)(jax.random.key(0), h, ids, feats, mask)
  assert variables["params"]["message_out"]["kernel"].names == ("mlp", "embed")
  out = jax.jit(module.apply)(variables, h, ids, feats, mask)
  assert out.dtype == jnp.bfloat16 and np.isfinite(np.asarray(out, np.float32)).all()


def test_bad_graphs_raise():
  h, ids, feats, mask = make_graph(11)
  module = GCNLayer()
  variables = jax.jit(module.init)(jax.random.key(0), h, ids, feats, mask)
  with pytest.raises(ValueError, match="neighbor_ids"):
    module.apply(variables, h, np.where(mask, NODES, -1).astype(np.int32), feats, mask)
  with pytest.raises(ValueError, match="neighbor_mask"):
    module.apply(variables, h, ids, feats, mask[:, :, :2])
  with pytest.raises(ValueError, match="neighbor_features"):
    module.apply(variables, h, ids, feats[:, :3], mask)
  with pytest.raises(ValueError, match="node states"):
    module.apply(variables, h[0], ids, feats, mask)


@pytest.mark.parametrize("mode", ["scatter_f32", "scatter"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_neighbor_gather_and_its_gradient_match_a_loop(monkeypatch, mode, dtype):
  """Forward: rows at the ids; gradient: every edge's cotangent added to its target row."""
  monkeypatch.setattr(gcn_lib, "NEIGHBOR_GRADIENT", mode)
  rng = np.random.default_rng(3)
  b, n, k, h = 2, 40, 5, 6
  x = rng.normal(size=(b, n, h)).astype(np.float32)
  ids = rng.integers(0, n, (b, n, k)).astype(np.int32)
  ids[0, :, 0] = 7  # a node many edges point to (the scatter's collisions)
  w = rng.normal(size=(b, n, k, h)).astype(np.float32)
  out = gcn_lib.gather_neighbors(jnp.asarray(x, dtype), jnp.asarray(ids))
  assert out.dtype == dtype and out.shape == (b, n, k, h)
  rows = np.asarray(jnp.asarray(x, dtype), np.float32)
  np.testing.assert_array_equal(np.asarray(out, np.float32),
                                rows[np.arange(b)[:, None, None], ids])
  grad = jax.grad(lambda v: (gcn_lib.gather_neighbors(v.astype(dtype), jnp.asarray(ids))
                             .astype(jnp.float32) * w).sum())(jnp.asarray(x))
  ref = np.zeros_like(x, np.float64)
  for bi in range(b):
    for li in range(n):
      for ki in range(k):
        ref[bi, ids[bi, li, ki]] += w[bi, li, ki]
  # bfloat16: each edge's cotangent is rounded once (2^-9 relative); "scatter" also
  # rounds every partial sum of the accumulation.
  tol = {jnp.float32: 1e-5, "scatter_f32": 5e-3, "scatter": 3e-2}
  err = np.abs(np.asarray(grad) - ref).max() / np.abs(ref).max()
  assert err < tol[jnp.float32 if dtype == jnp.float32 else mode], (mode, err)


def test_neighbor_gradient_modes_give_the_same_layer_gradients(monkeypatch):
  h, ids, feats, mask = make_graph(seed=5)
  layer, variables, _ = init_layer(h, ids, feats, mask, hidden_features=12)
  params = variables["params"]

  def grads():  # jitted anew each call, so it traces with the mode set now
    return jax.jit(jax.grad(lambda p, x: layer.apply({"params": p}, x, ids, feats, mask).sum(),
                            argnums=(0, 1)))(params, h)

  monkeypatch.setattr(gcn_lib, "NEIGHBOR_GRADIENT", "scatter")
  a = grads()
  monkeypatch.setattr(gcn_lib, "NEIGHBOR_GRADIENT", "scatter_f32")
  b = grads()
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-6)
  monkeypatch.setattr(gcn_lib, "NEIGHBOR_GRADIENT", "per_edge")
  with pytest.raises(ValueError, match="NEIGHBOR_GRADIENT"):
    grads()
