"""Tests for flaxdoc.decode: constraints, Viterbi (numpy and JAX), pooling, entity assembly.

The references here are independent of the implementation: brute-force
enumeration of all T^L paths, the "a valid sequence re-tags to itself"
characterisation of the tag grammar, and plain Python loops.
"""

from __future__ import annotations

import itertools

import hypothesis
import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import numpy as np
import pytest

from flaxdoc import decode
from flaxdoc import metrics
from flaxdoc import tags as tagging
from flaxdoc.data.document import Document, DocumentError, Entity

SCHEMES = ("BIOES", "BIO")


# --------------------------------------------------------------------------- references
def is_valid_reference(tags: list[str], scheme: str) -> bool:
  """A sequence is valid iff it is exactly the tagging of the chunks read from it.

  (Every ill-formed piece either yields no chunk or a chunk whose re-tagging
  differs, so it does not survive the round trip.)
  """
  spans = tagging.tags_to_spans(tags, scheme)
  retagged = ["O"] * len(tags)
  for label, begin, stop in spans:
    retagged[begin:stop] = tagging.span_tags(stop - begin, label, scheme)
  return retagged == list(tags)


def valid_by_matrices(path, trans, start, end) -> bool:
  """All potentials on the path allow it (boolean True, or a finite float)."""
  if len(path) == 0:
    return True
  allowed = lambda x: x if x.dtype == bool else np.isfinite(x)
  trans, start, end = allowed(trans), allowed(start), allowed(end)
  ok = bool(start[path[0]]) and bool(end[path[-1]])
  return ok and all(trans[a, b] for a, b in zip(path[:-1], path[1:]))


def brute_force(scores, trans, start, end):
  """Best path by enumerating all T^L paths; potentials as float (-inf forbidden)."""
  length, num_tags = scores.shape
  as_pot = lambda x: np.where(x, 0.0, -np.inf) if x.dtype == bool else x
  trans, start, end = as_pot(trans), as_pot(start), as_pot(end)
  paths = np.array(list(itertools.product(range(num_tags), repeat=length)))  # [N, L]
  total = scores[np.arange(length), paths].sum(axis=1)  # [N]
  total += start[paths[:, 0]] + end[paths[:, -1]]
  for t in range(1, length):
    total += trans[paths[:, t - 1], paths[:, t]]
  best = int(np.argmax(total))
  return paths[best], float(total[best]), np.sort(total)


def make_doc(rng, num_words, labels=("a", "b", "c"), num_pages=1, entity_rate=0.5):
  """A random document whose entities are runs of consecutive words."""
  words = [f"w{i}" for i in range(num_words)]
  pages = np.sort(rng.integers(0, num_pages, num_words))
  page_sizes = np.array([[600.0, 800.0]] * num_pages)
  x0 = rng.uniform(0, 500, num_words)
  y0 = rng.uniform(0, 700, num_words)
  boxes = np.stack([x0, y0, x0 + rng.uniform(1, 90, num_words),
                    y0 + rng.uniform(1, 90, num_words)], axis=1)
  entities, i = [], 0
  while i < num_words:
    if rng.random() < entity_rate:
      n = int(rng.integers(1, 5))
      entities.append(Entity(str(rng.choice(labels)), tuple(range(i, min(i + n, num_words)))))
      i += n
    else:
      i += 1
  return Document.create("doc", words, boxes, pages=pages, page_sizes=page_sizes,
                         entities=entities, label_set=labels)


# --------------------------------------------------------------------------- constraints
@pytest.mark.parametrize("scheme", SCHEMES)
def test_allowed_transitions_match_grammar_on_all_short_sequences(scheme):
  names = tagging.tag_names(["a", "b"], scheme)
  trans, start, end = decode.allowed_transitions(names, scheme)
  assert trans.shape == (len(names), len(names)) and trans.dtype == bool
  num_valid = 0
  for length in range(1, 5):
    for path in itertools.product(range(len(names)), repeat=length):
      seq = [names[i] for i in path]
      ref = is_valid_reference(seq, scheme)
      assert valid_by_matrices(path, trans, start, end) == ref, seq
      assert (decode.first_invalid_transition(seq, scheme) is None) == ref, seq
      num_valid += ref
  assert num_valid > 100  # the check saw many valid sequences, not only invalid ones


def test_allowed_transitions_spelled_out():
  names = tagging.tag_names(["a", "b"], "BIOES")
  trans, start, end = decode.allowed_transitions(names, "BIOES")
  ok = lambda a, b: bool(trans[names.index(a), names.index(b)])
  assert ok("O", "B-b") and ok("E-a", "S-b") and ok("S-a", "O") and ok("B-a", "E-a")
  assert not ok("O", "I-a") and not ok("B-a", "I-b") and not ok("I-a", "O")
  assert not ok("S-a", "E-a") and not ok("B-a", "B-a")
  assert [names[i] for i in np.flatnonzero(~start)] == ["I-a", "E-a", "I-b", "E-b"]
  assert [names[i] for i in np.flatnonzero(~end)] == ["B-a", "I-a", "B-b", "I-b"]
  names = tagging.tag_names(["a", "b"], "BIO")
  trans, start, end = decode.allowed_transitions(names, "BIO")
  ok = lambda a, b: bool(trans[names.index(a), names.index(b)])
  assert ok("I-a", "B-b") and ok("I-a", "I-a") and ok("B-a", "O") and ok("I-b", "B-b")
  assert not ok("O", "I-a") and not ok("B-a", "I-b")
  assert end.all() and [names[i] for i in np.flatnonzero(~start)] == ["I-a", "I-b"]


def test_allowed_transitions_rejects_bad_vocabularies():
  with pytest.raises(ValueError, match="BIO scheme"):
    decode.allowed_transitions(["O", "B-a", "E-a"], "BIO")
  with pytest.raises(ValueError, match="duplicate"):
    decode.allowed_transitions(["O", "B-a", "B-a"], "BIO")
  with pytest.raises(ValueError, match="malformed"):
    decode.allowed_transitions(["O", "X-a"], "BIOES")
  with pytest.raises(ValueError, match="scheme"):
    decode.allowed_transitions(["O"], "IOB1")


# --------------------------------------------------------------------------- Viterbi, numpy
@pytest.mark.parametrize("scheme,labels", [("BIOES", ["a", "b"]), ("BIO", ["a", "b", "c", "d"])])
def test_viterbi_numpy_equals_brute_force(scheme, labels):
  names = tagging.tag_names(labels, scheme)
  assert len(names) == 9
  trans, start, end = decode.allowed_transitions(names, scheme)
  rng = np.random.default_rng(1)
  for length in range(1, 6):
    for _ in range(4):
      scores = rng.normal(size=(length, len(names))) * 3
      path, score = decode.viterbi_numpy(scores, trans, start, end)
      ref_path, ref_score, _ = brute_force(scores, trans, start, end)
      np.testing.assert_array_equal(path, ref_path)
      assert score == pytest.approx(ref_score, abs=1e-9)
      assert is_valid_reference([names[i] for i in path], scheme)


def test_viterbi_numpy_float_potentials_equal_brute_force():
  """A CRF-style float transition matrix (with some -inf) is decoded exactly."""
  rng = np.random.default_rng(2)
  num_tags = 6
  for length in range(1, 6):
    for _ in range(4):
      trans = rng.normal(size=(num_tags, num_tags))
      trans[rng.random((num_tags, num_tags)) < 0.3] = -np.inf
      start, end = rng.normal(size=num_tags), rng.normal(size=num_tags)
      start[0] = end[0] = 0.0
      trans[0, 0] = 0.0  # the all-0 path stays possible
      scores = rng.normal(size=(length, num_tags))
      path, score = decode.viterbi_numpy(scores, trans, start, end)
      ref_path, ref_score, _ = brute_force(scores, trans, start, end)
      np.testing.assert_array_equal(path, ref_path)
      assert score == pytest.approx(ref_score, abs=1e-9)


def test_viterbi_numpy_edge_cases_and_errors():
  names = tagging.tag_names(["a"], "BIOES")
  trans, start, end = decode.allowed_transitions(names, "BIOES")
  path, score = decode.viterbi_numpy(np.zeros((0, 5)), trans, start, end)
  assert path.shape == (0,) and score == 0.0
  # Arg-max per position is `O I-a E-a` (invalid); the constrained answer differs.
  scores = np.log(np.array([[0.6, 0.4, 0.0, 0.0, 0.0],
                            [0.0, 0.0, 0.9, 0.0, 0.1],
                            [0.0, 0.0, 0.0, 0.9, 0.1]]) + 1e-12)
  path, _ = decode.viterbi_numpy(scores, trans, start, end)
  assert [names[i] for i in path] == ["B-a", "I-a", "E-a"]
  # -inf everywhere in a row still gives a valid sequence.
  scores = np.full((4, 5), -np.inf)
  path, _ = decode.viterbi_numpy(scores, trans, start, end)
  assert is_valid_reference([names[i] for i in path], "BIOES")
  with pytest.raises(ValueError, match="finite"):
    decode.viterbi_numpy(np.array([[0.0, np.nan, 0, 0, 0]]), trans, start, end)
  with pytest.raises(ValueError, match="shape"):
    decode.viterbi_numpy(np.zeros((3, 4)), trans, start, end)
  with pytest.raises(ValueError, match="no tag sequence"):
    decode.viterbi_numpy(np.zeros((2, 5)), np.zeros((5, 5), bool), start, end)


# --------------------------------------------------------------------------- Viterbi, JAX
def _random_batch(rng, batch, length, num_tags, holes=False):
  scores = rng.normal(size=(batch, length, num_tags)).astype(np.float32) * 2
  if holes:
    mask = rng.random((batch, length)) < 0.7
  else:
    lengths = rng.integers(0, length + 1, batch)
    lengths[0] = length  # one full row
    mask = np.arange(length)[None] < lengths[:, None]
  return scores, mask


def _check_against_numpy(scores, mask, path, score, trans, start, end):
  """jnp path == numpy path (or, on a float32 near-tie, a path of equal score)."""
  exact = 0
  for b in range(scores.shape[0]):
    valid = mask[b]
    assert (path[b][~valid] == 0).all()
    ref_path, ref_score = (decode.viterbi_numpy(scores[b][valid], trans, start, end)
                           if valid.any() else (np.zeros(0, int), 0.0))
    got = path[b][valid]
    assert valid_by_matrices(got, trans, start, end)
    assert score[b] == pytest.approx(ref_score, rel=1e-5, abs=1e-4)
    if np.array_equal(got, ref_path):
      exact += 1
    else:  # only acceptable as a tie within float32 rounding
      got_score = scores[b][valid][np.arange(valid.sum()), got].sum()
      assert got_score == pytest.approx(ref_score, rel=1e-5, abs=1e-4)
  return exact


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("holes", [False, True])
def test_viterbi_jnp_equals_numpy_on_padded_batches(scheme, holes):
  labels = ["a", "b", "c"] if scheme == "BIOES" else ["a", "b", "c", "d", "e", "f"]
  names = tagging.tag_names(labels, scheme)  # T = 13 in both: one compilation
  trans, start, end = decode.allowed_transitions(names, scheme)
  rng = np.random.default_rng(3)
  scores, mask = _random_batch(rng, 16, 23, len(names), holes=holes)
  mask[1] = False  # an empty row
  path, score = decode.viterbi_jnp(scores, mask, trans, start, end, return_score=True)
  path, score = np.asarray(path), np.asarray(score)
  assert path.shape == (16, 23) and path.dtype == np.int32
  assert score[1] == 0.0 and (path[1] == 0).all()
  exact = _check_against_numpy(scores, mask, path, score, trans, start, end)
  assert exact >= 14


def test_viterbi_jnp_no_mask_float_potentials_and_bf16():
  rng = np.random.default_rng(4)
  num_tags = 7
  trans = rng.normal(size=(num_tags, num_tags)).astype(np.float32)
  trans[rng.random((num_tags, num_tags)) < 0.3] = -np.inf
  trans[0, 0] = 0.0
  start = np.zeros(num_tags, np.float32)
  end = rng.normal(size=num_tags).astype(np.float32)
  scores = rng.normal(size=(5, 11, num_tags)).astype(np.float32)
  path, score = decode.viterbi_jnp(scores, None, trans, start, end, return_score=True)
  exact = _check_against_numpy(scores, np.ones((5, 11), bool), np.asarray(path),
                               np.asarray(score), trans, start, end)
  assert exact >= 4
  # bf16 scores are accepted (computed in float32) and give a valid path.
  path = decode.viterbi_jnp(jax.numpy.asarray(scores, jax.numpy.bfloat16), None, trans, start,
                            end)
  for p in np.asarray(path):
    assert valid_by_matrices(p, trans, start, end)


def test_viterbi_jnp_is_one_scan_and_jits_inside_a_model():
  """The traced program does not grow with L (no Python loop over positions)."""
  names = tagging.tag_names(["a", "b"], "BIOES")
  trans, start, end = decode.allowed_transitions(names, "BIOES")

  def count(length):
    jaxpr = jax.make_jaxpr(lambda s, m: decode.viterbi_jnp(s, m, trans, start, end))(
        np.zeros((2, length, 9), np.float32), np.ones((2, length), bool))
    text = str(jaxpr)
    return len(text.splitlines()), text.count("scan[")

  lines_short, scans_short = count(3)
  lines_long, scans_long = count(200)
  assert lines_short == lines_long
  assert scans_short == scans_long == 2  # forward and backtracking

  @jax.jit
  def head(logits, mask):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return decode.viterbi_jnp(logp, mask, trans, start, end)

  rng = np.random.default_rng(5)
  logits, mask = _random_batch(rng, 4, 9, 9)
  out = np.asarray(head(logits, mask))
  for b in range(4):
    logp = np.asarray(jax.nn.log_softmax(logits[b][mask[b]], axis=-1))
    ref, _ = decode.viterbi_numpy(logp, trans, start, end)
    np.testing.assert_array_equal(out[b][mask[b]], ref)


# --------------------------------------------------------------------------- validity property
_SCORE = st.one_of(st.floats(-1e6, 1e6), st.just(-np.inf))


@hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
@hypothesis.given(scores=hnp.arrays(np.float64, (7, 9), elements=_SCORE),
                  scheme=st.sampled_from(SCHEMES))
def test_viterbi_numpy_output_is_always_valid(scores, scheme):
  labels = ["a", "b"] if scheme == "BIOES" else ["a", "b", "c", "d"]
  names = tagging.tag_names(labels, scheme)
  trans, start, end = decode.allowed_transitions(names, scheme)
  path, score = decode.viterbi_numpy(scores, trans, start, end)
  assert np.isfinite(score)
  assert is_valid_reference([names[i] for i in path], scheme)


@hypothesis.settings(max_examples=30, deadline=None, derandomize=True)
@hypothesis.given(scores=hnp.arrays(np.float32, (3, 7, 9),
                                    elements=st.one_of(st.floats(-1e6, 1e6, width=32),
                                                       st.just(np.float32(-np.inf)),
                                                       st.just(np.float32(np.nan)))),
                  lengths=st.lists(st.integers(0, 7), min_size=3, max_size=3))
def test_viterbi_jnp_output_is_always_valid(scores, lengths):
  names = tagging.tag_names(["a", "b"], "BIOES")
  trans, start, end = decode.allowed_transitions(names, "BIOES")
  mask = np.arange(7)[None] < np.array(lengths)[:, None]
  path = np.asarray(decode.viterbi_jnp(scores, mask, trans, start, end))
  for b in range(3):
    seq = [names[i] for i in path[b][: lengths[b]]]
    assert is_valid_reference(seq, "BIOES")
    assert (path[b][lengths[b]:] == 0).all()


# --------------------------------------------------------------------------- tokens -> words
def test_word_scores_from_tokens_matches_loops():
  rng = np.random.default_rng(6)
  num_words, num_tags = 7, 5
  word_ids = np.array([-1, 0, 0, 1, 3, 3, 3, 2, 5, 5, -1, -1])  # word 4 and 6 have no token
  scores = rng.normal(size=(len(word_ids), num_tags)).astype(np.float32)
  first = decode.word_scores_from_tokens(scores, word_ids, num_words, "first")
  mean = decode.word_scores_from_tokens(scores, word_ids, num_words, "mean")
  for w in range(num_words):
    rows = [scores[k] for k in range(len(word_ids)) if word_ids[k] == w]
    if rows:
      np.testing.assert_array_equal(first[w], rows[0])
      np.testing.assert_allclose(mean[w], np.mean(rows, axis=0), rtol=1e-6)
    else:  # certainly O
      assert first[w, 0] == mean[w, 0] == 0.0
      assert (first[w, 1:] <= -1e8).all() and (mean[w, 1:] <= -1e8).all()
  # Word order in the token stream does not matter for "first": the earliest token wins.
  perm_ids = np.array([2, 2, 0, 1, 0])
  perm_scores = rng.normal(size=(5, num_tags))
  out = decode.word_scores_from_tokens(perm_scores, perm_ids, 3, "first")
  np.testing.assert_array_equal(out, perm_scores[[2, 3, 0]])


def test_word_scores_from_tokens_errors():
  scores = np.zeros((4, 3))
  with pytest.raises(ValueError, match="outside"):
    decode.word_scores_from_tokens(scores, [0, 1, 2, 3], 3)
  with pytest.raises(ValueError, match="outside"):
    decode.word_scores_from_tokens(scores, [0, -2, 1, 1], 3)
  with pytest.raises(ValueError, match="shape"):
    decode.word_scores_from_tokens(scores, [0, 1, 2], 3)
  with pytest.raises(ValueError, match="no token"):
    decode.word_scores_from_tokens(scores, [0, 0, 2, -1], 3, missing="error")
  with pytest.raises(ValueError, match="reduce"):
    decode.word_scores_from_tokens(scores, [0, 0, 1, 2], 3, reduce="max")


# --------------------------------------------------------------------------- entities
@pytest.mark.parametrize("scheme", SCHEMES)
def test_round_trip_entities_tags_entities(scheme):
  rng = np.random.default_rng(7)
  gold_all, pred_all, total = [], [], 0
  for k in range(40):
    doc = make_doc(rng, int(rng.integers(0, 30)), num_pages=int(rng.integers(1, 3)))
    word_tags = decode.word_tags_from_entities(doc, doc.entities, scheme)
    back = decode.entities_from_word_tags(doc, word_tags, scheme)
    assert [(e.label, e.words) for e in back] == [(e.label, e.words) for e in doc.entities]
    assert decode.word_tags_from_entities(doc, back, scheme) == word_tags
    gold_all.append(word_tags)
    pred_all.append(decode.word_tags_from_entities(doc, back, scheme))
    total += len(back)
  assert total > 100
  scores = metrics.entity_scores(gold_all, pred_all, scheme)
  assert scores["f1"] == 1.0 and scores["num_gold"] == total


def test_entity_text_box_page_and_score():
  words = ["Total", ":", "12.50", "EUR", "Date", "next", "page"]
  boxes = [[10, 10, 50, 20], [52, 10, 55, 20], [60, 8, 100, 22], [105, 9, 130, 21],
           [10, 40, 40, 50], [10, 700, 40, 710], [20, 5, 60, 15]]
  doc = Document.create("receipt", words, boxes, pages=[0, 0, 0, 0, 0, 0, 1],
                        page_sizes=[[200, 720], [200, 300]], label_set=("total", "date"))
  word_tags = ["O", "O", "B-total", "E-total", "O", "B-date", "E-date"]
  names = tagging.tag_names(["total", "date"], "BIOES")
  rng = np.random.default_rng(8)
  logits = rng.normal(size=(7, len(names)))
  ents = decode.entities_from_word_tags(doc, word_tags, "BIOES", logits, tag_names=names)
  assert [e.label for e in ents] == ["total", "date"]
  total, date = ents
  assert total.text == "12.50 EUR" and total.words == (2, 3) and total.page == 0
  assert total.box == (60.0, 8.0, 130.0, 22.0)
  # The date runs over two pages: all words kept, box and page of the first page.
  assert date.words == (5, 6) and date.text == "next page" and date.page == 0
  assert date.box == (10.0, 700.0, 40.0, 710.0)
  prob = lambda w, tag: np.exp(logits[w, names.index(tag)]) / np.exp(logits[w]).sum()
  assert total.score == pytest.approx((prob(2, "B-total") + prob(3, "E-total")) / 2)
  # tag_names default to the document's label set.
  again = decode.entities_from_word_tags(doc, word_tags, "BIOES", logits)
  assert again == ents
  assert decode.entities_from_word_tags(doc, word_tags, "BIOES")[0].score is None


def test_entities_from_word_tags_errors_and_lenient():
  doc = Document.create("d", ["a", "b", "c"], [[0, 0, 1, 1]] * 3, label_set=("x",))
  with pytest.raises(DocumentError, match="3 words"):
    decode.entities_from_word_tags(doc, ["O", "O"], "BIOES")
  with pytest.raises(DocumentError, match="ill-formed.*word 1"):
    decode.entities_from_word_tags(doc, ["O", "I-x", "E-x"], "BIOES")
  with pytest.raises(DocumentError, match="ends inside"):
    decode.entities_from_word_tags(doc, ["O", "B-x", "I-x"], "BIOES")
  with pytest.raises(DocumentError, match="malformed"):
    decode.entities_from_word_tags(doc, ["O", "Q-x", "O"], "BIOES")
  with pytest.raises(DocumentError, match="BIO scheme"):
    decode.entities_from_word_tags(doc, ["S-x", "O", "O"], "BIO")
  ents = decode.entities_from_word_tags(doc, ["I-x", "S-x", "O"], "BIOES", lenient=True)
  assert [(e.label, e.words) for e in ents] == [("x", (1,))]
  with pytest.raises(DocumentError, match="shape"):
    decode.entities_from_word_tags(doc, ["O", "S-x", "O"], "BIOES", np.zeros((3, 4)))
  with pytest.raises(DocumentError, match="document 'd'"):
    decode.word_tags_from_entities(doc, [Entity("x", (0, 1)), Entity("x", (1, 2))], "BIOES")
  with pytest.raises(DocumentError, match="unknown label"):
    decode.word_tags_from_entities(doc, [Entity("y", (0,))], "BIOES")
  # A model's predictions are checked against the model's labels, not the document's set.
  assert decode.word_tags_from_entities(doc, [Entity("y", (0,))], "BIOES",
                                        labels=("x", "y")) == ["S-y", "O", "O"]
  with pytest.raises(DocumentError, match=r"unknown label 'x' \(known: \['y'\]\)"):
    decode.word_tags_from_entities(doc, [Entity("x", (0,))], "BIOES", labels=("y",))
  with pytest.raises(DocumentError, match="refers to word 5"):
    decode.word_tags_from_entities(doc, [Entity("x", (5,))], "BIOES")


# --------------------------------------------------------------------------- decode_document
@pytest.mark.parametrize("scheme", SCHEMES)
def test_decode_document_recovers_gold_from_confident_scores(scheme):
  rng = np.random.default_rng(9)
  doc = make_doc(rng, 40, num_pages=2)
  names = tagging.tag_names(list(doc.label_set), scheme)
  gold = decode.word_tags_from_entities(doc, doc.entities, scheme)
  # Noisy logits whose arg-max is the gold tag at 80% of the words, else random.
  logits = rng.normal(size=(len(doc), len(names)))
  for i, t in enumerate(gold):
    if rng.random() < 0.8:
      logits[i, names.index(t)] += 8.0
  ents = decode.decode_document(doc, logits, names, scheme)
  pred = decode.word_tags_from_entities(doc, ents, scheme)
  assert is_valid_reference(pred, scheme)
  assert all(0.0 < e.score <= 1.0 for e in ents)
  # Viterbi over log-softmax(logits) is the best *valid* sequence: compare with
  # the score of the gold sequence (which is valid) and of the decoded one.
  logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
  path_score = lambda seq: sum(logp[i, names.index(t)] for i, t in enumerate(seq))
  assert path_score(pred) >= path_score(gold) - 1e-9
  # With confident scores everywhere the gold entities come back exactly.
  sharp = np.full((len(doc), len(names)), -20.0)
  sharp[np.arange(len(doc)), [names.index(t) for t in gold]] = 0.0
  ents = decode.decode_document(doc, sharp, names, scheme)
  assert [(e.label, e.words) for e in ents] == [(e.label, e.words) for e in doc.entities]
  assert all(e.score == pytest.approx(1.0, abs=1e-6) for e in ents)


def test_decode_document_equals_brute_force_on_a_small_document():
  rng = np.random.default_rng(10)
  doc = make_doc(rng, 5, labels=("a", "b"))
  names = tagging.tag_names(["a", "b"], "BIOES")
  trans, start, end = decode.allowed_transitions(names, "BIOES")
  logits = rng.normal(size=(5, len(names))) * 2
  logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
  ref_path, _, _ = brute_force(logp, trans, start, end)
  ents = decode.decode_document(doc, logits, names, "BIOES")
  pred = decode.word_tags_from_entities(doc, ents, "BIOES")
  assert pred == [names[i] for i in ref_path]


def test_decode_document_errors_and_empty():
  names = tagging.tag_names(["a"], "BIOES")
  doc = Document.create("d", ["x", "y"], [[0, 0, 1, 1]] * 2)
  with pytest.raises(DocumentError, match="shape"):
    decode.decode_document(doc, np.zeros((3, 5)), names)
  with pytest.raises(DocumentError, match="NaN"):
    decode.decode_document(doc, np.full((2, 5), np.nan), names)
  empty = Document.create("e", [], np.zeros((0, 4)))
  assert decode.decode_document(empty, np.zeros((0, 5)), names) == []
