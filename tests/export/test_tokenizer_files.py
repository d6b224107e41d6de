"""The export folder carries its tokenizer: each kind's files copied, the spec relative to the
folder, the folder moved and the originals gone, the same ids (no model, no JAX run)."""

import json
import shutil

import pytest

from flaxdoc.data import tokenizers
from flaxdoc.export import tokenizer_files

WORDS = ["Total:", "12,345.67", "Invoice", "Café", "the", "date", "zzqx"]
WORDPIECE_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "total", ":", "12", ",", "345",
                   ".", "67", "in", "##vo", "##ice", "cafe", "the", "date", "z", "##z", "##q",
                   "##x"]


def _bpe_folder(folder):
  """A tiny byte-level BPE vocabulary: every byte, a few merges, RoBERTa's specials."""
  chars = list(tokenizers.bytes_to_unicode().values())
  merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("a", "t")]
  vocab = {p: i for i, p in enumerate(["<s>", "<pad>", "</s>", "<unk>"] + chars +
                                      ["".join(m) for m in merges])}
  vocab["<mask>"] = len(vocab)
  folder.mkdir(parents=True)
  (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
  (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges),
                                     encoding="utf-8")
  (folder / "unrelated.bin").write_bytes(b"weights the tokenizer does not read")


def _sources(root):
  """spec -> (the files the export must hold under tokenizer/, the spec it records)."""
  sp = root / "sp" / "my.model"
  sp.parent.mkdir(parents=True)
  shutil.copy(tokenizers.default_tokenizer_path(), sp)
  (root / "wp").mkdir()
  (root / "wp" / "vocab.txt").write_text("\n".join(WORDPIECE_VOCAB) + "\n", encoding="utf-8")
  _bpe_folder(root / "bpe")
  hf = root / "hf"
  hf.mkdir()
  shutil.copy(root / "wp" / "vocab.txt", hf / "vocab.txt")
  (hf / "tokenizer_config.json").write_text('{"do_lower_case": false}')
  (hf / "model.safetensors").write_bytes(b"not read by the tokenizer")
  return {
      f"sentencepiece:{sp}": (["my.model"], "sentencepiece:tokenizer/my.model"),
      f"wordpiece:{root / 'wp' / 'vocab.txt'}": (["vocab.txt"], "wordpiece:tokenizer/vocab.txt"),
      f"wordpiece-cased:{root / 'wp' / 'vocab.txt'}": (["vocab.txt"],
                                                       "wordpiece-cased:tokenizer/vocab.txt"),
      f"bpe:{root / 'bpe'}": (["merges.txt", "vocab.json"], "bpe:tokenizer"),
      f"hf:{hf}": (["tokenizer_config.json", "vocab.txt"], "hf:tokenizer"),
  }


def test_each_kind_is_copied_and_loads_from_the_moved_folder(tmp_path):
  tokenizers.default_tokenizer()  # trained on first use: the sentencepiece case copies it
  cases = _sources(tmp_path / "train_machine")
  for k, (spec, (files, recorded)) in enumerate(cases.items()):
    want = tokenizers.load_tokenizer(spec)
    out = tmp_path / f"export{k}"
    assert tokenizer_files.copy_tokenizer(spec, out) == recorded
    assert sorted(p.name for p in (out / "tokenizer").iterdir()) == files
    moved = tmp_path / "serving" / f"export{k}"
    shutil.copytree(out, moved)
    shutil.rmtree(out)
    got = tokenizer_files.load_export_tokenizer(moved, {"tokenizer": recorded,
                                                        "format_version": 2})
    assert [got.encode_word(w) for w in WORDS] == [want.encode_word(w) for w in WORDS], spec
    assert got.vocab_size == want.vocab_size
  # The training machine's files are gone: every moved export still loads (above, after
  # each copy; here once all are removed, which the hf: kind's `vocab.txt` shared).
  shutil.rmtree(tmp_path / "train_machine")
  got = tokenizer_files.load_export_tokenizer(tmp_path / "serving" / "export4",
                                              {"tokenizer": "hf:tokenizer", "format_version": 2})
  assert got.encode_word("Total:") == [1, 6]  # do_lower_case: false was copied: "Total" unknown
  assert got.encode_word("total") == [5]


def test_default_stays_default_and_copies_nothing(tmp_path):
  assert tokenizer_files.copy_tokenizer("default", tmp_path / "out") == "default"
  assert not (tmp_path / "out").exists()
  assert tokenizer_files.resolve_spec({"tokenizer": "default", "format_version": 2},
                                      tmp_path) == "default"


def test_an_export_without_a_tokenizer_spec_is_refused(tmp_path):
  with pytest.raises(ValueError, match="records no tokenizer"):
    tokenizer_files.resolve_spec({"tokenizer": None, "format_version": 2}, tmp_path)


def test_a_format_1_export_keeps_its_absolute_spec(tmp_path):
  spec = f"wordpiece:{tmp_path / 'vocab.txt'}"
  assert tokenizer_files.resolve_spec({"tokenizer": spec}, tmp_path / "x") == spec
  assert tokenizer_files.resolve_spec({"tokenizer": spec, "format_version": 1}, "/else") == spec
  # format 2 with an absolute path (export_config called directly): used as it is.
  assert tokenizer_files.resolve_spec({"tokenizer": spec, "format_version": 2}, "/else") == spec
  assert (tokenizer_files.resolve_spec({"tokenizer": "bpe:tokenizer", "format_version": 2},
                                       tmp_path) == f"bpe:{tmp_path / 'tokenizer'}")


@pytest.mark.parametrize("kind", ["sentencepiece", "wordpiece", "bpe", "hf"])
def test_a_missing_file_is_one_line_naming_the_file_and_the_field(tmp_path, kind):
  missing = tmp_path / "gone"
  if kind == "bpe":
    missing.mkdir()
    (missing / "vocab.json").write_text("{}")
  spec = f"{kind}:{missing}"
  with pytest.raises(FileNotFoundError) as err:
    tokenizer_files.copy_tokenizer(spec, tmp_path / "out")
  message = str(err.value)
  assert "\n" not in message and "config.data.tokenizer" in message
  assert str(missing / "merges.txt" if kind == "bpe" else missing) in message
  assert not (tmp_path / "out").exists()
