"""Reading-order augmentations for fine-tuning (LSPE paper, DESIGN §3.7).

Both move whole OCR segments (text blocks: lines or annotated blocks, the
`Document.segments` ids) and keep the word order inside each segment, which
simulates an OCR engine that reads the blocks of a page in the wrong order:

* `global_block_shuffle`: a uniformly random permutation of the segments;
* `neighbour_block_swap`: each segment, in turn, swaps with the segment at
  offset `round(N(0, sigma^2))` from its current position (sigma = 1 in the
  paper), so blocks mostly move a step or two.

A segment's words are the words with that segment id, taken in document order
(even if other words sit between them). The result is a new, validated
`Document` whose per-word fields (words, boxes, pages, segments) are permuted
together and whose entities point at the same words in their new positions;
nothing else changes. Use them on training data only.
"""

from __future__ import annotations

import numpy as np

from flaxdoc.data.document import Document, Entity


def segment_blocks(doc: Document) -> list[np.ndarray]:
  """Word indices of each segment, segments in order of first appearance."""
  seg = doc.segments
  if not len(seg):
    return []
  _, first, inverse = np.unique(seg, return_index=True, return_inverse=True)
  inverse = inverse.reshape(-1)
  order = np.argsort(first, kind="stable")  # unique-id index -> appearance rank
  rank = np.empty(len(first), np.int64)
  rank[order] = np.arange(len(first))
  word_rank = rank[inverse]
  by_rank = np.argsort(word_rank, kind="stable")  # stable: document order inside a block
  sizes = np.bincount(word_rank, minlength=len(first))
  return np.split(by_rank, np.cumsum(sizes)[:-1])


def permute_words(doc: Document, order: np.ndarray) -> Document:
  """A copy of `doc` whose word `i` is the old word `order[i]`; entities follow their words."""
  order = np.asarray(order, np.int64)
  n = len(doc)
  if order.shape != (n,) or not np.array_equal(np.sort(order), np.arange(n)):
    raise ValueError(f"permute_words: order must be a permutation of {n} word indices")
  new_index = np.empty(n, np.int64)
  new_index[order] = np.arange(n)
  entities = None
  if doc.entities is not None:
    entities = tuple(Entity(e.label, tuple(sorted(int(new_index[w]) for w in e.words)))
                     for e in doc.entities)
  return Document.create(
      doc.id, [doc.words[i] for i in order], doc.boxes[order], pages=doc.pages[order],
      page_sizes=doc.page_sizes, segments=doc.segments[order], entities=entities,
      relations=doc.relations, label_set=doc.label_set)


def _blocks_to_order(blocks: list[np.ndarray]) -> np.ndarray:
  if not blocks:
    return np.zeros(0, np.int64)
  return np.concatenate(blocks)


def global_block_shuffle(doc: Document, rng: np.random.Generator | int | None) -> Document:
  """Permutes the document's segments uniformly at random (internal order kept)."""
  rng = np.random.default_rng(rng)
  blocks = segment_blocks(doc)
  perm = rng.permutation(len(blocks))
  return permute_words(doc, _blocks_to_order([blocks[i] for i in perm]))


def neighbour_block_swap(doc: Document, rng: np.random.Generator | int | None,
                         sigma: float = 1.0) -> Document:
  """Swaps each segment with the one at offset `round(N(0, sigma^2))` (LSPE §3.3).

  Segments are visited in their original order; each one, from wherever it
  currently is, swaps places with the block `d` positions away (`d` drawn per
  segment; no swap when `d == 0` or the target is outside the document).
  """
  if not np.isfinite(sigma) or sigma < 0:
    raise ValueError(f"sigma must be finite and >= 0, got {sigma}")
  rng = np.random.default_rng(rng)
  blocks = segment_blocks(doc)
  num = len(blocks)
  offsets = np.rint(rng.normal(0.0, sigma, size=num)).astype(np.int64) if sigma > 0 else \
      np.zeros(num, np.int64)
  return permute_words(doc, _blocks_to_order([blocks[b] for b in swap_blocks(offsets)]))


def swap_blocks(offsets: np.ndarray) -> list[int]:
  """The block order after each block `b`, in turn, swaps with the block `offsets[b]` away.

  `result[p]` is the original block now at position `p`. Offsets pointing
  outside `[0, len(offsets))` (or 0) leave that block where it is.
  """
  num = len(offsets)
  slots = list(range(num))  # slots[p] = original block at position p
  where = list(range(num))  # where[b] = current position of original block b
  for b in range(num):
    p = where[b]
    q = p + int(offsets[b])
    if q == p or not 0 <= q < num:
      continue
    other = slots[q]
    slots[p], slots[q] = other, b
    where[b], where[other] = q, p
  return slots
