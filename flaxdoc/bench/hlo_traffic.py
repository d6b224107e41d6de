r"""Bytes each op of a compiled step reads and writes: where memory-bound time goes, with no GPU.

    python -m flaxdoc.bench.hlo_traffic [--hlo FILE] [--length 1024] [--batch 16]
        [--etc_kernel pallas] [--gcn_kernel pallas_dpre] [--save FILE] [--top 25]
        [--bandwidth 3.35e12] [--pad_to_multiple_of 8] [--json]

Without `--hlo`, compiles the FormNet-A2 pre-training step that `bench.accelerator`
times for an H100 on this machine, with no GPU: XLA's CUDA compiler runs *deviceless*
from a description of the chip (`H100_TARGET`), which needs the CUDA plugin of the
installed JAX (`pip install jax-cuda13-plugin==<jax version>`, about 400 MB; the
environment variables it needs are set here). The fused Pallas kernels are compiled
for the GPU, not the interpreter. `--save` keeps the optimised module's text;
`--hlo` reads one (from here, or the `step.hlo.txt.gz` that `bench.accelerator
--profile` writes on a GPU: the module the card ran; `.gz` names are gzipped).

For every op of the module's entry computation (XLA's fusions, copies, library and
Triton calls) it counts the bytes of its outputs and of its operands, an operand that
the fusion only slices counted as the slices it takes, and attributes the op to a
model part by its `op_name` (`bench.profile_summary.part_of`). Ops are classed as
`gemm` (cuBLAS calls and XLA's GEMM fusions), `pallas` (the fused Pallas kernels) and
`xla` (everything else: XLA's elementwise, reduction, copy and layout fusions, the
"glue"). For the `xla` class bytes are time: those ops are memory-bound, so bytes /
bandwidth is what they take at best (the H100's 3.35 TB/s by default). For the other
two classes the bytes are only their traffic; their time is arithmetic
(`bench.gemm_floor`, `bench.kernel_sass`).

Why: sessions without a GPU could count the fused kernels' instructions but not see
XLA's fusion decisions, and the H100 profile put a third of the FormNet-A2 step in
XLA's glue. This showed, on the CPU, an MLM loss whose backward wrote float32 arrays of
the logits' size through a scatter, a GELU that kept three arrays for its backward
where one suffices, and Rich Attention's projections making four float32 gradients a
layer (docs/accelerators.md, session 11). A model, not a measurement: caches, partial
reads inside fusions and the kernels' overlap are not in it. Ops inside loops or
branches are counted once (the FormNet step has none; a module with `while` is noted).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys

from flaxdoc.bench import common
from flaxdoc.bench import profile_summary
from flaxdoc.bench.pretrain_step import Sizes, StepOptions, pretrain_step

H100_BANDWIDTH = 3.35e12  # bytes/s, H100 SXM5 HBM3 (NVIDIA datasheet)
# The chip as XLA's GPU compiler needs it for a deviceless compile (the values XLA reads
# off an H100 SXM5 80GB; cuDNN and CUDA versions as the JAX 0.10 plugin expects).
H100_TARGET = """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: 3352320000000 l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: 84929347584 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 } registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 7 }
runtime_version { major: 13 minor: 0 patch: 0 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""
_BYTES = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2,
          "s16": 2, "u16": 2, "s8": 1, "u8": 1, "pred": 1, "f8e4m3fn": 1, "f8e5m2": 1}
_ARRAY = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([0-9,]*)\]")
_LINE = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\(.*?\)|\S+) ([a-z][a-z0-9\-]*)\((.*)$")
_COMPUTATION = re.compile(r"^%([\w.\-]+) \(.*\) -> .*\{$")
_FREE = ("parameter", "get-tuple-element", "tuple", "constant", "bitcast", "after-all",
         "partition-id", "replica-id", "opt-barrier")
_GEMM = ("gemm", "cublas", "matmul", "conv")


def shape_bytes(shape: str) -> int:
  """Bytes of an HLO shape (`bf16[16,1024]{1,0}` or a tuple of them)."""
  total = 0
  for dtype, dims in _ARRAY.findall(shape):
    n = 1
    for d in dims.split(","):
      if d:
        n *= int(d)
    total += n * _BYTES[dtype]
  return total


def computations(hlo_text: str) -> tuple[dict[str, list[str]], list[str]]:
  """`({name: its instruction lines}, the entry computation's lines)`."""
  bodies: dict[str, list[str]] = {}
  entry, current, name = [], None, None
  for line in hlo_text.splitlines():
    if line.startswith("ENTRY "):
      current, name = entry, None
      continue
    m = _COMPUTATION.match(line)
    if m:
      current, name = [], m.group(1)
      continue
    if line.startswith("}"):
      if name is not None and current is not None:
        bodies[name] = current
      current, name = None, None
      continue
    if current is not None:
      current.append(line)
  return bodies, entry


def sliced_reads(body: list[str]) -> dict[int, int]:
  """`{parameter index: bytes}` for a fused computation's parameters that are only
  sliced: the fusion reads the slices, not the whole operand."""
  params, defined = {}, []
  for line in body:
    m = _LINE.match(line)
    if not m:
      continue
    defined.append(m)
    if m.group(3) == "parameter":
      params[m.group(1)] = int(re.match(r"(\d+)", m.group(4)).group(1))
  reads = {}
  for pname, index in params.items():
    pattern = re.compile(r"%" + re.escape(pname) + r"(?![\w.\-])")
    users = [m for m in defined if m.group(1) != pname and pattern.search(m.group(4))]
    if users and all(m.group(3) in ("slice", "dynamic-slice") for m in users):
      reads[index] = sum(shape_bytes(m.group(2)) for m in users)
  return reads


def op_class(op: str, rest: str, name: str) -> str:
  """`pallas` (a Triton custom call: the fused kernels), `gemm` (a cuBLAS call or one of
  XLA's GEMM fusions) or `xla` (the rest), from the op itself, not its operands."""
  target = re.search(r'custom_call_target="([^"]*)"', rest)
  calls = re.search(r"calls=%([\w.\-]+)", rest)
  if op == "custom-call" and target:
    t = target.group(1).lower()
    if "triton" in t:
      return "pallas"
    return "gemm" if any(g in t for g in _GEMM) else "xla"
  if op == "fusion" and (name.startswith("gemm_fusion") or
                         (calls and calls.group(1).startswith("gemm_fusion"))):
    return "gemm"
  return "xla"


_ALIASED = re.compile(r"\{[\d,\s]*\}:\s*\((\d+),")  # output_to_operand_aliasing={{}: (4, {})}


def op_traffic(hlo_text: str) -> list[dict]:
  """One row per op of the entry computation: bytes read and written, class, part."""
  bodies, entry = computations(hlo_text)
  op_names = profile_summary.hlo_op_names(hlo_text)
  sizes: dict[str, int] = {}
  rows = []
  for line in entry:
    m = _LINE.match(line)
    if not m:
      continue
    name, shape, op, rest = m.groups()
    written = shape_bytes(shape)
    sizes[name] = written
    if op in _FREE:
      continue
    operands = re.findall(r"%([\w.\-]+)", rest.split("), ", 1)[0])
    calls = re.search(r"calls=%([\w.\-]+)", rest)
    reads = sliced_reads(bodies.get(calls.group(1), [])) if op == "fusion" and calls else {}
    # A buffer passed twice is read once at most (the GCN kernels take `[S | N]` as both
    # their `S` and their `N` operand, each reading its half); an operand aliased to an
    # output is the buffer the op writes into, not read (the GCN's target-side backward
    # writes `d N` into the array the source side wrote `d S` into). Both still count the
    # whole array, not the part a kernel touches, and an output written in part (each GCN
    # backward kernel writes half of `d [S | N]`) counts whole: the `pallas` class is an
    # upper bound.
    aliased = {int(i) for i in _ALIASED.findall(rest)}
    read = sum(reads.get(i, sizes.get(o, 0)) for i, o in enumerate(operands)
               if i not in aliased and o not in operands[:i])
    op_name = op_names.get(name, "")
    rows.append(dict(name=name, op=op, cls=op_class(op, rest, name), read=read,
                     written=written, op_name=op_name, part=profile_summary.part_of(op_name)
                     if op_name else "unattributed"))
  return rows


def summarise(rows: list[dict], bandwidth: float = H100_BANDWIDTH, top: int = 25,
              note: str = "") -> dict:
  """Totals by class and part, and the `xla` ops that move most, grouped by what made them."""
  def entry(key, total, count):
    return dict(key, gb=total / 1e9, ms_at_bandwidth=1e3 * total / bandwidth, ops=count)

  by_class = collections.defaultdict(lambda: [0, 0])  # [bytes, ops]
  by_part = collections.defaultdict(lambda: [0, 0])
  groups = collections.defaultdict(lambda: [0, 0, ""])
  for r in rows:
    moved = r["read"] + r["written"]
    for acc in (by_class[r["cls"]], by_part[(r["cls"], r["part"])]):
      acc[0] += moved
      acc[1] += 1
    if r["cls"] == "xla":
      kind = re.sub(r"[._]?\d+$", "", r["name"])
      where = r["op_name"].split("/")[-1]
      g = groups[(kind, r["part"], where)]
      g[0] += moved
      g[1] += 1
      g[2] = r["op_name"]
  return dict(
      note=note,
      totals={cls: entry({"class": cls}, *v) for cls, v in by_class.items()},
      parts=[entry({"class": c, "part": p}, v[0], v[1])
             for (c, p), v in sorted(by_part.items(), key=lambda kv: -kv[1][0])],
      top_xla=[entry({"fusion": k[0], "part": k[1], "op": k[2], "op_name": v[2][-100:]},
                     v[0], v[1])
               for k, v in sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]])


# --------------------------------------------------------------------------- compiling
def cuda_plugin_available() -> bool:
  import importlib.util  # pylint: disable=import-outside-toplevel
  return any(importlib.util.find_spec(f"jax_plugins.xla_cuda{v}") is not None
             for v in (13, 12)) if importlib.util.find_spec("jax_plugins") else False


def compile_step_text(length: int, batch: int,
                      opts: StepOptions = StepOptions(etc_kernel="pallas",
                                                      gcn_kernel="pallas_dpre")) -> str:
  """The FormNet-A2 pre-training step (`bench.pretrain_step`, bfloat16, built as `opts`
  says; by default with the recommended GPU kernels) compiled for an H100 on this
  machine: the optimised module's text."""
  # Before JAX starts: no local GPU is looked for, and the plugin's check for cuDNN
  # and CUDA libraries, which a deviceless compile does not use, is skipped.
  os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
  import jax  # pylint: disable=import-outside-toplevel
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=import-outside-toplevel
  from flaxdoc.nn import pallas_backend  # pylint: disable=import-outside-toplevel
  # The kernels pick the interpreter when the default backend is not a GPU (here it is
  # the CPU); the compile is for a GPU, so they are lowered for Triton.
  with pallas_backend.lowering_for_gpu():
    try:
      topology = topologies.get_topology_desc(platform="cuda", target_config=H100_TARGET,
                                              topology="1x1x1")
    except NotImplementedError as e:  # JAX started its backends before the plugin could
      raise RuntimeError(
          "no CUDA backend to compile for: JAX's backends were started before the CUDA "
          "plugin could register (CUDA_VISIBLE_DEVICES=-1 and "
          "JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 must be set before JAX's first use; this sets "
          "them only where they are unset); run `python -m flaxdoc.bench.hlo_traffic` in a "
          "process of its own") from e
    mesh = topologies.make_mesh(topology, (1,), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    step, state, *_ = pretrain_step(length, batch, "bfloat16", "float32", Sizes(), False, opts)
    spec = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated)  # noqa: E731
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
    lowered = jax.jit(step, donate_argnums=(0, 1)).trace(*jax.tree.map(spec, state),
                                                           key).lower()
    return lowered.compile().as_text()


def format_summary(s: dict) -> str:
  lines = [f"{'class':<7} {'GB':>8} {'ms at bandwidth':>16} {'ops':>6}"]
  lines += [f"{t['class']:<7} {t['gb']:>8.2f} {t['ms_at_bandwidth']:>16.2f} {t['ops']:>6}"
            for t in sorted(s["totals"].values(), key=lambda t: -t["gb"])]
  lines += ["", common.format_table(s["parts"], ["class", "part", "gb", "ms_at_bandwidth",
                                                 "ops"]),
            "", "XLA ops that move the most (grouped by fusion kind, part and op):",
            common.format_table(s["top_xla"], ["gb", "ms_at_bandwidth", "ops", "fusion",
                                               "part", "op_name"])]
  if s["note"]:
    lines += ["", s["note"]]
  return "\n".join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--hlo", default=None,
                 help="read this optimised module text instead (.gz: gzipped)")
  p.add_argument("--length", type=int, default=1024)
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--etc_kernel", default="pallas", choices=("xla", "pallas"))
  p.add_argument("--gcn_kernel", default="pallas_dpre",
                 choices=common.GCN_KERNELS)
  p.add_argument("--save", default=None,
                 help="write the compiled module's text here (.gz: gzipped)")
  p.add_argument("--bandwidth", type=float, default=H100_BANDWIDTH, help="bytes/s")
  p.add_argument("--top", type=int, default=25)
  p.add_argument("--pad_to_multiple_of", type=int, default=1, metavar="N",
                 help="the encoder's rows padded to a multiple of N (1: off), as "
                      "bench.accelerator --pad_to_multiple_of")
  p.add_argument("--json", action="store_true")
  a = p.parse_args(argv)
  if a.hlo:
    text = profile_summary.read_hlo_text(a.hlo)
  else:
    if not cuda_plugin_available():
      p.error("compiling for an H100 here needs JAX's CUDA plugin (no GPU needed): pip "
              "install jax-cuda13-plugin==<your jax version>; or pass --hlo FILE")
    text = compile_step_text(a.length, a.batch, StepOptions(
        etc_kernel=a.etc_kernel, gcn_kernel=a.gcn_kernel,
        pad_to_multiple_of=a.pad_to_multiple_of))
    if a.save:
      profile_summary.write_hlo_text(a.save, text)
  note = ("the module has while loops: their bodies are counted once" if
          re.search(r" while\(", text) else "")
  summary = summarise(op_traffic(text), a.bandwidth, a.top, note)
  if a.json:
    import json  # pylint: disable=import-outside-toplevel
    print(json.dumps(summary))
  else:
    print(format_summary(summary))
  return 0


if __name__ == "__main__":
  sys.exit(main())
