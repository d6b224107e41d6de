"""Shared plumbing for `python -m flaxdoc.bench.*`: timing, peak memory and output.

Every benchmark prints a readable table by default and, with `--json`, one JSON
object per measurement (so results can be compared across commits).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from typing import Callable, Sequence


def peak_rss_mb() -> float:
  """Peak resident memory of this process so far, in MiB (Linux reports KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def time_call(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1,
              min_seconds: float = 0.0) -> float:
  """Median wall time of `fn()` in seconds (after `warmup` untimed calls).

  `fn` must block until its work is done (call `jax.block_until_ready` inside).
  """
  for _ in range(warmup):
    fn()
  times = []
  start_all = time.perf_counter()
  while len(times) < repeats or (time.perf_counter() - start_all) < min_seconds:
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
    if len(times) >= 1000:
      break
  times.sort()
  return times[len(times) // 2]


def time_back_to_back(fn: Callable[[], object], *, warmup: int = 2, iters: int = 10) -> float:
  """Seconds per call of `fn()`: `iters` back-to-back calls, one sync at the end (median of 3).

  For asynchronous devices (GPU/TPU), where `time_call`'s sync after every call would
  add the launch gap to each: `fn` returns arrays that are not yet ready.
  """
  import jax  # pylint: disable=import-outside-toplevel
  for _ in range(warmup):
    jax.block_until_ready(fn())
  runs = []
  for _ in range(3):
    t0 = time.perf_counter()
    out = None
    for _ in range(iters):
      out = fn()
    jax.block_until_ready(out)
    runs.append((time.perf_counter() - t0) / iters)
  return sorted(runs)[1]


def format_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
  """A plain aligned text table of dict rows (missing values print as '-')."""
  if not rows:
    return "(no measurements)"
  if columns is None:
    columns = []
    for r in rows:
      for k in r:
        if k not in columns:
          columns.append(k)

  def fmt(v):
    if v is None:
      return "-"
    if isinstance(v, float):
      if v == 0:
        return "0"
      if abs(v) >= 100:
        return f"{v:,.0f}"
      if abs(v) >= 1:
        return f"{v:.2f}"
      return f"{v:.4g}"
    return str(v)

  cells = [[fmt(r.get(c)) for c in columns] for r in rows]
  widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
  line = "  ".join(c.ljust(w) for c, w in zip(columns, widths))
  sep = "  ".join("-" * w for w in widths)
  body = ["  ".join(v.rjust(w) if _numeric(v) else v.ljust(w) for v, w in zip(row, widths))
          for row in cells]
  return "\n".join([line, sep, *body])


def _numeric(s: str) -> bool:
  return s.replace(",", "").replace(".", "").replace("-", "").replace("e", "").isdigit()


def emit(rows: Sequence[dict], *, as_json: bool, columns: Sequence[str] | None = None,
         title: str | None = None, file=None):
  """Prints rows as JSON lines (`as_json`) or as a titled table."""
  file = file or sys.stdout
  if as_json:
    for r in rows:
      print(json.dumps(r, sort_keys=False), file=file)
  else:
    if title:
      print(title, file=file)
    print(format_table(rows, columns), file=file)
  file.flush()


# `GCNLayer(kernel=...)`'s names (`flaxdoc.nn.gcn.KERNELS`, a test keeps them equal), for
# the benchmarks' flags: spelled out so a `--help` or an environment set before JAX's
# import (`hlo_traffic`) does not wait on importing JAX.
GCN_KERNELS = ("xla", "pallas", "pallas_saved", "pallas_dpre", "pallas_fused",
               "pallas_fused_forward")

# One run on a 16-core Xeon (flaxdoc.bench.gemm, 2,048 tokens, float32, jaxlib 0.11):
# XLA:CPU's default thunk runtime ran the encoder's [N, 768] x [768, 768] matmul at 454
# GFLOP/s against PyTorch's 1,043; with the older whole-program runtime JAX matched
# PyTorch on all three shapes (1,034 vs 1,028 GFLOP/s overall). jaxlib 0.10 warns that
# the flag is no longer supported, so benchmarks take it only when asked
# (`bench.serve --xla_no_thunks`) until a repeated measurement confirms it.
XLA_CPU_DEFAULT_FLAGS = ("--xla_cpu_use_thunk_runtime=false",)


def use_xla_cpu_defaults(enabled: bool = True) -> str:
  """Adds `XLA_CPU_DEFAULT_FLAGS` to `XLA_FLAGS` (before JAX starts); returns the value.

  Flags the user already set win: a flag whose name is in `XLA_FLAGS` is not added.
  """
  import os  # pylint: disable=import-outside-toplevel
  flags = os.environ.get("XLA_FLAGS", "")
  if enabled:
    for flag in XLA_CPU_DEFAULT_FLAGS:
      if flag.split("=")[0] not in flags:
        flags = f"{flags} {flag}".strip()
    os.environ["XLA_FLAGS"] = flags
  return flags
