"""Model rows timed in alternation in one process: paired ratios on a machine whose speed drifts.

    python -m flaxdoc.bench.serve_paired [--pages 4] [--rounds 7] [--malloc keep] [--json]

`bench.serve` runs each row in a subprocess of its own, one after the other. On a
shared 2-core machine the speed of the whole machine drifted by 15-30% between such
runs (LayoutLM's 8k row: 14.2 to 20.1 s on different runs), which is larger than the
differences the serving targets ask about. Here every row's model is built once in one
process and the rows are timed round-robin, one model call each per round, so a slow
minute slows all of them alike. Each round gives a ratio to the baseline row; the
median of those paired ratios is what this prints, beside each row's median time.

Only the model stage is timed: featurising, the graph and decoding differ little
between rows and `bench.serve` reports them (decode at most 2% of a document's time).
Rows run one after another in one process changed each other's times (allocator and
thread-pool state); in alternation that affects every row in every round alike, which
is why only the ratios are reported from here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from flaxdoc.bench import common
from flaxdoc.bench import serve

DEFAULT_ROWS = ("etc_rich_torch", "etc_rich_torch_compiled", "layoutlm_torch",
                "layoutlm_torch_compiled")


def build_rows(rows, pages: int, quick: bool):
  """`{row: (runner, batch)}` for one synthetic document of `pages` pages, and its tokens."""
  from flaxdoc.data import features, tokenizers  # pylint: disable=import-outside-toplevel
  tokenizer = tokenizers.load_tokenizer("default")
  size = serve.QUICK if quick else serve.Size()
  docs = serve.make_documents(pages, 1, quick, tokenizer)
  built, tokens = {}, 0
  for row in rows:
    runner, fc, _, tokens, _ = serve.set_up_row(row, docs, tokenizer, size, quick)
    batch = features.batch_features(features.featurize(docs[0], tokenizer, fc))
    built[row] = (runner, {k: v for k, v in batch.items() if k in serve.MODEL_KEYS})
  return built, tokens


def measure_paired(built: dict, rounds: int, baseline: str, warmup: int = 2) -> list[dict]:
  """Times every row once per round, round-robin; one result per row.

  `paired_speedup`: the median over rounds of `baseline time / row time` (documents/s
  relative to the baseline, measured within the same round).
  """
  if baseline not in built:
    raise ValueError(f"serve_paired: the baseline row {baseline!r} is not among the rows "
                     f"{sorted(built)}")
  for runner, batch in built.values():
    for _ in range(warmup):  # compile, allocator and thread-pool warm-up
      runner(batch)
  times = {row: [] for row in built}
  for _ in range(rounds):
    for row, (runner, batch) in built.items():
      t0 = time.perf_counter()
      runner(batch)
      times[row].append(time.perf_counter() - t0)
  base = np.asarray(times[baseline])
  out = []
  for row, ts in times.items():
    ts = np.asarray(ts)
    out.append(dict(bench="serve_paired", row=row, baseline=baseline, rounds=rounds,
                    model_s=float(np.median(ts)), min_s=float(ts.min()),
                    max_s=float(ts.max()), paired_speedup=float(np.median(base / ts)),
                    speedup_low=float(np.min(base / ts)), speedup_high=float(np.max(base / ts)),
                    times_s=[float(t) for t in ts]))
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--pages", type=int, default=4, help="pages of the document (500 tokens each)")
  p.add_argument("--rows", nargs="+", default=list(DEFAULT_ROWS), choices=serve.ROWS)
  p.add_argument("--baseline", default="layoutlm_torch", choices=serve.ROWS)
  p.add_argument("--rounds", type=int, default=7)
  p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
  p.add_argument("--malloc", default="default", choices=["default", "keep"],
                 help="keep: glibc keeps large blocks for reuse (bench.serve.keep_large_allocations)")
  p.add_argument("--quick", action="store_true", help="2 layers x 64, small documents (tests)")
  p.add_argument("--json", action="store_true")
  a = p.parse_args(argv)
  rows = list(dict.fromkeys(list(a.rows) + [a.baseline]))
  serve._set_up_process(False, a.malloc, a.threads)  # pylint: disable=protected-access
  built, tokens = build_rows(rows, a.pages, a.quick)
  results = measure_paired(built, a.rounds, a.baseline)
  for r in results:
    r.update(pages=a.pages, tokens=tokens, malloc=a.malloc)
  if a.json:
    for r in results:
      print(json.dumps(r), flush=True)
    return 0
  common.emit(results, as_json=False,
              title=f"serve_paired: {a.pages} pages ({tokens} tokens), {a.rounds} rounds",
              columns=["row", "model_s", "min_s", "max_s", "paired_speedup", "speedup_low",
                       "speedup_high"])
  return 0


if __name__ == "__main__":
  sys.exit(main())
