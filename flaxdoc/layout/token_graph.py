"""FormNet's Super-Token graph per sub-token: the word graph expanded to padded arrays.

`token_neighbours` builds the word graph (`flaxdoc.layout.graph`) over the words a
sequence sees and gives every sub-token the ids, edge features
(`flaxdoc.layout.edge_features`) and mask of its neighbours, which is what the GCN
(`flaxdoc.nn.gcn`) reads. It sits in a module of its own so that the feature
definitions need nothing of the graph (`graph.py` imports them, one way, to re-export).
"""

from __future__ import annotations

import numpy as np

from flaxdoc.layout import graph as _graph
from flaxdoc.layout.edge_features import NUM_EDGE_FEATURES, edge_features

__all__ = ["token_neighbours"]


def token_neighbours(word_boxes, token_word_ids, *, max_degree: int = 8,
                     variant: str = "ball_of_sight",
                     include_subtoken_links: bool = True) -> dict[str, np.ndarray]:
  """Per-sub-token neighbour arrays of the word graph, padded for batching.

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
    variant: graph construction, see `flaxdoc.layout.graph.build_word_graph`.
    include_subtoken_links: add the previous/next sub-token slots.

  Returns:
    dict with `neighbor_ids int32 [L, K]` (token indices), `neighbor_features
    float32 [L, K, F]` (`EDGE_FEATURE_NAMES`), `neighbor_mask bool [L, K]`, where
    `K = max_degree + 2` with sub-token links and `max_degree` without.
  """
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
