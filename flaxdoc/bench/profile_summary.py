r"""Where a jitted step spends its time: a `jax.profiler` trace summed by kernel and by kind.

    python -m flaxdoc.bench.profile_summary TRACE_DIR [--top 25] [--hlo MODULE.txt] [--json]

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

The first matching kind wins, in the order of the table.

Given the compiled module's text (`--hlo`, or a `*.hlo.txt` / `*.hlo.txt.gz` beside the
trace, which `bench.accelerator --profile` writes gzipped), kernel time is also summed by
*model part*: each kernel is matched to its HLO instruction (by name, or by the event's
`hlo_op`), the instruction to its `op_name` metadata (JAX's name stack with Flax's module
path), and that to a part (`PARTS`: GCN, attention, Rich Attention, feed-forward, MLM head,
optimizer, ...; "(backward)" under a transpose). `bench.accelerator --profile
DIR` writes such a trace for each pre-training row and prints this summary, which is
what the H100 MFU investigation of issue 14 needs first (which kernels, not which
layers, take the step).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
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
                 "XlaModule", "TraceMe", "ThreadPool", "DevicePut", "Handle input event")


# Model parts, by what the kernels' HLO `op_name` metadata holds: JAX's name stack with
# Flax's module path (`.../encoder/layer_3/attention/term_0/...`). The first match wins
# (so a LayerNorm inside the GCN counts as GCN); an op under `transpose(` is the backward
# pass; an op outside the model's `jvp(` is the optimizer's update.
PARTS = (
    ("mlm head", ("mlm_head",)),
    ("gcn", ("super_token", "gcn")),
    ("layer norm", ("attention_norm", "mlp_norm", "layer_norm", "layernorm")),
    ("dropout", ("dropout", "bernoulli", "threefry")),
    ("attention", ("/etc_rich_",)),  # the fused ETC kernels: attention with Rich Attention in
    ("layout terms", ("/term_", "rich")),
    ("attention", ("attention",)),
    ("feed-forward", ("mlp", "erf", "gelu")),
    ("tagging head", ("tagging_head",)),
    ("embeddings", ("embed",)),
)


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


def _kernel_times(events: list[dict]):
  """`({name: (microseconds, hlo_op)}, {name: calls}, lanes)` over the device lanes
  (the host lane, less the runtime's wrappers, when there is no device lane)."""
  lanes = {}
  for e in events:
    if e.get("ph") == "M" and e.get("name") == "process_name":
      lanes[e.get("pid")] = str(e.get("args", {}).get("name", ""))
  device = {pid for pid, n in lanes.items() if "/device:" in n}
  use = device or {pid for pid, n in lanes.items() if n.startswith("/host")} or set(lanes)
  by_name: dict[str, list] = {}
  counts: dict[str, int] = collections.Counter()
  for e in events:
    if e.get("ph") != "X" or e.get("pid") not in use:
      continue
    name = str(e.get("name", "?"))
    if not device and (name.startswith("$") or any(w in name for w in HOST_WRAPPERS)):
      continue
    entry = by_name.setdefault(name, [0.0, None])
    entry[0] += float(e.get("dur", 0.0))
    hlo_op = (e.get("args") or {}).get("hlo_op")
    if hlo_op and not str(hlo_op).startswith("command_buffer"):
      entry[1] = str(hlo_op)
    counts[name] += 1
  return ({k: (v[0], v[1]) for k, v in by_name.items()}, counts,
          sorted(lanes[p] for p in use))


def summarise(events: list[dict], top: int = 25) -> dict:
  """Sums kernel time by name and by kind over the device lanes (the host lane if none).

  Returns `{"lanes": [...], "total_us", "kinds": [{kind, us, share}], "kernels":
  [{name, kind, us, share, count}]}`, both lists largest first.
  """
  timed, counts, lane_names = _kernel_times(events)
  by_name = {name: us for name, (us, _) in timed.items()}
  total = sum(by_name.values())
  by_kind: dict[str, float] = collections.defaultdict(float)
  for name, us in by_name.items():
    by_kind[kind_of(name)] += us
  share = (lambda us: us / total) if total > 0 else (lambda us: 0.0)
  kernels = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
  return dict(
      lanes=lane_names, total_us=total,
      kinds=[dict(kind=k, us=us, share=share(us))
             for k, us in sorted(by_kind.items(), key=lambda kv: -kv[1])],
      kernels=[dict(name=n, kind=kind_of(n), us=us, share=share(us), count=counts[n])
               for n, us in kernels])


def part_of(op_name: str) -> str:
  """The model part an HLO `op_name` belongs to (`PARTS`), "(backward)" under a transpose."""
  low = op_name.lower()
  if "jvp(" not in low:
    return "optimizer"
  part = next((p for p, needles in PARTS if any(n in low for n in needles)), "other")
  return f"{part} (backward)" if "transpose(" in low else part


_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*[({]")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CALLS = re.compile(r"(?:calls|to_apply|body)=%?([\w.\-]+)")
_OPERAND = re.compile(r"%([\w.\-]+)")
_PALLAS_CALL = re.compile(r"([\w.\-]+)/pallas_call")
_DEDUPLICATED = re.compile(r"__\d+$")


def read_hlo_text(path) -> str:
  """A compiled module's text from `path`, gzipped if it ends in `.gz` (an H100 step's text
  is ~17 MB, over what a lent device machine sends back in one file; gzipped ~2 MB)."""
  path = Path(path)
  if path.suffix == ".gz":
    with gzip.open(path, "rt", encoding="utf-8") as f:
      return f.read()
  return path.read_text(encoding="utf-8")


def write_hlo_text(path, text: str) -> None:
  """`text` to `path`, gzipped if it ends in `.gz`."""
  path = Path(path)
  if path.suffix == ".gz":
    with gzip.open(path, "wt", encoding="utf-8") as f:
      f.write(text)
  else:
    path.write_text(text, encoding="utf-8")


def hlo_op_names(hlo_text: str) -> dict[str, str]:
  """`{instruction name: op_name}` from a compiled module's text (`compiled.as_text()`).

  An instruction without metadata of its own (most fusions) takes the first op_name
  found inside the computation it calls (its fused instructions).
  """
  own: dict[str, str] = {}
  calls: dict[str, str] = {}
  operands: dict[str, list[str]] = {}
  first_in: dict[str, str] = {}
  computation = None
  for line in hlo_text.splitlines():
    m = _INSTRUCTION.match(line)
    if m is None:
      c = _COMPUTATION.match(line)
      if c is not None and not line.strip().startswith("}"):
        computation = c.group(1)
      continue
    name, rest = m.groups()
    op = _OP_NAME.search(rest)
    if op:
      own[name] = op.group(1)
      if computation is not None:
        first_in.setdefault(computation, op.group(1))
    called = _CALLS.search(rest)
    if called:
      calls[name] = called.group(1)
    operands[name] = _OPERAND.findall(rest.split("metadata=", 1)[0])
  names = dict(own)
  for name, computation_name in calls.items():
    if name not in names and computation_name in first_in:
      names[name] = first_in[computation_name]
  # What passes added without metadata (layout copies, split dots) belongs where its
  # first operand does (instructions come in dependency order within a computation).
  for name, args in operands.items():
    if name not in names:
      found = next((names[a] for a in args if a in names), None)
      if found is not None:
        names[name] = found
  return names


def summarise_parts(events: list[dict], op_names: dict[str, str]) -> list[dict]:
  """Kernel time by model part (`part_of` each kernel's op_name), largest first.

  A kernel is found by its name (XLA:CPU names kernels after their HLO instruction;
  XLA:GPU after the fusion, `.` written `_`) or by its `hlo_op` argument. Library
  kernels launched from a CUDA graph (cuBLAS, cuDNN under `command_buffer_*`) carry
  neither and are counted as "unattributed"; `XLA_FLAGS=--xla_gpu_enable_command_buffer=`
  turns the graphs off for a profile that names them.

  A Pallas kernel is named by its `pallas_call` (`name=`; XLA adds `__1`, `__2` to a name
  it compiles more than once) and found by the op_names that end `<name>/pallas_call`.
  One name may serve both directions (the GCN's scores kernel computes `d a` too), and
  the trace does not say which call a kernel is: its time goes to all the parts its
  calls belong to, written together (`gcn / gcn (backward)`).
  """
  lookup = dict(op_names)
  lookup.update({k.replace(".", "_"): v for k, v in op_names.items()})
  pallas: dict[str, set] = collections.defaultdict(set)
  for op_name in op_names.values():
    if (m := _PALLAS_CALL.search(op_name)):
      pallas[m.group(1)].add(part_of(op_name))
  by_name, _, _ = _kernel_times(events)
  parts: dict[str, float] = collections.defaultdict(float)
  for name, (us, hlo_op) in by_name.items():
    op_name = lookup.get(name) or lookup.get(hlo_op or "")
    if op_name:
      parts[part_of(op_name)] += us
    elif (kernel_parts := pallas.get(_DEDUPLICATED.sub("", name))):
      parts[" / ".join(sorted(kernel_parts))] += us
    else:
      parts["unattributed"] += us
  total = sum(parts.values())
  return [dict(part=p, us=us, share=us / total if total else 0.0)
          for p, us in sorted(parts.items(), key=lambda kv: -kv[1])]


def format_summary(s: dict) -> str:
  lines = [f"lanes: {', '.join(s['lanes']) or '-'}; kernel time {s['total_us'] / 1e3:.2f} ms",
           "", f"{'kind':<10} {'ms':>10} {'share':>7}"]
  lines += [f"{k['kind']:<10} {k['us'] / 1e3:>10.3f} {100 * k['share']:>6.1f}%" for k in s["kinds"]]
  if s.get("parts"):
    lines += ["", f"{'model part':<28} {'ms':>10} {'share':>7}"]
    lines += [f"{p['part']:<28} {p['us'] / 1e3:>10.3f} {100 * p['share']:>6.1f}%"
              for p in s["parts"]]
  lines += ["", f"{'ms':>10} {'share':>7} {'calls':>6}  {'kind':<9} kernel"]
  lines += [f"{k['us'] / 1e3:>10.3f} {100 * k['share']:>6.1f}% {k['count']:>6}  {k['kind']:<9} "
            f"{k['name'][:90]}" for k in s["kernels"]]
  return "\n".join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("trace", help="a jax.profiler trace folder, or its *.json.gz")
  p.add_argument("--top", type=int, default=25)
  p.add_argument("--hlo", default=None,
                 help="the compiled module's text (`compiled.as_text()`), to sum kernel time "
                      "by model part (.gz: gzipped); default: a *.hlo.txt[.gz] in the trace "
                      "folder, if any")
  p.add_argument("--json", action="store_true")
  a = p.parse_args(argv)
  try:
    events = load_events(a.trace)
  except TraceError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  s = summarise(events, a.top)
  hlo = Path(a.hlo) if a.hlo else None
  if hlo is None and Path(a.trace).is_dir():
    hlo = min((f for f in Path(a.trace).iterdir() if f.name.endswith((".hlo.txt", ".hlo.txt.gz"))),
              default=None)
  if hlo is not None:
    if not hlo.is_file():
      print(f"error: {hlo}: no such HLO text file", file=sys.stderr)
      return 1
    s["parts"] = summarise_parts(events, hlo_op_names(read_hlo_text(hlo)))
  print(json.dumps(s) if a.json else format_summary(s))
  return 0


if __name__ == "__main__":
  sys.exit(main())
