"""Words must be valid text: lone surrogates and non-whitespace controls are refused or repaired.

`"\\ud800"` is valid JSON but not valid Unicode; such a word used to pass
validation and kill SentencePiece (`RuntimeError: Unable to cast Python instance
of type <class 'str'>`). Each tokenizer is checked on the repaired text.
"""

import os
import sys

import numpy as np
import pytest

from flaxdoc.data import tokenizers as tk
from flaxdoc.data.document import TEXT_POLICIES, Document, DocumentError
from flaxdoc.data.features import FeatureConfig, featurize

sys.path.insert(0, os.path.dirname(__file__))
from small_tokenizers import one_of_each  # pylint: disable=import-error,wrong-import-position

BOX = [0, 0, 1, 1]
BAD = {
    "lone high surrogate": "a\ud800b",
    "lone low surrogate": "\udfff",
    "NUL": "x\x00y",
    "escape": "\x1b[31mred",
    "DEL": "del\x7f",
    "C1 control": "\x9bz",
}


def _doc(words, **kw):
  return Document.create("d-1", words, [BOX] * len(words), page_sizes=[[2, 2]], **kw)


@pytest.mark.parametrize("name", sorted(BAD))
def test_invalid_text_is_a_document_error_naming_document_field_and_word(name):
  word = BAD[name]
  with pytest.raises(DocumentError) as info:
    _doc(["fine", "also fine", word])
  message = str(info.value)
  assert message.startswith("document 'd-1', field 'words': word 2 ")
  bad = next(ch for ch in word if ord(ch) < 32 or 0x7f <= ord(ch) <= 0x9f or
             0xd800 <= ord(ch) <= 0xdfff)
  assert f"U+{ord(bad):04X}" in message and "text_policy='replace'" in message
  assert info.value.doc_id == "d-1" and info.value.field == "words"


def test_whitespace_controls_and_valid_astral_text_are_accepted():
  words = ["tab\there", "line\nbreak", "k\x1fz", "\x85q", "🙂", "\U0001d11e", "\ufffd", "x\u200by"]
  assert _doc(words).words == tuple(words)


def test_replace_policy_repairs_and_records():
  doc = _doc(["ok", "a\ud800b", "x\x00\x00y"], text_policy="replace")
  assert doc.words == ("ok", "a\ufffdb", "x\ufffd\ufffdy")
  assert len(doc.repairs) == 1 and "2 words" in doc.repairs[0] and "U+FFFD" in doc.repairs[0]
  assert _doc(["ok"], text_policy="replace").repairs == ()
  with pytest.raises(ValueError, match="text_policy must be one of"):
    _doc(["ok"], text_policy="drop")
  assert TEXT_POLICIES == ("error", "replace")


def test_a_word_made_only_of_controls_stays_a_word():
  """Replacing (not dropping) keeps one word per box: nothing shifts, nothing becomes empty."""
  doc = _doc(["\x00", "\ud800\udc00x"], text_policy="replace")  # a *pair* typed as two escapes
  assert doc.words[0] == "\ufffd" and len(doc.words) == 2


@pytest.fixture(scope="module")
def every_tokenizer(tmp_path_factory):
  """One of each tokenizer class flaxdoc has: SentencePiece, WordPiece, byte-level BPE."""
  return one_of_each(tmp_path_factory.mktemp("tok"))


def test_every_tokenizer_class_is_covered(every_tokenizer):
  classes = {name for name, obj in vars(tk).items()
             if isinstance(obj, type) and name.endswith("Tokenizer") and not name.startswith("_")
             and name != "Tokenizer"}
  assert classes == {type(t).__name__ for t in every_tokenizer.values()}


@pytest.mark.parametrize("name", ["sentencepiece", "wordpiece", "byte_bpe"])
def test_each_tokenizer_featurizes_the_repaired_text(every_tokenizer, name):
  tok = every_tokenizer[name]
  words = ["total", *BAD.values(), "\x00\x01", "ab\ud83dcd"]
  doc = Document.create("d", words, [[i, 0, i + 1, 1] for i in range(len(words))],
                        page_sizes=[[len(words), 2]], text_policy="replace")
  for w in doc.words:
    ids = tok.encode_word(w)
    assert ids and all(0 <= i < tok.vocab_size for i in ids), (w, ids)
  windows = featurize(doc, tok, FeatureConfig(max_len=64))
  seen = set()
  for win in windows:
    ids = win["input_ids"]
    assert ids.dtype == np.int32 and ((0 <= ids) & (ids < tok.vocab_size)).all()
    seen |= set(int(w) for w in win["word_ids"] if w >= 0)
  assert seen == set(range(len(words)))  # every repaired word reached the model


def test_invalid_characters_are_exactly_surrogates_and_non_whitespace_controls():
  """The fast regex against a brute-force reference over every code point (Unicode categories):
  2,048 surrogates + 65 controls - 10 that str.isspace calls whitespace."""
  import unicodedata  # pylint: disable=import-outside-toplevel
  from flaxdoc.data.document import invalid_char, repair_text  # pylint: disable=import-outside-toplevel
  want = "".join(chr(cp) for cp in range(0x110000)
                 if unicodedata.category(chr(cp)) == "Cs" or
                 (unicodedata.category(chr(cp)) == "Cc" and not chr(cp).isspace()))
  everything = "".join(chr(cp) for cp in range(0x110000))
  bad = set(want)
  assert repair_text(everything) == "".join("\ufffd" if c in bad else c for c in everything)
  assert len(want) == 2048 + 65 - 10 and invalid_char("ok\ud800") == "\ud800"
