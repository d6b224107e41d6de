"""CORD reader: Indonesian receipts with 30 fine-grained `valid_line` categories.

Expected layout (one JSON file per receipt, the `ground_truth` of the Hugging Face
`naver-clova-ix/cord-v1` / `cord-v2` rows, or the v0 release files)::

  <data_dir>/train/json/<id>.json
  <data_dir>/dev/json/<id>.json     (optional: carved from train when absent)
  <data_dir>/test/json/<id>.json    (optional)

Each file has `meta.image_size` and `valid_line`, a list of semantic segments
`{"category", "group_id", ["sub_group_id" (v2)], "words": [{"quad", "text", ...}]}`;
v0, v1 and v2 files read the same (`sub_group_id`, `gt_parse`, `roi`, `dontcare`,
`repeating_symbol` are not used).

What becomes of it:

* words: the `valid_line` words in file order; a word with empty text is skipped
  and recorded in the report.
* boxes: the axis-aligned hull of each word's quad (min / max over its four
  corners). A few v1 quads poke out of the image by a few pixels; the default
  `box_policy="clip"` clips them and the report lists the repairs.
* segments: the index of the `valid_line` element of each word.
* entities: each `valid_line` element is one entity labelled by its `category`
  (one of `LABELS["cord"]`, spelled as in the data: `menu.nm`,
  `sub_total.subtotal_price`, `void_menu.nm`, ...). An element left with no
  words is recorded as a skipped entity.
* page size: `meta.image_size` (else the words' bounding box, counted in
  `report.stats["page_size_from_words"]`).
"""

from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Collection

from flaxdoc.data.public_datasets import LABELS, DatasetNotFoundError
from flaxdoc.data.document import Document, DocumentError
from flaxdoc.data.jsonl import coordinate, load_json_file
from flaxdoc.data.reading import check_on_error, list_ids, parse_each, select_ids
from flaxdoc.data.report import LoadReport

CORD_LABELS = LABELS["cord"]
SPLITS = ("train", "dev", "test")
_QUAD_KEYS = ("x1", "y1", "x2", "y2", "x3", "y3", "x4", "y4")


def _json_dir(data_dir, split: str) -> Path:
  if split not in SPLITS:
    raise ValueError(f"unknown CORD split {split!r}; expected one of {SPLITS}")
  d = Path(data_dir) / split / "json"
  if not d.is_dir():
    raise DatasetNotFoundError(
        f"CORD {split!r} split not found: {str(d)!r} is not a directory. Expected "
        "<data_dir>/{train,dev,test}/json/<id>.json (one receipt per file; dev and test "
        "are optional)")
  return d


def list_cord_ids(data_dir, split: str) -> list[str]:
  """Sorted receipt ids (file stems) of a split on disk."""
  return list_ids(_json_dir(data_dir, split), "*.json", f"CORD {split!r}")


def load_cord(data_dir, split: str, *, ids: Collection[str] | None = None,
              box_policy: str = "clip", on_error: str = "raise"
              ) -> tuple[list[Document], LoadReport]:
  """Reads a CORD split on disk: `(documents, report)`.

  Args:
    data_dir: the CORD folder (see the module docstring for the layout).
    split: "train", "dev" or "test".
    ids: read only these receipts (default: all, sorted by id).
    box_policy: `Document.create` policy for boxes outside the page ("clip" by
      default: some quads overshoot the image by a few pixels); repairs are
      recorded in the report.
    on_error: "raise" a `DocumentError` on a malformed file, or "skip" it and
      record it in the report.
  """
  check_on_error(on_error)
  d = _json_dir(data_dir, split)
  ids = select_ids(ids, list_cord_ids(data_dir, split), f"CORD {split!r}: no file", d)
  report = LoadReport(f"cord:{split} ({d})")
  stats = collections.Counter()
  segments_by_label = collections.Counter()
  docs = []

  def parse(doc_id, local):
    return _read_receipt(d / f"{doc_id}.json", doc_id, local, box_policy)

  for doc_id, local, (doc, info) in parse_each(ids, parse, report, on_error):
    report.skipped_words += local.skipped_words
    report.skipped_entities += local.skipped_entities
    for note in doc.repairs:
      report.repair(doc_id, note)
    stats.update(info)
    if not len(doc):
      report.skip_document(doc_id, "no words with text")
      continue
    for e in doc.entities:
      segments_by_label[e.label] += 1
    docs.append(doc)
  report.loaded = len(docs)
  report.stats.update({
      "words": stats["words"],
      "words_kept": sum(len(doc) for doc in docs),
      "segments": stats["segments"],
      "entities_by_label": dict(segments_by_label.most_common()),
      "page_size_from_words": stats["page_size_from_words"],
  })
  return docs, report


def _read_receipt(path: Path, doc_id: str, report: LoadReport, box_policy: str
                  ) -> tuple[Document, collections.Counter]:
  """One receipt file -> (Document, counts). Raises DocumentError if malformed."""
  source = os.fspath(path)

  def err(msg, field="valid_line"):
    return DocumentError(msg, doc_id=doc_id, field=field, source=source)

  data = load_json_file(path, doc_id=doc_id)
  if not isinstance(data, dict) or not isinstance(data.get("valid_line"), list):
    raise err("expected a JSON object with a 'valid_line' list")
  stats = collections.Counter()

  page_sizes = None
  size = data.get("meta", {}).get("image_size") if isinstance(data.get("meta"), dict) else None
  if size is not None:
    if not isinstance(size, dict):
      raise err(f"meta.image_size must be an object, got {str(size)[:80]}", "meta")
    w, h = coordinate(size.get("width")), coordinate(size.get("height"))
    if w is None or h is None or w <= 0 or h <= 0:
      raise err(f"meta.image_size must hold positive width and height, got {str(size)[:80]}",
                "meta")
    page_sizes = [[w, h]]
  else:
    stats["page_size_from_words"] += 1

  words, boxes, segments, entities = [], [], [], []
  for k, line in enumerate(data["valid_line"]):
    if not isinstance(line, dict):
      raise err(f"element {k} is {type(line).__name__}, not an object")
    label = line.get("category")
    if label not in CORD_LABELS:
      raise err(f"element {k} has category {str(label)[:80]!r}, not one of the 30 CORD "
                "categories")
    line_words = line.get("words")
    if not isinstance(line_words, list):
      raise err(f"element {k} ({label}) has no 'words' list")
    stats["segments"] += 1
    indices = []
    for j, w in enumerate(line_words):
      if not isinstance(w, dict) or not isinstance(w.get("text"), str):
        raise err(f"element {k} word {j} must be an object with a string 'text', got "
                  f"{str(w)[:80]}")
      quad = w.get("quad")
      if not isinstance(quad, dict):
        raise err(f"element {k} word {j} has no 'quad' object", "quad")
      coords = [coordinate(quad.get(key)) for key in _QUAD_KEYS]
      if any(c is None for c in coords):
        raise err(f"element {k} word {j} quad must hold finite float32 numbers "
                  f"{list(_QUAD_KEYS)}, got {str(quad)[:120]}", "quad")
      xs, ys = coords[0::2], coords[1::2]
      stats["words"] += 1
      if not w["text"].strip():
        report.skip_word(f"{doc_id} element {k} word {j}", "empty text")
        continue
      indices.append(len(words))
      words.append(w["text"])
      boxes.append([min(xs), min(ys), max(xs), max(ys)])  # axis-aligned hull of the quad
      segments.append(k)
    if not indices:
      report.skip_entity(f"{doc_id} element {k} ({label})", "no words with text")
      continue
    entities.append((label, indices))

  doc = Document.create(doc_id, words, boxes, page_sizes=page_sizes, segments=segments,
                        entities=entities, label_set=CORD_LABELS, box_policy=box_policy,
                        source=source)
  return doc, stats
