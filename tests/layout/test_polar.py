"""DocPolarBERT polar terms against plain loops written from DESIGN §3.4 / the t5x source."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxdoc.layout import geometry, polar

_edges = jax.jit(polar.distance_quantile_edges, static_argnames=("num_buckets", "pool"))
_buckets = jax.jit(polar.distance_buckets)
_codes = jax.jit(polar.angle_codes_released)
_sectors = jax.jit(polar.angle_sectors8)
_rel = jax.jit(polar.relative_position_buckets)
_t5 = jax.jit(polar.t5_relative_buckets, static_argnums=(1, 2, 3))
_dot = jax.jit(polar.bucketed_dot_logits, static_argnames=("method",))
_qblocks = jax.jit(geometry.etc_query_blocks, static_argnums=1)
_kblocks = jax.jit(geometry.etc_key_blocks, static_argnums=1)


def _grid_boxes(rng, shape):
  """Boxes on an integer grid: many exact same-row / same-column / diagonal pairs."""
  x0 = rng.integers(0, 20, shape) * 50.0
  y0 = rng.integers(0, 20, shape) * 50.0
  w = rng.integers(1, 4, shape) * 25.0
  h = rng.integers(1, 3, shape) * 20.0
  return np.stack([x0, y0, x0 + w, y0 + h], axis=-1).astype(np.float32)


def _centers(boxes):
  return (boxes[..., :2].astype(np.float64) + boxes[..., 2:]) / 2.0


# ------------------------------------------------------------------ distances
def _edges_reference(centers, mask, num_buckets, pool):
  groups = []
  for b in range(centers.shape[0]):
    idx = np.flatnonzero(mask[b])
    groups.append([math.dist(centers[b, i], centers[b, j])
                   for a, i in enumerate(idx) for j in idx[a + 1:]])
  if pool == "batch":
    groups = [sum(groups, [])] * len(groups)
  probs = np.linspace(0, 1, num_buckets + 1)
  return np.stack([np.quantile(g, probs) if g else np.zeros(num_buckets + 1) for g in groups])


@pytest.mark.parametrize("pool", ["document", "batch"])
def test_quantile_edges_match_numpy(pool):
  rng = np.random.default_rng(0)
  centers = rng.uniform(0, 1000, (3, 12, 2)).astype(np.float32)
  mask = np.ones((3, 12), bool)
  mask[1, 9:] = False  # padding
  mask[2, 1:] = False  # a single token: no pairs at all
  got = np.asarray(_edges(centers, mask, num_buckets=4, pool=pool))
  want = _edges_reference(centers.astype(np.float64), mask, 4, pool)
  assert got.shape == (3, 5)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)
  if pool == "document":
    np.testing.assert_array_equal(got[2], 0.0)  # no pairs: zeros, not NaN / inf


def test_quantile_edges_reject_bad_arguments():
  with pytest.raises(ValueError, match="pool"):
    polar.distance_quantile_edges(np.zeros((1, 3, 2)), np.ones((1, 3), bool), pool="corpus")
  with pytest.raises(ValueError, match=r"\[B, N, 2\]"):
    polar.distance_quantile_edges(np.zeros((3, 2)), np.ones(3, bool))


def test_distance_buckets_match_loop_and_are_balanced():
  rng = np.random.default_rng(1)
  centers = rng.uniform(0, 1000, (2, 16, 2)).astype(np.float32)
  mask = np.ones((2, 16), bool)
  edges = _edges(centers, mask, num_buckets=4, pool="document")
  got = np.asarray(_buckets(centers, centers[:, :7], edges))  # Q = 16, K = 7
  e = np.asarray(edges, np.float64)
  for b in range(2):
    for i in range(16):
      for j in range(7):
        rho = math.dist(centers[b, i].astype(np.float64), centers[b, j].astype(np.float64))
        assert got[b, i, j] == sum(rho >= e[b, k] for k in (1, 2, 3))
  full = np.asarray(_buckets(centers, centers, edges))
  upper = np.triu_indices(16, 1)
  counts = np.bincount(full[0][upper], minlength=4)  # 120 pairs: 30 per quartile
  assert counts.min() >= 29 and counts.max() <= 31, counts


@pytest.mark.parametrize("scale", [0.5, 2.0, 3.7])
def test_distance_buckets_invariant_to_uniform_page_scaling(scale):
  rng = np.random.default_rng(2)
  centers = rng.uniform(0, 1000, (2, 14, 2)).astype(np.float32)
  mask = np.ones((2, 14), bool)
  mask[0, 11:] = False
  base = _buckets(centers, centers, _edges(centers, mask, num_buckets=4, pool="document"))
  scaled = centers * np.float32(scale)
  got = _buckets(scaled, scaled, _edges(scaled, mask, num_buckets=4, pool="document"))
  np.testing.assert_array_equal(base, got)


# ---------------------------------------------------------------------- angles
def _codes_reference(bq, bk, is_self, valid):
  """DESIGN §3.4 read literally, with float64 atan2."""
  out = np.zeros(is_self.shape, np.int64)
  for i in range(bq.shape[0]):
    for j in range(bk.shape[0]):
      if not valid[i, j]:
        out[i, j] = 13
        continue
      if is_self[i, j]:
        out[i, j] = 0
        continue
      ci, cj = _centers(bq[i]), _centers(bk[j])
      dx, dy = cj[0] - ci[0], cj[1] - ci[1]
      phi = (360.0 - math.degrees(math.atan2(dy, dx))) % 360.0
      v_overlap = max(bq[i, 1], bk[j, 1]) < min(bq[i, 3], bk[j, 3])
      h_overlap = max(bq[i, 0], bk[j, 0]) < min(bq[i, 2], bk[j, 2])
      if h_overlap:
        out[i, j] = 2 if phi < 180 else 4
      elif v_overlap:
        out[i, j] = 1 if (phi < 90 or phi > 270) else 3
      else:
        out[i, j] = math.floor(phi / 45) + 5
  return out


def _hand_layout():
  """A query box and keys in every direction; expected released codes and 8-sector codes."""
  query = [400, 400, 500, 440]  # centre (450, 420)

  def around(cx, cy, w=60, h=20):
    return [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]

  keys = [  # box, released code, plain-sector code
      (query, 0, 0),  # itself
      ([600, 400, 700, 440], 1, 1),  # right, same row
      ([200, 405, 300, 435], 3, 5),  # left, same row
      ([420, 200, 480, 240], 2, 3),  # above, same column
      ([410, 600, 490, 640], 4, 7),  # below, same column
      (around(650, 300), 5, 2),  # phi = 31: up-right, flat
      (around(570, 200), 6, 2),  # phi = 61: up-right, steep
      (around(330, 200), 7, 4),  # phi = 119: up-left, steep
      (around(250, 300), 8, 4),  # phi = 149: up-left, flat
      (around(250, 540), 9, 6),  # phi = 211: down-left, flat
      (around(330, 640), 10, 6),  # phi = 241: down-left, steep
      (around(570, 640), 11, 8),  # phi = 299: down-right, steep
      (around(650, 540), 12, 8),  # phi = 329: down-right, flat
      (around(650, 220), 6, 2),  # phi = 45 exactly: the sector [45, 90)
      ([600, 440, 700, 480], 12, 1),  # touches the query's bottom edge: not the same row
      ([450, 420, 550, 460], 4, 1),  # overlaps both ways: the column rule wins (phi = 338)
      ([0, 0, 10, 10], 13, 9),  # padding
  ]
  bq = np.array([query], np.float32)
  bk = np.array([k[0] for k in keys], np.float32)
  is_self = np.zeros((1, len(keys)), bool)
  is_self[0, 0] = True
  valid = np.ones((1, len(keys)), bool)
  valid[0, -1] = False
  return bq, bk, is_self, valid, [k[1] for k in keys], [k[2] for k in keys]


def test_angle_codes_hand_built():
  bq, bk, is_self, valid, released, sectors = _hand_layout()
  np.testing.assert_array_equal(_codes(bq, bk, is_self, valid)[0], released)
  np.testing.assert_array_equal(_codes_reference(bq, bk, is_self, valid)[0], released)
  np.testing.assert_array_equal(_sectors(bq, bk, is_self, valid)[0], sectors)


def test_angle_codes_match_reference_on_random_grid_layouts():
  rng = np.random.default_rng(3)
  boxes = _grid_boxes(rng, (2, 25))
  idx = np.arange(25)
  is_self, valid = polar.pair_masks(idx, idx, idx < 22, idx < 22)  # 3 padding tokens
  got = np.asarray(_codes(boxes, boxes, is_self, valid))  # [2, 25, 25]
  for b in range(2):
    want = _codes_reference(boxes[b], boxes[b], np.asarray(is_self), np.asarray(valid))
    np.testing.assert_array_equal(got[b], want)
  # Every code occurs on a grid layout of this size, and nothing else does.
  assert set(np.unique(got)) == set(range(14))


def test_angle_sectors8_match_reference():
  rng = np.random.default_rng(4)
  boxes = rng.uniform(0, 1000, (30, 4)).astype(np.float32)
  boxes[:, 2:] = boxes[:, :2] + 10
  idx = np.arange(30)
  is_self, valid = polar.pair_masks(idx, idx, idx < 28, idx < 28)
  got = np.asarray(_sectors(boxes, boxes, is_self, valid))
  c = _centers(boxes)
  checked = 0
  for i in range(30):
    for j in range(30):
      if not valid[i, j]:
        assert got[i, j] == 9
        continue
      if i == j:
        assert got[i, j] == 0
        continue
      phi = math.degrees(math.atan2(-(c[j, 1] - c[i, 1]), c[j, 0] - c[i, 0])) % 360
      if abs((phi + 22.5) / 45 - round((phi + 22.5) / 45)) < 1e-4:
        continue  # float32 and float64 may disagree this close to a boundary
      assert got[i, j] == math.floor((phi + 22.5) / 45) % 8 + 1
      checked += 1
  assert checked > 700


def test_angle_codes_translation_invariant_and_blocked_equals_dense():
  rng = np.random.default_rng(5)
  n, blk = 11, 4
  boxes = _grid_boxes(rng, (1, n))
  idx = np.arange(n)
  is_self, valid = polar.pair_masks(idx, idx, idx < n, idx < n)
  dense = np.asarray(_codes(boxes, boxes, is_self, valid))  # [1, N, N]
  shifted = boxes + np.array([30.0, 1000.0, 30.0, 1000.0], np.float32)  # next page, moved right
  np.testing.assert_array_equal(_codes(shifted, shifted, is_self, valid), dense)

  q_idx, k_idx = geometry.etc_block_indices(n, blk)
  bs, bv = polar.pair_masks(q_idx, k_idx, q_idx >= 0, k_idx >= 0)  # [nb, b, 3b]
  qb = _qblocks(boxes, blk)  # [1, nb, b, 4]
  kb = _kblocks(boxes, blk)  # [1, nb, 3b, 4]
  blocked = np.asarray(_codes(qb, kb, bs[None], bv[None]))  # [1, nb, b, 3b]
  sectors_dense = np.asarray(_sectors(boxes, boxes, is_self, valid))
  sectors_blocked = np.asarray(_sectors(qb, kb, bs[None], bv[None]))
  for i in range(q_idx.shape[0]):
    for t in range(blk):
      for s in range(3 * blk):
        qi, kj = q_idx[i, t], k_idx[i, s]
        if qi >= 0 and kj >= 0:
          assert blocked[0, i, t, s] == dense[0, qi, kj]
          assert sectors_blocked[0, i, t, s] == sectors_dense[0, qi, kj]
        else:
          assert blocked[0, i, t, s] == polar.ANGLE_PADDING


def test_distance_buckets_blocked_equal_dense_and_translation_invariant():
  rng = np.random.default_rng(6)
  n, blk = 13, 4
  centers = rng.integers(0, 1000, (2, n, 2)).astype(np.float32) + 0.5
  edges = _edges(centers, np.ones((2, n), bool), num_buckets=4, pool="document")  # [B, E]
  dense = np.asarray(_buckets(centers, centers, edges))
  moved = centers + np.float32(1000.0)
  moved_edges = _edges(moved, np.ones((2, n), bool), num_buckets=4, pool="document")
  np.testing.assert_array_equal(_buckets(moved, moved, moved_edges), dense)
  blocked = np.asarray(_buckets(_qblocks(centers, blk),
                                _kblocks(centers, blk), edges[:, None, :]))
  q_idx, k_idx = geometry.etc_block_indices(n, blk)
  for i in range(q_idx.shape[0]):
    for t in range(blk):
      for s in range(3 * blk):
        if q_idx[i, t] >= 0 and k_idx[i, s] >= 0:
          np.testing.assert_array_equal(blocked[:, i, t, s], dense[:, q_idx[i, t], k_idx[i, s]])


# ---------------------------------------------------------------------- T5 1D
def _t5x_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
  """A straight numpy port of t5x `_relative_position_bucket`."""
  ret = 0
  n = -relative_position
  if bidirectional:
    num_buckets //= 2
    ret += (n < 0).astype(np.int32) * num_buckets
    n = np.abs(n)
  else:
    n = np.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  val_if_large = max_exact + (
      np.log(n.astype(np.float32) / max_exact + np.finfo(np.float32).eps) /
      np.log(max_distance / max_exact) * (num_buckets - max_exact)).astype(np.int32)
  val_if_large = np.minimum(val_if_large, num_buckets - 1)
  ret += np.where(is_small, n, val_if_large)
  return ret


@pytest.mark.parametrize("bidirectional,num_buckets,max_distance",
                         [(True, 32, 128), (True, 64, 256), (False, 32, 128), (True, 10, 20)])
def test_t5_buckets_match_t5x(bidirectional, num_buckets, max_distance):
  rel = np.arange(-1500, 1501)
  got = np.asarray(_t5(rel, bidirectional, num_buckets, max_distance))
  np.testing.assert_array_equal(got, _t5x_bucket(rel, bidirectional, num_buckets, max_distance))
  assert got.min() >= 0 and got.max() == num_buckets - 1


def test_t5_1d_buckets_blocked_equal_dense():
  n, blk = 300, 128
  pos = np.arange(n)
  dense = np.asarray(_rel(pos, pos))
  q_idx, k_idx = geometry.etc_block_indices(n, blk)
  blocked = np.asarray(_rel(q_idx, k_idx))  # positions == indices
  ok = (q_idx[:, :, None] >= 0) & (k_idx[:, None, :] >= 0)
  want = dense[np.maximum(q_idx, 0)[:, :, None], np.maximum(k_idx, 0)[:, None, :]]
  np.testing.assert_array_equal(np.where(ok, blocked, 0), np.where(ok, want, 0))


# -------------------------------------------------------------------- logits
def test_bucketed_dot_logits_match_loop():
  rng = np.random.default_rng(7)
  q = rng.normal(size=(2, 5, 3, 11)).astype(np.float32)  # [B, Q, H, D]
  table = rng.normal(size=(13, 11)).astype(np.float32)  # [nb, D]
  buckets = rng.integers(0, 13, (2, 5, 7))  # [B, Q, K]
  got = np.asarray(_dot(q, table, buckets))
  assert got.shape == (2, 3, 5, 7)
  for b in range(2):
    for h in range(3):
      for i in range(5):
        for j in range(7):
          want = sum(float(q[b, i, h, d]) * float(table[buckets[b, i, j], d]) for d in range(11))
          assert got[b, h, i, j] == pytest.approx(want, rel=1e-4, abs=1e-4)
  onehot = _dot(q, table, buckets, method="onehot")
  np.testing.assert_allclose(onehot, got, rtol=1e-5, atol=1e-5)
  # Buckets shared by the whole batch broadcast.
  shared = _dot(q, table, buckets[0])
  np.testing.assert_allclose(np.asarray(shared)[0], got[0], rtol=1e-6)


def test_bucketed_dot_logits_never_builds_q_k_d():
  q = jnp.ones((1, 5, 3, 11))  # Q = 5, H = 3, D = 11
  table = jnp.ones((13, 11))
  buckets = jnp.zeros((1, 5, 7), jnp.int32)  # K = 7
  for method in ("gather", "onehot"):
    jaxpr = jax.make_jaxpr(lambda a, t, b: polar.bucketed_dot_logits(a, t, b, method=method))(
        q, table, buckets)
    for eqn in jaxpr.jaxpr.eqns:
      for var in eqn.outvars:
        shape = tuple(getattr(var.aval, "shape", ()))
        assert not (5 in shape and 7 in shape and 11 in shape), (method, eqn.primitive, shape)


def test_bucketed_dot_logits_reject_bad_buckets():
  q = np.ones((1, 2, 1, 4), np.float32)
  with pytest.raises(ValueError, match=r"bucket ids must lie in \[0, 3\)"):
    polar.bucketed_dot_logits(q, np.ones((3, 4)), np.full((1, 2, 2), 3))
  with pytest.raises(ValueError, match="table"):
    polar.bucketed_dot_logits(q, np.ones((3, 5)), np.zeros((1, 2, 2), int))
  with pytest.raises(ValueError, match="integers"):
    polar.bucketed_dot_logits(q, np.ones((3, 4)), np.zeros((1, 2, 2)))
