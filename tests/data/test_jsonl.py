"""flaxdoc JSON Lines: lossless round trip, strict validation, errors that say where."""

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from flaxdoc.data import Document, DocumentError
from flaxdoc.data.document import repair_text
from flaxdoc.data.jsonl import (FORMAT, document_from_json, document_to_json, parse_json,
                                read_jsonl, write_jsonl)

LABELS = ("total", "date", "name")


def assert_same_document(a: Document, b: Document):
  """Field-by-field equality; float arrays bit for bit."""
  assert a.id == b.id
  assert a.words == b.words
  for name in ("boxes", "page_sizes"):
    x, y = getattr(a, name), getattr(b, name)
    assert x.dtype == y.dtype == np.float32 and x.shape == y.shape, name
    np.testing.assert_array_equal(x.view(np.uint32), y.view(np.uint32), err_msg=name)
  for name in ("pages", "segments"):
    np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
  assert a.entities == b.entities
  assert a.relations == b.relations
  assert a.label_set == b.label_set


@st.composite
def documents(draw, max_words=10):
  """Valid documents with arbitrary float32 geometry, several pages, entities or not."""
  n = draw(st.integers(0, max_words))
  num_pages = draw(st.integers(1, 3))
  f32 = lambda lo, hi: st.floats(lo, hi, width=32, allow_nan=False, allow_infinity=False)
  sizes = [[draw(f32(1.0, 5000.0)), draw(f32(1.0, 5000.0))] for _ in range(num_pages)]
  pages = [draw(st.integers(0, num_pages - 1)) for _ in range(n)]
  boxes = []
  for p in pages:
    w, h = sizes[p]
    xs = sorted([draw(f32(0.0, w)), draw(f32(0.0, w))])
    ys = sorted([draw(f32(0.0, h)), draw(f32(0.0, h))])
    boxes.append([xs[0], ys[0], xs[1], ys[1]])
  # Valid text only (Document refuses lone surrogates and non-whitespace controls).
  words = [draw(st.text(min_size=1, max_size=6).map(repair_text).filter(lambda s: s.strip()))
           for _ in range(n)]
  segments = [draw(st.integers(0, 4)) for _ in range(n)]
  entities = None
  if draw(st.booleans()):
    order = draw(st.permutations(range(n)))
    entities, k = [], 0
    while k < len(order) and draw(st.booleans()):
      size = draw(st.integers(1, 3))
      entities.append((draw(st.sampled_from(LABELS)), order[k:k + size]))
      k += size
  relations = []
  if entities:
    m = len(entities)
    relations = draw(st.lists(st.tuples(st.integers(0, m - 1), st.integers(0, m - 1)),
                              max_size=3))
  label_set = LABELS if draw(st.booleans()) else None
  doc_id = draw(st.text(min_size=1, max_size=8))
  return Document.create(doc_id, words, np.asarray(boxes, np.float32).reshape(n, 4),
                         pages=pages, page_sizes=np.asarray(sizes, np.float32),
                         segments=segments, entities=entities, relations=relations,
                         label_set=label_set)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(documents(), max_size=4, unique_by=lambda d: d.id))
def test_round_trip_is_lossless(tmp_path_factory, docs):
  path = tmp_path_factory.mktemp("rt") / "docs.jsonl"
  assert write_jsonl(path, docs) == len(docs)
  back, report = read_jsonl(path)
  assert report.loaded == len(docs) and not report.skipped_documents and not report.repairs
  assert len(back) == len(docs)
  for a, b in zip(docs, back):
    assert_same_document(a, b)
  # Each line is a plain JSON object of the documented format.
  # str.splitlines also breaks at U+0085 / U+2028: the writer escapes those.
  lines = path.read_text(encoding="utf-8").splitlines()
  assert len(lines) == len(docs)
  for line in lines:
    obj = json.loads(line)
    assert obj["format"] == FORMAT
    assert set(obj) <= {"format", "id", "words", "boxes", "pages", "page_sizes", "segments",
                        "entities", "relations", "label_set"}


def test_float32_written_short_and_exact():
  # 0.1f is written as "0.1" (shortest text that reads back to the same float32).
  box = np.float32([0.1, 1.0, 123.456, 2.5])
  d = Document.create("a", ["w"], box[None], page_sizes=[[200, 200]])
  obj = document_to_json(d)
  assert obj["boxes"] == [[0.1, 1, 123.456, 2.5]]
  assert isinstance(obj["boxes"][0][1], int)
  back = document_from_json(json.loads(json.dumps(obj)))
  np.testing.assert_array_equal(back.boxes.view(np.uint32), d.boxes.view(np.uint32))


def test_unlabelled_and_empty_entities_are_distinguished(tmp_path):
  base = dict(words=["a"], boxes=[[0, 0, 1, 1]], page_sizes=[[10, 10]])
  docs = [Document.create("none", **base), Document.create("empty", entities=[], **base)]
  write_jsonl(tmp_path / "x.jsonl", docs)
  back, _ = read_jsonl(tmp_path / "x.jsonl")
  assert back[0].entities is None and back[1].entities == ()


def test_odd_characters_round_trip_on_one_line(tmp_path):
  d1 = Document.create("s", ["a\ufffdb", "tab\there"], [[0, 0, 1, 1]] * 2, page_sizes=[[2, 2]])
  d2 = Document.create("t", ["x\u2028y\x85z", "\u00e9\u4e2d"], [[0, 0, 1, 1]] * 2,
                       page_sizes=[[2, 2]])
  write_jsonl(tmp_path / "s.jsonl", [d1, d2])
  assert len((tmp_path / "s.jsonl").read_text(encoding="utf-8").splitlines()) == 2
  back, _ = read_jsonl(tmp_path / "s.jsonl")
  assert back[0].words == d1.words and back[1].words == d2.words


def test_lone_surrogate_line_is_a_document_error_or_repaired(tmp_path):
  """`"\\ud800"` is valid JSON but not valid text (it used to crash SentencePiece)."""
  line = json.dumps({"format": FORMAT, "id": "s", "words": ["ok", "a\ud800b"],
                     "boxes": [[0, 0, 1, 1]] * 2, "page_sizes": [[2, 2]]})
  assert "\\ud800" in line
  (tmp_path / "s.jsonl").write_text(line + "\n", encoding="utf-8")
  with pytest.raises(DocumentError, match=r"document 's', field 'words': word 1 .*lone surrogate"):
    read_jsonl(tmp_path / "s.jsonl")
  docs, report = read_jsonl(tmp_path / "s.jsonl", text_policy="replace")
  assert docs[0].words == ("ok", "a\ufffdb") and "U+FFFD" in docs[0].repairs[0]
  assert report.repairs


def _line(**changes):
  obj = {"format": FORMAT, "id": "doc-1", "words": ["Total", "9.00"],
         "boxes": [[10, 10, 50, 20], [60, 10, 90, 20]], "page_sizes": [[100, 100]],
         "entities": [{"label": "total", "words": [1]}], "label_set": ["total"]}
  for k, v in changes.items():
    if v is _DROP:
      del obj[k]
    else:
      obj[k] = v
  return json.dumps(obj).encode()


_DROP = object()
_GOOD = _line()


@pytest.mark.parametrize("raw, doc_id, field, fragment", [
    (b'{"format": ', None, None, "invalid JSON"),
    (_GOOD.replace(b"50, 20]", b"NaN, 20]"), None, None, "NaN"),
    (_GOOD.replace(b"50, 20]", b"Infinity, 20]"), None, None, "Infinity"),
    (_GOOD.replace(b"50, 20]", b"1e999, 20]"), "doc-1", "boxes", "finite"),
    (_GOOD.replace(b"50, 20]", b"true, 20]"), "doc-1", "boxes", "finite"),
    (_GOOD.replace(b"50, 20]", b'"50", 20]'), "doc-1", "boxes", "finite"),
    (_line(boxes=[[10, 10, 50]]), "doc-1", "boxes", "4 numbers"),
    (_line(boxes=[[10, 10, 50, 20]]), "doc-1", "boxes", "1 rows for 2 words"),
    (_line(boxes="oops"), "doc-1", "boxes", "list"),
    (_line(words=_DROP), "doc-1", "words", "missing"),
    (_line(words=["Total", 9]), "doc-1", "words", "not a string"),
    (_line(words=["Total", " "]), "doc-1", "words", "empty"),
    (_line(format="flaxdoc.document/2"), "doc-1", "format", "unknown format version"),
    (_line(format=_DROP), "doc-1", "format", "missing"),
    (_line(format="something/1"), "doc-1", "format", "not a flaxdoc document"),
    (_line(id=""), None, "id", "non-empty string"),
    (_line(id=7), None, "id", "non-empty string"),
    (_line(page_size=[[1, 1]]), "doc-1", "page_size", "unknown key"),
    (_line(pages=[0, 1.5]), "doc-1", "pages", "integer"),
    (_line(pages=[0, 1]), "doc-1", "pages", "only 1 page sizes"),
    (_line(page_sizes=[[0, 100]]), "doc-1", "page_sizes", "positive"),
    (_line(boxes=[[10, 10, 50, 20], [60, 10, 190, 20]]), "doc-1", "boxes", "outside its page"),
    (_line(entities=[{"label": "bogus", "words": [1]}]), "doc-1", "entities", "unknown label"),
    (_line(entities=[{"label": "total", "words": [5]}]), "doc-1", "entities", "refers to word 5"),
    (_line(entities=[{"label": "total"}]), "doc-1", "entities", "'label' and 'words'"),
    # (A relation to a missing entity is dropped and reported: tests/data/test_linking.py.)
    (_line(relations=[[0]]), "doc-1", "relations", "pair"),
    (_line(label_set="total"), "doc-1", "label_set", "list of strings"),
    (b"[1, 2]", None, None, "JSON object"),
    (_GOOD[:-1] + b', "id": "x"}', None, None, "duplicate JSON key"),
    (_GOOD.replace(b"Total", b"T\xff\xfetal"), None, None, "not valid UTF-8"),
])
def test_errors_name_file_line_document_and_field(tmp_path, raw, doc_id, field, fragment):
  path = tmp_path / "bad.jsonl"
  path.write_bytes(_GOOD + b"\n" + raw + b"\n")
  with pytest.raises(DocumentError) as info:
    read_jsonl(path)
  msg = str(info.value)
  assert f"bad.jsonl:2" in msg and fragment in msg, msg
  assert info.value.doc_id == doc_id, msg
  if doc_id:
    assert f"'{doc_id}'" in msg
  if field:
    assert info.value.field == field and f"'{field}'" in msg, msg
  # With on_error="skip" the bad line is recorded and the good one kept.
  docs, report = read_jsonl(path, on_error="skip")
  assert [d.id for d in docs] == ["doc-1"]
  assert report.loaded == 1 and len(report.skipped_documents) == 1
  where, reason = report.skipped_documents[0]
  assert where == "line 2" and fragment in reason


def test_duplicate_ids_are_refused(tmp_path):
  path = tmp_path / "dup.jsonl"
  path.write_bytes(_GOOD + b"\n" + _GOOD + b"\n")
  with pytest.raises(DocumentError, match="duplicate document id.*line 1"):
    read_jsonl(path)
  with pytest.raises(ValueError, match="duplicate"):
    write_jsonl(tmp_path / "o.jsonl", read_jsonl(path, on_error="skip")[0] * 2)


def test_clip_policy_repairs_and_reports(tmp_path):
  path = tmp_path / "clip.jsonl"
  path.write_bytes(_line(boxes=[[10, 10, 50, 20], [60, 10, 190, 20]]) + b"\n")
  docs, report = read_jsonl(path, box_policy="clip")
  np.testing.assert_array_equal(docs[0].boxes[1], [60, 10, 100, 20])
  assert len(report.repairs) == 1 and "clipped 1 boxes" in report.repairs[0][1]


def test_bom_crlf_and_blank_lines(tmp_path):
  path = tmp_path / "win.jsonl"
  path.write_bytes(b"\xef\xbb\xbf" + _GOOD + b"\r\n\r\n   \n" + _line(id="doc-2") + b"\r\n")
  docs, report = read_jsonl(path)
  assert [d.id for d in docs] == ["doc-1", "doc-2"] and report.loaded == 2


def test_empty_file_and_empty_document(tmp_path):
  (tmp_path / "e.jsonl").write_bytes(b"")
  assert read_jsonl(tmp_path / "e.jsonl")[0] == []
  (tmp_path / "z.jsonl").write_bytes(_line(words=[], boxes=[], entities=[]) + b"\n")
  docs, _ = read_jsonl(tmp_path / "z.jsonl")
  assert len(docs[0]) == 0 and docs[0].boxes.shape == (0, 4)


def test_parse_json_rejects_constants_and_reports_source():
  for text in ("NaN", "[-Infinity]", '{"a": Infinity}'):
    with pytest.raises(DocumentError, match="not allowed"):
      parse_json(text, source="f.json")
  with pytest.raises(DocumentError, match="f.json.*nested too deeply"):
    parse_json("[" * 100000, source="f.json")
  assert parse_json('{"a": [1, 2.5]}') == {"a": [1, 2.5]}
  assert math.isinf(json.loads("1e999"))  # why the reader checks finiteness itself


def test_huge_document_reads_fast(tmp_path):
  n = 10000
  rng = np.random.default_rng(0)
  xy = rng.uniform(0, 900, size=(n, 2)).astype(np.float32)
  boxes = np.concatenate([xy, xy + 50], axis=1)
  d = Document.create("big", [f"w{i}" for i in range(n)], boxes, page_sizes=[[1000, 1000]],
                      entities=[("total", range(0, n, 2))], label_set=["total"])
  write_jsonl(tmp_path / "big.jsonl", [d])
  back, _ = read_jsonl(tmp_path / "big.jsonl")
  assert_same_document(d, back[0])


def test_load_dataset_jsonl_splits(tmp_path):
  from flaxdoc.data.datasets import DatasetNotFoundError, available_splits, load_dataset
  docs = [Document.create(f"d{i:02d}", ["w"], [[0, 0, 1, 1]], page_sizes=[[2, 2]])
          for i in range(20)]
  write_jsonl(tmp_path / "train.jsonl", docs)
  # Single file: it is the train split; dev (10%) is carved from it, disjoint.
  spec = f"jsonl:{tmp_path / 'train.jsonl'}"
  dev, _ = load_dataset(spec, "dev")
  train, report = load_dataset(spec, "train")
  assert len(dev) == 2 and len(train) == 18 and report.loaded == 18
  assert not {d.id for d in dev} & {d.id for d in train}
  assert {d.id for d in dev} | {d.id for d in train} == {d.id for d in docs}
  assert len(load_dataset(spec, "dev", dev_fraction=0.25)[0]) == 5
  with pytest.raises(DatasetNotFoundError, match="no 'test' split"):
    load_dataset(spec, "test")
  # Directory: official files win; without dev.jsonl, dev is carved from train.jsonl.
  assert available_splits(f"jsonl:{tmp_path}") == ["train", "dev"]
  assert {d.id for d in load_dataset(f"jsonl:{tmp_path}", "dev")[0]} == {d.id for d in dev}
  write_jsonl(tmp_path / "dev.jsonl", docs[:3])
  write_jsonl(tmp_path / "test.jsonl", docs[3:4])
  assert len(load_dataset(f"jsonl:{tmp_path}", "train")[0]) == 20
  assert len(load_dataset(f"jsonl:{tmp_path}", "dev")[0]) == 3
  assert len(load_dataset(f"jsonl:{tmp_path}/{{split}}.jsonl", "test")[0]) == 1
