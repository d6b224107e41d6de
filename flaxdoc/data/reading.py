"""The frame the file-per-document readers (FUNSD, CORD, SROIE) share.

Each reader lists a split's ids (file stems), checks its `on_error` policy, picks
the ids to read, then parses one file at a time into a report of its own: a
malformed file either raises its `DocumentError` or is recorded as a skipped
document. What a reader keeps from a parsed file (which report entries, which
statistics, in which order) differs from one dataset to the next, so that part
stays in the readers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Collection, Iterable, Iterator, TypeVar

from flaxdoc.data.public_datasets import DatasetNotFoundError
from flaxdoc.data.document import Document, DocumentError
from flaxdoc.data.report import LoadReport

T = TypeVar("T")


def check_on_error(on_error: str) -> None:
  """Refuses an `on_error` policy other than "raise" or "skip"."""
  if on_error not in ("raise", "skip"):
    raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")


def list_ids(folder: Path, pattern: str, what: str) -> list[str]:
  """The sorted stems of the files in `folder` matching `pattern`: a split's ids.

  Raises:
    DatasetNotFoundError: no file matches ("{what}: no {pattern} files in ...").
  """
  ids = sorted(p.stem for p in folder.glob(pattern))
  if not ids:
    raise DatasetNotFoundError(f"{what}: no {pattern} files in {str(folder)!r}")
  return ids


def select_ids(ids: Collection[str] | None, all_ids: list[str], missing: str,
               where: Path) -> list[str]:
  """The ids to read: `all_ids` when `ids` is None, else `ids` sorted and deduplicated.

  Args:
    ids: the ids asked for, or None for all of them.
    all_ids: the split's ids on disk, sorted.
    missing: the start of the error for ids not on disk, e.g. "CORD 'train': no file".
    where: the folder searched, named in that error.

  Raises:
    DatasetNotFoundError: some of `ids` are not in `all_ids` (the first five are named).
  """
  if ids is None:
    return all_ids
  not_found = sorted(set(ids) - set(all_ids))
  if not_found:
    raise DatasetNotFoundError(f"{missing} for id(s) {not_found[:5]} in {str(where)!r}")
  return sorted(set(ids))


def progress(items: Collection, desc: str, unit: str):
  """`items` with a progress bar (count, rate, ETA) for slow per-file work such as OCR;
  `items` as is for fewer than two, or without tqdm."""
  if len(items) < 2:
    return items
  try:
    from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
  except ImportError:  # pragma: no cover - tqdm comes with the declared stack
    return items
  return tqdm(items, desc=desc, unit=unit)


def parse_each(ids: Iterable[str], parse: Callable[[str, LoadReport], T], report: LoadReport,
               on_error: str) -> Iterator[tuple[str, LoadReport, T]]:
  """Yields `(doc_id, local_report, parse(doc_id, local_report))` for each id that parses.

  `parse` records into a fresh `local_report` (same source as `report`), so a file
  that fails halfway leaves nothing behind; the caller merges what it keeps. A
  `DocumentError` from `parse` is re-raised when `on_error == "raise"`, else
  recorded in `report` as a skipped document with the error's message.
  """
  for doc_id in ids:
    local = LoadReport(report.source)
    try:
      parsed = parse(doc_id, local)
    except DocumentError as e:
      if on_error == "raise":
        raise
      report.skip_document(doc_id, str(e))
      continue
    yield doc_id, local, parsed


def read_files(paths: Iterable, read: Callable[..., "Document"], report: LoadReport,
               on_error: str) -> list:
  """Reads one document per file (PDF, image...): ids from file names, failures reported.

  `read(path, doc_id=..., report=report)` reads one file. Ids are the file names
  without extension; when two files share a name, the later ones get their full
  path as id, so ids stay unique. A `DocumentError` is re-raised when
  `on_error == "raise"`, else recorded in `report.skipped_documents` under the
  file's path. Sets `report.loaded` and the `words` / `pages` statistics.
  """
  check_on_error(on_error)
  docs = []
  ids: set[str] = set()
  for p in paths:
    source = os.fspath(p)
    stem = Path(p).stem or Path(p).name
    doc_id = stem if stem not in ids else source
    while doc_id in ids:  # the same path given twice
      doc_id += "+"
    try:
      doc = read(p, doc_id=doc_id, report=report)
    except DocumentError as e:
      if on_error == "raise":
        raise
      report.skip_document(source, str(e))
      continue
    ids.add(doc.id)
    for note in doc.repairs:
      report.repair(doc.id, note)
    docs.append(doc)
  report.loaded = len(docs)
  report.stats["words"] = sum(len(d) for d in docs)
  report.stats["pages"] = sum(d.num_pages for d in docs)
  return docs
