"""DocPolarBERT's polar relative attention terms (DESIGN §3.4).

Three relative terms, each a learned vector per bucket (size = head dim,
shared by all layers and heads), enter the score as
`(q.k + q.r_1d + q.r_dist + q.r_angle) / sqrt(d)`:

* distance: `rho_ij = |c_j - c_i|` between box centres, bucketed by quantiles of
  all valid pairwise distances **of that document** (the paper); the released
  code pools a whole batch (`pool="batch"`). Quantile edges are computed over
  unordered pairs `i < j` of valid tokens (self pairs excluded: they are all 0
  and would drag the lower edges to 0), with numpy's default "linear"
  interpolation. Bucket `b` holds `edges[b] <= rho < edges[b + 1]`; distances
  below the first or beyond the last edge go to the first or last bucket.
  Uniformly scaling a page scales distances and edges alike, so buckets do not
  change.
* angle, as the released model (14 codes), from `d = c_j - c_i` and
  `phi = (360 - degrees(atan2(dy, dx))) mod 360` (counter-clockwise, y up: 0 =
  right, 90 = above): boxes whose horizontal extents overlap get 2 (above,
  `phi < 180`) or 4 (below); otherwise boxes whose vertical extents overlap get 1
  (right, `phi < 90 or phi > 270`) or 3 (left); all others get
  `floor(phi / 45) + 5` (5..12); the self pair 0, padding 13. The paper's plain
  8 direction sectors are `angle_sectors8`.
* 1D: T5 bidirectional buckets of the sequence offset (32 buckets, max 128).

The logits are computed as `q @ table.T` (`[..., H, Q, buckets]`) followed by a
gather along the bucket axis - never a `[Q, K, head_dim]` tensor (DESIGN §2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from flaxdoc.layout.geometry import (box_centers, check_last_dim,
                                     check_pair_shapes, is_concrete, pairwise_deltas,
                                     pairwise_distances)
from flaxdoc.layout.relative import relative_position_buckets, t5_relative_buckets

# Angle vocabularies: 14 codes for the released scheme, 10 for the plain sectors.
NUM_ANGLE_CODES = 14
NUM_ANGLE_SECTORS8_CODES = 10
ANGLE_SELF = 0
ANGLE_PADDING = 13
SECTORS8_PADDING = 9

DISTANCE_POOLS = ("document", "batch")

__all__ = [
    "NUM_ANGLE_CODES", "NUM_ANGLE_SECTORS8_CODES", "ANGLE_SELF", "ANGLE_PADDING",
    "SECTORS8_PADDING", "DISTANCE_POOLS", "pair_masks", "distance_quantile_edges",
    "distance_buckets", "angle_octants", "angle_codes_released", "angle_sectors8",
    "t5_relative_buckets", "relative_position_buckets", "bucketed_dot_logits",
]


def pair_masks(index_q, index_k, valid_q, valid_k) -> tuple[jnp.ndarray, jnp.ndarray]:
  """`(is_self, valid)`, each `bool [..., Q, K]`, from token indices and token masks.

  `index_*` identify tokens (e.g. sequence positions, also inside ETC blocks),
  so a query meets itself where the indices agree; a pair is valid when both
  tokens are.
  """
  check_pair_shapes(index_q, index_k, "index_q", "index_k", feature_axes=0)
  is_self = jnp.asarray(index_q)[..., :, None] == jnp.asarray(index_k)[..., None, :]  # [..., Q, K]
  valid = (jnp.asarray(valid_q, bool)[..., :, None]
           & jnp.asarray(valid_k, bool)[..., None, :])  # [..., Q, K]
  return is_self, valid


# ----------------------------------------------------------------- distance
def distance_quantile_edges(centers, mask, num_buckets: int = 4, *,
                            pool: str = "document") -> jnp.ndarray:
  """Quantile bucket edges of the pairwise centre distances, per document or per batch.

  Args:
    centers: `[B, N, 2]` box centres (any unit; document coordinates with stacked
      pages for multi-page documents).
    mask: `[B, N]` bool, True for real tokens.
    num_buckets: number of distance buckets (4 in the paper).
    pool: "document" (paper: each document's own quantiles) or "batch" (released
      code: one set of edges from the pairs of all documents of the batch; pairs
      are still taken within documents only).

  Returns:
    `float32 [B, num_buckets + 1]`: the quantiles at `0, 1/nb, ..., 1` of the
    distances over unordered valid pairs `i < j`. A document with fewer than two
    valid tokens gets all-zero edges (all its pairs fall in bucket 0). No
    gradient flows through the edges.

  Cost: sorts `B * N * N` distances, so it is meant for dense-attention lengths
  (DocPolarBERT's 512); for very long inputs compute the edges once per
  document in the input pipeline.
  """
  check_last_dim(centers, 2, "centers")
  if np.ndim(centers) != 3 or np.shape(mask) != np.shape(centers)[:2]:
    raise ValueError(f"centers must be [B, N, 2] and mask [B, N], got {list(np.shape(centers))} "
                     f"and {list(np.shape(mask))}")
  if num_buckets < 1:
    raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
  if pool not in DISTANCE_POOLS:
    raise ValueError(f"unknown pool {pool!r}; expected one of {DISTANCE_POOLS}")
  c = jax.lax.stop_gradient(jnp.asarray(centers, jnp.float32))  # [B, N, 2]
  m = jnp.asarray(mask, bool)  # [B, N]
  b, n = m.shape
  dist = pairwise_distances(c, c)  # [B, N, N]
  upper = jnp.triu(jnp.ones((n, n), bool), k=1)  # [N, N]
  pair_ok = m[:, :, None] & m[:, None, :] & upper  # [B, N, N]
  groups = 1 if pool == "batch" else b
  flat_d = dist.reshape(groups, -1)  # [G, M]
  flat_ok = pair_ok.reshape(groups, -1)  # [G, M]
  count = flat_ok.sum(axis=-1)  # [G]
  # Invalid pairs sort to the end; only the first `count` entries are read.
  ordered = jnp.sort(jnp.where(flat_ok, flat_d, jnp.inf), axis=-1)  # [G, M]
  probs = jnp.linspace(0.0, 1.0, num_buckets + 1, dtype=jnp.float32)  # [E]
  last = jnp.maximum(count - 1, 0).astype(jnp.float32)  # [G]
  pos = probs[None, :] * last[:, None]  # [G, E]
  lo = jnp.floor(pos)  # [G, E]
  frac = pos - lo  # [G, E]
  lo_i = lo.astype(jnp.int32)  # [G, E]
  hi_i = jnp.minimum(lo_i + 1, jnp.maximum(count - 1, 0)[:, None])  # [G, E]
  v_lo = jnp.take_along_axis(ordered, lo_i, axis=-1)  # [G, E]
  v_hi = jnp.take_along_axis(ordered, hi_i, axis=-1)  # [G, E]
  edges = v_lo + (v_hi - v_lo) * frac  # [G, E]
  edges = jnp.where(count[:, None] > 0, edges, 0.0)  # [G, E]; no inf for empty documents
  return jnp.broadcast_to(edges, (b, num_buckets + 1))  # [B, E]


def distance_buckets(centers_q, centers_k, edges, *, zero_bucket: bool = False) -> jnp.ndarray:
  """Distance bucket of every pair: `int32 [..., Q, K]` in `[0, E - 1)` (`[0, E)`: `zero_bucket`).

  `zero_bucket` (`model.polar_zero_bucket`, the released code's bucketing as flaxdoc
  reads it): pairs at distance 0 - the self pair and the sub-tokens of one word, which
  share a box - get a bucket of their own, 0, and every other pair the quantile
  bucket + 1. Without it (the paper) they fall in the first quantile bucket.

  Args:
    centers_q: `[..., Q, 2]` query box centres.
    centers_k: `[..., K, 2]` key box centres.
    edges: `[..., E]` from `distance_quantile_edges`; its leading dims must
      broadcast against the centres' leading dims (for ETC blocks `[B, nb, b, 2]`
      pass `edges[:, None, :]`).
  """
  check_last_dim(centers_q, 2, "centers_q")
  check_last_dim(centers_k, 2, "centers_k")
  e = jax.lax.stop_gradient(jnp.asarray(edges, jnp.float32))  # [..., E]
  if e.ndim < 1 or e.shape[-1] < 2:
    raise ValueError(f"edges must have shape [..., E] with E >= 2, got {list(e.shape)}")
  rho = pairwise_distances(centers_q, centers_k)  # [..., Q, K]
  bucket = jnp.zeros(rho.shape, jnp.int32)  # [..., Q, K]
  # Count the interior edges at or below rho; a loop over the few edges avoids
  # materialising a [..., Q, K, E] comparison.
  for i in range(1, e.shape[-1] - 1):
    bucket = bucket + (rho >= e[..., i, None, None]).astype(jnp.int32)  # [..., Q, K]
  if zero_bucket:
    bucket = jnp.where(rho <= ZERO_DISTANCE, 0, bucket + 1)  # [..., Q, K]
  return bucket


# Centre distances (0-1000 units) at or below this count as zero (`zero_bucket`).
ZERO_DISTANCE = 1e-3


# -------------------------------------------------------------------- angle
def angle_octants(u, v) -> jnp.ndarray:
  """`floor(phi / 45)` for `phi = atan2(v, u) mod 360` in degrees, exactly: `int32` in 0..7.

  Computed with comparisons instead of `atan2` so that pairs exactly on a
  boundary (the same row, the same column, a 45-degree diagonal - common with
  integer box coordinates) get the mathematically exact half-open sector
  `[45 k, 45 (k + 1))` rather than whatever the last ulp of `atan2` says. The
  origin counts as `phi = 0`.
  """
  # Rotate each vector by a multiple of 90 degrees into the first quadrant
  # {u > 0, v >= 0}, then split that quadrant at its diagonal.
  q1 = (u <= 0) & (v > 0)  # phi in [90, 180)
  q2 = (u < 0) & (v <= 0)  # phi in [180, 270)
  q3 = (u >= 0) & (v < 0)  # phi in [270, 360)
  quadrant = jnp.where(q1, 1, jnp.where(q2, 2, jnp.where(q3, 3, 0)))  # [...]
  ur = jnp.where(q1, v, jnp.where(q2, -u, jnp.where(q3, -v, u)))  # [...]
  vr = jnp.where(q1, -u, jnp.where(q2, -v, jnp.where(q3, u, v)))  # [...]
  origin = (u == 0) & (v == 0)  # [...]
  half = ((vr >= ur) & ~origin).astype(jnp.int32)  # [...]
  return (2 * quadrant + half).astype(jnp.int32)  # [...]


def _extents_overlap(lo_q, hi_q, lo_k, hi_k) -> jnp.ndarray:
  """Open-interval overlap of `[lo_q, hi_q]` and `[lo_k, hi_k]` per pair: `[..., Q, K]`.

  Intervals that only touch (`hi_q == lo_k`) do not overlap: two words on
  consecutive lines whose boxes share an edge are not on the same row.
  """
  lo = jnp.maximum(lo_q[..., :, None], lo_k[..., None, :])  # [..., Q, K]
  hi = jnp.minimum(hi_q[..., :, None], hi_k[..., None, :])  # [..., Q, K]
  return lo < hi  # [..., Q, K]


def _check_angle_args(boxes_q, boxes_k, is_self, valid):
  check_last_dim(boxes_q, 4, "boxes_q")
  check_last_dim(boxes_k, 4, "boxes_k")
  check_pair_shapes(boxes_q, boxes_k, "boxes_q", "boxes_k")
  pair_shape = np.broadcast_shapes(np.shape(boxes_q)[:-2], np.shape(boxes_k)[:-2]) + (
      np.shape(boxes_q)[-2], np.shape(boxes_k)[-2])
  for name, x in (("is_self", is_self), ("valid", valid)):
    try:
      np.broadcast_shapes(np.shape(x), pair_shape)
    except ValueError:
      raise ValueError(f"{name} shape {list(np.shape(x))} does not broadcast to the pair shape "
                       f"{list(pair_shape)}") from None


def angle_codes_released(boxes_q, boxes_k, is_self, valid) -> jnp.ndarray:
  """DocPolarBERT's released 14 angle codes, `int32 [..., Q, K]` (see the module doc).

  Args:
    boxes_q: `[..., Q, 4]` query boxes (document coordinates, y down).
    boxes_k: `[..., K, 4]` key boxes.
    is_self: `bool [..., Q, K]`, the query's own pair (code 0).
    valid: `bool [..., Q, K]`, False for pairs involving padding (code 13, which
      takes precedence over everything else).
  """
  _check_angle_args(boxes_q, boxes_k, is_self, valid)
  bq = jnp.asarray(boxes_q, jnp.float32)  # [..., Q, 4]
  bk = jnp.asarray(boxes_k, jnp.float32)  # [..., K, 4]
  dx, dy = pairwise_deltas(box_centers(bq), box_centers(bk))  # [..., Q, K] each
  u, v = dx, -dy  # [..., Q, K]; y up, so phi = atan2(v, u)
  sector = angle_octants(u, v) + 5  # [..., Q, K] in 5..12
  right = (u > 0) | ((u == 0) & (v == 0))  # [..., Q, K]: phi < 90 or phi > 270
  above = (v > 0) | ((v == 0) & (u >= 0))  # [..., Q, K]: phi < 180
  same_row = _extents_overlap(bq[..., 1], bq[..., 3], bk[..., 1], bk[..., 3])  # [..., Q, K]
  same_col = _extents_overlap(bq[..., 0], bq[..., 2], bk[..., 0], bk[..., 2])  # [..., Q, K]
  code = jnp.where(same_row, jnp.where(right, 1, 3), sector)  # [..., Q, K]
  code = jnp.where(same_col, jnp.where(above, 2, 4), code)  # [..., Q, K]; columns override
  code = jnp.where(jnp.asarray(is_self, bool), ANGLE_SELF, code)  # [..., Q, K]
  code = jnp.where(jnp.asarray(valid, bool), code, ANGLE_PADDING)  # [..., Q, K]
  return code.astype(jnp.int32)


def angle_sectors8(boxes_q, boxes_k, is_self, valid) -> jnp.ndarray:
  """The paper's plain 8 direction sectors between centres, `int32 [..., Q, K]` in 0..9.

  Sectors are centred on the eight main directions, counter-clockwise from
  "right": 1 right `(-22.5, 22.5)` degrees, 2 up-right, 3 above, 4 up-left,
  5 left, 6 down-left, 7 below, 8 down-right; 0 is the self pair (and, as in the
  paper's `atan2(c, c) = 0`, any other pair is a real direction), 9 padding.
  Sector boundaries use float `atan2` (a pair exactly at 22.5 degrees may fall
  on either side).
  """
  _check_angle_args(boxes_q, boxes_k, is_self, valid)
  dx, dy = pairwise_deltas(box_centers(boxes_q), box_centers(boxes_k))  # [..., Q, K] each
  phi = jnp.mod(jnp.degrees(jnp.arctan2(-dy, dx)), 360.0)  # [..., Q, K] in [0, 360)
  sector = jnp.mod(jnp.floor((phi + 22.5) / 45.0).astype(jnp.int32), 8)  # [..., Q, K]
  code = jnp.where(jnp.asarray(is_self, bool), 0, sector + 1)  # [..., Q, K]
  code = jnp.where(jnp.asarray(valid, bool), code, SECTORS8_PADDING)  # [..., Q, K]
  return code.astype(jnp.int32)


# ------------------------------------------------------------------ logits
def bucketed_dot_logits(q, table, buckets, *, method: str = "gather") -> jnp.ndarray:
  """`q_i . table[bucket_ij]` for every head and pair: `[..., H, Q, K]`.

  Args:
    q: `[..., Q, H, D]` per-head queries.
    table: `[num_buckets, D]` learned relative vectors (shared by heads).
    buckets: `int [..., Q, K]` bucket of each pair, in `[0, num_buckets)`; its
      leading dims must broadcast against `q`'s.
    method: "gather" (default): `q @ table.T` then `take_along_axis`;
      "onehot": the same contraction as a one-hot matmul (t5x style, better on
      TPU; materialises `[..., Q, K, num_buckets]` - never `[Q, K, D]`).

  Returns:
    `[..., H, Q, K]` in `q`'s dtype (not scaled by `1/sqrt(d)`).
  """
  if np.ndim(q) < 3 or np.ndim(table) != 2 or np.shape(table)[1] != np.shape(q)[-1]:
    raise ValueError(f"q must be [..., Q, H, D] and table [num_buckets, D]; got "
                     f"{list(np.shape(q))} and {list(np.shape(table))}")
  if np.ndim(buckets) < 2 or np.shape(buckets)[-2] != np.shape(q)[-3]:
    raise ValueError(f"buckets must be [..., Q, K] with Q = {np.shape(q)[-3]}, got "
                     f"{list(np.shape(buckets))}")
  if not jnp.issubdtype(jnp.asarray(buckets).dtype, jnp.integer):
    raise ValueError(f"buckets must be integers, got {jnp.asarray(buckets).dtype}")
  num_buckets = np.shape(table)[0]
  if is_concrete(buckets) and np.size(buckets):
    bmin, bmax = int(np.min(buckets)), int(np.max(buckets))
    if bmin < 0 or bmax >= num_buckets:
      raise ValueError(f"bucket ids must lie in [0, {num_buckets}), got [{bmin}, {bmax}]")
  q = jnp.asarray(q)
  table = jnp.asarray(table, q.dtype)
  scores = jnp.einsum("...qhd,nd->...hqn", q, table)  # [..., H, Q, nb]
  idx = jnp.asarray(buckets, jnp.int32)[..., None, :, :]  # [..., 1, Q, K]
  lead = np.broadcast_shapes(scores.shape[:-3], idx.shape[:-3])
  scores = jnp.broadcast_to(scores, lead + scores.shape[-3:])  # [..., H, Q, nb]
  idx = jnp.broadcast_to(idx, lead + idx.shape[-3:])  # [..., 1, Q, K]
  if method == "gather":
    # Under jit the ids cannot be checked; clip rather than jax's default NaN fill.
    return jnp.take_along_axis(scores, idx, axis=-1, mode="clip")  # [..., H, Q, K]
  if method == "onehot":
    onehot = jax.nn.one_hot(idx[..., 0, :, :], num_buckets, dtype=q.dtype)  # [..., Q, K, nb]
    return jnp.einsum("...hqn,...qkn->...hqk", scores, onehot)  # [..., H, Q, K]
  raise ValueError(f"unknown method {method!r}; expected 'gather' or 'onehot'")
