"""Squircle and cross 2D relative weights and their cosFormer factorisations (DESIGN §3.6).

Douzon et al. weight each pair by fixed functions of the box-centre offset in
0..1000 units (`extent` = 1000, the `M` of cosFormer's `pi / 2M`):

* squircle `w = cos(pi/2 * dx / M) * cos(pi/2 * dy / M)`,
* cross `w = max(cos(pi/2 * dx / M), cos(pi/2 * dy / M))`.

In softmax attention the weight enters as `log(max(w, 1e-5))` added to the
scaled scores (same for all heads and layers): `log_weight_bias`.

In linear attention (LayoutCosformer, `phi = relu`) the weight multiplies the
similarity, which keeps the cost `O(N)` only through a sum-of-products
expansion `w(i, j) = sum_m f_m(i) f_m(j)`:

* 1D (cosFormer): `cos(a (i - j)) = cos(a i) cos(a j) + sin(a i) sin(a j)`,
  `a = pi / 2M` -> 2 factors per token;
* squircle: the product of the x and y expansions -> 4 factors
  `(cx cy, cx sy, sx cy, sx sy)`;
* cross: a `max` does not factorise; the released model runs two linear
  attentions (x factors and y factors) and keeps the element of larger
  magnitude, so `cross_factors_2d` returns the two factor pairs.

The cosines are in `[0, 1]` only while `|dx|, |dy| <= M`, and periodic beyond. With
pages stacked vertically (`y_doc = 1000 page + y`) cross-page offsets exceed 1000:
the pairwise weights (`squircle_weight`, `cross_weight`) clamp each offset at `M`,
so a pair more than `M` apart on an axis gets weight 0 on it (a word four pages
away is not "aligned" with `cos(2 pi) = 1`). The factorisations cannot clamp: the
linear attention needs `extent = 1000 * max_pages` (or documents split at page
boundaries) to keep its weights non-negative and monotone.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from flaxdoc.layout.geometry import check_last_dim, pairwise_deltas

DEFAULT_EXTENT = 1000.0
DEFAULT_FLOOR = 1e-5

__all__ = ["DEFAULT_EXTENT", "DEFAULT_FLOOR", "squircle_weight", "cross_weight",
           "log_weight_bias", "cos_reweight_factors_1d", "squircle_factors_2d",
           "cross_factors_2d"]


def _check_extent(extent: float) -> float:
  if not extent > 0:
    raise ValueError(f"extent must be positive, got {extent}")
  return float(extent)


def _axis_cosines(centers_q, centers_k, extent: float) -> tuple[jnp.ndarray, jnp.ndarray]:
  extent = _check_extent(extent)
  a = math.pi / (2.0 * extent)
  dx, dy = pairwise_deltas(centers_q, centers_k)  # [..., Q, K] each
  # Clamped at the extent: the cosine is 0 there and would come back up beyond it.
  dx = jnp.minimum(jnp.abs(dx), extent)
  dy = jnp.minimum(jnp.abs(dy), extent)
  # cos(pi / 2) is -4e-8 in float32: keep the weights in [0, 1].
  return (jnp.maximum(jnp.cos(a * dx), 0.0),
          jnp.maximum(jnp.cos(a * dy), 0.0))  # [..., Q, K] each


def squircle_weight(centers_q, centers_k, extent: float = DEFAULT_EXTENT) -> jnp.ndarray:
  """`cos(pi/2 dx/M) cos(pi/2 dy/M)` for `[..., Q, 2]`, `[..., K, 2]` centres: `[..., Q, K]`."""
  cx, cy = _axis_cosines(centers_q, centers_k, extent)  # [..., Q, K] each
  return cx * cy  # [..., Q, K]


def cross_weight(centers_q, centers_k, extent: float = DEFAULT_EXTENT) -> jnp.ndarray:
  """`max(cos(pi/2 dx/M), cos(pi/2 dy/M))`, `[..., Q, K]`: full weight along row and column."""
  cx, cy = _axis_cosines(centers_q, centers_k, extent)  # [..., Q, K] each
  return jnp.maximum(cx, cy)  # [..., Q, K]


def log_weight_bias(w, floor: float = DEFAULT_FLOOR) -> jnp.ndarray:
  """`log(max(w, floor))`: a weight in `[0, 1]` as an additive softmax bias (`<= 0`)."""
  if not floor > 0:
    raise ValueError(f"floor must be positive, got {floor}")
  return jnp.log(jnp.maximum(w, floor))


def cos_reweight_factors_1d(positions, max_len: float) -> jnp.ndarray:
  """cosFormer's factors `(cos(a i), sin(a i))`, `a = pi / 2M`: `[..., N] -> [..., N, 2]`.

  `cos(a (i - j)) = sum_m f_m(i) f_m(j)`; with `M` = the maximum length the
  weight stays in `(0, 1]`.
  """
  a = math.pi / (2.0 * _check_extent(max_len))
  p = a * jnp.asarray(positions, jnp.float32)  # [..., N]
  return jnp.stack([jnp.cos(p), jnp.sin(p)], axis=-1)  # [..., N, 2]


def cross_factors_2d(centers, extent: float = DEFAULT_EXTENT) -> tuple[jnp.ndarray, jnp.ndarray]:
  """The x and y factor pairs `(fx [..., N, 2], fy [..., N, 2])` of the cross weight.

  `sum_m fx_m(i) fx_m(j) = cos(pi/2 dx/M)` and likewise for y; the cross weight
  is the larger of the two (the linear attention keeps the larger-magnitude
  output of the two reweighted attentions).
  """
  check_last_dim(centers, 2, "centers")
  c = jnp.asarray(centers, jnp.float32)  # [..., N, 2]
  fx = cos_reweight_factors_1d(c[..., 0], extent)  # [..., N, 2]
  fy = cos_reweight_factors_1d(c[..., 1], extent)  # [..., N, 2]
  return fx, fy


def squircle_factors_2d(centers, extent: float = DEFAULT_EXTENT) -> jnp.ndarray:
  """Four factors per token with `squircle_weight(i, j) = sum_m f_m(i) f_m(j)`: `[..., N, 4]`.

  `(cx cy, cx sy, sx cy, sx sy)`, the products of the x and y cosFormer factors.
  """
  fx, fy = cross_factors_2d(centers, extent)  # [..., N, 2] each
  prod = fx[..., :, None] * fy[..., None, :]  # [..., N, 2, 2]
  return prod.reshape(prod.shape[:-2] + (4,))  # [..., N, 4]
