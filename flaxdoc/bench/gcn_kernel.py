r"""One FormNet GCN layer: the XLA path against the fused kernels' tiles.

    python -m flaxdoc.bench.gcn_kernel [--json] [--batch 16] [--length 1024] [--dtype bfloat16]
        [--graph local|random] [--kernels pallas pallas_dpre pallas_fused ...]
        [--tiles 16,32,32,4[,2,8] ...]
        [--sweep] [--iters 20] [--local]

`flaxdoc.nn.gcn.GCNLayer` at FormNet-A2's sizes by default (768 wide, the message MLP's
hidden layer `2E + F` wide, 8 neighbour slots, 70% of them real edges), `jax.jit` of the
forward and of the gradients of the node states and every parameter. One row for
`kernel="xla"` and one per fused kernel (`--kernels`: "pallas" recomputes each edge's GELU
in the backward, "pallas_saved" keeps it from the forward, "pallas_dpre" recomputes it but
writes `d pre` for the target side, "pallas_fused" and "pallas_fused_forward" are that
with the forward, and the backward's node side, in one kernel that evaluates each edge
element once) and `--tiles` (`block_nodes,block_hidden,block_edges,warps`, optionally
`,fused_nodes,fused_warps`: `flaxdoc.nn.gcn_pallas.Tiles`); `--sweep` adds a set of
tilings. `fwd_ms` is the forward as inference runs it (for every form but the fused ones
the recomputing one); `fwd_bwd_ms` the forward and backward of training.
Errors are against the XLA layer in float32 (`flaxdoc.bench.kernel_rows`). The graph's
neighbours are within 32 tokens of the node (`local`: a page's spatial neighbours are
near in reading order, so gathers hit the cache) or anywhere in the row (`random`, as
`flaxdoc.models.example_batch` draws them for the pre-training benchmark).

On a CPU the kernels run in Pallas' interpreter (`--local` shrinks the sizes for a
smoke test); their times there mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys

from flaxdoc.bench import kernel_rows

SWEEP = ("16,32,64,4", "16,64,64,4", "16,16,64,4", "32,32,64,4", "16,32,128,4", "16,32,64,8",
         "32,64,64,8")


@dataclasses.dataclass(frozen=True)
class Problem:
  batch: int = 16
  length: int = 1024
  width: int = 768
  slots: int = 8
  edge_features: int = 0  # 0: the featuriser's (flaxdoc.layout.edge_features)
  graph: str = "local"


LOCAL = Problem(batch=2, length=40, width=16, slots=4)


def parse_tiles(text: str):
  from flaxdoc.nn import gcn_pallas  # pylint: disable=import-outside-toplevel
  values = [int(v) for v in text.split(",")]
  if len(values) not in (4, 6):
    raise ValueError(f"--tiles {text!r}: need four integers "
                     "block_nodes,block_hidden,block_edges,warps, or six with the fused "
                     "forms' fused_nodes,fused_warps")
  return gcn_pallas.Tiles(*values)


def make(p: Problem, dtype: str):
  """`(args, xla_fn, {kernel: kernel_fn(tiles)}, cotangent)`: `args = (h, params)`."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from flax import linen as nn  # pylint: disable=import-outside-toplevel

  # pylint: disable=import-outside-toplevel
  from flaxdoc.layout.edge_features import NUM_EDGE_FEATURES
  from flaxdoc.nn import gcn

  b, n, e, k = p.batch, p.length, p.width, p.slots
  f = p.edge_features or NUM_EDGE_FEATURES
  rng = np.random.default_rng(0)
  if p.graph == "local":
    ids = np.clip(np.arange(n)[None, :, None] + rng.integers(-32, 33, (b, n, k)), 0, n - 1)
  elif p.graph == "random":
    ids = rng.integers(0, n, (b, n, k))
  else:
    raise ValueError(f"graph must be 'local' or 'random', got {p.graph!r}")
  mask = rng.random((b, n, k)) < 0.7
  node_mask = np.ones((b, n), bool)
  node_mask[1 % b, n - n // 8:] = False  # a padded tail, as in a real batch
  mask &= node_mask[:, :, None]
  ids = jnp.asarray(np.where(mask, ids, 0), jnp.int32)
  feats = jnp.asarray(np.where(mask[..., None], rng.normal(size=(b, n, k, f)), 0), jnp.float32)
  mask, node_mask = jnp.asarray(mask), jnp.asarray(node_mask)
  hidden = gcn.message_hidden_width("input", e, f)
  h = jax.random.normal(jax.random.key(0), (b, n, e), dtype)

  def layer(kernel, tiles=None):
    def apply(h, params):
      module = gcn.GCNLayer(hidden_features=hidden, kernel=kernel, pallas_tiles=tiles,
                            dtype=h.dtype)
      return module.apply({"params": params}, h, ids, feats, mask, node_mask)
    return apply

  params = nn.unbox(gcn.GCNLayer(hidden_features=hidden).init(
      jax.random.key(1), h[:1].astype(jnp.float32), ids[:1], feats[:1], mask[:1])["params"])
  cotangent = jax.random.normal(jax.random.key(2), (b, n, e), jnp.float32)
  fused = {k: functools.partial(layer, k) for k in gcn.FUSED_KERNELS}
  return (h, params), layer("xla"), fused, cotangent


def run(p: Problem, dtype: str, tiles: list, iters: int, check: bool = True,
        kernels: tuple[str, ...] = ("pallas",)):
  """The XLA row, then one row per fused kernel and tiling (`kernel_rows.compare`)."""
  args, xla, fused, cotangent = make(p, dtype)
  return kernel_rows.compare(args, xla, {k: fused[k] for k in kernels}, cotangent, tiles, iters,
                             dict(batch=p.batch, length=p.length, dtype=dtype, graph=p.graph),
                             check)


def main(argv=None) -> int:
  from flaxdoc.nn import gcn_pallas  # pylint: disable=import-outside-toplevel
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  kernel_rows.add_arguments(ap, Problem.batch, Problem.length,
                            "block_nodes,block_hidden,block_edges,warps", SWEEP)
  ap.add_argument("--graph", default="local", choices=["local", "random"])
  ap.add_argument("--kernels", nargs="+", default=["pallas", "pallas_saved"],
                  choices=list(gcn_pallas.FORMS),
                  help="the fused forms: GELU recomputed in the backward, saved, or "
                       "recomputed once with d pre passed to the target side")
  a = ap.parse_args(argv)
  p = LOCAL if a.local else Problem(batch=a.batch, length=a.length)
  p = dataclasses.replace(p, graph=a.graph)
  # Without --tiles: each chosen form's default tiling (every form runs every tiling).
  defaults = [gcn_pallas.default_tiles(**gcn_pallas.form_options(k)) for k in a.kernels]
  tiles = kernel_rows.tilings(a, parse_tiles, list(dict.fromkeys(defaults)), SWEEP)
  kernel_rows.emit(run(p, a.dtype, tiles, a.iters, check=not a.no_check,
                       kernels=tuple(a.kernels)), a,
                   "one FormNet GCN layer: XLA vs fused",
                   columns=kernel_rows.COLUMNS[:5] + ("graph",) + kernel_rows.COLUMNS[5:])
  return 0


if __name__ == "__main__":
  sys.exit(main())
