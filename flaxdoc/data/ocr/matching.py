"""Gold words <-> OCR words: how well an engine read a page, and gold labels carried over.

* `match_words`: one-to-one pairs of a gold and an OCR word on the same page
  whose normalised texts are equal and whose boxes overlap with IoU >= 0.5,
  taken greedily by IoU (highest first). Recall = matched / gold words,
  precision = matched / OCR words, mean IoU over matched pairs
  (`word_scores`), as `python -m flaxdoc.bench.ocr` reports them.
* `transfer_entities`: each OCR word takes the gold entity of the gold word it
  overlaps most (intersection over the OCR word's own area >= 0.5), so a model
  can be scored on what OCR really gives (`load_funsd(..., ocr=...)`). Gold
  entities no OCR word lands in are lost (counted).

Normalised text: Unicode NFKC, case-folded, with everything but letters and
digits removed ("Date:" == "date"); a word of punctuation only keeps its
punctuation.
"""

from __future__ import annotations

import dataclasses
import unicodedata

import numpy as np

from flaxdoc.data.document import Document, Entity

MATCH_IOU = 0.5
TRANSFER_OVERLAP = 0.5


def normalize(text: str) -> str:
  folded = unicodedata.normalize("NFKC", text).casefold()
  kept = "".join(c for c in folded if c.isalnum())
  return kept or "".join(folded.split())


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """`[N, M]` intersection over union of boxes `a [N, 4]` and `b [M, 4]` (0 for empty unions)."""
  inter = _intersection(a, b)
  area_a = _area(a)[:, None]
  area_b = _area(b)[None, :]
  union = area_a + area_b - inter
  return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def _area(b: np.ndarray) -> np.ndarray:
  b = np.asarray(b, np.float64).reshape(-1, 4)
  return np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)


def _intersection(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  a = np.asarray(a, np.float64).reshape(-1, 4)[:, None, :]
  b = np.asarray(b, np.float64).reshape(-1, 4)[None, :, :]
  w = np.clip(np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]), 0, None)
  h = np.clip(np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]), 0, None)
  return w * h


def _same_page(gold: Document, ocr: Document):
  """Yields `(gold word indices, OCR word indices)` of each page both have words on."""
  for page in range(min(gold.num_pages, ocr.num_pages)):
    gi = np.flatnonzero(gold.pages == page)
    oi = np.flatnonzero(ocr.pages == page)
    if len(gi) and len(oi):
      yield gi, oi


def match_words(gold: Document, ocr: Document, *, min_iou: float = MATCH_IOU
                ) -> list[tuple[int, int, float]]:
  """`(gold word, OCR word, IoU)` pairs: same page, same normalised text, IoU >= `min_iou`."""
  out = []
  gold_norm = [normalize(w) for w in gold.words]
  ocr_norm = [normalize(w) for w in ocr.words]
  for gi, oi in _same_page(gold, ocr):
    iou = box_iou(gold.boxes[gi], ocr.boxes[oi])  # [G, O]
    same = np.array([[gold_norm[g] == ocr_norm[o] for o in oi] for g in gi], bool)
    cand = np.argwhere(same & (iou >= min_iou))
    order = np.argsort(-iou[cand[:, 0], cand[:, 1]], kind="stable")
    used_g, used_o = set(), set()
    for r, c in cand[order]:
      if r in used_g or c in used_o:
        continue
      used_g.add(r)
      used_o.add(c)
      out.append((int(gi[r]), int(oi[c]), float(iou[r, c])))
  return out


@dataclasses.dataclass
class WordScores:
  """Counts behind recall / precision / mean IoU; add them up over pages, then read the rates."""
  gold: int = 0
  ocr: int = 0
  matched: int = 0
  iou_sum: float = 0.0

  def __iadd__(self, other: "WordScores") -> "WordScores":
    self.gold += other.gold
    self.ocr += other.ocr
    self.matched += other.matched
    self.iou_sum += other.iou_sum
    return self

  @property
  def recall(self) -> float:
    return self.matched / self.gold if self.gold else 0.0

  @property
  def precision(self) -> float:
    return self.matched / self.ocr if self.ocr else 0.0

  @property
  def mean_iou(self) -> float:
    return self.iou_sum / self.matched if self.matched else 0.0


def word_scores(gold: Document, ocr: Document, *, min_iou: float = MATCH_IOU) -> WordScores:
  pairs = match_words(gold, ocr, min_iou=min_iou)
  return WordScores(len(gold), len(ocr), len(pairs), sum(p[2] for p in pairs))


def transfer_entities(gold: Document, ocr: Document, *, min_overlap: float = TRANSFER_OVERLAP
                      ) -> tuple[list[Entity], list[tuple[int, int]], list[int]]:
  """Gold entities (and relations) on the OCR words: `(entities, relations, lost)`.

  An OCR word belongs to the gold entity of the gold word (same page) that covers
  the largest part of it, if that part is at least `min_overlap` of its area.
  `lost` lists the gold entities no OCR word landed in; relations touching them
  are dropped.
  """
  entity_of_word = np.full(len(gold), -1)
  for k, e in enumerate(gold.entities or ()):
    entity_of_word[list(e.words)] = k
  members: dict[int, list[int]] = {}
  for gi, oi in _same_page(gold, ocr):
    inter = _intersection(ocr.boxes[oi], gold.boxes[gi])  # [O, G]
    cover = inter / np.maximum(_area(ocr.boxes[oi]), 1e-9)[:, None]
    best = cover.argmax(axis=1)
    for r, c in enumerate(best):
      k = entity_of_word[gi[c]]
      if cover[r, c] >= min_overlap and k >= 0:
        members.setdefault(int(k), []).append(int(oi[r]))
  gold_ents = list(gold.entities or ())
  new_index = {}
  entities = []
  for k in sorted(members):
    new_index[k] = len(entities)
    entities.append(Entity(gold_ents[k].label, tuple(sorted(members[k]))))
  relations = [(new_index[a], new_index[b]) for a, b in gold.relations
               if a in new_index and b in new_index]
  lost = [k for k in range(len(gold_ents)) if k not in new_index]
  return entities, relations, lost


def with_gold_entities(gold: Document, ocr: Document) -> tuple[Document, list[int]]:
  """The OCR document labelled with `gold`'s entities (see `transfer_entities`), and the
  indices of the gold entities lost."""
  entities, relations, lost = transfer_entities(gold, ocr)
  doc = ocr.replace(id=gold.id, entities=entities, relations=relations,
                    label_set=gold.label_set)
  return doc, lost
