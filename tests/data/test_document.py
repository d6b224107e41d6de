"""The Document record validates its input and names document and field in errors."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from flaxdoc.data import Document, DocumentError, Entity


def _doc(**kw):
  args = dict(id="d1", words=["Total", "9.00"], boxes=[[10, 10, 50, 20], [60, 10, 90, 20]],
              page_sizes=[[100, 100]])
  args.update(kw)
  return Document.create(**args)


def test_valid_document_fields_and_dtypes():
  d = _doc(entities=[("total", [1])], label_set=["total"], segments=[0, 1])
  assert len(d) == 2 and d.num_pages == 1
  assert d.boxes.dtype == np.float32 and d.boxes.shape == (2, 4)
  assert d.pages.dtype == np.int32 and d.segments.dtype == np.int32
  assert d.entities == (Entity("total", (1,)),)
  assert d.word_labels() == [None, "total"]
  assert d.entity_text(d.entities[0]) == "9.00"
  # LayoutLM units: x / width * 1000, rounded.
  np.testing.assert_array_equal(d.normalized_boxes()[1], [600, 100, 900, 200])


@pytest.mark.parametrize("kw, field, fragment", [
    (dict(words=["a"]), "boxes", "rows for 1 words"),
    (dict(boxes=[[0, 0, 1, 1], [0, 0, math.nan, 1]]), "boxes", "non-finite"),
    (dict(boxes=[[0, 0, 1, 1], [0, 0, math.inf, 1]]), "boxes", "non-finite"),
    (dict(boxes=[[5, 0, 1, 1], [0, 0, 1, 1]]), "boxes", "inverted"),
    (dict(boxes=[[0, 0, 1, 1], [0, 0, 150, 1]]), "boxes", "outside its page"),
    (dict(words=["a", " "]), "words", "empty"),
    (dict(words=["a", 3]), "words", "not str"),
    (dict(words="ab"), "words", "single string"),
    (dict(pages=[0, 1]), "pages", "only 1 page sizes"),
    (dict(pages=[0, -1]), "pages", "negative"),
    (dict(page_sizes=[[0, 100]]), "page_sizes", "positive"),
    (dict(segments=[0]), "segments", "shape"),
    (dict(entities=[("total", [5])]), "entities", "refers to word 5"),
    (dict(entities=[("total", [])]), "entities", "no words"),
    (dict(entities=[("x", [0]), ("y", [0])]), "entities", "belongs to entities"),
    (dict(entities=[("bogus", [0])], label_set=["total"]), "entities", "unknown label"),
    (dict(entities=[("total", [0])], relations=[(0, 3)]), "relations", "missing entity"),
    (dict(boxes=[["a", 0, 1, 1], [0, 0, 1, 1]]), "boxes", "numbers"),
    (dict(boxes=[[0, 0, 1, 1], [0, 0, 1e300, 1]]), "boxes", "non-finite"),
    (dict(segments=[0, 2**40]), "segments", "int32"),
    (dict(pages=[0, 2**33]), "pages", "int32"),
])
def test_errors_name_document_and_field(kw, field, fragment):
  with pytest.raises(DocumentError) as info:
    _doc(**kw)
  msg = str(info.value)
  assert "'d1'" in msg and f"'{field}'" in msg and fragment in msg, msg
  assert info.value.field == field and info.value.doc_id == "d1"


def test_clip_policy_repairs_and_records():
  d = _doc(boxes=[[-5, 0, 10, 10], [95, 5, 120, 2]], box_policy="clip")
  np.testing.assert_array_equal(d.boxes, [[0, 0, 10, 10], [95, 2, 100, 5]])
  assert len(d.repairs) == 2  # one swap note, one clip note
  assert any("inverted" in r for r in d.repairs) and any("clipped" in r for r in d.repairs)


def test_default_page_size_and_segments():
  d = Document.create("x", ["a", "b"], [[0, 0, 10, 5], [3, 4, 20, 30]])
  np.testing.assert_array_equal(d.page_sizes, [[20, 30]])
  np.testing.assert_array_equal(d.segments, [0, 1])


def test_multi_page_normalisation_uses_each_page_size():
  d = Document.create("m", ["a", "b"], [[0, 0, 50, 50], [0, 0, 50, 50]], pages=[0, 1],
                      page_sizes=[[100, 100], [200, 50]])
  np.testing.assert_array_equal(d.normalized_boxes(), [[0, 0, 500, 500], [0, 0, 250, 1000]])


def test_empty_document_is_allowed():
  d = Document.create("e", [], np.zeros((0, 4)), page_sizes=[[10, 10]])
  assert len(d) == 0 and d.normalized_boxes().shape == (0, 4)


def test_replace_revalidates():
  d = _doc()
  with pytest.raises(DocumentError):
    d.replace(words=["only one"])
  assert d.replace(id="d2").id == "d2"


_num = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32),
                 st.integers(-10**6, 10**6))


@settings(max_examples=150, deadline=None)
@given(words=st.lists(st.text(max_size=4), max_size=6),
       boxes=st.lists(st.lists(_num, min_size=0, max_size=5), max_size=7),
       pages=st.none() | st.lists(st.integers(-2, 3), max_size=7),
       ents=st.none() | st.lists(st.tuples(st.sampled_from(["a", "b", ""]),
                                           st.lists(st.integers(-2, 8), max_size=3)), max_size=3),
       policy=st.sampled_from(["error", "clip"]))
def test_fuzz_only_document_errors(words, boxes, pages, ents, policy):
  try:
    d = Document.create("fz", words, boxes, pages=pages, entities=ents, label_set=["a", "b"],
                        box_policy=policy)
  except DocumentError as e:
    assert "'fz'" in str(e)
    return
  assert np.isfinite(d.boxes).all()
  assert (d.boxes[:, 0] <= d.boxes[:, 2]).all() and (d.boxes[:, 1] <= d.boxes[:, 3]).all()
