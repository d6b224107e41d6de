r"""Where a jitted step spends its time: a `jax.profiler` trace summed by kernel and by kind.

    python -m flaxdoc.bench.profile_summary TRACE_DIR [--top 25] [--json]

`jax.profiler.trace(dir, create_perfetto_trace=True)` writes a Chrome-trace JSON
(`perfetto_trace.json.gz`) next to the TensorBoard files. This reads it without
TensorBoard: the complete events (`"ph": "X"`) of the device lanes (`/device:GPU:0`,
TPU cores; on a CPU-only run the host lane, where XLA:CPU runs its kernels) are summed
by name, and each name is put in a kind by what XLA and the vendor libraries call it:

| kind | kernel names containing |
|---|---|
| `matmul` | gemm, cublas, cutlass, matmul, dot, convolution, xmma, sm90 |
| `attention` | cudnn, flash, fmha, sdpa |
| `scatter` | scatter |
| `gather` | gather, dynamic-slice |
| `reduce` | reduce, softmax, layer_norm |
| `copy` | copy, transpose, memcpy, memset, concatenate, pad |
| `fusion` | any other fusion (element-wise work XLA fused) |
| `other` | the rest |

The first matching kind wins, in the order of the table. `bench.accelerator --profile
DIR` writes such a trace for each pre-training row and prints this summary, which is
what the H100 MFU investigation of issue 14 needs first (which kernels, not which
layers, take the step).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys
from pathlib import Path

KINDS = (
    ("matmul", ("gemm", "cublas", "cutlass", "matmul", "dot", "convolution", "xmma", "sm90")),
    ("attention", ("cudnn", "flash", "fmha", "sdpa")),
    ("scatter", ("scatter",)),
    ("gather", ("gather", "dynamic-slice", "dynamic_slice")),
    ("reduce", ("reduce", "softmax", "layer_norm")),
    ("copy", ("copy", "transpose", "memcpy", "memset", "concatenate", "pad")),
    ("fusion", ("fusion",)),
)
# Host lanes that are the runtime's own bookkeeping, not kernels (Python frames start
# with "$"; the PjRt wrappers enclose the kernels they launch).
HOST_WRAPPERS = ("PjitFunction", "PjRt", "Execute", "ParseArguments", "Handle inputs",
                 "AllocateOutputBuffers", "CollectGarbage", "CreateOutputs", "ThunkExecutor",
                 "XlaModule", "TraceMe")


class TraceError(ValueError):
  """A trace folder or file that holds no readable Chrome trace."""


def kind_of(name: str) -> str:
  low = name.lower()
  for kind, needles in KINDS:
    if any(n in low for n in needles):
      return kind
  return "other"


def find_trace(path: str | Path) -> Path:
  """The newest `*.trace.json.gz` / `perfetto_trace.json.gz` under `path` (or `path` itself)."""
  p = Path(path)
  if p.is_file():
    return p
  if not p.is_dir():
    raise TraceError(f"{p}: no such trace file or folder")
  found = sorted(p.rglob("perfetto_trace.json.gz"), key=lambda f: f.stat().st_mtime)
  if not found:
    found = sorted(p.rglob("*.trace.json.gz"), key=lambda f: f.stat().st_mtime)
  if not found:
    raise TraceError(f"{p}: no perfetto_trace.json.gz or *.trace.json.gz under it "
                     "(was it written by jax.profiler.trace(..., create_perfetto_trace=True)?)")
  return found[-1]


def load_events(path: str | Path) -> list[dict]:
  f = find_trace(path)
  try:
    with gzip.open(f, "rt") as fh:
      data = json.load(fh)
  except (OSError, json.JSONDecodeError, EOFError) as e:
    raise TraceError(f"{f}: not a gzipped Chrome-trace JSON ({e})") from e
  events = data.get("traceEvents") if isinstance(data, dict) else data
  if not isinstance(events, list):
    raise TraceError(f"{f}: no traceEvents list")
  return events


def summarise(events: list[dict], top: int = 25) -> dict:
  """Sums kernel time by name and by kind over the device lanes (the host lane if none).

  Returns `{"lanes": [...], "total_us", "kinds": [{kind, us, share}], "kernels":
  [{name, kind, us, share, count}]}`, both lists largest first.
  """
  lanes = {}
  for e in events:
    if e.get("ph") == "M" and e.get("name") == "process_name":
      lanes[e.get("pid")] = str(e.get("args", {}).get("name", ""))
  device = {pid for pid, n in lanes.items() if "/device:" in n}
  use = device or {pid for pid, n in lanes.items() if n.startswith("/host")} or set(lanes)
  by_name: dict[str, float] = collections.defaultdict(float)
  counts: dict[str, int] = collections.Counter()
  for e in events:
    if e.get("ph") != "X" or e.get("pid") not in use:
      continue
    name = str(e.get("name", "?"))
    if not device and (name.startswith("$") or any(w in name for w in HOST_WRAPPERS)):
      continue
    by_name[name] += float(e.get("dur", 0.0))
    counts[name] += 1
  total = sum(by_name.values())
  by_kind: dict[str, float] = collections.defaultdict(float)
  for name, us in by_name.items():
    by_kind[kind_of(name)] += us
  share = (lambda us: us / total) if total > 0 else (lambda us: 0.0)
  kernels = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
  return dict(
      lanes=sorted(lanes[p] for p in use), total_us=total,
      kinds=[dict(kind=k, us=us, share=share(us))
             for k, us in sorted(by_kind.items(), key=lambda kv: -kv[1])],
      kernels=[dict(name=n, kind=kind_of(n), us=us, share=share(us), count=counts[n])
               for n, us in kernels])


def format_summary(s: dict) -> str:
  lines = [f"lanes: {', '.join(s['lanes']) or '-'}; kernel time {s['total_us'] / 1e3:.2f} ms",
           "", f"{'kind':<10} {'ms':>10} {'share':>7}"]
  lines += [f"{k['kind']:<10} {k['us'] / 1e3:>10.3f} {100 * k['share']:>6.1f}%" for k in s["kinds"]]
  lines += ["", f"{'ms':>10} {'share':>7} {'calls':>6}  {'kind':<9} kernel"]
  lines += [f"{k['us'] / 1e3:>10.3f} {100 * k['share']:>6.1f}% {k['count']:>6}  {k['kind']:<9} "
            f"{k['name'][:90]}" for k in s["kernels"]]
  return "\n".join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("trace", help="a jax.profiler trace folder, or its *.json.gz")
  p.add_argument("--top", type=int, default=25)
  p.add_argument("--json", action="store_true")
  a = p.parse_args(argv)
  try:
    s = summarise(load_events(a.trace), a.top)
  except TraceError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(json.dumps(s) if a.json else format_summary(s))
  return 0


if __name__ == "__main__":
  sys.exit(main())
