"""FUNSD / CORD / SROIE readers against the dataset READMEs and small independent references.

The counts come from `../shared/datasets/*/README.md`; the references re-read the
raw files with a few lines of plain Python. Tests that need the datasets are
skipped when the folder is absent; the SROIE encoding / newline tests build
their own receipts.
"""

import codecs
import collections
import difflib
import json
import re

import numpy as np
import pytest

from flaxdoc.data.cord import load_cord
from flaxdoc.data.datasets import (LABELS, DatasetNotFoundError, available_splits, carve_dev,
                                   load_dataset)
from flaxdoc.data.funsd import load_funsd
from flaxdoc.data.sroie import decode_text, load_sroie
from flaxdoc.tags import consecutive_runs, entities_to_tags, tags_to_spans

# README numbers (training splits).
FUNSD_ENTITIES = {"question": 3266, "answer": 2802, "other": 902, "header": 441}
FUNSD_WORDS, FUNSD_EMPTY_WORDS, FUNSD_EMPTY_ENTITIES, FUNSD_RELATIONS = 22512, 624, 152, 4230
SROIE_LINES = 33626


@pytest.fixture(scope="module")
def funsd(datasets_dir):
  return load_funsd(datasets_dir / "funsd", "train")


@pytest.fixture(scope="module")
def cord(datasets_dir):
  return load_cord(datasets_dir / "cord", "train")


@pytest.fixture(scope="module")
def sroie(datasets_dir):
  return load_sroie(datasets_dir / "sroie", "train")


def _check_tag_round_trip(docs):
  """gold entities -> word tags -> spans gives back the entities, in both schemes."""
  for doc in docs:
    expected = []
    for e in doc.entities:
      assert len(consecutive_runs(e.words)) == 1, (doc.id, e)
      expected.append((e.label, e.words[0], e.words[-1] + 1))
    for scheme in ("BIOES", "BIO"):
      tags = entities_to_tags(len(doc), doc.entities, scheme)
      assert sorted(tags_to_spans(tags, scheme)) == sorted(expected), (doc.id, scheme)


def _no_nan(docs):
  for d in docs:
    assert np.isfinite(d.boxes).all() and np.isfinite(d.page_sizes).all()
    assert (d.boxes[:, :2] <= d.boxes[:, 2:]).all()


# ----------------------------------------------------------------------------- FUNSD
def test_funsd_counts_match_readme(funsd):
  docs, report = funsd
  assert len(docs) == 149 and report.loaded == 149 and not report.skipped_documents
  kept = collections.Counter(e.label for d in docs for e in d.entities)
  skipped = report.stats["skipped_entities_by_label"]
  for label, count in FUNSD_ENTITIES.items():
    assert kept[label] + skipped.get(label, 0) == count, label
  assert len(report.skipped_entities) == FUNSD_EMPTY_ENTITIES
  assert all(reason == "no words with text" for _, reason in report.skipped_entities)
  assert sum(len(d) for d in docs) + len(report.skipped_words) == FUNSD_WORDS
  assert len(report.skipped_words) == FUNSD_EMPTY_WORDS
  relations = sum(len(d.relations) for d in docs)
  assert relations + sum(report.stats["relations_dropped"].values()) == FUNSD_RELATIONS
  # Entity words are stored together, so no entity is split: counted independently.
  assert sum(len(consecutive_runs(e.words)) > 1 for d in docs for e in d.entities) == 0
  assert report.stats["noncontiguous_entities"] == 0
  _no_nan(docs)


def test_funsd_document_matches_raw_json(funsd, datasets_dir):
  docs, _ = funsd
  doc = docs[7]
  form = json.loads((datasets_dir / "funsd/training_data/annotations" /
                     f"{doc.id}.json").read_text())["form"]
  words = [(w["text"], w["box"], ent["id"], ent["label"])
           for ent in form for w in ent["words"] if w["text"].strip()]
  assert list(doc.words) == [w[0] for w in words]
  np.testing.assert_array_equal(doc.boxes, np.float32([w[1] for w in words]))
  np.testing.assert_array_equal(doc.segments, [w[2] for w in words])
  assert doc.word_labels() == [w[3] for w in words]
  ids = [ent["id"] for ent in form if any(w["text"].strip() for w in ent["words"])]
  links = {tuple(l) for ent in form for l in ent["linking"]}
  expected = {(ids.index(a), ids.index(b)) for a, b in links if a in ids and b in ids}
  assert set(doc.relations) == expected and len(doc.relations) == len(expected)
  # README: images are 1000 px tall, 754 to 863 px wide; page size is the image's.
  for d in docs:
    assert d.page_sizes[0, 1] == 1000 and 754 <= d.page_sizes[0, 0] <= 863


def test_funsd_tags_round_trip(funsd):
  _check_tag_round_trip(funsd[0])


def test_funsd_other_can_stay_untagged(datasets_dir):
  docs, report = load_funsd(datasets_dir / "funsd", "train", ids=["0000971160"],
                            other_as_entity=False)
  assert all(e.label != "other" for e in docs[0].entities)
  assert report.stats["other_not_entities"] > 0


def test_funsd_dev_carve(datasets_dir, funsd):
  root = datasets_dir / "funsd"
  dev, dev_report = load_dataset("funsd", "dev", root)
  train, report = load_dataset("funsd", "train", root)
  dev_ids, train_ids = {d.id for d in dev}, {d.id for d in train}
  assert len(dev_ids) == 20 and len(train_ids) == 129 and not dev_ids & train_ids
  assert dev_ids | train_ids == {d.id for d in funsd[0]}
  assert "dev carved with seed 0" in report.stats["split"]
  # Each report is titled with the split it holds.
  assert dev_report.summary().startswith("funsd:dev (carved from funsd:train (")
  assert report.summary().startswith("funsd:train (")
  whole = load_dataset("funsd", "train", root, dev_fraction=0.0)[1]
  assert whole.loaded == 149 and "(no dev carved)" in whole.stats["split"]
  # Deterministic, and the seed matters.
  assert {d.id for d in load_dataset("funsd", "dev", root)[0]} == dev_ids
  assert {d.id for d in load_dataset("funsd", "dev", root, seed=1)[0]} != dev_ids
  assert available_splits("funsd", root) == ["train", "dev"]
  with pytest.raises(DatasetNotFoundError, match="testing_data"):
    load_dataset("funsd", "test", root)


def test_carve_dev_is_order_independent():
  ids = [f"d{i:03d}" for i in range(50)]
  dev, train = carve_dev(ids, 7, seed=3)
  assert carve_dev(ids[::-1], 7, seed=3) == (dev, train)
  assert len(dev) == 7 and sorted(dev + train) == ids


def test_data_dir_defaults_to_env(datasets_dir, monkeypatch):
  monkeypatch.setenv("FLAXDOC_DATA_DIR", str(datasets_dir))
  docs, _ = load_dataset("funsd", "dev")
  assert len(docs) == 20
  monkeypatch.delenv("FLAXDOC_DATA_DIR")
  with pytest.raises(DatasetNotFoundError, match="FLAXDOC_DATA_DIR"):
    load_dataset("funsd", "dev")


def test_missing_directory_says_what_layout_was_expected(tmp_path):
  with pytest.raises(DatasetNotFoundError, match="training_data/annotations"):
    load_dataset("funsd", "train", tmp_path)
  with pytest.raises(DatasetNotFoundError, match=r"\{train,dev,test\}/json"):
    load_dataset("cord", "train", tmp_path)
  with pytest.raises(DatasetNotFoundError, match="box/<ID>.txt"):
    load_dataset("sroie", "train", tmp_path)
  with pytest.raises(ValueError, match="unknown split"):
    load_dataset("funsd", "validation", tmp_path)
  with pytest.raises(ValueError, match="unknown dataset"):
    load_dataset("nope", "train", tmp_path)


# ----------------------------------------------------------------------------- CORD
def test_cord_label_set_is_the_readme_table(datasets_dir):
  readme = (datasets_dir / "cord" / "README.md").read_text()
  names = set(re.findall(r"\| ((?:menu|void_menu|sub_total|total)\.[a-z_]+) \|", readme))
  assert len(LABELS["cord"]) == len(set(LABELS["cord"])) == 30
  assert set(LABELS["cord"]) == names


def test_cord_counts_and_segments(cord, datasets_dir):
  docs, report = cord
  assert len(docs) == 700 and not report.skipped_documents
  raw_segments = raw_words = 0
  empty_words = 0
  for path in sorted((datasets_dir / "cord/train/json").glob("*.json")):
    lines = json.loads(path.read_text())["valid_line"]
    raw_segments += len(lines)
    raw_words += sum(len(l["words"]) for l in lines)
    empty_words += sum(not w["text"].strip() for l in lines for w in l["words"])
  entities = sum(len(d.entities) for d in docs)
  assert entities + len(report.skipped_entities) == raw_segments == report.stats["segments"]
  assert sum(len(d) for d in docs) + len(report.skipped_words) == raw_words
  assert len(report.skipped_words) == empty_words
  for d in docs:
    # One valid_line element = one entity = one segment.
    assert len(set(d.segments.tolist())) == len(d.entities)
    for e in d.entities:
      assert len(set(d.segments[list(e.words)].tolist())) == 1
  assert {e.label for d in docs for e in d.entities} <= set(LABELS["cord"])
  _no_nan(docs)


def test_cord_boxes_are_quad_hulls(cord, datasets_dir):
  docs, _ = cord
  doc = docs[3]
  data = json.loads((datasets_dir / f"cord/train/json/{doc.id}.json").read_text())
  hulls = []
  for line in data["valid_line"]:
    for w in line["words"]:
      xs = [w["quad"][f"x{i}"] for i in range(1, 5)]
      ys = [w["quad"][f"y{i}"] for i in range(1, 5)]
      if w["text"].strip():
        hulls.append([min(xs), min(ys), max(xs), max(ys)])
  size = data["meta"]["image_size"]
  hulls = np.clip(np.float32(hulls), 0, [size["width"], size["height"]] * 2)
  np.testing.assert_array_equal(doc.boxes, hulls)
  np.testing.assert_array_equal(doc.page_sizes, [[size["width"], size["height"]]])


def test_cord_tags_round_trip_and_dev_carve(cord, datasets_dir):
  _check_tag_round_trip(cord[0])
  dev, _ = load_dataset("cord", "dev", datasets_dir / "cord")
  train, _ = load_dataset("cord", "train", datasets_dir / "cord")
  assert len(dev) == 100 and len(train) == 600
  assert not {d.id for d in dev} & {d.id for d in train}


# ----------------------------------------------------------------------------- SROIE
def _norm(s):
  return "".join(s.upper().split())


def test_sroie_counts_and_alignment(sroie, datasets_dir):
  docs, report = sroie
  assert len(docs) == 626 and not report.skipped_documents
  assert report.stats["lines"] == SROIE_LINES
  assert sum(len(set(d.segments.tolist())) for d in docs) == SROIE_LINES
  rates = report.stats["alignment_rate"]
  assert set(rates) == {"company", "date", "address", "total"}
  for field in ("company", "date", "total"):
    assert rates[field] > 0.9, (field, rates)
  # Unplaced fields are skipped entities with reasons, including the README's known gaps.
  where = dict(report.skipped_entities)
  assert where["X51005433522 total"] == "total: empty key string"
  assert where["X51005663280 address"] == "address: key missing from the entities file"
  placed = sum(len(d.entities) for d in docs)
  assert placed + len(report.skipped_entities) == 4 * 626
  # Each placed entity's words resemble its key string (independent check).
  for d in docs[::10]:
    keys = json.loads((datasets_dir / f"sroie/train/entities/{d.id}.txt").read_text())
    for e in d.entities:
      got = _norm(d.entity_text(e))
      want = _norm(keys[e.label])
      assert want in got or difflib.SequenceMatcher(None, got, want).ratio() >= 0.8, (d.id, e)
  _no_nan(docs)


def test_sroie_words_split_their_line_box(sroie, datasets_dir):
  docs, _ = sroie
  doc = docs[0]
  lines = [l for l in (datasets_dir / f"sroie/train/box/{doc.id}.txt").read_text().splitlines()
           if l.strip()]
  for k, line in enumerate(lines):
    *coords, text = line.split(",", 8)
    xs, ys = [float(c) for c in coords[0::2]], [float(c) for c in coords[1::2]]
    sel = np.flatnonzero(doc.segments == k)
    assert [doc.words[i] for i in sel] == text.split()
    b = doc.boxes[sel]
    np.testing.assert_allclose(b[0, 0], min(xs))
    np.testing.assert_allclose(b[-1, 2], max(xs), rtol=1e-6)
    assert (b[:, 1] == min(ys)).all() and (b[:, 3] == max(ys)).all()
    assert (np.diff(b[:, 0]) > 0).all()  # left to right
    # Width proportional to the characters of the word.
    stripped = text.strip()
    share = (b[:, 2] - b[:, 0]) / (max(xs) - min(xs))
    np.testing.assert_allclose(share, [len(w) / len(stripped) for w in text.split()], atol=1e-5)


def test_sroie_total_prefers_bottom_line(tmp_path):
  _write_sroie(tmp_path, "r1", ["10,10,90,10,90,20,10,20,SHOP SDN BHD",
                                "10,30,90,30,90,40,10,40,SUBTOTAL 9.00",
                                "10,50,90,50,90,60,10,60,TOTAL 19.00",
                                "10,70,90,70,90,80,10,80,TOTAL RM9.00"],
               {"company": "SHOP SDN BHD", "total": "9.00"})
  docs, report = load_sroie(tmp_path, "train")
  d = docs[0]
  labels = {e.label: d.entity_text(e) for e in d.entities}
  assert labels == {"company": "SHOP SDN BHD", "total": "RM9.00"}
  assert report.stats["alignment"]["date"] == {"missing": 1}


def test_sroie_tags_round_trip_and_dev_carve(sroie, datasets_dir):
  _check_tag_round_trip(sroie[0])
  dev, _ = load_dataset("sroie", "dev", datasets_dir / "sroie")
  assert len(dev) == 60


def _write_sroie(root, doc_id, lines, keys, *, newline="\n", encoding="utf-8"):
  (root / "train/box").mkdir(parents=True, exist_ok=True)
  (root / "train/entities").mkdir(parents=True, exist_ok=True)
  (root / f"train/box/{doc_id}.txt").write_bytes((newline.join(lines) + newline).encode(encoding))
  (root / f"train/entities/{doc_id}.txt").write_bytes(
      json.dumps(keys, ensure_ascii=False, indent=4).replace("\n", newline).encode(encoding))


_LINES = ["72,25,326,25,326,64,72,64,CAF\u00c9 M\u00dcLLER SDN BHD",
          "50,82,440,82,440,121,50,121,NO.53 JALAN SAGU 18, TAMAN DAYA",
          "110,144,383,144,383,163,110,163,DATE: 25/12/2018",
          "110,170,383,170,383,190,110,190,TOTAL: 9.00"]
_KEYS = {"company": "CAF\u00c9 M\u00dcLLER SDN BHD", "date": "25/12/2018",
         "address": "NO.53 JALAN SAGU 18, TAMAN DAYA", "total": "9.00"}


@pytest.mark.parametrize("newline, encoding", [("\n", "utf-8"), ("\r\n", "utf-8"),
                                               ("\r", "utf-8"), ("\r\n", "cp1252"),
                                               ("\n", "utf-8-sig"),
                                               ("\r\n", "utf-16")])  # Notepad's "Unicode"
def test_sroie_newlines_and_encodings(tmp_path, newline, encoding):
  _write_sroie(tmp_path, "X1", _LINES, _KEYS, newline=newline, encoding=encoding)
  docs, report = load_sroie(tmp_path, "train")
  d = docs[0]
  assert d.words == tuple(" ".join(l.split(",", 8)[8] for l in _LINES).split())
  assert {e.label: d.entity_text(e) for e in d.entities} == {
      "company": "CAF\u00c9 M\u00dcLLER SDN BHD", "date": "25/12/2018",
      "address": "NO.53 JALAN SAGU 18, TAMAN DAYA", "total": "9.00"}
  fallbacks = [r for r in report.repairs if "decoded as" in r[1]]
  assert len(fallbacks) == (2 if encoding in ("cp1252", "utf-16") else 0)
  assert all(r[1] == f"decoded as {encoding} (not UTF-8)" for r in fallbacks)


def test_sroie_decodes_utf16_by_its_byte_order_mark_only():
  text = "1,2,3,4,5,6,7,8,CAF\u00c9\r\n"
  for raw in (codecs.BOM_UTF16_LE + text.encode("utf-16-le"),
              codecs.BOM_UTF16_BE + text.encode("utf-16-be")):
    assert decode_text(raw) == (text, "utf-16")
  # Bytes that start like a mark but are not UTF-16 (an odd length) fall through to the
  # 8-bit encodings; without a mark, UTF-16 is never guessed.
  assert decode_text(codecs.BOM_UTF16_LE + b"abc")[1] == "cp1252"
  assert decode_text("\u00ff\u00fe".encode("utf-8"))[1] == "utf-8"


def test_progress_bar_names_the_work_and_counts_it(capsys):
  from flaxdoc.data.reading import progress  # pylint: disable=import-outside-toplevel
  assert progress(["only"], "FUNSD dev: OCR by rapidocr", "form") == ["only"]  # no bar for one
  assert list(progress(["a", "b", "c"], "FUNSD dev: OCR by rapidocr", "form")) == ["a", "b", "c"]
  err = capsys.readouterr().err
  assert "FUNSD dev: OCR by rapidocr" in err and "3/3" in err and "form/s" in err
