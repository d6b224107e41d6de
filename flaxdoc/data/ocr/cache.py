"""OCR results cached as JSON, one file per (file content, engine, dpi).

OCR is slow (seconds a page); re-reading FUNSD with OCR words for every run
would redo it. A cached result is the read `Document` as a `flaxdoc.document/1`
JSON object (words, boxes, pages, page sizes, segments, page images) with where
each page's words came from (`"page_sources"`: "text layer" or the engine), in
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
VERSION = 2  # bump when the reader's output changes for the same input (2: page_sources)


def cache_path(cache_dir, path, engine: str, dpi: float) -> Path:
  digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:32]
  return Path(cache_dir) / f"{digest}-{engine}-{float(dpi):g}dpi-v{VERSION}.json"


def load(cache_dir, path, engine: str, dpi: float, doc_id: str
         ) -> tuple[Document, list[str]] | None:
  """`(document with id doc_id, page sources)` cached for `path`, or None (none, unreadable)."""
  file = cache_path(cache_dir, path, engine, dpi)
  if not file.is_file():
    return None
  try:
    obj = parse_json(file.read_text(encoding="utf-8"), source=os.fspath(file))
    sources = obj.pop("page_sources", None) if isinstance(obj, dict) else None
    obj["id"] = doc_id
    doc = document_from_json(obj, source=os.fspath(path))
    if not (isinstance(sources, list) and len(sources) == doc.num_pages and
            all(isinstance(s, str) for s in sources)):
      raise DocumentError("page_sources: expected one string per page", field="page_sources",
                          source=os.fspath(file))
    return doc, sources
  except (DocumentError, OSError, TypeError, UnicodeDecodeError) as e:
    log.warning("ignoring unreadable OCR cache file %s (%s)", file, e)
    return None


def store(cache_dir, path, engine: str, dpi: float, doc: Document, page_sources) -> Path:
  """Caches `doc` and where each of its pages' words came from (`page_sources`)."""
  file = cache_path(cache_dir, path, engine, dpi)
  file.parent.mkdir(parents=True, exist_ok=True)
  tmp = file.with_suffix(f".tmp{os.getpid()}")
  obj = document_to_json(doc)
  obj["page_sources"] = list(page_sources)
  tmp.write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")
  os.replace(tmp, file)
  return file
