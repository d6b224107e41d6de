"""flaxdoc JSON Lines: a small, versioned file format for users' own documents.

Format `flaxdoc.document/1`
===========================

A file holds one document per line. Lines are UTF-8 (a byte-order mark on the
first line is tolerated), separated by `"\\n"` (`"\\r\\n"` is accepted; JSON
ignores the `"\\r"`). Lines holding only whitespace are ignored. Every other
line is one JSON object with these keys and no others:

| key          | required | value |
|--------------|----------|-------|
| `format`     | yes      | the string `"flaxdoc.document/1"` |
| `id`         | yes      | non-empty string, unique within the file |
| `words`      | yes      | list of `N` strings, none empty or whitespace only |
| `boxes`      | yes      | list of `N` `[x0, y0, x1, y1]`, finite numbers, page pixels |
| `pages`      | no       | list of `N` integers `>= 0` (default: all `0`) |
| `page_sizes` | no       | list of `P` `[width, height]`, positive (default: the bounding box) |
| `segments`   | no       | list of `N` integers `>= 0`, OCR line / block ids (default: `0..N-1`) |
| `entities`   | no       | list of `{"label": str, "words": [int, ...]}` (see below) |
| `relations`  | no       | list of `[a, b]` pairs of entity indices |
| `label_set`  | no       | list of strings; entity labels must belong to it |
| `page_images`| no       | list of `P` `{"path": str, "index": int, "width": num, "height": num}`: the picture of each page (an image file and its frame, or a PDF and its 0-based page) and the page size in box units |

`entities` absent means an unlabelled document; `[]` a labelled one without
entities. Numbers are JSON numbers (`true`/`false` are not numbers here). `NaN`,
`Infinity`, numbers that overflow to infinity, coordinates beyond the float32
range and integers beyond int32 are rejected, and so are duplicate keys. Entity
`words` index the document's words; `relations` index its `entities`. The
writer escapes U+0085, U+2028 and U+2029 (and lone surrogates) so that every
line-splitting tool sees one document per line. Box coordinates are stored as `float32` inside a `Document`;
`write_jsonl` writes each one as the shortest decimal that reads back to the
same `float32` bits (integers without a fraction), so a write/read round trip is
lossless. The validation rules of `Document.create` apply (e.g. boxes inside
their page unless read with `box_policy="clip"`).

Example line (wrapped here)::

  {"format": "flaxdoc.document/1", "id": "invoice-7", "words": ["Total", "9.00"],
   "boxes": [[10, 10, 50, 20], [60, 10, 90, 20]], "page_sizes": [[100, 100]],
   "entities": [{"label": "total", "words": [1]}], "label_set": ["total"]}

A later, incompatible revision will use `flaxdoc.document/2`; readers refuse
versions they do not know instead of guessing.

Errors raise `DocumentError` naming the file and line (`path:line`), the
document id when known and the field. With `on_error="skip"` a bad line is
recorded in the returned `LoadReport` instead and reading goes on.

This module also holds the strict JSON helpers the dataset readers share
(`parse_json`, `load_json_file`, `finite_number`, `coordinate`, `read_box`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from flaxdoc.data.document import Document, DocumentError, Entity, PageImage
from flaxdoc.data.report import LoadReport

FORMAT = "flaxdoc.document/1"
FORMAT_PREFIX = "flaxdoc.document/"
ON_ERROR = ("raise", "skip")

_REQUIRED = ("format", "id", "words", "boxes")
_OPTIONAL = ("pages", "page_sizes", "segments", "entities", "relations", "label_set",
             "page_images")


# --------------------------------------------------------------------------- strict JSON helpers
def parse_json(text: str, *, source: str | None = None, doc_id: str | None = None) -> Any:
  """`json.loads` that refuses NaN/Infinity literals and duplicate keys.

  Raises:
    DocumentError: naming `source` (file or `file:line`) and the JSON problem.
  """

  def reject_constant(name):
    raise DocumentError(f"JSON literal {name} is not allowed (numbers must be finite)",
                        doc_id=doc_id, source=source)

  def no_duplicates(pairs):
    out = {}
    for key, value in pairs:
      if key in out:
        raise DocumentError(f"duplicate JSON key {key!r}", doc_id=doc_id, source=source)
      out[key] = value
    return out

  try:
    return json.loads(text, parse_constant=reject_constant, object_pairs_hook=no_duplicates)
  except DocumentError:
    raise
  except RecursionError:
    raise DocumentError("JSON nested too deeply", doc_id=doc_id, source=source) from None
  except ValueError as e:  # json.JSONDecodeError, and int-too-long errors
    raise DocumentError(f"invalid JSON ({e})", doc_id=doc_id, source=source) from None


def finite_number(value) -> float | None:
  """`value` as a finite float, or None when it is not a finite real JSON number.

  Booleans are not numbers here, and integers too large for a float (which would
  make `math.isfinite` raise) count as not finite.
  """
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return None
  try:
    x = float(value)
  except OverflowError:
    return None
  return x if math.isfinite(x) else None


FLOAT32_MAX = float(np.finfo(np.float32).max)
INT32_MAX = int(np.iinfo(np.int32).max)


def coordinate(value) -> float | None:
  """`value` as a float that stays finite in float32 (boxes are stored as float32), or None."""
  x = finite_number(value)
  return x if x is not None and abs(x) <= FLOAT32_MAX else None


def read_box(value, err, what: str, width: int = 4) -> list[float]:
  """`value` as `width` coordinates (see `coordinate`); else raises `err(message)`."""
  if not isinstance(value, (list, tuple)) or len(value) != width:
    raise err(f"{what} must be a list of {width} numbers, got {_short(value)}")
  out = []
  for v in value:
    x = coordinate(v)
    if x is None:
      raise err(f"{what} must hold finite numbers within float32 range, got {_short(value)}")
    out.append(x)
  return out


def _short(value, limit: int = 80) -> str:
  text = repr(value)
  return text if len(text) <= limit else text[:limit] + "..."


def _int_list(value, err, what: str) -> list[int]:
  """A list of int32 integers (integral floats accepted, booleans refused)."""
  if not isinstance(value, list):
    raise err(f"must be a list of integers, got {type(value).__name__}")
  out = []
  for k, v in enumerate(value):
    x = finite_number(v)
    if x is None or x != int(x):
      raise err(f"{what} {k} must be an integer, got {_short(v)}")
    if abs(x) > INT32_MAX:  # stored as int32: refuse rather than wrap around
      raise err(f"{what} {k} = {_short(v)} does not fit in int32")
    out.append(int(v) if isinstance(v, int) else int(x))
  return out


# --------------------------------------------------------------------------- JSON <-> Document
def _f32_json(x: np.float32) -> int | float:
  """A JSON number that reads back as exactly this float32 (shortest text first)."""
  if x.is_integer() and abs(x) < 2.0 ** 53 and not (x == 0 and math.copysign(1.0, x) < 0):
    return int(x)
  short = float(np.format_float_positional(x, unique=True, trim="-"))
  if np.float32(short) == x:
    return short
  return float(x)  # float32 -> float64 is exact, so this always round-trips.


def document_to_json(doc: Document) -> dict:
  """The JSON object (format version 1) of one document."""
  obj: dict[str, Any] = {
      "format": FORMAT,
      "id": doc.id,
      "words": list(doc.words),
      "boxes": [[_f32_json(v) for v in row] for row in doc.boxes],
      "pages": [int(p) for p in doc.pages],
      "page_sizes": [[_f32_json(v) for v in row] for row in doc.page_sizes],
      "segments": [int(s) for s in doc.segments],
  }
  if doc.entities is not None:
    obj["entities"] = [{"label": e.label, "words": list(e.words)} for e in doc.entities]
  if doc.relations:
    obj["relations"] = [[int(a), int(b)] for a, b in doc.relations]
  if doc.label_set is not None:
    obj["label_set"] = list(doc.label_set)
  if doc.page_images is not None:
    obj["page_images"] = [{"path": im.path, "index": int(im.index),
                           "width": _f32_json(np.float32(im.width)),
                           "height": _f32_json(np.float32(im.height))}
                          for im in doc.page_images]
  return obj


def document_from_json(obj, *, source: str | None = None, box_policy: str = "error",
                       text_policy: str = "error") -> Document:
  """Validates one decoded JSON object (format version 1) and builds its `Document`.

  Raises:
    DocumentError: naming `source`, the document id (when readable) and the field.
  """
  doc_id = None
  if isinstance(obj, dict) and isinstance(obj.get("id"), str) and obj["id"]:
    doc_id = obj["id"]

  def field_err(field):
    return lambda msg: DocumentError(msg, doc_id=doc_id, field=field, source=source)

  if not isinstance(obj, dict):
    raise DocumentError(f"a line must hold a JSON object, got {type(obj).__name__}",
                        source=source)
  missing = [k for k in _REQUIRED if k not in obj]
  if missing:
    raise DocumentError(f"missing required key(s) {missing}", doc_id=doc_id, field=missing[0],
                        source=source)
  unknown = sorted(set(obj) - set(_REQUIRED) - set(_OPTIONAL))
  if unknown:
    raise DocumentError(f"unknown key(s) {unknown}; {FORMAT} allows "
                        f"{list(_REQUIRED + _OPTIONAL)}", doc_id=doc_id, field=unknown[0],
                        source=source)
  fmt = obj["format"]
  if not isinstance(fmt, str) or not fmt.startswith(FORMAT_PREFIX):
    raise field_err("format")(f"not a flaxdoc document format: {_short(fmt)} "
                              f"(expected {FORMAT!r})")
  if fmt != FORMAT:
    raise field_err("format")(f"unknown format version {fmt!r}; this flaxdoc reads {FORMAT!r}")
  if doc_id is None:
    raise field_err("id")(f"id must be a non-empty string, got {_short(obj['id'])}")

  words = obj["words"]
  if not isinstance(words, list):
    raise field_err("words")(f"must be a list of strings, got {type(words).__name__}")
  for k, w in enumerate(words):
    if not isinstance(w, str):
      raise field_err("words")(f"word {k} is {type(w).__name__}, not a string")

  raw_boxes = obj["boxes"]
  if not isinstance(raw_boxes, list):
    raise field_err("boxes")(f"must be a list of [x0, y0, x1, y1], got "
                             f"{type(raw_boxes).__name__}")
  boxes = [read_box(b, field_err("boxes"), f"box {k}") for k, b in enumerate(raw_boxes)]
  boxes = np.asarray(boxes, np.float64).reshape(len(boxes), 4)  # [N, 4]

  kwargs: dict[str, Any] = {}
  if "pages" in obj:
    kwargs["pages"] = _int_list(obj["pages"], field_err("pages"), "page")
  if "segments" in obj:
    kwargs["segments"] = _int_list(obj["segments"], field_err("segments"), "segment")
  if "page_sizes" in obj:
    sizes = obj["page_sizes"]
    if not isinstance(sizes, list):
      raise field_err("page_sizes")(f"must be a list of [width, height], got "
                                    f"{type(sizes).__name__}")
    kwargs["page_sizes"] = np.asarray(
        [read_box(s, field_err("page_sizes"), f"page size {k}", width=2)
         for k, s in enumerate(sizes)], np.float64).reshape(len(sizes), 2)  # [P, 2]
  if "entities" in obj:
    ents = obj["entities"]
    err = field_err("entities")
    if not isinstance(ents, list):
      raise err(f"must be a list of {{'label', 'words'}} objects, got {type(ents).__name__}")
    parsed = []
    for k, e in enumerate(ents):
      if not isinstance(e, dict) or set(e) != {"label", "words"}:
        raise err(f"entity {k} must be an object with exactly 'label' and 'words', got "
                  f"{_short(e)}")
      if not isinstance(e["label"], str):
        raise err(f"entity {k} label must be a string, got {_short(e['label'])}")
      parsed.append(Entity(e["label"], tuple(_int_list(e["words"], err, f"entity {k} word"))))
    kwargs["entities"] = parsed
  if "relations" in obj:
    rels = obj["relations"]
    err = field_err("relations")
    if not isinstance(rels, list):
      raise err(f"must be a list of [a, b] pairs, got {type(rels).__name__}")
    pairs = []
    for k, r in enumerate(rels):
      if not isinstance(r, list) or len(r) != 2:
        raise err(f"relation {k} must be a pair [a, b], got {_short(r)}")
      pairs.append(tuple(_int_list(r, err, f"relation {k} index")))
    # A relation to an entity the document does not have is dropped and reported (in
    # `Document.repairs`, which the reader's report lists), never a crash: linking
    # data is often written by hand, and one bad link should not lose the document.
    num_ents = len(kwargs.get("entities") or ())
    kept = [p for p in pairs if 0 <= p[0] < num_ents and 0 <= p[1] < num_ents]
    dropped = [f"relation {k} {list(p)}" for k, p in enumerate(pairs) if p not in kept]
    kwargs["relations"] = kept
  if "label_set" in obj:
    labels = obj["label_set"]
    if not isinstance(labels, list) or not all(isinstance(l, str) for l in labels):
      raise field_err("label_set")(f"must be a list of strings, got {_short(labels)}")
    kwargs["label_set"] = labels
  if "page_images" in obj:
    kwargs["page_images"] = _page_images(obj["page_images"], field_err("page_images"))

  doc = Document.create(doc_id, words, boxes, box_policy=box_policy, source=source,
                        text_policy=text_policy, **kwargs)
  if "relations" in obj and dropped:
    note = (f"dropped {len(dropped)} relation(s) to entities the document does not have "
            f"({num_ents} entities): {', '.join(dropped[:5])}")
    doc = dataclasses.replace(doc, repairs=doc.repairs + (note,))
  return doc


def _page_images(value, err) -> list[PageImage]:
  if not isinstance(value, list):
    raise err(f"must be a list of {{'path', 'index', 'width', 'height'}} objects, got "
              f"{type(value).__name__}")
  out = []
  for k, im in enumerate(value):
    if not isinstance(im, dict) or set(im) != {"path", "index", "width", "height"}:
      raise err(f"page image {k} must be an object with exactly 'path', 'index', 'width' and "
                f"'height', got {_short(im)}")
    if not isinstance(im["path"], str) or not im["path"]:
      raise err(f"page image {k} path must be a non-empty string, got {_short(im['path'])}")
    index = _int_list([im["index"]], err, f"page image {k} index")[0]
    size = read_box([im["width"], im["height"]], err, f"page image {k} size", width=2)
    if index < 0 or min(size) <= 0:
      raise err(f"page image {k} needs index >= 0 and a positive size, got {_short(im)}")
    out.append(PageImage(im["path"], index, size[0], size[1]))
  return out


# --------------------------------------------------------------------------- files
def write_jsonl(path: str | os.PathLike, docs: Iterable[Document]) -> int:
  """Writes documents to `path`, one JSON object per line (UTF-8). Returns how many.

  Raises:
    ValueError: if two documents share an id (the reader would refuse the file).
  """
  seen = set()
  count = 0
  with open(path, "wb") as f:
    for doc in docs:
      if doc.id in seen:
        raise ValueError(f"{os.fspath(path)!r}: duplicate document id {doc.id!r}")
      seen.add(doc.id)
      obj = document_to_json(doc)
      dump = lambda ascii_only: json.dumps(obj, ensure_ascii=ascii_only, allow_nan=False,
                                           separators=(",", ":"))
      try:
        line = dump(False).encode("utf-8")
      except UnicodeEncodeError:
        # Lone surrogates cannot be UTF-8; `\\uXXXX` escapes keep them (lossless).
        line = dump(True).encode("ascii")
      # U+0085, U+2028 and U+2029 are legal in JSON strings but some line readers
      # (Python's str.splitlines, older JavaScript) break lines there: escape them.
      for ch in ("\u0085", "\u2028", "\u2029"):
        line = line.replace(ch.encode("utf-8"), f"\\u{ord(ch):04x}".encode("ascii"))
      f.write(line + b"\n")
      count += 1
  return count


def iter_jsonl(path: str | os.PathLike, *, on_error: str = "raise", box_policy: str = "error",
               report: LoadReport | None = None, text_policy: str = "error"
               ) -> Iterator[Document]:
  """Yields the documents of a JSON Lines file one at a time (see the module doc).

  Args:
    path: the file.
    on_error: "raise" (default) raises `DocumentError` on the first bad line;
      "skip" records the line in `report.skipped_documents` and goes on.
    box_policy: passed to `Document.create` ("error" or "clip"); repairs are
      recorded in `report.repairs`.
    report: where skips and repairs are recorded (a fresh one if None).
    text_policy: passed to `Document.create` ("error" or "replace": lone
      surrogates and control characters in words become U+FFFD, recorded in
      `report.repairs`).
  """
  if on_error not in ON_ERROR:
    raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
  name = os.fspath(path)
  report = report if report is not None else LoadReport(name)
  seen: dict[str, int] = {}
  with open(path, "rb") as f:
    for lineno, raw in enumerate(f, start=1):
      source = f"{name}:{lineno}"
      try:
        try:
          text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError as e:
          raise DocumentError(f"line {lineno} is not valid UTF-8 ({e.reason} at byte "
                              f"{e.start})", source=source) from None
        if not text.strip():
          continue
        doc = document_from_json(parse_json(text, source=source), source=source,
                                 box_policy=box_policy, text_policy=text_policy)
        if doc.id in seen:
          raise DocumentError(f"duplicate document id (first on line {seen[doc.id]})",
                              doc_id=doc.id, field="id", source=source)
      except DocumentError as e:
        if on_error == "raise":
          raise
        report.skip_document(f"line {lineno}", str(e))
        continue
      seen[doc.id] = lineno
      for note in doc.repairs:
        report.repair(f"{doc.id} (line {lineno})", note)
      report.loaded += 1
      yield doc


def read_jsonl(path: str | os.PathLike, *, on_error: str = "raise",
               box_policy: str = "error", text_policy: str = "error"
               ) -> tuple[list[Document], LoadReport]:
  """Reads a whole JSON Lines file: `(documents, report)`. See `iter_jsonl`."""
  report = LoadReport(os.fspath(path))
  docs = list(iter_jsonl(path, on_error=on_error, box_policy=box_policy, report=report,
                         text_policy=text_policy))
  return docs, report


def load_json_file(path: str | os.PathLike, *, doc_id: str | None = None) -> Any:
  """A whole file as strict JSON (UTF-8, a BOM tolerated); errors name the file."""
  source = os.fspath(path)
  try:
    raw = Path(path).read_bytes()
  except OSError as e:
    raise DocumentError(f"cannot read file ({e.strerror or e})", doc_id=doc_id,
                        source=source) from None
  try:
    text = raw.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    raise DocumentError(f"not valid UTF-8 ({e.reason} at byte {e.start})", doc_id=doc_id,
                        source=source) from None
  return parse_json(text, source=source, doc_id=doc_id)
