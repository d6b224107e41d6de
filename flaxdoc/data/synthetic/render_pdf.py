"""Documents -> born-digital PDFs: each word's text drawn in its box, one PDF per document.

What for: `predict` mode reads PDFs (`flaxdoc.data.pdf.read_pdf`), but a fresh
checkout has none that look like what the model was trained on. Writing the
synthetic documents as PDFs gives PDFs to try `predict` on (with gold answers
to compare against), and gives the PDF reader a test input whose every word
and box is known.

    from flaxdoc.data.synthetic import make_document
    from flaxdoc.data.synthetic.render_pdf import write_pdf
    write_pdf(make_document(0, 7), "/tmp/synthetic-0-7.pdf")

or `python -m flaxdoc.data.synthetic --num 2 --pdf /tmp/pdfs`.

How: matplotlib's PDF backend (an optional dependency, in the `test` extra)
with TrueType fonts embedded (`pdf.fonttype` 42), so the words form a real,
selectable text layer. Units: page sizes and boxes are page pixels; by
default 1 pixel = 1 PDF point (`dpi=72`), so `read_pdf`'s default gives the
document's own coordinates back. (The synthetic pages are in 300-dpi pixels,
an A4 form 2480 x 3508, so their PDF pages are large, 34 x 49 inches; with
`dpi=300` they are real A4 pages, read back with `read_pdf(..., dpi=300)`.
The model sees boxes relative to the page, so either works for `predict`.)

Each word is one text object, with a trailing space (without it PDFium glues
words whose gap is narrower than a space into one), in DejaVu Sans Mono:
bundled with matplotlib, so the output is the same everywhere, and monospaced
like the generator's font model (every character 0.5-0.6 em wide; DejaVu's
are 0.6 em). With the proportional DejaVu Sans, words in narrow glyphs ("Ill",
a "-----" rule) came back up to 9 box heights short at the right; with the
monospaced font, at most 0.82. The font size is set so that the font's full
ink range (bottom of "_" to top of "|", one em) spans the box from top to
bottom, and the word's ink starts at the box's left edge. A word wider than
its box at that size is set smaller, its line centred on the box's. So every
word's ink lies inside its box.

Accuracy, as `tests/data/test_render_pdf.py` measures it with `read_pdf`
(glyph-tight boxes) on synthetic documents (300-dpi pages, words 27-78
px tall): the same words on the same pages, page sizes exact; left edges to
0.02 px; boxes inside the original to 0.012 box heights. The other edges fall
short by what the glyphs leave empty: the median error is 0.01 box heights at
the top (capitals and digits; 0.2 for words in x-height letters), 0.22 at the
bottom (words without descenders end on the baseline; up to 0.41 for words
set smaller) and 0.09 at the right (up to 0.82). The largest error is 40 px
(the top of a "____" signature line, whose ink is a thin bar at the bottom of
its box), some 10 pt at real A4 size. Word order is `read_pdf`'s (rows top to
bottom, left to right): the same as the document's when that is in visual
line order (`SyntheticConfig(interleave_columns=1.0)`).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from flaxdoc.data.document import Document

log = logging.getLogger(__name__)

FONT_FILE = "DejaVuSansMono.ttf"  # in matplotlib's own data directory
# Glyphs spanning the font's full ink range: the cell a box's height maps to.
_CELL_GLYPHS = "|_dgjy$()[]{}"
_MAX_NAME = 100


def _matplotlib():
  """The matplotlib pieces used here, imported on first use (an optional dependency)."""
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
    from matplotlib.backends.backend_pdf import PdfPages  # pylint: disable=import-outside-toplevel
    from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel
    from matplotlib.font_manager import FontProperties  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError("writing PDFs needs matplotlib, which flaxdoc does not install by "
                      "default: pip install matplotlib (or pip install 'flaxdoc[test]')") from e
  return matplotlib, PdfPages, Figure, FontProperties


class _Font:
  """DejaVu Sans Mono ink metrics, in ems: the ink box of a word set at size 1.

  Words are laid out by matplotlib's own text layout (as the PDF backend lays
  them out, kerning and ligatures included); each glyph's exact outline box is
  computed once, so a new word costs a layout, not a walk over its curves.
  """

  def __init__(self):
    matplotlib, _, _, FontProperties = _matplotlib()  # pylint: disable=invalid-name
    # pylint: disable=import-outside-toplevel
    from matplotlib.font_manager import get_font
    from matplotlib.path import Path as MplPath
    from matplotlib.textpath import text_to_path
    # pylint: enable=import-outside-toplevel
    path = os.path.join(matplotlib.get_data_path(), "fonts", "ttf", FONT_FILE)
    self.prop = FontProperties(fname=path)
    self._ft = get_font(path)
    self._charmap = self._ft.get_charmap()
    self._layout = text_to_path
    self._path = MplPath
    self._glyphs: dict = {}  # glyph key -> ink (x0, y0, x1, y1) in layout units, or None
    boxes = np.array([self.ink(c) for c in _CELL_GLYPHS])
    self.bottom, self.top = float(boxes[:, 1].min()), float(boxes[:, 3].max())

  @functools.lru_cache(maxsize=65536)
  def ink(self, text: str) -> tuple[float, float, float, float]:
    """`(x0, y0, x1, y1)` of the ink of `text` at size 1, origin on the baseline, y up.

    `(0, 0, 0, 0)` for text without ink (spaces).
    """
    tp = self._layout
    self._ft.set_size(tp.FONT_SCALE, tp.DPI)  # the font object is shared: set its size each time
    info, new, _ = tp.get_glyphs_with_font(self._ft, text, glyph_map=self._glyphs,
                                           return_new_glyphs_only=True)
    for key, (verts, codes) in new.items():
      if len(verts):
        e = self._path(verts, codes).get_extents()
        self._glyphs[key] = (e.x0, e.y0, e.x1, e.y1)
      else:
        self._glyphs[key] = None
    boxes = [(x + g[0], y + g[1], x + g[2], y + g[3])
             for key, x, y, _ in info if (g := self._glyphs[key]) is not None]
    if not boxes:
      return 0.0, 0.0, 0.0, 0.0
    b = np.array(boxes) / tp.FONT_SCALE
    return float(b[:, 0].min()), float(b[:, 1].min()), float(b[:, 2].max()), float(b[:, 3].max())

  def missing(self, text: str) -> bool:
    return any(ord(c) not in self._charmap for c in text)


@functools.lru_cache(maxsize=1)
def _font() -> _Font:
  return _Font()


def _placements(doc: Document, scale: float):
  """`(page, word, x, baseline, size)` per drawable word, in points (y down); and skipped words."""
  font = _font()
  cell = font.top - font.bottom
  placed, skipped = [], []
  for i, word in enumerate(doc.words):
    x0, y0, x1, y1 = (float(v) * scale for v in doc.boxes[i])
    width, height = x1 - x0, y1 - y0
    ix0, iy0, ix1, iy1 = font.ink(word)
    if not (width > 0 and height > 0 and ix1 > ix0 and iy1 > iy0):
      skipped.append(word)  # no area to fit text in, or text without ink
      continue
    size = height / cell
    if (ix1 - ix0) * size > width:
      size = width / (ix1 - ix0)  # too wide at full height: set it smaller
    # The font's cell centred on the box's vertical centre (the whole box at full size).
    baseline = (y0 + y1) / 2 + size * (font.top + font.bottom) / 2
    placed.append((int(doc.pages[i]), word, x0 - ix0 * size, baseline, size))
  return placed, skipped


def write_pdf(doc: Document, path: str | os.PathLike, *, dpi: float = 72.0) -> Path:
  """Writes `doc` as a PDF with a text layer: one PDF page per document page.

  Args:
    doc: the document (its entities are not drawn).
    path: the PDF file to write (its folder must exist).
    dpi: pixels per inch of the document's boxes and page sizes: 72 (default)
      makes 1 pixel 1 PDF point, which `read_pdf`'s default reads back as is.

  Returns:
    `path`, as a `Path`.

  Raises:
    ImportError: matplotlib is not installed.
    ValueError: a bad `dpi`.

  Words with characters the font lacks are drawn with its missing-glyph
  box (they will not read back as the same text), and words whose box has no
  width or height are left out; both are logged.
  """
  if not (isinstance(dpi, (int, float)) and math.isfinite(dpi) and dpi > 0):
    raise ValueError(f"dpi must be a positive number, got {dpi!r}")
  matplotlib, PdfPages, Figure, _ = _matplotlib()  # pylint: disable=invalid-name
  font = _font()
  scale = 72.0 / float(dpi)
  placed, skipped = _placements(doc, scale)
  if skipped:
    log.warning("%s: %d words not drawn (empty box or no ink), e.g. %r", doc.id, len(skipped),
                skipped[:5])
  missing = [w for w in doc.words if font.missing(w)]
  if missing:
    log.warning("%s: %d words have characters missing from %s, e.g. %r", doc.id, len(missing),
                FONT_FILE, missing[:5])
  path = Path(path)
  by_page: dict[int, list] = {}
  for p in placed:
    by_page.setdefault(p[0], []).append(p)
  # `CreationDate: None` leaves the date out: the same document gives the same bytes.
  metadata = {"Title": doc.id, "Creator": "flaxdoc.data.synthetic.render_pdf",
              "CreationDate": None}
  with matplotlib.rc_context({"pdf.fonttype": 42}), warnings.catch_warnings():
    # One warning per document (above) instead of matplotlib's one per glyph.
    warnings.filterwarnings("ignore", message="Glyph .* missing from font")
    with PdfPages(path, metadata=metadata) as pdf:
      for page, (width, height) in enumerate(doc.page_sizes.astype(np.float64) * scale):
        fig = Figure(figsize=(width / 72.0, height / 72.0))  # the PDF backend's 72 units/inch
        for _, word, x, baseline, size in by_page.get(page, ()):
          # The trailing space (no ink) ends the word in the text layer: without
          # it PDFium joins words whose gap is narrower than a space.
          fig.text(x / width, 1.0 - baseline / height, word + " ", fontproperties=font.prop,
                   fontsize=size, ha="left", va="baseline", parse_math=False)
        pdf.savefig(fig)
  return path


def pdf_file_name(doc_id: str) -> str:
  """A safe file name for a document id: `<id>.pdf`, odd characters replaced by "_"."""
  stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in doc_id)[:_MAX_NAME]
  stem = stem.lstrip(".") or "document"  # no hidden files, no "." or ".."
  return f"{stem}.pdf"


def write_pdfs(docs: Sequence[Document], directory: str | os.PathLike, *,
               dpi: float = 72.0) -> list[Path]:
  """Writes each document to `directory/<id>.pdf` (created if needed); returns the paths.

  Ids are made safe for file names (`pdf_file_name`); two ids that give the
  same name get `-2`, `-3`... appended, so no file is overwritten. `read_pdf`
  takes the file name (without `.pdf`) as the document id, so safe ids such as
  the synthetic `synthetic-0-7` come back unchanged.
  """
  directory = Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  used: set[str] = set()
  paths = []
  for doc in docs:
    name = pdf_file_name(doc.id)
    stem, k = name[:-len(".pdf")], 1
    while name.lower() in used:  # case-insensitive: macOS and Windows file systems
      k += 1
      name = f"{stem}-{k}.pdf"
    used.add(name.lower())
    paths.append(write_pdf(doc, directory / name, dpi=dpi))
  return paths
