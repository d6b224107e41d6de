"""LAGaBi Gaussian polar bias against a float64 loop written from DESIGN §3.5."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxdoc.layout import gaussian, geometry

_bias = jax.jit(gaussian.gaussian_polar_bias, static_argnames=("alpha",))


def _bias_reference(pq, pk, mu_rho, mu_theta, sigma_rho, sigma_theta, alpha=4.0):
  """`alpha (g - 1)` per head and pair, exactly as DESIGN writes it (no numerical floor)."""
  heads = len(mu_rho)
  out = np.zeros((heads, len(pq), len(pk)))
  for h in range(heads):
    for i in range(len(pq)):
      for j in range(len(pk)):
        dx = float(pk[j, 0]) - float(pq[i, 0])
        dy = float(pk[j, 1]) - float(pq[i, 1])
        rho = math.sqrt(dx * dx + dy * dy)
        theta = math.atan2(dx, dy)
        diff = abs(theta - mu_theta[h])
        dtheta = min(diff, 2 * math.pi - diff)
        g = (math.exp(-(rho - mu_rho[h]) ** 2 / (2 * sigma_rho[h] ** 2))
             * math.exp(-dtheta ** 2 / (2 * sigma_theta[h] ** 2)))
        out[h, i, j] = alpha * (g - 1.0)
  return out


def _random_params(rng, heads):
  return dict(mu_rho=rng.uniform(0, 0.5, heads), mu_theta=rng.uniform(-math.pi, math.pi, heads),
              sigma_rho=rng.uniform(0.2, 1.0, heads) * rng.choice([-1, 1], heads),
              sigma_theta=rng.uniform(0.2, 2.0, heads))


def test_box_corner():
  boxes = np.array([[100.0, 200.0, 300.0, 400.0]], np.float32)
  np.testing.assert_allclose(gaussian.box_corner(boxes), [[0.1, 0.4]])  # bottom-left default
  np.testing.assert_allclose(gaussian.box_corner(boxes, "top_left"), [[0.1, 0.2]])
  np.testing.assert_allclose(gaussian.box_corner(boxes, "center"), [[0.2, 0.3]])
  np.testing.assert_allclose(gaussian.box_corner(boxes, "top_left", scale=100.0), [[1.0, 2.0]])
  with pytest.raises(ValueError, match="corner"):
    gaussian.box_corner(boxes, "bottom")


def test_matches_loop_reference_with_q_ne_k():
  rng = np.random.default_rng(0)
  pq = rng.uniform(0, 1, (2, 4, 2)).astype(np.float32)
  pk = rng.uniform(0, 1, (2, 6, 2)).astype(np.float32)
  pk[:, 0] = pq[:, 0]  # a coinciding pair: rho = 0, theta = 0
  params = _random_params(rng, 3)
  got = np.asarray(_bias(pq, pk, **{k: v.astype(np.float32) for k, v in params.items()}))
  assert got.shape == (2, 3, 4, 6)
  for b in range(2):
    np.testing.assert_allclose(got[b], _bias_reference(pq[b], pk[b], **params),
                               rtol=1e-4, atol=1e-4)
  assert (got <= 0).all() and (got >= -4.0).all()


def test_hand_built_directions():
  """theta = atan2(dx, dy): right pi/2, below 0, left -pi/2, above pi (image y down)."""
  pq = np.array([[0.5, 0.5]], np.float32)
  pk = np.array([[0.8, 0.5], [0.5, 0.8], [0.2, 0.5], [0.5, 0.2], [0.5, 0.5]], np.float32)
  one = lambda v: np.array([v], np.float32)
  got = np.asarray(_bias(pq, pk, one(0.3), one(math.pi / 2), one(0.1), one(0.5)))[0, 0]
  quarter = math.exp(-(math.pi / 2) ** 2 / (2 * 0.25))
  half = math.exp(-math.pi ** 2 / (2 * 0.25))
  self_pair = math.exp(-0.09 / 0.02) * quarter  # rho = 0 and theta = 0 for the self pair
  want = 4 * (np.array([1.0, quarter, half, quarter, self_pair]) - 1)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  # The angle difference is circular: mu just past -pi is close to "above" (theta = pi).
  circ = np.asarray(_bias(pq, pk[3:4], one(0.3), one(-math.pi + 0.1), one(0.1), one(0.5)))
  np.testing.assert_allclose(circ[0, 0, 0], 4 * (math.exp(-0.01 / 0.5) - 1), rtol=1e-4)


def test_points_an_ulp_apart_count_as_the_self_pair():
  # What an FMA makes of `a * s - b * s` for equal a, b: a few ulp, in any direction.
  p = np.float32(0.37)
  pq = np.array([[p, p]], np.float32)
  pk = np.array([[p, p], [np.nextafter(p, np.float32(1)), p], [p, np.nextafter(p, np.float32(0))]],
                np.float32)
  rho, theta = gaussian.polar_coordinates(pq, pk)
  np.testing.assert_array_equal(np.asarray(theta), np.zeros((1, 3)))
  assert (np.asarray(rho) < gaussian.ORIGIN_RADIUS).all()
  # Far enough apart, the angle is the real one.
  _, theta = gaussian.polar_coordinates(pq, np.array([[p + 1e-3, p]], np.float32))
  np.testing.assert_allclose(np.asarray(theta), [[math.pi / 2]], rtol=1e-6)


def test_mu_theta_is_periodic_and_alpha_scales():
  rng = np.random.default_rng(1)
  pq = rng.uniform(0, 1, (5, 2)).astype(np.float32)
  params = {k: v.astype(np.float32) for k, v in _random_params(rng, 2).items()}
  base = _bias(pq, pq, **params)
  wrapped = dict(params, mu_theta=params["mu_theta"] + np.float32(4 * math.pi))
  np.testing.assert_allclose(_bias(pq, pq, **wrapped), base, atol=2e-5)
  np.testing.assert_allclose(_bias(pq, pq, **params, alpha=1.0), np.asarray(base) / 4, atol=1e-6)


def test_zero_sigma_is_finite_with_finite_gradients():
  pq = jnp.array([[0.1, 0.2], [0.4, 0.2], [0.1, 0.2]])
  zeros = jnp.zeros(2)

  def loss(mu_rho, sigma_rho, sigma_theta):
    return gaussian.gaussian_polar_bias(pq, pq, mu_rho, zeros, sigma_rho, sigma_theta).sum()

  val, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(zeros, zeros, zeros)
  assert np.isfinite(float(val))
  for g in grads:
    assert np.isfinite(np.asarray(g)).all()


def test_init_gaussian_params():
  params = gaussian.init_gaussian_params(jax.random.PRNGKey(0), 12)
  assert set(params) == {"mu_rho", "mu_theta", "sigma_rho", "sigma_theta"}
  for name, value in params.items():
    lo, hi = gaussian.INIT_RANGES[name]
    assert value.shape == (12,) and value.dtype == jnp.float32
    assert float(value.min()) >= lo and float(value.max()) <= hi
    assert float(value.std()) > 0
  assert sum(int(v.size) for v in params.values()) == 48  # LAGaBi's 48 layout parameters
  again = gaussian.init_gaussian_params(jax.random.PRNGKey(0), 12)
  other = gaussian.init_gaussian_params(jax.random.PRNGKey(1), 12)
  np.testing.assert_array_equal(again["sigma_rho"], params["sigma_rho"])
  assert not np.allclose(other["sigma_rho"], params["sigma_rho"])
  assert float(params["sigma_rho"].max()) > 0.1  # sigma ~ U(0, 1), not U(0, 0.01)


def test_translation_invariance():
  rng = np.random.default_rng(2)
  pq = rng.uniform(0, 1, (1, 6, 2)).astype(np.float32)
  params = {k: v.astype(np.float32) for k, v in _random_params(rng, 3).items()}
  moved = pq + np.array([0.25, 1.0], np.float32)  # right and one page down
  np.testing.assert_allclose(_bias(moved, moved, **params), _bias(pq, pq, **params), atol=2e-4)


def test_blocked_equals_dense():
  rng = np.random.default_rng(3)
  n, blk = 10, 4
  pts = rng.uniform(0, 1, (1, n, 2)).astype(np.float32)
  params = {k: v.astype(np.float32) for k, v in _random_params(rng, 2).items()}
  dense = np.asarray(_bias(pts, pts, **params))  # [1, H, N, N]

  @jax.jit
  def blocked_fn(p):
    return gaussian.gaussian_polar_bias(geometry.etc_query_blocks(p, blk),
                                        geometry.etc_key_blocks(p, blk), **params)

  blocked = np.asarray(blocked_fn(pts))  # [1, nb, H, b, 3b]
  q_idx, k_idx = geometry.etc_block_indices(n, blk)
  for i in range(q_idx.shape[0]):
    for t in range(blk):
      for s in range(3 * blk):
        if q_idx[i, t] >= 0 and k_idx[i, s] >= 0:
          np.testing.assert_allclose(blocked[0, i, :, t, s], dense[0, :, q_idx[i, t], k_idx[i, s]],
                                     rtol=1e-6, atol=1e-6)


def test_gradients_match_finite_differences():
  rng = np.random.default_rng(4)
  pq = rng.uniform(0, 1, (3, 2)).astype(np.float32)
  pk = rng.uniform(0, 1, (4, 2)).astype(np.float32)
  params = _random_params(rng, 2)
  weights = rng.normal(size=(2, 3, 4))
  names = ("mu_rho", "mu_theta", "sigma_rho", "sigma_theta")

  def loss(*p):
    return jnp.sum(gaussian.gaussian_polar_bias(pq, pk, *p) * weights)

  grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(
      *[jnp.asarray(params[n], jnp.float32) for n in names])
  eps = 1e-6
  for a, name in enumerate(names):
    for h in range(2):
      plus = {k: v.copy() for k, v in params.items()}
      minus = {k: v.copy() for k, v in params.items()}
      plus[name][h] += eps
      minus[name][h] -= eps
      fd = (np.sum(_bias_reference(pq, pk, **plus) * weights)
            - np.sum(_bias_reference(pq, pk, **minus) * weights)) / (2 * eps)
      assert np.isfinite(float(grads[a][h]))
      assert float(grads[a][h]) == pytest.approx(fd, rel=2e-3, abs=2e-4), (name, h)


def test_rejects_bad_parameter_shapes():
  pts = np.zeros((3, 2), np.float32)
  with pytest.raises(ValueError, match=r"\[H\]"):
    gaussian.gaussian_polar_bias(pts, pts, np.zeros(2), np.zeros(2), np.ones(2), np.ones(3))
  with pytest.raises(ValueError, match=r"pts_q must have shape \[\.\.\., 2\]"):
    gaussian.gaussian_polar_bias(np.zeros((3, 4)), pts, *([np.ones(2)] * 4))
