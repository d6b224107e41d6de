"""RoBERTa / GPT-2 byte-level BPE from local `vocab.json` and `merges.txt`, re-implemented."""

from __future__ import annotations

import functools
import os
import pathlib
import unicodedata

from flaxdoc.data.word_tokenizer import WORD_CACHE_SIZE, CachedWordEncoder, read_json_object


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


class ByteLevelBPETokenizer(CachedWordEncoder):
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
    if len(self._bpe_cache) < WORD_CACHE_SIZE:
      self._bpe_cache[token] = out
    return out

  def _encode_word_uncached(self, word: str) -> list[int]:
    text = " " + word if self.add_prefix_space else word
    ids = []
    for token in gpt2_pretokenize(text):
      mapped = "".join(self._byte_map[b] for b in token.encode("utf-8"))
      ids.extend(self._vocab.get(p, self._unk) for p in self._bpe(mapped))
    return ids
