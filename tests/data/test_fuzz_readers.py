"""Fuzzing the readers with malformed input: only `DocumentError`, never a crash, never NaN.

Each case starts from a valid file, breaks it (a value replaced by arbitrary JSON
including NaN / Infinity / huge numbers, a key deleted, bytes inserted or cut,
entities pointing anywhere), and checks that the reader either returns finite,
valid documents or raises `DocumentError` naming the file; with
`on_error="skip"` it never raises and accounts for every document.
"""

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from flaxdoc.bench.fuzz import json_paths
from flaxdoc.data import DocumentError
from flaxdoc.data.cord import load_cord
from flaxdoc.data.funsd import load_funsd
from flaxdoc.data.jsonl import FORMAT, read_jsonl
from flaxdoc.data.sroie import load_sroie

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**40, 10**40),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e38, 3.5e38, -1e300, 0.5]),
    st.text(max_size=6), st.sampled_from(["", " ", "question", "menu.nm", "total", "\x00"]))
json_values = st.recursive(
    _scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=5), c,
                                                                  max_size=3),
    max_leaves=8)


@st.composite
def mutated_json_bytes(draw, obj):
  """`obj` with a few random structural mutations, serialised, maybe byte-damaged."""
  obj = json.loads(json.dumps(obj))
  for _ in range(draw(st.integers(1, 3))):
    paths = list(json_paths(obj))
    path = draw(st.sampled_from(paths))
    if not path:
      if draw(st.integers(0, 9)) == 0:
        obj = draw(json_values)
      continue
    parent = obj
    for key in path[:-1]:
      parent = parent[key]
    action = draw(st.sampled_from(["replace", "replace", "delete", "inflate"]))
    if action == "delete":
      del parent[path[-1]]
    elif action == "inflate" and isinstance(parent[path[-1]], list) and parent[path[-1]]:
      parent[path[-1]] = parent[path[-1]] * draw(st.integers(2, 50))
    else:
      parent[path[-1]] = draw(json_values)
  raw = json.dumps(obj).encode()  # NaN / Infinity become JSON literals
  damage = draw(st.sampled_from(["none", "none", "insert", "truncate"]))
  if damage == "insert":
    at = draw(st.integers(0, len(raw)))
    raw = raw[:at] + draw(st.binary(min_size=1, max_size=4)) + raw[at:]
  elif damage == "truncate":
    raw = raw[:draw(st.integers(0, len(raw)))]
  return raw


def _check_documents(docs):
  for d in docs:
    assert np.isfinite(d.boxes).all() and np.isfinite(d.page_sizes).all()
    assert (d.page_sizes > 0).all() and (d.boxes[:, :2] <= d.boxes[:, 2:]).all()
    assert (d.segments >= 0).all() and (d.pages >= 0).all()
    assert all(w.strip() for w in d.words)


def _load_both_ways(load, root, name_fragment, n_files):
  """Runs a reader with on_error='raise' and 'skip' and checks the contract."""
  try:
    docs, _ = load(root, "train")
  except DocumentError as e:
    assert name_fragment in str(e), str(e)
    assert str(e).count(":") >= 1
  else:
    _check_documents(docs)
  docs, report = load(root, "train", on_error="skip")
  _check_documents(docs)
  assert len(docs) + len(report.skipped_documents) == n_files


# ----------------------------------------------------------------------------- JSON Lines
_DOC = {"format": FORMAT, "id": "d", "words": ["Total", "9.00", "Date"],
        "boxes": [[10, 10, 50, 20], [60, 10, 90, 20], [10, 30, 40, 40]], "pages": [0, 0, 0],
        "page_sizes": [[100, 100]], "segments": [0, 0, 1],
        "entities": [{"label": "total", "words": [1]}, {"label": "date", "words": [2]}],
        "relations": [[0, 1]], "label_set": ["total", "date"]}


@SETTINGS
@given(st.data(), st.sampled_from(["error", "clip"]))
def test_fuzz_read_jsonl(data, box_policy):
  raw = data.draw(mutated_json_bytes(_DOC))
  with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "fuzz.jsonl"
    path.write_bytes(json.dumps(_DOC).encode() + b"\n" + raw.replace(b"\n", b" ") + b"\n")
    try:
      docs, _ = read_jsonl(path, box_policy=box_policy)
    except DocumentError as e:
      assert "fuzz.jsonl:2" in str(e), str(e)
    else:
      _check_documents(docs)
    docs, report = read_jsonl(path, on_error="skip", box_policy=box_policy)
    _check_documents(docs)
    assert docs[0].id == "d"
    blank = not raw.replace(b"\n", b" ").strip()
    assert len(docs) + len(report.skipped_documents) == (1 if blank else 2)


# ----------------------------------------------------------------------------- FUNSD
_FORM = {"form": [
    {"id": 0, "label": "question", "text": "DATE:", "box": [10, 10, 60, 20],
     "words": [{"text": "DATE:", "box": [10, 10, 60, 20]}], "linking": [[0, 1]]},
    {"id": 1, "label": "answer", "text": "1/2/99", "box": [70, 10, 120, 20],
     "words": [{"text": "1/2/99", "box": [70, 10, 120, 20]}, {"text": "", "box": [0, 0, 1, 1]}],
     "linking": [[0, 1]]},
    {"id": 2, "label": "other", "text": "", "box": [0, 0, 5, 5],
     "words": [{"text": "", "box": [0, 0, 5, 5]}], "linking": []},
]}


@SETTINGS
@given(st.data())
def test_fuzz_funsd(data):
  raw = data.draw(mutated_json_bytes(_FORM))
  with tempfile.TemporaryDirectory() as tmp:
    ann = Path(tmp) / "training_data" / "annotations"
    ann.mkdir(parents=True)
    (ann / "good.json").write_text(json.dumps(_FORM))
    (ann / "fuzzed.json").write_bytes(raw)
    (Path(tmp) / "training_data" / "images").mkdir()
    (Path(tmp) / "training_data" / "images" / "fuzzed.png").write_bytes(raw[:40])
    _load_both_ways(load_funsd, tmp, "fuzzed.json", 2)


# ----------------------------------------------------------------------------- CORD
def _quad(x0, y0, x1, y1):
  return {"x1": x0, "y1": y0, "x2": x1, "y2": y0, "x3": x1, "y3": y1, "x4": x0, "y4": y1}


_RECEIPT = {
    "meta": {"version": "2.0.0", "image_id": 0, "image_size": {"width": 300, "height": 400}},
    "valid_line": [
        {"category": "menu.nm", "group_id": 1, "sub_group_id": 0,
         "words": [{"quad": _quad(10, 10, 50, 20), "text": "Nasi", "is_key": 0, "row_id": 1},
                   {"quad": _quad(55, 10, 90, 20), "text": "Goreng", "is_key": 0, "row_id": 1}]},
        {"category": "total.total_price", "group_id": 2, "sub_group_id": 0,
         "words": [{"quad": _quad(10, 30, 50, 40), "text": "25,000", "is_key": 0, "row_id": 2},
                   {"quad": _quad(60, 30, 70, 40), "text": " ", "is_key": 0, "row_id": 2}]},
    ]}


@SETTINGS
@given(st.data())
def test_fuzz_cord(data):
  raw = data.draw(mutated_json_bytes(_RECEIPT))
  with tempfile.TemporaryDirectory() as tmp:
    d = Path(tmp) / "train" / "json"
    d.mkdir(parents=True)
    (d / "good.json").write_text(json.dumps(_RECEIPT))
    (d / "fuzzed.json").write_bytes(raw)
    _load_both_ways(load_cord, tmp, "fuzzed.json", 2)


# ----------------------------------------------------------------------------- SROIE
_coord = st.one_of(st.integers(-50, 500).map(str), st.sampled_from(
    ["nan", "inf", "-inf", "1e999", "3.5e38", "", "x", " 12 ", "1_0", "\u0661\u0662"]))
_transcript = st.text(st.characters(blacklist_categories=("Cs",)), max_size=15)
_line = st.one_of(
    st.builds(lambda cs, t: ",".join(cs) + "," + t, st.lists(_coord, min_size=8, max_size=8),
              _transcript),
    st.builds(lambda a, b, c, d, t: f"{a},{b},{c},{b},{c},{d},{a},{d},{t}",
              st.integers(0, 300), st.integers(0, 300), st.integers(0, 300),
              st.integers(0, 300), _transcript),
    _transcript)
_keys = {"company": "SHOP SDN BHD", "date": "01/02/2019", "address": "JALAN 1, KL",
         "total": "9.00"}


@SETTINGS
@given(st.lists(_line, max_size=8), mutated_json_bytes(_keys),
       st.sampled_from(["\n", "\r\n", "\r"]), st.binary(max_size=3))
def test_fuzz_sroie(lines, keys_raw, newline, junk):
  with tempfile.TemporaryDirectory() as tmp:
    root = Path(tmp) / "train"
    (root / "box").mkdir(parents=True)
    (root / "entities").mkdir()
    good = ["10,10,90,10,90,20,10,20,SHOP SDN BHD", "10,30,90,30,90,40,10,40,TOTAL 9.00"]
    (root / "box" / "good.txt").write_text("\n".join(good) + "\n")
    (root / "entities" / "good.txt").write_text(json.dumps(_keys))
    (root / "box" / "fuzzed.txt").write_bytes(newline.join(lines).encode("utf-8") + junk)
    (root / "entities" / "fuzzed.txt").write_bytes(keys_raw)
    try:
      docs, report = load_sroie(tmp, "train")
    except DocumentError as e:
      assert "fuzzed.txt" in str(e), str(e)
    else:
      _check_documents(docs)
      for d in docs:
        for e in d.entities:
          assert e.label in ("company", "date", "address", "total")
    docs, report = load_sroie(tmp, "train", on_error="skip")
    _check_documents(docs)
    assert len(docs) + len(report.skipped_documents) == 2


@pytest.mark.parametrize("raw", [b"", b"\xff\xfe\x00", b"{}", b"[]", b'{"form": {}}',
                                 b'{"form": [{"id": 0, "label": "header", "words": [], '
                                 b'"linking": []}]}'])
def test_funsd_degenerate_files(tmp_path, raw):
  ann = tmp_path / "training_data" / "annotations"
  ann.mkdir(parents=True)
  (ann / "x.json").write_bytes(raw)
  docs, report = load_funsd(tmp_path, "train", on_error="skip")
  assert docs == [] and len(report.skipped_documents) == 1
  where, reason = report.skipped_documents[0]
  assert where == "x" and reason
