"""Fuzzing featurize (Hypothesis): odd input gives `DocumentError` or well-formed windows."""

import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from flaxdoc.data import tokenizers as tk
from flaxdoc.data.document import Document, DocumentError
from flaxdoc.data.features import FeatureConfig, featurize, stitch


class ChunkTokenizer:
  name = "chunk"
  vocab_size = 1000
  pad_id, unk_id, cls_id, sep_id, mask_id = 0, 1, 2, 3, 4

  def __init__(self, k):
    self.k = k

  def encode_word(self, word):
    return [5 + zlib.crc32(word[i:i + self.k].encode("utf-8", "surrogatepass")) % 995
            for i in range(0, len(word), self.k)]

  def id_to_piece(self, i):
    return str(i)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
  root = tmp_path_factory.mktemp("fuzz")
  corpus = ["Invoice total 12.50 Date: 03/04/2021 Café Zürich naïve", "the quick brown fox"] * 50
  sp = tk.SentencePieceTokenizer(tk.train_sentencepiece(corpus, root / "sp", vocab_size=400))
  (root / "vocab.txt").write_text("\n".join(list(tk.SPECIAL_PIECES) + list("abcdefghij.:") +
                                            ["##" + c for c in "abcdefghij"] + ["invoice"]) + "\n")
  wp = tk.WordPieceTokenizer(root / "vocab.txt")
  return [ChunkTokenizer(1), ChunkTokenizer(4), sp, wp]


def _huge_word(ch, n):
  return ch * n


words_st = st.lists(
    st.one_of(
        st.text(min_size=1, max_size=12),
        st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=40),
        st.builds(_huge_word, st.characters(codec="utf-8", exclude_categories=("Zs", "Cc")),
                  st.integers(200, 1500)),
        st.sampled_from(["[CLS]", "[MASK]", "\u200b", "x\u200by", "  padded  ", "東京", "🙂🙂",
                         "a\u0301", "\ufeff"]),
    ),
    min_size=0, max_size=25)


@st.composite
def documents(draw):
  words = draw(words_st)
  n = len(words)
  n_pages = draw(st.integers(1, 6))
  pages = sorted(draw(st.lists(st.integers(0, n_pages - 1), min_size=n, max_size=n)))
  if draw(st.booleans()):  # sometimes out of order, sometimes a page index too large
    pages = draw(st.permutations(pages))
  if n and draw(st.integers(0, 20)) == 0:
    pages[0] = n_pages
  coords = st.floats(-5, 1005)
  if draw(st.integers(0, 30)) == 0:
    coords = st.one_of(coords, st.just(float("nan")))
  boxes = []
  for _ in range(n):
    x0, y0, w, h = draw(st.tuples(coords, coords, st.floats(0, 50), st.floats(0, 50)))
    boxes.append([x0, y0, x0 + w, y0 + h])
  segments = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
  entities = []
  used = set()
  for _ in range(draw(st.integers(0, 4))):
    idx = draw(st.lists(st.integers(0, max(n - 1, 0)), min_size=1, max_size=4, unique=True))
    if n and not used & set(idx):
      used |= set(idx)
      entities.append((draw(st.sampled_from(["a", "b", "unknown"])), idx))
  return dict(id="fuzz", words=words, boxes=np.array(boxes).reshape(n, 4), pages=pages,
              page_sizes=[[1000, 1000]] * n_pages, segments=segments, entities=entities,
              box_policy=draw(st.sampled_from(["error", "clip"])))


@st.composite
def configs(draw):
  specials = draw(st.booleans())
  max_len = draw(st.integers(3 if specials else 1, 48))
  content = max_len - (2 if specials else 0)
  return FeatureConfig(max_len=max_len, stride=draw(st.integers(0, content - 1)),
                       split=draw(st.sampled_from(["window", "page"])),
                       scheme=draw(st.sampled_from(["BIOES", "BIO"])),
                       label_all_subtokens=draw(st.booleans()),
                       labels=draw(st.sampled_from([(), ("a", "b"), ("b", "a", "unknown")])),
                       add_special_tokens=specials)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.data_too_large])
@given(spec=documents(), cfg=configs(), which=st.integers(0, 3))
def test_featurize_fuzz(tokenizers, spec, cfg, which):
  tok = tokenizers[which]
  try:
    doc = Document.create(**spec)
    windows = featurize(doc, tok, cfg)
  except DocumentError as e:
    event(f"DocumentError on {e.field}")
    return  # the only failure allowed: a clear, named document error
  event(f"featurised into {min(len(windows), 3)}{'+' if len(windows) >= 3 else ''} windows")
  L = cfg.max_len
  n_tags = cfg.num_tags
  seen_first = np.zeros(len(doc), bool)
  for k, w in enumerate(windows):
    for key, value in w.items():
      assert value.dtype == np.int32, key
      assert value.shape[:1] == ((L,) if value.ndim else ()), key
    ids = w["input_ids"]
    assert ids.min() >= 0 and ids.max() < tok.vocab_size
    assert w["boxes"].shape == (L, 4) and w["boxes"].min() >= 0 and w["boxes"].max() <= 1000
    real = w["word_ids"] >= 0
    assert real.any()
    assert w["word_ids"].max() < len(doc)
    assert w["tags"].min() >= -1 and w["tags"].max() < n_tags
    assert (w["tags"][~real] == -1).all()
    mask = w["attention_mask"]
    length = int(mask.sum())
    assert (mask[:length] == 1).all() and (mask[length:] == 0).all()
    assert (ids[length:] == tok.pad_id).all()
    assert 0 <= w["page_ids"].min() and w["page_ids"].max() < doc.num_pages
    assert int(w["window_index"]) == k
    seen_first[w["word_ids"][real & (w["subtoken_index"] == 0)]] = True
  assert seen_first.all()  # every word has its first sub-token in some window
  scores = [np.eye(len(doc), dtype=np.float32)[np.maximum(w["word_ids"], 0)] for w in windows]
  out = stitch(doc, windows, scores)
  assert np.isfinite(out).all()
  np.testing.assert_array_equal(out, np.eye(len(doc)))
