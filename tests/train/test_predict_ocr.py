"""`predict` on scans: a born-digital PDF, a scanned (image-only) PDF and a PNG in one glob.

Uses the session's tiny trained run (`conftest.trained`). The scanned PDF and
the PNG are pictures of synthetic documents (`tests/data/ocr_samples.py`), so
OCR finds real words. Each file gets entities, each page a picture drawn over
its page image, and a file that is no document is skipped and reported by name.
"""

import json
import os
import sys

import numpy as np
import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("pypdfium2")

# pylint: disable=g-import-not-at-top,wrong-import-position
from PIL import Image

from flaxdoc.data.ocr import available_engines, pages
from flaxdoc.data.synthetic import make_document
from flaxdoc.train import inference

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "data"))
from ocr_samples import render_pages, spaced  # pylint: disable=import-error
from tiny import tiny_config  # pylint: disable=import-error
# pylint: enable=g-import-not-at-top,wrong-import-position


@pytest.fixture(scope="module")
def engine():
  engines = available_engines()
  if not engines:
    pytest.skip("no OCR engine installed (pip install flaxdoc[ocr]; apt-get install "
                "tesseract-ocr)")
  # Tesseract reads these small pages fastest; either engine would do.
  return "tesseract" if "tesseract" in engines else engines[0]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
  folder = tmp_path_factory.mktemp("mixed")
  work = tmp_path_factory.mktemp("render")
  digital = make_document(5, 0)
  render_pages(digital, folder, scale=1.0)  # writes folder/<id>.pdf with a text layer
  _, pictures, _ = render_pages(spaced(make_document(5, 1)), work, scale=0.5)
  pictures[0].save(folder / "scanned.pdf", resolution=150.0)  # image only: 0.5 px/pt * 300
  _, pictures, _ = render_pages(spaced(make_document(5, 2)), work, scale=0.5)
  pictures[0].save(folder / "photo.png")
  (folder / "readme.txt").write_text("not a document\n")
  return folder, digital.id


def test_predict_on_pdf_scan_and_png(trained, inputs, engine, tmp_path, capsys, monkeypatch):
  folder, digital_id = inputs
  opened = []
  real_open = pages.open_page_image

  def open_page_image(image, **kwargs):
    opened.append((os.path.basename(image.path), image.index))
    return real_open(image, **kwargs)

  monkeypatch.setattr(pages, "open_page_image", open_page_image)
  config = tiny_config(mode="predict")
  config.predict.input = str(folder / "*")
  config.predict.output = str(tmp_path / "pred.jsonl")
  config.predict.draw = True
  config.predict.draw_dir = str(tmp_path / "png")
  config.predict.ocr = engine
  config.predict.ocr_dpi = 150.0
  out = inference.run_predict(config, trained[0])

  printed = capsys.readouterr().out
  assert "loaded 3 documents" in printed
  assert str(folder / "readme.txt") in printed and "unsupported file format" in printed

  rows = {r["id"]: r for r in map(json.loads, open(out, encoding="utf-8"))}
  assert sorted(rows) == sorted([digital_id, "scanned", "photo"])
  for row in rows.values():
    assert row["entities"], row["id"]  # even a 6-step model tags something on every page
    for e in row["entities"]:
      assert e["page"] == 0 and 0.0 <= e["score"] <= 1.0 and e["text"]

  # One picture per page, drawn over the page image (the PDF's page, the PNG itself).
  pngs = sorted(os.listdir(tmp_path / "png"))
  assert pngs == sorted(f"{name}_p0.png" for name in rows)
  assert sorted(opened) == sorted([(f"{digital_id}.pdf", 0), ("scanned.pdf", 0),
                                   ("photo.png", 0)])
  for name in pngs:
    with Image.open(tmp_path / "png" / name) as img:
      pixels = np.asarray(img.convert("L"), np.float64)
    # Page text shows through: many dark pixels, as on the page itself.
    assert (pixels < 100).mean() > 0.002, name


def test_predict_without_ocr_keeps_born_digital_only(trained, inputs, tmp_path):
  folder, _ = inputs
  config = tiny_config(mode="predict")
  config.predict.input = str(folder / "photo.png")
  config.predict.output = str(tmp_path / "pred.jsonl")
  config.predict.ocr = ""
  with pytest.raises(ValueError, match="expected a .jsonl file, PDF file"):
    inference.run_predict(config, trained[0])
