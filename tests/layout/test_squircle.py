"""Squircle / cross weights and their cosFormer sum-of-products factorisations."""

import math

import jax
import numpy as np
import pytest

from flaxdoc.layout import geometry, squircle

_sq = jax.jit(squircle.squircle_weight, static_argnames=("extent",))
_cross = jax.jit(squircle.cross_weight, static_argnames=("extent",))


def _weights_reference(cq, ck, extent=1000.0):
  sq = np.zeros((len(cq), len(ck)))
  cr = np.zeros((len(cq), len(ck)))
  for i in range(len(cq)):
    for j in range(len(ck)):
      dx = min(abs(float(ck[j, 0]) - float(cq[i, 0])), extent)
      dy = min(abs(float(ck[j, 1]) - float(cq[i, 1])), extent)
      wx = math.cos(math.pi / 2 * dx / extent)
      wy = math.cos(math.pi / 2 * dy / extent)
      sq[i, j] = wx * wy
      cr[i, j] = max(wx, wy)
  return sq, cr


def test_weights_match_loop_with_q_ne_k():
  rng = np.random.default_rng(0)
  cq = rng.uniform(0, 1000, (2, 5, 2)).astype(np.float32)
  ck = rng.uniform(0, 1000, (2, 7, 2)).astype(np.float32)
  sq, cr = np.asarray(_sq(cq, ck)), np.asarray(_cross(cq, ck))
  assert sq.shape == cr.shape == (2, 5, 7)
  for b in range(2):
    want_sq, want_cr = _weights_reference(cq[b], ck[b])
    np.testing.assert_allclose(sq[b], want_sq, atol=1e-6)
    np.testing.assert_allclose(cr[b], want_cr, atol=1e-6)
  assert (sq >= 0).all() and (sq <= 1).all() and (cr >= sq - 1e-7).all()


def test_hand_built_weights():
  cq = np.array([[500.0, 500.0]], np.float32)
  ck = np.array([[500.0, 500.0],   # itself
                 [1000.0, 500.0],  # same row, half a page away
                 [500.0, 0.0],     # same column, half a page away
                 [1000.0, 1000.0],  # diagonal
                 [0.0, 1500.0]], np.float32)  # a full page below
  c = math.cos(math.pi / 4)
  np.testing.assert_allclose(_sq(cq, ck)[0], [1.0, c, c, c * c, 0.0], atol=1e-6)
  np.testing.assert_allclose(_cross(cq, ck)[0], [1.0, 1.0, 1.0, c, c], atol=1e-6)


def test_log_weight_bias_floors():
  w = np.array([1.0, 0.5, 1e-7, 0.0, -0.3], np.float32)
  got = np.asarray(squircle.log_weight_bias(w))
  np.testing.assert_allclose(got, [0.0, math.log(0.5)] + [math.log(1e-5)] * 3, rtol=1e-6)
  assert np.isfinite(got).all()
  with pytest.raises(ValueError, match="floor"):
    squircle.log_weight_bias(w, floor=0.0)


def test_cos_reweight_factors_1d_factorise_exactly():
  pos = np.arange(0, 300, 7)
  f = np.asarray(squircle.cos_reweight_factors_1d(pos, 512))  # [N, 2]
  want = np.cos(math.pi / (2 * 512) * (pos[:, None] - pos[None, :]))
  np.testing.assert_allclose(f @ f.T, want, atol=1e-6)
  assert ((f @ f.T) > 0).all()  # M = max length keeps the weight positive


def test_squircle_and_cross_factors_factorise_exactly():
  rng = np.random.default_rng(1)
  c = rng.uniform(0, 1000, (2, 9, 2)).astype(np.float32)
  f = np.asarray(squircle.squircle_factors_2d(c))  # [B, N, 4]
  assert f.shape == (2, 9, 4)
  np.testing.assert_allclose(np.einsum("bim,bjm->bij", f, f), _sq(c, c), atol=1e-6)
  fx, fy = map(np.asarray, squircle.cross_factors_2d(c))
  wx = np.einsum("bim,bjm->bij", fx, fx)
  wy = np.einsum("bim,bjm->bij", fy, fy)
  np.testing.assert_allclose(np.maximum(wx, wy), _cross(c, c), atol=1e-6)
  np.testing.assert_allclose(wx * wy, _sq(c, c), atol=1e-6)
  # A multi-page strip needs a larger extent to stay non-negative.
  strip = c * np.array([1.0, 3.0], np.float32)
  f3 = np.asarray(squircle.squircle_factors_2d(strip, extent=3000.0))
  np.testing.assert_allclose(np.einsum("bim,bjm->bij", f3, f3),
                             _sq(strip, strip, extent=3000.0), atol=1e-6)


def test_factors_give_linear_attention_equal_to_reweighted_dense():
  """relu linear attention reweighted by squircle, O(N) through the factors == dense."""
  rng = np.random.default_rng(2)
  n, d = 12, 5
  q = np.maximum(rng.normal(size=(n, d)), 0)
  k = np.maximum(rng.normal(size=(n, d)), 0)
  v = rng.normal(size=(n, d))
  c = rng.uniform(0, 1000, (n, 2)).astype(np.float32)
  w = np.asarray(_sq(c, c), np.float64)  # [N, N]
  dense_scores = (q @ k.T) * w
  dense = dense_scores @ v / dense_scores.sum(-1, keepdims=True)
  f = np.asarray(squircle.squircle_factors_2d(c), np.float64)  # [N, 4]
  qf = q[:, None, :] * f[:, :, None]  # [N, 4, d]
  kf = k[:, None, :] * f[:, :, None]  # [N, 4, d]
  num = np.einsum("imd,mde->ie", qf, np.einsum("jmd,je->mde", kf, v))
  den = np.einsum("imd,md->i", qf, kf.sum(0))
  np.testing.assert_allclose(num / den[:, None], dense, rtol=1e-4, atol=1e-5)


def test_translation_invariance():
  rng = np.random.default_rng(3)
  c = rng.uniform(0, 1000, (1, 8, 2)).astype(np.float32)
  moved = c + np.array([123.0, 1000.0], np.float32)
  np.testing.assert_allclose(_sq(moved, moved), _sq(c, c), atol=1e-5)
  np.testing.assert_allclose(_cross(moved, moved), _cross(c, c), atol=1e-5)
  np.testing.assert_allclose(squircle.log_weight_bias(_sq(moved, moved)),
                             squircle.log_weight_bias(_sq(c, c)), atol=1e-3)


def test_blocked_equals_dense():
  rng = np.random.default_rng(4)
  n, blk = 11, 4
  c = rng.uniform(0, 1000, (2, n, 2)).astype(np.float32)
  dense = np.asarray(_cross(c, c))

  @jax.jit
  def blocked_fn(x):
    return squircle.cross_weight(geometry.etc_query_blocks(x, blk), geometry.etc_key_blocks(x, blk))

  blocked = np.asarray(blocked_fn(c))  # [B, nb, b, 3b]
  q_idx, k_idx = geometry.etc_block_indices(n, blk)
  for i in range(q_idx.shape[0]):
    for t in range(blk):
      for s in range(3 * blk):
        if q_idx[i, t] >= 0 and k_idx[i, s] >= 0:
          np.testing.assert_allclose(blocked[:, i, t, s], dense[:, q_idx[i, t], k_idx[i, s]],
                                     atol=1e-6)


def test_stacked_pages_are_not_periodic():
  # Same x, pages 1..4 below (y_doc = 1000 page + y): cos(pi/2 * 4000/1000) would be 1.
  cq = np.array([[500.0, 100.0]], np.float32)
  ck = np.array([[500.0, 100.0 + 1000.0 * p] for p in range(5)] + [[500.0, 2100.0 - 1e-3]],
                np.float32)
  sq, cr = np.asarray(_sq(cq, ck))[0], np.asarray(_cross(cq, ck))[0]
  np.testing.assert_allclose(sq[:5], [1, 0, 0, 0, 0], atol=1e-6)
  np.testing.assert_allclose(cr[:5], [1, 1, 1, 1, 1], atol=1e-6)  # same column: x-aligned
  assert (sq >= 0).all() and (sq <= 1).all()
  want_sq, want_cr = _weights_reference(cq, ck)
  np.testing.assert_allclose(sq, want_sq[0], atol=1e-6)
  np.testing.assert_allclose(cr, want_cr[0], atol=1e-6)
  bias = np.asarray(squircle.log_weight_bias(sq))
  np.testing.assert_allclose(bias[1:5], np.log(squircle.DEFAULT_FLOOR), rtol=1e-6)


def test_rejects_bad_extent():
  with pytest.raises(ValueError, match="extent"):
    squircle.squircle_weight(np.zeros((2, 2)), np.zeros((2, 2)), extent=0.0)
