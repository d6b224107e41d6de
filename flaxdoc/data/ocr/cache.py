"""OCR results cached as JSON, one file per (file content, engine, dpi).

OCR is slow (seconds a page); re-reading FUNSD with OCR words for every run
would redo it. A cached result is the read `Document` as a `flaxdoc.document/1`
JSON object (words, boxes, pages, page sizes, segments, page images), in
`<cache_dir>/<sha256 of the file>-<engine>-<dpi>.json`. The key is the file's
*content*, so a moved file still hits and an edited one misses. Writes go to a
temporary file first and are renamed into place, so a crash leaves no half file;
an unreadable cache file is ignored (and overwritten).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from flaxdoc.data.document import Document, DocumentError
from flaxdoc.data.jsonl import document_from_json, document_to_json, parse_json

log = logging.getLogger(__name__)
VERSION = 1  # bump when the reader's output changes for the same input


def cache_path(cache_dir, path, engine: str, dpi: float) -> Path:
  digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:32]
  return Path(cache_dir) / f"{digest}-{engine}-{float(dpi):g}dpi-v{VERSION}.json"


def load(cache_dir, path, engine: str, dpi: float, doc_id: str) -> Document | None:
  """The cached document of `path` with id `doc_id`, or None (no cache, or unreadable)."""
  file = cache_path(cache_dir, path, engine, dpi)
  if not file.is_file():
    return None
  try:
    obj = parse_json(file.read_text(encoding="utf-8"), source=os.fspath(file))
    obj["id"] = doc_id
    return document_from_json(obj, source=os.fspath(path))
  except (DocumentError, OSError, TypeError, UnicodeDecodeError) as e:
    log.warning("ignoring unreadable OCR cache file %s (%s)", file, e)
    return None


def store(cache_dir, path, engine: str, dpi: float, doc: Document) -> Path:
  file = cache_path(cache_dir, path, engine, dpi)
  file.parent.mkdir(parents=True, exist_ok=True)
  tmp = file.with_suffix(f".tmp{os.getpid()}")
  tmp.write_text(json.dumps(document_to_json(doc), ensure_ascii=False), encoding="utf-8")
  os.replace(tmp, file)
  return file
