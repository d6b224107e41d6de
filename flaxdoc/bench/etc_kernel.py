r"""One ETC + Rich Attention layer's long queries: the XLA path against the fused kernel's tiles.

    python -m flaxdoc.bench.etc_kernel [--json] [--batch 16] [--length 1024] [--dtype bfloat16]
        [--tiles 64,64,4,64,64,4 32,64,4,32,32,4 ...] [--sweep] [--iters 20] [--local]

The operation `flaxdoc.nn.etc_pallas.long_query_attention` replaces inside
`EtcAttention(kernel="pallas")`: FormNet-A2's sizes by default (12 heads x 64, radius 84,
one global token, Rich Attention on x and y), random inputs, `jax.jit` of the forward
and of the gradients of every input (queries, keys, values, the globals' keys and
values, the four Rich projection matrices and theta). One row for the XLA path
(`flaxdoc.nn.etc_attention.global_local_attention` with the Rich term) and one per
`--tiles` (`block_q,block_k,warps,backward_block_q,backward_block_k,backward_warps`,
`flaxdoc.nn.etc_pallas.Tiles`); `--sweep` tries the seven tilings the H100 session of
2026-11-26 compared. Each row also reports its error against the XLA path in float32
(relative L2 norm of the output, and the largest over the gradients), beside the XLA
path's own error in `--dtype`: the kernel is as exact as the path it replaces when the
two are alike. Times are medians of three runs of `--iters` back-to-back calls.

On a CPU the kernel runs in Pallas' interpreter (`--local` shrinks the sizes for a
smoke test); its times there mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from flaxdoc.bench import common

COLUMNS = ("impl", "tiles", "batch", "length", "dtype", "fwd_ms", "fwd_bwd_ms", "speedup_fwd",
           "speedup_fwd_bwd", "out_err", "grad_err", "xla_out_err", "xla_grad_err")
SWEEP = ("64,64,4,64,64,8", "64,64,4,64,64,4", "64,64,4,32,64,4", "64,64,4,64,32,4",
         "64,64,4,32,32,4", "128,64,8,128,64,8", "32,64,4,32,64,8")


@dataclasses.dataclass(frozen=True)
class Problem:
  batch: int = 16
  length: int = 1024
  heads: int = 12
  head_dim: int = 64
  radius: int = 84
  num_globals: int = 1
  axes: int = 2


LOCAL = Problem(batch=2, length=96, heads=2, head_dim=16, radius=12)


def parse_tiles(text: str):
  from flaxdoc.nn import etc_pallas  # pylint: disable=import-outside-toplevel
  values = [int(v) for v in text.split(",")]
  if len(values) != 6:
    raise ValueError(f"--tiles {text!r}: need six integers block_q,block_k,warps,"
                     "backward_block_q,backward_block_k,backward_warps")
  return etc_pallas.Tiles(*values)


def make(p: Problem, dtype: str):
  """`(args, xla_fn, kernel_fn(tiles), cotangent)`: inputs and the two forms of the layer."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from flaxdoc.layout import rich as rich_lib  # pylint: disable=import-outside-toplevel
  from flaxdoc.nn import etc_pallas  # pylint: disable=import-outside-toplevel
  from flaxdoc.nn import etc_attention  # pylint: disable=import-outside-toplevel

  f32 = jnp.float32
  b, n, h, d, g, a = p.batch, p.length, p.heads, p.head_dim, p.num_globals, p.axes
  ks = jax.random.split(jax.random.key(0), 16)
  q, k, v = (jax.random.normal(ks[i], (b, n, h, d), dtype) for i in range(3))
  qg, kg, vg = (jax.random.normal(ks[3 + i], (b, g, h, d), dtype) for i in range(3))
  w = tuple(0.1 * jax.random.normal(ks[6 + i], (h, d, a)) for i in range(4))
  bias_o, bias_d = 0.1 * jax.random.normal(ks[10], (h, a)), 0.1 * jax.random.normal(ks[11], (h, a))
  theta = 0.1 + 0.2 * jax.random.uniform(ks[12], (h, a))
  coords = jnp.round(jax.random.uniform(ks[13], (b, n, a)) * 1000)
  valid = jnp.arange(n)[None] < jnp.where(jnp.arange(b) % 2 == 0, n, n - n // 8)[:, None]
  gvalid = jnp.ones((b, g), bool)
  cotangent = jax.random.normal(ks[14], (b, n, h, d), f32) * valid[..., None, None]

  def scalars(qq, kk, w):
    proj = rich_lib.rich_projection_scalars
    return (proj(qq.astype(f32), w[0], bias_o), proj(kk.astype(f32), w[1]),
            proj(qq.astype(f32), w[2], bias_d), proj(kk.astype(f32), w[3]))

  def xla(q, k, v, kg, vg, w, theta):
    def term(qb, kb, q_geom, k_geom):
      return rich_lib.rich_attention_logits(*scalars(qb, kb, w), theta, q_geom["c"],
                                            k_geom["c"])
    return etc_attention.global_local_attention(
        q, k, v, qg.astype(q.dtype), kg, vg, valid, gvalid, local_radius=p.radius,
        terms=[term], long_geom={"c": coords})[0]

  def fused(tiles):
    def f(q, k, v, kg, vg, w, theta):
      return etc_pallas.long_query_attention(
          q, k, v, kg, vg, valid, gvalid, local_radius=p.radius,
          rich=scalars(q, k, w) + (theta, coords), tiles=tiles)
    return f

  return (q, k, v, kg, vg, w, theta), xla, fused, cotangent


def _rel(a, b) -> float:
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
  return float(jnp.linalg.norm(a - b) / jnp.maximum(jnp.linalg.norm(a), 1e-30))


def measure(fn, args, cotangent, iters: int):
  """`(fwd_ms, fwd_bwd_ms, output, gradients)` of `fn(*args)`."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  forward = jax.jit(lambda *x: fn(*x))  # a fresh function per row: no trace shared
  grads = jax.jit(jax.grad(lambda *x: jnp.sum(fn(*x).astype(jnp.float32) * cotangent),
                           argnums=tuple(range(len(args)))))
  fwd = common.time_back_to_back(lambda: forward(*args), iters=iters)
  both = common.time_back_to_back(lambda: grads(*args), iters=iters)
  return fwd * 1e3, both * 1e3, forward(*args), grads(*args)


def run(p: Problem, dtype: str, tiles: list, iters: int, check: bool = True):
  """The XLA row, then one row per tiling (a failed tiling gets an `error` row)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  args, xla, fused, cotangent = make(p, dtype)
  base = dict(batch=p.batch, length=p.length, dtype=dtype)
  reference = None
  if check:  # the XLA path in float32 on the same (rounded) inputs
    args32 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), args)
    _, _, ref_out, ref_grads = measure(xla, args32, cotangent, 1)
    reference = (ref_out, jax.tree.leaves(ref_grads))

  def errors(out, grads, prefix=""):
    if reference is None:
      return {}
    grad_err = max(_rel(r, g) for r, g in zip(reference[1], jax.tree.leaves(grads)))
    return {f"{prefix}out_err": _rel(reference[0], out), f"{prefix}grad_err": grad_err}

  fwd, both, out, grads = measure(xla, args, cotangent, iters)
  xla_errors = errors(out, grads, "xla_")
  rows = [dict(base, impl="xla", tiles="-", fwd_ms=fwd, fwd_bwd_ms=both, **xla_errors)]
  yield rows[0]
  for t in tiles:
    label = ",".join(str(v) for v in dataclasses.astuple(t))
    try:
      f, fb, out, grads = measure(fused(t), args, cotangent, iters)
    except Exception as e:  # pylint: disable=broad-except  # a tiling Triton refuses
      yield dict(base, impl="pallas", tiles=label, error=f"{type(e).__name__}: {e}"[:300])
      continue
    yield dict(base, impl="pallas", tiles=label, fwd_ms=f, fwd_bwd_ms=fb,
               speedup_fwd=fwd / f, speedup_fwd_bwd=both / fb, **errors(out, grads),
               **xla_errors)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--batch", type=int, default=Problem.batch)
  ap.add_argument("--length", type=int, default=Problem.length)
  ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
  ap.add_argument("--tiles", nargs="+", default=None,
                  help="block_q,block_k,warps,backward_block_q,backward_block_k,backward_warps "
                       "(default: the kernel's defaults)")
  ap.add_argument("--sweep", action="store_true", help=f"also the tilings {SWEEP}")
  ap.add_argument("--iters", type=int, default=20)
  ap.add_argument("--no_check", action="store_true", help="skip the float32 reference")
  ap.add_argument("--local", action="store_true", help="tiny sizes, for CPU smoke tests")
  ap.add_argument("--json", action="store_true")
  a = ap.parse_args(argv)
  from flaxdoc.nn import etc_pallas  # pylint: disable=import-outside-toplevel
  p = LOCAL if a.local else dataclasses.replace(Problem(), batch=a.batch, length=a.length)
  tiles = [parse_tiles(t) for t in a.tiles] if a.tiles else [etc_pallas.DEFAULT_TILES]
  if a.sweep:
    tiles += [parse_tiles(t) for t in SWEEP if parse_tiles(t) not in tiles]
  rows = []
  for row in run(p, a.dtype, tiles, a.iters, check=not a.no_check):
    rows.append(row)
    if not a.json:
      print("#", row, flush=True)
  common.emit(rows, as_json=a.json, title="one ETC + Rich layer's long queries: XLA vs fused",
              columns=None if a.json else list(COLUMNS) + ["error"])
  return 0


if __name__ == "__main__":
  sys.exit(main())
