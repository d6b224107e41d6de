"""Born-digital PDFs -> `Document`s: words, boxes and lines from the PDF text layer.

`read_pdf(path)` turns the text layer of a PDF (what a viewer lets you select
and copy) into an unlabelled `Document` for `predict`: one word per
whitespace-separated run of characters, its box in page pixels, its page, the
page sizes and one segment per text line. No OCR happens here: a scanned PDF
without a text layer is refused with a message that says so.

Library: pypdfium2 (PDFium, the PDF engine of Chrome)
------------------------------------------------------
Compared on two manuals (36 and 17 pages, 12,750 and 5,234 words) and on
matplotlib PDFs with 96 words at known places, against the ink of a 4x render:

| library | licence | words per CPU-second | box error vs ink | /Rotate | CropBox |
|---|---|---|---|---|---|
| pypdfium2 5.15 + this module | Apache-2.0 or BSD-3 | 18k | 0.09 pt (glyph-tight) | yes | yes |
| pdfplumber 0.11 (pdfminer.six) | MIT | 0.6k-2k, merges words | 0.8 pt (font size) | yes | no |
| PyMuPDF 2.0 | AGPL-3.0 or commercial | 90k-125k | 1.3 pt (line height) | no | yes |

("no": the word boxes stay in unrotated / MediaBox coordinates.) PyMuPDF is
the fastest, but AGPL: a dependency on it would put everyone who distributes
flaxdoc, or serves it over a network, under AGPL-3.0 terms for the combined
work (or make them buy Artifex's commercial licence), which defeats
flaxdoc's Apache-2.0 licence; so it is out. pdfplumber is pure Python but
10-30x slower, glues words together on tightly set text (10,043 and 999 words
on the manuals above) and ignores the CropBox. pypdfium2 ships binary wheels
(Linux, macOS, Windows; x86-64 and arm64), gives glyph-tight and font-height
("loose") character boxes, marks the line breaks and end-of-line hyphens it
infers, and decrypts PDFs given the password; its cost is one ctypes call per
character and box kind, which is what bounds the speed here.

What `read_pdf` does
--------------------
* Coordinates: PDF user space (points, origin bottom-left, y up) is mapped to
  the page as displayed (origin top-left, y down): the visible page box
  (CropBox intersected with MediaBox) and the page's `/Rotate` are applied, then
  everything is scaled by `dpi / 72` (default 72: boxes in points).
* Words: runs of characters between whitespace (real or PDFium-generated).
  PDFium joins a word hyphenated across a line break into one run with the
  hyphen as U+0002; it is split back into `"hyph-"` and `"enation"` so that each
  piece keeps its own line's box. A run is also split where it jumps to another
  line or moves backwards. Invisible control and format characters (Unicode
  categories Cc, Cf) are dropped from words; the count is logged and reported.
* Boxes: `boxes="tight"` (default) is the union of the glyph outlines (what an
  OCR engine draws around the ink; `"."` gets a small box); `boxes="loose"` is
  the union of the font-height cells (all words of one font and line share
  their top and bottom).
* Lines (segments) and order: `order="layout"` (default) groups upright words
  into lines (font-height cells overlapping vertically by at least half the
  smaller height), splits a line where the horizontal gap exceeds
  `segment_gap` times the line height (so columns and form fields side by side
  become separate segments), and reads the segments top-to-bottom, then
  left-to-right, words left-to-right inside. Good for forms, receipts and
  invoices; it interleaves the lines of multi-column text. `order="stream"`
  keeps PDFium's order (the content stream's, with PDFium's line detection),
  which follows columns in typeset documents; a segment then ends where PDFium
  breaks the line or the text jumps. Either way segment ids are numbered
  0, 1, ... in reading order and each segment's words are contiguous.
  Text that is not upright on the displayed page (rotated labels) keeps
  PDFium's words and lines (one segment per PDFium line); in "layout" order
  each such line is placed by the position of its first word.
* Words that lie entirely outside the visible page (clipped by the CropBox)
  are skipped and counted (recorded in `report` when one is passed); boxes
  sticking out of the page are clipped (`Document.repairs` says how many).
* Errors: a missing or unreadable file, a file that is not a PDF, a corrupt or
  truncated PDF, an encrypted PDF without (or with the wrong) password, an
  unknown encryption scheme, a page that does not load and a PDF without any
  text layer (image-only: run OCR first) all raise `DocumentError` naming the
  file. Permissions in an encrypted PDF (e.g. "no copying") are not enforced.
* Passwords: `password=` (`read_pdfs`: `passwords=` per file), else, for a PDF
  that needs one, the environment variable `FLAXDOC_PDF_PASSWORD` (`PASSWORD_ENV`):
  the way for command lines, where an argument would show in `ps` and the shell's
  history. No password is ever logged, reported or written anywhere.
* Reports: with `report`, every page of the document is recorded as read from
  the text layer (`LoadReport.page_sources`, as `flaxdoc.data.ocr` records OCR'd pages).

PDFium is not thread-safe: read PDFs from one thread per process (grain and
`multiprocessing` workers are processes, which is fine).

Characters -> words -> lines, on the displayed page, are `flaxdoc.data.pdf_text`'s; this
module opens and checks the file, selects pages and assembles the `Document`.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from flaxdoc.data.document import Document, DocumentError
from flaxdoc.data.pdf_text import layout_segments, page_frame, page_words, stream_segments
from flaxdoc.data.report import TEXT_LAYER, LoadReport

log = logging.getLogger(__name__)

ORDERS = ("layout", "stream")
BOX_KINDS = ("tight", "loose")
ON_ERROR = ("raise", "skip")

# PDF 1.7 §7.5.2: the header may follow up to 1 KiB of junk; §7.5.5: "%%EOF"
# ends the file, and readers look for it in the last 1 KiB.
_HEADER_WINDOW = 1024
_TRAILER_WINDOW = 1024
# PDFium document-loading error codes (fpdfview.h, FPDF_ERR_*).
_LOAD_ERRORS = {
    1: "unknown PDFium error while opening",
    2: "the file cannot be opened or read",
    3: "not a valid PDF or corrupt (PDFium cannot parse it)",
    5: "unsupported encryption (security handler)",
    6: "page not found or its content is corrupt",
}
_FPDF_ERR_PASSWORD = 4
# The password of encrypted PDFs read without one: the way for command lines (predict, the
# OCR command), where an argument would show in `ps` and the shell's history (cf. PGPASSWORD).
PASSWORD_ENV = "FLAXDOC_PDF_PASSWORD"
_FPDF_PAGEOBJ_IMAGE = 3
_FPDF_PAGEOBJ_FORM = 5
# The first bytes of files people pass as PDFs by mistake, for the error message (and
# flaxdoc.data.ocr's message for an unsupported file).
FILE_SIGNATURES = ((b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"),
                   (b"GIF8", "a GIF image"), (b"II*\x00", "a TIFF image"),
                   (b"MM\x00*", "a TIFF image"), (b"PK\x03\x04", "a ZIP archive (e.g. .docx/.xlsx)"),
                   (b"{", "JSON text"), (b"<", "XML/HTML text"),
                   (b"\xd0\xcf\x11\xe0", "an old MS Office file"))


def import_pdfium():
  """Imports pypdfium2 on first use, with a clear message when it is missing."""
  try:
    import pypdfium2  # pylint: disable=import-outside-toplevel
    import pypdfium2.raw  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("reading PDFs needs pypdfium2: pip install 'pypdfium2>=5'") from e
  return pypdfium2


# --------------------------------------------------------------------------- files
def _describe_non_pdf(head: bytes) -> str:
  """A guess at what a non-PDF file is, for the error message."""
  for magic, what in FILE_SIGNATURES:
    # Text formats may start with whitespace; binary magic numbers may not.
    start = head.lstrip() if magic in (b"{", b"<") else head
    if start.startswith(magic):
      return what
  if not head:
    return "an empty file"
  return f"a file starting with {head[:16]!r}"


def check_file(path: Path, source: str) -> None:
  """Cheap checks before PDFium: exists, is a PDF, ends with %%EOF (not truncated)."""
  try:
    size = path.stat().st_size
    with open(path, "rb") as f:
      head = f.read(_HEADER_WINDOW)
      f.seek(max(0, size - _TRAILER_WINDOW))
      tail = f.read(_TRAILER_WINDOW)
  except FileNotFoundError:
    raise DocumentError("no such file", source=source) from None
  except IsADirectoryError:
    raise DocumentError("is a directory, not a PDF file", source=source) from None
  except OSError as e:
    raise DocumentError(f"cannot read file ({e.strerror or e})", source=source) from None
  if b"%PDF-" not in head:
    raise DocumentError(f"not a PDF file: no '%PDF-' header (looks like "
                        f"{_describe_non_pdf(head)})", source=source)
  if b"%%EOF" not in tail:
    raise DocumentError(f"truncated or damaged PDF: no '%%EOF' marker in the last "
                        f"{_TRAILER_WINDOW} bytes ({size} bytes in all); the file was probably "
                        "cut short while downloading or copying (if it does open in a viewer, "
                        "re-save it, e.g. `qpdf in.pdf out.pdf`)", source=source)


def open_pdf(pdfium, path: Path, password: str | None, source: str):
  """A `pypdfium2.PdfDocument`; without `password`, an encrypted PDF gets `PASSWORD_ENV`'s.

  The password is never put in a message, a log or a report.
  """
  env_password = os.environ.get(PASSWORD_ENV) if password is None else None
  try:
    try:
      return pdfium.PdfDocument(path, password=password)
    except pdfium.PdfiumError as e:
      # The environment's password only for a PDF that needs one: PDFium refuses a wrong
      # password even where none is needed (an owner-password-only PDF), and one variable
      # serves every file of a glob.
      if not (env_password and getattr(e, "err_code", None) == _FPDF_ERR_PASSWORD):
        raise
    return pdfium.PdfDocument(path, password=env_password)
  except FileNotFoundError:
    raise DocumentError("no such file", source=source) from None
  except pdfium.PdfiumError as e:
    code = getattr(e, "err_code", None)
    if code == _FPDF_ERR_PASSWORD:
      if password is None and not env_password:
        raise DocumentError(
            "the PDF is encrypted: give its password, in Python with read_pdf(..., "
            "password=...) or read_pdfs(..., passwords={path: ...}); on the command line "
            "(python -m flaxdoc.main --config.mode=predict, python -m flaxdoc.data.ocr) in the "
            f"environment variable {PASSWORD_ENV}",
            field="password", source=source) from None
      if password is None:
        raise DocumentError(
            f"the PDF is encrypted and the password in the environment variable {PASSWORD_ENV} "
            "is wrong for it (that one password is tried on every encrypted PDF read; give "
            "passwords per file with read_pdfs(..., passwords={path: ...}))",
            field="password", source=source) from None
      raise DocumentError("the PDF is encrypted and the password given is wrong",
                          field="password", source=source) from None
    raise DocumentError(_LOAD_ERRORS.get(code, f"PDFium cannot open it ({e})"),
                        source=source) from None


def _count_images(pdfium, obj_count, get_obj, depth: int = 0) -> int:
  """Image objects on a page, including those inside form XObjects (bounded depth)."""
  raw = pdfium.raw
  total = 0
  for k in range(obj_count):
    obj = get_obj(k)
    kind = raw.FPDFPageObj_GetType(obj)
    if kind == _FPDF_PAGEOBJ_IMAGE:
      total += 1
    elif kind == _FPDF_PAGEOBJ_FORM and depth < 8:
      total += _count_images(pdfium, raw.FPDFFormObj_CountObjects(obj),
                             lambda j, o=obj: raw.FPDFFormObj_GetObject(o, j), depth + 1)
  return total


def _page_images(pdfium, page) -> int:
  raw = pdfium.raw
  return _count_images(pdfium, raw.FPDFPage_CountObjects(page.raw),
                       lambda k: raw.FPDFPage_GetObject(page.raw, k))


def _select_pages(pages, num_pages: int, source: str, doc_id: str) -> list[int]:
  if pages is None:
    return list(range(num_pages))
  if isinstance(pages, (int, np.integer)):
    pages = [pages]
  selected = []
  for p in pages:
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)):
      raise DocumentError(f"page numbers must be integers (0-based), got {p!r}", doc_id=doc_id,
                          field="pages", source=source)
    if not 0 <= p < num_pages:
      raise DocumentError(f"page {int(p)} does not exist: the PDF has {num_pages} pages "
                          f"(0-based, 0..{num_pages - 1})", doc_id=doc_id, field="pages",
                          source=source)
    if int(p) in selected:
      raise DocumentError(f"page {int(p)} is selected twice", doc_id=doc_id, field="pages",
                          source=source)
    selected.append(int(p))
  if not selected:
    raise DocumentError("no pages selected", doc_id=doc_id, field="pages", source=source)
  return selected


def read_pdf(path: str | os.PathLike, *, doc_id: str | None = None,
             pages: Sequence[int] | int | None = None, password: str | None = None,
             dpi: float = 72.0, order: str = "layout", boxes: str = "tight",
             segment_gap: float = 1.0, report: LoadReport | None = None) -> Document:
  """Reads the text layer of a born-digital PDF into an unlabelled `Document`.

  Args:
    path: the PDF file.
    doc_id: the document id (default: the file name without `.pdf`).
    pages: 0-based page numbers to read, in the order given (default: all).
      Page `k` of the returned document is `pages[k]` of the file.
    password: the password of an encrypted PDF (user or owner password); when
      None, an encrypted PDF is opened with `$FLAXDOC_PDF_PASSWORD` if it is set.
    dpi: pixels per inch of the returned boxes and page sizes; 72 (default)
      gives PDF points.
    order: "layout" (rows top-to-bottom, left-to-right) or "stream" (PDFium's
      content order); see the module docstring.
    boxes: "tight" (glyph ink, default) or "loose" (font-height cells).
    segment_gap: a horizontal gap wider than this many line heights ends a
      segment (a line piece), e.g. between columns or form fields.
    report: if given, skipped words, dropped characters and pages without text
      are recorded in it (otherwise they are logged).

  Returns:
    A `Document` with `entities=None`; words in reading order, one segment id
    per line piece (0, 1, ... in reading order), `page_sizes` of the selected
    pages as displayed (rotation applied) in pixels at `dpi`.

  Raises:
    DocumentError: naming the file, for a missing/unreadable file, a non-PDF
      file, a corrupt or truncated PDF, an encrypted PDF without the right
      password, a page that fails to load, bad `pages`, or a PDF whose selected
      pages have no text layer at all (scanned/image-only: run OCR first).
    ValueError: for a bad `dpi`, `order`, `boxes` or `segment_gap`.
  """
  if order not in ORDERS:
    raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
  if boxes not in BOX_KINDS:
    raise ValueError(f"boxes must be one of {BOX_KINDS}, got {boxes!r}")
  if not (isinstance(dpi, (int, float)) and math.isfinite(dpi) and dpi > 0):
    raise ValueError(f"dpi must be a positive number, got {dpi!r}")
  if not (isinstance(segment_gap, (int, float)) and segment_gap >= 0):
    raise ValueError(f"segment_gap must be a number >= 0, got {segment_gap!r}")
  pdfium = import_pdfium()
  path = Path(path)
  source = os.fspath(path)
  doc_id = str(doc_id) if doc_id is not None else (path.stem or path.name)
  check_file(path, source)
  pdf = open_pdf(pdfium, path, password, source)
  try:
    selected = _select_pages(pages, len(pdf), source, doc_id)
    scale = float(dpi) / 72.0
    all_words, all_boxes, all_pages, all_segments = [], [], [], []
    page_sizes = []
    empty_pages, images_on_empty = [], 0
    dropped_chars = outside_words = next_segment = 0
    for k, number in enumerate(selected):
      try:
        page = pdf[number]
      except pdfium.PdfiumError as e:
        raise DocumentError(f"page {number} cannot be loaded ({e})", doc_id=doc_id,
                            field="pages", source=source) from None
      try:
        frame = page_frame(page)
        width, height = frame.size
        if not (width > 0 and height > 0):
          raise DocumentError(f"page {number} has an empty page box {page.get_bbox()}",
                              doc_id=doc_id, field="page_sizes", source=source)
        page_sizes.append((width * scale, height * scale))
        words, dropped = page_words(pdfium, page, frame)
        dropped_chars += dropped
        if not words:
          empty_pages.append(number)
          images_on_empty += _page_images(pdfium, page)
          continue
      finally:
        page.close()
      # Words wholly outside the visible page (cut away by the CropBox) are
      # skipped, and so are the (never seen) words PDFium gives no finite box.
      box = words.tight if boxes == "tight" else words.loose
      finite = np.isfinite(words.tight).all(1) & np.isfinite(words.loose).all(1)
      with np.errstate(invalid="ignore"):
        inside = finite & ((box[:, 2] >= 0) & (box[:, 3] >= 0) & (box[:, 0] <= width) &
                           (box[:, 1] <= height))
      if not inside.all():
        outside_words += int((~inside).sum())
        if report is not None:
          for text, ok in zip(np.asarray(words.texts, object)[~inside], finite[~inside]):
            report.skip_word(f"{doc_id} page {number}: {text!r}",
                             "outside the visible page" if ok else "no box from PDFium")
        words = words.select(inside)
      box = (words.tight if boxes == "tight" else words.loose) * scale
      segmenter = layout_segments if order == "layout" else stream_segments
      for members in segmenter(words, segment_gap):
        all_words.extend(words.texts[i] for i in members)
        all_boxes.append(box[members])
        all_pages.append(np.full(len(members), k))
        all_segments.append(np.full(len(members), next_segment))
        next_segment += 1
  finally:
    pdf.close()

  if not all_words:
    where = "the PDF" if pages is None else f"the selected pages {selected}"
    if outside_words:
      raise DocumentError(f"all {outside_words} words of {where} lie outside the visible page "
                          "(CropBox): nothing to read", doc_id=doc_id, field="words",
                          source=source)
    if images_on_empty:
      raise DocumentError(
          f"no text layer in {where}, only {images_on_empty} image(s): it looks scanned. Run OCR "
          "first (e.g. Tesseract, docTR or an OCR service) and read its words and boxes with "
          "flaxdoc.data.jsonl, or make a searchable PDF (e.g. `ocrmypdf in.pdf out.pdf`) and "
          "read that", doc_id=doc_id, field="words", source=source)
    raise DocumentError(f"no text layer in {where} (and no images): nothing to read",
                        doc_id=doc_id, field="words", source=source)
  # Not errors, but nothing may vanish silently: report (or log) what was left out.
  if report is not None:
    report.record_page_sources(doc_id, [TEXT_LAYER] * len(selected))
    if empty_pages:
      report.stats.setdefault("pages_without_text", {})[doc_id] = empty_pages
    if dropped_chars:
      report.stats["dropped_control_chars"] = (report.stats.get("dropped_control_chars", 0) +
                                               dropped_chars)
  else:
    if empty_pages:
      log.warning("%s: pages %s have no text layer (image-only or blank): no words from them",
                  source, empty_pages)
    if dropped_chars:
      log.info("%s: dropped %d invisible control/format characters", source, dropped_chars)
    if outside_words:
      log.info("%s: skipped %d words outside the visible page", source, outside_words)
  # "clip": boxes that stick out of the page (ascenders at the top edge, a
  # word half cut by the CropBox) are clipped, and Document.repairs says so.
  return Document.create(doc_id, all_words, np.concatenate(all_boxes),
                         pages=np.concatenate(all_pages), page_sizes=page_sizes,
                         segments=np.concatenate(all_segments), entities=None,
                         box_policy="clip", source=source,
                         # A broken font's ToUnicode map can yield lone surrogates: U+FFFD, recorded.
                         text_policy="replace")


def read_pdfs(paths: Iterable[str | os.PathLike], *, on_error: str = "skip",
              passwords: dict[str, str] | None = None, **options
              ) -> tuple[list[Document], LoadReport]:
  """Reads several PDFs: `(documents, report)`; failures are recorded per file.

  Args:
    paths: PDF files (a single path is also accepted).
    on_error: "skip" (default) records a file that fails in
      `report.skipped_documents` (with the `DocumentError` message) and goes
      on; "raise" re-raises the first failure.
    passwords: passwords by path (as given) or by file name, for encrypted PDFs;
      a file without one gets `$FLAXDOC_PDF_PASSWORD`, if set (see `read_pdf`).
    **options: passed to `read_pdf` (`pages`, `dpi`, `order`, `boxes`,
      `segment_gap`).

  Document ids are the file names without `.pdf`; when two files share a name,
  the later ones get their full path as id so that ids stay unique.
  """
  if on_error not in ON_ERROR:
    raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
  for bad in ("doc_id", "password", "report"):
    if bad in options:
      raise TypeError(f"read_pdfs: {bad!r} is set per file (ids from file names, `passwords`)")
  if isinstance(paths, (str, os.PathLike)):
    paths = [paths]
  paths = list(paths)
  passwords = passwords or {}
  report = LoadReport(f"pdf ({len(paths)} files)")

  def read_one(p, doc_id, report):
    password = passwords.get(os.fspath(p), passwords.get(Path(p).name))
    return read_pdf(p, doc_id=doc_id, password=password, report=report, **options)

  from flaxdoc.data.reading import read_files  # pylint: disable=import-outside-toplevel
  docs = read_files(paths, read_one, report, on_error)
  return docs, report
