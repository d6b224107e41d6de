"""Word-level tokenizers: one small protocol over SentencePiece, WordPiece and byte-level BPE.

Documents arrive already split into OCR words, each with its own box, so the
only operation featurisation needs is "the sub-token ids of this one word"
(`encode_word`): every sub-token then inherits its word's box (DESIGN §3.3).
Three implementations cover the papers' vocabularies:

* `SentencePieceTokenizer`: a SentencePiece model (the default, trained on the
  synthetic corpus by `default_tokenizer()`, or any `.model` file);
* `WordPieceTokenizer`: BERT basic tokenisation + greedy longest-match WordPiece
  from a local `vocab.txt` (FormNet used BERT-multilingual);
* `ByteLevelBPETokenizer`: RoBERTa's byte-level BPE from local `vocab.json` and
  `merges.txt` (DocPolarBERT, LAGaBi).

The two Hugging Face formats are re-implemented here (not wrapped) so that the
library does not depend on `transformers`; tests check them against it.

`encode_word` never returns an empty list: a word that its tokenizer reduces to
nothing (a lone zero-width space, a control character) becomes `[unk_id]`, so
every word keeps at least one token and therefore its box and its label.

Command line:
  python -m flaxdoc.data.tokenizers train --input corpus.txt --out PREFIX --vocab_size 8000
  python -m flaxdoc.data.tokenizers encode --tokenizer default "Total: 12.50"
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import pathlib
import sys
import tempfile
import unicodedata
from typing import Iterable, Iterator, Protocol, Sequence, runtime_checkable

log = logging.getLogger(__name__)

# The special pieces every flaxdoc-trained SentencePiece model has, at ids 0..4.
SPECIAL_PIECES = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# Bump when the default model's training recipe or corpus changes: the cache key.
DEFAULT_TOKENIZER_VERSION = "sp-unigram-v1"
DEFAULT_VOCAB_SIZE = 8000
DEFAULT_CORPUS_DOCS = 600
DEFAULT_CORPUS_SEED = 0

# Per-tokenizer memo of word -> ids. OCR text repeats a lot ("Date:", "Total"),
# so an LRU over words is what makes featurisation fast.
_WORD_CACHE_SIZE = 1 << 16


@runtime_checkable
class Tokenizer(Protocol):
  """What featurisation and masking need from a tokenizer."""
  name: str

  @property
  def vocab_size(self) -> int: ...

  @property
  def pad_id(self) -> int: ...

  @property
  def unk_id(self) -> int: ...

  @property
  def cls_id(self) -> int: ...

  @property
  def sep_id(self) -> int: ...

  @property
  def mask_id(self) -> int: ...

  def encode_word(self, word: str) -> list[int]:
    """The ids of one word's sub-tokens; never empty."""
    ...

  def id_to_piece(self, i: int) -> str: ...


class _LRU:
  """A bounded memo with approximately-LRU eviction, cheap and safe under threads.

  Two generations of plain dicts: hits in the old generation are promoted, and
  when the new one fills up it becomes the old one (dropping the previous old
  one). Entries used at least once per `maxsize / 2` insertions always survive.
  Single dict operations are atomic under the GIL, so grain worker threads can
  share it without a lock (a race can at worst recompute an entry).
  """

  def __init__(self, maxsize: int):
    self.maxsize = max(2, int(maxsize))
    self._new: dict = {}
    self._old: dict = {}

  def get(self, key):
    value = self._new.get(key)
    if value is None:
      value = self._old.get(key)
      if value is not None:
        self.put(key, value)
    return value

  def put(self, key, value):
    new = self._new
    new[key] = value
    if len(new) >= self.maxsize // 2:
      self._old, self._new = new, {}

  def __len__(self) -> int:
    return len(self._new) + len(self._old)


class _CachedWordEncoder:
  """Base of the tokenizers: memoises `_encode_word_uncached`, enforces the non-empty rule.

  Also serves the special ids, which each `__init__` looks up in its own vocabulary
  format and stores in `_pad`, `_unk`, `_cls`, `_sep` and `_mask`.
  """

  pad_id = property(lambda self: self._pad)
  unk_id = property(lambda self: self._unk)
  cls_id = property(lambda self: self._cls)
  sep_id = property(lambda self: self._sep)
  mask_id = property(lambda self: self._mask)

  def _init_cache(self):
    self._cache = _LRU(_WORD_CACHE_SIZE)

  def encode_word(self, word: str) -> list[int]:
    """The ids of one word's sub-tokens (a fresh list; never empty)."""
    ids = self._cache.get(word)
    if ids is None:
      ids = tuple(self._encode_word_uncached(word)) or (self.unk_id,)
      self._cache.put(word, ids)
    return list(ids)

  def _encode_word_uncached(self, word: str) -> list[int]:
    # The hook each tokenizer class defines (SentencePiece, WordPiece, BPE all do).
    raise TypeError(f"{type(self).__name__} must define _encode_word_uncached(word)")

  def __repr__(self) -> str:
    return f"{type(self).__name__}({self.name!r}, vocab_size={self.vocab_size})"


# --------------------------------------------------------------------------- SentencePiece
class SentencePieceTokenizer(_CachedWordEncoder):
  """A SentencePiece model (unigram or BPE) read from a `.model` file.

  Special ids are looked up by piece: `[PAD]`/`<pad>`, `[UNK]`/`<unk>`,
  `[CLS]`/`<s>`, `[SEP]`/`</s>`, `[MASK]`/`<mask>` (then the model's own
  pad/unk/bos/eos ids). A model that lacks one of them is refused with a clear
  message unless `special_ids` supplies it, e.g. `{"mask": 7}`.
  """

  def __init__(self, model_file: str | os.PathLike, *, special_ids: dict[str, int] | None = None):
    import sentencepiece as spm  # pylint: disable=import-outside-toplevel
    path = pathlib.Path(model_file)
    if not path.is_file():
      raise FileNotFoundError(f"SentencePiece model {str(path)!r} does not exist")
    self.model_file = str(path)
    self._sp = spm.SentencePieceProcessor(model_file=str(path))
    self.name = f"sentencepiece:{path}"
    n = self._sp.get_piece_size()

    def find(kind, pieces, fallback):
      if special_ids and kind in special_ids:
        return int(special_ids[kind])
      for p in pieces:
        i = self._sp.piece_to_id(p)
        # piece_to_id returns unk_id for an unknown piece; accept only exact hits.
        if 0 <= i < n and self._sp.id_to_piece(i) == p:
          return i
      if fallback is not None and 0 <= fallback < n:
        return int(fallback)
      raise ValueError(f"SentencePiece model {str(path)!r} has no {kind} piece (looked for "
                       f"{list(pieces)}); pass special_ids={{{kind!r}: id}}")

    self._pad = find("pad", ("[PAD]", "<pad>"), self._sp.pad_id())
    self._unk = find("unk", ("[UNK]", "<unk>"), self._sp.unk_id())
    self._cls = find("cls", ("[CLS]", "<s>"), self._sp.bos_id())
    self._sep = find("sep", ("[SEP]", "</s>"), self._sp.eos_id())
    self._mask = find("mask", ("[MASK]", "<mask>"), None)
    for kind, i in (("pad", self._pad), ("unk", self._unk), ("cls", self._cls),
                    ("sep", self._sep), ("mask", self._mask)):
      if not 0 <= i < n:
        raise ValueError(f"special id {kind}={i} is outside the vocabulary of {str(path)!r} ({n})")
    self._init_cache()

  vocab_size = property(lambda self: self._sp.get_piece_size())

  def _encode_word_uncached(self, word: str) -> list[int]:
    return self._sp.encode(word)

  def id_to_piece(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))


# --------------------------------------------------------------------------- WordPiece
def _is_control(ch: str) -> bool:
  if ch in "\t\n\r":
    return False
  return unicodedata.category(ch).startswith("C")


def _is_whitespace(ch: str) -> bool:
  if ch in " \t\n\r":
    return True
  return unicodedata.category(ch) == "Zs"


def _is_punctuation(ch: str) -> bool:
  cp = ord(ch)
  # BERT treats every non-alphanumeric ASCII character as punctuation ("$", "^", "`").
  if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
    return True
  return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
  return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or
          0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or
          0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


class WordPieceTokenizer(_CachedWordEncoder):
  """BERT tokenisation from a local `vocab.txt` (one piece per line, id = line number).

  Basic tokenisation as BERT's `BertNormalizer` + `BertPreTokenizer`: drop
  control characters, space out CJK ideographs, strip accents and lowercase
  (both by default for uncased vocabularies), split on whitespace and
  punctuation; then greedy longest-match WordPiece with `##` continuations,
  where a pre-token that cannot be covered (or longer than
  `max_input_chars_per_word`) becomes `[UNK]`.

  Unlike Hugging Face's tokenizer, the literal text `[MASK]` in a document is
  ordinary text here (`[`, `mask`, `]`), never the mask token.
  """

  def __init__(self, vocab_txt: str | os.PathLike, *, lowercase: bool = True,
               strip_accents: bool | None = None, max_input_chars_per_word: int = 100,
               continuation_prefix: str = "##"):
    path = pathlib.Path(vocab_txt)
    if not path.is_file():
      raise FileNotFoundError(f"WordPiece vocabulary {str(path)!r} does not exist")
    pieces = path.read_text(encoding="utf-8").split("\n")
    if pieces and pieces[-1] == "":
      pieces.pop()
    self._pieces = [p.rstrip("\r") for p in pieces]
    # A duplicated line maps to its last id, as in Hugging Face's `load_vocab`.
    self._vocab = {p: i for i, p in enumerate(self._pieces)}
    self.vocab_file = str(path)
    self.name = f"wordpiece:{path}"
    self.lowercase = lowercase
    self.strip_accents = lowercase if strip_accents is None else strip_accents
    self.max_input_chars_per_word = max_input_chars_per_word
    self.prefix = continuation_prefix

    def special(piece):
      if piece not in self._vocab:
        raise ValueError(f"WordPiece vocabulary {str(path)!r} has no {piece} entry")
      return self._vocab[piece]

    self._pad, self._unk, self._cls, self._sep, self._mask = (special(p) for p in SPECIAL_PIECES)
    self._init_cache()

  vocab_size = property(lambda self: len(self._pieces))

  def id_to_piece(self, i: int) -> str:
    return self._pieces[int(i)]

  def basic_tokenize(self, text: str) -> list[str]:
    """BERT's normaliser and pre-tokeniser: the pre-tokens WordPiece then splits."""
    chars = []
    for ch in text:
      cp = ord(ch)
      if cp == 0 or cp == 0xFFFD or _is_control(ch):
        continue
      if _is_whitespace(ch):
        chars.append(" ")
      elif _is_cjk(cp):
        chars.extend((" ", ch, " "))
      else:
        chars.append(ch)
    text = "".join(chars)
    if self.strip_accents:
      text = "".join(c for c in unicodedata.normalize("NFD", text)
                     if unicodedata.category(c) != "Mn")
    if self.lowercase:
      text = text.lower()
    out = []
    for chunk in text.split():
      current = []
      for ch in chunk:
        if _is_punctuation(ch):
          if current:
            out.append("".join(current))
            current = []
          out.append(ch)
        else:
          current.append(ch)
      if current:
        out.append("".join(current))
    return out

  def _wordpiece(self, token: str) -> list[int]:
    if len(token) > self.max_input_chars_per_word:
      return [self._unk]
    ids = []
    start = 0
    while start < len(token):
      end = len(token)
      found = None
      while start < end:
        piece = token[start:end]
        if start > 0:
          piece = self.prefix + piece
        if piece in self._vocab:
          found = self._vocab[piece]
          break
        end -= 1
      if found is None:
        return [self._unk]
      ids.append(found)
      start = end
    return ids

  def _encode_word_uncached(self, word: str) -> list[int]:
    ids = []
    for token in self.basic_tokenize(word):
      ids.extend(self._wordpiece(token))
    return ids


# --------------------------------------------------------------------------- byte-level BPE
@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
  """GPT-2's reversible map from the 256 byte values to printable characters."""
  bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
      list(range(ord("®"), ord("ÿ") + 1))
  cs = bs[:]
  n = 0
  for b in range(256):
    if b not in bs:
      bs.append(b)
      cs.append(256 + n)
      n += 1
  return dict(zip(bs, (chr(c) for c in cs)))


# Unicode White_Space (what `\s` matches in the GPT-2 pre-tokenisation regex).
_WHITE_SPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000" +
                         "".join(chr(c) for c in range(0x2000, 0x200B)))
_CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d")


def _char_class(ch: str) -> str:
  if ch in _WHITE_SPACE:
    return "s"
  cat = unicodedata.category(ch)[0]
  if cat == "L":
    return "L"
  if cat == "N":
    return "N"
  return "o"


def gpt2_pretokenize(text: str) -> list[str]:
  """The GPT-2 / RoBERTa pre-tokenisation regex, written out without `regex`:

  `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+`
  (alternatives tried in order at each position, each greedy).
  """
  classes = [_char_class(c) for c in text]
  n = len(text)
  out = []
  i = 0
  while i < n:
    matched = None
    for c in _CONTRACTIONS:
      if text.startswith(c, i):
        matched = i + len(c)
        break
    if matched is None:
      j = i + 1 if text[i] == " " else i
      for cls in ("L", "N", "o"):
        k = j
        while k < n and classes[k] == cls:
          k += 1
        if k > j:
          matched = k
          break
    if matched is None:  # text[i] is whitespace not followed by a word character run
      k = i
      while k < n and classes[k] == "s":
        k += 1
      if k == n or k - 1 == i:  # `\s+(?!\S)` takes the run; else `\s+` a single char
        matched = k
      else:  # leave the last space of the run to prefix the following token
        matched = k - 1
    out.append(text[i:matched])
    i = matched
  return out


def read_json_object(path: pathlib.Path, what: str = "a JSON object") -> dict:
  """A JSON file holding an object; `ValueError` naming the file otherwise."""
  try:
    value = json.loads(path.read_text(encoding="utf-8"))
  except json.JSONDecodeError as e:
    raise ValueError(f"{str(path)!r} is not valid JSON ({e})") from None
  if not isinstance(value, dict):
    raise ValueError(f"{str(path)!r} must hold {what}")
  return value


class ByteLevelBPETokenizer(_CachedWordEncoder):
  """RoBERTa / GPT-2 byte-level BPE from local `vocab.json` and `merges.txt`.

  Every word is encoded in its leading-space form (`"Ġword"`), which is how
  RoBERTa encodes a word after the first in running text and what Hugging Face
  does for pre-split words with `add_prefix_space=True`. Applying it to the
  first word too keeps `encode_word` independent of the word's position, so
  the per-word cache and window boundaries cannot change a word's tokens.
  """

  def __init__(self, vocab_json: str | os.PathLike, merges_txt: str | os.PathLike, *,
               add_prefix_space: bool = True):
    vpath, mpath = pathlib.Path(vocab_json), pathlib.Path(merges_txt)
    for p in (vpath, mpath):
      if not p.is_file():
        raise FileNotFoundError(f"BPE file {str(p)!r} does not exist")
    vocab = read_json_object(vpath, "a JSON object piece -> id")
    self._vocab = {str(k): int(v) for k, v in vocab.items()}
    size = max(self._vocab.values()) + 1 if self._vocab else 0
    self._pieces = [""] * size
    for k, v in self._vocab.items():
      self._pieces[v] = k
    self._ranks = {}
    for line_no, line in enumerate(mpath.read_text(encoding="utf-8").split("\n")):
      line = line.rstrip("\r")
      if not line or (line_no == 0 and line.startswith("#version")):
        continue
      parts = line.split(" ")
      if len(parts) != 2:
        raise ValueError(f"{str(mpath)!r} line {line_no + 1}: expected two pieces, got {line!r}")
      self._ranks.setdefault((parts[0], parts[1]), len(self._ranks))
    self.name = f"bpe:{vpath.parent}"
    self.add_prefix_space = add_prefix_space
    self._byte_map = bytes_to_unicode()

    def special(*pieces):
      for p in pieces:
        if p in self._vocab:
          return self._vocab[p]
      raise ValueError(f"BPE vocabulary {str(vpath)!r} has none of {list(pieces)}")

    self._pad = special("<pad>", "[PAD]")
    self._unk = special("<unk>", "[UNK]")
    self._cls = special("<s>", "[CLS]")
    self._sep = special("</s>", "[SEP]")
    self._mask = special("<mask>", "[MASK]")
    self._bpe_cache: dict[str, tuple[str, ...]] = {}
    self._init_cache()

  vocab_size = property(lambda self: len(self._pieces))

  def id_to_piece(self, i: int) -> str:
    return self._pieces[int(i)]

  def _bpe(self, token: str) -> tuple[str, ...]:
    """Merges the pair of lowest rank until none applies (GPT-2's `bpe`)."""
    cached = self._bpe_cache.get(token)
    if cached is not None:
      return cached
    word = list(token)
    while len(word) > 1:
      best, best_rank = None, None
      for pair in zip(word, word[1:]):
        r = self._ranks.get(pair)
        if r is not None and (best_rank is None or r < best_rank):
          best, best_rank = pair, r
      if best is None:
        break
      merged = []
      i = 0
      while i < len(word):
        if i + 1 < len(word) and word[i] == best[0] and word[i + 1] == best[1]:
          merged.append(best[0] + best[1])
          i += 2
        else:
          merged.append(word[i])
          i += 1
      word = merged
    out = tuple(word)
    if len(self._bpe_cache) < _WORD_CACHE_SIZE:
      self._bpe_cache[token] = out
    return out

  def _encode_word_uncached(self, word: str) -> list[int]:
    text = " " + word if self.add_prefix_space else word
    ids = []
    for token in gpt2_pretokenize(text):
      mapped = "".join(self._byte_map[b] for b in token.encode("utf-8"))
      ids.extend(self._vocab.get(p, self._unk) for p in self._bpe(mapped))
    return ids


# --------------------------------------------------------------------------- training
def train_sentencepiece(texts: Iterable[str], model_prefix: str | os.PathLike,
                        vocab_size: int = 8000, *, model_type: str = "unigram", character_coverage: float = 0.9995,
                        byte_fallback: bool = True, hard_vocab_limit: bool = False,
                        num_threads: int = 1, input_sentence_size: int = 1_000_000,
                        **extra) -> str:
  """Trains a SentencePiece model with flaxdoc's stable special ids; returns the `.model` path.

  The specials are `[PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3` (SentencePiece's pad/unk/
  bos/eos slots) and `[MASK]=4` (a control symbol), so no text can ever encode
  to a special id. `byte_fallback` spells unseen characters as UTF-8 byte
  pieces instead of `[UNK]`; `hard_vocab_limit=False` lets a small corpus give
  a smaller vocabulary instead of failing. `num_threads=1` keeps training
  reproducible. Extra keyword arguments go to `SentencePieceTrainer.train`.
  """
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  lines = _nonempty_lines(texts)
  try:
    first = next(lines)
  except StopIteration:
    raise ValueError("train_sentencepiece: the corpus has no non-empty line") from None

  def chain() -> Iterator[str]:
    yield first
    yield from lines

  prefix = str(model_prefix)
  pathlib.Path(prefix).parent.mkdir(parents=True, exist_ok=True)
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=chain(), model_prefix=prefix, vocab_size=int(vocab_size),
        model_type=model_type, character_coverage=character_coverage,
        pad_id=0, unk_id=1, bos_id=2, eos_id=3,
        pad_piece=SPECIAL_PIECES[0], unk_piece=SPECIAL_PIECES[1],
        bos_piece=SPECIAL_PIECES[2], eos_piece=SPECIAL_PIECES[3],
        control_symbols=[SPECIAL_PIECES[4]], byte_fallback=byte_fallback,
        hard_vocab_limit=hard_vocab_limit, num_threads=num_threads,
        input_sentence_size=input_sentence_size, shuffle_input_sentence=True,
        minloglevel=2, **extra)
  except RuntimeError as e:  # e.g. a vocab_size below the character set (+256 byte pieces)
    raise ValueError(f"SentencePiece training of {prefix!r} failed (vocab_size={vocab_size}, "
                     f"byte_fallback={byte_fallback}): {e}") from None
  return prefix + ".model"


def _nonempty_lines(texts: Iterable[str] | str) -> Iterator[str]:
  if isinstance(texts, str):
    texts = texts.splitlines()
  for t in texts:
    for line in str(t).splitlines():
      if line.strip():
        yield line


# --------------------------------------------------------------------------- default + loading
def cache_dir() -> pathlib.Path:
  """`$FLAXDOC_CACHE`, default `~/.cache/flaxdoc`."""
  return pathlib.Path(os.environ.get("FLAXDOC_CACHE") or
                      pathlib.Path.home() / ".cache" / "flaxdoc").expanduser()


@contextlib.contextmanager
def _file_lock(path: pathlib.Path):
  """An exclusive advisory lock (parallel pytest workers train the model once)."""
  import fcntl  # pylint: disable=import-outside-toplevel
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "a+b") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def default_tokenizer_path() -> pathlib.Path:
  return cache_dir() / "tokenizers" / f"default-{DEFAULT_TOKENIZER_VERSION}.model"


def default_tokenizer() -> SentencePieceTokenizer:
  """flaxdoc's default vocabulary: SentencePiece unigram (~8k) on the synthetic corpus.

  Trained on first use (a few seconds) and cached under `cache_dir()` keyed by
  `DEFAULT_TOKENIZER_VERSION`. Training happens under a file lock into a
  temporary file that is then atomically renamed, so parallel processes never
  see a half-written model.
  """
  return _load_default(str(default_tokenizer_path()))


@functools.lru_cache(maxsize=4)
def _load_default(path_str: str) -> SentencePieceTokenizer:
  path = pathlib.Path(path_str)
  if not path.exists():
    with _file_lock(path.with_suffix(".lock")):
      if not path.exists():  # another process may have finished while we waited
        from flaxdoc.data import synthetic  # pylint: disable=import-outside-toplevel
        corpus = synthetic.corpus_text(DEFAULT_CORPUS_DOCS, DEFAULT_CORPUS_SEED)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
          model = train_sentencepiece(corpus, pathlib.Path(tmp) / "model",
                                      vocab_size=DEFAULT_VOCAB_SIZE)
          os.replace(model, path)
        log.info("trained the default tokenizer into %s", path)
  return SentencePieceTokenizer(path)


def load_tokenizer(spec: str) -> Tokenizer:
  """A tokenizer from a spec string.

  `"default"`, `"sentencepiece:PATH.model"`, `"wordpiece:PATH/vocab.txt"`
  (`"wordpiece-cased:..."` keeps case and accents), `"bpe:DIR"` (a folder with
  `vocab.json` and `merges.txt`), `"hf:DIR"` (a Hugging Face checkpoint folder's own
  tokenizer, see `flaxdoc.data.hf_tokenizer`).
  """
  if spec == "default":
    return default_tokenizer()
  kind, sep, arg = spec.partition(":")
  if not sep or not arg:
    raise ValueError(f"tokenizer spec {spec!r}: expected 'default', 'sentencepiece:PATH', "
                     "'wordpiece:PATH', 'wordpiece-cased:PATH', 'bpe:DIR' or 'hf:DIR'")
  if kind == "hf":
    from flaxdoc.data import hf_tokenizer  # pylint: disable=import-outside-toplevel
    return hf_tokenizer.load_hf_tokenizer(arg)
  if kind == "sentencepiece":
    return SentencePieceTokenizer(arg)
  if kind in ("wordpiece", "wordpiece-cased"):
    return WordPieceTokenizer(arg, lowercase=(kind == "wordpiece"))
  if kind == "bpe":
    d = pathlib.Path(arg)
    return ByteLevelBPETokenizer(d / "vocab.json", d / "merges.txt")
  raise ValueError(f"tokenizer spec {spec!r}: unknown kind {kind!r}")


def special_ids(tokenizer: Tokenizer) -> tuple[int, ...]:
  """The sorted, distinct special ids (pad, unk, cls, sep, mask) of a tokenizer."""
  return tuple(sorted({tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id,
                       tokenizer.mask_id}))


# --------------------------------------------------------------------------- CLI
def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m flaxdoc.data.tokenizers",
                                   description=__doc__.split("\n\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  t = sub.add_parser("train", help="train a SentencePiece model with flaxdoc's special ids")
  t.add_argument("--input", required=True, nargs="+", help="text file(s), one sentence per line")
  t.add_argument("--out", required=True, help="model prefix: writes PREFIX.model and PREFIX.vocab")
  t.add_argument("--vocab_size", type=int, default=DEFAULT_VOCAB_SIZE)
  t.add_argument("--model_type", default="unigram", choices=("unigram", "bpe", "char", "word"))
  e = sub.add_parser("encode", help="show the sub-tokens of some words")
  e.add_argument("--tokenizer", default="default", help="a load_tokenizer spec")
  e.add_argument("words", nargs="+")
  args = parser.parse_args(argv)

  if args.command == "train":
    def lines():
      for name in args.input:
        with open(name, encoding="utf-8") as f:
          yield from f
    model = train_sentencepiece(lines(), args.out, args.vocab_size, model_type=args.model_type)
    tok = SentencePieceTokenizer(model)
    print(f"wrote {model} (vocab_size={tok.vocab_size})")
    return 0
  tok = load_tokenizer(args.tokenizer)
  for w in args.words:
    ids = tok.encode_word(w)
    print(f"{w!r}: {ids} {[tok.id_to_piece(i) for i in ids]}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
