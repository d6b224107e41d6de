r"""FormNet's GCN message attention as fused Pallas kernels, forward and backward.

`flaxdoc.nn.gcn.GCNLayer` computes, per node `l` and neighbour slot `k`, the hidden
message `x_lk = gelu(S_l + N_{id(l,k)} + e_lk We + b1)`, its score `x_lk . v`, a softmax
over the valid slots and the pooled vector `sum_k a_lk x_lk`. As XLA arrays that is a
chain of `[B, L, K, H]` tensors (the gathered rows, the edge part, the pre-activation,
GELU, its gradient, the gathered gradient's scatter-add), each a pass over memory
forward and again backward: with FormNet-A2's `H = 2E + F = 1,547` and `K = 8`, one
such tensor is 400 MB at 16 x 1,024 tokens in bfloat16, and the GCN was 32% of an
H100 pre-training step (docs/accelerators.md). Here nothing `[B, L, K, H]` is written:
each kernel recomputes the pre-activation of its edges from the per-node vectors
(`flaxdoc.nn.gcn_pallas_kernels`).

Forward: one kernel for the scores (per chunk of `H`, summed after), a softmax over
`K` in XLA (`[B, L, K]`, tiny), one kernel for the pooled vectors. Backward: one kernel
for `d a` (as the scores, with the pooled gradient in place of `v`), the softmax's
backward in XLA, one kernel per *source* node tile (`d S`, and partial sums of `d v`
and `d [We; b1]`) and one per *target* node tile (`d N`). The last is the gather's transpose,
a scatter-add; it runs without atomics: XLA sorts a row's edges by target once, and each
target tile sums its in-edges with a one-hot matrix product.

`save_activations=True` (`GCNLayer(kernel="pallas_saved")`) trades memory for those
recomputations: under differentiation the forward's scores kernel also writes every
edge row's GELU output and slope (two `[B, Lp * Kp, Hp]` arrays, the padded sizes, in
the inputs' dtype, kept until the backward), the pooled sum and `d a` read them, the
source-tile backward reads them and writes `d pre`, and the target-tile backward only
sums `d pre` rows. GELU (with its slope) is evaluated once per edge element a step
instead of five times. A forward that is not differentiated saves nothing: it is the
recomputing forward; both pool `x` and the weights as operands of one product in the
inputs' dtype, so the training forward's output is the inference forward's, bit for bit
(checked in Pallas' interpreter; on a GPU as long as both kernels compute `x` alike).

`write_d_pre=True` (`GCNLayer(kernel="pallas_dpre")`) is a middle way: nothing is kept
from the forward, but within the backward the source-tile kernel writes `d pre` (one
`[B, Lp * Kp, Hp]` array, freed with the layer's backward) and the target side sums it:
four GELU evaluations an element instead of five.

`fused_forward=True` with `write_d_pre` (`GCNLayer(kernel="pallas_fused_forward")`) runs
the forward as one kernel on a grid of (batch row, node tile): a program takes a few
nodes' edge rows across all of `H`, evaluates each element once, keeps `x` in registers
while the scores complete, takes the softmax over the slots and pools from what it kept
(`gcn_pallas_fused.fused_forward_kernel`): one launch and one XLA softmax fewer.
`fused_backward=True` does the same for the backward's node side (`d a`, the softmax's
backward, `d pre`, `d S`, `d v`), keeping `x` and the GELU slope in the inputs' dtype
while `d a` completes, and the target side sums `d [We; b1]` with `d N`
(`GCNLayer(kernel="pallas_fused")`: both). Two evaluations an element a step, against
four for `write_d_pre`. Their tiles are `Tiles.fused_nodes` / `fused_warps`; counted
(`bench.kernel_sass`), not yet timed.

The kernels work on node arrays padded to whole tiles (`[B, Lp, Hp]`), `S` and `N` as the
two halves of one `[B, Lp, 2 Hp]` array `[S | N]`, whose gradient they write as one array
too (the source side `d S`, the target side `d N` into the same buffer). `GCNLayer` calls
`message_attention`, whose one node product writes `[S | N]` and takes its gradient
back, in the compute dtype; `attention_pool` takes `S` and `N` as they are, pads and
joins them.

The edge features are treated as data: they get no gradient (the XLA path would give
them one; nothing in flaxdoc trains them). The score's constant `b2 . w` is left out:
a softmax does not see a constant. Kernels run on GPUs through Pallas' Triton backend,
elsewhere (CPU tests) with `interpret=True`. The kernel bodies are in
`flaxdoc.nn.gcn_pallas_kernels` (the fused forms' in `flaxdoc.nn.gcn_pallas_fused`), the
`pallas_call`s that lay out their operands and
launch them in `flaxdoc.nn.gcn_pallas_calls`; this module holds the forms and tiles, the
custom VJP that chains the calls, and the public functions.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from flaxdoc.nn import batch_parallel
from flaxdoc.nn import gcn_pallas_calls as calls
from flaxdoc.nn import pallas_backend
from flaxdoc.nn.gcn_pallas_kernels import Config, slot_softmax_grad

__all__ = ["DEFAULT_TILES", "DPRE_TILES", "FORMS", "Config", "Tiles", "attention_pool",
           "default_tiles", "form_options", "message_attention"]

Array = jax.Array
F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Tiles:
  """Tile sizes (powers of two, >= 16 on a GPU) and Triton warps.

  `block_nodes` nodes (their `block_nodes * Kp` edge rows) by `block_hidden` hidden
  features per program; `block_edges` in-edges per step of the target-side backward.
  A program holds several `[block_nodes * Kp, block_hidden]` float32 arrays (the
  pre-activation, GELU, its slope, the gradients), so `block_hidden` is 32 by default:
  with `Kp = 8` that is 32 registers per thread and array at 4 warps (64 for
  `write_d_pre`, `DPRE_TILES`, timed faster in the step all the same). The defaults are
  the fastest forward + backward of `python -m flaxdoc.bench.gcn_kernel --sweep` on an
  H100 for the recomputing form (one layer at 16 x 1,024, bf16: 4.46 ms in session 9,
  3.68 ms in session 13; the other tilings 3.78-5.20 ms). `write_d_pre` has its own
  (`DPRE_TILES`).
  """
  block_nodes: int = 16
  block_hidden: int = 32
  block_edges: int = 32
  warps: int = 4
  # The fused forms' kernels: nodes a program (x all of H; divides block_nodes) and warps.
  # 2 x 8: the forward keeps 104 registers without a spill at FormNet-A2's sizes, the
  # backward 255 with 344 bytes spilled (`bench.kernel_sass`; at 4 warps the forward
  # spills too, at 16 the instructions double); untimed.
  fused_nodes: int = 2
  fused_warps: int = 8


DEFAULT_TILES = Tiles()
# `write_d_pre`'s: 64 hidden features a program. Its forward is slower so (1.11 against
# 1.01 ms a layer at 16 x 1,024 on an H100), the layer 3% faster (3.37 against 3.48 ms,
# 1.3 ms over 12 layers) and the FormNet-A2 pre-training step 2.9 ms faster (95.3 against
# 98.2 ms, session 13; docs/accelerators.md): in the step the source-side backward, which
# gathers neighbour rows of `N` and writes `d pre`, reads and writes whole 128-byte lines.
DPRE_TILES = Tiles(block_hidden=64, block_edges=64)


def default_tiles(save_activations: bool = False, write_d_pre: bool = False,
                  fused_forward: bool = False, fused_backward: bool = False) -> Tiles:
  """The tiles a form runs with when none are given (the fused forms run with
  `write_d_pre`'s, whose fields `fused_nodes` / `fused_warps` size their fused kernels)."""
  del fused_forward, fused_backward
  return DPRE_TILES if write_d_pre and not save_activations else DEFAULT_TILES


# The fused forms by the names `GCNLayer(kernel=...)` and the configs use: recompute each
# edge's GELU in the backward, save it from the forward, or recompute it once in the
# backward and pass `d pre` from the source side to the target side; and that backward
# after a forward in one kernel that evaluates each edge's GELU once (session 16, untimed).
_NONE = dict(save_activations=False, write_d_pre=False, fused_forward=False,
             fused_backward=False)
FORMS = {
    "pallas": _NONE,
    "pallas_saved": dict(_NONE, save_activations=True),
    "pallas_dpre": dict(_NONE, write_d_pre=True),
    "pallas_fused": dict(_NONE, write_d_pre=True, fused_forward=True, fused_backward=True),
    # the fused forward before `pallas_dpre`'s backward: to time the two halves apart
    "pallas_fused_forward": dict(_NONE, write_d_pre=True, fused_forward=True),
}


def form_options(form: str) -> dict:
  """`message_attention`'s `save_activations` / `write_d_pre` / `fused_forward` /
  `fused_backward` for a form's name."""
  if form not in FORMS:
    raise ValueError(f"unknown fused GCN form {form!r}; expected one of {tuple(FORMS)}")
  return dict(FORMS[form])


# --------------------------------------------------------------------------- custom VJP
# On the kernels' layout: `sn = [S | N]` is `[B, Lp, 2 Hp]`, the pooled output `[B, Lp, Hp]`
# (zeros in the padding), so neither direction pads, crops, slices or concatenates a
# `[B, L, H]` array around the kernels.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention_pool(cfg, sn, edges, ids, mask, we, b1, v):
  # Not differentiated (inference): nothing needs saving, whatever `cfg.save_activations`.
  return _recomputing_forward(cfg, calls.prepare(cfg, sn, edges, ids, mask, we, b1, v), sn.dtype)[0]


def _recomputing_forward(cfg, x, out_dtype):
  """`((pooled [B, Lp, Hp], weights [B, L, K]), a)`: the scores kernel, the softmax, the
  pooling kernel; or the one fused kernel (`cfg.fused_nodes`)."""
  if cfg.fused_forward:
    pooled, a = calls.fused_forward(cfg, x, out_dtype)
    return (pooled, _weights(cfg, a)), a
  a = calls.softmax(cfg, calls.edge_dot(cfg, x, x["v"], per_node_u=False), x["mask"])
  return (calls.pool(cfg, x, a, out_dtype), _weights(cfg, a)), a


def _weights(cfg, a):
  """The rows' weights `[B, rows]` cropped to `[B, L, K]`."""
  batch = a.shape[0]
  return a.reshape(batch, cfg.padded_nodes, cfg.padded_slots)[:, :cfg.nodes, :cfg.slots]


def _attention_pool_fwd(cfg, sn, edges, ids, mask, we, b1, v):
  x = calls.prepare(cfg, sn, edges, ids, mask, we, b1, v)
  if not cfg.save_activations:
    out, a = _recomputing_forward(cfg, x, sn.dtype)
    return out, (sn, edges, ids, mask, we, b1, v, a)
  scores, hidden, slope = calls.saving_scores(cfg, x)
  a = calls.softmax(cfg, scores, x["mask"])
  # `sn` is not needed again (`hidden` has its dtype).
  res = (edges, ids, mask, we, b1, v, a, hidden, slope)
  return (calls.saved_pool(cfg, hidden, a, sn.dtype), _weights(cfg, a)), res


def _attention_pool_bwd(cfg, res, grads):
  d_pooled, d_weights = grads
  # The recomputing target-side kernel gathers `dp` rows by source node, and widening a
  # gathered bfloat16 row costs it ~4 integer instructions an edge element
  # (`bench.kernel_sass`), so for it `dp` is widened here, in the pass XLA makes anyway (the
  # crop's transpose, a pad, with dropout's). With `write_d_pre` or `save_activations`
  # no kernel gathers `dp`: they widen a node tile's rows once, before repeating them for
  # the edges, and `dp` stays in the inputs' dtype: the same values, and that pass writes
  # (and the two kernels read) half the bytes, ~0.15 GB a layer at 16 x 1,024 on an H100,
  # where the float32 array was a 2.2 GB `convert` a step in the module the card ran.
  gathers_dp = not (cfg.save_activations or cfg.write_d_pre)
  dp = d_pooled.astype(F32) if gathers_dp else d_pooled  # [B, Lp, Hp]
  if cfg.save_activations:
    edges, ids, mask, we, b1, v, a, hidden, slope = res
    x = calls.prepare_edges(cfg, edges, ids, mask, we, b1, v)
  else:
    sn, edges, ids, mask, we, b1, v, a = res
    x = calls.prepare(cfg, sn, edges, ids, mask, we, b1, v)
  batch, lp, kp = a.shape[0], cfg.padded_nodes, cfg.padded_slots
  d_weights = jnp.pad(d_weights.astype(F32), [(0, 0), (0, lp - cfg.nodes),
                                              (0, kp - cfg.slots)]).reshape(batch, cfg.rows)
  if cfg.fused_backward:
    d_sn, d_v, d_pre = calls.fused_backward(cfg, x, a, d_weights, dp)
    d_sn, d_we = calls.fused_target_grads(cfg, x, d_pre, d_sn)
    return _grads(cfg, d_sn, d_v, d_we, we, b1, v)
  d_a = calls.saved_edge_dot(cfg, hidden, dp) if cfg.save_activations else calls.edge_dot(
      cfg, x, dp, per_node_u=True)
  d_a += d_weights
  # Softmax backward per node (zero where a is: masked slots).
  ds = slot_softmax_grad(a.reshape(batch, lp, kp), d_a.reshape(batch, lp, kp)).reshape(
      batch, cfg.rows)
  # The source side writes `d S` into `d [S | N]`, the target side `d N` into the same array.
  if cfg.save_activations:
    d_sn, d_v, d_we, d_pre = calls.saved_source_grads(cfg, x, hidden, slope, a, ds, dp)
    d_sn = calls.saved_target_grads(cfg, x, d_pre, d_sn)
  elif cfg.write_d_pre:
    d_sn, d_v, d_we, d_pre = calls.source_grads(cfg, x, a, ds, dp)
    d_sn = calls.saved_target_grads(cfg, x, d_pre, d_sn)
  else:
    d_sn, d_v, d_we = calls.source_grads(cfg, x, a, ds, dp)
    d_sn = calls.target_grads(cfg, x, a, ds, dp, d_sn)
  return _grads(cfg, d_sn, d_v, d_we, we, b1, v)


def _grads(cfg, d_sn, d_v, d_we, we, b1, v):
  """The custom VJP's cotangents from the kernels' `d [S | N]` and partial sums."""
  feats, hidden_width = cfg.features, cfg.hidden
  d_we = d_we.sum(axis=(0, 1))  # [Fp, Hp]: d We, then d b1 in row F (the ones' column)
  return (d_sn, None, None, None, d_we[:feats, :hidden_width].astype(we.dtype),
          d_we[feats, :hidden_width].astype(b1.dtype),
          d_v.sum(axis=(0, 1))[:hidden_width].astype(v.dtype))


_attention_pool.defvjp(_attention_pool_fwd, _attention_pool_bwd)


def attention_pool(from_self: Array, from_neighbor: Array, edge_features: Array,
                   neighbor_ids: Array, neighbor_mask: Array, edge_kernel: Array,
                   bias: Array, score_vector: Array, *, tiles: Tiles | None = None,
                   save_activations: bool = False, write_d_pre: bool = False,
                   fused_forward: bool = False, fused_backward: bool = False,
                   interpret: bool | None = None) -> tuple[Array, Array]:
  """FormNet's GCN message attention, fused: `(pooled [B, L, H], weights [B, L, K])`.

      x_lk    = gelu(from_self[l] + from_neighbor[ids[l, k]] + edge_features[l, k] @ edge_kernel
                     + bias)
      weights = softmax over the valid k of x_lk . score_vector   (all zero with none valid)
      pooled  = sum_k weights[l, k] x_lk

  `message_attention` is the same from the node states and the first layer's node kernels;
  it gives the kernels their padded layout without copying `[B, L, H]` arrays.

  Args:
    from_self, from_neighbor: `[B, L, H]` the first message layer's node parts (the
      neighbour part not yet gathered), bfloat16 or float32; `from_neighbor` is cast to
      `from_self`'s dtype.
    edge_features: `[B, L, K, F]`; data: no gradient flows to them.
    neighbor_ids: int `[B, L, K]`: any value where `neighbor_mask` is False; valid ids
      outside `[0, L)` are clamped into it, as XLA's gather clamps them.
    neighbor_mask: bool `[B, L, K]`.
    edge_kernel: `[F, H]`; bias, score_vector: `[H]`. The bias is added in the edge
      product, so with bfloat16 node parts it enters as bfloat16, as the edge kernel does
      (`GCNLayer` computes in its dtype: its bias is bfloat16 there anyway).
    tiles: `Tiles` (default: `default_tiles(save_activations, write_d_pre)`).
    save_activations: when differentiated, the forward keeps every edge's GELU output and
      slope (two `[B, Lp * Kp, Hp]` arrays in `from_self`'s dtype: `L`, `K` and `H`
      padded to whole tiles, `K` to a power of two) and the backward evaluates no GELU
      (five evaluations per element become one); False recomputes them, keeping
      nothing per edge.
    write_d_pre: without `save_activations`: the backward's source-side kernel also
      writes every edge row's `d pre` (a `[B, Lp * Kp, Hp]` array in `from_self`'s dtype,
      alive only during this backward) and the target side sums it instead of evaluating
      GELU again: four evaluations an element a step instead of five, for that array's
      write and read. The same values up to the last bits (bit for bit in Pallas'
      interpreter; on a GPU the two kernels compute `d pre` in differently compiled code):
      the target side's product takes `d pre` in the inputs' dtype either way. (Implied
      by `save_activations`.)
    fused_forward: with `write_d_pre` and not `save_activations` (`GCNLayer(kernel=
      "pallas_fused")`): the forward is one kernel that evaluates each edge element once,
      keeping a program's `x` (`tiles.fused_nodes` nodes x all of `H`) while its scores
      complete, with the softmax over slots inside (`gcn_pallas_fused.
      fused_forward_kernel`): three evaluations an element a step instead of four, and no
      XLA softmax between forward kernels. The same values up to the order of additions.
    fused_backward: with `write_d_pre` and not `save_activations`: the backward's node side
      in one kernel (`gcn_pallas_fused.fused_backward_kernel`), evaluating each edge
      element once and keeping `x` and the slope (rounded to the inputs' dtype, as
      `save_activations` keeps them) while `d a` completes; the target side also sums
      `d [We; b1]`. One evaluation an element in the backward instead of two.
    interpret: run the Pallas interpreter (default: when the backend is not a GPU).

  Returns:
    `pooled` in `from_self`'s dtype and `weights` in float32.
  """
  if from_neighbor.shape != from_self.shape:
    raise ValueError(f"attention_pool: from_neighbor has shape {tuple(from_neighbor.shape)}, "
                     f"expected {tuple(from_self.shape)}")
  cfg = _config("attention_pool", from_self, edge_features, neighbor_ids, neighbor_mask,
                edge_kernel, bias, score_vector, tiles, save_activations, write_d_pre,
                fused_forward, fused_backward, interpret)
  sn = jnp.concatenate([calls.pad_nodes(cfg, from_self),
                        calls.pad_nodes(cfg, from_neighbor.astype(from_self.dtype))], axis=-1)
  return _run(cfg, sn, edge_features, neighbor_ids, neighbor_mask, edge_kernel, bias,
              score_vector)


def message_attention(h: Array, self_kernel: Array, neighbor_kernel: Array,
                      edge_features: Array, neighbor_ids: Array, neighbor_mask: Array,
                      edge_kernel: Array, bias: Array, score_vector: Array, *,
                      tiles: Tiles | None = None, save_activations: bool = False,
                      write_d_pre: bool = False, fused_forward: bool = False,
                      fused_backward: bool = False,
                      interpret: bool | None = None) -> tuple[Array, Array]:
  """`attention_pool(h @ self_kernel, h @ neighbor_kernel, ...)`, as `GCNLayer` runs it.

  The kernels work on `[B, Lp, Hp]` node arrays (`L` and `H` padded to whole tiles).
  Here one product `h @ [Ws | Wn]` writes both, `[S | N]`, at that size (the kernels'
  columns padded with zeros, `h`'s rows when `L` is not a whole number of tiles), and
  the kernels' gradient `d [S | N]` comes back at it, in `h`'s dtype: no `[B, L, H]`
  array is padded, cropped, sliced or concatenated around the kernels, forward or
  backward (the pooled gradient is widened to float32 for `pallas` only, whose target
  side gathers it) (with FormNet-A2's `H = 1,547` such a pass moves 100-200 MB a
  layer at 16 x 1,024 tokens in bfloat16). The pooled output is cropped once, where the
  layer's dropout and output product read it.

  Args:
    h: `[B, L, E]` node states (bfloat16 or float32; the products run in its dtype).
    self_kernel, neighbor_kernel: `[E, H]`, the first message layer's rows for the node
      and for its neighbour.
    edge_features, neighbor_ids, neighbor_mask, edge_kernel, bias, score_vector, tiles,
    save_activations, write_d_pre, fused_forward, fused_backward, interpret: as
      `attention_pool`'s.

  Returns:
    `(pooled [B, L, H] in h's dtype, weights [B, L, K] float32)`.
  """
  if h.ndim != 3:
    raise ValueError(f"message_attention: h has shape {tuple(h.shape)}, expected [B, L, E]")
  for name, kernel in (("self_kernel", self_kernel), ("neighbor_kernel", neighbor_kernel)):
    if kernel.ndim != 2 or kernel.shape[0] != h.shape[2] or kernel.shape != self_kernel.shape:
      raise ValueError(f"message_attention: {name} has shape {tuple(kernel.shape)}, "
                       f"expected [{h.shape[2]}, H] (both kernels alike)")
  batch, nodes, _ = h.shape
  node_parts = jax.ShapeDtypeStruct((batch, nodes, self_kernel.shape[1]), h.dtype)
  cfg = _config("message_attention", node_parts, edge_features, neighbor_ids, neighbor_mask,
                edge_kernel, bias, score_vector, tiles, save_activations, write_d_pre,
                fused_forward, fused_backward, interpret)
  h = jnp.pad(h, [(0, 0), (0, cfg.padded_nodes - nodes), (0, 0)])
  columns = [(0, 0), (0, cfg.padded_hidden - cfg.hidden)]
  # One product for both parts: the kernels read `S` and `N` as the two halves of its
  # output, and their gradients come back as one array, so no slice splits the output
  # and no concatenation joins the gradients (XLA merges two products of `h` into one
  # anyway, then copies the halves out: 0.2 GB a layer at 16 x 1,024 on an H100, with
  # the gradients' concatenation about as much again).
  sn = h @ jnp.concatenate([jnp.pad(self_kernel.astype(h.dtype), columns),
                            jnp.pad(neighbor_kernel.astype(h.dtype), columns)], axis=1)
  return _run(cfg, sn, edge_features, neighbor_ids, neighbor_mask, edge_kernel, bias,
              score_vector)


def _run(cfg, sn, edge_features, neighbor_ids, neighbor_mask, edge_kernel, bias, score_vector):
  """The fused kernels on the padded node parts `[S | N]` (`[B, Lp, 2 Hp]`); the pooled
  output cropped."""
  args = (sn, jax.lax.stop_gradient(jnp.asarray(edge_features, F32)),
          jnp.asarray(neighbor_ids, jnp.int32), jnp.asarray(neighbor_mask, bool),
          jnp.asarray(edge_kernel, F32), jnp.asarray(bias, F32), jnp.asarray(score_vector, F32))
  # Per example: each device runs its own rows when the mesh splits the batch.
  pooled, weights = batch_parallel.over_batch(lambda _, *x: _attention_pool(cfg, *x), args,
                                              (True,) * 4 + (False,) * 3)
  return pooled[:, :cfg.nodes, :cfg.hidden], weights


def _config(owner, from_self, edge_features, neighbor_ids, neighbor_mask, edge_kernel, bias,
            score_vector, tiles, save_activations, write_d_pre, fused_forward,
            fused_backward, interpret) -> Config:
  """Checks the shapes and tiles; the call's `Config`. `from_self` may be abstract."""
  batch, nodes, hidden = from_self.shape
  if neighbor_ids.ndim != 3 or tuple(neighbor_ids.shape[:2]) != (batch, nodes):
    raise ValueError(f"{owner}: neighbor_ids has shape {tuple(neighbor_ids.shape)}, "
                     f"expected [{batch}, {nodes}, K]")
  slots = neighbor_ids.shape[2]
  if tuple(neighbor_mask.shape) != (batch, nodes, slots):
    raise ValueError(f"{owner}: neighbor_mask has shape {tuple(neighbor_mask.shape)}, "
                     f"expected {(batch, nodes, slots)}")
  if edge_features.ndim != 4 or tuple(edge_features.shape[:3]) != (batch, nodes, slots):
    raise ValueError(f"{owner}: edge_features has shape "
                     f"{tuple(edge_features.shape)}, expected [{batch}, {nodes}, {slots}, F]")
  features = edge_features.shape[3]
  if tuple(edge_kernel.shape) != (features, hidden):
    raise ValueError(f"{owner}: edge_kernel has shape {tuple(edge_kernel.shape)}, "
                     f"expected {(features, hidden)}")
  for name, vec in (("bias", bias), ("score_vector", score_vector)):
    if tuple(vec.shape) != (hidden,):
      raise ValueError(f"{owner}: {name} has shape {tuple(vec.shape)}, "
                       f"expected {(hidden,)}")
  t = tiles or default_tiles(save_activations, write_d_pre)
  fused = fused_forward or fused_backward
  if fused and (save_activations or not write_d_pre):
    raise ValueError(f"{owner}: fused_forward / fused_backward run with write_d_pre=True and "
                     "save_activations=False (the forms 'pallas_fused', "
                     "'pallas_fused_forward')")
  if fused and t.block_nodes % t.fused_nodes:
    raise ValueError(f"{owner}: tiles.fused_nodes={t.fused_nodes} must divide "
                     f"tiles.block_nodes={t.block_nodes} (the backward's node tiles set the "
                     "padded length)")
  for name, value in dataclasses.asdict(t).items():
    if name not in ("warps", "fused_warps") and (value < 1 or value & (value - 1)):
      raise ValueError(f"{owner}: tiles.{name} must be a power of two, got {value}")
  if interpret is None:
    interpret = pallas_backend.default_interpret("gcn_pallas", "the fused GCN kernels run",
                                                 "gcn_kernel='xla'", stacklevel=3)
  if not interpret:
    for name in ("block_nodes", "block_hidden", "block_edges"):
      if getattr(t, name) < 16:  # Triton's dots want >= 16 on every side
        raise ValueError(f"{owner}: on a GPU tiles.{name} must be >= 16, "
                         f"got {getattr(t, name)}")
    for name in ("warps", "fused_warps"):
      if getattr(t, name) < 1 or getattr(t, name) & (getattr(t, name) - 1):
        raise ValueError(f"{owner}: tiles.{name} must be a power of two, "
                         f"got {getattr(t, name)}")
    kp = int(pl.next_power_of_2(max(neighbor_ids.shape[2], 1)))
    if fused and t.fused_nodes * kp < 16:  # the fused kernel's edge product's rows
      raise ValueError(f"{owner}: on a GPU tiles.fused_nodes x the padded slots ({kp}) must "
                       f"be >= 16, got fused_nodes={t.fused_nodes}")
  return Config(nodes=nodes, slots=slots, features=features, hidden=hidden,
                block_nodes=t.block_nodes, block_hidden=t.block_hidden,
                block_edges=t.block_edges, warps=t.warps, interpret=bool(interpret),
                bf16=from_self.dtype == jnp.bfloat16, save_activations=bool(save_activations),
                write_d_pre=bool(write_d_pre) and not save_activations,
                fused_forward=bool(fused_forward), fused_backward=bool(fused_backward),
                fused_nodes=t.fused_nodes, fused_warps=t.fused_warps)
