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

PDFium is not thread-safe: read PDFs from one thread per process (grain and
`multiprocessing` workers are processes, which is fine).
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import math
import os
import unicodedata
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from flaxdoc.data.document import Document, DocumentError
from flaxdoc.data.report import LoadReport

log = logging.getLogger(__name__)

ORDERS = ("layout", "stream")
BOX_KINDS = ("tight", "loose")
ON_ERROR = ("raise", "skip")

# PDFium marks the hyphen of a word broken across two lines with U+0002.
_PDFIUM_HYPHEN = "\x02"
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
_FPDF_PAGEOBJ_IMAGE = 3
_FPDF_PAGEOBJ_FORM = 5
# Text further than this (degrees) from upright on the displayed page is
# "rotated": no line grouping by rows for it.
_UPRIGHT_TOLERANCE_DEG = 10.0
_MAGIC = ((b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"),
          (b"GIF8", "a GIF image"), (b"II*\x00", "a TIFF image"), (b"MM\x00*", "a TIFF image"),
          (b"PK\x03\x04", "a ZIP archive (e.g. .docx/.xlsx)"), (b"{", "JSON text"),
          (b"<", "XML/HTML text"), (b"\xd0\xcf\x11\xe0", "an old MS Office file"))


def _pdfium():
  """Imports pypdfium2 on first use, with a clear message when it is missing."""
  try:
    import pypdfium2  # pylint: disable=import-outside-toplevel
    import pypdfium2.raw  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("reading PDFs needs pypdfium2: pip install 'pypdfium2>=5'") from e
  return pypdfium2


# --------------------------------------------------------------------------- geometry
@dataclasses.dataclass(frozen=True)
class _PageFrame:
  """Maps PDF user space (points, y up) to the displayed page (points, y down).

  `left, bottom, right, top` is the visible page box (CropBox within MediaBox);
  `rotation` the page's clockwise `/Rotate` in {0, 90, 180, 270}.
  """
  left: float
  bottom: float
  right: float
  top: float
  rotation: int

  @property
  def size(self) -> tuple[float, float]:
    """Displayed (width, height) in points: swapped for quarter turns."""
    w, h = self.right - self.left, self.top - self.bottom
    return (h, w) if self.rotation in (90, 270) else (w, h)

  def to_display(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points `(x, y)` in user space -> displayed `(x', y')`, origin top-left."""
    w, h = self.right - self.left, self.top - self.bottom
    u, v = x - self.left, self.top - y  # unrotated, y down
    if self.rotation == 0:
      return u, v
    if self.rotation == 90:  # clockwise: the top-left corner goes to the top-right
      return h - v, u
    if self.rotation == 180:
      return w - u, h - v
    return v, w - u  # 270

  def boxes_to_display(self, boxes: np.ndarray) -> np.ndarray:
    """`[n, 4]` user-space `(left, bottom, right, top)` -> displayed `[x0, y0, x1, y1]`."""
    xa, ya = self.to_display(boxes[:, 0], boxes[:, 1])
    xb, yb = self.to_display(boxes[:, 2], boxes[:, 3])
    return np.stack([np.minimum(xa, xb), np.minimum(ya, yb), np.maximum(xa, xb),
                     np.maximum(ya, yb)], axis=1)


def _page_frame(page) -> _PageFrame:
  left, bottom, right, top = (float(v) for v in page.get_bbox())
  rotation = int(page.get_rotation()) % 360
  return _PageFrame(left, bottom, right, top, rotation)


# --------------------------------------------------------------------------- characters -> words
@dataclasses.dataclass
class _PageWords:
  """The words of one page in PDFium's order, in displayed points (struct of arrays)."""
  texts: list[str]
  tight: np.ndarray  # [W, 4] union of the glyph boxes
  loose: np.ndarray  # [W, 4] union of the font-height cells
  upright: np.ndarray  # [W] bool: upright on the displayed page
  stream_break: np.ndarray  # [W] bool: PDFium (or a jump) starts a new line here

  def __len__(self) -> int:
    return len(self.texts)

  def select(self, keep: np.ndarray) -> "_PageWords":
    return _PageWords([t for t, k in zip(self.texts, keep) if k], self.tight[keep],
                      self.loose[keep], self.upright[keep], self.stream_break[keep])


def _no_words() -> _PageWords:
  return _PageWords([], np.zeros((0, 4)), np.zeros((0, 4)), np.zeros(0, bool), np.zeros(0, bool))


def _page_codes(raw, tp, n: int) -> np.ndarray:
  """`int64 [n]` Unicode code point of each PDFium character (0 when it has none).

  One `FPDFText_GetText` call instead of `n` `FPDFText_GetUnicode` calls (ctypes
  calls cost microseconds each). That call returns UTF-16 and spells the
  end-of-line hyphen U+FFFE; when the page has characters beyond the BMP
  (surrogate pairs) the per-character call is used instead.
  """
  buf = (ctypes.c_uint16 * (n + 1))()
  written = raw.FPDFText_GetText(tp, 0, n, buf)
  units = np.frombuffer(buf, np.uint16)[:max(written - 1, 0)].astype(np.int64)
  if len(units) == n and not ((units >= 0xD800) & (units <= 0xDFFF)).any():
    units[units == 0xFFFE] = ord(_PDFIUM_HYPHEN)
    return units
  return np.asarray([raw.FPDFText_GetUnicode(tp, i) for i in range(n)], np.int64)


# Per code point: 0 = letter (kept), 1 = whitespace, 2 = line break, 3 = PDFium's
# end-of-line hyphen, 4 = invisible control/format character (dropped).
_KEEP, _SPACE, _NEWLINE, _HYPHEN, _DROP = range(5)
_LINE_BREAKS = frozenset("\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


def _char_class(code: int) -> int:
  if code <= 0 or code >= 0x110000:
    return _SPACE  # no Unicode value: treated as a separator, like a space
  ch = chr(code)
  if ch == _PDFIUM_HYPHEN:
    return _HYPHEN
  if ch in _LINE_BREAKS:
    return _NEWLINE
  if ch.isspace() or ch == "\u200b":  # a zero-width space separates words too
    return _SPACE
  if unicodedata.category(ch) in ("Cc", "Cf", "Cs"):
    return _DROP
  return _KEEP


def _page_words(pdfium, page, frame: _PageFrame) -> tuple[_PageWords, int]:
  """The words of one page in PDFium's order, and the number of dropped control characters."""
  raw = pdfium.raw
  textpage = page.get_textpage()
  try:
    tp = textpage.raw
    n = raw.FPDFText_CountChars(tp)
    if n <= 0:
      return _no_words(), 0
    codes = _page_codes(raw, tp, n)
    classes = {code: _char_class(code) for code in set(codes.tolist())}
    cls = np.asarray([classes[code] for code in codes.tolist()], np.int8)  # [n]
    # The end-of-line hyphen is kept as "-": it belongs to the first piece.
    kept = np.flatnonzero((cls == _KEEP) | (cls == _HYPHEN))  # [m] PDFium indices
    m = len(kept)
    if m == 0:
      return _no_words(), int((cls == _DROP).sum())
    # The per-character ctypes calls dominate the run time: keep the loop bare.
    l, r, b, t = ctypes.c_double(), ctypes.c_double(), ctypes.c_double(), ctypes.c_double()
    get_box, get_loose = raw.FPDFText_GetCharBox, raw.FPDFText_GetLooseCharBox
    tight_list = []
    add = tight_list.append
    nan_box = (math.nan,) * 4
    rects = (raw.FS_RECTF * m)()  # float32 (left, top, right, bottom) per character
    loose_failed = []
    for j, i in enumerate(kept.tolist()):
      if get_box(tp, i, l, r, b, t):
        add((l.value, b.value, r.value, t.value))
      else:
        add(nan_box)
      if not get_loose(tp, i, rects[j]):
        loose_failed.append(j)
    tight = np.asarray(tight_list, np.float64)  # [m, 4] user space (left, bottom, right, top)
    loose = np.frombuffer(rects, np.float32).reshape(m, 4)[:, [0, 3, 2, 1]].astype(np.float64)
    loose[loose_failed] = math.nan
    # A character PDFium has only one kind of box for borrows it for the other;
    # one with neither makes its word's box NaN, and `read_pdf` skips that word.
    tight = np.where(np.isnan(tight), loose, tight)
    loose = np.where(np.isnan(loose), tight, loose)

    # Word and line boundaries between consecutive kept characters, from the
    # separators PDFium put between them (counted with prefix sums).
    # Dropped characters (soft hyphens, zero-width joiners...) do not split words.
    is_sep = ((cls == _SPACE) | (cls == _NEWLINE)).astype(np.int64)
    is_break = (cls == _NEWLINE).astype(np.int64)
    hyphen = cls[kept] == _HYPHEN  # [m]
    sep_count = np.concatenate([[0], np.cumsum(is_sep)])
    break_count = np.concatenate([[0], np.cumsum(is_break)])
    # Separators strictly between kept[j-1] and kept[j].
    sep_between = sep_count[kept[1:]] - sep_count[kept[:-1] + 1] > 0  # [m-1]
    break_between = break_count[kept[1:]] - break_count[kept[:-1] + 1] > 0
    after_hyphen = hyphen[:-1]
    run_start = np.concatenate([[True], sep_between | after_hyphen])  # [m]
    line_start = np.concatenate([[True], break_between | after_hyphen])

    tight = frame.boxes_to_display(tight)
    loose = frame.boxes_to_display(loose)
    # Is each run upright on the displayed page? One angle per run (not per
    # character). PDFium's angle turns clockwise as seen on the unrotated page
    # (matplotlib's `rotation=90`, counter-clockwise, reads 270 degrees), and
    # /Rotate turns the page clockwise too, so the two add up.
    starts = np.flatnonzero(run_start)
    angles = np.degrees([raw.FPDFText_GetCharAngle(tp, int(i)) for i in kept[starts]])
  finally:
    textpage.close()
  shown = (angles + frame.rotation) % 360.0
  run_upright = np.minimum(shown, 360.0 - shown) <= _UPRIGHT_TOLERANCE_DEG  # [runs]
  upright = np.repeat(run_upright, np.diff(np.append(starts, m)))  # [m]

  # Inside an upright run, a character on another line (font cells overlapping
  # by less than a third of the smaller height: superscripts still continue) or
  # more than half a cell to the left of its predecessor starts a new word.
  prev, cur = loose[:-1], loose[1:]
  height = np.minimum(prev[:, 3] - prev[:, 1], cur[:, 3] - cur[:, 1])
  overlap = np.minimum(prev[:, 3], cur[:, 3]) - np.maximum(prev[:, 1], cur[:, 1])
  jump = (height > 0) & ((overlap < height / 3) | (cur[:, 0] < prev[:, 0] - height / 2))
  jump = np.concatenate([[False], jump & upright[1:]])
  word_start = run_start | jump
  line_start = line_start | jump

  chars = [chr(c) for c in codes[kept].tolist()]
  for j in np.flatnonzero(hyphen):
    chars[j] = "-"
  starts = np.flatnonzero(word_start)
  ends = np.append(starts[1:], m)
  words = _PageWords(
      texts=["".join(chars[s:e]) for s, e in zip(starts.tolist(), ends.tolist())],
      tight=np.concatenate([np.minimum.reduceat(tight[:, :2], starts),
                            np.maximum.reduceat(tight[:, 2:], starts)], axis=1),
      loose=np.concatenate([np.minimum.reduceat(loose[:, :2], starts),
                            np.maximum.reduceat(loose[:, 2:], starts)], axis=1),
      upright=upright[starts], stream_break=line_start[starts])
  return words, int((cls == _DROP).sum())


# ------------------------------------------------------------------- words -> lines and order
def _same_row(a, b) -> bool:
  """Loose boxes on one text row: vertical overlap >= half the smaller height."""
  height = min(a[3] - a[1], b[3] - b[1])
  overlap = min(a[3], b[3]) - max(a[1], b[1])
  return overlap >= 0.5 * height if height > 0 else overlap >= 0


def _gap_breaks(a, b, segment_gap: float) -> bool:
  """Whether the horizontal gap from loose box `a` to `b` splits their line."""
  height = max(a[3] - a[1], b[3] - b[1])
  return b[0] - a[2] > segment_gap * height


def _layout_segments(words: _PageWords, segment_gap: float) -> list[list[int]]:
  """Segments (lists of word indices) read top-to-bottom, then left-to-right."""
  loose = words.loose.tolist()  # plain floats: this loop is scalar work
  centre = [(b[1] + b[3]) / 2 for b in loose]
  upright = [i for i in range(len(words)) if words.upright[i]]
  upright.sort(key=lambda i: (centre[i], loose[i][0]))
  rows: list[list[int]] = []
  for i in upright:
    # Compare with the row's first word (not its last) so rows cannot drift down.
    if rows and _same_row(loose[rows[-1][0]], loose[i]):
      rows[-1].append(i)
    else:
      rows.append([i])
  units: list[tuple[float, float, list[int]]] = []  # (row centre, x0, word indices)
  for row in rows:
    row.sort(key=lambda i: (loose[i][0], loose[i][2]))
    start = 0
    for k in range(1, len(row) + 1):
      if k == len(row) or _gap_breaks(loose[row[k - 1]], loose[row[k]], segment_gap):
        units.append((centre[row[0]], loose[row[start]][0], row[start:k]))
        start = k
  # Rotated text: PDFium's words and lines as they come, each line placed by its first word.
  for line in _rotated_lines(words):
    units.append((centre[line[0]], loose[line[0]][0], line))
  # Stable sort: the pieces of one row keep their left-to-right order.
  units.sort(key=lambda u: (u[0], u[1]))
  return [u[2] for u in units]


def _rotated_lines(words: _PageWords) -> list[list[int]]:
  """Runs of consecutive non-upright words that PDFium puts on one line."""
  lines: list[list[int]] = []
  for i in np.flatnonzero(~words.upright).tolist():
    if lines and lines[-1][-1] == i - 1 and not words.stream_break[i]:
      lines[-1].append(i)
    else:
      lines.append([i])
  return lines


def _stream_segments(words: _PageWords, segment_gap: float) -> list[list[int]]:
  """Segments in PDFium's order: a new one at each line break, jump or wide gap."""
  loose = words.loose.tolist()
  upright = words.upright.tolist()
  breaks = words.stream_break.tolist()
  segments: list[list[int]] = []
  for i in range(len(words)):
    if segments:
      p = segments[-1][-1]
      if upright[i] and upright[p]:
        joined = (not breaks[i] and _same_row(loose[p], loose[i]) and
                  loose[i][0] >= loose[p][0] and
                  not _gap_breaks(loose[p], loose[i], segment_gap))
      else:  # rotated text: PDFium's lines
        joined = not breaks[i] and not upright[i] and not upright[p]
      if joined:
        segments[-1].append(i)
        continue
    segments.append([i])
  return segments


# --------------------------------------------------------------------------- files
def _describe_non_pdf(head: bytes) -> str:
  """A guess at what a non-PDF file is, for the error message."""
  for magic, what in _MAGIC:
    # Text formats may start with whitespace; binary magic numbers may not.
    start = head.lstrip() if magic in (b"{", b"<") else head
    if start.startswith(magic):
      return what
  if not head:
    return "an empty file"
  return f"a file starting with {head[:16]!r}"


def _check_file(path: Path, source: str) -> None:
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


def _open(pdfium, path: Path, password: str | None, source: str):
  try:
    return pdfium.PdfDocument(path, password=password)
  except FileNotFoundError:
    raise DocumentError("no such file", source=source) from None
  except pdfium.PdfiumError as e:
    code = getattr(e, "err_code", None)
    if code == _FPDF_ERR_PASSWORD:
      if password is None:
        raise DocumentError("the PDF is encrypted: give its password (read_pdf(..., "
                            "password=...) or read_pdfs(..., passwords={path: ...}))",
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
    password: the password of an encrypted PDF (user or owner password).
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
  pdfium = _pdfium()
  path = Path(path)
  source = os.fspath(path)
  doc_id = str(doc_id) if doc_id is not None else (path.stem or path.name)
  _check_file(path, source)
  pdf = _open(pdfium, path, password, source)
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
        frame = _page_frame(page)
        width, height = frame.size
        if not (width > 0 and height > 0):
          raise DocumentError(f"page {number} has an empty page box {page.get_bbox()}",
                              doc_id=doc_id, field="page_sizes", source=source)
        page_sizes.append((width * scale, height * scale))
        words, dropped = _page_words(pdfium, page, frame)
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
      segmenter = _layout_segments if order == "layout" else _stream_segments
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
    passwords: passwords by path (as given) or by file name, for encrypted PDFs.
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
