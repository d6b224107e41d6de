"""Block shuffling augmentations: segments move whole, words keep boxes and entities."""

import collections

import numpy as np
import pytest

from flaxdoc.data.augment import (global_block_shuffle, neighbour_block_swap, permute_words,
                                  segment_blocks, swap_blocks)
from flaxdoc.data.document import Document


def _doc(rng, n=40, interleave=False, n_pages=2):
  """Unique words (`w0`, `w1`...) so every word can be followed through a permutation."""
  words = [f"w{i}" for i in range(n)]
  x0 = rng.uniform(0, 500, n)
  y0 = rng.uniform(0, 500, n)
  boxes = np.stack([x0, y0, x0 + 20, y0 + 10], 1)
  pages = np.sort(rng.integers(0, n_pages, n))
  segments = rng.integers(0, n // 4, n) if interleave else np.cumsum(rng.random(n) < 0.3)
  ents, i = [], 0
  while i < n - 3:
    if rng.random() < 0.4:
      ents.append((["q", "a"][int(rng.integers(2))], list(range(i, i + int(rng.integers(1, 4))))))
      i += 4
    i += 1
  relations = [(0, 1)] if len(ents) > 1 else []
  return Document.create("aug", words, boxes, pages=pages, page_sizes=[[600, 600]] * n_pages,
                         segments=segments, entities=ents, relations=relations,
                         label_set=["q", "a"])


def _check_consistent(old: Document, new: Document):
  assert new.id == old.id and len(new) == len(old)
  assert collections.Counter(new.words) == collections.Counter(old.words)
  where = {w: i for i, w in enumerate(old.words)}
  src = np.array([where[w] for w in new.words])  # old index of each new word
  np.testing.assert_array_equal(new.boxes, old.boxes[src])
  np.testing.assert_array_equal(new.pages, old.pages[src])
  np.testing.assert_array_equal(new.segments, old.segments[src])
  np.testing.assert_array_equal(new.page_sizes, old.page_sizes)
  # Entities keep their label and their words (as multisets of entity texts).
  text = lambda d, e: (e.label, tuple(sorted(d.words[i] for i in e.words)))  # noqa: E731
  assert collections.Counter(text(new, e) for e in new.entities) == \
      collections.Counter(text(old, e) for e in old.entities)
  # Entity order is kept, so relations still point at the same entities.
  assert [text(new, e) for e in new.entities] == [text(old, e) for e in old.entities]
  assert new.relations == old.relations and new.label_set == old.label_set
  # Each segment is one contiguous block with its words in their original order.
  for seg in np.unique(old.segments):
    old_order = [w for w, s in zip(old.words, old.segments) if s == seg]
    positions = np.flatnonzero(new.segments == seg)
    assert [new.words[p] for p in positions] == old_order
    assert positions[-1] - positions[0] == len(positions) - 1
  return src


@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("augment", [global_block_shuffle, neighbour_block_swap])
def test_augmentations_are_consistent(augment, interleave):
  rng = np.random.default_rng(0)
  changed = 0
  for seed in range(20):
    doc = _doc(rng, interleave=interleave)
    new = augment(doc, np.random.default_rng(seed))
    src = _check_consistent(doc, new)
    changed += not np.array_equal(src, np.arange(len(doc)))
  assert changed >= 15  # they do move blocks


def test_deterministic_under_seed():
  doc = _doc(np.random.default_rng(1))
  for augment in (global_block_shuffle, neighbour_block_swap):
    assert augment(doc, 3).words == augment(doc, np.random.default_rng(3)).words
    assert augment(doc, 3).words != augment(doc, 4).words


def test_global_shuffle_is_uniform_over_first_block():
  doc = Document.create("five", [f"w{i}" for i in range(5)], [[i, 0, i + 1, 1] for i in range(5)],
                        segments=[0, 1, 2, 3, 4])
  rng = np.random.default_rng(0)
  first = collections.Counter(global_block_shuffle(doc, rng).words[0] for _ in range(1000))
  assert set(first) == set(doc.words)
  assert all(abs(c - 200) < 5 * np.sqrt(200) for c in first.values())


def test_swap_blocks_hand_checked():
  # Block 0 swaps right, block 1 stays, block 2 (now at 2) swaps left with block 0
  # (now at 1), block 3's target is outside, block 4 stays.
  assert swap_blocks(np.array([1, 0, -1, 5, 0])) == [1, 2, 0, 3, 4]
  assert swap_blocks(np.array([0, 0, 0])) == [0, 1, 2]
  assert swap_blocks(np.array([2, 0, 0])) == [2, 1, 0]
  # Block 1 has already moved (to 0) when its turn comes: it swaps from there.
  assert swap_blocks(np.array([1, 1, 0])) == [0, 1, 2]
  assert swap_blocks(np.array([], np.int64)) == []


def test_neighbour_swap_moves_blocks_locally():
  n = 200
  doc = Document.create("line", [f"w{i}" for i in range(n)], [[i, 0, i + 1, 1] for i in range(n)],
                        page_sizes=[[n, 1]], segments=np.arange(n))
  new = neighbour_block_swap(doc, np.random.default_rng(0), sigma=1.0)
  moved = np.abs(np.array([int(w[1:]) for w in new.words]) - np.arange(n))
  assert moved.mean() < 2.5 and 0.2 < (moved > 0).mean() < 0.95
  assert neighbour_block_swap(doc, 0, sigma=0.0).words == doc.words
  far = neighbour_block_swap(doc, np.random.default_rng(0), sigma=20.0)
  assert np.abs(np.array([int(w[1:]) for w in far.words]) - np.arange(n)).mean() > moved.mean()
  with pytest.raises(ValueError):
    neighbour_block_swap(doc, 0, sigma=-1.0)


def test_segment_blocks_and_edge_cases():
  doc = Document.create("blocks", ["a", "b", "c", "d", "e"], [[0, 0, 1, 1]] * 5,
                        segments=[5, 2, 5, 2, 9])
  assert [b.tolist() for b in segment_blocks(doc)] == [[0, 2], [1, 3], [4]]
  one = Document.create("one", ["a", "b"], [[0, 0, 1, 1]] * 2, segments=[0, 0])
  assert global_block_shuffle(one, 0).words == ("a", "b")
  empty = Document.create("empty", [], np.zeros((0, 4)))
  assert len(global_block_shuffle(empty, 0)) == 0 and len(neighbour_block_swap(empty, 0)) == 0
  with pytest.raises(ValueError, match="permutation"):
    permute_words(doc, [0, 0, 1, 2, 3])
