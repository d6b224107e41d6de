"""`flaxdoc.data.ocr`: images and scanned PDFs -> Documents, against words whose place is known.

Synthetic documents rendered to PNG (`ocr_samples.render_pages`) are read by
each engine and matched to the generator's words (normalised text, box IoU >=
0.5): recall >= 0.9 and mean IoU >= 0.7. Multi-page TIFFs and image-only PDFs
give one page per page, PDF boxes in points; bad files give `DocumentError`s
naming the file. Engines not installed are skipped with the reason.
"""

import json
import logging
import os
import sys

import numpy as np
import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("pypdfium2")

# pylint: disable=g-import-not-at-top,wrong-import-position
from PIL import Image

from flaxdoc.data.document import Document, DocumentError, Entity, PageImage
from flaxdoc.data.jsonl import read_jsonl, write_jsonl
from flaxdoc.data.ocr import ENGINES, OcrUnavailableError, OcrWord, get_engine, read_document, \
    read_documents
from flaxdoc.data.ocr import __main__ as ocr_main
from flaxdoc.data.ocr import matching
from flaxdoc.data.synthetic import make_document

sys.path.insert(0, os.path.dirname(__file__))
from ocr_samples import render_pages, spaced, text_image  # pylint: disable=import-error
# pylint: enable=g-import-not-at-top,wrong-import-position


def _engine(name):
  try:
    get_engine(name)
  except OcrUnavailableError as e:
    pytest.skip(f"OCR engine {name} not installed: {e}")
  return name


@pytest.fixture(scope="module")
def synthetic_png(tmp_path_factory):
  """A one-page synthetic form as a ~150-dpi PNG, and its reference words."""
  folder = tmp_path_factory.mktemp("synthetic")
  _, pictures, reference = render_pages(spaced(make_document(0, 0)), folder, scale=0.5)
  path = folder / "form.png"
  pictures[0].save(path)
  return path, reference


@pytest.fixture(scope="module")
def text_pages():
  return [text_image(["Invoice number 4711", "Total due 12.50"]),
          text_image(["Second page here", "Signed by Alice"])]


# ----------------------------------------------------------------------------- accuracy
@pytest.mark.parametrize("engine", ENGINES)
def test_synthetic_page_words_and_boxes(engine, synthetic_png):
  path, reference = synthetic_png
  doc = read_document(path, engine=_engine(engine))
  scores = matching.word_scores(reference, doc)
  assert scores.recall >= 0.9, (engine, scores)
  assert scores.mean_iou >= 0.7, (engine, scores)
  assert scores.precision >= 0.8, (engine, scores)
  # Page size is the picture's; the page image is the file itself.
  with Image.open(path) as im:
    np.testing.assert_array_equal(doc.page_sizes, [im.size])
  assert doc.page_images == (PageImage(str(path), 0, *map(float, im.size)),)
  # Segments are lines: a segment's words share a row.
  for s in set(doc.segments.tolist()):
    b = doc.boxes[doc.segments == s]
    centre = (b[:, 1] + b[:, 3]) / 2
    assert centre.max() - centre.min() <= (b[:, 3] - b[:, 1]).max(), s


# ----------------------------------------------------------------------------- pages
def test_multipage_tiff_gives_one_page_per_frame(tmp_path, text_pages):
  engine = _engine("tesseract")
  path = tmp_path / "two.tiff"
  text_pages[0].save(path, save_all=True, append_images=text_pages[1:])
  doc = read_document(path, engine=engine)
  assert doc.num_pages == 2
  assert [im.index for im in doc.page_images] == [0, 1]
  by_page = [{w.lower() for w, p in zip(doc.words, doc.pages) if p == k} for k in range(2)]
  assert {"invoice", "4711", "total"} <= by_page[0]
  assert {"second", "alice"} <= by_page[1]


def test_scanned_pdf_gives_pages_in_points(tmp_path, text_pages):
  """An image-only PDF (Pillow writes one) is rendered and OCR'd; boxes come back in points."""
  engine = _engine("tesseract")
  path = tmp_path / "scan.pdf"
  text_pages[0].save(path, save_all=True, append_images=text_pages[1:], resolution=100.0)
  doc = read_document(path, engine=engine, dpi=200)
  assert doc.num_pages == 2
  w, h = text_pages[0].size
  np.testing.assert_allclose(doc.page_sizes, [[w * 0.72, h * 0.72]] * 2, atol=1.0)
  assert [im.index for im in doc.page_images] == [0, 1]
  # The same word read from the PNG (pixels at 100 dpi) sits at 0.72 x its pixel box.
  png = tmp_path / "p0.png"
  text_pages[0].save(png)
  direct = read_document(png, engine=engine)
  pairs = matching.match_words(direct.replace(boxes=direct.boxes * 0.72,
                                              page_sizes=direct.page_sizes * 0.72),
                               doc.replace(page_sizes=doc.page_sizes))
  assert len(pairs) >= 3
  assert np.mean([iou for _, _, iou in pairs]) > 0.7


def test_pdf_with_text_layer_needs_no_ocr(tmp_path, monkeypatch):
  doc = make_document(3, 0)
  _, _, reference = render_pages(doc, tmp_path, scale=1.0)
  monkeypatch.setattr("flaxdoc.data.ocr.reader.get_engine",
                      lambda name: pytest.fail("OCR ran on a born-digital page"))
  back = read_document(tmp_path / f"{doc.id}.pdf")
  assert back.words == reference.words
  np.testing.assert_allclose(back.boxes, reference.boxes)
  assert back.page_images[0].path.endswith(".pdf")


# ------------------------------------------------------------------------- where words came from
class _OneWordEngine:
  """Stands in for an OCR engine (no install, no seconds a page): one word a page."""
  name = "tesseract"

  def read(self, image):
    del image
    return [OcrWord("scanned", (10.0, 10.0, 60.0, 30.0), 0, 0, 0.9)]


def _mixed_pdf(path):
  """Page 0 typed (a text layer), page 1 a picture of text only (as scanned)."""
  from matplotlib.backends.backend_pdf import PdfPages  # pylint: disable=import-outside-toplevel
  from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel
  with PdfPages(path) as pdf:
    typed = Figure(figsize=(4, 2))
    typed.text(0.1, 0.5, "Typed invoice 4711")
    pdf.savefig(typed)
    scanned = Figure(figsize=(4, 2))
    ax = scanned.add_axes([0, 0, 1, 1])
    ax.imshow(np.asarray(text_image(["Scanned page"])))
    ax.axis("off")
    pdf.savefig(scanned)
  return path


def test_pages_say_where_their_words_came_from(tmp_path, monkeypatch, caplog):
  """A page with a text layer is not OCR'd and is not reported as OCR'd: reports and logs
  name, per document, the pages read from the text layer and those read by the engine."""
  monkeypatch.setattr("flaxdoc.data.ocr.reader.get_engine", lambda name: _OneWordEngine())
  mixed = _mixed_pdf(tmp_path / "mixed.pdf")
  photo = tmp_path / "photo.png"
  text_image(["Photo"]).save(photo)
  docs, report = read_documents([mixed, photo], engine="tesseract", progress=False)
  assert docs[0].words == ("Typed", "invoice", "4711", "scanned")
  assert report.page_sources == {"mixed": ["text layer", "tesseract"], "photo": ["tesseract"]}
  summary = report.summary()
  assert "words from: 3 pages: 1 from the PDF's text layer, 2 by tesseract" in summary
  assert "mixed: 2 pages: 1 from the PDF's text layer, 1 by tesseract" in summary
  assert "photo: 1 page, by tesseract" in summary
  assert "ocr:tesseract" not in summary
  # A large mixed corpus names the first documents with OCR'd pages, then counts the rest;
  # documents read wholly from their text layer are in the total only.
  from flaxdoc.data import report as report_lib  # pylint: disable=import-outside-toplevel
  big = report_lib.LoadReport("big")
  for k in range(report_lib.MAX_LISTED_DOCUMENTS + 5):
    big.record_page_sources(f"scan{k}", ["tesseract"])
  big.record_page_sources("typed", ["text layer"])
  lines = big.summary().splitlines()
  assert f"    scan{report_lib.MAX_LISTED_DOCUMENTS - 1}: 1 page, by tesseract" in lines
  assert not any(line.startswith(("    typed", f"    scan{report_lib.MAX_LISTED_DOCUMENTS}:"))
                 for line in lines)
  assert lines[-1] == "    ... and 5 more documents with OCR'd pages"
  # Without a report the log says it, for a read from the cache too.
  with caplog.at_level(logging.INFO, "flaxdoc.data.ocr.reader"):
    for _ in range(2):
      read_document(mixed, engine="tesseract", cache_dir=tmp_path / "cache")
  assert caplog.text.count("mixed.pdf: 2 pages: 1 from the PDF's text layer, 1 by tesseract") == 2


def test_encrypted_pdf_on_the_command_line(tmp_path, monkeypatch, capsys):
  """$FLAXDOC_PDF_PASSWORD opens both the text layer and the pages rendered for OCR; the
  password shows in no output and no file written."""
  pypdf = pytest.importorskip("pypdf")
  monkeypatch.setattr("flaxdoc.data.ocr.reader.get_engine", lambda name: _OneWordEngine())
  writer = pypdf.PdfWriter(clone_from=_mixed_pdf(tmp_path / "mixed.pdf"))
  writer.encrypt("s3cret-77", algorithm="RC4-128")  # RC4 needs no `cryptography` package
  locked = tmp_path / "in" / "locked.pdf"
  locked.parent.mkdir()
  writer.write(locked)
  out = tmp_path / "out" / "docs.jsonl"
  args = ["--engine", "tesseract", "--out", str(out), "--cache_dir", str(tmp_path / "out"),
          str(locked)]
  monkeypatch.delenv("FLAXDOC_PDF_PASSWORD", raising=False)
  assert ocr_main.main(args) == 1
  assert "FLAXDOC_PDF_PASSWORD" in capsys.readouterr().out
  monkeypatch.setenv("FLAXDOC_PDF_PASSWORD", "s3cret-77")
  assert ocr_main.main(args) == 0
  docs, _ = read_jsonl(out)
  assert docs[0].words == ("Typed", "invoice", "4711", "scanned")
  printed = capsys.readouterr()
  assert "2 pages: 1 from the PDF's text layer, 1 by tesseract" in printed.out
  assert "s3cret" not in printed.out + printed.err
  written = [f for f in (tmp_path / "out").rglob("*") if f.is_file()]
  assert len(written) == 2  # the JSON Lines and the cache file
  for f in written:
    assert b"s3cret" not in f.read_bytes(), f
  # In Python, by argument: a path's or a file name's password; a wrong one is an error
  # naming the file (the environment's is not tried after a given one).
  monkeypatch.delenv("FLAXDOC_PDF_PASSWORD")
  for passwords in ({str(locked): "s3cret-77"}, {"locked.pdf": "s3cret-77"}):
    docs, report = read_documents([locked], engine="tesseract", progress=False,
                                  passwords=passwords)
    assert docs[0].words == ("Typed", "invoice", "4711", "scanned") and report.loaded == 1
  monkeypatch.setenv("FLAXDOC_PDF_PASSWORD", "s3cret-77")
  with pytest.raises(DocumentError, match="locked.pdf.*password given is wrong"):
    read_document(locked, engine="tesseract", password="wrong")
  # The OCR cache (filled above, keyed by the file's bytes) does not stand in for the password.
  cache = tmp_path / "out"
  assert read_document(locked, engine="tesseract", cache_dir=cache).words[0] == "Typed"
  with pytest.raises(DocumentError, match="locked.pdf.*password given is wrong"):
    read_document(locked, engine="tesseract", password="wrong", cache_dir=cache)
  monkeypatch.delenv("FLAXDOC_PDF_PASSWORD")
  with pytest.raises(DocumentError, match="locked.pdf.*encrypted: give its password"):
    read_document(locked, engine="tesseract", cache_dir=cache)


# ----------------------------------------------------------------------------- errors
def test_bad_files_raise_documented_errors_naming_the_file(tmp_path):
  corrupt = tmp_path / "corrupt.png"
  corrupt.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00garbage" * 20)
  blank = tmp_path / "blank.png"
  Image.new("RGB", (400, 300), "white").save(blank)
  text = tmp_path / "notes.txt"
  text.write_text("just some text\n")
  gif = tmp_path / "anim.gif"
  Image.new("RGB", (20, 20), "white").save(gif)
  engine = _engine("tesseract")
  cases = [(corrupt, "unreadable image"), (blank, "no text found"),
           (text, "unsupported file format: it looks like plain text"),
           (gif, "unsupported file format: it looks like a GIF image"),
           (tmp_path / "missing.png", "no such file")]
  for path, message in cases:
    with pytest.raises(DocumentError, match=message) as info:
      read_document(path, engine=engine)
    assert str(path) in str(info.value)
  # Several files: the bad ones are skipped and reported by file, with the reason.
  good = tmp_path / "good.png"
  text_image(["Hello world 2024"]).save(good)
  docs, report = read_documents([good] + [p for p, _ in cases], engine=engine)
  assert [d.id for d in docs] == ["good"]
  assert [where for where, _ in report.skipped_documents] == [str(p) for p, _ in cases]
  for (_, reason), (_, message) in zip(report.skipped_documents, cases):
    assert message in reason


def test_unknown_engine():
  with pytest.raises(ValueError, match="unknown OCR engine"):
    get_engine("nope")


# ----------------------------------------------------------------------------- formats
def test_page_images_survive_json_lines(tmp_path):
  doc = Document.create("d", ["a", "b"], [[0, 0, 5, 5], [0, 0, 5, 5]], pages=[0, 1],
                        page_sizes=[[10, 10], [10, 20]],
                        page_images=[PageImage("/x/s.tif", 0, 10, 10),
                                     PageImage("/x/s.tif", 1, 10, 20)])
  write_jsonl(tmp_path / "d.jsonl", [doc])
  back, _ = read_jsonl(tmp_path / "d.jsonl")
  assert back[0].page_images == doc.page_images
  with pytest.raises(DocumentError, match="page_images"):
    doc.replace(page_images=[PageImage("/x/s.tif", 0, 10, 10)])
  bad = json.loads((tmp_path / "d.jsonl").read_text())
  bad["page_images"][0]["index"] = -1
  (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n")
  with pytest.raises(DocumentError, match="page_images"):
    read_jsonl(tmp_path / "bad.jsonl")


def test_command_line_writes_json_lines(tmp_path, capsys):
  engine = _engine("tesseract")
  good = tmp_path / "scan.png"
  text_image(["Purchase order 981"]).save(good)
  (tmp_path / "notes.txt").write_text("hi")
  out = tmp_path / "out.jsonl"
  assert ocr_main.main(["--engine", engine, "--out", str(out), str(good),
                        str(tmp_path / "notes.txt")]) == 0
  docs, _ = read_jsonl(out)
  assert [d.id for d in docs] == ["scan"] and "981" in docs[0].words
  assert docs[0].page_images[0].path == str(good)
  printed = capsys.readouterr().out
  assert "notes.txt" in printed and "unsupported file format" in printed


def test_cache_makes_a_second_read_free(tmp_path, monkeypatch):
  engine = _engine("tesseract")
  path = tmp_path / "scan.png"
  text_image(["Cached words 77"]).save(path)
  first = read_document(path, engine=engine, cache_dir=tmp_path / "cache")
  assert len(list((tmp_path / "cache").glob("*.json"))) == 1
  monkeypatch.setattr("flaxdoc.data.ocr.reader.get_engine",
                      lambda name: pytest.fail("OCR ran despite the cache"))
  again = read_document(path, engine=engine, cache_dir=tmp_path / "cache", doc_id="other")
  assert again.id == "other" and again.words == first.words
  np.testing.assert_array_equal(again.boxes, first.boxes)
  assert again.page_images == first.page_images


# ----------------------------------------------------------------------------- matching
def test_box_iou_against_a_loop():
  rng = np.random.default_rng(0)
  corner = rng.uniform(0, 10, (2, 6, 2))
  size = rng.uniform(0, 5, (2, 6, 2))
  a, b = np.concatenate([corner, corner + size], axis=2)  # [6, 4] each
  got = matching.box_iou(a, b)
  for i in range(6):
    for j in range(6):
      ix = max(0.0, min(a[i, 2], b[j, 2]) - max(a[i, 0], b[j, 0]))
      iy = max(0.0, min(a[i, 3], b[j, 3]) - max(a[i, 1], b[j, 1]))
      area = lambda r: max(r[2] - r[0], 0) * max(r[3] - r[1], 0)
      union = area(a[i]) + area(b[j]) - ix * iy
      assert got[i, j] == pytest.approx(ix * iy / union if union > 0 else 0.0)


def test_matching_and_label_transfer():
  gold = Document.create("g", ["Date:", "12", "March", "Name"],
                         [[0, 0, 50, 10], [60, 0, 80, 10], [85, 0, 130, 10], [0, 20, 40, 30]],
                         page_sizes=[[200, 100]],
                         entities=[Entity("question", (0,)), Entity("answer", (1, 2)),
                                   Entity("question", (3,))], relations=[(0, 1)])
  # OCR: "date" (case, colon), "12March" merged, "Nane" misread, an extra mark.
  ocr = Document.create("o", ["DATE", "12March", "Nane", "x"],
                        [[1, 1, 49, 10], [60, 0, 129, 10], [0, 21, 40, 30], [150, 50, 155, 55]],
                        page_sizes=[[200, 100]])
  pairs = matching.match_words(gold, ocr)
  assert [(g, o) for g, o, _ in pairs] == [(0, 0)]
  scores = matching.word_scores(gold, ocr)
  assert (scores.recall, scores.precision) == (0.25, 0.25)
  entities, relations, lost = matching.transfer_entities(gold, ocr)
  # "12March" lies over "12" and "March" of one entity: it takes that entity.
  assert [(e.label, e.words) for e in entities] == [("question", (0,)), ("answer", (1,)),
                                                    ("question", (2,))]
  assert relations == [(0, 1)] and lost == []
  assert matching.normalize("Ｄate:") == "date" and matching.normalize("--") == "--"


# ----------------------------------------------------------------------------- FUNSD
@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_funsd_reread_with_ocr(engine, datasets_dir, tmp_path):
  from flaxdoc.data.funsd import list_funsd_ids, load_funsd  # pylint: disable=import-outside-toplevel
  funsd = datasets_dir / "funsd"
  ids = list_funsd_ids(funsd, "train")[:1]
  gold, _ = load_funsd(funsd, "train", ids=ids)
  docs, report = load_funsd(funsd, "train", ids=ids, ocr=_engine(engine),
                            ocr_cache_dir=tmp_path)
  doc = docs[0]
  assert report.stats["ocr"] == engine and doc.label_set == gold[0].label_set
  # Where the words came from is in the dataset's report (not a log line per form).
  assert report.page_sources == {ids[0]: [engine]}
  assert f"words from: 1 page, by {engine}" in report.summary()
  assert doc.page_images == gold[0].page_images
  np.testing.assert_array_equal(doc.page_sizes, gold[0].page_sizes)
  # Most gold entities keep some OCR words, and labels land on overlapping words.
  assert len(doc.entities) >= 0.5 * len(gold[0].entities)
  assert report.stats["ocr_entities_lost"] == len(gold[0].entities) - len(doc.entities)
  scores = matching.word_scores(gold[0], doc)
  assert scores.recall > 0.3 and scores.mean_iou > 0.5
