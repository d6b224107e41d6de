"""Tagging schemes (BIOES, BIO): tag vocabularies and entity <-> word-tag conversion.

The tag vocabulary is fixed by the label list and the scheme, in this order:
`O`, then for each label (in the given order) its prefixes in scheme order:
BIOES -> `B-x, I-x, E-x, S-x`; BIO -> `B-x, I-x`. Tag id 0 is always `O`.

Entities here are spans of *consecutive words in reading order*: a gold entity
whose words are not contiguous in the document's word order is tagged over its
words only, and the words in between keep their own tags.
"""

from __future__ import annotations

from typing import Sequence

SCHEMES = ("BIOES", "BIO")

_PREFIXES = {"BIOES": ("B", "I", "E", "S"), "BIO": ("B", "I")}


def check_scheme(scheme: str) -> str:
  s = scheme.upper()
  if s not in SCHEMES:
    raise ValueError(f"unknown tagging scheme {scheme!r}; expected one of {SCHEMES}")
  return s


def tag_names(labels: Sequence[str], scheme: str = "BIOES") -> list[str]:
  """`["O", "B-l0", "I-l0", ...]` for the labels, in a fixed order."""
  scheme = check_scheme(scheme)
  if len(set(labels)) != len(labels):
    raise ValueError(f"duplicate labels in {list(labels)}")
  names = ["O"]
  for label in labels:
    names += [f"{p}-{label}" for p in _PREFIXES[scheme]]
  return names


def split_tag(tag: str) -> tuple[str, str | None]:
  """`"B-total"` -> `("B", "total")`; `"O"` -> `("O", None)`."""
  if tag == "O":
    return "O", None
  prefix, sep, label = tag.partition("-")
  if not sep or prefix not in ("B", "I", "E", "S") or not label:
    raise ValueError(f"malformed tag {tag!r}")
  return prefix, label


def span_tags(length: int, label: str, scheme: str = "BIOES") -> list[str]:
  """The tags of one entity of `length` words."""
  scheme = check_scheme(scheme)
  if length <= 0:
    return []
  if scheme == "BIO":
    return [f"B-{label}"] + [f"I-{label}"] * (length - 1)
  if length == 1:
    return [f"S-{label}"]
  return [f"B-{label}"] + [f"I-{label}"] * (length - 2) + [f"E-{label}"]


def entities_to_tags(num_words: int, entities, scheme: str = "BIOES") -> list[str]:
  """Word tags from entities (objects with `.label` and sorted `.words`).

  A gold entity whose word indices are not consecutive is split into maximal
  runs of consecutive indices, each tagged as an entity of its own (so the
  conversion stays exact on what it can represent).
  """
  tags = ["O"] * num_words
  for e in entities or ():
    for run in consecutive_runs(e.words):
      for i, t in zip(run, span_tags(len(run), e.label, scheme)):
        tags[i] = t
  return tags


def consecutive_runs(indices: Sequence[int]) -> list[list[int]]:
  runs: list[list[int]] = []
  for i in sorted(indices):
    if runs and runs[-1][-1] == i - 1:
      runs[-1].append(i)
    else:
      runs.append([i])
  return runs


def tags_to_spans(tags: Sequence[str], scheme: str = "BIOES") -> list[tuple[str, int, int]]:
  """Spans `(label, start, end_exclusive)` from tags, read leniently.

  Invalid sequences are read the way seqeval's strict mode would reject them
  as entity parts: an entity is only emitted for a well-formed chunk
  (BIOES: `S` or `B I* E`; BIO: `B I*`). Use the constrained Viterbi decoder
  to produce well-formed tags in the first place.
  """
  scheme = check_scheme(scheme)
  spans = []
  start, label = None, None
  for i, tag in enumerate(tags):
    p, l = split_tag(tag)
    if scheme == "BIO":
      if p == "B":
        if start is not None:
          spans.append((label, start, i))
        start, label = i, l
      elif p == "I" and start is not None and l == label:
        continue
      else:
        if start is not None:
          spans.append((label, start, i))
        start, label = None, None
    else:
      if p == "S":
        start, label = None, None
        spans.append((l, i, i + 1))
      elif p == "B":
        start, label = i, l
      elif p == "I" and start is not None and l == label:
        continue
      elif p == "E" and start is not None and l == label:
        spans.append((label, start, i + 1))
        start, label = None, None
      else:
        start, label = None, None
  if scheme == "BIO" and start is not None:
    spans.append((label, start, len(tags)))
  return spans
