"""Documents from a path: a JSON Lines file, PDFs, or (with an OCR engine) images and scans.

    docs = read_source("/data/in/*.pdf")                      # born-digital PDFs
    docs = read_source("/data/scans/*.png", ocr="tesseract")  # images and scanned pages

The one place that picks a reader for what a user points at, so that `predict` mode
(`config.predict.input`) and the PyTorch serving pipeline
(`flaxdoc.export.torch.pipeline`) read the same files into the same documents:

* `*.jsonl` -> `flaxdoc.data.jsonl.read_jsonl`;
* with an OCR engine: PDFs and images (PNG, JPEG, TIFF) -> `flaxdoc.data.ocr.read_documents`
  (a PDF page's text layer where it has one, OCR where not);
* without: PDFs only -> `flaxdoc.data.pdf.read_pdfs` (unreadable files are skipped and
  reported, as by the OCR reader).

A glob (`*`, `?`, `[`) is expanded here, sorted, so that it needs no shell.
"""

from __future__ import annotations

import glob
import logging
from typing import Callable

from flaxdoc.data.document import Document

log = logging.getLogger(__name__)


class SourceError(ValueError):
  """A source that gives no document; the message names the setting it came from."""


def expand(source: str) -> list[str]:
  """The files a path or glob names, sorted (a path that is no glob: itself)."""
  return sorted(glob.glob(source)) if any(c in source for c in "*?[") else [source]


def read_source(source: str, *, ocr: str | None = None, ocr_dpi: float = 300.0,
                name: str = "input", announce: Callable[[str], object] = print,
                otherwise: str = "") -> list[Document]:
  """The documents of `source` (see the module docstring).

  `name` is the setting `source` came from, for the errors (`config.predict.input`);
  `announce` gets the PDF and OCR readers' per-file reports (what was skipped and why);
  `otherwise` ends the error for a kind of file not taken (what else the setting takes).

  Raises:
    SourceError: no readable file, or a kind of file this reader does not take.
  """
  if source.endswith(".jsonl"):
    from flaxdoc.data import jsonl  # pylint: disable=import-outside-toplevel
    docs, report = jsonl.read_jsonl(source)
    log.info("%s", report.summary())
    return docs
  paths = expand(source)
  if ocr:  # images and scanned PDF pages too (flaxdoc.data.ocr)
    from flaxdoc.data.ocr import read_documents  # pylint: disable=import-outside-toplevel
    docs, report = read_documents(paths, engine=ocr, dpi=ocr_dpi)
    announce(report.summary())
    if not docs:
      raise SourceError(f"{name}={source!r}: no readable PDF or image (see the report above)")
    return docs
  if all(p.lower().endswith(".pdf") for p in paths):
    from flaxdoc.data import pdf  # pylint: disable=import-outside-toplevel
    docs, report = pdf.read_pdfs(paths)  # unreadable files are skipped and reported
    announce(report.summary())
    if not docs:
      raise SourceError(f"{name}={source!r}: no readable PDF (see the report above)")
    return docs
  raise SourceError(f"{name}={source!r}: expected a .jsonl file, PDF file(s){otherwise}")
