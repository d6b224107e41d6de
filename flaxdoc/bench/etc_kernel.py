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
two are alike (`flaxdoc.bench.kernel_rows`). Times are medians of three runs of `--iters`
back-to-back calls.

On a CPU the kernel runs in Pallas' interpreter (`--local` shrinks the sizes for a
smoke test); its times there mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from flaxdoc.bench import kernel_rows

# The H100 sweep of 2026-11-26, then tilings `bench.kernel_sass` counted as cheaper once the
# transcendentals took one instruction (session 8, untimed): 32 x 64 backward tiles no
# longer spill, and 16-row tiles cover fewer keys outside the band with fewer registers.
SWEEP = ("64,64,4,64,64,8", "64,64,4,64,64,4", "64,64,4,32,64,4", "64,64,4,64,32,4",
         "64,64,4,32,32,4", "128,64,8,128,64,8", "32,64,4,32,64,8",
         "32,64,4,32,64,4", "16,64,2,16,64,4", "16,64,2,16,32,2", "16,32,2,16,32,2")


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
    # As the layer does (`RichAttentionTerm.scalars`): q, k in their dtype, widened inside.
    return (proj(qq, w[0], bias_o), proj(kk, w[1]), proj(qq, w[2], bias_d), proj(kk, w[3]))

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


def run(p: Problem, dtype: str, tiles: list, iters: int, check: bool = True):
  """The XLA row, then one row per tiling (`flaxdoc.bench.kernel_rows.compare`)."""
  args, xla, fused, cotangent = make(p, dtype)
  return kernel_rows.compare(args, xla, fused, cotangent, tiles, iters,
                             dict(batch=p.batch, length=p.length, dtype=dtype), check)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  kernel_rows.add_arguments(ap, Problem.batch, Problem.length,
                            "block_q,block_k,warps,backward_block_q,backward_block_k,"
                            "backward_warps", SWEEP)
  a = ap.parse_args(argv)
  from flaxdoc.nn import etc_pallas  # pylint: disable=import-outside-toplevel
  p = LOCAL if a.local else Problem(batch=a.batch, length=a.length)
  tiles = kernel_rows.tilings(a, parse_tiles, etc_pallas.DEFAULT_TILES, SWEEP)
  kernel_rows.emit(run(p, a.dtype, tiles, a.iters, check=not a.no_check), a,
                   "one ETC + Rich layer's long queries: XLA vs fused")
  return 0


if __name__ == "__main__":
  sys.exit(main())
