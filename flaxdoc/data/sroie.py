"""SROIE reader: scanned receipts, OCR lines, and four key fields aligned back to words.

Expected layout (the usual "SROIE2019" layout; images are not needed)::

  <data_dir>/train/box/<ID>.txt        OCR lines: x1,y1,...,x4,y4,transcript
  <data_dir>/train/entities/<ID>.txt   {"company", "date", "address", "total"} (JSON)
  <data_dir>/test/box/<ID>.txt
  <data_dir>/test/entities/<ID>.txt    (optional: without it, documents are unlabelled)

Files are decoded as UTF-16 where a byte-order mark says so, else as UTF-8 (a BOM is
tolerated) and, failing that, as cp1252 and then latin-1; every fallback is recorded in
the report. Lines are split with
universal newlines (`\\n`, `\\r\\n` and `\\r`).

What becomes of it:

* segments: the OCR lines (one id per line). A line's box is the axis-aligned
  hull of its four corners.
* words: each line split on whitespace. A word's box spans the line's height
  and the share of the line's width proportional to its characters (the
  transcript is spread evenly over the box, stripped of outer spaces). A line
  with an empty transcript is recorded as a skipped word.
* page size: the bounding box of all lines (from the origin): SROIE gives no
  image size.
* entities: SROIE labels whole receipts, not words, so each key string is
  aligned to the words (`align_field`): first an exact match of the
  space-free, upper-cased key in the space-free, upper-cased word stream whose
  ends do not cut a number or a word in the middle (`19.00` does not match
  `9.00`, `RM9.00` does); failing that a fuzzy match over windows of up to
  `max_window_lines` consecutive OCR lines (candidates ranked by character
  trigram overlap, then `difflib` similarity of the covered words, accepted at
  `min_similarity`, default 0.8). `total` prefers the bottom-most occurrence
  (totals repeat: subtotal, total, cash); the other fields the first one.
  Fields are placed in the order company, date, total, address, and never
  share words. `report.stats["alignment_rate"]` gives, per field, the fraction
  of receipts where it was placed; `report.stats["alignment"]` the counts by
  outcome; every field not placed is a skipped entity with its reason.
"""

from __future__ import annotations

import codecs
import collections
import difflib
import os
import re
from pathlib import Path
from typing import Collection, Sequence

import numpy as np

from flaxdoc.data.public_datasets import LABELS, DatasetNotFoundError
from flaxdoc.data.document import Document, DocumentError
from flaxdoc.data.jsonl import coordinate, parse_json
from flaxdoc.data.reading import check_on_error, list_ids, parse_each, select_ids
from flaxdoc.data.report import LoadReport

SROIE_LABELS = LABELS["sroie"]
SPLITS = ("train", "test")
FIELD_ORDER = ("company", "date", "total", "address")
ENCODINGS = ("utf-8", "cp1252", "latin-1")

_LAYOUT = ("<data_dir>/{train,test}/box/<ID>.txt (OCR lines 'x1,y1,...,x4,y4,text') and "
           "<data_dir>/{train,test}/entities/<ID>.txt (JSON key fields)")


# --------------------------------------------------------------------------- files
def _split_dirs(data_dir, split: str) -> tuple[Path, Path | None]:
  if split not in SPLITS:
    raise DatasetNotFoundError(
        f"SROIE has no official {split!r} split (only {list(SPLITS)}); use "
        f"flaxdoc.data.datasets.load_dataset('sroie', {split!r}) to carve a dev split")
  root = Path(data_dir) / split
  box = root / "box"
  if not box.is_dir():
    raise DatasetNotFoundError(f"SROIE {split!r} split not found: {str(box)!r} is not a "
                               f"directory. Expected {_LAYOUT}")
  ents = root / "entities"
  return box, (ents if ents.is_dir() else None)


def list_sroie_ids(data_dir, split: str) -> list[str]:
  """Sorted receipt ids (box file stems) of an official split."""
  box, _ = _split_dirs(data_dir, split)
  return list_ids(box, "*.txt", f"SROIE {split!r}")


def decode_text(raw: bytes) -> tuple[str, str]:
  """`(text, encoding)`: UTF-16 where a byte-order mark says so (what Windows Notepad
  saves as "Unicode"), else UTF-8 first (BOM stripped), then cp1252, then latin-1."""
  if raw[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
    try:
      return raw.decode("utf-16"), "utf-16"
    except UnicodeDecodeError:
      pass  # an odd byte count or a lone surrogate: not UTF-16 after all
  for enc in ENCODINGS:
    try:
      text = raw.decode("utf-8-sig" if enc == "utf-8" else enc)
    except UnicodeDecodeError:
      continue
    return text, enc
  raise AssertionError("latin-1 decodes any bytes")


def split_lines(text: str) -> list[str]:
  """Universal newlines, as text-mode `open` does (no splitting on other separators)."""
  return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _read_text(path: Path, doc_id: str, report: LoadReport) -> str:
  try:
    raw = path.read_bytes()
  except OSError as e:
    raise DocumentError(f"cannot read file ({e.strerror or e})", doc_id=doc_id,
                        source=os.fspath(path)) from None
  text, enc = decode_text(raw)
  if enc != "utf-8":
    report.repair(f"{doc_id} {path.parent.name}/{path.name}", f"decoded as {enc} (not UTF-8)")
  return text


def _parse_coordinate(text: str, err) -> float:
  try:
    x = float(text.strip())
  except ValueError:
    raise err(f"coordinate {text.strip()[:20]!r} is not a number") from None
  if coordinate(x) is None:
    raise err(f"coordinate {text.strip()[:20]!r} is not finite in float32")
  return x


# --------------------------------------------------------------------------- reading
def load_sroie(data_dir, split: str, *, ids: Collection[str] | None = None,
               box_policy: str = "clip", on_error: str = "raise",
               min_similarity: float = 0.8, max_window_lines: int = 6
               ) -> tuple[list[Document], LoadReport]:
  """Reads an official SROIE split: `(documents, report)`.

  Args:
    data_dir: the SROIE folder (see the module docstring for the layout).
    split: "train" or "test".
    ids: read only these receipts (default: all, sorted by id).
    box_policy: `Document.create` policy for boxes outside the page.
    on_error: "raise" a `DocumentError` on a malformed file, or "skip" it and
      record it in the report.
    min_similarity: fuzzy alignments below this `difflib` ratio are rejected.
    max_window_lines: the most consecutive OCR lines one fuzzy match may span.
  """
  check_on_error(on_error)
  box_dir, ent_dir = _split_dirs(data_dir, split)
  ids = select_ids(ids, list_sroie_ids(data_dir, split), f"SROIE {split!r}: no box file",
                   box_dir)
  report = LoadReport(f"sroie:{split} ({box_dir.parent})")
  outcomes = {f: collections.Counter() for f in SROIE_LABELS}
  docs = []

  def entities_path(doc_id):
    return ent_dir / f"{doc_id}.txt" if ent_dir is not None else None

  def with_entities(doc_ids):
    # A receipt without its entities file is skipped whatever `on_error` says.
    # Filtering lazily keeps the skipped documents of the report in id order.
    for doc_id in doc_ids:
      ent_path = entities_path(doc_id)
      if ent_path is not None and not ent_path.is_file():
        report.skip_document(doc_id, f"no entities file {ent_path.name} (other receipts of "
                             "this split have one)")
        continue
      yield doc_id

  def parse(doc_id, local):
    return _read_receipt(box_dir / f"{doc_id}.txt", entities_path(doc_id), doc_id, local,
                         box_policy, min_similarity, max_window_lines)

  for doc_id, local, (doc, outcome) in parse_each(with_entities(ids), parse, report, on_error):
    report.skipped_words += local.skipped_words
    report.repairs += local.repairs
    if not len(doc):
      report.skip_document(doc_id, "no words with text")
      continue
    report.skipped_entities += local.skipped_entities
    for note in doc.repairs:
      report.repair(doc_id, note)
    for field, result in outcome.items():
      outcomes[field][result] += 1
    docs.append(doc)
  report.loaded = len(docs)
  report.stats["lines"] = sum(len(set(d.segments.tolist())) for d in docs)
  if ent_dir is None:
    report.stats["unlabelled"] = f"no {split}/entities folder: {len(docs)} unlabelled receipts"
  else:
    n = max(len(docs), 1)
    report.stats["alignment_rate"] = {
        f: round((c["exact"] + c["fuzzy"]) / n, 4) for f, c in outcomes.items()}
    report.stats["alignment"] = {f: dict(c) for f, c in outcomes.items()}
  return docs, report


def _read_receipt(box_path: Path, ent_path: Path | None, doc_id: str, report: LoadReport,
                  box_policy: str, min_similarity: float, max_window_lines: int
                  ) -> tuple[Document, dict[str, str]]:
  """One receipt -> (Document, alignment outcome per field). Raises DocumentError."""
  words, boxes, segments = [], [], []
  max_x = max_y = 1.0
  num_lines = 0
  for lineno, line in enumerate(split_lines(_read_text(box_path, doc_id, report)), start=1):
    if not line.strip():
      continue  # blank lines (a trailing newline) hold no OCR line

    def err(msg, lineno=lineno):
      return DocumentError(f"line {lineno}: {msg}", doc_id=doc_id, field="box",
                           source=f"{os.fspath(box_path)}:{lineno}")

    parts = line.split(",", 8)
    if len(parts) < 9:
      raise err(f"expected 8 coordinates and a transcript, got {line[:80]!r}")
    coords = [_parse_coordinate(p, err) for p in parts[:8]]
    xs, ys = coords[0::2], coords[1::2]
    x0, y0, x1, y1 = min(xs), min(ys), max(xs), max(ys)  # hull of the quad
    max_x, max_y = max(max_x, x1), max(max_y, y1)
    text = parts[8]
    spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    if not spans:
      report.skip_word(f"{doc_id} line {lineno}", "empty text")
      continue
    first, last = spans[0][0], spans[-1][1]
    scale = (x1 - x0) / (last - first)  # pixels per character of the visible text
    for s, e in spans:
      words.append(text[s:e])
      boxes.append([x0 + (s - first) * scale, y0, x0 + (e - first) * scale, y1])
      segments.append(num_lines)
    num_lines += 1

  entities, outcome = None, {}
  if ent_path is not None:
    keys = _read_keys(ent_path, doc_id, report)
    centre_y = [(b[1] + b[3]) / 2 for b in boxes]
    entities, outcome = align_fields(doc_id, keys, words, segments, centre_y, report,
                                     min_similarity=min_similarity,
                                     max_window_lines=max_window_lines)
  doc = Document.create(doc_id, words, boxes, page_sizes=[[max_x, max_y]], segments=segments,
                        entities=entities, label_set=SROIE_LABELS, box_policy=box_policy,
                        source=os.fspath(box_path))
  return doc, outcome


def _read_keys(path: Path, doc_id: str, report: LoadReport) -> dict[str, str]:
  source = os.fspath(path)
  keys = parse_json(_read_text(path, doc_id, report), source=source, doc_id=doc_id)
  if not isinstance(keys, dict):
    raise DocumentError(f"expected a JSON object of key fields, got {type(keys).__name__}",
                        doc_id=doc_id, field="entities", source=source)
  for k, v in keys.items():
    if k not in SROIE_LABELS:
      raise DocumentError(f"unknown key field {k!r} (expected {list(SROIE_LABELS)})",
                          doc_id=doc_id, field="entities", source=source)
    if not isinstance(v, str):
      raise DocumentError(f"key field {k!r} must be a string, got {str(v)[:80]}",
                          doc_id=doc_id, field="entities", source=source)
  return keys


# --------------------------------------------------------------------------- alignment
def _norm(text: str) -> str:
  return "".join(text.upper().split())


def _char_class(c: str) -> int:
  return 1 if c.isdigit() else 2 if c.isalpha() else 0


def _trigrams(text: str) -> set[str]:
  return {text[i:i + 3] for i in range(len(text) - 2)}


class _WordStream:
  """The normalised (space-free, upper-case) text of a receipt, mapped back to words."""

  def __init__(self, words: Sequence[str], segments: Sequence[int], centre_y: Sequence[float]):
    parts = [_norm(w) for w in words]
    lengths = np.array([len(p) for p in parts], np.int64)
    self.text = "".join(parts)
    self.end = np.cumsum(lengths)                 # [N] exclusive char end of each word
    self.start = self.end - lengths               # [N]
    self.char_word = np.repeat(np.arange(len(parts)), lengths)  # [chars] -> word
    self.segments = np.asarray(segments, np.int64)
    self.centre_y = np.asarray(centre_y, np.float64)
    # Lines as word ranges, in reading order (segments are consecutive runs).
    self.lines: list[tuple[int, int]] = []
    for i, s in enumerate(segments):
      if self.lines and segments[i - 1] == s:
        self.lines[-1] = (self.lines[-1][0], i + 1)
      else:
        self.lines.append((i, i + 1))
    self._line_trigrams = None

  def words_of(self, a: int, b: int) -> tuple[int, int]:
    """The word range `[w0, w1)` covered by characters `[a, b)`."""
    return int(self.char_word[a]), int(self.char_word[b - 1]) + 1

  def line_text(self, i: int, j: int) -> tuple[int, str]:
    """(char offset, text) of lines `i..j` inclusive."""
    a = int(self.start[self.lines[i][0]])
    b = int(self.end[self.lines[j][1] - 1])
    return a, self.text[a:b]

  def line_trigrams(self) -> list[set[str]]:
    if self._line_trigrams is None:
      self._line_trigrams = [_trigrams(self.line_text(i, i)[1]) for i in range(len(self.lines))]
    return self._line_trigrams


def _exact_candidates(stream: _WordStream, value: str):
  """Yields `(w0, w1)` word ranges where `value` occurs with clean ends."""
  text, n = stream.text, len(value)
  p = text.find(value)
  while p >= 0:
    w0, w1 = stream.words_of(p, p + n)
    # An end is clean at a word boundary or where the neighbouring character is of
    # another class (letter / digit / other): `RM9.00` holds `9.00`, `19.00` does not.
    start_ok = p == stream.start[w0] or _char_class(text[p - 1]) != _char_class(value[0])
    end_ok = (p + n == stream.end[w1 - 1] or
              _char_class(text[p + n]) != _char_class(value[-1]))
    if start_ok and end_ok:
      yield w0, w1
    p = text.find(value, p + 1)


def _similarity(a: str, b: str) -> float:
  return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def _fuzzy_candidates(stream: _WordStream, value: str, max_window_lines: int,
                      num_windows: int = 4):
  """Yields `(score, w0, w1)` for the best-looking windows of consecutive lines."""
  target = _trigrams(value)
  if not target:
    return
  line_tri = stream.line_trigrams()
  hits = [len(target & t) for t in line_tri]
  windows = []
  for i in range(len(stream.lines)):
    if not hits[i]:
      continue
    union = set()
    for j in range(i, min(i + max_window_lines, len(stream.lines))):
      union |= line_tri[j]
      if hits[j]:
        # Trigram Dice coefficient: a cheap stand-in for the similarity.
        windows.append((2 * len(target & union) / (len(target) + len(union)), i, j))
  windows.sort(key=lambda w: (-w[0], w[1], w[2]))
  for _, i, j in windows[:num_windows]:
    offset, window = stream.line_text(i, j)
    blocks = difflib.SequenceMatcher(None, window, value, autojunk=False).get_matching_blocks()
    blocks = [b for b in blocks if b.size >= 2] or [b for b in blocks if b.size]
    if not blocks:
      continue
    w0, w1 = stream.words_of(offset + blocks[0].a, offset + blocks[-1].a + blocks[-1].size)
    best = (_similarity(stream.text[stream.start[w0]:stream.end[w1 - 1]], value), w0, w1)
    # Greedy refinement: drop or add a word at either end while that helps.
    improved = True
    while improved:
      improved = False
      score, a, b = best
      for na, nb in ((a + 1, b), (a, b - 1), (a - 1, b), (a, b + 1)):
        if 0 <= na < nb <= len(stream.start):
          s = _similarity(stream.text[stream.start[na]:stream.end[nb - 1]], value)
          if s > best[0]:
            best, improved = (s, na, nb), True
    yield best


def align_field(stream: _WordStream, field: str, value: str, taken: set[int], *,
                min_similarity: float = 0.8, max_window_lines: int = 6
                ) -> tuple[str, tuple[int, int] | None, float]:
  """Places one key string: `(outcome, (w0, w1) or None, similarity)`.

  `outcome` is "exact", "fuzzy" or "unaligned". Word ranges overlapping `taken`
  are not used. `total` prefers the bottom-most candidate, other fields the
  first one (in reading order).
  """
  value = _norm(value)

  def free(w0, w1):
    return not taken.intersection(range(w0, w1))

  def position(w0, w1):
    if field == "total":  # bottom-most, then last
      return (-float(stream.centre_y[w1 - 1]), -w0)
    return (w0, 0.0)

  exact = [c for c in _exact_candidates(stream, value) if free(*c)]
  if exact:
    return "exact", min(exact, key=lambda c: position(*c)), 1.0
  fuzzy = [c for c in _fuzzy_candidates(stream, value, max_window_lines) if free(c[1], c[2])]
  if fuzzy:
    best = max(c[0] for c in fuzzy)
    if best >= min_similarity:
      # Among (near-)equally good matches, apply the position preference.
      good = [c for c in fuzzy if c[0] >= best - 1e-9]
      _, w0, w1 = min(good, key=lambda c: position(c[1], c[2]))
      return "fuzzy", (w0, w1), best
    return "unaligned", None, best
  return "unaligned", None, 0.0


def align_fields(doc_id: str, keys: dict[str, str], words: Sequence[str],
                 segments: Sequence[int], centre_y: Sequence[float], report: LoadReport, *,
                 min_similarity: float = 0.8, max_window_lines: int = 6
                 ) -> tuple[list[tuple[str, list[int]]], dict[str, str]]:
  """Aligns a receipt's key fields to its words: `(entities, outcome per field)`.

  Every field not placed is recorded in `report.skipped_entities` with its reason.
  """
  stream = _WordStream(words, segments, centre_y)
  taken: set[int] = set()
  entities, outcome = [], {}
  for field in FIELD_ORDER:
    where = f"{doc_id} {field}"
    if field not in keys:
      outcome[field] = "missing"
      report.skip_entity(where, f"{field}: key missing from the entities file")
      continue
    if not _norm(keys[field]):
      outcome[field] = "empty"
      report.skip_entity(where, f"{field}: empty key string")
      continue
    result, span, score = align_field(stream, field, keys[field], taken,
                                      min_similarity=min_similarity,
                                      max_window_lines=max_window_lines)
    outcome[field] = result
    if span is None:
      report.skip_entity(f"{where} (best similarity {score:.2f})",
                         f"{field}: no match in the OCR lines")
      continue
    taken.update(range(*span))
    entities.append((field, list(range(*span))))
  entities.sort(key=lambda e: e[1][0])
  return entities, outcome
