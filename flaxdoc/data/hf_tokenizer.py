"""The tokenizer of a local Hugging Face checkpoint folder, as a flaxdoc `Tokenizer`.

    tok = load_hf_tokenizer("models/all-MiniLM-L6-v2")   # or load_tokenizer("hf:DIR")

A checkpoint's vocabulary is only usable with its own tokenisation, so starting
from pre-trained weights (`init_from=hf:DIR`) takes the tokenizer from the same
folder. The folder's files decide the kind, in this order:

* `vocab.txt` -> WordPiece (BERT, LayoutLM, MiniLM); `do_lower_case` and
  `strip_accents` come from `tokenizer_config.json` (Hugging Face's defaults,
  lowercase on and accents following lowercase, when absent);
* `vocab.json` + `merges.txt` -> byte-level BPE (RoBERTa, DocPolarBERT, LAGaBi),
  every word in its leading-space form as `add_prefix_space=True` does;
* a SentencePiece model (`sentencepiece.bpe.model`, `spiece.model`, `*.model`)
  -> SentencePiece; XLM-R / CamemBERT folders keep fairseq's id layout
  (`<s> <pad> </s> <unk>` at 0..3, SentencePiece ids shifted by one, `<mask>` last),
  which is what their `transformers` tokenizers produce.

flaxdoc's tokenizer classes (`wordpiece`, `byte_level_bpe`, `sentencepiece_tokenizer`,
all re-exported by `flaxdoc.data.tokenizers`) do the work (they are checked against
`transformers.AutoTokenizer` in the tests); this module only reads the folder.
Nothing is downloaded.
"""

from __future__ import annotations

import os
import pathlib

from flaxdoc.data.byte_level_bpe import ByteLevelBPETokenizer
from flaxdoc.data.sentencepiece_tokenizer import SentencePieceTokenizer
from flaxdoc.data.word_tokenizer import CachedWordEncoder, Tokenizer, read_json_object
from flaxdoc.data.wordpiece import WordPieceTokenizer

SENTENCEPIECE_FILES = ("sentencepiece.bpe.model", "spiece.model", "tokenizer.model")
# Model types whose SentencePiece ids are laid out as fairseq's dictionary.
FAIRSEQ_MODEL_TYPES = ("xlm-roberta", "camembert")
FAIRSEQ_TOKENIZERS = ("XLMRobertaTokenizer", "XLMRobertaTokenizerFast", "CamembertTokenizer",
                      "CamembertTokenizerFast")


class HFTokenizerError(ValueError):
  """A checkpoint folder whose tokenizer cannot be read (names the folder and the file)."""


def _read_json(path: pathlib.Path) -> dict:
  return read_json_object(path) if path.is_file() else {}


def _flag(config: dict, key: str, default, folder: pathlib.Path):
  value = config.get(key, default)
  if value is None:
    return default
  if not isinstance(value, bool):
    raise HFTokenizerError(f"{folder / 'tokenizer_config.json'}: field {key!r} must be true, "
                           f"false or null, got {value!r}")
  return value


class FairseqSentencePieceTokenizer(CachedWordEncoder):
  """XLM-R / CamemBERT: a SentencePiece model behind fairseq's dictionary layout.

  `<s>=0 <pad>=1 </s>=2 <unk>=3`, then SentencePiece piece `i` (i >= 1) at `i + 1`,
  and `<mask>` after the last piece; SentencePiece's own unknown id maps to `<unk>`.
  Words are encoded in their leading-space form, as in running text.
  """

  OFFSET = 1

  def __init__(self, model_file: str | os.PathLike):
    import sentencepiece as spm  # pylint: disable=import-outside-toplevel
    self.model_file = str(model_file)
    self._sp = spm.SentencePieceProcessor(model_file=self.model_file)
    self.name = f"sentencepiece-fairseq:{model_file}"
    n = self._sp.get_piece_size()
    self._cls, self._pad, self._sep, self._unk = 0, 1, 2, 3
    self._mask = n + self.OFFSET
    self._init_cache()

  vocab_size = property(lambda self: self._sp.get_piece_size() + self.OFFSET + 1)

  def _encode_word_uncached(self, word: str) -> list[int]:
    unk = self._sp.unk_id()
    return [self._unk if i == unk else i + self.OFFSET for i in self._sp.encode(word)]

  def id_to_piece(self, i: int) -> str:
    i = int(i)
    special = {0: "<s>", 1: "<pad>", 2: "</s>", 3: "<unk>", self._mask: "<mask>"}
    if i in special:
      return special[i]
    return self._sp.id_to_piece(i - self.OFFSET)


def _sentencepiece_file(folder: pathlib.Path) -> pathlib.Path | None:
  for name in SENTENCEPIECE_FILES:
    if (folder / name).is_file():
      return folder / name
  models = sorted(folder.glob("*.model"))
  return models[0] if models else None


def tokenizer_kind(folder: str | os.PathLike) -> str:
  """"wordpiece" | "bpe" | "sentencepiece": what `load_hf_tokenizer` would build."""
  d = pathlib.Path(folder)
  if (d / "vocab.txt").is_file():
    return "wordpiece"
  if (d / "vocab.json").is_file() and (d / "merges.txt").is_file():
    return "bpe"
  if _sentencepiece_file(d) is not None:
    return "sentencepiece"
  raise HFTokenizerError(
      f"{d}: no tokenizer files found: expected vocab.txt (WordPiece), vocab.json + merges.txt "
      "(byte-level BPE) or a SentencePiece *.model file; set config.data.tokenizer to use "
      "another tokenizer")


def load_hf_tokenizer(folder: str | os.PathLike) -> Tokenizer:
  """The tokenizer stored in a Hugging Face checkpoint folder (see the module docstring)."""
  d = pathlib.Path(folder)
  if not d.is_dir():
    raise HFTokenizerError(f"{d}: not a directory (expected a Hugging Face checkpoint folder)")
  kind = tokenizer_kind(d)
  tconfig = _read_json(d / "tokenizer_config.json")
  if kind == "wordpiece":
    lowercase = _flag(tconfig, "do_lower_case", True, d)
    strip = tconfig.get("strip_accents")
    if strip is not None and not isinstance(strip, bool):
      raise HFTokenizerError(f"{d / 'tokenizer_config.json'}: field 'strip_accents' must be "
                             f"true, false or null, got {strip!r}")
    tok = WordPieceTokenizer(d / "vocab.txt", lowercase=lowercase, strip_accents=strip)
  elif kind == "bpe":
    tok = ByteLevelBPETokenizer(d / "vocab.json", d / "merges.txt")
  else:
    model = _sentencepiece_file(d)
    mconfig = _read_json(d / "config.json")
    if (mconfig.get("model_type") in FAIRSEQ_MODEL_TYPES
        or tconfig.get("tokenizer_class") in FAIRSEQ_TOKENIZERS):
      tok = FairseqSentencePieceTokenizer(model)
    else:
      tok = SentencePieceTokenizer(model)
  tok.name = f"hf:{d}"
  return tok
