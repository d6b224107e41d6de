"""TFDS builders: build array_record from a small manual dir, read back with tfds.data_source.

No TensorFlow is installed: building goes through tfds's own serializer and
reading through `tfds.data_source` (never `tfds.load`).
"""

import json
import shutil

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

tfds = pytest.importorskip("tensorflow_datasets")

from flaxdoc.data import Document, DocumentError  # pylint: disable=g-import-not-at-top
from flaxdoc.data import tfds_builders as tb  # pylint: disable=g-import-not-at-top
from flaxdoc.data.datasets import load_dataset  # pylint: disable=g-import-not-at-top


def assert_same_document(a: Document, b: Document):
  assert a.id == b.id and a.words == b.words
  for name in ("boxes", "page_sizes"):
    x, y = getattr(a, name), getattr(b, name)
    assert x.dtype == y.dtype == np.float32 and x.shape == y.shape
    np.testing.assert_array_equal(x.view(np.uint32), y.view(np.uint32), err_msg=name)
  np.testing.assert_array_equal(a.pages, b.pages)
  np.testing.assert_array_equal(a.segments, b.segments)
  assert a.entities == b.entities and a.relations == b.relations
  assert a.label_set == b.label_set


@st.composite
def documents(draw):
  n = draw(st.integers(0, 6))
  f32 = st.floats(0, 500, width=32)
  boxes = [sorted([draw(f32), draw(f32)]) for _ in range(2 * n)]
  boxes = np.float32([[a[0], b[0], a[1], b[1]] for a, b in zip(boxes[0::2], boxes[1::2])])
  # Valid text only: Document refuses lone surrogates and non-whitespace controls.
  valid = st.characters(exclude_categories=("Cs", "Cc"))
  words = [draw(st.text(valid, min_size=1, max_size=5).filter(str.strip)) for _ in range(n)]
  entities = None
  if draw(st.booleans()):
    order = draw(st.permutations(range(n)))
    cut = draw(st.integers(0, n))
    entities = [("a", order[:cut])] if cut else []
    if cut < n and draw(st.booleans()):
      entities.append(("b", order[cut:]))
  relations = [(0, len(entities) - 1)] if entities and draw(st.booleans()) else []
  return Document.create(draw(st.text(min_size=1, max_size=5)), words, boxes.reshape(n, 4),
                         pages=[0] * n, page_sizes=[[500, 500]],
                         segments=draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)),
                         entities=entities, relations=relations,
                         label_set=("a", "b") if draw(st.booleans()) else None)


@settings(max_examples=40, deadline=None)
@given(documents())
def test_example_round_trip_through_feature_serialization(doc):
  features = tb.document_features()
  serialized = features.serialize_example(tb.example_from_document(doc))
  example = features.deserialize_example_np(serialized)  # what data_source returns
  assert_same_document(tb.document_from_example(example), doc)
  assert_same_document(tb.document_from_example(tb.example_from_document(doc)), doc)


def test_inconsistent_example_raises_document_error():
  doc = Document.create("x", ["a", "b"], [[0, 0, 1, 1]] * 2, page_sizes=[[2, 2]],
                        entities=[("a", [0])])
  ex = tb.example_from_document(doc)
  ex["entity_offsets"] = np.int32([0, 5])
  with pytest.raises(DocumentError, match="entity_offsets"):
    tb.document_from_example(ex)
  ex = tb.example_from_document(doc)
  ex["has_entities"] = False
  with pytest.raises(DocumentError, match="has_entities"):
    tb.document_from_example(ex)


def _form(k):
  """A small FUNSD-format form (one empty word, one empty entity, links)."""
  return {"form": [
      {"id": 0, "label": "header", "text": f"FORM {k}", "box": [10, 5, 90, 15],
       "words": [{"text": "FORM", "box": [10, 5, 40, 15]},
                 {"text": str(k), "box": [45, 5, 90, 15]}],
       "linking": []},
      {"id": 1, "label": "question", "text": "Date:", "box": [10, 20, 40, 30],
       "words": [{"text": "Date:", "box": [10, 20, 40, 30]}, {"text": "", "box": [41, 20, 42, 30]}],
       "linking": [[1, 2]]},
      {"id": 2, "label": "answer", "text": "1/1/99", "box": [50, 20, 90, 30],
       "words": [{"text": "1/1/99", "box": [50, 20, 90, 30]}], "linking": [[1, 2]]},
      {"id": 3, "label": "other", "text": "", "box": [0, 0, 1, 1],
       "words": [{"text": "", "box": [0, 0, 1, 1]}], "linking": []},
  ]}


def _build_and_compare(builder_cls, name, manual_dir, data_dir, expected_splits, **options):
  builder = builder_cls(data_dir=str(data_dir), reader_options=options)
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      manual_dir=str(manual_dir) if manual_dir else None))
  files = sorted(p.name for p in (data_dir / name / tb.FEATURES_VERSION).iterdir())
  assert any(f.endswith(".array_record-00000-of-00001") for f in files), files
  sources = tfds.data_source(name, data_dir=str(data_dir), download=False)
  assert sorted(sources) == sorted(expected_splits)
  for split, source in sources.items():
    want, _ = load_dataset(name, split, manual_dir, **options)
    got = [tb.document_from_example(source[i]) for i in range(len(source))]
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):  # same order: shuffling is disabled
      assert_same_document(a, b)


def test_funsd_builder_from_manual_dir(tmp_path):
  ann = tmp_path / "manual" / "training_data" / "annotations"
  ann.mkdir(parents=True)
  for k in range(6):
    (ann / f"form{k}.json").write_text(json.dumps(_form(k)))
  _build_and_compare(tb.Funsd, "funsd", tmp_path / "manual", tmp_path / "tfds",
                     ["train", "dev"])


def test_sroie_and_cord_builders_from_manual_dir(tmp_path):
  sroie = tmp_path / "sroie"
  (sroie / "train/box").mkdir(parents=True)
  (sroie / "train/entities").mkdir(parents=True)
  (sroie / "test/box").mkdir(parents=True)
  for k in range(5):
    (sroie / f"train/box/X{k}.txt").write_text(
        f"10,10,90,10,90,20,10,20,SHOP {k} SDN BHD\r\n10,30,90,30,90,40,10,40,TOTAL {k}.00\r\n")
    (sroie / f"train/entities/X{k}.txt").write_text(
        json.dumps({"company": f"SHOP {k} SDN BHD", "total": f"{k}.00"}))
  (sroie / "test/box/T0.txt").write_text("10,10,90,10,90,20,10,20,HELLO\n")  # unlabelled
  _build_and_compare(tb.Sroie, "sroie", sroie, tmp_path / "tfds", ["train", "dev", "test"])

  cord = tmp_path / "cord"
  for split in ("train", "dev"):
    (cord / split / "json").mkdir(parents=True)
    for k in range(2):
      quad = {"x1": 1, "y1": 1, "x2": 20, "y2": 1, "x3": 20, "y3": 9, "x4": 1, "y4": 9}
      (cord / split / f"json/{split}{k}.json").write_text(json.dumps({
          "meta": {"image_size": {"width": 100, "height": 100}},
          "valid_line": [{"category": "menu.nm", "group_id": 0,
                          "words": [{"quad": quad, "text": f"item{k}"}]}]}))
  _build_and_compare(tb.Cord, "cord", cord, tmp_path / "tfds", ["train", "dev"])


def test_funsd_builder_on_real_files(tmp_path, datasets_dir):
  src = datasets_dir / "funsd" / "training_data"
  manual = tmp_path / "manual" / "training_data"
  (manual / "annotations").mkdir(parents=True)
  (manual / "images").mkdir()
  for stem in sorted(p.stem for p in (src / "annotations").glob("*.json"))[:3]:
    shutil.copy(src / "annotations" / f"{stem}.json", manual / "annotations")
    shutil.copy(src / "images" / f"{stem}.png", manual / "images")
  _build_and_compare(tb.Funsd, "funsd", tmp_path / "manual", tmp_path / "tfds",
                     ["train", "dev"])


def test_synthetic_builder(tmp_path):
  pytest.importorskip("flaxdoc.data.synthetic")
  _build_and_compare(tb.Synthetic, "synthetic", None, tmp_path / "tfds", ["train", "dev", "test"],
                     num_train=4, num_dev=2, num_test=2)


class _FakeDownloadManager:
  """Stands in for tfds's DownloadManager to check which source the FUNSD builder picks."""

  def __init__(self, manual, extracted):
    self._manual, self._extracted, self.calls = manual, extracted, []

  @property
  def manual_dir(self):
    if self._manual is None:
      raise AssertionError("Manual directory not enabled.")  # what tfds raises
    return self._manual

  def download_and_extract(self, url):
    self.calls.append(("download", url))
    return self._extracted

  def extract(self, path):
    self.calls.append(("extract", path.name))
    return self._extracted


def test_funsd_builder_downloads_without_manual_dir(tmp_path):
  # The official zip unpacks to dataset/training_data/...: the reader accepts that.
  ann = tmp_path / "extracted" / "dataset" / "training_data" / "annotations"
  ann.mkdir(parents=True)
  for k in range(3):
    (ann / f"f{k}.json").write_text(json.dumps(_form(k)))
  builder = tb.Funsd(data_dir=str(tmp_path / "tfds"))
  dl = _FakeDownloadManager(None, tmp_path / "extracted")
  splits = builder._split_generators(dl)  # pylint: disable=protected-access
  assert dl.calls == [("download", tb.Funsd.URL)] and sorted(splits) == ["dev", "train"]
  assert len(list(splits["train"])) + len(list(splits["dev"])) == 3
  # A manual dir holding only dataset.zip is extracted rather than downloaded.
  (tmp_path / "manual").mkdir()
  (tmp_path / "manual" / "dataset.zip").write_bytes(b"")
  dl = _FakeDownloadManager(tmp_path / "manual", tmp_path / "extracted")
  builder._split_generators(dl)  # pylint: disable=protected-access
  assert dl.calls == [("extract", "dataset.zip")]
