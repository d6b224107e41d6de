"""Scanned files -> `Document`s: images and PDFs, words and boxes from an OCR engine.

    from flaxdoc.data.ocr import read_document
    doc = read_document("form.png", engine="rapidocr")

What a document holds:

* words and tight word boxes, in the engine's reading order, page by page;
  boxes in the picture's pixels for images, in PDF points for PDFs (as
  `flaxdoc.data.pdf.read_pdf` gives them by default), whatever `dpi` the
  pages were rendered at for OCR;
* one page per image frame (multi-page TIFF) or PDF page, `page_sizes` in the
  same units;
* segments: the engine's text lines, numbered across the document;
* `page_images`: the file and frame/page of each page, so pictures
  (`flaxdoc.viz.draw_document`) are drawn over the real page.

Where each page's words came from, the PDF's text layer or the engine, is recorded
in `report.page_sources` (`LoadReport.summary()`: "3 pages: 2 from the PDF's text
layer, 1 by tesseract"), else logged.

A PDF page with a text layer is read from it (exact words, no OCR); a page
without one (scanned) is rendered at `dpi` and OCR'd. Pages with no text at all
are recorded (`report.stats["pages_without_text"]`, else logged); a file with no
text on any page is a `DocumentError` ("no text found").
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from flaxdoc.data import pdf as pdf_lib
from flaxdoc.data.document import Document, DocumentError, PageImage
from flaxdoc.data.ocr import cache as cache_lib
from flaxdoc.data.ocr import pages as pages_lib
from flaxdoc.data.ocr.engine import DEFAULT_ENGINE, OcrWord, get_engine
from flaxdoc.data.reading import progress as progress_bar
from flaxdoc.data.reading import read_files
from flaxdoc.data.report import TEXT_LAYER, LoadReport, describe_page_sources

log = logging.getLogger(__name__)
DEFAULT_DPI = 300.0
ON_ERROR = ("raise", "skip")


class _Builder:
  """Collects words page by page; segment ids run on across pages."""

  def __init__(self):
    self.words, self.boxes, self.pages, self.segments = [], [], [], []
    self.sizes, self.images, self.blank = [], [], []
    self.sources = []  # per page: TEXT_LAYER or the engine's name
    self.next_segment = 0

  def add_ocr_page(self, words: Sequence[OcrWord], scale: float, size, image: PageImage,
                   engine: str):
    self.sources.append(engine)
    page = len(self.sizes)
    lines: dict[int, int] = {}
    for w in words:
      self.words.append(w.text)
      self.boxes.append(np.asarray(w.box, np.float64) * scale)
      self.pages.append(page)
      if w.line not in lines:
        lines[w.line] = self.next_segment
        self.next_segment += 1
      self.segments.append(lines[w.line])
    self._page(size, image, bool(words))

  def add_text_page(self, doc: Document, page: int, image: PageImage):
    self.sources.append(TEXT_LAYER)
    sel = np.flatnonzero(doc.pages == page)
    segs = doc.segments[sel]
    remap = {s: self.next_segment + k for k, s in enumerate(dict.fromkeys(segs.tolist()))}
    self.next_segment += len(remap)
    self.words.extend(doc.words[i] for i in sel)
    self.boxes.extend(doc.boxes[sel].astype(np.float64))
    self.pages.extend([len(self.sizes)] * len(sel))
    self.segments.extend(remap[s] for s in segs.tolist())
    self._page(doc.page_sizes[page].tolist(), image, len(sel) > 0)

  def _page(self, size, image, has_words):
    if not has_words:
      self.blank.append(len(self.sizes))
    self.sizes.append([float(size[0]), float(size[1])])
    self.images.append(image)

  def build(self, doc_id: str, source: str) -> Document:
    boxes = np.asarray(self.boxes, np.float64).reshape(-1, 4)
    # "clip": engines round outward, so a box may stick out of its page by a pixel.
    return Document.create(doc_id, self.words, boxes, pages=self.pages, page_sizes=self.sizes,
                           segments=self.segments, entities=None, box_policy="clip",
                           source=source, page_images=self.images)


def read_document(path: str | os.PathLike, *, engine: str = DEFAULT_ENGINE,
                  dpi: float = DEFAULT_DPI, doc_id: str | None = None, cache_dir=None,
                  report: LoadReport | None = None, password: str | None = None) -> Document:
  """Reads one image or PDF file into an unlabelled `Document` (see the module doc).

  Args:
    path: a PNG, JPEG, TIFF or PDF file (the format is read from its first bytes).
    engine: "rapidocr" or "tesseract" (`flaxdoc.data.ocr.ENGINES`).
    dpi: resolution PDF pages are rendered at for OCR (images are read as they are).
    doc_id: the document id (default: the file name without its extension).
    cache_dir: if given, OCR results are cached there (`flaxdoc.data.ocr.cache`).
    report: where pages without text, and where each page's words came from (the
      PDF's text layer or `engine`), are recorded (else they are logged).
    password: the password of an encrypted PDF (default: `$FLAXDOC_PDF_PASSWORD`,
      as `flaxdoc.data.pdf.read_pdf`); never logged, cached or reported.

  Raises:
    DocumentError: naming the file: unsupported format, unreadable image or PDF,
      no text found on any page.
    OcrUnavailableError: a page needs OCR and the engine is not installed.
  """
  if not (isinstance(dpi, (int, float)) and np.isfinite(dpi) and dpi > 0):
    raise ValueError(f"dpi must be a positive number, got {dpi!r}")
  path = Path(path)
  source = os.fspath(path)
  doc_id = str(doc_id) if doc_id is not None else (path.stem or path.name)
  kind = pages_lib.sniff_format(path)
  if cache_dir is not None:
    cached = cache_lib.load(cache_dir, path, engine, dpi, doc_id)
    if cached is not None and kind == "pdf":
      # The cache is keyed by the file's bytes, not by who may read them: an encrypted PDF
      # must still open with the password given now (a wrong or missing one raises).
      pages_lib.open_pdf(path, password).close()
    if cached is not None:
      _record_sources(report, source, doc_id, cached[1])
      return cached[0]
  built = _Builder()
  if kind == "pdf":
    _read_pdf_pages(path, source, doc_id, engine, float(dpi), built, password)
  else:
    for k, frame in pages_lib.image_frames(path):
      w, h = frame.size
      built.add_ocr_page(get_engine(engine).read(frame), 1.0, (w, h),
                         PageImage(source, k, float(w), float(h)), engine)
  if not built.words:
    pages = len(built.sizes)
    what = ("no text layer, and OCR" if kind == "pdf" else "OCR")
    raise DocumentError(f"no text found: {what} ({engine}) found no words on its {pages} "
                        f"page(s) (a blank page, or a scan too faint or small to read)",
                        doc_id=doc_id, field="words", source=source)
  if built.blank:
    if report is not None:
      report.stats.setdefault("pages_without_text", {})[doc_id] = built.blank
    else:
      log.warning("%s: no text found on pages %s", source, built.blank)
  doc = built.build(doc_id, source)
  if cache_dir is not None:
    cache_lib.store(cache_dir, path, engine, dpi, doc, built.sources)
  _record_sources(report, source, doc_id, built.sources)
  return doc


def _record_sources(report: LoadReport | None, source: str, doc_id: str, sources) -> None:
  """Says which pages were read from a text layer and which by OCR (report, else log)."""
  if report is not None:
    report.record_page_sources(doc_id, sources)
  else:
    log.info("%s: %s", source, describe_page_sources(sources))


def _read_pdf_pages(path: Path, source: str, doc_id: str, engine: str, dpi: float,
                    built: _Builder, password: str | None):
  """Pages with a text layer from it (`read_pdf`), the others rendered and OCR'd."""
  text_report = LoadReport(source)
  try:
    text = pdf_lib.read_pdf(path, doc_id=doc_id, report=text_report, password=password)
    without_text = set(text_report.stats.get("pages_without_text", {}).get(doc_id, []))
  except DocumentError as e:
    if "no text layer" not in str(e):
      raise  # corrupt, truncated, encrypted...: not something OCR can help with
    text, without_text = None, None
  pdf = pages_lib.open_pdf(path, password)
  try:
    # read_pdf numbers pages with text 0.. in file order, skipping none: its page k is file page k.
    for k in range(len(pdf)):
      if text is not None and k not in without_text:
        size = text.page_sizes[k]
        built.add_text_page(text, k, PageImage(source, k, float(size[0]), float(size[1])))
        continue
      picture = pages_lib.render_pdf_page(pdf, k, dpi)
      scale = 72.0 / dpi
      size = (picture.width * scale, picture.height * scale)
      built.add_ocr_page(get_engine(engine).read(picture), scale, size,
                         PageImage(source, k, size[0], size[1]), engine)
  finally:
    pdf.close()


def read_documents(paths: Iterable[str | os.PathLike], *, engine: str = DEFAULT_ENGINE,
                   dpi: float = DEFAULT_DPI, on_error: str = "skip", cache_dir=None,
                   progress: bool = True, passwords: dict[str, str] | None = None
                   ) -> tuple[list[Document], LoadReport]:
  """Reads several image/PDF files: `(documents, report)`; failures are recorded per file.

  `on_error="skip"` (default) records a file that fails in
  `report.skipped_documents` with the reason (unsupported format, unreadable
  image, no text found, ...) and goes on; "raise" re-raises. Ids are file names
  without extension; a repeated name gets the full path as id. `passwords` maps a
  path (as given) or a file name to an encrypted PDF's password, as `read_pdfs` does;
  files without one get `$FLAXDOC_PDF_PASSWORD`.
  """
  if on_error not in ON_ERROR:
    raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
  if isinstance(paths, (str, os.PathLike)):
    paths = [paths]
  paths = list(paths)
  # Not "ocr:<engine>": PDF pages with a text layer are read from it, and the summary says
  # how many pages each source gave (`LoadReport.page_sources`).
  files = f"{len(paths)} file" + ("" if len(paths) == 1 else "s")
  report = LoadReport(f"{files} (PDF text layer where there is one, else OCR by {engine})")
  passwords = passwords or {}

  def read_one(p, doc_id, report):
    password = passwords.get(os.fspath(p), passwords.get(Path(p).name))
    return read_document(p, engine=engine, dpi=dpi, doc_id=doc_id, cache_dir=cache_dir,
                         report=report, password=password)

  if progress:
    paths = progress_bar(paths, f"reading (OCR by {engine} where needed)", "file")
  docs = read_files(paths, read_one, report, on_error)
  return docs, report
