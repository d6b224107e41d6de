"""BERT's WordPiece tokenisation from a local `vocab.txt`, re-implemented (no `transformers`)."""

from __future__ import annotations

import os
import pathlib
import unicodedata

from flaxdoc.data.word_tokenizer import SPECIAL_PIECES, CachedWordEncoder


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


class WordPieceTokenizer(CachedWordEncoder):
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
