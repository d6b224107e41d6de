"""Tests for flaxdoc.metrics: seqeval strict entity scores and the streaming accumulator.

References: exact-match sets of (sequence, label, start, end) built from the
entities a random sequence was generated from, and seqeval's own metric
functions on cases where both define the same number.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from seqeval import metrics as seqeval_metrics
from seqeval import scheme as seqeval_scheme

from flaxdoc import metrics
from flaxdoc import tags as tagging

SCHEMES = ("BIOES", "BIO")
LABELS = ("a", "b", "c")


def random_spans(rng, length, labels=LABELS, rate=0.4):
  """Non-overlapping random spans `(label, start, end)` over `length` words."""
  spans, i = [], 0
  while i < length:
    if rng.random() < rate:
      n = int(rng.integers(1, 4))
      spans.append((str(rng.choice(labels)), i, min(i + n, length)))
      i += n + int(rng.integers(0, 2))  # sometimes adjacent, sometimes a gap
    else:
      i += 1
  return spans


def tags_of(spans, length, scheme):
  tags = ["O"] * length
  for label, begin, stop in spans:
    tags[begin:stop] = tagging.span_tags(stop - begin, label, scheme)
  return tags


def perturb(rng, spans, length, labels=LABELS):
  """A prediction: gold spans kept, relabelled, resized or dropped, plus extras."""
  out = []
  for label, begin, stop in spans:
    r = rng.random()
    if r < 0.5:
      out.append((label, begin, stop))
    elif r < 0.65:
      out.append((str(rng.choice(labels)), begin, stop))
    elif r < 0.8 and stop - begin > 1:
      out.append((label, begin, stop - 1))
  taken = np.zeros(length, bool)
  for _, begin, stop in out:
    taken[begin:stop] = True
  for _ in range(int(rng.integers(0, 3))):
    i = int(rng.integers(0, max(length, 1)))
    if length and not taken[i]:
      out.append((str(rng.choice(labels)), i, i + 1))
      taken[i] = True
  return sorted(out, key=lambda s: s[1])


def reference_scores(gold_spans, pred_spans):
  """Micro and per-label P/R/F1 from exact-match span sets, with the documented
  empty-case rules written out independently."""
  gold = {(k, *s) for k, spans in enumerate(gold_spans) for s in spans}
  pred = {(k, *s) for k, spans in enumerate(pred_spans) for s in spans}

  def prf(g, p):
    c = len(g & p)
    if not g and not p:
      return 1.0, 1.0, 1.0
    prec = c / len(p) if p else 0.0
    rec = c / len(g) if g else 0.0
    return prec, rec, (2 * prec * rec / (prec + rec) if prec + rec else 0.0)

  per_label = {}
  for label in sorted({s[1] for s in gold | pred}):
    g = {s for s in gold if s[1] == label}
    p = {s for s in pred if s[1] == label}
    per_label[label] = (*prf(g, p), len(g))
  return prf(gold, pred), per_label


@pytest.mark.parametrize("scheme", SCHEMES)
def test_entity_scores_match_span_set_reference(scheme):
  rng = np.random.default_rng(0)
  for trial in range(30):
    num_seqs = int(rng.integers(1, 6))
    lengths = rng.integers(0, 25, num_seqs)
    gold_spans = [random_spans(rng, n) for n in lengths]
    pred_spans = [perturb(rng, s, n) for s, n in zip(gold_spans, lengths)]
    gold = [tags_of(s, n, scheme) for s, n in zip(gold_spans, lengths)]
    pred = [tags_of(s, n, scheme) for s, n in zip(pred_spans, lengths)]
    got = metrics.entity_scores(gold, pred, scheme)
    (p, r, f), per_label = reference_scores(gold_spans, pred_spans)
    assert (got["precision"], got["recall"], got["f1"]) == pytest.approx((p, r, f))
    assert set(got["per_label"]) == set(per_label)
    for label, (lp, lr, lf, support) in per_label.items():
      v = got["per_label"][label]
      assert (v["precision"], v["recall"], v["f1"]) == pytest.approx((lp, lr, lf))
      assert v["support"] == support
    assert got["num_gold"] == sum(map(len, gold_spans))
    assert got["num_pred"] == sum(map(len, pred_spans))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_entity_scores_match_seqeval_on_arbitrary_sequences(scheme):
  """Also on ill-formed sequences (random tag noise), where strict mode drops chunks."""
  names = tagging.tag_names(list(LABELS), scheme)
  seq_scheme = {"BIOES": seqeval_scheme.IOBES, "BIO": seqeval_scheme.IOB2}[scheme]
  rng = np.random.default_rng(1)
  checked = 0
  for _ in range(40):
    lengths = rng.integers(1, 20, int(rng.integers(1, 5)))
    gold = [tags_of(random_spans(rng, n), n, scheme) for n in lengths]
    # Gold with ~25% of the tags replaced at random: mostly ill-formed sequences.
    pred = [[names[rng.integers(len(names))] if rng.random() < 0.25 else t for t in g]
            for g in gold]
    got = metrics.entity_scores(gold, pred, scheme)
    if not got["num_gold"] or not got["num_pred"] or not got["num_correct"]:
      continue  # seqeval's 0/0 handling differs by design; see test_empty_cases
    kw = dict(mode="strict", scheme=seq_scheme)
    assert got["precision"] == pytest.approx(seqeval_metrics.precision_score(gold, pred, **kw))
    assert got["recall"] == pytest.approx(seqeval_metrics.recall_score(gold, pred, **kw))
    assert got["f1"] == pytest.approx(seqeval_metrics.f1_score(gold, pred, **kw))
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # labels only in gold or pred: seqeval warns 0/0
      report = seqeval_metrics.classification_report(gold, pred, output_dict=True,
                                                     zero_division=0, **kw)
    for label, v in got["per_label"].items():
      if v["support"] and v["num_pred"]:
        assert v["f1"] == pytest.approx(report[label]["f1-score"])
        assert v["precision"] == pytest.approx(report[label]["precision"])
        assert v["support"] == report[label]["support"]
    checked += 1
  assert checked >= 20


def test_extract_entities_agrees_with_tags_to_spans():
  """Decoding (flaxdoc.tags / flaxdoc.decode) and scoring read chunks the same way."""
  rng = np.random.default_rng(2)
  for scheme in SCHEMES:
    names = tagging.tag_names(["a", "b"], scheme)
    for _ in range(300):
      seq = [names[i] for i in rng.integers(0, len(names), int(rng.integers(0, 9)))]
      assert metrics.extract_entities(seq, scheme) == tagging.tags_to_spans(seq, scheme)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_gold_equal_pred_gives_one(scheme):
  rng = np.random.default_rng(3)
  lengths = rng.integers(0, 30, 8)
  gold = [tags_of(random_spans(rng, n), n, scheme) for n in lengths]
  got = metrics.entity_scores(gold, gold, scheme)
  assert got["precision"] == got["recall"] == got["f1"] == got["macro_f1"] == 1.0
  assert all(v["f1"] == 1.0 for v in got["per_label"].values())


def test_empty_cases_are_defined_and_silent():
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    for gold, pred in [([], []), ([["O", "O"]], [["O", "O"]]), ([[]], [[]])]:
      got = metrics.entity_scores(gold, pred, "BIOES")
      assert (got["precision"], got["recall"], got["f1"]) == (1.0, 1.0, 1.0)
      assert got["per_label"] == {} and got["num_gold"] == got["num_pred"] == 0
    got = metrics.entity_scores([["O", "O"]], [["S-a", "O"]], "BIOES")  # nothing to find
    assert (got["precision"], got["recall"], got["f1"]) == (0.0, 0.0, 0.0)
    got = metrics.entity_scores([["S-a", "O"]], [["O", "O"]], "BIOES")  # nothing found
    assert (got["precision"], got["recall"], got["f1"]) == (0.0, 0.0, 0.0)
    assert got["per_label"]["a"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1,
                                     "num_pred": 0, "num_correct": 0}
    # Strict mode: an ill-formed chunk is no entity (seqeval default mode would count it).
    got = metrics.entity_scores([["B-a", "E-a"]], [["I-a", "E-a"]], "BIOES")
    assert got["num_pred"] == 0 and got["recall"] == 0.0


def test_streaming_equals_one_shot_and_add_ids():
  rng = np.random.default_rng(4)
  scheme = "BIOES"
  names = tagging.tag_names(list(LABELS), scheme)
  lengths = rng.integers(1, 20, 12)
  gold_spans = [random_spans(rng, n) for n in lengths]
  gold = [tags_of(s, n, scheme) for s, n in zip(gold_spans, lengths)]
  pred = [tags_of(perturb(rng, s, n), n, scheme) for s, n in zip(gold_spans, lengths)]
  one_shot = metrics.entity_scores(gold, pred, scheme)

  acc = metrics.EntityMetrics(scheme)
  acc.add(gold[:5], pred[:5])
  acc.add(gold[5], pred[5])  # a single sequence
  acc.add(gold[6:], pred[6:])
  assert acc.compute() == one_shot

  # Integer ids with a padding mask give the same result.
  width = int(lengths.max())
  gold_ids = np.zeros((len(gold), width), np.int32)
  pred_ids = np.full((len(gold), width), names.index("S-b"), np.int32)  # garbage in padding
  mask = np.arange(width)[None] < lengths[:, None]
  for k, (g, p) in enumerate(zip(gold, pred)):
    gold_ids[k, : len(g)] = [names.index(t) for t in g]
    pred_ids[k, : len(p)] = [names.index(t) for t in p]
  by_ids = metrics.EntityMetrics(scheme, tag_names=names)
  by_ids.add_ids(gold_ids[:7], pred_ids[:7], mask[:7])
  by_ids.add_ids(gold_ids[7:], pred_ids[7:], mask[7:])
  assert by_ids.compute() == one_shot
  by_ids.reset()
  assert by_ids.compute()["num_sequences"] == 0


def test_errors_name_the_problem():
  with pytest.raises(ValueError, match="sequence 1: 2 gold tags but 1"):
    metrics.entity_scores([["O"], ["O", "O"]], [["O"], ["O"]], "BIOES")
  with pytest.raises(ValueError, match="2 gold sequences but 1"):
    metrics.entity_scores([["O"], ["O"]], [["O"]], "BIOES")
  with pytest.raises(ValueError, match="position 1 has malformed tag 'X-a'"):
    metrics.entity_scores([["O", "O"]], [["O", "X-a"]], "BIOES")
  with pytest.raises(ValueError, match="BIO scheme"):
    metrics.entity_scores([["O", "E-a"]], [["O", "O"]], "BIO")
  with pytest.raises(ValueError, match="list"):
    metrics.entity_scores(["O", "O"], ["O", "O"], "BIO")
  with pytest.raises(ValueError, match="tag_names"):
    metrics.EntityMetrics("BIO").add_ids(np.zeros((1, 2)), np.zeros((1, 2)))
  with pytest.raises(ValueError, match="outside"):
    metrics.EntityMetrics("BIO", tag_names=["O", "B-a", "I-a"]).add_ids(
        np.array([[0, 3]]), np.array([[0, 0]]))


def test_format_report_lists_labels_and_totals():
  got = metrics.entity_scores([["B-a", "E-a", "O", "S-b"]], [["B-a", "E-a", "O", "S-a"]], "BIOES")
  text = metrics.format_report(got)
  lines = text.splitlines()
  row = {line.split()[0]: line.split() for line in lines if line and line[0].isalpha()}
  assert row["a"][1:] == ["0.5000", "1.0000", "0.6667", "1"]
  assert row["b"][1:] == ["0.0000", "0.0000", "0.0000", "1"]
  assert row["micro"][2:] == ["0.5000", "0.5000", "0.5000", "2"]
  assert "2 predicted, 1 correct" in text
  assert "micro avg" in metrics.format_report(metrics.entity_scores([], []))
