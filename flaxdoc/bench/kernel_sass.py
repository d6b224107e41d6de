"""The fused Pallas kernels as a GPU would run them, compiled on this machine: registers,
spills and instructions per pair (ETC + Rich Attention) or per edge element (the GCN).

    python -m flaxdoc.bench.kernel_sass [--json] [--arch 90]
        [--kernels etc gcn gcn_saved gcn_dpre gcn_fused]
        [--etc_tiles 32,64,4,32,32,4] [--gcn_tiles 16,32,32,4[,2,8]]

Needs the `triton` package (`pip install triton`; no GPU, no CUDA install: its wheel
carries `ptxas` and `nvdisasm`). Each kernel is lowered by JAX for CUDA at FormNet-A2's
sizes, its Triton IR taken from Pallas' lowering, compiled by that Triton for the chosen
architecture (sm_90: H100, H200) and disassembled. The counts are static: for the ETC
kernels, the instructions of one pass of the key-tile loop divided by the pairs each
thread handles in it; for the GCN kernels (no loop but the target side's), the whole
program (up to its last `EXIT`) divided by its edge elements per thread. `MUFU` counts the
special-function unit's instructions (exp2, log2, reciprocal): 16 lanes an SM a clock on
sm_90 against 128 for FP32, an eighth of the rate, in a pipe of its own.

A proxy for time, not a timing: it cannot see stalls or memory traffic, occupancy only as
sm_90's rules allow it (`warps_per_sm`), and XLA compiles the same IR with the Triton it
bundles, whose passes may differ from the `triton` package's. It is what a machine without
a GPU can tell about a kernel change, and it told which half of the per-pair work was
libdevice's `log1p` / `exp` (`flaxdoc.nn.pallas_math`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import os
import re
import subprocess
import sys
import tempfile

from flaxdoc.bench import common

# --------------------------------------------------------------------------- SASS text


@dataclasses.dataclass(frozen=True)
class Listing:
  """An `nvdisasm` listing: `(address, opcode)` per instruction."""
  instructions: tuple[tuple[int, str], ...]

  def opcodes(self, start: int = 0, end: int | None = None) -> collections.Counter:
    """Opcodes in `[start, end]`; by default up to the last `EXIT` (what follows it is the
    compiler's padding: a branch to itself and `NOP`s, never run)."""
    if end is None:
      end = max((a for a, op in self.instructions if op == "EXIT"), default=1 << 62)
    return collections.Counter(op for addr, op in self.instructions if start <= addr <= end)


_LABEL = re.compile(r"^\s*(\.L[_\w]+):")
_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(.*?);")
_GUARD = re.compile(r"^@!?U?P[T0-9]+\s+")


def _opcode(text: str) -> str:
  """`@!P1 BRA \\`(.L_x_3)` -> `BRA`; `FFMA.FTZ R1, ...` -> `FFMA`."""
  return _GUARD.sub("", text).split()[0].split(".")[0]


def parse_sass(text: str) -> tuple[Listing, list[tuple[int, int]]]:
  """The listing and its loops: `(start, end)` address ranges closed by a branch back."""
  instructions, labels, pending, branches = [], {}, [], []
  for line in text.splitlines():
    m = _LABEL.match(line)
    if m:
      pending.append(m.group(1))
      continue
    m = _INSTRUCTION.match(line)
    if not m:
      continue
    addr, body = int(m.group(1), 16), m.group(2).strip()
    for label in pending:
      labels[label] = addr
    pending = []
    op = _opcode(body)
    instructions.append((addr, op))
    if op == "BRA":
      target = re.search(r"\((\.L[_\w]+)\)", body)
      if target:
        branches.append((addr, target.group(1)))
  loops = [(labels[t], addr) for addr, t in branches if t in labels and labels[t] < addr]
  return Listing(tuple(instructions)), loops


def hot_loop(listing: Listing, loops) -> tuple[int, int] | None:
  """The loop with the most instructions (the key-tile loop of an ETC kernel)."""
  if not loops:
    return None
  return max(loops, key=lambda r: sum(listing.opcodes(*r).values()))


def resources(text: str) -> dict:
  """`cuobjdump -res-usage` -> `{"registers", "stack", "local", "shared"}` (bytes but registers)."""
  found = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", text))
  return {"registers": int(found.get("REG", 0)), "stack": int(found.get("STACK", 0)),
          "local": int(found.get("LOCAL", 0)), "shared": int(found.get("SHARED", 0))}


FP32 = ("FFMA", "FADD", "FMUL", "FMNMX", "FSEL", "FSETP")
INTEGER = ("IADD3", "IMAD", "LOP3", "SHF", "ISETP", "LEA", "SEL", "PRMT", "IABS")


def warps_per_sm(registers: int, warps: int, shared_bytes: int = 0) -> int:
  """Resident warps an SM can hold of a kernel (sm_90: 64K registers allocated per warp in
  units of 256, 64 warps, 32 blocks, 228 KB of shared memory with 1 KB kept per block).
  Fewer warps hide less latency: the measured kernels issued at 37-64% of the peak rate."""
  per_warp = -(-registers * 32 // 256) * 256
  blocks = min(65536 // (per_warp * warps), 64 // warps, 32,
               (228 * 1024) // (shared_bytes + 1024))
  return blocks * warps


def summarize(name: str, sass: str, usage: dict, elements_per_thread: int,
              warps: int = 4) -> dict:
  """One row: resources, resident warps, and instructions per element of the hot loop (or
  the program)."""
  listing, loops = parse_sass(sass)
  loop = hot_loop(listing, loops)
  ops = listing.opcodes(*loop) if loop else listing.opcodes()
  total = sum(ops.values())
  per = 1.0 / elements_per_thread
  return {"kernel": name, "registers": usage["registers"],
          "spill_bytes": usage["local"] + usage["stack"],
          "warps_per_sm": warps_per_sm(usage["registers"], warps,
                                       usage["shared"] + usage.get("dynamic_shared", 0)),
          "static_instructions": len(listing.instructions),
          "counted": "loop" if loop else "program", "counted_instructions": total,
          "per_element": total * per, "mufu_per_element": ops["MUFU"] * per,
          "fp32_per_element": sum(ops[o] for o in FP32) * per,
          "int_per_element": sum(ops[o] for o in INTEGER) * per,
          "branches_per_element": ops["BRA"] * per,
          "mma": ops["HMMA"] + ops["HGMMA"]}


# --------------------------------------------------------------------------- compiling


@contextlib.contextmanager
def captured_triton_modules():
  """Records `(kernel name, Triton IR text)` of every Pallas kernel lowered for a GPU.

  Pallas keeps its Triton module as bytecode inside the custom call; the text is taken
  where it is built (`jax._src.pallas.triton.lowering`, a private module: if a JAX
  release moves it, this says so).
  """
  try:
    from jax._src.pallas.triton import lowering  # pylint: disable=import-outside-toplevel
    original = lowering.lower_jaxpr_to_triton_module
  except (ImportError, AttributeError) as e:
    raise RuntimeError("kernel_sass: this JAX has no jax._src.pallas.triton.lowering."
                       "lower_jaxpr_to_triton_module to take the Triton IR from") from e
  found = []

  def capture(jaxpr, *args, **kwargs):
    result = original(jaxpr, *args, **kwargs)
    found.append((jaxpr.debug_info.func_name,
                  result.module.operation.get_asm(enable_debug_info=False)))
    return result

  lowering.lower_jaxpr_to_triton_module = capture
  try:
    yield found
  finally:
    lowering.lower_jaxpr_to_triton_module = original


def lower_kernels(fn, args) -> list[dict]:
  """`[{name, ir, warps, stages}]` of the kernels `jax.jit(fn)(*args)` runs on a GPU.

  `fn` must not have been lowered before in this process: JAX reuses a cached lowering,
  which never reaches the capture (an error says so rather than returning nothing).
  """
  import jax  # pylint: disable=import-outside-toplevel
  with captured_triton_modules() as found:
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  params = {}
  for line in text.splitlines():
    if "xla.gpu.triton" not in line:
      continue
    name = re.search(r'name = \\?"(\w+)', line).group(1)
    warps, stages = (int(re.search(rf"{k} = (\d+)", line).group(1))
                     for k in ("num_warps", "num_stages"))
    if params.setdefault(name, (warps, stages)) != (warps, stages):
      raise RuntimeError(f"kernel_sass: kernel {name} lowered with two settings")
  if sorted({n for n, _ in found}) != sorted(params):
    raise RuntimeError(f"kernel_sass: the lowering has kernels {sorted(params)} but "
                       f"{sorted({n for n, _ in found})} were captured (a cached lowering? "
                       "pass a function not lowered before)")
  return [{"name": n, "ir": ir, "warps": params[n][0], "stages": params[n][1]}
          for n, ir in found]


def _triton():
  try:
    import triton  # pylint: disable=import-outside-toplevel
    from triton.backends.nvidia import compiler as nvidia  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise RuntimeError("kernel_sass needs the triton package: pip install triton "
                       "(no GPU needed)") from e
  return triton, os.path.join(os.path.dirname(nvidia.__file__), "bin")


def compile_to_sass(ir: str, warps: int, stages: int, arch: int = 90) -> tuple[str, dict]:
  """`(nvdisasm listing, resources)` of one kernel's Triton IR, as Triton builds it."""
  triton, tools = _triton()
  from triton._C.libtriton import ir as tir  # pylint: disable=import-outside-toplevel
  from triton.backends.compiler import GPUTarget  # pylint: disable=import-outside-toplevel
  target = GPUTarget("cuda", arch, 32)
  backend = triton.compiler.make_backend(target)
  options = backend.parse_options({"num_warps": warps, "num_stages": stages})
  with tempfile.TemporaryDirectory() as tmp:
    raw = os.path.join(tmp, "raw.ttir")
    with open(raw, "w", encoding="utf-8") as f:
      f.write(ir)
    # triton.compile skips the IR's own stage for IR files: run the TTIR passes (inlining,
    # canonicalisation, CSE) that a kernel written in Triton gets, then compile from there.
    context = tir.context()
    tir.load_dialects(context)
    backend.load_dialects(context)
    module = tir.parse_mlir_module(raw, context)
    module.context = context
    module = backend.make_ttir(module, {}, options, arch)
    path = os.path.join(tmp, "kernel.ttir")
    with open(path, "w", encoding="utf-8") as f:
      f.write(str(module))
    kernel = triton.compile(path, target=target,
                            options={"num_warps": warps, "num_stages": stages})
    cubin = os.path.join(tmp, "kernel.cubin")
    with open(cubin, "wb") as f:
      f.write(kernel.asm["cubin"])
    sass = subprocess.run([os.path.join(tools, "nvdisasm"), cubin], check=True,
                          capture_output=True, text=True).stdout
    usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", cubin], check=True,
                           capture_output=True, text=True).stdout
  return sass, dict(resources(usage), dynamic_shared=int(kernel.metadata.shared))


# --------------------------------------------------------------------------- FormNet-A2's kernels
LAYER_BATCH = 16  # rows of the pre-training step the per-layer counts are for (1,024 tokens each)



def etc_problem(tiles, length: int = 1024, heads: int = 12):
  """`(gradient function, its inputs, pairs a thread handles per pass of each kernel's
  key-tile loop, "pair", passes a layer makes (`etc_passes`))`: the ETC + Rich layer's
  three kernels (forward, `dq`, `dk dv`) at FormNet-A2's sizes (radius 84, 12 heads x 64,
  2 Rich axes, dropout, bfloat16)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from flaxdoc.nn import etc_pallas as ep  # pylint: disable=import-outside-toplevel
  b, n, h, d, a = 1, length, heads, 64, 2
  x = jnp.zeros((b, n, h, d), jnp.bfloat16)
  g = jnp.zeros((b, 1, h, d), jnp.bfloat16)
  scalars = jnp.zeros((b, h, n, a))

  def loss(q, k, v, oq):
    out = ep.long_query_attention(
        q, k, v, g, g, jnp.ones((b, n), bool), jnp.ones((b, 1), bool), local_radius=84,
        rich=(oq, scalars, scalars, scalars, jnp.ones((h, a)), jnp.zeros((b, n, a))),
        dropout_rate=0.1, dropout_seed=jnp.zeros((1,), jnp.int32), interpret=False,
        tiles=tiles)
    return out.astype(jnp.float32).sum()

  t = tiles or ep.DEFAULT_TILES
  forward = t.block_q * t.block_k // (32 * t.warps)
  backward = t.backward_block_q * t.backward_block_k // (32 * t.backward_warps)
  per_thread = {"etc_rich_forward": forward, "etc_rich_backward_dq": backward,
                "etc_rich_backward_dkv": backward}
  return (jax.grad(loss, argnums=(0, 1, 2, 3)), (x, x, x, scalars), per_thread, "pair",
          etc_passes(t, length, heads))


def etc_passes(tiles, length: int = 1024, heads: int = 12, radius: int = 84,
               batch: int = LAYER_BATCH) -> dict:
  """Passes of each ETC kernel's key-tile loop over one layer of `batch` rows: the query
  tiles times the key tiles of their windows (forward, `dq`), and for `dk, dv` the
  query tiles that see each key tile. Taller tiles cover more keys outside the band."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from flaxdoc.nn import etc_pallas_kernels as ek  # pylint: disable=import-outside-toplevel
  cfg = ek.Config(radius=radius, length=length, num_globals=1, num_axes=2, dropout_rate=0.1,
                  block_q=tiles.block_q, block_k=tiles.block_k, warps=tiles.warps,
                  interpret=False, backward_tiles=(tiles.backward_block_q,
                                                   tiles.backward_block_k, tiles.backward_warps))
  bwd = cfg.backward()

  def key_passes(c):  # as forward_kernel's and dq_kernel's key loops
    return sum(int(c.key_window(i0, np)[1]) for i0 in range(0, c.padded_q, c.block_q))

  dkv = sum(int(bwd.query_window(j0, np)[1])  # as dkv_kernel's query loop
            for j0 in range(0, bwd.padded_k, bwd.block_k))
  rows = batch * heads
  return {"etc_rich_forward": rows * key_passes(cfg),
          "etc_rich_backward_dq": rows * key_passes(bwd),
          "etc_rich_backward_dkv": rows * dkv}


def gcn_problem(tiles, save: bool, nodes: int = 1024, hidden: int = 1548,
                write_d_pre: bool = False, fused_forward: bool = False,
                fused_backward: bool = False):
  """As `etc_problem`, "edge element": one GCN layer's kernels at FormNet-A2's sizes (768
  wide, hidden 2E + F = 1,548, 8 slots, 12 edge features, bfloat16), and the edge
  elements (edge x hidden unit) a thread handles per program, or per pass of the target
  side's loop."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from flaxdoc.nn import gcn_pallas as gp  # pylint: disable=import-outside-toplevel
  b, k, f = 1, 8, 12
  s = jnp.zeros((b, nodes, hidden), jnp.bfloat16)
  ids, mask = jnp.zeros((b, nodes, k), jnp.int32), jnp.ones((b, nodes, k), bool)
  e = jnp.zeros((b, nodes, k, f))

  def loss(s, n, we, b1, v):
    pooled, weights = gp.attention_pool(s, n, e, ids, mask, we, b1, v, interpret=False,
                                        save_activations=save, write_d_pre=write_d_pre,
                                        fused_forward=fused_forward,
                                        fused_backward=fused_backward, tiles=tiles)
    return pooled.astype(jnp.float32).sum() + weights.sum()

  from flaxdoc.nn import gcn_pallas_kernels as gk  # pylint: disable=import-outside-toplevel
  t = tiles or gp.default_tiles(save, write_d_pre)
  cfg = gk.Config(nodes=nodes, slots=k, features=f, hidden=hidden, block_nodes=t.block_nodes,
                  block_hidden=t.block_hidden, block_edges=t.block_edges, warps=t.warps,
                  interpret=False, bf16=True, save_activations=save)
  threads = 32 * t.warps
  per_thread = collections.defaultdict(lambda: cfg.block_rows * t.block_hidden // threads)
  targets = ("gcn_backward_target", "gcn_saved_backward_target", "gcn_fused_backward_target")
  for name in targets:
    per_thread[name] = t.block_edges * t.block_hidden // threads
  # The fused kernels: BLf nodes' edge rows x all of Hp a program, on their own warps.
  for name in ("gcn_fused_forward", "gcn_fused_backward"):
    per_thread[name] = t.fused_nodes * cfg.padded_slots * cfg.padded_hidden // (
        32 * t.fused_warps)
  args = (s, s, jnp.zeros((f, hidden)), jnp.zeros(hidden), jnp.zeros(hidden))
  # Programs of one layer of LAYER_BATCH rows; the target side's loop runs about K * BL / BE
  # passes a program (each node with K in-edges, as in a local graph).
  programs = LAYER_BATCH * cfg.node_tiles * cfg.hidden_chunks
  passes = collections.defaultdict(lambda: programs)
  for name in targets:
    passes[name] = programs * (-(-k * t.block_nodes // t.block_edges))
  for name in ("gcn_fused_forward", "gcn_fused_backward"):
    passes[name] = LAYER_BATCH * (cfg.padded_nodes // t.fused_nodes)
  return jax.grad(loss, argnums=(0, 1, 2, 3, 4)), args, per_thread, "edge element", passes


def run(kernels=("etc", "gcn_saved"), etc_tiles=None, gcn_tiles=None, arch: int = 90):
  """One row per distinct kernel of the chosen problems."""
  rows = []
  for which in kernels:
    if which == "etc":
      fn, args, per_thread, unit, passes = etc_problem(etc_tiles)
    elif which in ("gcn", "gcn_saved", "gcn_dpre", "gcn_fused"):
      fn, args, per_thread, unit, passes = gcn_problem(
          gcn_tiles, save=which == "gcn_saved", write_d_pre=which in ("gcn_dpre", "gcn_fused"),
          fused_forward=which == "gcn_fused", fused_backward=which == "gcn_fused")
    else:
      raise ValueError(f"kernel_sass: unknown kernels {which!r}: etc, gcn, gcn_saved, "
                       "gcn_dpre or gcn_fused")
    seen = {}
    for k in lower_kernels(fn, args):
      # A kernel the step calls twice with the same code is one row; the GCN's scores
      # kernel is traced twice with different code (the score vector forward, each node's
      # pooled gradient for `d a` backward): the second gets its own row, "name#2".
      versions = seen.setdefault(k["name"], [])
      if k["ir"] in versions:
        continue
      versions.append(k["ir"])
      label = k["name"] + (f"#{len(versions)}" if len(versions) > 1 else "")
      sass, usage = compile_to_sass(k["ir"], k["warps"], k["stages"], arch)
      row = summarize(label, sass, usage, per_thread[k["name"]], k["warps"])
      # Static instructions x passes: what one layer issues if every pass runs the whole
      # counted code (warp instructions; the fairer figure across tilings).
      layer = row["counted_instructions"] * k["warps"] * passes[k["name"]] / 1e9
      rows.append({"problem": which, **row, "layer_warp_ginstr": layer, "element": unit,
                   "warps": k["warps"], "arch": f"sm_{arch}"})
  return rows


COLUMNS = ("kernel", "registers", "spill_bytes", "warps_per_sm", "counted",
           "counted_instructions", "layer_warp_ginstr", "per_element", "mufu_per_element",
           "fp32_per_element", "int_per_element", "branches_per_element", "element")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--json", action="store_true")
  ap.add_argument("--arch", type=int, default=90, help="compute capability, 90 = H100/H200")
  ap.add_argument("--kernels", nargs="+", default=["etc", "gcn_saved"],
                  choices=["etc", "gcn", "gcn_saved", "gcn_dpre", "gcn_fused"])
  ap.add_argument("--etc_tiles", default=None, help="six ints, as bench.etc_kernel --tiles")
  ap.add_argument("--gcn_tiles", default=None, help="four or six ints, as bench.gcn_kernel --tiles")
  a = ap.parse_args(argv)
  from flaxdoc.bench import etc_kernel, gcn_kernel  # pylint: disable=import-outside-toplevel
  etc_tiles = etc_kernel.parse_tiles(a.etc_tiles) if a.etc_tiles else None
  gcn_tiles = gcn_kernel.parse_tiles(a.gcn_tiles) if a.gcn_tiles else None
  common.emit(run(a.kernels, etc_tiles, gcn_tiles, a.arch), as_json=a.json, columns=COLUMNS,
              title=f"fused kernels compiled for sm_{a.arch} (static counts, no GPU)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
