"""Node and edge features of FormNet's Super-Token graph.

`flaxdoc.layout.token_graph.token_neighbours` fills them into the per-token arrays the
GCN (`flaxdoc.nn.gcn`) reads.

FormNet describes every graph edge `e_kl` (from token k to token l) by the relative
distances between the centres, the top-left and the bottom-right corners of the two
boxes, the shortest horizontal and vertical distances between the boxes, and the
height/width ratios of box k, box l and of the box covering both. Each node gets its
normalised corners plus width and height.

All inputs are boxes `[x0, y0, x1, y1]` in LayoutLM units (0..1000 per page axis;
multi-page documents stacked, `y + 1000 * page`, DESIGN §2). The raw quantities span
three orders of magnitude (a neighbour 3 units away, the other end of the page 1000
units away) and aspect ratios are unbounded (a box 0 units wide), so every edge
feature is compressed to O(1) by a logarithm:

* deltas (of centres and corners, `l` minus `k`): `sign(d) * ln(1 + |d|) / ln(1001)`,
  in [-1, 1] on one page and only logarithmically larger across stacked pages;
* gaps (>= 0, 0 when the boxes overlap on that axis): `ln(1 + g) / ln(1001)`;
* aspect ratios: `ln((h + 1) / (w + 1)) / ln(1001)`, in [-1, 1] for boxes inside one
  page (0 for a square, negative for the usual wide word box); the `+ 1` keeps
  degenerate (zero-width or zero-height) boxes finite;
* `subtoken_step`: +1 for the link to the next sub-token of the same word, -1 for
  the previous one, 0 for a link to a neighbouring word. Sub-tokens of one word share
  its box, so without it their two links would look identical to the network.

Nothing here can produce NaN or inf for finite boxes (identical boxes give all-zero
deltas and gaps). Only numpy is imported.
"""

from __future__ import annotations

import numpy as np

# The edge feature vector, in order. `F = len(EDGE_FEATURE_NAMES)`.
EDGE_FEATURE_NAMES = (
    "d_center_x", "d_center_y",
    "d_top_left_x", "d_top_left_y",
    "d_bottom_right_x", "d_bottom_right_y",
    "gap_x", "gap_y",
    "aspect_k", "aspect_l", "aspect_union",
    "subtoken_step",
)
NUM_EDGE_FEATURES = len(EDGE_FEATURE_NAMES)

# The node spatial features, in order (DESIGN §3.3: normalised x0, y0, x1, y1, width, height).
NODE_FEATURE_NAMES = ("x0", "y0", "x1", "y1", "width", "height")

# Scale of one page axis in LayoutLM units; log(1 + 1000) maps a full-page distance to 1.
_UNITS = 1000.0
_LOG_SCALE = float(np.log1p(_UNITS))


def _check_boxes(boxes, name: str) -> np.ndarray:
  try:
    arr = np.asarray(boxes, dtype=np.float64)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{name}: cannot be read as numbers ({e})") from None
  if arr.ndim == 0 or arr.shape[-1] != 4:
    raise ValueError(f"{name} must have shape [..., 4], got {list(arr.shape)}")
  if arr.size and not np.isfinite(arr).all():
    raise ValueError(f"{name} contains NaN or inf")
  return arr


def signed_log(d: np.ndarray) -> np.ndarray:
  """`sign(d) * ln(1 + |d|) / ln(1001)`: a distance in 0..1000 units squashed to [-1, 1]."""
  return np.sign(d) * np.log1p(np.abs(d)) / _LOG_SCALE


def log_aspect(width: np.ndarray, height: np.ndarray) -> np.ndarray:
  """`ln((h + 1) / (w + 1)) / ln(1001)`: the height/width ratio on a symmetric log scale."""
  return (np.log1p(np.maximum(height, 0.0)) - np.log1p(np.maximum(width, 0.0))) / _LOG_SCALE


def edge_features(boxes_k, boxes_l, subtoken_step=0.0) -> np.ndarray:
  """Edge features `e_kl` of directed edges from boxes `k` to boxes `l`.

  Args:
    boxes_k: `[..., 4]` source boxes, 0..1000 units (page-stacked).
    boxes_l: `[..., 4]` target boxes, broadcastable against `boxes_k`.
    subtoken_step: `[...]` (or a scalar) +1 / -1 for links to the next / previous
      sub-token of the same word, 0 for links between words.

  Returns:
    `float32 [..., F]` in the order of `EDGE_FEATURE_NAMES` (see the module
    docstring for the scaling).
  """
  bk = _check_boxes(boxes_k, "boxes_k")
  bl = _check_boxes(boxes_l, "boxes_l")
  bk, bl = np.broadcast_arrays(bk, bl)
  x0k, y0k, x1k, y1k = (bk[..., c] for c in range(4))
  x0l, y0l, x1l, y1l = (bl[..., c] for c in range(4))
  out = np.empty(bk.shape[:-1] + (NUM_EDGE_FEATURES,), np.float32)
  out[..., 0] = signed_log(0.5 * ((x0l + x1l) - (x0k + x1k)))  # centres
  out[..., 1] = signed_log(0.5 * ((y0l + y1l) - (y0k + y1k)))
  out[..., 2] = signed_log(x0l - x0k)  # top-left corners
  out[..., 3] = signed_log(y0l - y0k)
  out[..., 4] = signed_log(x1l - x1k)  # bottom-right corners
  out[..., 5] = signed_log(y1l - y1k)
  # Gap on each axis: how far apart the two intervals are (0 when they overlap).
  out[..., 6] = np.log1p(np.maximum(0.0, np.maximum(x0l - x1k, x0k - x1l))) / _LOG_SCALE
  out[..., 7] = np.log1p(np.maximum(0.0, np.maximum(y0l - y1k, y0k - y1l))) / _LOG_SCALE
  out[..., 8] = log_aspect(x1k - x0k, y1k - y0k)
  out[..., 9] = log_aspect(x1l - x0l, y1l - y0l)
  out[..., 10] = log_aspect(np.maximum(x1k, x1l) - np.minimum(x0k, x0l),
                            np.maximum(y1k, y1l) - np.minimum(y0k, y0l))
  out[..., 11] = subtoken_step
  return out


def node_features(boxes_1000) -> np.ndarray:
  """`[..., 4]` boxes in 0..1000 units -> `float32 [..., 6]`: x0, y0, x1, y1, width, height / 1000.

  Use per-page boxes (not page-stacked ones) so every value stays in [0, 1].
  """
  b = _check_boxes(boxes_1000, "boxes_1000")
  size = b[..., 2:] - b[..., :2]
  return (np.concatenate([b, size], axis=-1) / _UNITS).astype(np.float32)
