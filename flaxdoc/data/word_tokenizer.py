"""What every flaxdoc tokenizer is: the `Tokenizer` protocol and its cached base class
(plus the special pieces and `read_json_object`, which the formats share).

`flaxdoc.data.tokenizers` is the entry point (`load_tokenizer`, the default model); the
three vocabulary formats live beside this module (`sentencepiece_tokenizer`,
`wordpiece`, `byte_level_bpe`) and the Hugging Face folder reader (`hf_tokenizer`)
builds on them, so none of them imports the loader.
"""

from __future__ import annotations

import json
import pathlib
from typing import Protocol, runtime_checkable

# The special pieces every flaxdoc-trained SentencePiece model has, at ids 0..4 (and
# BERT's WordPiece vocabularies, by name).
SPECIAL_PIECES = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# Per-tokenizer memo of word -> ids. OCR text repeats a lot ("Date:", "Total"),
# so an LRU over words is what makes featurisation fast.
WORD_CACHE_SIZE = 1 << 16


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


class CachedWordEncoder:
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
    self._cache = _LRU(WORD_CACHE_SIZE)

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


def read_json_object(path: pathlib.Path, what: str = "a JSON object") -> dict:
  """A JSON file holding an object; `ValueError` naming the file otherwise."""
  try:
    value = json.loads(path.read_text(encoding="utf-8"))
  except json.JSONDecodeError as e:
    raise ValueError(f"{str(path)!r} is not valid JSON ({e})") from None
  if not isinstance(value, dict):
    raise ValueError(f"{str(path)!r} must hold {what}")
  return value
