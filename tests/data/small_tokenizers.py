"""One small tokenizer of each class flaxdoc has (SentencePiece, WordPiece, byte-level BPE), built offline."""

import json

from flaxdoc.data import tokenizers as tk

CORPUS = ["Invoice total 12.50 Date: 03/04/2021 Café Zürich naïve", "the quick brown fox"] * 50


def one_of_each(root) -> dict:
  """{"sentencepiece", "wordpiece", "byte_bpe"} -> tokenizer, files written under `root`."""
  sp = tk.SentencePieceTokenizer(tk.train_sentencepiece(CORPUS, root / "sp", vocab_size=400))
  (root / "vocab.txt").write_text("\n".join(list(tk.SPECIAL_PIECES) + list("abcdefghijkxyz.:") +
                                            ["##" + c for c in "abcdefghijkxyz"]) + "\n",
                                  encoding="utf-8")
  wp = tk.WordPieceTokenizer(root / "vocab.txt")
  # Every byte has its piece and there are no merges: each byte of a word is one token.
  pieces = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"] + sorted(set(tk.bytes_to_unicode().values()))
  (root / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}),
                                   encoding="utf-8")
  (root / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
  bpe = tk.ByteLevelBPETokenizer(root / "vocab.json", root / "merges.txt")
  return {"sentencepiece": sp, "wordpiece": wp, "byte_bpe": bpe}
