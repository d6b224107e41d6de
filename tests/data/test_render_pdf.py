"""`flaxdoc.data.synthetic.render_pdf`: synthetic documents -> PDFs -> `read_pdf`, round trip.

The reader is the judge: every word must come back with the same text, page
and (nearly) the same box, page sizes exactly, and, for documents whose words
come in visual line order, in the same order.
"""

import collections
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("pypdfium2")

# pylint: disable=g-import-not-at-top,wrong-import-position
from flaxdoc.data.document import Document
from flaxdoc.data.pdf import read_pdf
from flaxdoc.data.synthetic import SyntheticConfig, make_document
from flaxdoc.data.synthetic import render_pdf
# pylint: enable=g-import-not-at-top,wrong-import-position

ROOT = Path(__file__).resolve().parents[2]
# Words in visual line order (the naive OCR order): what read_pdf's layout order gives.
LINE_ORDER = SyntheticConfig(interleave_columns=1.0)


@pytest.fixture(scope="module")
def round_trips(tmp_path_factory):
  """(original, read back) for: a default document, one in line order, two pages, OCR noise."""
  out = tmp_path_factory.mktemp("render")
  docs = [make_document(0, 0), make_document(0, 1, LINE_ORDER),
          make_document(0, 3, SyntheticConfig(min_pages=2, max_pages=2, interleave_columns=1.0)),
          make_document(1, 5, SyntheticConfig(ocr_noise=0.1))]
  assert [d.num_pages for d in docs] == [1, 1, 2, 1]
  return [(d, read_pdf(render_pdf.write_pdf(d, out / f"{d.id}.pdf"))) for d in docs]


def _match(doc, back):
  """Index in `doc` of each word of `back`: same text and page, nearest box."""
  free = collections.defaultdict(list)
  for i, (w, p) in enumerate(zip(doc.words, doc.pages.tolist())):
    free[w, p].append(i)
  out = []
  for w, p, box in zip(back.words, back.pages.tolist(), back.boxes):
    cands = free[w, p]
    j = min(cands, key=lambda i: np.abs(doc.boxes[i] - box).sum())
    cands.remove(j)
    out.append(j)
  return np.array(out)


def test_same_words_pages_and_page_sizes(round_trips):
  for doc, back in round_trips:
    assert back.id == doc.id  # the file name
    assert collections.Counter(zip(back.words, back.pages.tolist())) == \
        collections.Counter(zip(doc.words, doc.pages.tolist()))
    assert back.num_pages == doc.num_pages
    np.testing.assert_allclose(back.page_sizes, doc.page_sizes, atol=1e-3)
    assert not back.repairs  # no box stuck out of its page


def test_line_order_documents_come_back_in_their_order(round_trips):
  for doc, back in round_trips[1:3]:
    assert back.words == doc.words
    np.testing.assert_array_equal(back.pages, doc.pages)
    # read_pdf joins neighbouring pieces of a line into one segment, but never
    # splits a segment of the original.
    for s in set(doc.segments.tolist()):
      assert len(set(back.segments[doc.segments == s].tolist())) == 1, s


def test_boxes_come_back_inside_and_close(round_trips):
  err, rel = [], []
  for doc, back in round_trips:
    orig = doc.boxes[_match(doc, back)].astype(np.float64)
    height = (orig[:, 3] - orig[:, 1])[:, None]
    err.append(back.boxes - orig)
    rel.append((back.boxes - orig) / height)
  err, rel = np.concatenate(err), np.concatenate(rel)
  # Measured on these 4 documents (300-dpi pixels, words 27-78 px tall),
  # as (read back - original) for x0, y0, x1, y1:
  #   left edge: |dx0| <= 0.02 px;
  #   inside the original box to 0.012 box heights (0.51 px, at the top);
  #   largest |error| 40.4 px: the top of a "______________" signature line
  #   (its ink is a thin bar at the bottom of the box); right edge 24.7 px,
  #   bottom 18.2 px; median |error| 0.011, 0.094 and 0.223 box heights at the
  #   top, right and bottom (words without descenders end on the baseline).
  assert np.abs(err[:, 0]).max() < 0.1
  assert (rel[:, :2] > -0.02).all() and (rel[:, 2:] < 0.02).all()
  assert np.abs(err).max() < 45.0
  median = np.median(np.abs(rel), axis=0)
  assert (median < [0.01, 0.05, 0.15, 0.3]).all(), median
  # Words in capitals or digits, neither shrunk nor below the box: their top is
  # the cap height, 0.03 box heights below the box top.
  assert np.quantile(np.abs(rel[:, 1]), 0.25) < 0.05


def test_dpi_maps_pixels_to_points(tmp_path):
  doc = make_document(0, 1, LINE_ORDER)
  path = render_pdf.write_pdf(doc, tmp_path / "a4.pdf", dpi=300)
  points = read_pdf(path)
  np.testing.assert_allclose(points.page_sizes, doc.page_sizes * 72 / 300, atol=1e-3)
  back = read_pdf(path, dpi=300)
  assert back.words == doc.words
  np.testing.assert_allclose(back.page_sizes, doc.page_sizes, atol=1e-3)
  np.testing.assert_allclose(back.boxes[:, 0], doc.boxes[:, 0], atol=0.1)
  with pytest.raises(ValueError, match="dpi"):
    render_pdf.write_pdf(doc, tmp_path / "x.pdf", dpi=0)


def test_write_pdfs_safe_unique_names_and_same_bytes(tmp_path, caplog):
  def tiny(doc_id, words=("Total", "9.00")):
    return Document.create(doc_id, words, [[10, 10, 60, 22], [70, 10, 100, 22]],
                           page_sizes=[[120, 40]])
  cjk = "\u6f22\u5b57"
  docs = [tiny("a/b"), tiny("a_b"), tiny("../x"), tiny(f"Z\u00fcrich {cjk}", ("Z\u00fcrich", cjk))]
  paths = render_pdf.write_pdfs(docs, tmp_path / "out")
  names = [p.name for p in paths]
  assert names == ["a_b.pdf", "a_b-2.pdf", "_x.pdf", f"Z\u00fcrich_{cjk}.pdf"]
  assert all(p.parent == tmp_path / "out" for p in paths)
  assert read_pdf(paths[0]).words == ("Total", "9.00")
  # No glyphs for CJK in DejaVu Sans Mono: written anyway, and said so.
  assert "missing" in caplog.text and cjk in caplog.text
  # No creation date in the file: the same document gives the same bytes.
  again = render_pdf.write_pdf(docs[0], tmp_path / "again.pdf")
  assert again.read_bytes() == paths[0].read_bytes()


def test_without_matplotlib_the_error_says_what_to_install(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "matplotlib", None)
  doc = Document.create("d", ["x"], [[1, 1, 5, 5]], page_sizes=[[10, 10]])
  with pytest.raises(ImportError, match="pip install matplotlib"):
    render_pdf.write_pdf(doc, tmp_path / "d.pdf")


def test_cli_writes_pdfs_and_prints_their_paths(tmp_path):
  out = tmp_path / "pdfs"
  proc = subprocess.run([sys.executable, "-m", "flaxdoc.data.synthetic", "--num", "2", "--seed",
                         "4", "--pdf", str(out)], cwd=ROOT, capture_output=True, text=True,
                        timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  expected = [out / "synthetic-4-0.pdf", out / "synthetic-4-1.pdf"]
  assert proc.stdout.split() == [str(p) for p in expected]
  for k, path in enumerate(expected):
    assert collections.Counter(read_pdf(path).words) == \
        collections.Counter(make_document(4, k).words)
