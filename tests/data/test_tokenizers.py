"""Tokenizers: hand-checked pieces, agreement with Hugging Face, the default model and its cache."""

import os
import pathlib
import subprocess
import sys
import textwrap

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the references are built from local files only

import numpy as np
import pytest

from flaxdoc.data import tokenizers as tk
from flaxdoc.data import word_tokenizer

REPO = pathlib.Path(__file__).resolve().parents[2]

CORPUS = [
    "Invoice number 12345 dated 2021-03-04, total: $1,234.56 (incl. VAT 20%)",
    "Café résumé naïve façade Ñandú, São Paulo; Zürich — Kraków",
    "Hello world! It's John's book; they'll see what we've done.",
    "Name: Dr. Jane O'Brien   Date: 03/04/2021   Amount due: 99.95",
    "über Straße 東京 タワー",
    "the quick brown fox jumps over the lazy dog 0123456789",
]

# Words checked against the reference: accents, punctuation, digits, CJK, emoji,
# combining marks, ligatures, odd whitespace and control characters, long words.
WORDS = [
    "Invoice", "invoice", "INVOICE", "12345", "2021-03-04,", "$1,234.56", "(incl.", "20%)",
    "Café", "RÉSUMÉ", "naïve", "Ñandú", "São", "Zürich", "—", "Kraków", "It's", "they'll",
    "we've", "O'Brien", "Dr.", "東京タワー", "über", "Straße", "zzzq", "🙂", "a\u0301", "x\ty",
    "x  y", "  lead", "trail  ", "foo\u00a0bar", "A" * 150, "’quoted’", "¿Qué?", "ﬁnance", "Ⅻ",
    "١٢٣", "k\x1fz", "x \u3000y", "İstanbul", "x\u2003\u2003y", "a's'S'LL'll", "\x85q", "#hash",
    "e-mail@host.com", "ß", "ǅ", "Ⓐ", "½", "x\u200dy",
]


@pytest.fixture(scope="module")
def hf_files(tmp_path_factory):
  """Small WordPiece (uncased + cased) and byte-level BPE vocabularies, trained by `tokenizers`."""
  tokenizers = pytest.importorskip("tokenizers")
  root = tmp_path_factory.mktemp("hf")
  corpus = CORPUS * 20
  bpe = tokenizers.ByteLevelBPETokenizer()
  bpe.train_from_iterator(corpus, vocab_size=420, min_frequency=2, show_progress=False,
                          special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
  (root / "bpe").mkdir()
  bpe.save_model(str(root / "bpe"))
  for name, lower in (("uncased", True), ("cased", False)):
    wp = tokenizers.BertWordPieceTokenizer(lowercase=lower)
    # limit_alphabet leaves some characters out, so [UNK] paths are exercised.
    wp.train_from_iterator(corpus, vocab_size=220, limit_alphabet=45, show_progress=False,
                           special_tokens=list(tk.SPECIAL_PIECES))
    (root / name).mkdir()
    wp.save_model(str(root / name))
  return root


# --------------------------------------------------------------------------- WordPiece
def _write(path, lines):
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return path


def test_wordpiece_hand_checked(tmp_path):
  vocab = _write(tmp_path / "vocab.txt", list(tk.SPECIAL_PIECES) + [
      "un", "##aff", "##able", "runn", "##ing", ",", "!", "the", "cafe", "[", "]", "mask"])
  tok = tk.WordPieceTokenizer(vocab)
  ids = {p: i for i, p in enumerate((tmp_path / "vocab.txt").read_text().split())}
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  assert tok.vocab_size == 17
  assert tok.encode_word("unaffable") == [ids["un"], ids["##aff"], ids["##able"]]
  # Lowercased, punctuation split off, accents stripped.
  assert tok.encode_word("Running,") == [ids["runn"], ids["##ing"], ids[","]]
  assert tok.encode_word("CAFÉ!") == [ids["cafe"], ids["!"]]
  # A pre-token that WordPiece cannot cover is one [UNK], the others survive.
  assert tok.encode_word("the-xyz") == [ids["the"], tok.unk_id, tok.unk_id]
  # Document text "[MASK]" is text, not the mask token.
  assert tok.encode_word("[MASK]") == [ids["["], ids["mask"], ids["]"]]
  # Never empty: a word that normalises to nothing falls back to [UNK].
  assert tok.encode_word("\u200b") == [tok.unk_id]
  assert tok.encode_word("\x00") == [tok.unk_id]
  assert [tok.id_to_piece(i) for i in tok.encode_word("unaffable")] == ["un", "##aff", "##able"]


def test_wordpiece_missing_special_is_an_error(tmp_path):
  vocab = _write(tmp_path / "vocab.txt", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"])
  with pytest.raises(ValueError, match=r"\[MASK\]"):
    tk.WordPieceTokenizer(vocab)


@pytest.mark.parametrize("cased", [False, True])
def test_wordpiece_matches_transformers(hf_files, cased):
  transformers = pytest.importorskip("transformers")
  folder = hf_files / ("cased" if cased else "uncased")
  ref = transformers.BertTokenizer.from_pretrained(str(folder), do_lower_case=not cased)
  ours = tk.WordPieceTokenizer(folder / "vocab.txt", lowercase=not cased)
  assert ours.vocab_size == len(ref)
  checked = 0
  for w in WORDS + CORPUS:
    expected = ref.encode(w, add_special_tokens=False)
    if not expected:  # HF returns nothing; ours falls back to [UNK] by design
      assert ours.encode_word(w) == [ours.unk_id], w
      continue
    assert ours.encode_word(w) == expected, w
    checked += 1
  assert checked > 40
  # The reference did produce unknowns and multi-piece words, so those paths are covered.
  all_ids = [i for w in WORDS for i in ours.encode_word(w)]
  assert ours.unk_id in all_ids
  assert any(ours.id_to_piece(i).startswith("##") for i in all_ids)


# --------------------------------------------------------------------------- byte-level BPE
def test_bpe_hand_checked(tmp_path):
  import json
  pieces = ["<s>", "<pad>", "</s>", "<unk>", "<mask>", "Ġ", "l", "o", "w", "e", "r", "Ġl", "Ġlo",
            "Ġlow", "er", "!"]
  (tmp_path / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}))
  _write(tmp_path / "merges.txt", ["#version: 0.2", "Ġ l", "Ġl o", "Ġlo w", "e r"])
  tok = tk.ByteLevelBPETokenizer(tmp_path / "vocab.json", tmp_path / "merges.txt")
  assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 4)
  piece = lambda w: [tok.id_to_piece(i) for i in tok.encode_word(w)]  # noqa: E731
  assert piece("low") == ["Ġlow"]
  assert piece("lower") == ["Ġlow", "er"]
  assert piece("lower!") == ["Ġlow", "er", "!"]
  # Bytes without a piece in this tiny vocabulary are unknown.
  assert piece("lowz") == ["Ġlow", "<unk>"]


def test_gpt2_pretokenize_matches_regex():
  regex = pytest.importorskip("regex")
  pattern = regex.compile(
      r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
  texts = [" " + w for w in WORDS] + CORPUS + ["  a  b   ", "\t\tx", "a\n\nb ", "'s's", " 's",
                                               "x\u3000 y", "  ", "a \u00a0 b"]
  for t in texts:
    assert tk.gpt2_pretokenize(t) == pattern.findall(t), repr(t)


def test_bpe_matches_transformers(hf_files):
  transformers = pytest.importorskip("transformers")
  folder = hf_files / "bpe"
  ref = transformers.RobertaTokenizer.from_pretrained(str(folder))
  ours = tk.ByteLevelBPETokenizer(folder / "vocab.json", folder / "merges.txt")
  assert ours.vocab_size == len(ref)
  for w in WORDS + CORPUS:
    # RoBERTa's encoding of a word after the first one in running text.
    assert ours.encode_word(w) == ref.encode(" " + w, add_special_tokens=False), repr(w)
  # Pre-split words with add_prefix_space: the same thing, word by word.
  ref_split = transformers.RobertaTokenizer.from_pretrained(str(folder), add_prefix_space=True)
  words = ["Invoice", "total:", "$1,234.56", "Zürich"]
  got = ref_split(words, is_split_into_words=True, add_special_tokens=False)["input_ids"]
  assert got == [i for w in words for i in ours.encode_word(w)]
  # And in running text, words after the first.
  sentence = ref.encode("Invoice total: $1,234.56 Zürich", add_special_tokens=False)
  tail = [i for w in words[1:] for i in ours.encode_word(w)]
  assert sentence[-len(tail):] == tail


# --------------------------------------------------------------------------- SentencePiece
@pytest.fixture(scope="module")
def sp_model(tmp_path_factory):
  root = tmp_path_factory.mktemp("sp")
  return tk.train_sentencepiece(CORPUS * 30, root / "m", vocab_size=500)


def test_sentencepiece_specials_and_encoding(sp_model):
  tok = tk.SentencePieceTokenizer(sp_model)
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  assert [tok.id_to_piece(i) for i in range(5)] == list(tk.SPECIAL_PIECES)
  assert isinstance(tok, tk.Tokenizer)
  specials = set(tk.special_ids(tok))
  for w in WORDS:
    ids = tok.encode_word(w)
    assert ids and all(0 <= i < tok.vocab_size for i in ids), w
    # No text encodes to a special other than [UNK] (the fallback).
    assert not (set(ids) & (specials - {tok.unk_id})), w
  assert tok.encode_word("[MASK]") != [tok.mask_id]
  assert tok.encode_word("\u200b") == [tok.unk_id]
  # byte_fallback: characters never seen in training are spelled as bytes, losslessly.
  sp = tok._sp  # pylint: disable=protected-access
  for w in ["東京タワー", "🙂", "Ωmega", "Invoice"]:
    assert sp.decode(tok.encode_word(w)) == w


def test_train_sentencepiece_is_deterministic(tmp_path):
  a = tk.train_sentencepiece(CORPUS * 10, tmp_path / "a", vocab_size=450)
  b = tk.train_sentencepiece(iter(CORPUS * 10), tmp_path / "b", vocab_size=450)
  # Same pieces with the same scores (the files differ only in the recorded prefix).
  # pylint: disable-next=protected-access
  pieces = [[(t._sp.id_to_piece(i), t._sp.get_score(i)) for i in range(t.vocab_size)]
            for t in (tk.SentencePieceTokenizer(a), tk.SentencePieceTokenizer(b))]
  assert pieces[0] == pieces[1]
  with pytest.raises(ValueError, match="no non-empty line"):
    tk.train_sentencepiece(["", "  "], tmp_path / "c", vocab_size=450)


def test_sentencepiece_model_without_mask_needs_special_ids(tmp_path):
  import sentencepiece as spm
  spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS * 10),
                                 model_prefix=str(tmp_path / "p"), vocab_size=150, minloglevel=2,
                                 hard_vocab_limit=False)
  with pytest.raises(ValueError, match="has no pad piece.*special_ids"):
    tk.SentencePieceTokenizer(tmp_path / "p.model")
  tok = tk.SentencePieceTokenizer(tmp_path / "p.model", special_ids={"mask": 5, "pad": 6})
  assert (tok.mask_id, tok.pad_id) == (5, 6)


def test_word_cache_returns_fresh_lists(sp_model):
  tok = tk.SentencePieceTokenizer(sp_model)
  a = tok.encode_word("Invoice")
  a.append(-1)
  assert tok.encode_word("Invoice") == a[:-1]


# --------------------------------------------------------------------------- loading, CLI, default
def test_load_tokenizer_specs(hf_files, sp_model):
  assert isinstance(tk.load_tokenizer(f"sentencepiece:{sp_model}"), tk.SentencePieceTokenizer)
  wp = tk.load_tokenizer(f"wordpiece:{hf_files / 'uncased' / 'vocab.txt'}")
  assert isinstance(wp, tk.WordPieceTokenizer) and wp.lowercase
  assert not tk.load_tokenizer(f"wordpiece-cased:{hf_files / 'cased' / 'vocab.txt'}").lowercase
  bpe = tk.load_tokenizer(f"bpe:{hf_files / 'bpe'}")
  assert isinstance(bpe, tk.ByteLevelBPETokenizer)
  for t in (wp, bpe):
    assert isinstance(t, tk.Tokenizer)
  with pytest.raises(ValueError, match="expected"):
    tk.load_tokenizer("nonsense")
  with pytest.raises(ValueError, match="unknown kind"):
    tk.load_tokenizer("foo:bar")
  with pytest.raises(FileNotFoundError):
    tk.load_tokenizer("sentencepiece:/nonexistent.model")


def _run(args, **kw):
  env = dict(os.environ, PYTHONPATH=str(REPO))
  env.update(kw.pop("env", {}))
  return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=120, **kw)


def test_cli_train_and_encode(tmp_path):
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(CORPUS * 20), encoding="utf-8")
  r = _run(["-m", "flaxdoc.data.tokenizers", "train", "--input", str(corpus), "--out",
            str(tmp_path / "cli"), "--vocab_size", "500"])
  assert r.returncode == 0, r.stderr
  tok = tk.SentencePieceTokenizer(tmp_path / "cli.model")
  assert tok.mask_id == 4 and tok.vocab_size <= 500
  r = _run(["-m", "flaxdoc.data.tokenizers", "encode", "--tokenizer",
            f"sentencepiece:{tmp_path / 'cli.model'}", "Invoice"])
  assert r.returncode == 0 and "'Invoice'" in r.stdout, r.stderr


def test_cli_train_names_a_missing_input_file(tmp_path, capsys):
  with pytest.raises(SystemExit) as info:
    tk.main(["train", "--input", str(tmp_path / "nofile.txt"), "--out", str(tmp_path / "m")])
  assert info.value.code == 2
  assert f"--input: no such file: {tmp_path / 'nofile.txt'}" in capsys.readouterr().err
  assert not list(tmp_path.iterdir())  # nothing written


_DEFAULT_SCRIPT = textwrap.dedent("""
    import sys
    from flaxdoc.data import synthetic, tokenizers as tk
    # A small stand-in corpus keeps this test fast; the locking is what is tested.
    synthetic.corpus_text = lambda n, seed: %r * 50
    tk.DEFAULT_VOCAB_SIZE = 500
    tok = tk.default_tokenizer()
    print(tok.vocab_size, tok.mask_id, tk.default_tokenizer_path())
""" % ("\n".join(CORPUS),))


def test_default_tokenizer_parallel_processes_share_one_model(tmp_path):
  pytest.importorskip("flaxdoc.data.synthetic")
  env = {"FLAXDOC_CACHE": str(tmp_path / "cache")}
  procs = [subprocess.Popen([sys.executable, "-c", _DEFAULT_SCRIPT], cwd=REPO,
                            env=dict(os.environ, PYTHONPATH=str(REPO), **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for _ in range(3)]
  outs = [p.communicate(timeout=120) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err
  lines = {o.strip() for o, _ in outs}
  assert len(lines) == 1, lines  # all saw the same model
  folder = tmp_path / "cache" / "tokenizers"
  models = sorted(f.name for f in folder.iterdir() if f.suffix == ".model")
  assert models == [f"default-{tk.DEFAULT_TOKENIZER_VERSION}.model"]
  assert not [f for f in folder.iterdir() if f.is_dir()]  # no temporary folders left


def test_default_tokenizer_real_corpus():
  """The real default model, from the user's cache (trained there on first use, ~5 s)."""
  synthetic = pytest.importorskip("flaxdoc.data.synthetic")
  if not hasattr(synthetic, "corpus_text"):
    pytest.skip("flaxdoc.data.synthetic.corpus_text is not available yet")
  tok = tk.default_tokenizer()
  assert tok is tk.default_tokenizer()  # memoised in-process
  assert tk.default_tokenizer_path().exists()
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  assert 1000 <= tok.vocab_size <= tk.DEFAULT_VOCAB_SIZE
  ids = np.array([i for w in WORDS for i in tok.encode_word(w)])
  assert ids.min() >= 0 and ids.max() < tok.vocab_size
  # Frequent form words are single pieces in the default vocabulary.
  assert [tok.id_to_piece(i) for i in tok.encode_word("Invoice")] == ["▁Invoice"]


def test_word_cache_is_bounded_and_keeps_recent_entries():
  cache = word_tokenizer._LRU(8)  # pylint: disable=protected-access
  for i in range(100):
    cache.put(i, (i,))
    assert cache.get(0) == (0,)  # used all the time: never evicted
    assert len(cache) <= 8
  assert cache.get(99) == (99,) and cache.get(1) is None
