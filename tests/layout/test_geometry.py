"""Box geometry and ETC blocking, checked against plain numpy loops and `Document`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxdoc.data.document import Document
from flaxdoc.layout import geometry


def _random_boxes(rng, shape, hi=900.0):
  """`shape + [4]` valid boxes with integer-ish coordinates in [0, 1000]."""
  x0 = rng.integers(0, hi, shape + (1,))
  y0 = rng.integers(0, hi, shape + (1,))
  w = rng.integers(1, 100, shape + (1,))
  h = rng.integers(1, 60, shape + (1,))
  return np.concatenate([x0, y0, x0 + w, y0 + h], axis=-1).astype(np.float32)


def test_box_points_by_hand():
  boxes = np.array([[10.0, 20.0, 30.0, 60.0]], np.float32)
  np.testing.assert_allclose(geometry.box_centers(boxes), [[20.0, 40.0]])
  np.testing.assert_allclose(geometry.box_point(boxes, "top_left"), [[10.0, 20.0]])
  np.testing.assert_allclose(geometry.box_point(boxes, "bottom_left"), [[10.0, 60.0]])
  np.testing.assert_allclose(geometry.box_point(boxes, "top_right"), [[30.0, 20.0]])
  np.testing.assert_allclose(geometry.box_point(boxes, "bottom_right"), [[30.0, 60.0]])
  np.testing.assert_allclose(geometry.box_point(boxes, "center"), [[20.0, 40.0]])
  np.testing.assert_allclose(geometry.box_sizes(boxes), [[20.0, 40.0]])
  with pytest.raises(ValueError, match="box point"):
    geometry.box_point(boxes, "middle")
  with pytest.raises(ValueError, match=r"boxes must have shape \[\.\.\., 4\]"):
    geometry.box_centers(np.zeros((3, 5)))


def test_stack_pages_matches_loop():
  rng = np.random.default_rng(0)
  boxes = _random_boxes(rng, (2, 6))
  pages = rng.integers(0, 3, (2, 6))
  out = np.asarray(geometry.stack_pages(boxes, pages))
  for b in range(2):
    for i in range(6):
      x0, y0, x1, y1 = boxes[b, i]
      p = pages[b, i]
      np.testing.assert_allclose(out[b, i], [x0, y0 + 1000 * p, x1, y1 + 1000 * p])
  with pytest.raises(ValueError, match="page_ids shape"):
    geometry.stack_pages(boxes, pages[:, :3])


def test_normalize_boxes_matches_document():
  rng = np.random.default_rng(1)
  sizes = np.array([[612.0, 792.0], [595.0, 842.0], [1000.0, 700.0]])
  pages = rng.integers(0, 3, 20)
  x0 = rng.uniform(0, sizes[pages, 0] * 0.8)
  y0 = rng.uniform(0, sizes[pages, 1] * 0.8)
  boxes = np.stack([x0, y0, x0 + rng.uniform(0, sizes[pages, 0] * 0.2),
                    y0 + rng.uniform(0, sizes[pages, 1] * 0.2)], axis=1)
  doc = Document.create("d", [f"w{i}" for i in range(20)], boxes, pages=pages, page_sizes=sizes)
  ours = geometry.normalize_boxes(doc.boxes.astype(np.float32), doc.page_sizes, doc.pages)
  assert ours.dtype == jnp.int32
  # Float32 vs the Document's float64 may round a .5 differently: allow one unit.
  assert np.abs(np.asarray(ours) - doc.normalized_boxes()).max() <= 1
  assert (np.asarray(ours) == doc.normalized_boxes()).mean() > 0.95
  stacked = np.asarray(geometry.document_boxes(doc.boxes, doc.page_sizes, doc.pages))
  np.testing.assert_allclose(stacked[:, 1], np.asarray(ours)[:, 1] + 1000 * doc.pages)
  # Batched and under jit.
  batched = jax.jit(geometry.normalize_boxes)(np.stack([boxes, boxes]).astype(np.float32),
                                              np.stack([sizes, sizes]), np.stack([pages, pages]))
  np.testing.assert_array_equal(batched[0], ours)


def test_normalize_boxes_rejects_bad_input():
  boxes = np.zeros((3, 4), np.float32)
  sizes = np.array([[100.0, 100.0]])
  with pytest.raises(ValueError, match=r"pages must lie in \[0, 1\)"):
    geometry.normalize_boxes(boxes, sizes, np.array([0, 1, 0]))
  with pytest.raises(ValueError, match="positive"):
    geometry.normalize_boxes(boxes, np.array([[0.0, 100.0]]), np.zeros(3, int))
  with pytest.raises(ValueError, match="pages shape"):
    geometry.normalize_boxes(boxes, sizes, np.zeros(2, int))
  with pytest.raises(ValueError, match="page_sizes"):
    geometry.normalize_boxes(boxes, np.zeros((0, 2)), np.zeros(3, int))


def test_pairwise_deltas_and_distances_match_loops():
  rng = np.random.default_rng(2)
  pq = rng.uniform(0, 1000, (2, 3, 2)).astype(np.float32)
  pk = rng.uniform(0, 1000, (1, 5, 2)).astype(np.float32)  # broadcasts over the batch
  dx, dy = map(np.asarray, geometry.pairwise_deltas(pq, pk))
  dist = np.asarray(geometry.pairwise_distances(pq, pk))
  assert dx.shape == dy.shape == dist.shape == (2, 3, 5)
  for b in range(2):
    for i in range(3):
      for j in range(5):
        assert dx[b, i, j] == pytest.approx(pk[0, j, 0] - pq[b, i, 0], abs=1e-3)
        assert dy[b, i, j] == pytest.approx(pk[0, j, 1] - pq[b, i, 1], abs=1e-3)
        assert dist[b, i, j] == pytest.approx(np.hypot(pk[0, j, 0] - pq[b, i, 0],
                                                       pk[0, j, 1] - pq[b, i, 1]), rel=1e-5)
  with pytest.raises(ValueError, match="do not broadcast"):
    geometry.pairwise_deltas(pq, rng.uniform(size=(3, 5, 2)))


def test_safe_norm_has_finite_gradient_at_origin():
  pts = jnp.array([[1.0, 2.0], [1.0, 2.0], [4.0, 6.0]])
  grad = jax.jit(jax.grad(lambda p: geometry.pairwise_distances(p, p).sum()))(pts)
  assert np.isfinite(np.asarray(grad)).all()
  np.testing.assert_allclose(geometry.pairwise_distances(pts, pts)[0, 2], 5.0)


def _block_indices_by_loop(n, b):
  nb = max(1, -(-n // b))
  q = np.full((nb, b), -1)
  k = np.full((nb, 3 * b), -1)
  for i in range(nb):
    for t in range(b):
      if i * b + t < n:
        q[i, t] = i * b + t
    for s in range(3 * b):
      tok = (i - 1) * b + s
      if 0 <= tok < n:
        k[i, s] = tok
  return q, k


@pytest.mark.parametrize("n,b", [(10, 4), (12, 4), (3, 5)])
def test_etc_block_indices_and_views(n, b):
  q_ref, k_ref = _block_indices_by_loop(n, b)
  q_idx, k_idx = geometry.etc_block_indices(n, b)
  np.testing.assert_array_equal(q_idx, q_ref)
  np.testing.assert_array_equal(k_idx, k_ref)
  assert geometry.etc_num_blocks(n, b) == q_ref.shape[0]
  rng = np.random.default_rng(n)
  x = rng.normal(size=(2, n, 3)).astype(np.float32)  # [B, N, G]
  qb = np.asarray(geometry.etc_query_blocks(x, b))  # [B, nb, b, G]
  kb = np.asarray(geometry.etc_key_blocks(x, b, pad_value=-7.0))  # [B, nb, 3b, G]
  for bi in range(2):
    for i in range(q_ref.shape[0]):
      for t in range(b):
        want = x[bi, q_ref[i, t]] if q_ref[i, t] >= 0 else np.zeros(3)
        np.testing.assert_array_equal(qb[bi, i, t], want)
      for s in range(3 * b):
        want = x[bi, k_ref[i, s]] if k_ref[i, s] >= 0 else np.full(3, -7.0)
        np.testing.assert_array_equal(kb[bi, i, s], want)
  # The token axis can sit anywhere: [G, B, N] with axis=-1.
  xt = np.moveaxis(x, (0, 1), (1, 2))  # [G, B, N]
  kt = np.asarray(geometry.etc_key_blocks(xt, b, axis=-1, pad_value=-7.0))  # [G, B, nb, 3b]
  np.testing.assert_array_equal(np.moveaxis(kt, 0, -1), kb)
  qt = np.asarray(geometry.etc_query_blocks(xt, b, axis=2))
  np.testing.assert_array_equal(np.moveaxis(qt, 0, -1), qb)


def test_blocking_is_jittable():
  x = jnp.arange(2 * 9 * 2, dtype=jnp.float32).reshape(2, 9, 2)
  f = jax.jit(lambda v: geometry.etc_key_blocks(v, 4))
  np.testing.assert_array_equal(f(x), geometry.etc_key_blocks(x, 4))
  with pytest.raises(ValueError, match="block length"):
    geometry.etc_block_indices(5, 0)
