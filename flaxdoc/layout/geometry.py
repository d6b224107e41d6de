"""Box geometry shared by every pairwise layout term.

Conventions (DESIGN §2):

* boxes are `[x0, y0, x1, y1]`; inside a `Document` they are page pixels, for the
  models they are LayoutLM units (0..1000 per page axis);
* multi-page documents are put on one vertical strip, `y_doc = 1000 * page + y`,
  so tokens on different pages are far apart for every pairwise term;
* pairwise deltas are *key minus query*: `dx[..., i, j] = x_j - x_i`, the
  position of key `j` seen from query `i`.

Also here: ETC-style blocking of per-token geometry (a query block against the
previous, own and next key blocks), which the blocked attention uses and which
the tests use to check that every pairwise term evaluated on blocks equals the
dense evaluation restricted to the same pairs.

Only numpy and jax are imported (DESIGN §1). Array functions accept arbitrary
leading batch dimensions and are jit-able.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

# Height of one page in LayoutLM units: the vertical offset between stacked pages.
PAGE_HEIGHT = 1000.0

BOX_POINTS = ("center", "top_left", "bottom_left", "top_right", "bottom_right")


def check_last_dim(x, size: int, name: str) -> None:
  """Raises ValueError unless `x` has at least one axis and its last axis has `size` entries.

  Shapes are static under `jit`, so this check costs nothing at run time and
  turns a shape mistake into a message naming the argument instead of a
  broadcasting error from deep inside XLA.
  """
  shape = np.shape(x)
  if len(shape) == 0 or shape[-1] != size:
    raise ValueError(f"{name} must have shape [..., {size}], got {list(shape)}")


def check_pair_shapes(q, k, name_q: str, name_k: str, feature_axes: int = 1) -> None:
  """Raises ValueError unless query and key leading (batch) dims broadcast.

  `feature_axes` trailing axes are per-token features (1 for `[..., N, G]`
  geometry, 0 for `[..., N]` positions); the axis before them is the token axis,
  which may differ between queries and keys (Q != K).
  """
  sq, sk = np.shape(q), np.shape(k)
  need = 1 + feature_axes
  if len(sq) < need or len(sk) < need:
    raise ValueError(f"{name_q} and {name_k} need at least {need} axes, got {list(sq)} and "
                     f"{list(sk)}")
  lead_q, lead_k = sq[:len(sq) - need], sk[:len(sk) - need]
  try:
    np.broadcast_shapes(lead_q, lead_k)
  except ValueError:
    raise ValueError(f"batch dims of {name_q} {list(sq)} and {name_k} {list(sk)} do not "
                     "broadcast") from None


# --------------------------------------------------------------------- boxes
def box_centers(boxes) -> jnp.ndarray:
  """`[..., 4]` boxes -> `[..., 2]` centres `((x0 + x1) / 2, (y0 + y1) / 2)`."""
  check_last_dim(boxes, 4, "boxes")
  boxes = jnp.asarray(boxes, jnp.float32)  # [..., 4]
  return 0.5 * (boxes[..., 0:2] + boxes[..., 2:4])  # [..., 2]


def box_point(boxes, which: str = "center") -> jnp.ndarray:
  """One reference point per box, `[..., 4] -> [..., 2]`, in the boxes' units.

  `which` is one of `BOX_POINTS`. "bottom_left" is `(x0, y1)` (image y grows
  downward, so the bottom edge is `y1`); "top_left" is `(x0, y0)`.
  """
  check_last_dim(boxes, 4, "boxes")
  boxes = jnp.asarray(boxes, jnp.float32)  # [..., 4]
  if which == "center":
    return box_centers(boxes)
  columns = {"top_left": (0, 1), "bottom_left": (0, 3), "top_right": (2, 1),
             "bottom_right": (2, 3)}
  if which not in columns:
    raise ValueError(f"unknown box point {which!r}; expected one of {BOX_POINTS}")
  cx, cy = columns[which]
  return jnp.stack([boxes[..., cx], boxes[..., cy]], axis=-1)  # [..., 2]


def box_sizes(boxes) -> jnp.ndarray:
  """`[..., 4]` boxes -> `[..., 2]` (width, height)."""
  check_last_dim(boxes, 4, "boxes")
  boxes = jnp.asarray(boxes, jnp.float32)  # [..., 4]
  return boxes[..., 2:4] - boxes[..., 0:2]  # [..., 2]


def stack_pages(boxes_1000, page_ids, page_height: float = PAGE_HEIGHT) -> jnp.ndarray:
  """Document coordinates: shifts each box down by `page_height * page`.

  Args:
    boxes_1000: `[..., 4]` boxes in per-page LayoutLM units (0..1000).
    page_ids: `[...]` integer page index of each box (same leading shape).
    page_height: the page height in the boxes' units (1000 for LayoutLM units).

  Returns:
    `float32 [..., 4]` boxes with `y0, y1` replaced by `page_height * page + y`.
  """
  check_last_dim(boxes_1000, 4, "boxes_1000")
  if np.shape(page_ids) != np.shape(boxes_1000)[:-1]:
    raise ValueError(f"page_ids shape {list(np.shape(page_ids))} must equal the boxes' leading "
                     f"shape {list(np.shape(boxes_1000)[:-1])}")
  boxes = jnp.asarray(boxes_1000, jnp.float32)  # [..., 4]
  offset = page_height * jnp.asarray(page_ids, jnp.float32)  # [...]
  shift = jnp.stack([jnp.zeros_like(offset), offset, jnp.zeros_like(offset), offset],
                    axis=-1)  # [..., 4]
  return boxes + shift  # [..., 4]


def normalize_boxes(boxes_px, page_sizes, pages, *, as_int: bool = True) -> jnp.ndarray:
  """Page pixels -> LayoutLM units (0..1000 per page axis), like `Document.normalized_boxes`.

  Args:
    boxes_px: `[..., N, 4]` boxes in page pixels.
    page_sizes: `[..., P, 2]` (width, height) of each page in pixels.
    pages: `[..., N]` integer page of each box.
    as_int: True (default) rounds half-to-even and returns `int32` like
      `Document.normalized_boxes` (which computes in float64: a value within
      float32 noise of `k + 0.5` may round the other way, i.e. differ by one
      unit); False returns the unrounded `float32` values, clipped to `[0, 1000]`.

  Returns:
    `[..., N, 4]` boxes in `[0, 1000]`.

  Raises:
    ValueError: on wrong shapes, and - when the arguments are concrete arrays
      rather than jit tracers - on page indices outside `[0, P)` or non-positive
      page sizes (inside `jit` they cannot be checked; the gather would clamp).
  """
  check_last_dim(boxes_px, 4, "boxes_px")
  check_last_dim(page_sizes, 2, "page_sizes")
  if np.shape(pages) != np.shape(boxes_px)[:-1]:
    raise ValueError(f"pages shape {list(np.shape(pages))} must equal the boxes' leading shape "
                     f"{list(np.shape(boxes_px)[:-1])}")
  num_pages = np.shape(page_sizes)[-2] if np.ndim(page_sizes) >= 2 else 0
  if num_pages == 0:
    raise ValueError(f"page_sizes must have shape [..., P, 2] with P >= 1, got "
                     f"{list(np.shape(page_sizes))}")
  if is_concrete(pages) and np.size(pages):
    p = np.asarray(pages)
    if p.min() < 0 or p.max() >= num_pages:
      raise ValueError(f"pages must lie in [0, {num_pages}), got values in "
                       f"[{int(p.min())}, {int(p.max())}]")
  if is_concrete(page_sizes):
    s = np.asarray(page_sizes, np.float64)
    if not np.isfinite(s).all() or (s <= 0).any():
      raise ValueError("page_sizes must be finite and positive")
  boxes = jnp.asarray(boxes_px, jnp.float32)  # [..., N, 4]
  sizes = jnp.asarray(page_sizes, jnp.float32)  # [..., P, 2]
  idx = jnp.asarray(pages, jnp.int32)[..., None]  # [..., N, 1]
  size = jnp.take_along_axis(sizes, idx, axis=-2)  # [..., N, 2]
  scale = jnp.concatenate([size, size], axis=-1)  # [..., N, 4]
  out = jnp.clip(boxes / scale * 1000.0, 0.0, 1000.0)  # [..., N, 4]
  if as_int:
    return jnp.round(out).astype(jnp.int32)  # [..., N, 4]
  return out


def document_boxes(boxes_px, page_sizes, pages) -> jnp.ndarray:
  """Pixels -> stacked document coordinates: `stack_pages(normalize_boxes(...), pages)`.

  This is the geometry every pairwise term expects for multi-page documents.
  Returns `float32 [..., N, 4]`.
  """
  return stack_pages(normalize_boxes(boxes_px, page_sizes, pages), pages)


# ------------------------------------------------------------ pairwise deltas
def pairwise_deltas(pts_q, pts_k) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Key-minus-query offsets `(dx, dy)`, each `[..., Q, K]`, of `[..., Q, 2]` and `[..., K, 2]`."""
  check_last_dim(pts_q, 2, "pts_q")
  check_last_dim(pts_k, 2, "pts_k")
  check_pair_shapes(pts_q, pts_k, "pts_q", "pts_k")
  pq = jnp.asarray(pts_q, jnp.float32)  # [..., Q, 2]
  pk = jnp.asarray(pts_k, jnp.float32)  # [..., K, 2]
  dx = pk[..., None, :, 0] - pq[..., :, None, 0]  # [..., Q, K]
  dy = pk[..., None, :, 1] - pq[..., :, None, 1]  # [..., Q, K]
  return dx, dy


def safe_norm(dx, dy) -> jnp.ndarray:
  """`sqrt(dx^2 + dy^2)` with a finite (zero) gradient at the origin.

  The plain `sqrt` has an infinite derivative at 0 (every self pair), which
  would turn into NaN as soon as anything upstream is differentiated; the
  double `where` keeps the forward value exact and the gradient finite.
  """
  r2 = dx * dx + dy * dy  # [..., Q, K]
  positive = r2 > 0  # [..., Q, K]
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, r2, 1.0)), 0.0)  # [..., Q, K]


def pairwise_distances(pts_q, pts_k) -> jnp.ndarray:
  """Euclidean distances `[..., Q, K]` between `[..., Q, 2]` and `[..., K, 2]` points."""
  dx, dy = pairwise_deltas(pts_q, pts_k)  # [..., Q, K] each
  return safe_norm(dx, dy)  # [..., Q, K]


# ------------------------------------------------------------- ETC blocking
def etc_num_blocks(num_tokens: int, block: int) -> int:
  """Number of blocks of length `block` covering `num_tokens` (the last one padded)."""
  if block <= 0:
    raise ValueError(f"block length must be positive, got {block}")
  return max(1, -(-int(num_tokens) // int(block)))


def etc_block_indices(num_tokens: int, block: int) -> tuple[np.ndarray, np.ndarray]:
  """Token index of every position of the query and key blocks, -1 for padding.

  Returns:
    `(q_idx int32 [nb, b], k_idx int32 [nb, 3b])`: query block `i` holds tokens
    `i*b .. i*b+b-1`; its keys are blocks `i-1, i, i+1` (so `k_idx[i, b + t] ==
    q_idx[i, t]`). Positions past the sequence end or before its start are -1.
  """
  nb = etc_num_blocks(num_tokens, block)
  q_idx = np.arange(nb * block, dtype=np.int64).reshape(nb, block)  # [nb, b]
  k_idx = np.concatenate([q_idx - block, q_idx, q_idx + block], axis=1)  # [nb, 3b]
  q_idx = np.where(q_idx < num_tokens, q_idx, -1)
  k_idx = np.where((k_idx >= 0) & (k_idx < num_tokens), k_idx, -1)
  return q_idx.astype(np.int32), k_idx.astype(np.int32)


def _move_token_axis(x, axis: int):
  x = jnp.asarray(x)
  axis = axis % x.ndim
  return jnp.moveaxis(x, axis, 0), axis


def etc_query_blocks(x, block: int, *, axis: int = 1, pad_value=0):
  """Splits the token axis into `[nb, b]` blocks, padding the end with `pad_value`.

  `x` is `[..., N, ...]` with the token axis at `axis` (default 1: `[B, N, ...]`);
  the result has that axis replaced by `nb, b`.
  """
  xt, axis = _move_token_axis(x, axis)  # [N, ...]
  n = xt.shape[0]
  nb = etc_num_blocks(n, block)
  pad = nb * block - n
  xt = jnp.pad(xt, [(0, pad)] + [(0, 0)] * (xt.ndim - 1),
               constant_values=pad_value)  # [nb*b, ...]
  xt = xt.reshape((nb, block) + xt.shape[1:])  # [nb, b, ...]
  return jnp.moveaxis(xt, (0, 1), (axis, axis + 1))  # [..., nb, b, ...]


def etc_key_blocks(x, block: int, *, axis: int = 1, pad_value=0):
  """Key blocks for ETC local attention: blocks `i-1, i, i+1` side by side.

  `x` is `[..., N, ...]` with the token axis at `axis`; the result has that axis
  replaced by `nb, 3b`. Positions before the first and after the last token
  hold `pad_value` (`etc_block_indices` says which are padding).
  """
  xt, axis = _move_token_axis(x, axis)  # [N, ...]
  n = xt.shape[0]
  nb = etc_num_blocks(n, block)
  tail = nb * block - n
  # One extra block of padding in front and behind, then three shifted views.
  xt = jnp.pad(xt, [(block, tail + block)] + [(0, 0)] * (xt.ndim - 1),
               constant_values=pad_value)  # [(nb+2)*b, ...]
  xt = xt.reshape((nb + 2, block) + xt.shape[1:])  # [nb+2, b, ...]
  keys = jnp.concatenate([xt[:-2], xt[1:-1], xt[2:]], axis=1)  # [nb, 3b, ...]
  return jnp.moveaxis(keys, (0, 1), (axis, axis + 1))  # [..., nb, 3b, ...]


def is_concrete(x) -> bool:
  """True unless `x` is a jit/grad tracer, i.e. its values can be checked on the host."""
  return not isinstance(x, jax.core.Tracer)


__all__: Sequence[str] = (
    "PAGE_HEIGHT", "BOX_POINTS", "check_last_dim", "check_pair_shapes", "box_centers",
    "box_point", "box_sizes", "stack_pages", "normalize_boxes", "document_boxes",
    "pairwise_deltas", "safe_norm", "pairwise_distances", "etc_num_blocks",
    "etc_block_indices", "etc_query_blocks", "etc_key_blocks", "is_concrete")
