"""`predict` mode end to end on born-digital PDFs: synthetic documents written as PDFs.

Uses the session's tiny trained run (`conftest.trained`), writes synthetic documents as PDFs
(`flaxdoc.data.synthetic.render_pdf`), and runs `inference.run_predict` on a
glob of them, next to an image-only and a truncated PDF, which are skipped and
reported by file, and an encrypted one (with pypdf, a test-only dependency),
opened with the command line's password, `$FLAXDOC_PDF_PASSWORD`.
"""

import importlib.util
import json
import logging
import os
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("pypdfium2")

# pylint: disable=g-import-not-at-top,wrong-import-position
from matplotlib.figure import Figure
from PIL import Image

from flaxdoc.data.pdf import read_pdf
from flaxdoc.data.synthetic import SyntheticConfig, make_document
from flaxdoc.data.synthetic.render_pdf import write_pdf
from flaxdoc.train import inference

sys.path.insert(0, os.path.dirname(__file__))
from tiny import tiny_config  # pylint: disable=import-error
# pylint: enable=g-import-not-at-top,wrong-import-position

ENTITY_KEYS = {"label", "text", "words", "word_boxes", "box", "page", "score"}
PASSWORD = "s3cret-91"


@pytest.fixture(scope="module")
def pdf_dir(tmp_path_factory):
  """Two synthetic PDFs (one page, two pages), an image-only PDF, a truncated one and
  (with pypdf) `locked.pdf`, the first encrypted: `(folder, [(id, document)] readable)`."""
  folder = tmp_path_factory.mktemp("pdfs")
  docs = [make_document(5, 0), make_document(5, 1, SyntheticConfig(min_pages=2, max_pages=2))]
  assert [d.num_pages for d in docs] == [1, 2]
  for doc in docs:
    write_pdf(doc, folder / f"{doc.id}.pdf")
  scan = Figure(figsize=(3, 3))
  ax = scan.add_axes([0, 0, 1, 1])
  ax.imshow(np.random.default_rng(0).random((16, 16)))
  ax.axis("off")
  scan.savefig(folder / "scan.pdf")
  data = (folder / f"{docs[0].id}.pdf").read_bytes()
  (folder / "broken.pdf").write_bytes(data[:len(data) // 2])
  readable = [(d.id, d) for d in docs]
  if importlib.util.find_spec("pypdf") is not None:
    import pypdf  # pylint: disable=import-outside-toplevel
    writer = pypdf.PdfWriter(clone_from=folder / f"{docs[0].id}.pdf")
    writer.encrypt(PASSWORD, algorithm="RC4-128")  # RC4 needs no `cryptography` package
    writer.write(folder / "locked.pdf")
    readable.insert(0, ("locked", docs[0]))  # file name order
  return folder, readable


def _predict_config(source, tmp_path):
  config = tiny_config(mode="predict")
  config.predict.input = str(source)
  config.predict.output = str(tmp_path / "pred.jsonl")
  config.predict.draw = True
  config.predict.draw_dir = str(tmp_path / "png")
  return config


def test_predict_from_pdfs(trained, pdf_dir, tmp_path, capsys, caplog, monkeypatch):
  folder, readable = pdf_dir
  monkeypatch.setenv("FLAXDOC_PDF_PASSWORD", PASSWORD)
  with caplog.at_level(logging.DEBUG):
    out = inference.run_predict(_predict_config(folder / "*.pdf", tmp_path), trained[0])
  assert out == str(tmp_path / "pred.jsonl")

  # Unreadable files are skipped, each reported with its path and why.
  printed = capsys.readouterr()
  assert f"loaded {len(readable)} documents" in printed.out
  assert "skipped documents: 2" in printed.out
  assert str(folder / "scan.pdf") in printed.out and "no text layer" in printed.out
  assert str(folder / "broken.pdf") in printed.out and "truncated" in printed.out
  # Every page read came from a text layer, and the report says so (no OCR engine named).
  pages = sum(d.num_pages for _, d in readable)
  assert f"words from: {pages} pages, all from the PDF's text layer" in printed.out

  # One row per readable PDF, in file name order, with the file name as id.
  rows = [json.loads(line) for line in open(out, encoding="utf-8")]
  assert [r["id"] for r in rows] == [doc_id for doc_id, _ in readable]
  num_entities = 0
  for row, (doc_id, doc) in zip(rows, readable):
    back = read_pdf(folder / f"{doc_id}.pdf")  # what predict read: entity words index it
    for e in row["entities"]:
      num_entities += 1
      assert ENTITY_KEYS <= set(e), e
      assert e["text"] == " ".join(back.words[i] for i in e["words"])
      np.testing.assert_allclose(e["word_boxes"], back.boxes[e["words"]], atol=1e-3)
      assert 0 <= e["page"] < doc.num_pages and 0.0 <= e["score"] <= 1.0
      x0, y0, x1, y1 = e["box"]
      assert 0 <= x0 <= x1 <= doc.page_sizes[e["page"], 0] + 1e-3
      assert 0 <= y0 <= y1 <= doc.page_sizes[e["page"], 1] + 1e-3
  assert num_entities > 0  # even a 6-step model tags something: the checks above ran

  # One valid PNG per page.
  pngs = sorted(os.listdir(tmp_path / "png"))
  assert pngs == sorted(f"{i}_p{p}.png" for i, d in readable for p in range(d.num_pages))
  for name in pngs:
    with Image.open(tmp_path / "png" / name) as img:
      img.verify()
    with Image.open(tmp_path / "png" / name) as img:
      assert img.format == "PNG" and img.width > 0 and img.height > 0

  # The password is in no output, log or file (predictions, the run's config.json...).
  assert PASSWORD not in printed.out + printed.err + caplog.text
  written = [f for f in [*tmp_path.rglob("*"), *Path(trained[0]).rglob("*")] if f.is_file()]
  assert tmp_path / "pred.jsonl" in written
  for f in written:
    assert PASSWORD.encode() not in f.read_bytes(), f


def test_predict_without_a_readable_pdf_names_the_files(trained, pdf_dir, tmp_path, capsys):
  folder, _ = pdf_dir
  with pytest.raises(ValueError, match="no readable PDF"):
    inference.run_predict(_predict_config(folder / "[bs][rc]*.pdf", tmp_path), trained[0])
  printed = capsys.readouterr().out
  assert str(folder / "scan.pdf") in printed and str(folder / "broken.pdf") in printed
  assert not os.path.exists(tmp_path / "pred.jsonl")
