"""Layout term modules: numbers against pair-by-pair numpy references, blocking, sharing."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flaxdoc.layout import polar as polar_lib
from flaxdoc.nn.etc_attention import block_geometry, split_blocks, three_blocks, pad_long
from flaxdoc.nn.layout_terms import (FixedBiasTerm, GaussianTerm, PolarTerm, RichAttentionTerm,
                                     layout_geometry)

B, N, H, D = 2, 7, 2, 4


def _random_layout(seed, b=B, n=N, pages=False):
  rng = np.random.default_rng(seed)
  x0 = rng.integers(0, 900, (b, n))
  y0 = rng.integers(0, 950, (b, n))
  boxes = np.stack([x0, y0, x0 + rng.integers(1, 100, (b, n)), y0 + rng.integers(1, 50, (b, n))],
                   -1).astype(np.float32)
  mask = np.ones((b, n), bool)
  mask[-1, n - 2:] = False
  page_ids = rng.integers(0, 2, (b, n)) if pages else None
  geom = layout_geometry(boxes, mask, pages=page_ids, distance_buckets=4)
  q = rng.normal(size=(b, n, H, D)).astype(np.float32)
  k = rng.normal(size=(b, n, H, D)).astype(np.float32)
  return rng, geom, q, k


def _t5_bucket(rel, num_buckets=32, max_distance=128):
  """Hugging Face T5 `_relative_position_bucket` (bidirectional), one offset at a time."""
  num_buckets //= 2
  ret = num_buckets if rel > 0 else 0
  n = abs(rel)
  max_exact = num_buckets // 2
  if n < max_exact:
    return ret + n
  large = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact)
                          * (num_buckets - max_exact))
  return ret + min(large, num_buckets - 1)


def _log_sigmoid(z):
  return -np.log1p(np.exp(-z))


def test_rich_term_matches_pairwise_reference():
  _, geom, q, k = _random_layout(0, pages=True)
  term = RichAttentionTerm(num_heads=H, head_dim=D, axes=("x", "y", "index"))
  p = _random_params(term, q, k, geom)["params"]  # non-trivial b, c, theta too
  got = np.asarray(jax.jit(term.apply)({"params": p}, q, k, geom, geom))
  centers, pos = np.asarray(geom["centers"]), np.asarray(geom["positions"])
  want = np.zeros((B, H, N, N))
  for bi in range(B):
    coord = np.concatenate([centers[bi], pos[bi][:, None]], -1)  # [N, 3]: x, y, index
    for h in range(H):
      for i in range(N):
        for j in range(N):
          for a in range(3):
            z = q[bi, i, h] @ p["w_q"][h, :, a] + p["b"][h, a] + k[bi, j, h] @ p["w_k"][h, :, a]
            order = coord[i, a] < coord[j, a]
            s_o = _log_sigmoid(z) if order else _log_sigmoid(-z)
            mu = q[bi, i, h] @ p["v_q"][h, :, a] + p["c"][h, a] + k[bi, j, h] @ p["v_k"][h, :, a]
            dist = math.log(1 + abs(coord[i, a] - coord[j, a]))
            want[bi, h, i, j] += s_o - p["theta"][h, a] ** 2 * (dist - mu) ** 2 / 2
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_rich_term_parameters():
  term = RichAttentionTerm(num_heads=3, head_dim=5, theta_init=0.1)
  q = jnp.zeros((1, 2, 3, 5))
  geom = {"centers": jnp.zeros((1, 2, 2))}
  params = jax.eval_shape(term.init, jax.random.key(0), q, q, geom, geom)["params"]
  assert params["w_q"].value.shape == (3, 5, 2)
  assert params["w_q"].names == ("heads", "kv", None)
  assert params["theta"].value.shape == (3, 2)
  theta = jax.jit(term.init)(jax.random.key(0), q, q, geom, geom)["params"]["theta"].value
  np.testing.assert_allclose(np.asarray(theta), 0.1)
  with pytest.raises(ValueError, match="axes"):
    jax.eval_shape(RichAttentionTerm(num_heads=1, head_dim=1, axes=("x", "z")).init,
                   jax.random.key(0), jnp.zeros((1, 2, 1, 1)), jnp.zeros((1, 2, 1, 1)), geom, geom)
  with pytest.raises(ValueError, match="positions"):
    jax.eval_shape(RichAttentionTerm(num_heads=3, head_dim=5, axes=("index",)).init,
                   jax.random.key(0), q, q, geom, geom)


def test_polar_term_matches_pairwise_reference_with_packed_documents():
  rng, geom, q, k = _random_layout(2)
  # Row 0 packs two documents with their own distance edges (per-token copies).
  edges = np.asarray(geom["dist_edges"]).copy()
  edges[0, 4:] = np.array([0.0, 50.0, 100.0, 300.0, 2000.0], np.float32)
  geom = dict(geom, dist_edges=jnp.asarray(edges))
  term = PolarTerm(head_dim=D)
  variables = _random_params(term, q, k, geom)
  onehot = PolarTerm(head_dim=D, gather_method="onehot")
  both = jax.jit(lambda v: (term.apply(v, q, k, geom, geom),
                            onehot.apply(v, q, k, geom, geom)))
  got, got_onehot = (np.asarray(a) for a in both(variables))
  p = variables["params"]
  centers, pos = np.asarray(geom["centers"]), np.asarray(geom["positions"])
  valid = np.asarray(geom["valid"])
  is_self = pos[:, :, None] == pos[:, None, :]
  angle = np.asarray(polar_lib.angle_codes_released(
      geom["boxes"], geom["boxes"], is_self, valid[:, :, None] & valid[:, None, :]))
  want = np.zeros((B, H, N, N))
  for bi in range(B):
    for i in range(N):
      for j in range(N):
        rho = np.hypot(*(centers[bi, j] - centers[bi, i]))
        dist_bucket = int(sum(rho >= e for e in edges[bi, i, 1:-1]))
        b1d = _t5_bucket(int(pos[bi, j] - pos[bi, i]))
        for h in range(H):
          want[bi, h, i, j] = q[bi, i, h] @ (p["table_1d"][b1d] + p["table_distance"][dist_bucket]
                                             + p["table_angle"][angle[bi, i, j]]) / math.sqrt(D)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert p["table_angle"].shape == (polar_lib.NUM_ANGLE_CODES, D)
  # The one-hot contraction gives the same numbers.
  np.testing.assert_allclose(got_onehot, got, rtol=1e-5, atol=1e-6)


def test_polar_term_options_and_errors():
  _, geom, q, k = _random_layout(3)
  only_angle = PolarTerm(head_dim=D, use_1d=False, use_distance=False, angle="sectors8")
  variables = jax.eval_shape(only_angle.init, jax.random.key(0), q, k, geom, geom)
  assert set(variables["params"]) == {"table_angle"}
  assert variables["params"]["table_angle"].value.shape == (polar_lib.NUM_ANGLE_SECTORS8_CODES, D)
  with pytest.raises(ValueError, match="dist_edges"):
    jax.eval_shape(PolarTerm(head_dim=D, num_distance_buckets=3).init, jax.random.key(0), q, k,
                   geom, geom)
  no_edges = {key: v for key, v in geom.items() if key != "dist_edges"}
  with pytest.raises(ValueError, match="dist_edges"):
    jax.eval_shape(PolarTerm(head_dim=D).init, jax.random.key(0), q, k, no_edges, no_edges)


def test_gaussian_term_reference_and_init():
  _, geom, q, k = _random_layout(4)
  term = GaussianTerm(num_heads=H)
  variables = jax.jit(term.init)(jax.random.key(0), q, k, geom, geom)
  p = jax.tree_util.tree_map(np.asarray, nn.unbox(variables)["params"])
  for name in ("mu_rho", "mu_theta"):
    assert p[name].shape == (H,) and np.all((p[name] >= 0) & (p[name] <= 0.01))
  for name in ("sigma_rho", "sigma_theta"):
    assert np.all((p[name] >= 0) & (p[name] <= 1))
  # Wider kernels for a more informative comparison.
  p = {"mu_rho": np.array([0.1, 0.3], np.float32), "mu_theta": np.array([0.5, -2.0], np.float32),
       "sigma_rho": np.array([0.2, 0.5], np.float32),
       "sigma_theta": np.array([1.0, 0.7], np.float32)}
  got = np.asarray(jax.jit(term.apply)({"params": p}, q, k, geom, geom))
  boxes = np.asarray(geom["boxes"])
  want = np.zeros((B, H, N, N))
  for bi in range(B):
    for i in range(N):
      for j in range(N):
        # bottom-left corner (x0, y1) in 0-1 units
        dx = (boxes[bi, j, 0] - boxes[bi, i, 0]) / 1000
        dy = (boxes[bi, j, 3] - boxes[bi, i, 3]) / 1000
        rho, theta = math.hypot(dx, dy), math.atan2(dx, dy)
        for h in range(H):
          dtheta = abs(theta - p["mu_theta"][h])
          dtheta = min(dtheta, 2 * math.pi - dtheta)
          var_r = p["sigma_rho"][h] ** 2 + 1e-6
          var_t = p["sigma_theta"][h] ** 2 + 1e-6
          g = math.exp(-(rho - p["mu_rho"][h]) ** 2 / (2 * var_r) - dtheta ** 2 / (2 * var_t))
          want[bi, h, i, j] = 4.0 * (g - 1)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  # Coincident boxes (sub-tokens of one word) sit at the origin, under jit too: the
  # pair gets exactly the self-pair value, not an angle made of rounding noise.
  same = np.asarray(geom["boxes"]).copy()
  same[:, 1] = same[:, 0]
  geom_same = dict(geom, boxes=jnp.asarray(same))
  got = np.asarray(jax.jit(term.apply)({"params": p}, q, k, geom_same, geom_same))
  np.testing.assert_allclose(got[:, :, 0, 1], got[:, :, 0, 0], rtol=1e-6)
  np.testing.assert_allclose(got[:, :, 1, 0], got[:, :, 0, 0], rtol=1e-6)


@pytest.mark.parametrize("kind", ["squircle", "cross"])
def test_fixed_bias_term_reference(kind):
  _, geom, q, k = _random_layout(5, pages=True)
  term = FixedBiasTerm(kind=kind)
  assert term.init(jax.random.key(0), q, k, geom, geom) == {}
  got = np.asarray(jax.jit(term.apply)({}, q, k, geom, geom))
  assert got.shape == (B, 1, N, N)
  c = np.asarray(geom["centers"])
  dx = np.abs(c[:, None, :, 0] - c[:, :, None, 0])
  dy = np.abs(c[:, None, :, 1] - c[:, :, None, 1])
  cx, cy = np.cos(np.pi / 2 * dx / 1000), np.cos(np.pi / 2 * dy / 1000)
  w = cx * cy if kind == "squircle" else np.maximum(cx, cy)
  np.testing.assert_allclose(got[:, 0], np.log(np.maximum(w, 1e-5)), rtol=1e-5, atol=1e-5)


def _random_params(term, q, k, geom, seed=0):
  """Parameters of the right shapes (from `eval_shape`, no init compile), random values."""
  rng = np.random.default_rng(seed)
  shapes = nn.unbox(jax.eval_shape(term.init, jax.random.key(0), q, k, geom, geom))
  return jax.tree_util.tree_map(
      lambda s: (0.3 * rng.normal(size=s.shape)).astype(np.float32) + 0.1, shapes)


ALL_TERMS = (RichAttentionTerm(num_heads=H, head_dim=D, axes=("x", "y", "index")),
             PolarTerm(head_dim=D), GaussianTerm(num_heads=H), FixedBiasTerm(kind="cross"))
BLOCK = 3


@pytest.fixture(scope="module")
def term_outputs():
  """Each term evaluated densely, on ETC blocks, on translated boxes, plus its gradient.

  One compiled program per term, shared by the tests below.
  """
  _, geom, q, k = _random_layout(6)
  padded = -(-N // BLOCK) * BLOCK
  qb = split_blocks(pad_long(jnp.asarray(q), padded), BLOCK)  # [B, nb, b, H, D]
  kb = three_blocks(split_blocks(pad_long(jnp.asarray(k), padded), BLOCK))  # [B, nb, 3b, H, D]
  q_geom, k_geom = block_geometry(geom, BLOCK, padded)
  shift = np.array([13.0, 41.0, 13.0, 41.0], np.float32)
  moved = layout_geometry(np.asarray(geom["boxes"]) + shift, geom["valid"], distance_buckets=4)
  results = {}
  for term in ALL_TERMS:
    variables = _random_params(term, q, k, geom)

    @jax.jit
    def evaluate(variables, term=term):
      loss = lambda v: term.apply(v, q, k, geom, geom).sum()  # noqa: E731
      return {"dense": term.apply(variables, q, k, geom, geom),  # [B, H|1, N, N]
              "blocked": term.apply(variables, qb, kb, q_geom, k_geom),  # [B, nb, H|1, b, 3b]
              "moved": term.apply(variables, q, k, moved, moved),
              "grads": jax.grad(loss)(variables)}

    results[type(term).__name__] = jax.tree_util.tree_map(np.asarray, evaluate(variables))
  return results


@pytest.mark.parametrize("name", [type(t).__name__ for t in ALL_TERMS])
def test_every_term_blocked_equals_dense_slices(term_outputs, name):
  """ETC calls terms on [B, nb, b] query blocks against [B, nb, 3b] key blocks."""
  dense, blocked = term_outputs[name]["dense"], term_outputs[name]["blocked"]
  nb = -(-N // BLOCK)
  assert blocked.shape[:2] == (B, nb) and blocked.shape[-2:] == (BLOCK, 3 * BLOCK)
  # Pairs outside the sequence are masked by ETC; they must still be finite.
  assert np.all(np.isfinite(blocked))
  checked = 0
  for n_ in range(nb):
    for i in range(BLOCK):
      for j in range(3 * BLOCK):
        qi, kj = n_ * BLOCK + i, (n_ - 1) * BLOCK + j
        if qi < N and 0 <= kj < N:
          np.testing.assert_allclose(blocked[:, n_, :, i, j], dense[:, :, qi, kj], rtol=1e-5,
                                     atol=1e-5)
          checked += 1
  near = [(a, b_) for a in range(N) for b_ in range(N) if abs(a // BLOCK - b_ // BLOCK) <= 1]
  assert checked == len(near)


@pytest.mark.parametrize("name", [type(t).__name__ for t in ALL_TERMS])
def test_terms_translation_invariant(term_outputs, name):
  np.testing.assert_allclose(term_outputs[name]["moved"], term_outputs[name]["dense"],
                             rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["RichAttentionTerm", "PolarTerm", "GaussianTerm"])
def test_parameter_gradients_are_finite(term_outputs, name):
  leaves = jax.tree_util.tree_leaves(term_outputs[name]["grads"])
  assert leaves and all(np.all(np.isfinite(g)) for g in leaves)
  assert all(np.any(g != 0) for g in leaves)


def test_layout_geometry_pages_and_errors():
  boxes = np.array([[[0, 10, 100, 30], [0, 10, 100, 30]]], np.float32)
  geom = layout_geometry(boxes, np.ones((1, 2), bool), pages=np.array([[0, 2]]),
                         document_ids=np.array([[3, 3]]), distance_buckets=4)
  np.testing.assert_allclose(np.asarray(geom["centers"])[0], [[50, 20], [50, 2020]])
  np.testing.assert_array_equal(np.asarray(geom["positions"]), [[0, 1]])
  assert geom["dist_edges"].shape == (1, 2, 5)
  assert geom["document_ids"].dtype == jnp.int32
  with pytest.raises(ValueError, match="mask"):
    layout_geometry(boxes, np.ones((1, 3), bool))
  with pytest.raises(ValueError, match="'centers'"):
    FixedBiasTerm().apply({}, jnp.zeros((1, 2, 1, 1)), jnp.zeros((1, 2, 1, 1)), {}, {})
