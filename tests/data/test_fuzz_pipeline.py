"""Fuzzing the whole input path: JSON Lines bytes -> `Document` -> `featurize` -> batch.

Each case is one JSON Lines file built from a valid document and then broken
(wrong types, NaN / inf / huge numbers, bad entities, odd strings: lone
surrogates, control characters, invisible and astral characters), serialised
either as JSON or with `\\uXXXX` escapes. The only failure allowed is the
documented `DocumentError`; whatever is accepted must give finite arrays, boxes
in [0, 1000] and ids inside the tokenizer's vocabulary, for every tokenizer class.
Derandomized and bounded (300 examples, ~30 s) so it runs in the default suite;
`python -m flaxdoc.bench.fuzz` is the long campaign.
"""

import json
import logging
import math
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from flaxdoc.data.document import DocumentError
from flaxdoc.data.features import FeatureConfig, batch_features, featurize
from flaxdoc.data.jsonl import FORMAT, read_jsonl

sys.path.insert(0, os.path.dirname(__file__))
from small_tokenizers import one_of_each  # pylint: disable=import-error,wrong-import-position

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])
LABELS = ["question", "answer", "header"]

ODD_STRINGS = ["\ud800", "a\udfffb", "\x00", "x\x1by", "\x7f", "\u200b", "\ufeff", "🙂", "a\u0301",
               "東京", "\u2028", "\t", " ", "", "[CLS]", "<mask>", "\U0010ffff", "\ufffd" * 3]
ODD_NUMBERS = [float("nan"), float("inf"), -float("inf"), 1e300, -1e300, 3.5e38, 2**63, -1, 0.5,
               1e-320]
odd_values = st.one_of(
    st.none(), st.booleans(), st.sampled_from(ODD_NUMBERS), st.integers(-2**70, 2**70),
    st.sampled_from(ODD_STRINGS), st.text(max_size=8),
    st.lists(st.sampled_from(ODD_NUMBERS + [0, 1, 10]), max_size=5),
    st.dictionaries(st.sampled_from(["label", "words", "x"]), st.integers(-3, 9), max_size=2))


@st.composite
def base_document(draw):
  """A valid format-1 JSON object (odd but valid words included)."""
  n = draw(st.integers(1, 12))
  width, height = draw(st.sampled_from([(100, 100), (612, 792), (2480, 3508), (1, 1)]))
  words, boxes = [], []
  for _ in range(n):
    words.append(draw(st.one_of(st.sampled_from(["Total", "9.00", "Name:", "é", "🙂", "x\ty"]),
                                st.text(min_size=1, max_size=10).filter(str.strip))))
    x0 = draw(st.floats(0, width, allow_nan=False))
    y0 = draw(st.floats(0, height, allow_nan=False))
    boxes.append([x0, y0, draw(st.floats(x0, width)), draw(st.floats(y0, height))])
  obj = {"format": FORMAT, "id": draw(st.sampled_from(["doc-1", "é", "x" * 300])),
         "words": words, "boxes": boxes, "page_sizes": [[width, height]]}
  if draw(st.booleans()):
    obj["segments"] = [draw(st.integers(0, 3)) for _ in range(n)]
  if draw(st.booleans()):
    k = draw(st.integers(0, n))
    obj["entities"] = [{"label": draw(st.sampled_from(LABELS)), "words": [i]} for i in range(k)]
    obj["label_set"] = LABELS
  return obj


@st.composite
def broken_line(draw):
  """(JSON Lines bytes, what was broken) for one document."""
  obj = draw(base_document())
  what = []
  n = len(obj["words"])
  for _ in range(draw(st.integers(0, 3))):
    kind = draw(st.sampled_from(["field", "word", "box", "entity", "drop", "page"]))
    i = draw(st.integers(0, n - 1))
    if kind == "field":
      key = draw(st.sampled_from(sorted(obj)))
      obj[key] = draw(odd_values)
    elif kind == "word" and isinstance(obj.get("words"), list) and i < len(obj["words"]):
      obj["words"][i] = draw(st.one_of(st.sampled_from(ODD_STRINGS), odd_values,
                                       st.text(min_size=1, max_size=5).map(lambda s: s + "\ud8a0")))
    elif kind == "box" and isinstance(obj.get("boxes"), list) and i < len(obj["boxes"]):
      obj["boxes"][i] = draw(st.one_of(st.lists(st.sampled_from(ODD_NUMBERS + [0, 5]),
                                                min_size=4, max_size=4), odd_values))
    elif kind == "entity":
      obj.setdefault("entities", []).append(
          {"label": draw(st.sampled_from(LABELS + ["", "nope", "\ud800"])),
           "words": draw(st.lists(st.integers(-2, n + 1), max_size=3))})
    elif kind == "drop" and len(obj) > 1:
      del obj[draw(st.sampled_from(sorted(obj)))]
    elif kind == "page":
      obj["page_sizes"] = draw(st.lists(st.lists(st.sampled_from(ODD_NUMBERS + [100.0]),
                                                 min_size=2, max_size=2), max_size=2))
    what.append(kind)
  ascii_only = draw(st.booleans())
  try:
    text = json.dumps(obj, ensure_ascii=ascii_only, allow_nan=True)
    data = text.encode("utf-8")
  except UnicodeEncodeError:  # lone surrogates: only the escaped form is a JSON Lines line
    data = json.dumps(obj, ensure_ascii=True, allow_nan=True).encode("ascii")
  return data + b"\n", what


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
  return list(one_of_each(tmp_path_factory.mktemp("fuzz_pipeline")).values())


@SETTINGS
@given(case=broken_line(), which=st.integers(0, 2), max_len=st.integers(8, 64),
       policy=st.sampled_from(["error", "replace"]), graph=st.booleans())
def test_jsonl_to_batch_only_document_errors(tokenizers, tmp_path, case, which, max_len, policy,
                                             graph):
  data, what = case
  tok = tokenizers[which]
  path = tmp_path / "case.jsonl"
  path.write_bytes(data)
  config = FeatureConfig(max_len=max_len, labels=tuple(LABELS), graph=graph)
  try:
    docs, _ = read_jsonl(path, text_policy=policy, box_policy="clip" if graph else "error")
    windows = [w for doc in docs for w in featurize(doc, tok, config)]
  except DocumentError as e:
    assert str(e), "a DocumentError must say what is wrong"
    event(f"DocumentError on {e.field}")
    return
  event(f"accepted ({'+'.join(sorted(set(what))) or 'unbroken'})")
  assert docs and windows
  for doc in docs:
    assert np.isfinite(doc.boxes).all() and np.isfinite(doc.page_sizes).all()
    assert all(w.strip() and not any(0xD800 <= ord(c) <= 0xDFFF for c in w) for w in doc.words)
  batch = batch_features(windows)
  for key, value in batch.items():
    assert value.shape[0] == len(windows), key
    if value.dtype.kind == "f":
      assert np.isfinite(value).all(), key
  ids = batch["input_ids"]
  assert ids.min() >= 0 and ids.max() < tok.vocab_size
  assert batch["boxes"].min() >= 0 and batch["boxes"].max() <= 1000
  assert batch["word_ids"].min() >= -1
  assert batch["word_ids"].max() < max(len(d) for d in docs)
  assert batch["tags"].min() >= -1 and batch["tags"].max() < config.num_tags
  if graph:
    n_pos = batch["neighbor_ids"]
    assert n_pos.min() >= 0 and n_pos.max() < max_len


def test_the_reported_crash_is_now_a_document_error(tmp_path, tokenizers):
  """The fuzz run that filed issue 15: a lone surrogate used to kill SentencePiece."""
  line = json.dumps({"format": FORMAT, "id": "s", "words": ["\ud800"], "boxes": [[0, 0, 1, 1]],
                     "page_sizes": [[2, 2]]})
  (tmp_path / "s.jsonl").write_text(line + "\n", encoding="ascii")
  with pytest.raises(DocumentError, match="word 0 .*lone surrogate"):
    read_jsonl(tmp_path / "s.jsonl")
  docs, _ = read_jsonl(tmp_path / "s.jsonl", text_policy="replace")
  assert not math.isnan(float(featurize(docs[0], tokenizers[0], FeatureConfig(max_len=8))[0]
                              ["input_ids"].sum()))


@pytest.mark.slow
def test_fuzz_campaign_has_no_crash():
  """A short run of the `python -m flaxdoc.bench.fuzz` campaign (the README's counts: 10,000)."""
  from flaxdoc.bench import fuzz  # pylint: disable=import-outside-toplevel
  result = fuzz.run(500, seed=1, progress=False)
  assert not result["crashes"], result["crashes"][:5]
  counts = result["counts"]
  assert "jsonl" in counts and "pdf" in counts
  assert sum(sum(c.values()) for c in counts.values()) == 500
  for source, c in counts.items():  # every source exercises both the accepting and the refusing path
    assert c.get("accepted", 0) > 0 and c.get("DocumentError", 0) > 0, (source, c)
  rows = fuzz.table_rows(result)
  assert rows[-1]["source"] == "total" and rows[-1]["crash"] == 0
  # Deterministic in the seed (no state leaks from one case into the next).
  again = fuzz.run(100, seed=1, progress=False)["counts"]
  first = fuzz.run(100, seed=1, progress=False)["counts"]
  assert again == first


@pytest.mark.parametrize("level", [logging.NOTSET, logging.INFO])
def test_fuzz_campaign_puts_the_log_level_back(level):
  """The campaign quiets flaxdoc's repair warnings while it runs, then restores the caller's
  level (it used to leave ERROR behind, and a later test in the same session that waited for a
  warning failed depending on test order)."""
  from flaxdoc.bench import fuzz  # pylint: disable=import-outside-toplevel
  logger = logging.getLogger("flaxdoc")
  before = logger.level
  seen = []
  try:
    logger.setLevel(level)
    fuzz.run(2, seed=0, sources=("jsonl",), progress=False,
             on_case=lambda *_: seen.append(logger.level))
    assert seen == [logging.ERROR] * 2
    assert logger.level == level
  finally:
    logger.setLevel(before)
