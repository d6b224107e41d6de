"""Entity-linking inputs: a document's entities and key -> value relations as padded arrays.

The linking head (`flaxdoc.nn.linking.LinkingHead`) scores, in each model window, every
*candidate* (key, value) pair of the entities the window holds. This module decides
which pairs are candidates and builds the index arrays the head gathers with.

Candidate rule (LayoutXLM's relation extraction, `config.linking.pairs`): a table of
`key_label:value_label` entries, e.g. `"question:answer"` (FUNSD) or `"key:*"` (the
synthetic dataset's key words to any value label; `*` is every label but the key's).
Gold relations are oriented by this table: FUNSD lists a link once on each of its
entities in either order, so `(answer, question)` becomes `question -> answer`;
relations the table does not allow (FUNSD's header -> question) are not linking
targets.

Per window (all padded to fixed sizes, `LinkShapes`):

| key | shape | meaning |
|---|---|---|
| `link_first` | int32 `[E]` | window position of the entity's first token |
| `link_token_entity` | int32 `[L]` | window entity of each token, -1 outside entities |
| `link_label` | int32 `[E]` | label index of the entity |
| `link_box` | float32 `[E, 4]` | entity box, 0..1000 per axis, pages stacked (`y + 1000 p`) |
| `link_entity_id` | int32 `[E]` | the entity's index in the document's entity list (-1: pad) |
| `link_value` | int32 `[V]` | window entity of each value slot |
| `link_candidates` | int32 `[V, C]` | the value's possible keys in the window, nearest box first |
| `link_candidate_mask` | bool `[V, C]` | real candidates |
| `link_target` | int32 `[V]` | index of the gold key in the candidates, `C` for "no key", -1: not trained |

A value whose gold key is not among its candidates (outside the window, or beyond
`max_candidates`) gets target -1: it is neither a positive nor a "no key" example.
Entities come from the gold spans in training and evaluation "with gold entities",
and from the Viterbi-decoded spans end to end (then there is no target).

`document_candidates` applies the same rule (allowed labels, nearest first, at most
`max_candidates`) to a whole document's entities, for linking across windows at
inference (`config.linking.scope="document"`).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from flaxdoc.data.document import Document

# The datasets' own candidate rules; other datasets must set `config.linking.pairs`.
DEFAULT_PAIRS = {"funsd": "question:answer", "synthetic": "key:*"}

LINK_KEYS = ("link_first", "link_token_entity", "link_label", "link_box", "link_entity_id",
             "link_value", "link_candidates", "link_candidate_mask", "link_target")


@dataclasses.dataclass(frozen=True)
class LinkShapes:
  """Padded sizes per window: entities, value slots, candidates per value."""
  max_entities: int = 96
  max_values: int = 64
  max_candidates: int = 32


def parse_pairs(pairs: str | Sequence[str], labels: Sequence[str]) -> np.ndarray:
  """`"question:answer,key:*"` -> `bool [num_labels, num_labels]`, `[key, value]` allowed.

  Raises:
    ValueError: a malformed entry or a label outside `labels` (named).
  """
  labels = list(labels)
  entries = pairs.split(",") if isinstance(pairs, str) else list(pairs)
  allowed = np.zeros((len(labels), len(labels)), bool)
  for entry in entries:
    entry = entry.strip()
    if not entry:
      continue
    if entry.count(":") != 1:
      raise ValueError(f"config.linking.pairs entry {entry!r} must be 'key_label:value_label'")
    key, value = (x.strip() for x in entry.split(":"))
    for name in (key, value):
      if name != "*" and name not in labels:
        raise ValueError(f"config.linking.pairs entry {entry!r}: unknown label {name!r} "
                         f"(labels: {labels})")
    keys = range(len(labels)) if key == "*" else [labels.index(key)]
    for k in keys:
      values = [v for v in range(len(labels)) if v != k] if value == "*" else [labels.index(value)]
      allowed[k, values] = True
  if not allowed.any():
    raise ValueError(f"config.linking.pairs={pairs!r} allows no (key, value) label pair")
  return allowed


def oriented_relations(doc: Document, allowed: np.ndarray, label_index: dict[str, int]
                       ) -> list[tuple[int, int]]:
  """The document's relations as `(key entity, value entity)` pairs the table allows."""
  ents = doc.entities or ()
  out = []
  for a, b in doc.relations:
    la, lb = label_index.get(ents[a].label), label_index.get(ents[b].label)
    if la is None or lb is None:
      continue
    if allowed[la, lb]:
      pair = (a, b)
    elif allowed[lb, la]:
      pair = (b, a)
    else:
      continue
    if pair not in out:
      out.append(pair)
  return out


def entity_boxes(doc: Document, entities: Sequence) -> np.ndarray:
  """`float32 [E, 4]` union boxes in 0..1000 units, pages stacked (`y + 1000 * page`)."""
  nb = doc.normalized_boxes().astype(np.float32)
  out = np.zeros((len(entities), 4), np.float32)
  for i, e in enumerate(entities):
    words = list(e.words)
    page = int(doc.pages[words[0]])
    b = nb[words]
    out[i] = [b[:, 0].min(), b[:, 1].min(), b[:, 2].max(), b[:, 3].max()]
    out[i, [1, 3]] += 1000.0 * page
  return out


def nearest_first(boxes: np.ndarray, value: int, candidates: Sequence[int]) -> list[int]:
  """`candidates` (rows of `boxes [N, 4]`) ordered nearest to entity `value` first.

  By the distance between the boxes (0 when they touch), then between the centres. FUNSD
  dev, 256-token windows: a value's key is its first candidate for 57% of the answers by
  this order, 46% by the centres alone. The geometry score reads the rank.
  """
  cands = list(candidates)
  if not cands:
    return cands
  other = boxes[cands]  # [n, 4]
  me = boxes[value]
  apart = np.maximum(np.maximum(me[:2] - other[:, 2:], other[:, :2] - me[2:]), 0.0)
  centres = 0.5 * (other[:, :2] + other[:, 2:])
  centre = np.hypot(*(centres - 0.5 * (me[:2] + me[2:])).T)
  return [cands[k] for k in np.lexsort((centre, np.hypot(*apart.T)))]


def value_candidates(boxes: np.ndarray, labels: np.ndarray, allowed: np.ndarray, value: int,
                     max_candidates: int, usable: np.ndarray | None = None,
                     stats: dict | None = None) -> list[int]:
  """The candidate keys of entity `value`: the rule windows and documents share.

  Entities (rows of `boxes [N, 4]` and `labels int [N]`, -1: not in the table) whose label
  may key the value's (`allowed[key, value]`), other than the value itself and, when
  `usable` (bool `[N]`) is given, among the usable ones; nearest first (`nearest_first`),
  at most `max_candidates` (what is cut is counted in `stats["candidates_cut"]`).
  """
  labels = np.asarray(labels)
  keys = (labels >= 0) & allowed[np.maximum(labels, 0), labels[value]]
  if usable is not None:
    keys &= np.asarray(usable, bool)
  keys[value] = False
  order = nearest_first(boxes, value, np.flatnonzero(keys).tolist())
  if len(order) > max_candidates and stats is not None:
    stats["candidates_cut"] = stats.get("candidates_cut", 0) + len(order) - max_candidates
  return order[:max_candidates]


def window_link_arrays(doc: Document, window: dict, entities: Sequence, relations,
                       allowed: np.ndarray, label_index: dict[str, int],
                       shapes: LinkShapes, boxes: np.ndarray | None = None,
                       stats: dict | None = None) -> dict[str, np.ndarray]:
  """The `link_*` arrays of one window (see the module table).

  Args:
    doc: the window's document.
    window: a `flaxdoc.data.features.featurize` window (reads `word_ids`).
    entities: the document's entities (`Entity` or `PredictedEntity`: `.label`, `.words`).
    relations: oriented `(key, value)` entity pairs (targets), or None (no targets).
    allowed: `parse_pairs` table; label_index: label -> row of `allowed`.
    boxes: `entity_boxes(doc, entities)` (computed when None).
    stats: counters of what the padding sizes cut (updated in place).
  """
  E, V, C = shapes.max_entities, shapes.max_values, shapes.max_candidates
  word_ids = np.asarray(window["word_ids"])
  L = word_ids.shape[0]
  if boxes is None:
    boxes = entity_boxes(doc, entities)
  word_entity = np.full(len(doc), -1, np.int64)
  for i, e in enumerate(entities):
    word_entity[list(e.words)] = i
  tok_doc_entity = np.where(word_ids >= 0, word_entity[np.maximum(word_ids, 0)], -1)  # [L]
  present, first_pos = np.unique(tok_doc_entity, return_index=True)
  keep = present >= 0
  present, first_pos = present[keep], first_pos[keep]
  order = np.argsort(first_pos, kind="stable")
  present, first_pos = present[order], first_pos[order]
  if len(present) > E and stats is not None:
    stats["entities_cut"] = stats.get("entities_cut", 0) + len(present) - E
  present, first_pos = present[:E], first_pos[:E]
  local = {int(d): i for i, d in enumerate(present)}

  out = empty_link_arrays(L, shapes)
  n = len(present)
  out["link_first"][:n] = first_pos
  out["link_entity_id"][:n] = present
  out["link_box"][:n] = boxes[present] if n else 0
  labels = np.asarray([label_index.get(entities[d].label, -1) for d in present], np.int64)
  out["link_label"][:n] = np.maximum(labels, 0)
  for pos in np.flatnonzero(tok_doc_entity >= 0):
    i = local.get(int(tok_doc_entity[pos]))
    if i is not None:
      out["link_token_entity"][pos] = i

  gold_keys: dict[int, list[int]] = {}
  for k, v in relations or ():
    gold_keys.setdefault(v, []).append(k)
  box = out["link_box"]  # [E, 4]
  slot = 0
  for i in range(n):
    li = labels[i]
    if li < 0 or not allowed[:, li].any():
      continue
    if slot == V:
      if stats is not None:
        stats["values_cut"] = stats.get("values_cut", 0) + 1
      continue
    cands = value_candidates(box[:n], labels, allowed, i, C, stats=stats)
    out["link_value"][slot] = i
    out["link_candidates"][slot, :len(cands)] = cands
    out["link_candidate_mask"][slot, :len(cands)] = True
    if relations is not None:
      gold = {local[k] for k in gold_keys.get(int(present[i]), ()) if k in local}
      hits = [c for c, j in enumerate(cands) if j in gold]
      if hits:
        out["link_target"][slot] = hits[0]
      elif int(present[i]) not in gold_keys:
        out["link_target"][slot] = C  # no key
    slot += 1
  return out


def document_candidates(labels: np.ndarray, boxes: np.ndarray, allowed: np.ndarray,
                        max_candidates: int, encoded: np.ndarray | None = None,
                        stats: dict | None = None
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Candidates over a whole document (`config.linking.scope="document"`).

  Every value entity with the `max_candidates` allowed keys nearest to it anywhere in the
  document, ordered as in a window (`nearest_first`), so that a key and a value in
  different windows can be linked.

  Args:
    labels: int `[N]` label index of each of the document's entities (-1: not in the table).
    boxes: float32 `[N, 4]`, `entity_boxes`.
    allowed: `parse_pairs` table.
    encoded: bool `[N]`, the entities the model encoded (in some window); None: all.
    stats: counters of what `max_candidates` cut (updated in place).
  Returns:
    `values int [V]`, `candidates int [V, C]` (entity indices, 0 where masked) and
    `mask bool [V, C]`, for the `V` entities that can be a value.
  """
  labels = np.asarray(labels)
  n, C = len(labels), max_candidates
  ok = labels >= 0 if encoded is None else (labels >= 0) & np.asarray(encoded, bool)
  values = [i for i in range(n) if ok[i] and allowed[:, labels[i]].any()]
  cands = np.zeros((len(values), C), np.int32)
  mask = np.zeros((len(values), C), bool)
  for slot, i in enumerate(values):
    order = value_candidates(boxes, labels, allowed, i, C, ok, stats)
    cands[slot, :len(order)] = order
    mask[slot, :len(order)] = True
  return np.asarray(values, np.int32), cands, mask


def empty_link_arrays(length: int, shapes: LinkShapes) -> dict[str, np.ndarray]:
  """All-padding `link_*` arrays for a window of `length` tokens (no entities)."""
  E, V, C = shapes.max_entities, shapes.max_values, shapes.max_candidates
  return {
      "link_first": np.zeros(E, np.int32), "link_token_entity": np.full(length, -1, np.int32),
      "link_label": np.zeros(E, np.int32), "link_box": np.zeros((E, 4), np.float32),
      "link_entity_id": np.full(E, -1, np.int32), "link_value": np.zeros(V, np.int32),
      "link_candidates": np.zeros((V, C), np.int32),
      "link_candidate_mask": np.zeros((V, C), bool), "link_target": np.full(V, -1, np.int32),
  }


def add_link_arrays(documents: Sequence[Document], windows: list[dict], window_doc: np.ndarray,
                    entities_of: Sequence[Sequence], relations_of: Sequence | None,
                    allowed: np.ndarray, labels: Sequence[str], shapes: LinkShapes) -> dict:
  """Adds the `link_*` arrays to every window in place; returns what the sizes cut.

  Args:
    entities_of: per document, the entities to link (gold or predicted).
    relations_of: per document, oriented gold relations, or None (no targets).
  """
  label_index = {l: i for i, l in enumerate(labels)}
  stats: dict = {}
  boxes = [entity_boxes(d, ents) if ents else np.zeros((0, 4), np.float32)
           for d, ents in zip(documents, entities_of)]
  for w, d in zip(windows, np.asarray(window_doc)):
    d = int(d)
    w.update(window_link_arrays(
        documents[d], w, entities_of[d], None if relations_of is None else relations_of[d],
        allowed, label_index, shapes, boxes[d], stats))
  return stats
