"""`flaxdoc.data.pdf`: PDF text layers -> Documents, checked against PDFs made here.

The PDFs are drawn with matplotlib's PDF backend (text at known places, both
Type 3 and TrueType fonts); rotated and cropped variants are made with
pypdfium2's page editing, the encrypted one with pypdf (a test-only
dependency, skipped when absent). Box positions are checked against an
independent rasteriser: the same figure rendered by matplotlib's Agg backend,
whose ink bounding boxes the glyph-tight word boxes must match. The page
transform is checked against PDFium's own `FPDF_PageToDevice`.
"""

import ctypes
import io
import random
import time

import matplotlib
import numpy as np
import pytest
from matplotlib.backends.backend_pdf import PdfPages
from matplotlib.figure import Figure
from PIL import Image

from flaxdoc.data import pdf_text
from flaxdoc.data.document import DocumentError
from flaxdoc.data.pdf import read_pdf, read_pdfs

pdfium = pytest.importorskip("pypdfium2")
import pypdfium2.raw as pdfium_raw  # pylint: disable=g-import-not-at-top

LETTER = (612.0, 792.0)
A4_LANDSCAPE = (842.0, 595.0)


# --------------------------------------------------------------------------- making PDFs
def _figure(size):
  return Figure(figsize=(size[0] / 72.0, size[1] / 72.0))


def _text(fig, size, x, baseline, s, fontsize=12, **kw):
  """Draws `s` with its left end at `x` and its baseline at `baseline` (points, y down)."""
  fig.text(x / size[0], 1.0 - baseline / size[1], s, fontsize=fontsize, **kw)


def _save(path, figures, fonttype=42):
  with matplotlib.rc_context({"pdf.fonttype": fonttype}):
    with PdfPages(path) as pages:
      for fig in figures:
        pages.savefig(fig)
  return path


# Lines of the "invoice": (page, x, baseline, text). Two fields share the
# first baseline far apart: two segments of one row.
INVOICE = [
    (0, 50, 80, "Invoice No. 123"),
    (0, 360, 80, "Date: 2024-01-05"),
    (0, 50, 120, "Bill to: ACME Corp."),
    (0, 50, 140, "12 Main Street"),
    (0, 50, 700, "Total 9.00"),
    (1, 60, 60, "Page two header"),
    (1, 60, 300, "Amount due 42.00"),
    (2, 40, 50, "Thank you"),
]
INVOICE_SIZES = [LETTER, A4_LANDSCAPE, LETTER]


def _invoice_figures(shuffle_seed=0):
  """The invoice pages, each page's lines drawn in a shuffled order."""
  rng = random.Random(shuffle_seed)
  figures = []
  for p, size in enumerate(INVOICE_SIZES):
    fig = _figure(size)
    lines = [line for line in INVOICE if line[0] == p]
    rng.shuffle(lines)
    for _, x, base, s in lines:
      _text(fig, size, x, base, s)
    figures.append(fig)
  return figures


@pytest.fixture(scope="module")
def invoice_pdf(tmp_path_factory):
  return _save(tmp_path_factory.mktemp("pdf") / "invoice.pdf", _invoice_figures())


# Isolated words for box checks: (x, baseline, text, fontsize) on a 360x288 page.
SMALL = (360.0, 288.0)
BOX_WORDS = [(30, 40, "Invoice", 12), (200, 40, "No.123", 10), (30, 100, "Total:", 16),
             (200, 100, "9,00", 14), (30, 160, "glyphy", 12), (200, 160, "ACME", 20),
             (30, 230, "a.b", 9), (200, 230, "Zürich", 12)]


def _box_figure():
  fig = _figure(SMALL)
  for x, base, s, fs in BOX_WORDS:
    _text(fig, SMALL, x, base, s, fontsize=fs)
  return fig


@pytest.fixture(scope="module")
def box_pdf(tmp_path_factory):
  return _save(tmp_path_factory.mktemp("pdf") / "boxes.pdf", [_box_figure()])


def _agg_ink_boxes(fig, scale=4):
  """Ink bounding boxes of BOX_WORDS from matplotlib's own Agg rendering (points)."""
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=72 * scale)
  ink = np.asarray(Image.open(buf).convert("L")) < 128
  out = {}
  for x, base, s, fs in BOX_WORDS:
    x0, x1 = int((x - 0.3 * fs) * scale), int((x + 0.9 * fs * len(s)) * scale)
    y0, y1 = int((base - 1.3 * fs) * scale), int((base + 0.5 * fs) * scale)
    ys, xs = np.nonzero(ink[y0:y1, x0:x1])
    out[s] = np.array([x0 + xs.min(), y0 + ys.min(), x0 + xs.max() + 1,
                       y0 + ys.max() + 1]) / scale
  return out


def _check_invariants(doc):
  """Properties every Document from read_pdf has."""
  n = len(doc)
  assert n > 0 and doc.entities is None
  assert np.isfinite(doc.boxes).all()
  assert (doc.boxes[:, :2] <= doc.boxes[:, 2:]).all()
  size = doc.page_sizes[doc.pages]
  assert (doc.boxes >= 0).all() and (doc.boxes[:, 2:] <= size + 1e-3).all()
  assert (np.diff(doc.pages) >= 0).all()
  # Segment ids: 0, 1, 2 ... in reading order, each segment contiguous.
  assert doc.segments[0] == 0 and set(np.diff(doc.segments).tolist()) <= {0, 1}
  # A segment never spans two pages.
  change = np.diff(doc.pages) != 0
  assert (np.diff(doc.segments)[change] == 1).all()


def _lines(doc):
  """Segments as strings, in order."""
  out = {}
  for w, s in zip(doc.words, doc.segments.tolist()):
    out.setdefault(s, []).append(w)
  return [" ".join(v) for v in out.values()]


# --------------------------------------------------------------------------- content
def test_words_order_pages_segments(invoice_pdf):
  doc = read_pdf(invoice_pdf)
  _check_invariants(doc)
  assert doc.id == "invoice"
  assert doc.num_pages == 3
  np.testing.assert_allclose(doc.page_sizes, INVOICE_SIZES)
  # Reading order: rows top to bottom, left to right, whatever the drawing order.
  expected = sorted(INVOICE, key=lambda l: (l[0], l[2], l[1]))
  assert _lines(doc) == [l[3] for l in expected]
  assert list(doc.words) == " ".join(l[3] for l in expected).split()
  counts = [len(l[3].split()) for l in expected]
  np.testing.assert_array_equal(doc.pages, np.repeat([l[0] for l in expected], counts))


def test_layout_order_does_not_depend_on_drawing_order(tmp_path):
  a = read_pdf(_save(tmp_path / "a.pdf", _invoice_figures(1)))
  b = read_pdf(_save(tmp_path / "b.pdf", _invoice_figures(2)))
  assert a.words == b.words
  np.testing.assert_array_equal(a.boxes, b.boxes)
  np.testing.assert_array_equal(a.segments, b.segments)


def test_stream_order_follows_drawing_order(tmp_path):
  figures = _invoice_figures(3)
  drawn = [t.get_text() for fig in figures for t in fig.texts]
  doc = read_pdf(_save(tmp_path / "s.pdf", figures), order="stream")
  _check_invariants(doc)
  assert _lines(doc) == drawn


@pytest.mark.parametrize("fonttype", [3, 42])
def test_tight_boxes_match_agg_ink(tmp_path, fonttype):
  """Glyph-tight word boxes within 0.75 pt of the ink that matplotlib's Agg draws."""
  fig = _box_figure()
  doc = read_pdf(_save(tmp_path / "boxes.pdf", [fig], fonttype=fonttype))
  ink = _agg_ink_boxes(fig)
  assert sorted(doc.words) == sorted(ink)
  for word, box in zip(doc.words, doc.boxes):
    np.testing.assert_allclose(box, ink[word], atol=0.75, err_msg=word)
  # And with the known anchors: left end at x, bottom on the baseline (for
  # words without descenders: not "glyphy", whose y goes below, nor "9,00"),
  # top about a cap height above.
  by_word = dict(zip(doc.words, doc.boxes))
  for x, base, s, fs in BOX_WORDS:
    box = by_word[s]
    assert abs(box[0] - x) < 0.15 * fs, s
    if s not in ("glyphy", "9,00"):
      assert abs(box[3] - base) < 0.05 * fs, s
    assert 0.55 * fs < base - box[1] < 0.95 * fs, s


def test_loose_boxes_hold_the_tight_ones(box_pdf):
  tight, loose = read_pdf(box_pdf), read_pdf(box_pdf, boxes="loose")
  assert tight.words == loose.words
  assert (loose.boxes[:, :2] <= tight.boxes[:, :2] + 0.5).all()
  assert (loose.boxes[:, 2:] >= tight.boxes[:, 2:] - 0.5).all()
  # Font-height cells: one height per font size, whatever the letters.
  size_of = {s: fs for _, _, s, fs in BOX_WORDS}
  heights = {}
  for word, box in zip(loose.words, loose.boxes):
    heights.setdefault(size_of[word], []).append(box[3] - box[1])
  assert len(heights) == 6
  for fs, h in heights.items():
    assert max(h) - min(h) < 1e-3
    assert 1.0 * fs < h[0] < 1.4 * fs


def test_dpi_scales_boxes_and_page_sizes(invoice_pdf):
  a, b = read_pdf(invoice_pdf), read_pdf(invoice_pdf, dpi=144)
  assert a.words == b.words
  np.testing.assert_allclose(b.boxes, 2 * a.boxes, rtol=1e-6, atol=1e-3)
  np.testing.assert_allclose(b.page_sizes, 2 * a.page_sizes)
  np.testing.assert_array_equal(a.normalized_boxes(), b.normalized_boxes())


def test_reading_is_deterministic(invoice_pdf):
  a, b = read_pdf(invoice_pdf), read_pdf(invoice_pdf)
  assert a.words == b.words
  for field in ("boxes", "pages", "page_sizes", "segments"):
    np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


def test_page_selection(invoice_pdf):
  full = read_pdf(invoice_pdf)
  doc = read_pdf(invoice_pdf, pages=[2, 0])
  _check_invariants(doc)
  np.testing.assert_allclose(doc.page_sizes, [INVOICE_SIZES[2], INVOICE_SIZES[0]])
  for k, p in enumerate([2, 0]):
    assert [w for w, q in zip(doc.words, doc.pages) if q == k] == \
        [w for w, q in zip(full.words, full.pages) if q == p]
  assert read_pdf(invoice_pdf, pages=1).num_pages == 1
  for bad, match in (([5], "page 5 does not exist"), ([0, 0], "selected twice"),
                     ([], "no pages"), (["1"], "integers"), ([-1], "does not exist")):
    with pytest.raises(DocumentError, match=match) as e:
      read_pdf(invoice_pdf, pages=bad)
    assert "invoice.pdf" in str(e.value)


def test_bad_options(invoice_pdf):
  for kw in (dict(order="columns"), dict(boxes="ink"), dict(dpi=0), dict(dpi=float("nan")),
             dict(segment_gap=-1)):
    with pytest.raises(ValueError):
      read_pdf(invoice_pdf, **kw)


def test_segment_gap_splits_wide_gaps(tmp_path):
  fig = _figure(LETTER)
  _text(fig, LETTER, 50, 100, "Name:")
  _text(fig, LETTER, 50 + 60, 100, "Ada")  # ~2 line heights after "Name:" (~34 pt wide)
  path = _save(tmp_path / "gap.pdf", [fig])
  assert _lines(read_pdf(path)) == ["Name:", "Ada"]
  assert _lines(read_pdf(path, segment_gap=3.0)) == ["Name: Ada"]


def test_end_of_line_hyphen_and_invisible_characters(tmp_path):
  fig = _figure(LETTER)
  _text(fig, LETTER, 50, 100, "The quick fox manip-")
  _text(fig, LETTER, 50, 115, "ulation co\u00adoperate end")
  path = _save(tmp_path / "hyphen.pdf", [fig])
  docs, report = read_pdfs([path])
  doc = docs[0]
  # PDFium joins "manip-|ulation" (U+0002); each piece keeps its own line and box.
  assert _lines(doc) == ["The quick fox manip-", "ulation cooperate end"]
  i = doc.words.index("manip-")
  assert doc.boxes[i + 1, 1] > doc.boxes[i, 3]  # "ulation" is below "manip-"
  assert doc.boxes[i + 1, 0] < doc.boxes[i, 0]
  assert report.stats["dropped_control_chars"] == 1  # the soft hyphen


def test_rotated_text_on_rotated_page_reads_upright(tmp_path):
  """Text drawn at 90 degrees on a page shown with /Rotate 90: upright rows."""
  fig = _figure(LETTER)
  # Drawn bottom row (as shown) first.
  for x, s in ((140, "Second line here"), (100, "Landscape invoice total")):
    fig.text(x / LETTER[0], 0.1, s, rotation=90, rotation_mode="anchor", fontsize=12)
  src = _save(tmp_path / "vertical.pdf", [fig])
  vertical = read_pdf(src)
  # On the unrotated page the words are vertical: PDFium's lines, tall boxes.
  assert sorted(_lines(vertical)) == ["Landscape invoice total", "Second line here"]
  w = vertical.boxes[:, 2:] - vertical.boxes[:, :2]
  assert (w[:, 1] > w[:, 0]).all()
  pdf = pdfium.PdfDocument(src)
  pdf[0].set_rotation(90)
  pdf.save(tmp_path / "landscape.pdf")
  pdf.close()
  doc = read_pdf(tmp_path / "landscape.pdf")
  _check_invariants(doc)
  np.testing.assert_allclose(doc.page_sizes, [LETTER[::-1]])
  assert _lines(doc) == ["Landscape invoice total", "Second line here"]
  w = doc.boxes[:, 2:] - doc.boxes[:, :2]
  assert (w[:, 0] > w[:, 1]).all()
  # Upright as displayed: text angle and page rotation cancel out.
  for path, upright in ((src, False), (tmp_path / "landscape.pdf", True)):
    pdf = pdfium.PdfDocument(path)
    page = pdf[0]
    frame = pdf_text.page_frame(page)
    words, _ = pdf_text.page_words(pdfium, page, frame)
    assert len(words) == 6 and (words.upright == upright).all(), path
    page.close()
    pdf.close()


# --------------------------------------------------------------------------- rotation, crop box
def _edited(src, dst, rotation=0, cropbox=None):
  pdf = pdfium.PdfDocument(src)
  for page in pdf:
    page.set_rotation(rotation)
    if cropbox is not None:
      page.set_cropbox(*cropbox)
  pdf.save(dst)
  pdf.close()
  return dst


@pytest.mark.parametrize("rotation", [90, 180, 270])
def test_rotated_pages(tmp_path, box_pdf, rotation):
  plain = read_pdf(box_pdf)
  doc = read_pdf(_edited(box_pdf, tmp_path / "rot.pdf", rotation))
  _check_invariants(doc)
  # Sideways or upside down, the words are not upright: their order may
  # change, so compare word by word (they are unique).
  assert sorted(doc.words) == sorted(plain.words)
  order = [plain.words.index(word) for word in doc.words]
  w, h = SMALL
  x0, y0, x1, y1 = plain.boxes[order].T.astype(np.float64)
  # Turning the page clockwise moves the point (u, v) to (h - v, u), and so on.
  expected = {90: [h - y1, x0, h - y0, x1], 180: [w - x1, h - y1, w - x0, h - y0],
              270: [y0, w - x1, y1, w - x0]}[rotation]
  np.testing.assert_allclose(doc.boxes, np.stack(expected, 1), atol=1e-3)
  np.testing.assert_allclose(doc.page_sizes, [SMALL if rotation == 180 else SMALL[::-1]])


def test_crop_box(tmp_path, box_pdf):
  plain = read_pdf(box_pdf)
  # Keep x in [20, 340], y (PDF, up) in [80, 270]: cuts away the bottom row.
  crop = (20.0, 80.0, 340.0, 270.0)
  docs, report = read_pdfs([_edited(box_pdf, tmp_path / "crop.pdf", cropbox=crop)])
  doc = docs[0]
  _check_invariants(doc)
  np.testing.assert_allclose(doc.page_sizes, [[320.0, 190.0]])
  top_offset = SMALL[1] - crop[3]
  kept = [i for i, b in enumerate(plain.boxes) if b[1] < SMALL[1] - crop[1]]
  assert doc.words == tuple(plain.words[i] for i in kept)
  np.testing.assert_allclose(doc.boxes, plain.boxes[kept] - [crop[0], top_offset] * 2,
                             atol=1e-3)
  skipped = sorted(w for w in plain.words if w not in doc.words)
  assert skipped == ["Zürich", "a.b"]
  assert len(report.skipped_words) == 2
  assert all("outside the visible page" in reason for _, reason in report.skipped_words)
  # A crop box with no words in it: nothing to read, and the message says why.
  empty = _edited(box_pdf, tmp_path / "nothing.pdf", cropbox=(100.0, 250.0, 190.0, 288.0))
  with pytest.raises(DocumentError, match="all 8 words of the PDF lie outside"):
    read_pdf(empty)


@pytest.mark.parametrize("rotation", [0, 90, 180, 270])
def test_page_frame_matches_pdfium_page_to_device(tmp_path, box_pdf, rotation):
  """Our user-space -> displayed mapping against PDFium's FPDF_PageToDevice."""
  path = _edited(box_pdf, tmp_path / "e.pdf", rotation, cropbox=(15.0, 25.0, 300.0, 260.0))
  pdf = pdfium.PdfDocument(path)
  page = pdf[0]
  frame = pdf_text.page_frame(page)
  width, height = frame.size
  assert (width, height) == pytest.approx(page.get_size())
  k = 100  # PageToDevice rounds to device pixels: use 100 pixels per point
  pts = np.array([[15.0, 25.0], [300.0, 260.0], [40.5, 200.25], [290.0, 30.0]])
  dx, dy = ctypes.c_int(), ctypes.c_int()
  for x, y in pts:
    pdfium_raw.FPDF_PageToDevice(page.raw, 0, 0, int(width * k), int(height * k), 0, x, y, dx, dy)
    got = frame.to_display(np.array([x]), np.array([y]))
    np.testing.assert_allclose([got[0][0], got[1][0]], [dx.value / k, dy.value / k], atol=0.02)
  page.close()
  pdf.close()


# --------------------------------------------------------------------------- bad input
def _image_only_figure():
  fig = _figure((300, 300))
  ax = fig.add_axes([0, 0, 1, 1])
  ax.imshow(np.random.default_rng(0).random((16, 16)))
  ax.axis("off")
  return fig


def test_image_only_pdf_says_no_text_layer(tmp_path):
  path = _save(tmp_path / "scan.pdf", [_image_only_figure()])
  with pytest.raises(DocumentError, match="no text layer") as e:
    read_pdf(path)
  assert "scan.pdf" in str(e.value) and "OCR" in str(e.value)
  blank = _save(tmp_path / "blank.pdf", [_figure(LETTER)])
  with pytest.raises(DocumentError, match="no text layer"):
    read_pdf(blank)


def test_pages_without_text_are_reported(tmp_path):
  fig = _figure(LETTER)
  _text(fig, LETTER, 50, 50, "Cover letter")
  path = _save(tmp_path / "mixed.pdf", [fig, _image_only_figure()])
  docs, report = read_pdfs([path])
  assert docs[0].num_pages == 2 and docs[0].words == ("Cover", "letter")
  assert report.stats["pages_without_text"] == {"mixed": [1]}
  with pytest.raises(DocumentError, match="no text layer"):
    read_pdf(path, pages=[1])


def _encrypt(source, path, user_password, owner_password=None):
  pypdf = pytest.importorskip("pypdf")
  writer = pypdf.PdfWriter(clone_from=source)
  writer.encrypt(user_password, owner_password, algorithm="RC4-128")  # RC4: no `cryptography`
  writer.write(path)
  return path


def test_encrypted_pdf(tmp_path, invoice_pdf, monkeypatch):
  monkeypatch.delenv("FLAXDOC_PDF_PASSWORD", raising=False)
  path = _encrypt(invoice_pdf, tmp_path / "locked.pdf", "s3cret")
  with pytest.raises(DocumentError, match="encrypted") as e:
    read_pdf(path)
  assert "locked.pdf" in str(e.value) and "password" in str(e.value)
  with pytest.raises(DocumentError, match="wrong"):
    read_pdf(path, password="guess")
  opened = read_pdf(path, password="s3cret")
  plain = read_pdf(invoice_pdf)
  assert opened.words == plain.words
  np.testing.assert_allclose(opened.boxes, plain.boxes)


def test_password_from_the_environment(tmp_path, invoice_pdf, monkeypatch):
  """Command lines cannot pass `password=`: $FLAXDOC_PDF_PASSWORD opens what needs one."""
  locked = _encrypt(invoice_pdf, tmp_path / "locked.pdf", "s3cret")
  # Owner password only: opens without one, and must still open with a wrong one set.
  owner = _encrypt(invoice_pdf, tmp_path / "owner.pdf", "", "0wner-only")
  plain = read_pdf(invoice_pdf)
  monkeypatch.delenv("FLAXDOC_PDF_PASSWORD", raising=False)
  with pytest.raises(DocumentError, match="encrypted") as e:
    read_pdf(locked)
  for way in ("read_pdf(..., password=...)", "read_pdfs(..., passwords=", "FLAXDOC_PDF_PASSWORD",
              "locked.pdf"):
    assert way in str(e.value)

  monkeypatch.setenv("FLAXDOC_PDF_PASSWORD", "not-it-42")
  with pytest.raises(DocumentError, match="FLAXDOC_PDF_PASSWORD is wrong") as e:
    read_pdf(locked)
  assert "not-it-42" not in str(e.value)  # a password is never shown
  assert read_pdf(owner).words == plain.words

  monkeypatch.setenv("FLAXDOC_PDF_PASSWORD", "s3cret")
  for path in (locked, owner, invoice_pdf):  # unencrypted and owner-only PDFs are unaffected
    doc = read_pdf(path)
    assert doc.words == plain.words
    np.testing.assert_allclose(doc.boxes, plain.boxes)
  with pytest.raises(DocumentError, match="password given is wrong"):
    read_pdf(locked, password="guess")  # an argument wins over the environment
  docs, report = read_pdfs([locked, owner], passwords={"owner.pdf": "0wner-only"})
  assert [d.id for d in docs] == ["locked", "owner"] and not report.skipped_documents
  assert "s3cret" not in report.summary() and "0wner" not in report.summary()


def test_report_says_pages_come_from_the_text_layer(invoice_pdf):
  docs, report = read_pdfs([invoice_pdf])
  assert docs[0].num_pages == 3
  assert report.page_sources == {"invoice": ["text layer"] * 3}
  assert "words from: 3 pages, all from the PDF's text layer" in report.summary()


def _corrupt_files(tmp_path, invoice_pdf):
  data = invoice_pdf.read_bytes()
  rng = np.random.default_rng(0)
  files = {
      "half.pdf": (data[:len(data) // 2], "truncated"),
      "cut.pdf": (data[:-20], "truncated"),
      "garbage.pdf": (b"%PDF-1.7\n" + rng.integers(0, 256, 4000, np.uint8).tobytes() +
                      b"\n%%EOF\n", "not a valid PDF or corrupt"),
      "image.pdf": (b"\x89PNG\r\n\x1a\n" + bytes(64), "not a PDF file.*PNG"),
      "notes.pdf": (b"just some text\n", "not a PDF file"),
      "empty.pdf": (b"", "not a PDF file.*empty"),
  }
  out = {}
  for name, (content, match) in files.items():
    (tmp_path / name).write_bytes(content)
    out[tmp_path / name] = match
  return out


def test_corrupt_truncated_and_non_pdf_files(tmp_path, invoice_pdf):
  for path, match in _corrupt_files(tmp_path, invoice_pdf).items():
    with pytest.raises(DocumentError, match=match) as e:
      read_pdf(path)
    assert str(path) in str(e.value)
  with pytest.raises(DocumentError, match="no such file"):
    read_pdf(tmp_path / "missing.pdf")
  with pytest.raises(DocumentError, match="directory"):
    read_pdf(tmp_path)


# --------------------------------------------------------------------------- several files
def test_read_pdfs_records_failures_per_file(tmp_path, invoice_pdf):
  bad = _corrupt_files(tmp_path, invoice_pdf)
  other = tmp_path / "sub"
  other.mkdir()
  twin = other / "invoice.pdf"  # same file name as invoice_pdf, another folder
  twin.write_bytes(invoice_pdf.read_bytes())
  paths = [invoice_pdf, *bad, twin, tmp_path / "missing.pdf"]
  docs, report = read_pdfs(paths)
  assert [d.id for d in docs] == ["invoice", str(twin)]
  assert report.loaded == 2
  skipped = dict(report.skipped_documents)
  assert set(skipped) == {str(p) for p in bad} | {str(tmp_path / "missing.pdf")}
  for path, reason in skipped.items():
    assert path in reason
  assert report.stats["pages"] == 6
  assert "skipped documents: 7" in report.summary()
  with pytest.raises(DocumentError, match="truncated"):
    read_pdfs([invoice_pdf, *bad], on_error="raise")
  with pytest.raises(ValueError):
    read_pdfs([invoice_pdf], on_error="ignore")
  with pytest.raises(TypeError):
    read_pdfs([invoice_pdf], password="x")


def test_read_pdfs_passwords_by_name(tmp_path, invoice_pdf, monkeypatch):
  monkeypatch.delenv("FLAXDOC_PDF_PASSWORD", raising=False)
  path = _encrypt(invoice_pdf, tmp_path / "locked.pdf", "pw")
  docs, report = read_pdfs([path], passwords={"locked.pdf": "pw"})
  assert len(docs) == 1 and not report.skipped_documents
  docs, report = read_pdfs([path])
  assert not docs and "encrypted" in report.skipped_documents[0][1]


# --------------------------------------------------------------------------- speed
def test_ten_pages_read_whole(tmp_path):
  """3,200 words on 10 pages (80 lines of 4 words a page), every word and line read.

  The time is printed, not asserted (tests check correctness; a slower CI machine took
  1.23 s where this one takes ~0.3 s)."""
  rng = random.Random(0)
  vocab = ["Invoice", "Total", "9.00", "ACME", "Corp.", "Street", "Date:", "2024-01-05", "Qty",
           "Price", "Amount", "due", "VAT", "20%"]
  fig = _figure(LETTER)
  for row in range(40):
    for col in range(2):
      _text(fig, LETTER, 40 + 280 * col, 40 + 18 * row,
            " ".join(rng.choice(vocab) for _ in range(4)), fontsize=10)
  page = _save(tmp_path / "page.pdf", [fig])
  # matplotlib takes seconds per page of text: draw one page, copy it 10 times.
  ten = pdfium.PdfDocument.new()
  one = pdfium.PdfDocument(page)
  ten.import_pages(one, [0] * 10)
  ten.save(tmp_path / "ten.pdf")
  ten.close()
  one.close()
  start = time.perf_counter()
  doc = read_pdf(tmp_path / "ten.pdf")
  print(f"{len(doc)} words in {time.perf_counter() - start:.2f} s")
  assert len(doc) == 10 * 40 * 2 * 4 and doc.num_pages == 10
  assert len(set(doc.segments.tolist())) == 10 * 40 * 2
