"""Entity-level precision, recall and F1, as seqeval computes them (strict mode).

The numbers the papers report (DESIGN.md §3.8, §4) are seqeval's entity-level
scores with `mode="strict"` and the matching scheme (`IOBES` for BIOES, `IOB2`
for BIO), computed over *words*. An entity counts as found only when a
predicted entity has the same label and exactly the same first and last word;
ill-formed chunks (`O I-x`, `B-x E-y`...) are not entities at all.

Entities are read with seqeval's own strict reader (`seqeval.scheme`); the
counting is done here so that the streaming accumulator (`EntityMetrics`) and
the one-shot function (`entity_scores`) agree exactly and so that empty cases
have a defined value instead of a warning:

* precision = correct / predicted, recall = correct / gold, and
  F1 = 2 P R / (P + R) (0 when P + R = 0);
* no predicted entity: precision is 1.0 if there is no gold entity either, else
  0.0; no gold entity: recall is 1.0 if nothing was predicted, else 0.0. So
  gold == pred always gives F1 = 1.0 (also when both are empty), and one side
  empty with the other not gives 0.0. (seqeval instead warns and returns 0.0
  for 0/0.) The same rules apply per label.
"""

from __future__ import annotations

import collections
from typing import Sequence

import numpy as np
from seqeval import scheme as seqeval_scheme

from flaxdoc import tags as tagging

_SEQEVAL_SCHEMES = {"BIOES": seqeval_scheme.IOBES, "BIO": seqeval_scheme.IOB2}


def extract_entities(tags: Sequence[str], scheme: str = "BIOES") -> list[tuple[str, int, int]]:
  """`(label, start, end_exclusive)` of the well-formed chunks, as seqeval strict reads them."""
  scheme = tagging.check_scheme(scheme)
  _check_tags(tags, scheme, where="tags")
  tokens = seqeval_scheme.Tokens(list(tags), scheme=_SEQEVAL_SCHEMES[scheme])
  return [(e.tag, e.start, e.end) for e in tokens.entities]


def _check_tags(tags: Sequence[str], scheme: str, where: str) -> None:
  """Clear errors for tags seqeval would reject with a KeyError or a terse message."""
  if isinstance(tags, str):
    raise ValueError(f"{where}: expected a sequence of tags, got a single string {tags!r}")
  for i, t in enumerate(tags):
    if not isinstance(t, str):
      raise ValueError(f"{where}: position {i} holds {type(t).__name__} {t!r}, not a tag string")
    try:
      p, _ = tagging.split_tag(t)
    except ValueError:
      raise ValueError(f"{where}: position {i} has malformed tag {t!r}") from None
    if scheme == "BIO" and p in ("E", "S"):
      raise ValueError(f"{where}: position {i} has tag {t!r}, which the BIO scheme lacks")


def _ratios(correct: int, num_pred: int, num_gold: int) -> tuple[float, float, float]:
  """(precision, recall, f1) with the empty-case conventions of the module doc."""
  if num_pred:
    precision = correct / num_pred
  else:
    precision = 1.0 if num_gold == 0 else 0.0
  if num_gold:
    recall = correct / num_gold
  else:
    recall = 1.0 if num_pred == 0 else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
  return precision, recall, f1


class EntityMetrics:
  """Streaming entity-level counts: `add` sequences batch by batch, `compute` at the end.

  Each added sequence is one document's word tags (entities never cross
  sequences), so the result equals `entity_scores` over all sequences at once.

  Example:
    metrics = EntityMetrics("BIOES")
    for batch in eval_batches:
      metrics.add(gold_word_tags, predicted_word_tags)   # list[list[str]]
    print(format_report(metrics.compute()))
  """

  def __init__(self, scheme: str = "BIOES", tag_names: Sequence[str] | None = None):
    """`tag_names` is only needed for `add_ids` (integer tag ids)."""
    self.scheme = tagging.check_scheme(scheme)
    self.tag_names = list(tag_names) if tag_names is not None else None
    self.reset()

  def reset(self) -> None:
    self._correct: collections.Counter = collections.Counter()
    self._pred: collections.Counter = collections.Counter()
    self._gold: collections.Counter = collections.Counter()
    self.num_sequences = 0

  def add(self, gold_tags, pred_tags) -> None:
    """Adds one sequence (`list[str]`) or a batch of them (`list[list[str]]`).

    Raises:
      ValueError: gold and pred differ in number or length of sequences, or
        hold malformed tags.
    """
    gold_batch, pred_batch = _as_batch(gold_tags), _as_batch(pred_tags)
    if len(gold_batch) != len(pred_batch):
      raise ValueError(f"{len(gold_batch)} gold sequences but {len(pred_batch)} predicted")
    for k, (gold, pred) in enumerate(zip(gold_batch, pred_batch)):
      seq = self.num_sequences + k
      if len(gold) != len(pred):
        raise ValueError(f"sequence {seq}: {len(gold)} gold tags but {len(pred)} predicted")
      _check_tags(gold, self.scheme, where=f"sequence {seq} (gold)")
      _check_tags(pred, self.scheme, where=f"sequence {seq} (pred)")
    for gold, pred in zip(gold_batch, pred_batch):
      gold_set = set(extract_entities(gold, self.scheme))
      pred_set = set(extract_entities(pred, self.scheme))
      self._gold.update(label for label, _, _ in gold_set)
      self._pred.update(label for label, _, _ in pred_set)
      self._correct.update(label for label, _, _ in gold_set & pred_set)
    self.num_sequences += len(gold_batch)

  def add_ids(self, gold_ids, pred_ids, mask=None) -> None:
    """Adds a batch of integer tag ids `[B, L]` (columns of `tag_names`).

    `mask` (`[B, L]`, prefix of valid positions, e.g. words of each document)
    drops the padding; without it every position counts.
    """
    if self.tag_names is None:
      raise ValueError("add_ids needs the tag vocabulary: EntityMetrics(scheme, tag_names=...)")
    gold_ids, pred_ids = np.asarray(gold_ids), np.asarray(pred_ids)
    if gold_ids.ndim != 2 or gold_ids.shape != pred_ids.shape:
      raise ValueError(f"gold_ids and pred_ids must both be [B, L], got {list(gold_ids.shape)} "
                       f"and {list(pred_ids.shape)}")
    mask = np.ones(gold_ids.shape, bool) if mask is None else np.asarray(mask).astype(bool)
    if mask.shape != gold_ids.shape:
      raise ValueError(f"mask must have shape {list(gold_ids.shape)}, got {list(mask.shape)}")
    num_tags = len(self.tag_names)
    for name, ids in (("gold_ids", gold_ids), ("pred_ids", pred_ids)):
      sel = ids[mask]
      if sel.size and (sel.min() < 0 or sel.max() >= num_tags):
        raise ValueError(f"{name} holds ids outside [0, {num_tags}) at valid positions")
    names = self.tag_names
    gold = [[names[i] for i in g[m]] for g, m in zip(gold_ids, mask)]
    pred = [[names[i] for i in p[m]] for p, m in zip(pred_ids, mask)]
    self.add(gold, pred)

  def compute(self) -> dict:
    """The scores of everything added so far, in the format of `entity_scores`."""
    labels = sorted(set(self._gold) | set(self._pred))
    per_label = {}
    for label in labels:
      p, r, f = _ratios(self._correct[label], self._pred[label], self._gold[label])
      per_label[label] = {"precision": p, "recall": r, "f1": f, "support": self._gold[label],
                          "num_pred": self._pred[label], "num_correct": self._correct[label]}
    correct, num_pred, num_gold = (sum(c.values()) for c in (self._correct, self._pred, self._gold))
    p, r, f = _ratios(correct, num_pred, num_gold)
    # Macro F1 averages over labels seen in gold or pred; with none, it is the micro F1 (1.0).
    macro = float(np.mean([v["f1"] for v in per_label.values()])) if per_label else f
    return {"precision": p, "recall": r, "f1": f, "macro_f1": macro, "num_gold": num_gold,
            "num_pred": num_pred, "num_correct": correct, "num_sequences": self.num_sequences,
            "per_label": per_label}


def _as_batch(tags) -> list[list[str]]:
  """A single sequence of strings becomes a batch of one."""
  if isinstance(tags, str):
    raise ValueError(f"expected tag sequences, got a single string {tags!r}")
  tags = list(tags)
  if tags and isinstance(tags[0], str):
    return [tags]
  return [list(t) for t in tags]


def entity_scores(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]],
                  scheme: str = "BIOES") -> dict:
  """seqeval strict entity-level scores over word-tag sequences.

  Args:
    gold: one tag sequence per document.
    pred: the predicted tag sequences, same lengths.
    scheme: "BIOES" (seqeval `IOBES`) or "BIO" (seqeval `IOB2`).

  Returns:
    `{"precision", "recall", "f1"}` (micro), `"macro_f1"`, the counts
    `"num_gold"`, `"num_pred"`, `"num_correct"`, `"num_sequences"`, and
    `"per_label": {label: {"precision", "recall", "f1", "support", "num_pred",
    "num_correct"}}` for every label in gold or pred. Empty cases follow the
    module doc (no entities anywhere: all 1.0).
  """
  metrics = EntityMetrics(scheme)
  if isinstance(gold, str) or isinstance(pred, str):
    raise ValueError("gold and pred must be lists of tag sequences")
  gold, pred = list(gold), list(pred)
  if len(gold) != len(pred):
    raise ValueError(f"{len(gold)} gold sequences but {len(pred)} predicted")
  if gold and isinstance(gold[0], str) or pred and isinstance(pred[0], str):
    raise ValueError("gold and pred must be lists of tag sequences (list[list[str]]), "
                     "not a single sequence")
  if gold:
    metrics.add(gold, pred)
  return metrics.compute()


def format_report(scores: dict, digits: int = 4) -> str:
  """A readable table of `entity_scores` / `EntityMetrics.compute` output."""
  rows = [(label, v["precision"], v["recall"], v["f1"], v["support"])
          for label, v in scores["per_label"].items()]
  rows.append(("micro avg", scores["precision"], scores["recall"], scores["f1"],
               scores["num_gold"]))
  if "macro_f1" in scores:
    rows.append(("macro avg", None, None, scores["macro_f1"], scores["num_gold"]))
  name_width = max(len("label"), *(len(r[0]) for r in rows))
  num_width = max(digits + 2, len("precision"))
  header = (f"{'label':<{name_width}}  {'precision':>{num_width}}  {'recall':>{num_width}}  "
            f"{'f1':>{num_width}}  {'support':>7}")
  lines = [header, "-" * len(header)]
  for k, (label, p, r, f, support) in enumerate(rows):
    if k == len(scores["per_label"]) and scores["per_label"]:
      lines.append("-" * len(header))

    def num(x):
      return f"{'-':>{num_width}}" if x is None else f"{x:>{num_width}.{digits}f}"

    lines.append(f"{label:<{name_width}}  {num(p)}  {num(r)}  {num(f)}  {support:>7d}")
  lines.append(f"({scores.get('num_pred', 0)} predicted, {scores.get('num_correct', 0)} correct, "
               f"{scores.get('num_sequences', 0)} sequences)")
  return "\n".join(lines)


# --------------------------------------------------------------------------- relations
class RelationMetrics:
  """Key -> value relation precision / recall / F1 (LayoutXLM's RE definition).

  A pair is `(key_words, value_words)`, each the word indices of an entity's span. A
  predicted pair counts as correct only when a gold pair has exactly the same key span,
  the same value span and so the same link: a wrong span on either side, a wrong key
  for the value, or a missing pair are all errors. Counts are summed over documents
  (micro average); empty cases follow `_ratios` (nothing predicted and nothing gold:
  P = R = F1 = 1).
  """

  def __init__(self):
    self.reset()

  def reset(self) -> None:
    self.correct = self.num_pred = self.num_gold = 0

  @staticmethod
  def _pairs(pairs) -> set:
    out = set()
    for key, value in pairs:
      out.add((tuple(sorted(int(i) for i in key)), tuple(sorted(int(i) for i in value))))
    return out

  def add(self, gold_pairs, pred_pairs) -> None:
    """Adds one document: `gold_pairs`, `pred_pairs` are iterables of (key_words, value_words)."""
    gold, pred = self._pairs(gold_pairs), self._pairs(pred_pairs)
    self.correct += len(gold & pred)
    self.num_pred += len(pred)
    self.num_gold += len(gold)

  def compute(self) -> dict:
    p, r, f = _ratios(self.correct, self.num_pred, self.num_gold)
    return {"precision": p, "recall": r, "f1": f, "correct": self.correct,
            "num_pred": self.num_pred, "num_gold": self.num_gold}
