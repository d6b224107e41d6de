"""Rich Attention (FormNet eqs. 1-4) against a float64 loop over pairs, heads and axes."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxdoc.layout import geometry, rich

# Jitted once: eager evaluation compiles every small op separately, which is slow.
_rich_jit = jax.jit(rich.rich_attention_logits)

def _rich_reference(oq, ok, dq, dk, theta, cq, ck):
  """Plain loops: `out[b, h, i, j] = sum_a s_o + s_d` in float64."""
  bsz, heads, nq, axes = oq.shape
  nk = ok.shape[2]
  out = np.zeros((bsz, heads, nq, nk))
  for b in range(bsz):
    for h in range(heads):
      for i in range(nq):
        for j in range(nk):
          total = 0.0
          for a in range(axes):
            z = float(oq[b, h, i, a]) + float(ok[b, h, j, a])
            o = 1.0 if cq[b, i, a] < ck[b, j, a] else 0.0
            p = 1.0 / (1.0 + math.exp(-z))
            s_o = o * math.log(p) + (1.0 - o) * math.log(1.0 - p)
            d = math.log(1.0 + abs(float(cq[b, i, a]) - float(ck[b, j, a])))
            mu = float(dq[b, h, i, a]) + float(dk[b, h, j, a])
            s_d = -float(theta[h, a]) ** 2 * (d - mu) ** 2 / 2.0
            total += s_o + s_d
          out[b, h, i, j] = total
  return out


def _random_inputs(rng, bsz=2, heads=3, nq=4, nk=5, axes=3, same_tokens=False):
  oq = rng.normal(0, 2, (bsz, heads, nq, axes)).astype(np.float32)
  ok = rng.normal(0, 2, (bsz, heads, nk, axes)).astype(np.float32)
  dq = rng.normal(2, 1, (bsz, heads, nq, axes)).astype(np.float32)
  dk = rng.normal(0, 1, (bsz, heads, nk, axes)).astype(np.float32)
  theta = rng.normal(0, 1, (heads, axes)).astype(np.float32)
  # Integer coordinates (with ties) like 0..1000 box centres on two stacked pages.
  cq = rng.integers(0, 2000, (bsz, nq, axes)).astype(np.float32)
  ck = cq.copy() if same_tokens else rng.integers(0, 2000, (bsz, nk, axes)).astype(np.float32)
  ck[:, 0] = cq[:, 0]  # at least one tie per axis: order 0 both ways
  return oq, ok, dq, dk, theta, cq, ck


def test_matches_loop_reference_with_q_ne_k():
  rng = np.random.default_rng(0)
  args = _random_inputs(rng)
  got = np.asarray(_rich_jit(*args))
  assert got.shape == (2, 3, 4, 5)
  np.testing.assert_allclose(got, _rich_reference(*args), rtol=1e-5, atol=1e-4)
  assert (got <= 0).all()


def test_two_axes_and_shared_theta():
  rng = np.random.default_rng(1)
  oq, ok, dq, dk, theta, cq, ck = _random_inputs(rng, axes=2)
  shared = theta[:, 0]
  got = _rich_jit(oq, ok, dq, dk, shared, cq, ck)
  want = _rich_reference(oq, ok, dq, dk, np.repeat(shared[:, None], 2, axis=1), cq, ck)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_hand_built_layout():
  """A key to the right / left / below / above of the query at log-distance exactly 1."""
  step = math.e - 1.0  # ln(1 + step) == 1
  cq = np.array([[[100.0, 500.0]]], np.float32)  # [B=1, Q=1, A=2]
  ck = np.array([[[100.0 + step, 500.0], [100.0 - step, 500.0], [100.0, 500.0 + step],
                  [100.0, 500.0 - step]]], np.float32)  # right, left, below, above
  ones_q = np.ones((1, 1, 1, 2), np.float32)
  zeros_k = np.zeros((1, 1, 4, 2), np.float32)
  theta = np.ones((1, 2), np.float32)
  got = np.asarray(_rich_jit(2 * ones_q, zeros_k, 0 * ones_q, zeros_k, theta, cq, ck))[0, 0, 0]
  ls = lambda z: -math.log1p(math.exp(-z))  # log sigmoid
  # Predicted order logit z = 2 on both axes ("key after query"), predicted log-distance 0.
  # right: x in order (s_o = ls(2)), x distance 1 (s_d = -1/2); y tied: not in order (ls(-2)).
  right = ls(2) - 0.5 + ls(-2)
  left = ls(-2) - 0.5 + ls(-2)
  below = ls(-2) + ls(2) - 0.5  # image y grows downward: below means c_i < c_j
  above = ls(-2) + ls(-2) - 0.5
  np.testing.assert_allclose(got, [right, left, below, above], rtol=1e-5)  # float32 coords


def test_projection_scalars_match_loop():
  rng = np.random.default_rng(2)
  q = rng.normal(size=(2, 4, 3, 5)).astype(np.float32)  # [B, Q, H, D]
  w = rng.normal(size=(3, 5, 2)).astype(np.float32)  # [H, D, A]
  b = rng.normal(size=(3, 2)).astype(np.float32)  # [H, A]
  got = np.asarray(rich.rich_projection_scalars(q, w, b))
  assert got.shape == (2, 3, 4, 2)
  for bi in range(2):
    for h in range(3):
      for i in range(4):
        for a in range(2):
          want = sum(float(q[bi, i, h, d]) * float(w[h, d, a]) for d in range(5)) + b[h, a]
          assert got[bi, h, i, a] == pytest.approx(want, rel=1e-4, abs=1e-4)
  np.testing.assert_allclose(rich.rich_projection_scalars(q, w), got - b[None, :, None, :],
                             rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match=r"b must be \[H, A\]"):
    rich.rich_projection_scalars(q, w, b[:, :1])


def test_projection_scalars_of_bfloat16_queries_are_the_float32_sums_of_their_values():
  """bfloat16 `q` with float32 weights (as the layer calls it): float32 out, the sums of
  the bfloat16 values widened, not of a bfloat16 product."""
  rng = np.random.default_rng(3)
  q = jnp.asarray(rng.normal(size=(2, 6, 3, 64)), jnp.bfloat16)  # [B, Q, H, D]
  w = jnp.asarray(rng.normal(size=(3, 64, 4)), jnp.float32)  # [H, D, A]
  got = rich.rich_projection_scalars(q, w)
  assert got.dtype == jnp.float32 and got.shape == (2, 3, 6, 4)
  want = np.einsum("bqhd,hda->bhqa", np.asarray(q, np.float64), np.asarray(w, np.float64))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_axis_coordinates():
  c = np.array([[[1.0, 2.0], [3.0, 4.0]]])
  np.testing.assert_array_equal(rich.rich_axis_coordinates(c), c)
  got = rich.rich_axis_coordinates(c, np.array([[0, 1]]))
  np.testing.assert_array_equal(got, [[[1.0, 2.0, 0.0], [3.0, 4.0, 1.0]]])
  with pytest.raises(ValueError, match="positions"):
    rich.rich_axis_coordinates(c, np.array([[0, 1, 2]]))


def test_translation_invariance():
  rng = np.random.default_rng(3)
  oq, ok, dq, dk, theta, cq, ck = _random_inputs(rng)
  shift = np.array([37.0, 1000.0, 5.0], np.float32)  # another page, another x, another index
  a = _rich_jit(oq, ok, dq, dk, theta, cq, ck)
  b = _rich_jit(oq, ok, dq, dk, theta, cq + shift, ck + shift)
  np.testing.assert_array_equal(a, b)


def test_blocked_equals_dense():
  rng = np.random.default_rng(4)
  n, blk, heads = 10, 4, 2
  oq, ok, dq, dk, theta, c, _ = _random_inputs(rng, bsz=1, heads=heads, nq=n, nk=n, axes=3,
                                               same_tokens=True)
  dense = np.asarray(_rich_jit(oq, ok, dq, dk, theta, c, c))  # [B, H, N, N]

  def qblocks(x):  # [B, H, N, A] -> [B, nb, H, b, A]
    return jnp.moveaxis(geometry.etc_query_blocks(x, blk, axis=2), 1, 2)

  def kblocks(x):  # [B, H, N, A] -> [B, nb, H, 3b, A]
    return jnp.moveaxis(geometry.etc_key_blocks(x, blk, axis=2), 1, 2)

  @jax.jit
  def blocked_fn(oq, ok, dq, dk, c):
    return rich.rich_attention_logits(qblocks(oq), kblocks(ok), qblocks(dq), kblocks(dk), theta,
                                      geometry.etc_query_blocks(c, blk),
                                      geometry.etc_key_blocks(c, blk))

  blocked = np.asarray(blocked_fn(oq, ok, dq, dk, c))
  nb = geometry.etc_num_blocks(n, blk)
  assert blocked.shape == (1, nb, heads, blk, 3 * blk)
  q_idx, k_idx = geometry.etc_block_indices(n, blk)
  checked = 0
  for i in range(nb):
    for t in range(blk):
      for s in range(3 * blk):
        if q_idx[i, t] >= 0 and k_idx[i, s] >= 0:
          np.testing.assert_allclose(blocked[0, i, :, t, s], dense[0, :, q_idx[i, t], k_idx[i, s]],
                                     rtol=1e-6, atol=1e-6)
          checked += 1
  assert checked > n * blk  # every query saw its own block and at least one neighbour


def test_jit_and_gradients_match_finite_differences():
  rng = np.random.default_rng(5)
  oq, ok, dq, dk, theta, cq, ck = _random_inputs(rng, bsz=1, heads=2, nq=3, nk=4, axes=2)
  weights = rng.normal(size=(1, 2, 3, 4))

  def loss(oq_, dk_, theta_):
    return jnp.sum(rich.rich_attention_logits(oq_, ok, dq, dk_, theta_, cq, ck) * weights)

  np.testing.assert_allclose(_rich_jit(oq, ok, dq, dk, theta, cq, ck),
                             _rich_reference(oq, ok, dq, dk, theta, cq, ck), rtol=1e-5, atol=1e-4)
  g_oq, g_dk, g_theta = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(oq, dk, theta)
  for g in (g_oq, g_dk, g_theta):
    assert np.isfinite(np.asarray(g)).all()

  def ref_loss(oq_, dk_, theta_):
    return float(np.sum(_rich_reference(oq_, ok, dq, dk_, theta_, cq, ck) * weights))

  eps = 1e-5
  base = [oq.astype(np.float64), dk.astype(np.float64), theta.astype(np.float64)]
  for arg, grad, index in ((0, g_oq, (0, 1, 2, 0)), (1, g_dk, (0, 0, 3, 1)),
                           (2, g_theta, (0, 0)), (2, g_theta, (1, 1))):
    plus = [x.copy() for x in base]
    minus = [x.copy() for x in base]
    plus[arg][index] += eps
    minus[arg][index] -= eps
    fd = (ref_loss(*plus) - ref_loss(*minus)) / (2 * eps)
    assert float(grad[index]) == pytest.approx(fd, rel=2e-3, abs=2e-3)


def test_gradient_through_projection_weights():
  """d/dw of the Rich term through `rich_projection_scalars` (what the nn layer trains)."""
  rng = np.random.default_rng(6)
  q = rng.normal(size=(1, 3, 2, 4)).astype(np.float32)  # [B, Q, H, D]
  k = rng.normal(size=(1, 5, 2, 4)).astype(np.float32)  # [B, K, H, D]
  w = rng.normal(0, 0.3, size=(2, 4, 2)).astype(np.float32)
  c = rng.integers(0, 1000, (1, 5, 2)).astype(np.float32)

  def loss(w_):
    oq = rich.rich_projection_scalars(q, w_, jnp.zeros((2, 2)))
    ok = rich.rich_projection_scalars(k, w_)
    return rich.rich_attention_logits(oq, ok, oq, ok, jnp.ones((2, 2)), c[:, :3], c).sum()

  g = jax.jit(jax.grad(loss))(w)
  eps = 1e-2
  dw = np.zeros_like(w)
  dw[1, 2, 0] = eps
  loss_jit = jax.jit(loss)
  fd = (loss_jit(w + dw) - loss_jit(w - dw)) / (2 * eps)
  assert np.isfinite(np.asarray(g)).all()
  assert float(g[1, 2, 0]) == pytest.approx(float(fd), rel=1e-2, abs=1e-2)


def test_rejects_mismatched_shapes():
  rng = np.random.default_rng(7)
  oq, ok, dq, dk, theta, cq, ck = _random_inputs(rng)
  with pytest.raises(ValueError, match="order_k"):
    rich.rich_attention_logits(oq, ok[..., :2], dq, dk, theta, cq, ck)
  with pytest.raises(ValueError, match="theta"):
    rich.rich_attention_logits(oq, ok, dq, dk, theta[:2], cq, ck)
  with pytest.raises(ValueError, match="same number of axes"):
    rich.rich_attention_logits(oq, ok, dq, dk, theta, cq, ck[..., :2])
