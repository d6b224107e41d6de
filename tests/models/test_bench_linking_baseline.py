"""The nearest-key baseline and its count of the gold pairs document candidates reach."""

from flaxdoc.bench import linking_baseline
from flaxdoc.data.document import Document

LABELS = ("header", "question", "answer")


def _form():
  """q0 a1 on one line, q2 above a3, q4 right of its answer a5, a lone q6 right above a5."""
  words = ["Name:", "Ann", "Date:", "1.2.20", "Fax:", "12", "Tel:"]
  boxes = [[0, 0, 10, 5], [20, 0, 30, 5], [0, 10, 10, 15], [0, 20, 10, 25], [80, 80, 90, 85],
           [60, 80, 70, 85], [60, 70, 70, 75]]
  ents = [("question", [0]), ("answer", [1]), ("question", [2]), ("answer", [3]),
          ("question", [4]), ("answer", [5]), ("question", [6])]
  return Document.create("f", words, boxes, page_sizes=[[100, 100]], entities=ents,
                         relations=[(1, 0), (2, 3), (4, 5)], label_set=LABELS)


def test_nearest_key_rule_and_reachable_pairs():
  doc = _form()
  # a5 is left of its question: the rule (a key left of / above) gives it q6, right above.
  scores = linking_baseline.evaluate([doc], "question:answer", LABELS)
  assert (scores["num_gold"], scores["num_pred"], scores["correct"]) == (3, 3, 2), scores
  # q6 is also a5's nearest question (5 apart; q4 10): one candidate misses a5's key, two hold it.
  assert linking_baseline.reachable_pairs([doc], "question:answer", LABELS, 1) == (2, 3)
  assert linking_baseline.reachable_pairs([doc], "question:answer", LABELS, 2) == (3, 3)
