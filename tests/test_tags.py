"""Tag vocabularies and entity <-> tag conversion, checked against hand-written cases."""

import random

import pytest

from flaxdoc import tags
from flaxdoc.data import Entity


def test_tag_names_order():
  assert tags.tag_names(["a", "b"], "BIOES") == ["O", "B-a", "I-a", "E-a", "S-a",
                                                 "B-b", "I-b", "E-b", "S-b"]
  assert tags.tag_names(["a"], "bio") == ["O", "B-a", "I-a"]
  with pytest.raises(ValueError):
    tags.tag_names(["a", "a"])
  with pytest.raises(ValueError):
    tags.tag_names(["a"], "IOB1")


def test_entities_to_tags_by_hand():
  ents = [Entity("k", (0, 1, 2)), Entity("v", (4,)), Entity("k", (6, 8))]
  assert tags.entities_to_tags(9, ents, "BIOES") == [
      "B-k", "I-k", "E-k", "O", "S-v", "O", "S-k", "O", "S-k"]
  assert tags.entities_to_tags(9, ents, "BIO") == [
      "B-k", "I-k", "I-k", "O", "B-v", "O", "B-k", "O", "B-k"]


def test_tags_to_spans_rejects_malformed_chunks():
  assert tags.tags_to_spans(["I-a", "E-a", "S-b"], "BIOES") == [("b", 2, 3)]
  assert tags.tags_to_spans(["B-a", "I-b", "E-b"], "BIOES") == []
  assert tags.tags_to_spans(["B-a", "I-a"], "BIOES") == []  # never closed
  assert tags.tags_to_spans(["I-a", "B-a", "I-a", "O", "B-b"], "BIO") == [("a", 1, 3), ("b", 4, 5)]


@pytest.mark.parametrize("scheme", ["BIOES", "BIO"])
def test_round_trip_random_spans(scheme):
  rng = random.Random(0)
  for _ in range(200):
    n = rng.randint(0, 30)
    spans, i = [], 0
    while i < n:
      if rng.random() < 0.4:
        length = rng.randint(1, min(4, n - i))
        spans.append((rng.choice("xyz"), i, i + length))
        i += length
        if rng.random() < 0.5:
          i += 1  # a gap, or BIO adjacent entities of the same type
      else:
        i += 1
    ents = [Entity(l, tuple(range(s, e))) for l, s, e in spans]
    got = tags.tags_to_spans(tags.entities_to_tags(n, ents, scheme), scheme)
    assert got == spans
