"""Node and edge features of FormNet's Super-Token graph, and the padded per-token arrays.

`token_neighbours` turns a word graph (`flaxdoc.layout.graph`) into what the GCN
(`flaxdoc.nn.gcn`) reads: per sub-token, the ids, edge features and mask of its
neighbours. It lives here, next to the features it fills in, and is re-exported as
`flaxdoc.layout.graph.token_neighbours` (the name the featuriser uses).

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
deltas and gaps). Only numpy is imported (and `flaxdoc.layout.graph`, lazily, by
`token_neighbours`).
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


def token_neighbours(word_boxes, token_word_ids, *, max_degree: int = 8,
                     variant: str = "ball_of_sight",
                     include_subtoken_links: bool = True) -> dict[str, np.ndarray]:
  """Per-sub-token neighbour arrays of the word graph, padded for batching.

  (Import it as `flaxdoc.layout.graph.token_neighbours`.)

  The graph is built over the words that have at least one token (so a truncated
  sequence spends no degree budget on words it cannot see). Each token then gets:

  * slots `0 .. max_degree - 1`: the first sub-token of each graph neighbour of its
    word, nearest (by box distance) first;
  * with `include_subtoken_links`, slot `max_degree`: the previous sub-token of its
    own word, slot `max_degree + 1`: the next one (in sequence order).

  Tokens with word id -1 (specials, padding) get no neighbours. Unused slots have
  id 0, features 0 and mask False.

  Args:
    word_boxes: `[W, 4]` word boxes in 0..1000 units (page-stacked: `y + 1000 * page`).
    token_word_ids: `[L]` integer word index of every token, -1 for none.
    max_degree: graph neighbours per word (FormNet: 8, `graph.DEFAULT_MAX_DEGREE`).
    variant: graph construction, see `build_word_graph`.
    include_subtoken_links: add the previous/next sub-token slots.

  Returns:
    dict with `neighbor_ids int32 [L, K]` (token indices), `neighbor_features
    float32 [L, K, F]` (`EDGE_FEATURE_NAMES`), `neighbor_mask bool [L, K]`, where
    `K = max_degree + 2` with sub-token links and `max_degree` without.
  """
  from flaxdoc.layout import graph as _graph  # pylint: disable=import-outside-toplevel
  boxes = _graph.validate_boxes(word_boxes, "word_boxes")
  if isinstance(max_degree, bool) or not isinstance(max_degree, (int, np.integer)) \
      or max_degree < 0:
    raise ValueError(f"max_degree must be a non-negative integer, got {max_degree!r}")
  ids = np.asarray(token_word_ids)
  if ids.ndim != 1:
    raise ValueError(f"token_word_ids must have shape [L], got {list(ids.shape)}")
  if ids.size and not np.issubdtype(ids.dtype, np.integer):
    if not np.issubdtype(ids.dtype, np.floating) or not np.isfinite(ids).all() \
        or (ids != np.round(ids)).any():
      raise ValueError("token_word_ids must be integers")
  ids = ids.astype(np.int64)
  w = len(boxes)
  if ids.size and (ids.min() < -1 or ids.max() >= w):
    raise ValueError(f"token_word_ids must be in [-1, {w}) for {w} word boxes, got values in "
                     f"[{ids.min()}, {ids.max()}]")
  num_tokens = len(ids)
  k_slots = max_degree + (2 if include_subtoken_links else 0)
  nb_ids = np.zeros((num_tokens, k_slots), np.int32)
  nb_feat = np.zeros((num_tokens, k_slots, NUM_EDGE_FEATURES), np.float32)
  nb_mask = np.zeros((num_tokens, k_slots), bool)
  out = {"neighbor_ids": nb_ids, "neighbor_features": nb_feat, "neighbor_mask": nb_mask}
  real = np.flatnonzero(ids >= 0)
  if not len(real):
    return out

  # First token of every word that has tokens.
  present, first_pos = np.unique(ids[real], return_index=True)
  first_token = np.full(w, -1, np.int64)
  first_token[present] = real[first_pos]

  # Word graph over the present words, as directed lists sorted nearest first.
  if max_degree > 0 and len(present) > 1:
    sub_edges = _graph.build_word_graph(boxes[present], variant=variant, max_degree=max_degree)
    if len(sub_edges):
      e = present[sub_edges.astype(np.int64)]  # back to word indices
      src = np.concatenate([e[:, 0], e[:, 1]])
      dst = np.concatenate([e[:, 1], e[:, 0]])
      gap = _graph.box_gaps(boxes[src], boxes[dst])
      d = 0.5 * ((boxes[dst, :2] + boxes[dst, 2:]) - (boxes[src, :2] + boxes[src, 2:]))
      order = np.lexsort((dst, np.hypot(d[:, 0], d[:, 1]), gap, src))
      src, dst = src[order], dst[order]
      starts = np.searchsorted(src, src, side="left")
      slot = np.arange(len(src)) - starts  # rank among the word's neighbours (< max_degree)
      # Every token of word `src` gets the same neighbour list.
      tok_order = real[np.argsort(ids[real], kind="stable")]
      tok_words = ids[tok_order]
      lo = np.searchsorted(tok_words, src, side="left")
      hi = np.searchsorted(tok_words, src, side="right")
      counts = hi - lo
      rows = np.repeat(np.arange(len(counts)), counts)  # directed edge of each (token, edge)
      rank = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
      tok = tok_order[lo[rows] + rank]
      feats = edge_features(boxes[src], boxes[dst])  # [2E, F], once per directed word edge
      nb_ids[tok, slot[rows]] = first_token[dst[rows]]
      nb_mask[tok, slot[rows]] = True
      nb_feat[tok, slot[rows]] = feats[rows]

  if include_subtoken_links:
    # Tokens of each word in sequence order; neighbours in that order are linked.
    tok_order = real[np.lexsort((real, ids[real]))]
    same = ids[tok_order[1:]] == ids[tok_order[:-1]]
    cur, nxt = tok_order[:-1][same], tok_order[1:][same]
    own = edge_features(boxes, boxes)[ids[cur]]  # [P, F] a word's box against itself
    nb_ids[cur, max_degree + 1] = nxt
    nb_mask[cur, max_degree + 1] = True
    own[:, -1] = 1.0  # subtoken_step: the next sub-token
    nb_feat[cur, max_degree + 1] = own
    nb_ids[nxt, max_degree] = cur
    nb_mask[nxt, max_degree] = True
    own[:, -1] = -1.0  # the previous one
    nb_feat[nxt, max_degree] = own
  return out
