"""RelationMetrics (LayoutXLM's RE definition) on hand-computed cases."""

import pytest

from flaxdoc.metrics import RelationMetrics

GOLD = [((0, 1), (2,)), ((3,), (4, 5)), ((6,), (7,))]  # (key words, value words)


def _scores(gold, pred):
  m = RelationMetrics()
  m.add(gold, pred)
  return m.compute()


def test_perfect_and_empty():
  assert _scores(GOLD, list(reversed(GOLD)))["f1"] == 1.0
  assert _scores([], [])["f1"] == 1.0
  assert _scores(GOLD, [])["f1"] == 0.0 and _scores([], GOLD)["f1"] == 0.0


def test_missed_pair():
  s = _scores(GOLD, GOLD[:2])
  assert (s["correct"], s["num_pred"], s["num_gold"]) == (2, 2, 3)
  assert s["precision"] == 1.0 and s["recall"] == pytest.approx(2 / 3)
  assert s["f1"] == pytest.approx(0.8)


def test_wrong_tail():
  # The value of key (3,) attached to key (6,) instead: one wrong, one missed.
  pred = [GOLD[0], ((6,), (4, 5)), GOLD[2]]
  s = _scores(GOLD, pred)
  assert (s["correct"], s["num_pred"], s["num_gold"]) == (2, 3, 3)
  assert s["f1"] == pytest.approx(2 / 3)


def test_wrong_span():
  # Right link, but the value span lost a word (a tagging error): the pair is wrong.
  pred = [GOLD[0], ((3,), (4,)), GOLD[2]]
  s = _scores(GOLD, pred)
  assert s["correct"] == 2 and s["precision"] == pytest.approx(2 / 3)
  # Word order inside a span does not matter; duplicates count once.
  s = _scores(GOLD, [((1, 0), (2,)), ((0, 1), (2,))])
  assert (s["correct"], s["num_pred"]) == (1, 1)


def test_micro_average_over_documents():
  m = RelationMetrics()
  m.add(GOLD, GOLD)  # 3 / 3
  m.add(GOLD[:1], [])  # 0 / 1 gold
  s = m.compute()
  assert (s["correct"], s["num_pred"], s["num_gold"]) == (3, 3, 4)
  assert s["recall"] == pytest.approx(0.75) and s["precision"] == 1.0
