"""`predict` mode end to end on born-digital PDFs: synthetic documents written as PDFs.

Uses the session's tiny trained run (`conftest.trained`), writes synthetic documents as PDFs
(`flaxdoc.data.synthetic.render_pdf`), and runs `inference.run_predict` on a
glob of them, next to an image-only and a truncated PDF, which are skipped and
reported by file.
"""

import json
import os
import sys

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


@pytest.fixture(scope="module")
def pdf_dir(tmp_path_factory):
  """Two synthetic PDFs (one page, two pages), an image-only PDF and a truncated one."""
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
  return folder, docs


def _predict_config(source, tmp_path):
  config = tiny_config(mode="predict")
  config.predict.input = str(source)
  config.predict.output = str(tmp_path / "pred.jsonl")
  config.predict.draw = True
  config.predict.draw_dir = str(tmp_path / "png")
  return config


def test_predict_from_pdfs(trained, pdf_dir, tmp_path, capsys):
  folder, docs = pdf_dir
  out = inference.run_predict(_predict_config(folder / "*.pdf", tmp_path), trained[0])
  assert out == str(tmp_path / "pred.jsonl")

  # Unreadable files are skipped, each reported with its path and why.
  printed = capsys.readouterr().out
  assert "loaded 2 documents" in printed and "skipped documents: 2" in printed
  assert str(folder / "scan.pdf") in printed and "no text layer" in printed
  assert str(folder / "broken.pdf") in printed and "truncated" in printed

  # One row per readable PDF, in file name order, with the file name as id.
  rows = [json.loads(line) for line in open(out, encoding="utf-8")]
  assert [r["id"] for r in rows] == [d.id for d in docs]
  num_entities = 0
  for row, doc in zip(rows, docs):
    back = read_pdf(folder / f"{doc.id}.pdf")  # what predict read: entity words index it
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
  assert pngs == sorted(f"{d.id}_p{p}.png" for d in docs for p in range(d.num_pages))
  for name in pngs:
    with Image.open(tmp_path / "png" / name) as img:
      img.verify()
    with Image.open(tmp_path / "png" / name) as img:
      assert img.format == "PNG" and img.width > 0 and img.height > 0


def test_predict_without_a_readable_pdf_names_the_files(trained, pdf_dir, tmp_path, capsys):
  folder, _ = pdf_dir
  with pytest.raises(ValueError, match="no readable PDF"):
    inference.run_predict(_predict_config(folder / "[bs][rc]*.pdf", tmp_path), trained[0])
  printed = capsys.readouterr().out
  assert str(folder / "scan.pdf") in printed and str(folder / "broken.pdf") in printed
  assert not os.path.exists(tmp_path / "pred.jsonl")
