"""Featurisation: hand-checked windows, valid tags, window cover and overlap, stitch, graph."""

import sys
import types
import zlib

import numpy as np
import pytest

from flaxdoc import tags as tags_lib
from flaxdoc.data.document import Document, DocumentError
from flaxdoc.data.features import (FeatureConfig, batch_features, featurize, stitch, window_spans,
                                   WINDOW_KEYS)


class ChunkTokenizer:
  """Deterministic test tokenizer: a word is cut into chunks of `k` characters."""
  name = "chunk"
  vocab_size = 1000
  pad_id, unk_id, cls_id, sep_id, mask_id = 0, 1, 2, 3, 4

  def __init__(self, k: int = 4):
    self.k = k

  def encode_word(self, word):
    return [5 + zlib.crc32(word[i:i + self.k].encode()) % 995 for i in range(0, len(word), self.k)]

  def id_to_piece(self, i):
    return f"<{i}>"


TOK = ChunkTokenizer()
LABELS = ("date", "total")


def _hand_doc():
  return Document.create(
      "hand", ["Date:", "12/03/2021", "Total", "42"],
      [[0, 0, 100, 50], [100, 0, 300, 50], [0, 100, 100, 150], [100, 100, 200, 150]],
      page_sizes=[[1000, 500]], segments=[7, 7, 3, 3], entities=[("date", [1]), ("total", [3])])


def random_doc(rng, n_words, *, n_pages=1, max_chars=9, labels=("a", "b", "c"), doc_id="r",
               interleave_segments=False):
  """A random document: words, boxes on their pages, segment runs and entity runs."""
  alphabet = list("abcdefghijklmnopqrstuvwxyzÄé0123456789:$.-")
  words = ["".join(rng.choice(alphabet, rng.integers(1, max_chars + 1))) for _ in range(n_words)]
  pages = np.sort(rng.integers(0, n_pages, n_words))
  pages[: min(n_pages, n_words)] = np.arange(min(n_pages, n_words))  # every page used
  pages = np.sort(pages)
  x0 = rng.uniform(0, 700, n_words)
  y0 = rng.uniform(0, 900, n_words)
  w, h = rng.uniform(1, 100, n_words), rng.uniform(1, 100, n_words)
  boxes = np.stack([x0, y0, x0 + w, y0 + h], 1)
  if interleave_segments:
    segments = rng.integers(0, max(1, n_words // 3), n_words)
  else:
    segments = np.cumsum(rng.random(n_words) < 0.3)
  entities, i = [], 0
  while i < n_words:
    if rng.random() < 0.35:
      length = int(rng.integers(1, 5))
      idx = list(range(i, min(i + length, n_words)))
      if len(idx) > 2 and rng.random() < 0.2:
        idx.pop(1)  # a non-contiguous entity: tagged as two runs
      entities.append((labels[int(rng.integers(len(labels)))], idx))
      i += length
    i += 1
  return Document.create(doc_id, words, boxes, pages=pages, page_sizes=[[800, 1000]] * n_pages,
                         segments=segments, entities=entities, label_set=labels)


def _doc_tokens(doc, tok=TOK):
  ids, word_ids = [], []
  for w, word in enumerate(doc.words):
    pieces = tok.encode_word(word)
    ids += pieces
    word_ids += [w] * len(pieces)
  return np.array(ids), np.array(word_ids)


def _content(win):
  """Window positions of real (non-special, non-pad) tokens."""
  return np.flatnonzero(win["word_ids"] >= 0)


# --------------------------------------------------------------------------- hand-checked
def test_hand_checked_window():
  doc = _hand_doc()
  (w,) = featurize(doc, TOK, FeatureConfig(max_len=12, stride=2, labels=LABELS))
  assert set(w) == set(WINDOW_KEYS)
  # Tokens: [CLS] Date : | 12/0 3/20 21 | Tota l | 42 [SEP] pad pad
  np.testing.assert_array_equal(w["word_ids"], [-1, 0, 0, 1, 1, 1, 2, 2, 3, -1, -1, -1])
  np.testing.assert_array_equal(w["subtoken_index"], [-1, 0, 1, 0, 1, 2, 0, 1, 0, -1, -1, -1])
  chunks = ["Date", ":", "12/0", "3/20", "21", "Tota", "l", "42"]
  np.testing.assert_array_equal(
      w["input_ids"], [2] + [TOK.encode_word(c)[0] for c in chunks] + [3, 0, 0])
  np.testing.assert_array_equal(w["attention_mask"], [1] * 10 + [0] * 2)
  np.testing.assert_array_equal(w["positions"], np.arange(12))
  # Page 1000 x 500 px: x * 1, y * 2 in LayoutLM units; CLS zeros, SEP 1000s, pads zeros.
  np.testing.assert_array_equal(w["boxes"], [
      [0, 0, 0, 0], [0, 0, 100, 100], [0, 0, 100, 100], [100, 0, 300, 100], [100, 0, 300, 100],
      [100, 0, 300, 100], [0, 200, 100, 300], [0, 200, 100, 300], [100, 200, 200, 300],
      [1000, 1000, 1000, 1000], [0, 0, 0, 0], [0, 0, 0, 0]])
  # Segments 7, 7, 3, 3 renumbered by first appearance; word index inside its segment.
  np.testing.assert_array_equal(w["segment_ids"], [-1, 0, 0, 0, 0, 0, 1, 1, 1, -1, -1, -1])
  np.testing.assert_array_equal(w["token_in_segment"], [-1, 0, 0, 1, 1, 1, 0, 0, 1, -1, -1, -1])
  np.testing.assert_array_equal(w["page_ids"], np.zeros(12))
  assert int(w["window_index"]) == 0 and int(w["window_start"]) == 0
  for key in WINDOW_KEYS:
    assert w[key].dtype == np.int32, key


# Tag vocabularies: BIOES: O B-date I-date E-date S-date B-total I-total E-total S-total
#                   BIO:   O B-date I-date B-total I-total
@pytest.mark.parametrize("scheme,all_subtokens,expected", [
    ("BIOES", False, [-1, 0, -1, 4, -1, -1, 0, -1, 8, -1]),
    ("BIOES", True, [-1, 0, 0, 1, 2, 3, 0, 0, 8, -1]),   # S-date on 3 sub-tokens -> B I E
    ("BIO", False, [-1, 0, -1, 1, -1, -1, 0, -1, 3, -1]),
    ("BIO", True, [-1, 0, 0, 1, 2, 2, 0, 0, 3, -1]),
])
def test_hand_checked_tags(scheme, all_subtokens, expected):
  cfg = FeatureConfig(max_len=12, labels=LABELS, scheme=scheme, label_all_subtokens=all_subtokens)
  (w,) = featurize(_hand_doc(), TOK, cfg)
  np.testing.assert_array_equal(w["tags"], expected + [-1, -1])


def test_hand_checked_windows_and_stitch():
  # Content of 4 tokens per window, overlap >= 1: words have 2, 3, 2, 1 tokens.
  doc = _hand_doc()
  wins = featurize(doc, TOK, FeatureConfig(max_len=6, stride=1, labels=LABELS))
  got = [(int(w["window_start"]), w["word_ids"][_content(w)].tolist()) for w in wins]
  # Whole words only; each window reaches past the previous one.
  assert got == [(0, [0, 0]), (2, [1, 1, 1]), (5, [2, 2, 3])]
  scores = [np.eye(4)[np.maximum(w["word_ids"], 0)] for w in wins]
  np.testing.assert_array_equal(stitch(doc, wins, scores), np.eye(4))


def test_cut_entity_is_tagged_validly_in_each_window():
  words = ["aaaa"] * 6  # one token each
  doc = Document.create("cut", words, [[i * 10, 0, i * 10 + 9, 9] for i in range(6)],
                        entities=[("date", [3, 4, 5])])
  cfg = FeatureConfig(max_len=5, stride=1, labels=LABELS, add_special_tokens=False)
  wins = featurize(doc, TOK, cfg)
  assert [w["word_ids"][_content(w)].tolist() for w in wins] == [[0, 1, 2, 3, 4], [4, 5]]
  names = cfg.tag_names
  seqs = [[names[t] for t in w["tags"][_content(w)]] for w in wins]
  # Each window sees a clipped piece of the entity and tags it as a whole entity.
  assert seqs == [["O", "O", "O", "B-date", "E-date"], ["B-date", "E-date"]]
  cfg_bio = FeatureConfig(max_len=5, stride=1, labels=LABELS, add_special_tokens=False,
                          scheme="BIO")
  names = cfg_bio.tag_names
  seqs = [[names[t] for t in w["tags"][_content(w)]] for w in featurize(doc, TOK, cfg_bio)]
  assert seqs == [["O", "O", "O", "B-date", "I-date"], ["B-date", "I-date"]]


# --------------------------------------------------------------------------- tags, random docs
CONFIGS = [
    FeatureConfig(max_len=16, stride=4, labels=("a", "b", "c")),
    FeatureConfig(max_len=16, stride=4, labels=("a", "b", "c"), label_all_subtokens=True),
    FeatureConfig(max_len=24, stride=6, labels=("a", "b", "c"), scheme="BIO"),
    FeatureConfig(max_len=24, stride=0, labels=("a", "b", "c"), scheme="BIO",
                  label_all_subtokens=True),
    FeatureConfig(max_len=13, stride=5, labels=("a", "b", "c"), split="page"),
    FeatureConfig(max_len=40, stride=9, labels=("c", "b", "a"), split="page",
                  label_all_subtokens=True),
    FeatureConfig(max_len=512, stride=128, labels=("a", "b", "c")),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.max_len}-{c.stride}-{c.split}-"
                         f"{c.scheme}-{'all' if c.label_all_subtokens else 'first'}")
def test_window_tags_valid_and_recover_clipped_spans(cfg):
  rng = np.random.default_rng(1)
  for trial in range(6):
    doc = random_doc(rng, int(rng.integers(1, 60)), n_pages=int(rng.integers(1, 4)))
    names = cfg.tag_names
    runs = [(e.label, run) for e in doc.entities for run in tags_lib.consecutive_runs(e.words)]
    for w in featurize(doc, TOK, cfg):
      pos = np.flatnonzero(w["tags"] >= 0)  # labelled positions
      real = _content(w)
      if cfg.label_all_subtokens:
        np.testing.assert_array_equal(pos, real)
      else:
        np.testing.assert_array_equal(pos, real[w["subtoken_index"][real] == 0])
      seq = [names[t] for t in w["tags"][pos]]
      spans = tags_lib.tags_to_spans(seq, cfg.scheme)
      # Valid: rebuilding the sequence from its spans gives it back (no stray I/E).
      rebuilt = ["O"] * len(seq)
      for label, a, b in spans:
        rebuilt[a:b] = tags_lib.span_tags(b - a, label, cfg.scheme)
      assert rebuilt == seq
      # The spans are the gold runs clipped to the window (at labelled positions).
      got = {(label, int(pos[a]), int(pos[b - 1])) for label, a, b in spans}
      expected = set()
      for label, run in runs:
        in_run = np.flatnonzero(np.isin(w["word_ids"][pos], run))
        if len(in_run):
          expected.add((label, int(pos[in_run[0]]), int(pos[in_run[-1]])))
      assert got == expected, (trial, doc.id)


# --------------------------------------------------------------------------- windows
WINDOW_CASES = [(8, 0, "window"), (8, 2, "window"), (12, 5, "window"), (20, 3, "page"),
                (9, 1, "page"), (64, 16, "window"), (512, 128, "page")]


@pytest.mark.parametrize("max_len,stride,split", WINDOW_CASES)
def test_windows_cover_overlap_and_stitch_inverse(max_len, stride, split):
  rng = np.random.default_rng(max_len * 100 + stride)
  cfg = FeatureConfig(max_len=max_len, stride=stride, split=split, labels=("a", "b", "c"))
  c = cfg.content_len
  for trial in range(8):
    doc = random_doc(rng, int(rng.integers(1, 80)), n_pages=int(rng.integers(1, 5)),
                     max_chars=12 if trial % 2 else 6)
    ids, word_of = _doc_tokens(doc)
    wins = featurize(doc, TOK, cfg)
    longest = max(len(TOK.encode_word(w)) for w in doc.words)
    covered = np.zeros(len(ids), bool)
    prev = None
    for k, w in enumerate(wins):
      assert int(w["window_index"]) == k
      real = _content(w)
      n = len(real)
      start = int(w["window_start"])
      assert 1 <= n <= c
      np.testing.assert_array_equal(real, np.arange(1, n + 1))  # [CLS] content [SEP] pads
      np.testing.assert_array_equal(w["input_ids"][real], ids[start:start + n])
      np.testing.assert_array_equal(w["word_ids"][real], word_of[start:start + n])
      assert w["input_ids"][0] == TOK.cls_id and w["input_ids"][n + 1] == TOK.sep_id
      assert (w["input_ids"][n + 2:] == TOK.pad_id).all()
      assert w["attention_mask"].sum() == n + 2
      covered[start:start + n] = True
      if split == "page":
        assert len(set(doc.pages[w["word_ids"][real]])) == 1
      if longest <= c:  # windows hold whole words
        assert start == 0 or word_of[start] != word_of[start - 1]
        assert start + n == len(ids) or word_of[start + n] != word_of[start + n - 1]
      if prev is not None:
        p_start, p_end = prev
        same_run = split == "window" or doc.pages[word_of[p_start]] == doc.pages[word_of[start]]
        if same_run:
          assert start > p_start and start + n > p_end  # progress, never a repeated window
          if c - stride >= 2 * longest - 1:
            assert p_end - start >= stride
        else:
          assert start == p_end  # a new page starts a new window
      prev = (start, start + n)
    assert covered.all()
    # Inverse: one-hot word scores (noise elsewhere) come back exactly.
    scores = []
    for w in wins:
      s = rng.normal(size=(max_len, len(doc)))
      first = (w["word_ids"] >= 0) & (w["subtoken_index"] == 0)
      s[first] = np.eye(len(doc))[w["word_ids"][first]]
      scores.append(s)
    np.testing.assert_array_equal(stitch(doc, wins, scores), np.eye(len(doc)))


def test_stitch_reads_the_most_central_window():
  rng = np.random.default_rng(7)
  cfg = FeatureConfig(max_len=10, stride=5, labels=("a", "b", "c"))
  for _ in range(5):
    doc = random_doc(rng, 60, max_chars=5)
    wins = featurize(doc, TOK, cfg)
    assert len(wins) > 3
    # Score row = (window index, position) so the choice is visible.
    scores = [np.stack([np.full(10, k), np.arange(10)], 1).astype(float) for k in range(len(wins))]
    got = stitch(doc, wins, scores)
    for word in range(len(doc)):
      best = None
      for k, w in enumerate(wins):  # brute force over windows holding the first sub-token
        real = list(_content(w))
        for p, i in enumerate(real):
          if w["word_ids"][i] == word and w["subtoken_index"][i] == 0:
            margin = min(p, len(real) - 1 - p)
            if best is None or margin > best[0]:
              best = (margin, k, i)
      assert tuple(got[word]) == (best[1], best[2])


def test_window_spans_cut_only_words_longer_than_a_window():
  word_ids = np.repeat(np.arange(4), [2, 11, 1, 3])  # word 1 has 11 tokens
  spans = window_spans(word_ids, 0, len(word_ids), 4, 1)
  covered = np.zeros(len(word_ids), bool)
  for a, b in spans:
    assert 0 < b - a <= 4
    covered[a:b] = True
  assert covered.all()
  starts = {a for a, _ in spans}
  assert 0 in starts and 13 in starts  # word 2 (token 13) starts a window
  assert all(b > pb for (_, pb), (_, b) in zip(spans, spans[1:]))


def test_split_page_one_window_per_page_and_special_pages():
  rng = np.random.default_rng(3)
  doc = random_doc(rng, 30, n_pages=3)
  wins = featurize(doc, TOK, FeatureConfig(max_len=512, split="page"))
  assert len(wins) == 3
  for p, w in enumerate(wins):
    real = _content(w)
    assert set(w["page_ids"][real]) == {p}
    n = len(real)
    assert w["page_ids"][0] == p and w["page_ids"][n + 1] == p  # specials take their page
  assert len(featurize(doc, TOK, FeatureConfig(max_len=512, split="window"))) == 1


def test_without_special_tokens():
  doc = _hand_doc()
  (w,) = featurize(doc, TOK, FeatureConfig(max_len=10, stride=0, add_special_tokens=False,
                                           labels=LABELS))
  np.testing.assert_array_equal(w["word_ids"], [0, 0, 1, 1, 1, 2, 2, 3, -1, -1])
  assert w["attention_mask"].sum() == 8
  assert TOK.cls_id not in w["input_ids"] and TOK.sep_id not in w["input_ids"]
  np.testing.assert_array_equal(w["tags"], [0, -1, 4, -1, -1, 0, -1, 8, -1, -1])


def test_segments_and_token_in_segment_brute_force():
  rng = np.random.default_rng(5)
  for _ in range(5):
    doc = random_doc(rng, 50, interleave_segments=True)
    for w in featurize(doc, TOK, FeatureConfig(max_len=20, stride=4)):
      real = _content(w)
      words = w["word_ids"][real]
      seen = []
      for i, word in zip(real, words):
        seg = doc.segments[word]
        if seg not in seen:
          seen.append(seg)
        assert w["segment_ids"][i] == seen.index(seg)
        before = sum(1 for v in range(word) if doc.segments[v] == seg)
        assert w["token_in_segment"][i] == before
      pad = np.setdiff1d(np.arange(20), real)
      assert (w["segment_ids"][pad] == -1).all() and (w["token_in_segment"][pad] == -1).all()


def test_untagged_cases():
  doc = _hand_doc()
  (w,) = featurize(doc, TOK, FeatureConfig(max_len=12))  # no labels: nothing to tag
  assert (w["tags"] == -1).all()
  unlabelled = Document.create("u", doc.words, doc.boxes, page_sizes=doc.page_sizes)
  (w,) = featurize(unlabelled, TOK, FeatureConfig(max_len=12, labels=LABELS))
  assert (w["tags"] == -1).all()
  no_entities = unlabelled.replace(entities=[])
  (w,) = featurize(no_entities, TOK, FeatureConfig(max_len=12, labels=LABELS))
  np.testing.assert_array_equal(w["tags"][:10], [-1, 0, -1, 0, -1, -1, 0, -1, 0, -1])


# --------------------------------------------------------------------------- errors
def test_document_errors_name_document_and_field():
  empty = Document.create("empty-doc", [], np.zeros((0, 4)))
  with pytest.raises(DocumentError, match="empty-doc.*words"):
    featurize(empty, TOK, FeatureConfig())
  with pytest.raises(DocumentError, match=r"hand.*entities.*'date'"):
    featurize(_hand_doc(), TOK, FeatureConfig(labels=("total", "other")))
  with pytest.raises(TypeError):
    featurize("not a document", TOK, FeatureConfig())


@pytest.mark.parametrize("kwargs", [
    dict(max_len=2), dict(max_len=0, add_special_tokens=False), dict(max_len=10, stride=8),
    dict(stride=-1), dict(split="sentence"), dict(scheme="IOB2"), dict(labels=("a", "a")),
    dict(labels="abc"), dict(graph=True, graph_max_degree=0),
])
def test_bad_config(kwargs):
  with pytest.raises(ValueError):
    FeatureConfig(**kwargs)


def test_bad_tokenizer_output():
  class Bad(ChunkTokenizer):
    def encode_word(self, word):
      return [5000] if word == "42" else [5]

  class Empty(ChunkTokenizer):
    def encode_word(self, word):
      return []

  with pytest.raises(ValueError, match="outside its vocabulary.*'42'"):
    featurize(_hand_doc(), Bad(), FeatureConfig())
  with pytest.raises(ValueError, match="no token"):
    featurize(_hand_doc(), Empty(), FeatureConfig())


def test_stitch_errors():
  doc = _hand_doc()
  wins = featurize(doc, TOK, FeatureConfig(max_len=6, stride=1))
  scores = [np.zeros((6, 3)) for _ in wins]
  with pytest.raises(ValueError, match="no first sub-token"):
    stitch(doc, wins[:1], scores[:1])
  with pytest.raises(ValueError, match="score arrays"):
    stitch(doc, wins, scores[:1])
  with pytest.raises(ValueError, match="expected"):
    stitch(doc, wins, [np.zeros((5, 3)) for _ in wins])


def test_batch_features():
  rng = np.random.default_rng(0)
  doc = random_doc(rng, 40)
  wins = featurize(doc, TOK, FeatureConfig(max_len=16, stride=4))
  batch = batch_features(wins)
  assert batch["input_ids"].shape == (len(wins), 16)
  assert batch["boxes"].shape == (len(wins), 16, 4)
  assert batch["window_index"].tolist() == list(range(len(wins)))
  other = featurize(doc, TOK, FeatureConfig(max_len=32, stride=4))
  with pytest.raises(ValueError, match="different shapes"):
    batch_features(wins + other)
  with pytest.raises(ValueError, match="keys"):
    batch_features([wins[0], {"input_ids": wins[0]["input_ids"]}])
  with pytest.raises(ValueError):
    batch_features([])


# --------------------------------------------------------------------------- graph plumbing
def _fake_token_neighbours(word_boxes, token_word_ids, *, max_degree=8, variant="ball_of_sight"):
  """Stand-in graph: a token's neighbours are the tokens at offsets +-1, +-3, +-7, +-11."""
  del word_boxes, variant
  t = len(token_word_ids)
  offsets = np.array([1, -1, 3, -3, 7, -7, 11, -11])[:max_degree]
  ids = np.arange(t)[:, None] + offsets[None]
  mask = (ids >= 0) & (ids < t)
  ids = np.where(mask, ids, 0)
  feats = np.stack([np.broadcast_to(np.arange(t)[:, None], ids.shape), ids], -1).astype(np.float32)
  return {"neighbor_ids": ids.astype(np.int32), "neighbor_features": feats,
          "neighbor_mask": mask}


def test_graph_windows_remap_and_mask(monkeypatch):
  fake = types.ModuleType("flaxdoc.layout.token_graph")
  fake.token_neighbours = _fake_token_neighbours
  monkeypatch.setitem(sys.modules, "flaxdoc.layout.token_graph", fake)
  rng = np.random.default_rng(11)
  doc = random_doc(rng, 50)
  cfg = FeatureConfig(max_len=20, stride=6, graph=True, graph_max_degree=6)
  wins = featurize(doc, TOK, cfg)
  n_tokens = len(_doc_tokens(doc)[0])
  full = _fake_token_neighbours(None, np.zeros(n_tokens), max_degree=6)
  assert len(wins) > 2
  for w in wins:
    assert w["neighbor_ids"].shape == (20, 6) and w["neighbor_mask"].shape == (20, 6)
    assert w["neighbor_features"].shape == (20, 6, 2)
    start = int(w["window_start"])
    real = _content(w)
    for i in range(20):
      if i not in real:
        assert not w["neighbor_mask"][i].any() and (w["neighbor_features"][i] == 0).all()
        continue
      t = start + i - 1  # document token at window position i
      for k in range(6):
        j = full["neighbor_ids"][t, k]
        inside = full["neighbor_mask"][t, k] and start <= j < start + len(real)
        assert w["neighbor_mask"][i, k] == inside
        if inside:
          assert w["neighbor_ids"][i, k] == j - start + 1
          np.testing.assert_array_equal(w["neighbor_features"][i, k], [t, j])
        else:
          assert w["neighbor_ids"][i, k] == 0 and (w["neighbor_features"][i, k] == 0).all()


def test_graph_with_real_module():
  rng = np.random.default_rng(12)
  doc = random_doc(rng, 60, n_pages=2)
  for w in featurize(doc, TOK, FeatureConfig(max_len=32, stride=8, graph=True)):
    mask = w["neighbor_mask"]
    real = w["word_ids"] >= 0
    assert not mask[~real].any()
    assert (w["neighbor_ids"][mask] >= 1).all() and real[w["neighbor_ids"][mask]].all()
    assert np.isfinite(w["neighbor_features"]).all()


def test_bench_data_smoke(tmp_path, capsys):
  pytest.importorskip("flaxdoc.data.synthetic")
  import json
  from flaxdoc.bench import data as bench
  from flaxdoc.data import tokenizers as tk
  corpus = ["Invoice total 12.50 Date: 03/04/2021", "Name Address Phone"] * 50
  model = tk.train_sentencepiece(corpus, tmp_path / "sp", vocab_size=300)
  assert bench.main(["--json", "--data_dir", str(tmp_path / "none"), "--num_synthetic", "3",
                     "--repeats", "1", "--tokenizer", f"sentencepiece:{model}"]) == 0
  rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  assert rows[0]["dataset"] == "funsd" and rows[0]["stage"] == "skipped"
  stages = {r["stage"]: r for r in rows if r["dataset"] == "synthetic"}
  assert set(stages) == {"read", "featurize_cold", "featurize", "read+featurize", "mlm+lop"}
  assert stages["featurize"]["docs"] == 3 and stages["featurize"]["tokens_per_s"] > 0
