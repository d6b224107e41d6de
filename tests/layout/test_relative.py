"""ETC relative ids and LayoutLMv2/v3 buckets: loops, and Hugging Face's own functions."""

import jax
import numpy as np
import pytest

from flaxdoc.layout import geometry, relative

_ids = jax.jit(relative.etc_relative_ids, static_argnums=2)
_rel = jax.jit(relative.relative_position_buckets,
               static_argnames=("bidirectional", "num_buckets", "max_distance"))
_rel2d = jax.jit(relative.layoutlmv2_2d_buckets, static_argnames=("num_buckets", "max_distance"))


def test_etc_relative_ids_match_loop_with_q_ne_k():
  rng = np.random.default_rng(0)
  pos_q = rng.integers(0, 60, (2, 5))
  pos_k = rng.integers(0, 60, (2, 9))
  got = np.asarray(_ids(pos_q, pos_k, 12))
  assert got.shape == (2, 5, 9) and got.dtype == np.int32
  for b in range(2):
    for i in range(5):
      for j in range(9):
        rel = pos_k[b, j] - pos_q[b, i]
        assert got[b, i, j] == min(max(rel, -12), 12) + 12


def test_etc_relative_ids_by_hand():
  pos = np.arange(30)
  ids = np.asarray(_ids(pos, pos, 12))
  assert ids[5, 5] == 12  # itself
  assert ids[5, 6] == 13 and ids[6, 5] == 11  # next / previous token
  assert ids[0, 29] == 24 and ids[29, 0] == 0  # clipped at +-12
  assert ids.min() == 0 and ids.max() == 24
  assert np.asarray(_ids(pos, pos, 3)).max() == 6


def test_etc_membership_ids_and_vocab():
  assert relative.etc_relative_vocab_size() == 27
  assert relative.etc_relative_vocab_size(4) == 11
  got = np.asarray(relative.etc_membership_ids(np.array([0, 0, 1]), np.array([0, 1])))
  np.testing.assert_array_equal(got, [[25, 26], [25, 26], [26, 25]])
  # FormNet: one global token, so every long token is a member of it.
  single = np.asarray(relative.etc_membership_ids(np.zeros(4, int), np.zeros(1, int)))
  np.testing.assert_array_equal(single, np.full((4, 1), 25))


def test_etc_ids_blocked_equal_dense():
  n, blk = 40, 13  # ETC radius 12 -> block 13
  pos = np.arange(n)
  dense = np.asarray(_ids(pos, pos, 12))
  q_idx, k_idx = geometry.etc_block_indices(n, blk)
  blocked = np.asarray(_ids(q_idx, k_idx, 12))  # positions are the token indices
  for i in range(q_idx.shape[0]):
    for t in range(blk):
      for s in range(3 * blk):
        if q_idx[i, t] >= 0 and k_idx[i, s] >= 0:
          assert blocked[i, t, s] == dense[q_idx[i, t], k_idx[i, s]]
          if abs(int(q_idx[i, t]) - int(k_idx[i, s])) <= 12:
            assert blocked[i, t, s] == k_idx[i, s] - q_idx[i, t] + 12  # unclipped in radius


def test_t5_buckets_round_float_offsets():
  got = np.asarray(relative.t5_relative_buckets(np.array([2.4, -2.6, 40.0, -0.2])))
  want = np.asarray(relative.t5_relative_buckets(np.array([2, -3, 40, 0])))
  np.testing.assert_array_equal(got, want)
  with pytest.raises(ValueError, match="max_distance"):
    relative.t5_relative_buckets(np.arange(3), num_buckets=32, max_distance=8)


def test_layoutlmv2_buckets_match_hugging_face():
  """Bucket ids fed through HF's bias tables equal HF LayoutLMv2's own relative biases."""
  torch = pytest.importorskip("torch")
  pytest.importorskip("transformers")
  # pylint: disable=import-outside-toplevel,protected-access
  from transformers import LayoutLMv2Config
  from transformers.models.layoutlmv2 import modeling_layoutlmv2 as hf

  # The bucket function itself, on every offset a 0..1000 coordinate can produce.
  rel = np.arange(-1000, 1001)
  for num_buckets, max_distance in ((32, 128), (64, 256)):
    want = hf.relative_position_bucket(torch.from_numpy(rel), num_buckets=num_buckets,
                                       max_distance=max_distance).numpy()
    got = relative.t5_relative_buckets(rel, num_buckets=num_buckets, max_distance=max_distance)
    np.testing.assert_array_equal(np.asarray(got), want)

  # The 1D and 2D relative biases of a (tiny) HF encoder, on random boxes.
  torch.manual_seed(0)
  config = LayoutLMv2Config(hidden_size=8, num_attention_heads=2, num_hidden_layers=1,
                            intermediate_size=8)
  encoder = hf.LayoutLMv2Encoder(config)
  rng = np.random.default_rng(1)
  xy0 = rng.integers(0, 950, (2, 7, 2))
  boxes = np.concatenate([xy0, xy0 + rng.integers(0, 50, (2, 7, 2))], axis=-1)
  with torch.no_grad():
    want_2d = encoder._calculate_2d_position_embeddings(torch.from_numpy(boxes)).numpy()
    want_1d = encoder._calculate_1d_position_embeddings(torch.arange(7)[None]).numpy()
  wx = encoder.rel_pos_x_bias.weight.detach().numpy()  # [H, 64]
  wy = encoder.rel_pos_y_bias.weight.detach().numpy()  # [H, 64]
  w1 = encoder.rel_pos_bias.weight.detach().numpy()  # [H, 32]
  bx, by = map(np.asarray, _rel2d(boxes, boxes, num_buckets=config.rel_2d_pos_bins,
                                  max_distance=config.max_rel_2d_pos))
  ours_2d = wx[:, bx].transpose(1, 0, 2, 3) + wy[:, by].transpose(1, 0, 2, 3)  # [B, H, N, N]
  np.testing.assert_allclose(ours_2d, want_2d, rtol=1e-6, atol=1e-6)
  b1 = np.asarray(_rel(np.arange(7)[None], np.arange(7)[None], num_buckets=config.rel_pos_bins,
                       max_distance=config.max_rel_pos))
  np.testing.assert_allclose(w1[:, b1].transpose(1, 0, 2, 3), want_1d, rtol=1e-6, atol=1e-6)


def test_layoutlmv2_buckets_use_x0_and_y1_and_round_floats():
  boxes = np.array([[[100, 100, 120, 110], [300, 50, 500, 110], [100, 400, 100, 700]]])
  bx, by = map(np.asarray, _rel2d(boxes, boxes, num_buckets=64, max_distance=256))
  dx0 = boxes[0, :, 0][None, :] - boxes[0, :, 0][:, None]
  dy1 = boxes[0, :, 3][None, :] - boxes[0, :, 3][:, None]
  want_x = np.asarray(relative.t5_relative_buckets(dx0, num_buckets=64, max_distance=256))
  want_y = np.asarray(relative.t5_relative_buckets(dy1, num_buckets=64, max_distance=256))
  np.testing.assert_array_equal(bx[0], want_x)
  np.testing.assert_array_equal(by[0], want_y)
  assert by[0, 0, 1] == 0  # same bottom edge (y1 = 110) although the tops differ
  assert bx[0, 0, 2] == 0  # same left edge (x0 = 100) although the right edges differ
  assert bx[0, 0, 1] >= 32 and bx[0, 1, 0] < 32  # key to the right: the "positive" half
  fx, fy = map(np.asarray, _rel2d(boxes + 0.3, boxes - 0.2, num_buckets=64, max_distance=256))
  np.testing.assert_array_equal(fx, bx)
  np.testing.assert_array_equal(fy, by)
