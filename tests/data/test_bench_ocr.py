"""`python -m flaxdoc.bench.ocr`: its numbers on two synthetic pages, and a missing engine."""

import os
import sys

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("pypdfium2")

# pylint: disable=g-import-not-at-top,wrong-import-position
from flaxdoc.bench import ocr as bench_ocr
from flaxdoc.data.ocr import OcrUnavailableError, available_engines, read_document
from flaxdoc.data.ocr.matching import WordScores, word_scores
from flaxdoc.data.synthetic import make_document

sys.path.insert(0, os.path.dirname(__file__))
from ocr_samples import render_pages, spaced  # pylint: disable=import-error
# pylint: enable=g-import-not-at-top,wrong-import-position


def test_bench_row_sums_the_pages(tmp_path):
  if "tesseract" not in available_engines():
    pytest.skip("Tesseract not installed (apt-get install tesseract-ocr; pip install pytesseract)")
  doc = spaced(make_document(0, 0))  # the form tests/data/test_ocr.py reads
  _, pictures, reference = render_pages(doc, tmp_path, scale=0.5)
  pairs = []
  for k in range(2):  # the same page twice, under two names: sums must double
    path = tmp_path / f"page{k}.png"
    pictures[0].save(path)
    pairs.append((path, reference))
  row = bench_ocr.bench_engine("tesseract", pairs, progress=False)
  one = word_scores(reference, read_document(pairs[0][0], engine="tesseract"))
  twice = WordScores()
  twice += one
  twice += one
  assert row["pages"] == 2 and row["gold_words"] == 2 * len(reference)
  assert row["ocr_words"] == twice.ocr
  assert row["recall"] == pytest.approx(twice.recall, abs=1e-4) and row["recall"] >= 0.9
  assert row["precision"] == pytest.approx(twice.precision, abs=1e-4)
  assert row["mean_iou"] == pytest.approx(twice.mean_iou, abs=1e-4)
  assert row["s_per_page"] > 0


def test_missing_engine_is_a_note(monkeypatch):
  def unavailable(name):
    raise OcrUnavailableError(f"{name} is not here")
  monkeypatch.setattr(bench_ocr, "get_engine", unavailable)
  row = bench_ocr.bench_engine("rapidocr", [], progress=False)
  assert row["engine"] == "rapidocr" and "not installed" in row["note"]


def test_datasets_root_follows_the_users_variable_first(monkeypatch, tmp_path, capsys):
  """The benches read the root `load_dataset` reads ($FLAXDOC_DATA_DIR), then the tests' name."""
  from flaxdoc.bench.data import default_datasets_dir  # pylint: disable=import-outside-toplevel
  user, tests = tmp_path / "user", tmp_path / "tests"
  monkeypatch.setenv("FLAXDOC_DATA_DIR", str(user))
  monkeypatch.setenv("FLAXDOC_DATASETS", str(tests))
  assert default_datasets_dir() == user
  monkeypatch.delenv("FLAXDOC_DATA_DIR")
  assert default_datasets_dir() == tests
  monkeypatch.delenv("FLAXDOC_DATASETS")
  assert default_datasets_dir().parts[-2:] == ("shared", "datasets")
  # A root without funsd/ in it: the bench says so and names the variable a user sets.
  monkeypatch.setenv("FLAXDOC_DATA_DIR", str(user))
  assert bench_ocr.main(["--engines", "tesseract"]) == 1
  err = capsys.readouterr().err
  assert f"FUNSD not found under {user}" in err and "$FLAXDOC_DATA_DIR" in err
