"""Discrete relative positions: ETC clipped ids, T5 log buckets, LayoutLMv2/v3 2D buckets.

All of these map a pair (query `i`, key `j`) to a small integer that indexes a
learned table; the relative position is always *key minus query*
(`pos_k[j] - pos_q[i]`, "memory position minus query position" in T5 terms).

* ETC (FormNet's backbone, DESIGN §3.1): `clip(j - i, -r, r) + r`, a vocabulary of
  `2r + 1` ids (25 for r = 12), plus two membership ids for the global-local
  pieces: `2r + 1` when a long token belongs to the global token's segment,
  `2r + 2` when it does not (total vocabulary `2r + 3`).
* T5 buckets (DocPolarBERT's 1D term, LayoutLMv2/v3): half the buckets for exact
  small offsets, the other half logarithmically up to `max_distance`, one sign
  bit when bidirectional. `t5_relative_buckets` reproduces t5x /
  Hugging Face `relative_position_bucket` exactly for integer offsets.
  Instead of a float `log` (whose last-ulp rounding differs between XLA, numpy
  and torch exactly at the bucket boundaries 16, 32, 64 ...), the log buckets
  are found by comparing with thresholds computed once in float64, which gives
  the mathematically exact bucket - the value both references produce.
* LayoutLMv2/v3 2D: T5 buckets of `x0` (left edge) and of `y1` (bottom edge)
  separately, 64 buckets up to 256 by default (HF `LayoutLMv2Encoder.
  _calculate_2d_position_embeddings`).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from flaxdoc.layout.geometry import check_last_dim, check_pair_shapes

# ETC's default relative-position radius (DESIGN §3.1).
ETC_MAX_DISTANCE = 12


def etc_relative_vocab_size(max_distance: int = ETC_MAX_DISTANCE) -> int:
  """`2r + 1` clipped offsets plus the two l2g/g2l membership ids (27 for r = 12)."""
  return 2 * int(max_distance) + 3


def relative_offsets(pos_q, pos_k) -> jnp.ndarray:
  """`pos_k[..., None, :] - pos_q[..., :, None]`: `[..., Q]`, `[..., K]` -> `[..., Q, K]`."""
  check_pair_shapes(pos_q, pos_k, "pos_q", "pos_k", feature_axes=0)
  pq = jnp.asarray(pos_q)  # [..., Q]
  pk = jnp.asarray(pos_k)  # [..., K]
  return pk[..., None, :] - pq[..., :, None]  # [..., Q, K]


def etc_relative_ids(pos_q, pos_k, max_distance: int = ETC_MAX_DISTANCE) -> jnp.ndarray:
  """ETC long-to-long relative ids `clip(pos_k - pos_q, -r, r) + r`, int32 in `0..2r`.

  Args:
    pos_q: `[..., Q]` integer sequence positions of the queries.
    pos_k: `[..., K]` integer sequence positions of the keys (Q != K allowed,
      e.g. a query block against its three key blocks).
    max_distance: the clipping radius `r` (12 in ETC and FormNet).

  Returns:
    `int32 [..., Q, K]`; `r` on the diagonal, `2r` for keys `>= r` to the right.
  """
  if max_distance < 0:
    raise ValueError(f"max_distance must be >= 0, got {max_distance}")
  pq = jnp.asarray(pos_q, jnp.int32)  # [..., Q]
  pk = jnp.asarray(pos_k, jnp.int32)  # [..., K]
  rel = relative_offsets(pq, pk)  # [..., Q, K]
  return (jnp.clip(rel, -max_distance, max_distance) + max_distance).astype(jnp.int32)


def etc_membership_ids(owner_q, owner_k, max_distance: int = ETC_MAX_DISTANCE) -> jnp.ndarray:
  """ETC's l2g / g2l relative ids: `2r + 1` if query and key belong together, else `2r + 2`.

  For l2g pass the long tokens' owning global index as `owner_q` and the global
  tokens' own index as `owner_k`; for g2l swap them. With FormNet's single
  global token every long token gets `2r + 1` (25 for r = 12); with one global
  per page, tokens attend to their own page's global with id 25 and to the
  others with 26.

  Returns `int32 [..., Q, K]`.
  """
  check_pair_shapes(owner_q, owner_k, "owner_q", "owner_k", feature_axes=0)
  same = jnp.asarray(owner_q)[..., :, None] == jnp.asarray(owner_k)[..., None, :]  # [..., Q, K]
  member, other = 2 * max_distance + 1, 2 * max_distance + 2
  return jnp.where(same, member, other).astype(jnp.int32)  # [..., Q, K]


@functools.lru_cache(maxsize=None)
def _log_bucket_thresholds(max_exact: int, num_buckets: int, max_distance: int) -> np.ndarray:
  """The smallest integer distances at which the logarithmic bucket index increments.

  The T5 log bucket of a distance `n >= max_exact` is, with `s = num_buckets - max_exact`,
  `max_exact + floor(log(n / max_exact) / log(max_distance / max_exact) * s)`,
  capped at `num_buckets - 1`. It is `>= max_exact + k` exactly when
  `n >= T_k = max_exact * (max_distance / max_exact) ** (k / s)`.
  Thresholds that are integers in exact arithmetic (e.g. 16, 32, 64) are snapped
  to them so float64 noise cannot move a boundary; distances are integers, so
  `n >= T_k` iff `n >= ceil(T_k)`.
  """
  steps = num_buckets - max_exact
  k = np.arange(1, steps, dtype=np.float64)  # the cap makes the last threshold unnecessary
  t = max_exact * (max_distance / max_exact) ** (k / steps)  # [steps - 1]
  snapped = np.round(t)
  t = np.where(np.abs(t - snapped) <= 1e-9 * t, snapped, t)
  return np.ceil(t).astype(np.int32)  # [steps - 1]


def t5_relative_buckets(relative_position, bidirectional: bool = True, num_buckets: int = 32,
                        max_distance: int = 128) -> jnp.ndarray:
  """T5 relative-position buckets, exactly as t5x / Hugging Face `_relative_position_bucket`.

  Args:
    relative_position: `[...]` key-minus-query offsets. Integer arrays are used
      as they are; float arrays are rounded to the nearest integer first (the
      references only accept integers).
    bidirectional: True: half the buckets for positive offsets (`rel > 0`).
    num_buckets: total number of buckets (32 in T5 and DocPolarBERT).
    max_distance: offsets at or beyond this share the last bucket (128).

  Returns:
    `int32 [...]` in `[0, num_buckets)`.
  """
  if num_buckets < (4 if bidirectional else 2):
    raise ValueError(f"num_buckets too small: {num_buckets}")
  rel = jnp.asarray(relative_position)
  if not jnp.issubdtype(rel.dtype, jnp.integer):
    rel = jnp.round(rel)
  rel = rel.astype(jnp.int32)  # [...]
  buckets = num_buckets
  if bidirectional:
    buckets //= 2
    ret = jnp.where(rel > 0, buckets, 0)  # [...]
    n = jnp.abs(rel)  # [...]
  else:
    ret = jnp.zeros_like(rel)
    n = jnp.maximum(-rel, 0)  # [...]
  max_exact = buckets // 2
  if max_distance <= max_exact:
    raise ValueError(f"max_distance ({max_distance}) must exceed the exact range ({max_exact})")
  thresholds = _log_bucket_thresholds(max_exact, buckets, int(max_distance))
  large = max_exact + jnp.searchsorted(jnp.asarray(thresholds), n, side="right")  # [...]
  return (ret + jnp.where(n < max_exact, n, large)).astype(jnp.int32)  # [...]


def relative_position_buckets(pos_q, pos_k, *, bidirectional: bool = True, num_buckets: int = 32,
                              max_distance: int = 128) -> jnp.ndarray:
  """T5 buckets of `pos_k - pos_q`: `[..., Q]`, `[..., K]` -> `int32 [..., Q, K]`.

  LayoutLMv2/v3's 1D relative term (32 buckets, max distance 128) and
  DocPolarBERT's 1D relative term.
  """
  rel = relative_offsets(pos_q, pos_k)  # [..., Q, K]
  return t5_relative_buckets(rel, bidirectional, num_buckets, max_distance)  # [..., Q, K]


def layoutlmv2_2d_buckets(boxes_q, boxes_k, *, num_buckets: int = 64,
                          max_distance: int = 256) -> tuple[jnp.ndarray, jnp.ndarray]:
  """LayoutLMv2/v3 2D relative buckets: T5 buckets of `x0` and of `y1` offsets, separately.

  Mirrors HF `LayoutLMv2Encoder._calculate_2d_position_embeddings`: the x
  coordinate is the box's left edge `x0` (`bbox[..., 0]`), the y coordinate its
  bottom edge `y1` (`bbox[..., 3]`), offsets are key minus query, and each axis
  indexes its own bias table (the two biases are summed by the caller).

  Args:
    boxes_q: `[..., Q, 4]` boxes in LayoutLM units (integers 0..1000; floats are
      rounded).
    boxes_k: `[..., K, 4]`.
    num_buckets: `rel_2d_pos_bins` (64).
    max_distance: `max_rel_2d_pos` (256).

  Returns:
    `(x_buckets, y_buckets)`, each `int32 [..., Q, K]` in `[0, num_buckets)`.
  """
  check_last_dim(boxes_q, 4, "boxes_q")
  check_last_dim(boxes_k, 4, "boxes_k")
  bq, bk = jnp.asarray(boxes_q), jnp.asarray(boxes_k)  # [..., Q, 4], [..., K, 4]
  if not jnp.issubdtype(bq.dtype, jnp.integer):
    bq = jnp.round(bq)
  if not jnp.issubdtype(bk.dtype, jnp.integer):
    bk = jnp.round(bk)
  bq, bk = bq.astype(jnp.int32), bk.astype(jnp.int32)
  x = relative_position_buckets(bq[..., 0], bk[..., 0], num_buckets=num_buckets,
                                max_distance=max_distance)  # [..., Q, K]
  y = relative_position_buckets(bq[..., 3], bk[..., 3], num_buckets=num_buckets,
                                max_distance=max_distance)  # [..., Q, K]
  return x, y
