"""The fused forms' kernel bodies (`GCNLayer(kernel="pallas_fused")`, `"pallas_fused_forward"`):
a program takes `BLf = Config.fused_nodes` nodes' edge rows (`BLf * Kp`, 16 by default, the
least Triton's dots take) by all of the hidden width, walked in static chunks of `BH`, and
keeps what it evaluated in registers until the softmax over each node's slots (forward)
or its backward has what it needs: each edge element's GELU evaluated once a kernel, where
the recomputing forms evaluate it in two kernels with an XLA softmax between them. The
pieces they share with the other forms (`dot`, GELU, the target side's sum) are in
`flaxdoc.nn.gcn_pallas_kernels`; the `pallas_call`s in `flaxdoc.nn.gcn_pallas_calls`.
Counted for sm_90 in docs/accelerators.md, session 16; not yet timed on a GPU.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from flaxdoc.nn import gcn_pallas_kernels as gk

F32 = jnp.float32


def _chunk_pre(cfg, s_ref, n_ref, tgt, e_rows, we_ref, cols):
  """The pre-activation of the program's edge rows in hidden chunk `cols` (`[BLf * Kp, BH]`;
  as `gcn_pallas_kernels._pre`, from refs covering all of `Hp`)."""
  return (gk.per_edge(cfg, s_ref[:, cols].astype(F32)) + n_ref[tgt, cols].astype(F32)
          + gk.dot(cfg, e_rows, we_ref[:, cols]))


def fused_forward_kernel(cfg, s_ref, n_ref, tgt_ref, e_ref, we_ref, v_ref, mask_ref, out_ref,
                         a_ref):
  """The whole forward of `BLf = cfg.fused_nodes` nodes in one program: each edge row's
  `x` is evaluated once, over all of `H`, kept (in the inputs' dtype: the pooled sum takes
  it so either way) while the scores complete, the softmax over the node's slots taken
  here, and the pooled vectors summed from the kept `x`. The recomputing forward
  evaluates `x` twice (scores, then pooling: the pooling weights need every hidden
  unit's share of the score) with an XLA softmax between the two kernels.

  The program walks `H` in static chunks of `BH`; `x` of all chunks stays live (`BLf * Kp`
  rows x `Hp`, in registers), so `BLf` is small: 2 by default, 16 rows, the least Triton's
  edge product takes (`bench.kernel_sass`, sm_90, FormNet-A2's sizes, 8 warps: 104
  registers, no spill, 31.6 instructions an edge element where the scores and pooling
  kernels take 23.5 + 24.6; 4 warps spill). Scores sum `x . v` in float32 as
  `gcn_pallas_kernels.edge_dot_kernel` does; the pooled sum is `pool_kernel`'s product,
  `x` and the weights as operands in the inputs' dtype. Writes the program's `BLf` rows of
  the pooled `[Lp, Hp]` (under a mask, `_pooled_rows`) and the weights `[BLf * Kp]` (the
  backward's residual).
  """
  bl, kp, bh = cfg.fused_nodes, cfg.padded_slots, cfg.block_hidden
  keep = jnp.bfloat16 if cfg.bf16 else F32
  tgt, e_rows = tgt_ref[...], e_ref[...]
  kept, partial = [], jnp.zeros((bl * kp, bh), F32)
  for c in range(cfg.hidden_chunks):
    cols = pl.ds(c * bh, bh)
    x = gk.gelu(_chunk_pre(cfg, s_ref, n_ref, tgt, e_rows, we_ref, cols), cfg.interpret)
    # The score's sum over H: one multiply-add an element here, one sum across the row's
    # threads at the end (not one per chunk).
    partial = partial + x * v_ref[cols].astype(F32)[None, :]
    kept.append(x.astype(keep))
  score = jnp.sum(partial, axis=1)  # [BLf * Kp]
  a = gk.slot_softmax(score.reshape(bl, kp), mask_ref[...].reshape(bl, kp) != 0)  # [BLf, Kp]
  a = a.reshape(bl * kp)
  a_ref[...] = a
  # The pooled sum as a 16-row product, only this program's rows stored (`_pooled_rows`).
  picks, mine, start = _pooled_rows(cfg, a)
  for c, x in enumerate(kept):
    pooled = gk.dot(cfg, picks, x)  # [16, BH]
    plgpu.store(out_ref.at[pl.ds(start, picks.shape[0]), pl.ds(c * bh, bh)],
                pooled.astype(out_ref.dtype), mask=mine)


def _pooled_rows(cfg, weights):
  """The fused kernels' per-node sums as products of 16 rows (the least Triton's dots
  take; `BLf` if more): `(picks [rows, BLf * Kp], mask [rows, BH], start)`. Row `r` of
  `picks @ edge_rows` is node `start + r` of the row, `weights` (`[BLf * Kp]`, or None
  for ones) on its edges if it is one of this program's `BLf` nodes, else zero; `mask`
  marks those rows, the only ones stored (at rows `start ...` of the row's whole
  `[Lp, ...]` output). `start` keeps the window inside `Lp` at the row's end, so no store
  is out of range, even masked (the interpreter clamps a window that would be)."""
  bl, kp, bh = cfg.fused_nodes, cfg.padded_slots, cfg.block_hidden
  rows = min(max(16, bl), cfg.padded_nodes)  # every one of the program's BLf nodes
  first = pl.program_id(1) * bl
  start = jnp.minimum(first, cfg.padded_nodes - rows)
  node = lax.broadcasted_iota(jnp.int32, (rows, bl * kp), 0) + (start - first)  # tile's 0..BLf
  mine = lax.broadcasted_iota(jnp.int32, (rows, bl * kp), 1) // kp == node
  picks = mine.astype(F32) if weights is None else jnp.where(mine, weights[None, :], 0.0)
  row_node = lax.broadcasted_iota(jnp.int32, (rows, bh), 0) + (start - first)
  return picks, (row_node >= 0) & (row_node < bl), start


def fused_backward_kernel(cfg, s_ref, n_ref, tgt_ref, e_ref, we_ref, v_ref, a_ref, dw_ref,
                          dp_ref, d_self_ref, d_v_ref, d_pre_ref):
  """The backward's node side of `BLf = cfg.fused_nodes` nodes in one program, after the
  fused forward: `d a`, the softmax's backward, `d pre` (written for the target side), `d S`
  and this program's partial sum of `d v`.

  As the forward, the program walks all of `H` in chunks of `BH`, evaluating each element's
  GELU and slope once and keeping both (in the inputs' dtype, as `pallas_saved` keeps them
  between forward and backward) while `d a = x . dP` completes; then the softmax's
  backward over the node's slots, and from what it kept, per chunk, `d pre = (a dP + ds v)
  gelu'(pre)`, its per-node sum `d S` and `d v = sum_e ds x` (16-row products, as
  `gcn_pallas_kernels._store_source_grads`). `d [We; b1]` is summed by the target side,
  which reads every `d pre` row anyway (`gcn_pallas_kernels.sum_by_target`): here it would
  be a `[Fp, Hp]` partial sum for every 2 nodes. The recomputing backward evaluates each
  element twice, in two kernels, with the softmax's backward in XLA between them.
  """
  bl, kp, bh = cfg.fused_nodes, cfg.padded_slots, cfg.block_hidden
  keep = jnp.bfloat16 if cfg.bf16 else F32
  tgt, e_rows = tgt_ref[...], e_ref[...]

  def dp_rows(cols):  # the pooled gradient of each edge's source node, [BLf * Kp, BH]
    return gk.per_edge(cfg, dp_ref[:, cols].astype(F32))

  xs, slopes, partial = [], [], jnp.zeros((bl * kp, bh), F32)
  for c in range(cfg.hidden_chunks):
    cols = pl.ds(c * bh, bh)
    x, slope = gk.gelu_and_grad(_chunk_pre(cfg, s_ref, n_ref, tgt, e_rows, we_ref, cols),
                                cfg.interpret)
    partial = partial + x * dp_rows(cols)
    xs.append(x.astype(keep))
    slopes.append(slope.astype(keep))
  a = a_ref[...]
  d_a = (jnp.sum(partial, axis=1) + dw_ref[...]).reshape(bl, kp)
  ds = gk.slot_softmax_grad(a.reshape(bl, kp), d_a).reshape(bl * kp)
  ones, mine, start = _pooled_rows(cfg, None)
  ds_row = gk.ds_rows(ds)  # `d v = ds . x` as row 0 of a 16-row product, once for all chunks
  for c, (x, slope) in enumerate(zip(xs, slopes)):
    cols = pl.ds(c * bh, bh)
    d_pre = gk.d_hidden(a, ds, dp_rows(cols), v_ref[cols]) * slope.astype(F32)
    d_pre_ref[:, cols] = d_pre.astype(d_pre_ref.dtype)
    plgpu.store(d_self_ref.at[pl.ds(start, ones.shape[0]), cols],
                gk.dot(cfg, ones, d_pre).astype(d_self_ref.dtype), mask=mine)
    d_v_ref[cols] = jnp.sum(gk.dot(cfg, ds_row, x), axis=0)


def fused_target_grad_kernel(cfg, bounds_ref, order_ref, tgt_ref, e_ref, d_pre_ref, d_nb_ref,
                             d_we_ref):
  """`d N` per target tile, summing the written `d pre` rows, and the tile's partial sum of
  `d [We; b1]` (the fused backward's; `gcn_pallas_kernels.sum_by_target`)."""
  gk.sum_by_target(cfg, bounds_ref, order_ref, tgt_ref, lambda edge, tgt: d_pre_ref[edge, :],
                 d_nb_ref, e_ref, d_we_ref)
