"""LAGaBi's Gaussian layout bias (DESIGN §3.5).

Each head has a 2D Gaussian kernel over polar coordinates of the key seen from
the query, with four parameters `(mu_rho, mu_theta, sigma_rho, sigma_theta)`
shared across layers (48 numbers for 12 heads). The attention score becomes
`q.k / sqrt(d) + alpha * (g - 1)` with `alpha = 4`, so close pairs keep their
score and far pairs are pushed down by up to `alpha`.

Coordinates are one box corner in 0-1 units (the LayoutLM 0..1000 value / 1000);
the released code uses the bottom-left corner `(x0, y1)` and reports it better
than the paper's top-left, so that is the default of `box_corner`.

With `(dx, dy)` the key-minus-query offset:
`rho = sqrt(dx^2 + dy^2)`, `theta = atan2(dx, dy)` (the released argument order:
the angle from the downward y axis, in `(-pi, pi]`), and the circular difference
`dtheta = min(w, 2 pi - w)` with `w = (theta - mu_theta) mod 2 pi` - the same as
DESIGN's `min(|theta - mu|, 2 pi - |theta - mu|)` whenever `|theta - mu| <= 2 pi`,
and still a proper circular distance if a learned `mu_theta` wanders further.

Numerical guard: the kernel divides by `sigma^2`, and `sigma ~ U(0, 1)` at
initialisation can be arbitrarily close to 0 (and a learned sigma can cross 0).
The kernel uses `sigma^2 + SIGMA_FLOOR^2` (`SIGMA_FLOOR = 1e-3`, far below any
useful width in 0-1 units) as the variance: smooth, sign-agnostic, never a
division by zero, and the gradient w.r.t. sigma stays finite (bounded by
roughly `3e8 * g`, with `g = exp(-huge)` = 0 wherever it is large).
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from flaxdoc.layout.geometry import box_point, pairwise_deltas, safe_norm

# LAGaBi's alpha (tuned on CORD in the paper).
DEFAULT_ALPHA = 4.0
# Smallest effective standard deviation of either kernel axis (0-1 units / radians).
SIGMA_FLOOR = 1e-3
# The released initialiser: mu ~ U(0, 0.01), sigma ~ U(0, 1).
INIT_RANGES = {
    "mu_rho": (0.0, 0.01),
    "mu_theta": (0.0, 0.01),
    "sigma_rho": (0.0, 1.0),
    "sigma_theta": (0.0, 1.0),
}
CORNERS = ("bottom_left", "top_left", "center")

__all__ = ["DEFAULT_ALPHA", "SIGMA_FLOOR", "INIT_RANGES", "CORNERS", "box_corner",
           "polar_coordinates", "gaussian_polar_bias", "uniform_initializer",
           "init_gaussian_params"]


def box_corner(boxes, corner: str = "bottom_left", scale: float = 1000.0) -> jnp.ndarray:
  """The reference point of each box in 0-1 units: `[..., 4] -> [..., 2]`.

  Args:
    boxes: `[..., 4]` boxes in LayoutLM units (document coordinates: page `p`
      starts at `y = 1000 p`, so the result's y is `p + y / 1000`).
    corner: "bottom_left" `(x0, y1)` (released, default), "top_left" `(x0, y0)`
      (paper) or "center".
    scale: the boxes' unit per 1 (1000 for LayoutLM units).
  """
  if corner not in CORNERS:
    raise ValueError(f"unknown corner {corner!r}; expected one of {CORNERS}")
  if scale <= 0:
    raise ValueError(f"scale must be positive, got {scale}")
  return box_point(boxes, corner) / scale  # [..., 2]


# Below this distance (in the points' units) two points coincide; the rho of the
# pair is kept (it is ~0 anyway), only the angle is set to 0.
ORIGIN_RADIUS = 1e-6


def polar_coordinates(pts_q, pts_k) -> tuple[jnp.ndarray, jnp.ndarray]:
  """`(rho, theta)`, each `[..., Q, K]`: distance and `atan2(dx, dy)` of key from query.

  Both have finite gradients w.r.t. the points everywhere (at coinciding points
  `theta` is 0 with zero gradient). Points closer than `ORIGIN_RADIUS` count as
  coinciding: under jit, XLA may fuse `a * s - b * s` into an FMA, so two equal
  points scaled on each side can come out an ulp apart, and an arbitrary angle
  for the self pair would cost up to `alpha` of bias.
  """
  dx, dy = pairwise_deltas(pts_q, pts_k)  # [..., Q, K] each
  rho = safe_norm(dx, dy)  # [..., Q, K]
  origin = rho < ORIGIN_RADIUS  # [..., Q, K]
  theta = jnp.where(origin, 0.0, jnp.arctan2(jnp.where(origin, 1.0, dx),
                                             jnp.where(origin, 1.0, dy)))  # [..., Q, K]
  return rho, theta


ANGLES = ("released", "paper")


def paper_angle(pts_q, pts_k) -> jnp.ndarray:
  """LAGaBi's paper angle (its eq. 2): `theta = arctan(dy / dx)` in `[-pi/2, pi/2]`, `[..., Q, K]`.

  Unlike the released `atan2(dx, dy)` it cannot tell left from right (a key at angle
  `theta` and its mirror through the query share it). `dx = 0` gives `+-pi/2` by the
  sign of `dy`; coinciding points give 0 with zero gradient.
  """
  dx, dy = pairwise_deltas(pts_q, pts_k)  # [..., Q, K] each
  origin = safe_norm(dx, dy) < ORIGIN_RADIUS  # [..., Q, K]
  vertical = jnp.abs(dx) < ORIGIN_RADIUS  # [..., Q, K]
  safe_dx = jnp.where(vertical, 1.0, dx)
  theta = jnp.where(vertical, jnp.sign(dy) * (math.pi / 2), jnp.arctan(dy / safe_dx))
  return jnp.where(origin, 0.0, theta)  # [..., Q, K]


def _per_head(x, name: str) -> jnp.ndarray:
  x = jnp.asarray(x, jnp.float32)
  if x.ndim != 1:
    raise ValueError(f"{name} must have shape [H], got {list(x.shape)}")
  return x[:, None, None]  # [H, 1, 1]


def gaussian_polar_bias(pts_q, pts_k, mu_rho, mu_theta, sigma_rho, sigma_theta,
                        alpha: float = DEFAULT_ALPHA, angle: str = "released") -> jnp.ndarray:
  """LAGaBi's additive attention bias `alpha * (g - 1)`, `[..., H, Q, K]`, in `[-alpha, 0]`.

  Args:
    pts_q: `[..., Q, 2]` query reference points in 0-1 units (`box_corner`).
    pts_k: `[..., K, 2]` key reference points.
    mu_rho, mu_theta, sigma_rho, sigma_theta: `[H]` per-head kernel parameters.
    alpha: the bias weight (4 in the paper).
    angle: "released" (`atan2(dx, dy)`, circular angle difference) or "paper"
      (`paper_angle`, plain difference `theta - mu_theta`).

  Returns:
    `float32 [..., H, Q, K]`; differentiable in the four parameters.
  """
  heads = {np.shape(p)[0] if np.ndim(p) else None
           for p in (mu_rho, mu_theta, sigma_rho, sigma_theta)}
  if len(heads) != 1:
    raise ValueError("mu_rho, mu_theta, sigma_rho, sigma_theta must all have shape [H]")
  m_rho, m_theta = _per_head(mu_rho, "mu_rho"), _per_head(mu_theta, "mu_theta")  # [H, 1, 1]
  s_rho, s_theta = _per_head(sigma_rho, "sigma_rho"), _per_head(sigma_theta, "sigma_theta")
  var_rho = jnp.square(s_rho) + SIGMA_FLOOR ** 2  # [H, 1, 1]
  var_theta = jnp.square(s_theta) + SIGMA_FLOOR ** 2  # [H, 1, 1]
  if angle not in ANGLES:
    raise ValueError(f"angle must be one of {ANGLES}, got {angle!r}")
  rho, theta = polar_coordinates(pts_q, pts_k)  # [..., Q, K] each
  rho = rho[..., None, :, :]  # [..., 1, Q, K]
  if angle == "paper":
    theta = paper_angle(pts_q, pts_k)[..., None, :, :]  # [..., 1, Q, K]
    dtheta = theta - m_theta  # [..., H, Q, K]
  else:
    theta = theta[..., None, :, :]  # [..., 1, Q, K]
    wrapped = jnp.mod(theta - m_theta, 2.0 * math.pi)  # [..., H, Q, K] in [0, 2 pi)
    dtheta = jnp.minimum(wrapped, 2.0 * math.pi - wrapped)  # [..., H, Q, K] in [0, pi]
  exponent = (jnp.square(rho - m_rho) / (2.0 * var_rho)
              + jnp.square(dtheta) / (2.0 * var_theta))  # [..., H, Q, K]
  g = jnp.exp(-exponent)  # [..., H, Q, K]
  return alpha * (g - 1.0)  # [..., H, Q, K]


def uniform_initializer(low: float, high: float) -> Callable:
  """A Flax-style initializer `(key, shape, dtype) -> U(low, high)` samples."""

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, minval=low, maxval=high)

  return init


def init_gaussian_params(key, num_heads: int, dtype=jnp.float32) -> dict[str, jnp.ndarray]:
  """The four `[num_heads]` kernel parameters, drawn from `INIT_RANGES`.

  The released LAGaBi code defines this initialiser but never calls it;
  flaxdoc does call it, as DESIGN §3.5 says.
  """
  if num_heads < 1:
    raise ValueError(f"num_heads must be >= 1, got {num_heads}")
  keys = jax.random.split(key, len(INIT_RANGES))
  return {name: uniform_initializer(lo, hi)(k, (num_heads,), dtype)
          for k, (name, (lo, hi)) in zip(keys, INIT_RANGES.items())}
