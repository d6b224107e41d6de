"""SentencePiece models as flaxdoc tokenizers, and training one with flaxdoc's special ids."""

from __future__ import annotations

import os
import pathlib
from typing import Iterable, Iterator

from flaxdoc.data.word_tokenizer import SPECIAL_PIECES, CachedWordEncoder


class SentencePieceTokenizer(CachedWordEncoder):
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


# The vocabulary a trained model gets unless told otherwise (also the CLI's and the default
# tokenizer's, `flaxdoc.data.tokenizers`).
DEFAULT_VOCAB_SIZE = 8000


def train_sentencepiece(texts: Iterable[str], model_prefix: str | os.PathLike,
                        vocab_size: int = DEFAULT_VOCAB_SIZE, *, model_type: str = "unigram",
                        character_coverage: float = 0.9995,
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
