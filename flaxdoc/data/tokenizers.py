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

Each lives in a module of its own (`sentencepiece_tokenizer`, `wordpiece`,
`byte_level_bpe`, on the protocol and cached base class of `word_tokenizer`); this
module re-exports them and is the entry point: `load_tokenizer(spec)` and the default
model. The two Hugging Face formats are re-implemented (not wrapped) so that the
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
import logging
import os
import pathlib
import sys
import tempfile
from typing import Sequence

# The tokenizer classes live in a module each; they are re-exported here, the entry
# point every caller uses.
from flaxdoc.data.byte_level_bpe import ByteLevelBPETokenizer, bytes_to_unicode, gpt2_pretokenize
from flaxdoc.data.sentencepiece_tokenizer import (DEFAULT_VOCAB_SIZE, SentencePieceTokenizer,
                                                  train_sentencepiece)
from flaxdoc.data.word_tokenizer import SPECIAL_PIECES, CachedWordEncoder, Tokenizer, read_json_object
from flaxdoc.data.wordpiece import WordPieceTokenizer

__all__ = [
    "SPECIAL_PIECES", "ByteLevelBPETokenizer", "CachedWordEncoder", "SentencePieceTokenizer",
    "Tokenizer", "WordPieceTokenizer", "bytes_to_unicode", "cache_dir", "default_tokenizer",
    "default_tokenizer_path", "gpt2_pretokenize", "load_tokenizer", "read_json_object",
    "special_ids", "train_sentencepiece", "DEFAULT_TOKENIZER_VERSION", "DEFAULT_VOCAB_SIZE",
    "DEFAULT_CORPUS_DOCS", "DEFAULT_CORPUS_SEED", "main",
]

log = logging.getLogger(__name__)

# Bump when the default model's training recipe or corpus changes: the cache key.
DEFAULT_TOKENIZER_VERSION = "sp-unigram-v1"
DEFAULT_CORPUS_DOCS = 600
DEFAULT_CORPUS_SEED = 0


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
    missing = [name for name in args.input if not os.path.isfile(name)]
    if missing:
      parser.error(f"--input: no such file: {', '.join(missing)}")

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
