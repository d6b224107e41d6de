"""Input-pipeline throughput: reading and featurising FUNSD and synthetic documents.

    python -m flaxdoc.bench.data [--json] [--data_dir ../shared/datasets] [--tokenizer default]

Stages per dataset:
  read             load the split from disk (FUNSD) or generate it (synthetic);
  featurize_cold   featurise every document once with an empty word cache;
  featurize        the same with the cache warm (median of `--repeats` passes);
  read+featurize   read + warm featurisation, the steady state of an epoch;
  mlm+lop          MLM (15%) and 1-LOP (30%) targets on the stacked windows.
Each row reports documents/s, real tokens/s (specials included, padding not)
and ms per document. FUNSD rows are skipped, with a note, when the data is
missing. `--json` prints one JSON object per row.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
from typing import Callable

import numpy as np

from flaxdoc.bench.common import emit, peak_rss_mb, time_call
from flaxdoc.data import tokenizers as tk
from flaxdoc.data.features import FeatureConfig, batch_features, featurize
from flaxdoc.data.masking import pretraining_targets

COLUMNS = ("bench", "dataset", "stage", "docs", "tokens", "windows", "seconds", "docs_per_s",
           "tokens_per_s", "ms_per_doc", "note")


DATASETS_HELP = ("datasets root holding funsd/, cord/, sroie/ (default $FLAXDOC_DATA_DIR, else "
                 "$FLAXDOC_DATASETS, else ../shared/datasets next to the repository)")


def default_datasets_dir() -> pathlib.Path:
  """The benches' `--data_dir` default: the folder holding `funsd/`, `cord/`, `sroie/`.

  `$FLAXDOC_DATA_DIR` first (the root `load_dataset` reads, the one the README tells users
  to set), then `$FLAXDOC_DATASETS` (the tests' and CI's name for it), then
  `../shared/datasets` next to the repository.
  """
  for var in ("FLAXDOC_DATA_DIR", "FLAXDOC_DATASETS"):
    if os.environ.get(var):
      return pathlib.Path(os.environ[var])
  return pathlib.Path(__file__).resolve().parents[2] / ".." / "shared" / "datasets"


def _funsd_dir(root: pathlib.Path) -> pathlib.Path:
  """Accepts the datasets root (holding `funsd/`) or the FUNSD folder itself."""
  return root if (root / "training_data").is_dir() else root / "funsd"


def _fresh_tokenizer(spec: str):
  """A new tokenizer object (empty word cache) for the given spec."""
  if spec == "default":
    tk.default_tokenizer()  # make sure the model exists
    return tk.SentencePieceTokenizer(tk.default_tokenizer_path())
  return tk.load_tokenizer(spec)


def _row(dataset: str, stage: str, docs: int, tokens: int | None, windows: int | None,
         seconds: float, note: str | None = None) -> dict:
  return {
      "bench": "data", "dataset": dataset, "stage": stage, "docs": docs, "tokens": tokens,
      "windows": windows, "seconds": seconds,
      "docs_per_s": docs / seconds if seconds > 0 else None,
      "tokens_per_s": tokens / seconds if tokens and seconds > 0 else None,
      "ms_per_doc": 1e3 * seconds / docs if docs else None,
      "note": note,
  }


def bench_dataset(name: str, read: Callable[[], list], spec: str, config: FeatureConfig,
                  repeats: int, seed: int = 0) -> list[dict]:
  """Rows for one dataset: read, cold and warm featurisation, and pre-training targets."""
  t0 = time.perf_counter()
  docs = read()
  read_s = time.perf_counter() - t0
  rows = [_row(name, "read", len(docs), None, None, read_s,
               note=f"{sum(len(d) for d in docs)} words")]

  tokenizer = _fresh_tokenizer(spec)
  t0 = time.perf_counter()
  windows = [w for d in docs for w in featurize(d, tokenizer, config)]
  cold_s = time.perf_counter() - t0
  tokens = int(sum(int(w["attention_mask"].sum()) for w in windows))
  rows.append(_row(name, "featurize_cold", len(docs), tokens, len(windows), cold_s))

  warm_s = time_call(lambda: [featurize(d, tokenizer, config) for d in docs], repeats=repeats,
                     warmup=0)
  rows.append(_row(name, "featurize", len(docs), tokens, len(windows), warm_s,
                   note=f"max_len={config.max_len}, stride={config.stride}"))
  rows.append(_row(name, "read+featurize", len(docs), tokens, len(windows), read_s + warm_s))

  batch = batch_features(windows)
  rng = np.random.default_rng(seed)
  mask_s = time_call(lambda: pretraining_targets(batch, rng, tokenizer, mlm_rate=0.15,
                                                 lop_rate=0.3), repeats=repeats, warmup=1)
  rows.append(_row(name, "mlm+lop", len(docs), tokens, len(windows), mask_s))
  return rows


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m flaxdoc.bench.data",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--json", action="store_true", help="one JSON object per measurement")
  parser.add_argument("--data_dir", default=None,
                      help=DATASETS_HELP)
  parser.add_argument("--tokenizer", default="default", help="a load_tokenizer spec")
  parser.add_argument("--max_len", type=int, default=512)
  parser.add_argument("--stride", type=int, default=None)
  parser.add_argument("--num_synthetic", type=int, default=200)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args(argv)

  synthetic_labels = ()
  try:
    from flaxdoc.data import synthetic  # pylint: disable=import-outside-toplevel
    synthetic_labels = tuple(synthetic.LABELS)
  except ImportError:
    synthetic = None

  rows = []
  root = pathlib.Path(args.data_dir) if args.data_dir else default_datasets_dir()
  funsd_dir = _funsd_dir(root)
  if funsd_dir.is_dir():
    # pylint: disable-next=import-outside-toplevel
    from flaxdoc.data.datasets import LABELS, load_dataset
    cfg = FeatureConfig(max_len=args.max_len, stride=args.stride, labels=LABELS["funsd"])
    rows += bench_dataset("funsd", lambda: load_dataset("funsd", "train", data_dir=funsd_dir)[0],
                          args.tokenizer, cfg, args.repeats)
  else:
    rows.append({"bench": "data", "dataset": "funsd", "stage": "skipped",
                 "note": f"no FUNSD folder at {funsd_dir} (pass --data_dir)"})

  if synthetic is not None:
    cfg = FeatureConfig(max_len=args.max_len, stride=args.stride, labels=synthetic_labels)
    rows += bench_dataset("synthetic", lambda: synthetic.generate(args.num_synthetic, seed=0),
                          args.tokenizer, cfg, args.repeats)
  else:
    rows.append({"bench": "data", "dataset": "synthetic", "stage": "skipped",
                 "note": "flaxdoc.data.synthetic is not available"})

  for r in rows:
    r["peak_rss_mb"] = peak_rss_mb()
  emit(rows, as_json=args.json, columns=COLUMNS,
       title=f"flaxdoc data pipeline (tokenizer {args.tokenizer}, max_len {args.max_len})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
