"""The tokenizer's files inside an export folder, so that the folder is self-contained.

A run records its tokenizer as a spec (`config.data.tokenizer`, see
`flaxdoc.data.tokenizers.load_tokenizer`) naming files on the training machine. The
exporter copies the files that spec's loader reads into `OUT/tokenizer/` and records a
spec relative to the export folder (`"sentencepiece:tokenizer/sp.model"`), which
`load_export_tokenizer(OUT)` resolves against wherever the folder now is: the folder is
passed around as one unit, as a Hugging Face checkpoint folder is.

What is copied into `tokenizer/`, and the spec recorded:

* `default`: nothing (flaxdoc builds it from its own package); `default`;
* `sentencepiece:F.model`, `wordpiece[-cased]:V.txt`: that file; `KIND:tokenizer/NAME`;
* `bpe:DIR`: `vocab.json` and `merges.txt`; `bpe:tokenizer`;
* `hf:DIR`: the vocabulary `load_hf_tokenizer` picks (`vocab.txt`, `vocab.json` +
  `merges.txt`, or a SentencePiece model), with `tokenizer_config.json` and, beside a
  SentencePiece model, `config.json` (its `model_type`) where present; `hf:tokenizer`.

Exports before format version 2 record the absolute spec of the training machine; it
is used as it is. Nothing here imports JAX or torch.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any, Mapping

TOKENIZER_DIR = "tokenizer"
# The first export format whose tokenizer spec is relative to the export folder.
RELATIVE_SPEC_VERSION = 2
_FILE_KINDS = ("sentencepiece", "wordpiece", "wordpiece-cased")


def tokenizer_files(spec: str, field: str = "config.data.tokenizer") -> list[pathlib.Path]:
  """The files `load_tokenizer(spec)` reads (none for `"default"`).

  Raises:
    FileNotFoundError: a file the loader needs is missing; one line naming the file and
      `field`, the setting the spec came from.
    ValueError: a spec that is not a tokenizer spec.
  """
  if spec == "default":
    return []
  kind, sep, arg = spec.partition(":")
  if not sep or not arg:
    raise ValueError(f"{field}={spec!r}: not a tokenizer spec (see "
                     "flaxdoc.data.tokenizers.load_tokenizer)")
  path = pathlib.Path(arg).expanduser()

  def need(p: pathlib.Path) -> pathlib.Path:
    if not p.is_file():
      raise FileNotFoundError(f"{field}={spec!r}: tokenizer file {p} not found (the export "
                              "copies the tokenizer's files into its folder)")
    return p
  if kind in _FILE_KINDS:
    return [need(path)]
  if kind == "bpe":
    return [need(path / "vocab.json"), need(path / "merges.txt")]
  if kind == "hf":
    return _hf_files(path, spec, field, need)
  raise ValueError(f"{field}={spec!r}: unknown tokenizer kind {kind!r}")


def _hf_files(folder: pathlib.Path, spec: str, field: str, need) -> list[pathlib.Path]:
  from flaxdoc.data import hf_tokenizer  # pylint: disable=import-outside-toplevel
  if not folder.is_dir():
    raise FileNotFoundError(f"{field}={spec!r}: tokenizer folder {folder} not found (the export "
                            "copies the tokenizer's files into its folder)")
  kind = hf_tokenizer.tokenizer_kind(folder)  # the same choice the loader makes
  if kind == "wordpiece":
    files = [need(folder / "vocab.txt")]
  elif kind == "bpe":
    files = [need(folder / "vocab.json"), need(folder / "merges.txt")]
  else:
    files = [need(hf_tokenizer._sentencepiece_file(folder))]  # pylint: disable=protected-access
    if (folder / "config.json").is_file():  # its model_type picks fairseq's id layout
      files.append(folder / "config.json")
  if (folder / "tokenizer_config.json").is_file():  # optional: lowercase and accent flags
    files.append(folder / "tokenizer_config.json")
  return files


def copy_tokenizer(spec: str, out_dir: str | os.PathLike,
                   field: str = "config.data.tokenizer") -> str:
  """Copies the tokenizer's files into `out_dir/tokenizer/`; returns the spec to record.

  `out_dir` may be remote (`gs://...`): the files are written through `etils.epath`.
  """
  files = tokenizer_files(spec, field)
  if not files:
    return spec
  from etils import epath  # pylint: disable=import-outside-toplevel
  folder = epath.Path(os.fspath(out_dir)) / TOKENIZER_DIR
  folder.mkdir(parents=True, exist_ok=True)
  for f in files:
    (folder / f.name).write_bytes(f.read_bytes())
  kind = spec.partition(":")[0]
  if kind in _FILE_KINDS:
    return f"{kind}:{TOKENIZER_DIR}/{files[0].name}"
  return f"{kind}:{TOKENIZER_DIR}"


def resolve_spec(config: Mapping[str, Any], folder: str | os.PathLike) -> str:
  """The loadable tokenizer spec of an export's `config.json` read from `folder`."""
  spec = config.get("tokenizer")
  if not spec:  # `export_config` called without one: no guess, the vocabulary may differ
    raise ValueError(f"{folder}: config.json records no tokenizer; export with `python -m "
                     "flaxdoc.export`, or give the tokenizer yourself")
  if spec == "default" or int(config.get("format_version", 1)) < RELATIVE_SPEC_VERSION:
    return spec  # format 1: the training machine's absolute spec, as it was
  kind, _, arg = spec.partition(":")
  # An absolute path (written by `export_config` called directly) stays as it is.
  return f"{kind}:{os.path.join(os.fspath(folder), os.path.expanduser(arg))}"


def load_export_tokenizer(folder: str | os.PathLike, config: Mapping[str, Any] | None = None):
  """The tokenizer of the export in `folder` (its `config.json`, or `config` if given)."""
  # pylint: disable=import-outside-toplevel
  from flaxdoc.data.tokenizers import load_tokenizer
  if config is None:
    import json
    with open(os.path.join(os.fspath(folder), "config.json"), encoding="utf-8") as f:
      config = json.load(f)
  spec = resolve_spec(config, folder)
  try:
    return load_tokenizer(spec)
  except FileNotFoundError as e:
    if int(config.get("format_version", 1)) >= RELATIVE_SPEC_VERSION:
      raise
    raise FileNotFoundError(f"{folder}: this export (format version 1) names the training "
                            f"machine's tokenizer files ({e}); export it again with `python -m "
                            "flaxdoc.export` (the folder then holds them), or give the "
                            "tokenizer yourself") from e
