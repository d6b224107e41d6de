"""One entry point for every dataset: `load_dataset(name, split)`, label sets, dev splits.

Names:

* `funsd`, `cord`, `sroie`: the public benchmarks, read from a local copy by
  `flaxdoc.data.{funsd,cord,sroie}` (see those modules for the expected layout).
  `data_dir` defaults to `$FLAXDOC_DATA_DIR/<name>`.
* `jsonl:PATH`: the flaxdoc JSON Lines format (`flaxdoc.data.jsonl`). `PATH` is a
  directory holding `train.jsonl`, `dev.jsonl`, `test.jsonl` (any subset), a path
  with a `{split}` placeholder, or a single file, which then is the `train` split.
* `synthetic`: generated documents, `flaxdoc.data.synthetic.load_synthetic`.

Splits are `train`, `dev` and `test`. When a dataset has no official `dev` split on
disk, `dev` is carved out of the official `train` split and `train` is the rest,
never overlapping:

1. list the document ids of the official train split and sort them;
2. permute them with `numpy.random.default_rng(seed).permutation` (seed 0 by default);
3. the first `n_dev` of the permutation are `dev`.

`n_dev` is `round(dev_fraction * n)` when `dev_fraction` is given, else the
dataset default (`DEV_SIZES`: FUNSD 20 forms, CORD 100 receipts, SROIE 60 receipts,
JSON Lines 10%), capped at `n // 5` for small copies; at least 1 when `n >= 2`,
and never all of them. The carve depends only on the sorted ids and the seed, so
it is the same on every machine and run.
"""

from __future__ import annotations

import copy
import inspect
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from flaxdoc.data.document import Document
# Defined in public_datasets (the readers import them from there); re-exported here.
from flaxdoc.data.public_datasets import LABELS, DatasetNotFoundError
from flaxdoc.data.report import LoadReport

__all__ = ["LABELS", "SPLITS", "DEV_SIZES", "DatasetNotFoundError", "check_split", "dev_size",
           "carve_dev", "default_data_dir", "has_official_split", "available_splits",
           "option_names", "load_dataset"]

SPLITS = ("train", "dev", "test")

# Default dev-split sizes (documents) when the dataset has no official dev split.
DEV_SIZES = {"funsd": 20, "cord": 100, "sroie": 60}
JSONL_DEV_FRACTION = 0.1

# The official splits each reader can find on disk.
_OFFICIAL_SPLITS = {"funsd": ("train", "test"), "cord": ("train", "dev", "test"),
                    "sroie": ("train", "test")}


def check_split(split: str) -> str:
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
  return split


def dev_size(name: str, n: int, dev_fraction: float | None = None) -> int:
  """How many of `n` official-train documents go to the carved dev split."""
  if dev_fraction is not None and float(dev_fraction) == 0.0:
    return 0  # no dev split: train on the whole official train split (the papers' protocol)
  if n < 2:
    return 0
  if dev_fraction is not None:
    if not 0.0 < dev_fraction < 1.0:
      raise ValueError(f"dev_fraction must be in [0, 1), got {dev_fraction}")
    k = int(round(dev_fraction * n))
  elif name in DEV_SIZES:
    k = min(DEV_SIZES[name], n // 5)
  else:
    k = int(round(JSONL_DEV_FRACTION * n))
  return int(min(max(k, 1), n - 1))


def carve_dev(ids: Sequence[str], n_dev: int, seed: int = 0) -> tuple[list[str], list[str]]:
  """`(dev_ids, train_ids)`: a seeded, order-independent split of `ids` (both sorted)."""
  if len(set(ids)) != len(ids):
    raise ValueError("duplicate document ids; cannot carve a dev split")
  ids = sorted(ids)
  perm = np.random.default_rng(seed).permutation(len(ids))
  dev = {ids[i] for i in perm[:n_dev]}
  return sorted(dev), [i for i in ids if i not in dev]


def _reader(name: str):
  """(list_ids, load) of a file-based dataset; imported lazily (each pulls in its own deps)."""
  if name == "funsd":
    from flaxdoc.data import funsd
    return funsd.list_funsd_ids, funsd.load_funsd
  if name == "cord":
    from flaxdoc.data import cord
    return cord.list_cord_ids, cord.load_cord
  if name == "sroie":
    from flaxdoc.data import sroie
    return sroie.list_sroie_ids, sroie.load_sroie
  raise ValueError(f"unknown dataset {name!r}; expected one of "
                   f"{sorted(_OFFICIAL_SPLITS) + ['jsonl:PATH', 'synthetic']}")


def default_data_dir(name: str) -> Path:
  root = os.environ.get("FLAXDOC_DATA_DIR")
  if not root:
    raise DatasetNotFoundError(
        f"no data_dir given for dataset {name!r} and $FLAXDOC_DATA_DIR is not set; pass "
        f"data_dir=... or set FLAXDOC_DATA_DIR to a folder holding {name}/")
  return Path(root) / name


def has_official_split(name: str, data_dir, split: str) -> bool:
  """Whether `split` of `name` exists on disk (without reading it)."""
  if split not in _OFFICIAL_SPLITS.get(name, ()):
    return False
  list_ids, _ = _reader(name)
  try:
    list_ids(data_dir, split)
  except DatasetNotFoundError:
    return False
  return True


def available_splits(name: str, data_dir=None) -> list[str]:
  """The splits `load_dataset(name, ...)` can produce from this copy."""
  if name == "synthetic":
    return list(SPLITS)
  if name.startswith("jsonl:"):
    spec = name[len("jsonl:"):]
    out = [s for s in SPLITS if _jsonl_split_file(spec, s) is not None]
    return out if "dev" in out or "train" not in out else ["train", "dev"] + out[1:]
  data_dir = Path(data_dir) if data_dir is not None else default_data_dir(name)
  out = [s for s in SPLITS if has_official_split(name, data_dir, s)]
  if "train" in out and "dev" not in out:
    list_ids, _ = _reader(name)
    if dev_size(name, len(list_ids(data_dir, "train"))) > 0:
      out.insert(1, "dev")
  return out


def _options_reader(name: str):
  """(the function `load_dataset(name, ...)` passes its `**options` to, the parameters
  `load_dataset` fills itself)."""
  if name == "synthetic":
    from flaxdoc.data.synthetic import load_synthetic
    return load_synthetic, ("split",)
  if name.startswith("jsonl:"):
    from flaxdoc.data.jsonl import read_jsonl
    return read_jsonl, ("path",)
  return _reader(name)[1], ("data_dir", "split", "ids")


def option_names(name: str) -> tuple[str, ...] | None:
  """The `**options` `load_dataset(name, ...)` takes: its own (`dev_fraction`, `seed`) and
  those its reader takes by keyword (the synthetic generator's `**overrides`: the fields of
  `SyntheticConfig`); None when a reader takes any (`**kwargs`)."""
  reader, filled = _options_reader(name)
  params = inspect.signature(reader).parameters.values()
  extra = ()
  if name == "synthetic":
    import dataclasses  # pylint: disable=import-outside-toplevel
    from flaxdoc.data.synthetic import SyntheticConfig
    extra = tuple(f.name for f in dataclasses.fields(SyntheticConfig))
  elif any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
    return None
  keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
  return tuple(dict.fromkeys(("dev_fraction", "seed") + tuple(
      p.name for p in params if p.kind in keyword and p.name not in filled) + extra))


def load_dataset(name: str, split: str, data_dir=None, *, dev_fraction: float | None = None,
                 seed: int = 0, reads: dict | None = None,
                 **options) -> tuple[list[Document], LoadReport]:
  """Loads one split of a dataset as `(documents, report)`.

  Args:
    name: `funsd`, `cord`, `sroie`, `jsonl:PATH` or `synthetic`.
    split: `train`, `dev` or `test`.
    data_dir: the dataset folder (default `$FLAXDOC_DATA_DIR/<name>`); unused for
      `jsonl:` and `synthetic`.
    dev_fraction: size of a carved dev split as a fraction of the official train
      split (default: the dataset's `DEV_SIZES`).
    seed: seed of the dev carve (see the module docstring). Forwarded to
      `load_synthetic` when that accepts a `seed`.
    reads: a dict the caller keeps across calls so that each `jsonl:` file is read once
      with the same options (e.g. the labels' read of train, train, a dev carved from
      it); each call gets its own list and report.
    **options: passed to the reader (`box_policy`, `on_error`, ...).

  Raises:
    DatasetNotFoundError: a missing folder or split (the message gives the layout).
    DocumentError: malformed data (with `on_error="raise"`, the default).
  """
  check_split(split)
  if name == "synthetic":
    from flaxdoc.data.synthetic import load_synthetic  # written elsewhere; optional here
    if "seed" in inspect.signature(load_synthetic).parameters:
      options.setdefault("seed", seed)
    return load_synthetic(split, **options)
  if name.startswith("jsonl:"):
    return _load_jsonl(name[len("jsonl:"):], split, dev_fraction=dev_fraction, seed=seed,
                       reads=reads, **options)

  list_ids, load = _reader(name)
  data_dir = Path(data_dir) if data_dir is not None else default_data_dir(name)
  if split == "test" or (split == "dev" and has_official_split(name, data_dir, "dev")):
    return load(data_dir, split, **options)
  if split == "train" and has_official_split(name, data_dir, "dev"):
    return load(data_dir, "train", **options)

  ids = list_ids(data_dir, "train")
  n_dev = dev_size(name, len(ids), dev_fraction)
  dev_ids, train_ids = carve_dev(ids, n_dev, seed)
  _check_dev_wanted(data_dir, split, dev_fraction)
  if split == "dev" and not dev_ids:
    raise DatasetNotFoundError(f"{data_dir}: {len(ids)} training document(s) are too few to "
                               "carve a dev split from")
  docs, report = load(data_dir, "train", ids=dev_ids if split == "dev" else train_ids, **options)
  _note_carve(report, name, split, len(dev_ids if split == "dev" else train_ids), len(ids),
              "official-train", n_dev, seed)
  return docs, report


def _note_carve(report: LoadReport, name: str, split: str, kept: int, total: int, what: str,
                n_dev: int, seed: int) -> None:
  """Says in `report` which part of the train documents a split holds."""
  if split == "dev":  # the reader titled the report after the official split it read
    report.source = f"{name}:dev (carved from {report.source})"
  report.stats["split"] = (f"{split}: {kept} of {total} {what} documents "
                           + (f"(dev carved with seed {seed})" if n_dev else "(no dev carved)"))


def _jsonl_split_file(spec: str, split: str) -> Path | None:
  """The file of one split of a `jsonl:` dataset on disk, or None."""
  if "{split}" in spec:
    p = Path(spec.replace("{split}", split))
    return p if p.is_file() else None
  p = Path(spec)
  if p.is_dir():
    f = p / f"{split}.jsonl"
    return f if f.is_file() else None
  if p.is_file() and split == "train":
    return p  # a single file is the train split; dev is carved from it
  return None


def _read_jsonl(path: Path, reads: dict | None, **options):
  """`read_jsonl`, or its earlier result kept in `reads` (copied: callers carve and count)."""
  from flaxdoc.data.jsonl import read_jsonl
  if reads is None:
    return read_jsonl(path, **options)
  key = (str(path.resolve()), repr(sorted(options.items())))
  if key not in reads:
    reads[key] = read_jsonl(path, **options)
  docs, report = reads[key]
  return list(docs), copy.deepcopy(report)


def _load_jsonl(spec: str, split: str, *, dev_fraction, seed, reads=None, **options):
  files = {s: _jsonl_split_file(spec, s) for s in SPLITS}
  if split == "test" or files["dev"] is not None:
    if files[split] is None:
      raise DatasetNotFoundError(
          f"jsonl:{spec}: no {split!r} split. Expected a directory with {split}.jsonl or a "
          "path with a '{split}' placeholder (a single .jsonl file is the train split only)")
    return _read_jsonl(files[split], reads, **options)
  if files["train"] is None:
    raise DatasetNotFoundError(
        f"jsonl:{spec}: no 'train' split to read {split!r} from. Expected a directory with "
        "train.jsonl, a path with a '{split}' placeholder, or a single .jsonl file")
  docs, report = _read_jsonl(files["train"], reads, **options)
  return _carve_loaded(spec, docs, report, split, dev_fraction, seed)


def _check_dev_wanted(where, split: str, dev_fraction) -> None:
  if split == "dev" and dev_fraction is not None and float(dev_fraction) == 0.0:
    raise DatasetNotFoundError(f"{where}: no dev split: data.dev_fraction=0 carves none from "
                               "the official train split; evaluate on the test split "
                               "(data.eval_split=test) or on nothing (data.eval_split='')")


def _carve_loaded(spec, docs, report, split, dev_fraction, seed):
  """Carves dev from already-read train documents (JSON Lines has no file per document)."""
  ids = [d.id for d in docs]
  n_dev = dev_size("jsonl", len(ids), dev_fraction)
  dev_ids, train_ids = carve_dev(ids, n_dev, seed)
  keep = set(dev_ids if split == "dev" else train_ids)
  _check_dev_wanted(f"jsonl:{spec}", split, dev_fraction)
  if split == "dev" and not keep:
    raise DatasetNotFoundError(f"jsonl:{spec}: {len(ids)} document(s) are too few to carve "
                               "a dev split from")
  out = [d for d in docs if d.id in keep]
  report.loaded = len(out)
  _note_carve(report, f"jsonl:{spec}", split, len(out), len(ids), "train", n_dev, seed)
  return out, report
