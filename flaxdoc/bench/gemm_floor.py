r"""The matrix-multiply floor of the FormNet-A2 pre-training step: each of its products alone.

    python -m flaxdoc.bench.gemm_floor [--json] [--length 1024] [--batch 16]
        [--etc_kernel xla|pallas] [--gcn_kernel xla|pallas] [--dtype bfloat16]
        [--iters 20] [--top 20] [--step_ms MS] [--local] [--pad_to_multiple_of 8]

What MFU can the step reach on this chip at all? This lowers the step that
`flaxdoc.bench.accelerator` times (forward, backward, AdamW), reads every
`dot_general` of its StableHLO, each counted as often as it runs (a private
function's products once per call site; a product inside a loop or branch, whose
count the text does not give, is an error), and times each distinct product *alone*
(`jax.lax.dot_general` with the same shapes, dtypes, dimension numbers and precision,
`jax.jit`). A call runs up to 16 copies, each on operands of its own, and returns
every output, so XLA can neither merge nor drop them, and the host's dispatch (tens
of microseconds, longer than a small product) is spread over the copies. Earlier
forms got this wrong: one dispatch per product charged the dispatch to every small
product, and copies of the same operands were merged into one product by XLA.

Their sum is the step's matrix-multiply time at the rates XLA and the chip give those
shapes; AdamW, timed alone on the step's parameters (donated, as in the step), is
the one large memory-bound part no step skips (its traffic floor: 7 float32 reads
and writes per parameter, 6.2 GB for FormNet-A2, 1.9 ms at an H100's 3.35 TB/s).
A step where every other kernel took no time would still take their sum, so

    bound MFU = model FLOPs / (GEMM floor + AdamW) / peak

bounds what this model reaches with these products (work inside fused Pallas
kernels, such as ETC's scores, counts as free, which makes the bound optimistic).
Printed: the products that take longest, then the summary; `--step_ms` adds a
measured step and its ratio to the floor. `--pad_to_multiple_of N` lowers the step with
the encoder's rows padded to a multiple of N (`EncoderSpec.pad_to_multiple_of`), so its
products are the padded shapes (the model FLOPs stay those of the real rows).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import math
import re
import sys

from flaxdoc.bench import common
from flaxdoc.bench.pretrain_step import (LOCAL, Sizes, StepOptions, mfu, pretrain_step,
                                         train_step_tflop)

_NAME = r'@("[^"]*"|[\w.$-]+)'  # a symbol, bare or quoted (jit of a lambda: @"<lambda>")
_FUNC = re.compile(r"\s*func\.func (?:public |private )?" + _NAME + r"\(")
_CALL = re.compile(r"\bcall " + _NAME)
_DIMS = re.compile(r"(?:batching_dims = \[([\d, ]*)\] x \[([\d, ]*)\], )?"
                   r"contracting_dims = \[([\d, ]*)\] x \[([\d, ]*)\]")
_TENSOR = re.compile(r"tensor<([^>]*)>")
_PRECISION = re.compile(r"precision = \[(\w+), (\w+)\]")
# A quoted symbol name (kept) or a string literal (blanked): a Pallas kernel's custom call
# carries its Triton module and launch parameters in strings, braces and all.
_STRING = re.compile(r'@?"(?:[^"\\]|\\.)*"')


def _blank_strings(line: str) -> str:
  return _STRING.sub(lambda m: m[0] if m[0].startswith("@") else '""', line)
SUMMARY_COLUMNS = ("what", "length", "batch", "dtype", "device", "etc_kernel", "gcn_kernel",
                   "pad_to_multiple_of", "dots", "distinct", "dot_tflop", "model_tflop",
                   "gemm_ms", "gemm_tflops", "adamw_ms", "floor_ms",
                   "bound_mfu", "step_ms", "step_over_floor")
DOT_COLUMNS = ("lhs", "rhs", "out", "count", "gflop", "ms_each", "ms_total", "tflops", "share")


@dataclasses.dataclass(frozen=True)
class Dot:
  """One `dot_general`'s operand types and dimension numbers."""
  lhs: tuple[int, ...]
  rhs: tuple[int, ...]
  out: tuple[int, ...]
  lhs_dtype: str
  rhs_dtype: str
  out_dtype: str
  lhs_batch: tuple[int, ...]
  rhs_batch: tuple[int, ...]
  lhs_contract: tuple[int, ...]
  rhs_contract: tuple[int, ...]
  precision: tuple[str, ...] = ()  # e.g. ("HIGHEST", "HIGHEST"); () is DEFAULT

  @property
  def flop(self) -> float:
    """2 per multiply-add: 2 x output elements x contracted size."""
    return 2.0 * math.prod(self.out) * math.prod(self.lhs[i] for i in self.lhs_contract)


def _ints(text: str | None) -> tuple[int, ...]:
  return tuple(int(v) for v in (text or "").split(",") if v.strip())


# StableHLO element types -> NumPy names.
_DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "f64": "float64",
           "i8": "int8", "i32": "int32", "i64": "int64"}


def _tensor(text: str) -> tuple[tuple[int, ...], str]:
  *dims, dtype = text.split("x")
  if any(not d.isdigit() for d in dims):
    raise ValueError(f"gemm_floor: tensor<{text}> has a dimension that is not a number")
  if dtype not in _DTYPES:
    raise ValueError(f"gemm_floor: element type {dtype!r} of tensor<{text}> not handled")
  return tuple(int(d) for d in dims), _DTYPES[dtype]


def parse_dot(line: str) -> Dot:
  """A `stablehlo.dot_general` line of `jax.jit(f).lower(...).as_text()`."""
  dims = _DIMS.search(line)
  types = _TENSOR.findall(line.rsplit(" : ", 1)[-1])
  if dims is None or len(types) != 3:
    raise ValueError(f"gemm_floor: cannot read the dot_general {line.strip()[:200]!r}")
  (lhs, lt), (rhs, rt), (out, ot) = (_tensor(t) for t in types)
  precision = _PRECISION.search(line)
  return Dot(lhs, rhs, out, lt, rt, ot, _ints(dims.group(1)), _ints(dims.group(2)),
             _ints(dims.group(3)), _ints(dims.group(4)),
             precision.groups() if precision and set(precision.groups()) != {"DEFAULT"} else ())


def count_dots(module_text: str) -> collections.Counter:
  """`Counter[Dot]`: every `dot_general` of a lowered module, times the calls that run it.

  Functions are entered from `main`; a private function's products count once per
  call site of each caller, recursively (the call graph of a lowered module is acyclic).
  A product inside a region (a `while` body, a `case` branch: how often it runs is not
  in the text), or a call from one to a function that has products, is an error
  rather than a wrong count.
  """
  funcs: dict[str, dict] = {}
  current, depth = None, 0
  for line in module_text.splitlines():
    code = _blank_strings(line)  # braces and words inside strings are not structure
    m = _FUNC.match(code)
    if m:
      current = funcs.setdefault(m.group(1), {"dots": [], "calls": collections.Counter(),
                                              "in_region": []})
      depth = code.count("{") - code.count("}")
      continue
    if current is None:
      continue
    nested = depth > 1  # the function body is depth 1; a region's body is deeper
    for callee in _CALL.findall(code):
      current["calls"][callee] += 1
      if nested:
        current["in_region"].append(("call", callee, line))
    if "stablehlo.dot_general" in code:
      current["dots"].append(parse_dot(line))
      if nested:
        current["in_region"].append(("dot", None, line))
    depth += code.count("{") - code.count("}")
    if depth <= 0:
      current = None
  if "main" not in funcs:
    raise ValueError("gemm_floor: the module has no @main function")

  @functools.lru_cache(maxsize=None)
  def has_dots(name: str) -> bool:
    f = funcs.get(name)
    return bool(f and (f["dots"] or any(has_dots(c) for c in f["calls"])))

  counts: collections.Counter = collections.Counter()

  def visit(name: str, times: int) -> None:
    for kind, callee, line in funcs[name]["in_region"]:
      if kind == "dot" or has_dots(callee):
        raise ValueError(f"gemm_floor: @{name} has a product inside a loop or branch, whose "
                         f"count the module text does not give: {line.strip()[:160]!r}")
    for dot in funcs[name]["dots"]:
      counts[dot] += times
    for callee, n in funcs[name]["calls"].items():
      if callee in funcs:
        visit(callee, times * n)

  visit("main", 1)
  return counts


def chained_products(dot: Dot, chain: int = 16):
  """`(f, args)`: `f(*args)` computes `dot` on `n <= chain` pairs of distinct operands.

  Distinct operands and every output returned: XLA can neither merge the copies into
  one product nor drop any as unused. `n` keeps operands and outputs within 2 GiB.
  """
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  k1, k2 = jax.random.split(jax.random.key(0))
  a = jax.random.normal(k1, dot.lhs, jnp.float32)
  b = jax.random.normal(k2, dot.rhs, jnp.float32)
  dims = ((dot.lhs_contract, dot.rhs_contract), (dot.lhs_batch, dot.rhs_batch))
  precision = tuple(jax.lax.Precision[p] for p in dot.precision) or None
  each = sum(math.prod(shape) * jnp.dtype(dtype).itemsize
             for shape, dtype in ((dot.out, dot.out_dtype), (dot.lhs, dot.lhs_dtype),
                                  (dot.rhs, dot.rhs_dtype)))
  n = max(1, min(chain, int(2 ** 31 // max(each, 1))))
  # Both operands distinct per copy: XLA's GPU compiler merges products that share one
  # (its dot-merger pass), which would time one large product instead of n small ones.
  lhs = [(a + i).astype(dot.lhs_dtype) for i in range(n)]
  rhs = [(b - i).astype(dot.rhs_dtype) for i in range(n)]

  def f(xs, ys):
    return [jax.lax.dot_general(x, y, dims, precision=precision,
                                preferred_element_type=dot.out_dtype) for x, y in zip(xs, ys)]

  return f, (lhs, rhs)


def time_dot(dot: Dot, iters: int, chain: int = 16) -> float:
  """Device seconds of this product alone: `chained_products` per call, so the host's
  dispatch (tens of microseconds, longer than a small product) is spread over the
  copies instead of charged to each."""
  import jax  # pylint: disable=import-outside-toplevel
  f, args = chained_products(dot, chain)
  f = jax.jit(f)
  shape = f(*args)[0].shape
  if shape != dot.out:
    raise ValueError(f"gemm_floor: {dot} gives shape {shape}")
  return common.time_back_to_back(lambda: f(*args), warmup=2, iters=iters) / len(args[0])


def time_adamw(tx, params, opt_state, iters: int) -> float:
  """Seconds per AdamW update of these parameters alone, updated in place (donated) as
  the step does, from a separate gradient tree (7 arrays of traffic per parameter, as
  in the step); `params` and `opt_state` are consumed."""
  import jax  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel

  grads = jax.tree.map(lambda x: x * 0.5, params)

  def update(p, o, g):
    u, o = tx.update(g, o, p)
    return optax.apply_updates(p, u), o

  update = jax.jit(update, donate_argnums=(0, 1))
  state = [params, opt_state]

  def call():
    state[:] = update(*state, grads)
    return state[0]

  return common.time_back_to_back(call, warmup=2, iters=iters)


def _label(shape: tuple[int, ...], dtype: str) -> str:
  return f"{'x'.join(map(str, shape))} {dtype}"


def run(length: int, batch: int, dtype: str, iters: int, local: bool, peak_tflops: float,
        opts: StepOptions = StepOptions(), step_ms: float | None = None):
  """`(summary_row, dot_rows)` for the step at these sizes, built as `opts` says."""
  import jax  # pylint: disable=import-outside-toplevel
  sizes = LOCAL if local else Sizes()
  step, (params, opt_state, data), tx, head_positions, sizes = pretrain_step(
      length, batch, dtype, "float32", sizes, local, opts)
  text = jax.jit(step).lower(params, opt_state, data, jax.random.key(0)).as_text()
  counts = count_dots(text)
  dot_tflop = sum(d.flop * n for d, n in counts.items()) / 1e12
  model_tflop = train_step_tflop(length, batch, sizes, head_positions)
  if dot_tflop < 0.5 * model_tflop:
    # The fused kernels' own work (ETC's scores, the GCN's messages) is a minority of the
    # step; a parse that found less than half the FLOPs has missed products. Checked
    # before any product is timed, so a bad parse costs no device time.
    raise ValueError(f"gemm_floor: the products found carry {dot_tflop:.3g} of the step's "
                     f"{model_tflop:.3g} model TFLOP: the module was not read in full")
  rows = []
  for dot, n in counts.items():
    seconds = time_dot(dot, iters)
    rows.append(dict(lhs=_label(dot.lhs, dot.lhs_dtype), rhs=_label(dot.rhs, dot.rhs_dtype),
                     out=_label(dot.out, dot.out_dtype), count=n,
                     gflop=dot.flop / 1e9, ms_each=seconds * 1e3, ms_total=n * seconds * 1e3,
                     tflops=dot.flop / seconds / 1e12))
  gemm_ms = sum(r["ms_total"] for r in rows)
  for r in rows:
    r["share"] = r["ms_total"] / gemm_ms if gemm_ms else 0.0
  rows.sort(key=lambda r: -r["ms_total"])
  adamw_ms = time_adamw(tx, params, opt_state, iters) * 1e3
  floor_ms = gemm_ms + adamw_ms
  summary = dict(what="floor", length=length, batch=batch, dtype=dtype,
                 etc_kernel=opts.etc_kernel, gcn_kernel=opts.gcn_kernel,
                 pad_to_multiple_of=opts.pad_to_multiple_of,
                 dots=sum(counts.values()), distinct=len(counts),
                 dot_tflop=dot_tflop, model_tflop=model_tflop, gemm_ms=gemm_ms,
                 gemm_tflops=dot_tflop / gemm_ms * 1e3 if gemm_ms else None,
                 adamw_ms=adamw_ms, floor_ms=floor_ms,
                 bound_mfu=mfu(model_tflop, floor_ms / 1e3, peak_tflops),
                 device=str(jax.devices()[0].device_kind), step_ms=step_ms,
                 step_over_floor=None if step_ms is None else step_ms / floor_ms)
  return summary, rows


def main(argv=None) -> int:
  from flaxdoc.bench.accelerator import H100_BF16_TFLOPS  # pylint: disable=import-outside-toplevel
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--length", type=int, default=1024)
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
  # Default: the fused kernels on an accelerator; with --local the XLA paths, since
  # Pallas' CPU interpreter turns a kernel into loops whose products cannot be counted.
  ap.add_argument("--etc_kernel", default=None, choices=["xla", "pallas"])
  ap.add_argument("--gcn_kernel", default=None,
                  choices=common.GCN_KERNELS)
  ap.add_argument("--iters", type=int, default=20)
  ap.add_argument("--top", type=int, default=20, help="products listed (the summary has all)")
  ap.add_argument("--peak_tflops", type=float, default=H100_BF16_TFLOPS)
  ap.add_argument("--step_ms", type=float, default=None, help="a measured step, for the ratio")
  ap.add_argument("--local", action="store_true", help="the shrunk model at 128 x 2 (CPU tests)")
  ap.add_argument("--pad_to_multiple_of", type=int, default=1, metavar="N",
                  help="the encoder's rows padded to a multiple of N (1: off; 8: 1025 -> 1032 "
                       "at 1,024 tokens), as bench.accelerator --pad_to_multiple_of")
  ap.add_argument("--json", action="store_true")
  a = ap.parse_args(argv)
  length, batch = (128, 2) if a.local else (a.length, a.batch)
  kernels = [k or ("xla" if a.local else "pallas") for k in (a.etc_kernel, a.gcn_kernel)]
  opts = StepOptions(etc_kernel=kernels[0], gcn_kernel=kernels[1],
                     pad_to_multiple_of=a.pad_to_multiple_of)
  summary, rows = run(length, batch, a.dtype, a.iters, a.local, a.peak_tflops, opts, a.step_ms)
  common.emit(rows[:a.top], as_json=a.json, title="the step's products, each alone",
              columns=None if a.json else list(DOT_COLUMNS))
  common.emit([summary], as_json=a.json, title="FormNet-A2 pre-training step: GEMM floor",
              columns=None if a.json else list(SUMMARY_COLUMNS))
  return 0


if __name__ == "__main__":
  sys.exit(main())
