"""The `pallas_call`s of `flaxdoc.nn.gcn_pallas`: operands, BlockSpecs, grids, outputs.

`gcn_pallas` ties these into the message attention's custom VJP; the kernel bodies are
in `flaxdoc.nn.gcn_pallas_kernels` and `flaxdoc.nn.gcn_pallas_fused`. Everything here
works on the kernels' layout: node arrays padded to whole tiles (`[B, Lp, Hp]`, `[S | N]`
as one `[B, Lp, 2 Hp]` array), edge arrays flattened to rows `node * Kp + slot`
(`prepare`), on a grid of (batch row, node tile, hidden chunk), or (batch row, node tile)
for the fused kernels, each program over all of `Hp`. Besides the layout helpers
(`pad_nodes`, `prepare`, `prepare_edges`), each function is one kernel launch (or, for
the softmax, the small XLA op between two), forward or backward, recomputing or reading
saved activations.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from flaxdoc.nn import gcn_pallas_fused as fused_kernels
from flaxdoc.nn import gcn_pallas_kernels as kernels

F32 = jnp.float32


# --------------------------------------------------------------------------- layout
def pad_nodes(cfg, x):
  """`[B, L, H]` -> `[B, Lp, Hp]`, zeros in the padding (the kernels' node layout)."""
  return jnp.pad(x, [(0, 0), (0, cfg.padded_nodes - cfg.nodes),
                     (0, cfg.padded_hidden - cfg.hidden)])


def prepare(cfg, sn, edges, ids, mask, we, b1, v):
  """The kernels' operands: `sn = [S | N]` as given (already `[B, Lp, 2 Hp]`), the edge
  arrays padded (nodes to whole tiles, slots to `Kp`, `F` to `Fp`) and flattened to rows
  `node * Kp + slot`, the vectors padded to `Hp` (`prepare_edges`)."""
  return dict(prepare_edges(cfg, edges, ids, mask, we, b1, v), sn=sn)


def prepare_edges(cfg, edges, ids, mask, we, b1, v):
  """`prepare` without the node parts (all the saved backward needs). The bias joins the
  edge product: each real edge's features get a 1 in column `F`, and `we` gets `b1` in
  row `F`."""
  batch = edges.shape[0]
  lp, kp, fp, hp = cfg.padded_nodes, cfg.padded_slots, cfg.padded_features, cfg.padded_hidden
  dl, dk, df, dh = lp - cfg.nodes, kp - cfg.slots, fp - cfg.features, hp - cfg.hidden
  mask = jnp.pad(mask, [(0, 0), (0, dl), (0, dk)])
  ids = jnp.clip(jnp.pad(ids, [(0, 0), (0, dl), (0, dk)]), 0, cfg.nodes - 1)
  tgt = jnp.where(mask, ids, 0)  # every id in range: the kernels gather with it
  ones = jnp.ones(edges.shape[:3] + (1,), edges.dtype)
  e = jnp.pad(jnp.concatenate([edges, ones], axis=-1), [(0, 0), (0, dl), (0, dk), (0, df - 1)])
  e = jnp.where(mask[..., None], e, 0)
  dtype = jnp.bfloat16 if cfg.bf16 else F32
  return dict(
      mask=mask.reshape(batch, cfg.rows), tgt=tgt.reshape(batch, cfg.rows).astype(jnp.int32),
      e=e.reshape(batch, cfg.rows, fp).astype(dtype),
      we=jnp.pad(jnp.concatenate([we, b1[None, :]]), [(0, df - 1), (0, dh)]),
      v=jnp.pad(v, [(0, dh)]))


def _specs(cfg):
  bl, bh, br, fp = cfg.block_nodes, cfg.block_hidden, cfg.block_rows, cfg.padded_features
  lp, rows, chunks = cfg.padded_nodes, cfg.rows, cfg.hidden_chunks
  return dict(
      # `S` (and node arrays of width Hp: the pooled sum, its gradient) ...
      node_tile=pl.BlockSpec((None, bl, bh), lambda b, i, c: (b, i, c)),
      all_nodes=pl.BlockSpec((None, lp, bh), lambda b, i, c: (b, 0, c)),
      # ... and `N`, the second half of `[S | N]` (and of its gradient)
      neighbour_tile=pl.BlockSpec((None, bl, bh), lambda b, i, c: (b, i, c + chunks)),
      all_neighbours=pl.BlockSpec((None, lp, bh), lambda b, i, c: (b, 0, c + chunks)),
      edge_tile=pl.BlockSpec((None, br), lambda b, i, c: (b, i)),
      all_edges=pl.BlockSpec((None, rows), lambda b, i, c: (b, 0)),
      edge_feature_tile=pl.BlockSpec((None, br, fp), lambda b, i, c: (b, i, 0)),
      all_edge_features=pl.BlockSpec((None, rows, fp), lambda b, i, c: (b, 0, 0)),
      we=pl.BlockSpec((fp, bh), lambda b, i, c: (0, c)),
      chunk=pl.BlockSpec((bh,), lambda b, i, c: (c,)),
      # per-chunk partial sums over H of edge rows, [B, chunks, rows] (summed in XLA)
      chunk_sums=pl.BlockSpec((None, None, br), lambda b, i, c: (b, c, i)),
      edge_rows=pl.BlockSpec((None, br, bh), lambda b, i, c: (b, i, c)),  # saved [B, rows, Hp]
      all_edge_rows=pl.BlockSpec((None, rows, bh), lambda b, i, c: (b, 0, c)),
  )


def _launch(cfg, kernel, grid, in_specs, out_specs, out_shape, name, warps, stages,
            input_output_aliases=None):
  """A `pallas_call` in the interpreter, or with Triton's warps and stages on a GPU."""
  kwargs = {"input_output_aliases": input_output_aliases} if input_output_aliases else {}
  if not cfg.interpret:
    from jax.experimental.pallas import triton as plgpu  # pylint: disable=import-outside-toplevel
    kwargs["compiler_params"] = plgpu.CompilerParams(num_warps=warps, num_stages=stages)
  return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs,
                        out_shape=out_shape, interpret=cfg.interpret, name=name, **kwargs)


def _call(cfg, batch, kernel, in_specs, out_specs, out_shape, name, input_output_aliases=None):
  """One `pallas_call` over the grid (batch, node tiles, hidden chunks)."""
  return _launch(cfg, kernel, (batch, cfg.node_tiles, cfg.hidden_chunks), in_specs, out_specs,
                 out_shape, name, cfg.warps, 2, input_output_aliases)


def edge_dot(cfg, x, u, per_node_u):
  """`sum_h x[e, h] u[h]` for every edge row: `[B, rows]` (float32)."""
  batch, sp = x["sn"].shape[0], _specs(cfg)
  out = _call(cfg, batch, functools.partial(kernels.edge_dot_kernel, cfg, per_node_u),
              [sp["node_tile"], sp["all_neighbours"], sp["edge_tile"], sp["edge_feature_tile"],
               sp["we"], sp["node_tile"] if per_node_u else sp["chunk"]],
              sp["chunk_sums"],
              jax.ShapeDtypeStruct((batch, cfg.hidden_chunks, cfg.rows), F32),
              "gcn_edge_dot")(x["sn"], x["sn"], x["tgt"], x["e"], x["we"], u)
  return out.sum(axis=1)


def softmax(cfg, scores, mask):
  """Softmax over each node's valid slots; zeros for a node without one. `[B, rows]`."""
  batch, kp = scores.shape[0], cfg.padded_slots
  weights = kernels.slot_softmax(scores.reshape(batch, -1, kp), mask.reshape(batch, -1, kp))
  return weights.reshape(batch, cfg.rows)


def pool(cfg, x, a, out_dtype):
  batch, sp = x["sn"].shape[0], _specs(cfg)
  return _call(cfg, batch, functools.partial(kernels.pool_kernel, cfg),
               [sp["node_tile"], sp["all_neighbours"], sp["edge_tile"], sp["edge_feature_tile"],
                sp["we"], sp["edge_tile"]],
               sp["node_tile"],
               jax.ShapeDtypeStruct((batch, cfg.padded_nodes, cfg.padded_hidden), out_dtype),
               "gcn_pool")(x["sn"], x["sn"], x["tgt"], x["e"], x["we"], a)


def _fused_specs(cfg):
  """BlockSpecs of the fused kernels' grid (batch row, tile of `cfg.fused_nodes` nodes),
  each program over all of `Hp`."""
  bl, lp, hp, fp = cfg.fused_nodes, cfg.padded_nodes, cfg.padded_hidden, cfg.padded_features
  br = bl * cfg.padded_slots
  return dict(
      node_tile=pl.BlockSpec((None, bl, hp), lambda b, i: (b, i, 0)),  # S, the pooled grad
      all_nodes=pl.BlockSpec((None, lp, hp), lambda b, i: (b, 0, 0)),  # written 16 rows a time
      all_neighbours=pl.BlockSpec((None, lp, hp), lambda b, i: (b, 0, 1)),  # `[S | N]`'s N
      edge_tile=pl.BlockSpec((None, br), lambda b, i: (b, i)),
      edge_feature_tile=pl.BlockSpec((None, br, fp), lambda b, i: (b, i, 0)),
      edge_rows=pl.BlockSpec((None, br, hp), lambda b, i: (b, i, 0)),
      we=pl.BlockSpec((fp, hp), lambda b, i: (0, 0)),
      vector=pl.BlockSpec((hp,), lambda b, i: (0,)),
      tile_vector=pl.BlockSpec((None, None, hp), lambda b, i: (b, i, 0)))


def _fused_call(cfg, batch, kernel, in_specs, out_specs, out_shape, name):
  """One fused kernel's `pallas_call` over the grid (batch, node tiles of `fused_nodes`)."""
  return _launch(cfg, functools.partial(kernel, cfg), (batch, cfg.fused_tiles), in_specs,
                 out_specs, out_shape, name, cfg.fused_warps, 1)


def _fused_we(cfg, x):
  """Every fused program reads all of `[We; b1]`: in bfloat16 where the edge product takes
  it so anyway (`kernels.dot`), half the bytes."""
  return x["we"].astype(jnp.bfloat16) if cfg.bf16 else x["we"]


def fused_forward(cfg, x, out_dtype):
  """`(pooled [B, Lp, Hp], weights [B, rows])` in one kernel (`cfg.fused_nodes` nodes x all
  of `Hp` a program; `gcn_pallas_fused.fused_forward_kernel`), on a grid of (batch row,
  node tile)."""
  batch, sp = x["sn"].shape[0], _fused_specs(cfg)
  return _fused_call(
      cfg, batch, fused_kernels.fused_forward_kernel,
      [sp["node_tile"], sp["all_neighbours"], sp["edge_tile"], sp["edge_feature_tile"],
       sp["we"], sp["vector"], sp["edge_tile"]],
      [sp["all_nodes"], sp["edge_tile"]],
      [jax.ShapeDtypeStruct((batch, cfg.padded_nodes, cfg.padded_hidden), out_dtype),
       jax.ShapeDtypeStruct((batch, cfg.rows), F32)], "gcn_fused_forward")(
           x["sn"], x["sn"], x["tgt"], x["e"], _fused_we(cfg, x), x["v"],
           x["mask"].astype(jnp.int32))


def fused_backward(cfg, x, a, d_weights, dp):
  """The backward's node side in one kernel (`gcn_pallas_fused.fused_backward_kernel`):
  `(d [S | N] with only d S written, d v partials [B, tiles, Hp], d pre [B, rows, Hp])`.
  `d_weights`: the weights' cotangent as rows `[B, rows]` (float32)."""
  batch, sp, dtype = x["sn"].shape[0], _fused_specs(cfg), x["sn"].dtype
  lp, hp = cfg.padded_nodes, cfg.padded_hidden
  return _fused_call(
      cfg, batch, fused_kernels.fused_backward_kernel,
      [sp["node_tile"], sp["all_neighbours"], sp["edge_tile"], sp["edge_feature_tile"],
       sp["we"], sp["vector"], sp["edge_tile"], sp["edge_tile"], sp["node_tile"]],
      [sp["all_nodes"], sp["tile_vector"], sp["edge_rows"]],
      [jax.ShapeDtypeStruct((batch, lp, 2 * hp), dtype),
       jax.ShapeDtypeStruct((batch, cfg.fused_tiles, hp), F32),
       jax.ShapeDtypeStruct((batch, cfg.rows, hp), dtype)], "gcn_fused_backward")(
           x["sn"], x["sn"], x["tgt"], x["e"], _fused_we(cfg, x), x["v"], a, d_weights, dp)


def _source_out_specs(cfg):
  """`d S` per node tile; per-tile partial sums of `d v` and `d [We; b1]`."""
  return [_specs(cfg)["node_tile"],
          pl.BlockSpec((None, None, cfg.block_hidden), lambda b, i, c: (b, i, c)),
          pl.BlockSpec((None, None, cfg.padded_features, cfg.block_hidden),
                       lambda b, i, c: (b, i, 0, c))]


def _source_out_shapes(cfg, batch, dtype):
  """`d [S | N]` with `d S` written (in the inputs' dtype, rounded once, in the kernel,
  from float32 sums) and `d N` left for the target side (`_writing_d_n`); the partial
  sums in float32."""
  nt, fp, hp = cfg.node_tiles, cfg.padded_features, cfg.padded_hidden
  return [jax.ShapeDtypeStruct((batch, cfg.padded_nodes, 2 * hp), dtype),
          jax.ShapeDtypeStruct((batch, nt, hp), F32),
          jax.ShapeDtypeStruct((batch, nt, fp, hp), F32)]


def source_grads(cfg, x, a, ds, dp):
  """`(d [S | N] with only d S written, d v partials, d [We; b1] partials)`, and `d pre`
  `[B, rows, Hp]` with `cfg.write_d_pre`; the target side writes `d N` (`_writing_d_n`)."""
  batch, sp, dtype = x["sn"].shape[0], _specs(cfg), x["sn"].dtype
  d_pre = [jax.ShapeDtypeStruct((batch, cfg.rows, cfg.padded_hidden), dtype)]
  return _call(cfg, batch, functools.partial(kernels.source_grad_kernel, cfg),
               [sp["node_tile"], sp["all_neighbours"], sp["edge_tile"], sp["edge_feature_tile"],
                sp["we"], sp["chunk"], sp["edge_tile"], sp["edge_tile"], sp["node_tile"]],
               _source_out_specs(cfg) + [sp["edge_rows"]] * cfg.write_d_pre,
               _source_out_shapes(cfg, batch, dtype) + d_pre * cfg.write_d_pre,
               "gcn_backward_source_writing" if cfg.write_d_pre else "gcn_backward_source")(
                   x["sn"], x["sn"], x["tgt"], x["e"], x["we"], x["v"], a, ds, dp)


def _by_target(cfg, x):
  """`(bounds [B, tiles + 1], order [B, rows + BE])`: each row's edges sorted by target,
  and where each target tile's in-edges start (`kernels.sum_by_target`)."""
  lp, bl, be = cfg.padded_nodes, cfg.block_nodes, cfg.block_edges
  key = jnp.where(x["mask"], x["tgt"], lp)  # masked edges sort last, into no tile
  order = jnp.argsort(key, axis=-1, stable=True).astype(jnp.int32)  # [B, rows]
  sorted_key = jnp.take_along_axis(key, order, axis=-1)
  bounds = jax.vmap(lambda k: jnp.searchsorted(k, jnp.arange(0, lp + 1, bl), side="left"))(
      sorted_key).astype(jnp.int32)  # [B, tiles + 1]
  return bounds, jnp.pad(order, [(0, 0), (0, be)])  # a step may read up to BE past the end


def _by_target_specs(cfg):
  return [pl.BlockSpec((None, cfg.node_tiles + 1), lambda b, i, c: (b, 0)),
          pl.BlockSpec((None, cfg.rows + cfg.block_edges), lambda b, i, c: (b, 0))]


def _writing_d_n(kernel):
  """A target-side kernel that takes `d [S | N]` as its last input, aliased to its output,
  and writes only the `d N` half (`neighbour_tile`): `d S`, which the source side wrote,
  stays. So `d [S | N]` comes out as one array, the gradient of the one product
  `h @ [Ws | Wn]` (`gcn_pallas.message_attention`), and neither half is copied into it."""
  return lambda *refs: kernel(*refs[:-2], refs[-1])


def target_grads(cfg, x, a, ds, dp, d_sn):
  """`d [S | N]` with `d N` written by target tile, from the row's edges sorted by target
  (see the kernel)."""
  batch, sp = x["sn"].shape[0], _specs(cfg)
  bounds, order = _by_target(cfg, x)
  inputs = (bounds, order, x["sn"], x["sn"], x["tgt"], x["e"], x["we"], x["v"], a, ds, dp, d_sn)
  return _call(cfg, batch, _writing_d_n(functools.partial(kernels.target_grad_kernel, cfg)),
               _by_target_specs(cfg) + [
                   sp["all_nodes"], sp["all_neighbours"], sp["all_edges"],
                   sp["all_edge_features"], sp["we"], sp["chunk"], sp["all_edges"],
                   sp["all_edges"], sp["all_nodes"], sp["neighbour_tile"]],
               sp["neighbour_tile"], jax.ShapeDtypeStruct(d_sn.shape, d_sn.dtype),
               "gcn_backward_target", {len(inputs) - 1: 0})(*inputs)


# --------------------------------------------------------------------------- saved activations
def saving_scores(cfg, x):
  """The forward scores `[B, rows]` (float32), and every edge row's `x` and GELU slope
  `[B, rows, Hp]` in the inputs' dtype."""
  batch, sp = x["sn"].shape[0], _specs(cfg)
  saved = jax.ShapeDtypeStruct((batch, cfg.rows, cfg.padded_hidden), x["sn"].dtype)
  scores, hidden, slope = _call(
      cfg, batch, functools.partial(kernels.saving_scores_kernel, cfg),
      [sp["node_tile"], sp["all_neighbours"], sp["edge_tile"], sp["edge_feature_tile"], sp["we"],
       sp["chunk"]],
      [sp["chunk_sums"],
       sp["edge_rows"], sp["edge_rows"]],
      [jax.ShapeDtypeStruct((batch, cfg.hidden_chunks, cfg.rows), F32), saved, saved],
      "gcn_saving_scores")(x["sn"], x["sn"], x["tgt"], x["e"], x["we"], x["v"])
  return scores.sum(axis=1), hidden, slope


def saved_pool(cfg, hidden, a, out_dtype):
  batch, sp = hidden.shape[0], _specs(cfg)
  return _call(cfg, batch, functools.partial(kernels.saved_pool_kernel, cfg),
               [sp["edge_rows"], sp["edge_tile"]], sp["node_tile"],
               jax.ShapeDtypeStruct((batch, cfg.padded_nodes, cfg.padded_hidden), out_dtype),
               "gcn_saved_pool")(hidden, a)


def saved_edge_dot(cfg, hidden, dp):
  """`sum_h x[e, h] dp[src(e), h]` for every edge row: `[B, rows]` (float32)."""
  batch, sp = hidden.shape[0], _specs(cfg)
  out = _call(cfg, batch, functools.partial(kernels.saved_edge_dot_kernel, cfg),
              [sp["edge_rows"], sp["node_tile"]],
              sp["chunk_sums"],
              jax.ShapeDtypeStruct((batch, cfg.hidden_chunks, cfg.rows), F32),
              "gcn_saved_edge_dot")(hidden, dp)
  return out.sum(axis=1)


def saved_source_grads(cfg, x, hidden, slope, a, ds, dp):
  """As `source_grads` from the saved `x` and slope, `d pre` always written."""
  batch, sp = hidden.shape[0], _specs(cfg)
  return _call(cfg, batch, functools.partial(kernels.saved_source_grad_kernel, cfg),
               [sp["edge_rows"], sp["edge_rows"], sp["edge_feature_tile"], sp["chunk"],
                sp["edge_tile"], sp["edge_tile"], sp["node_tile"]],
               _source_out_specs(cfg) + [sp["edge_rows"]],
               _source_out_shapes(cfg, batch, hidden.dtype) + [
                   jax.ShapeDtypeStruct((batch, cfg.rows, cfg.padded_hidden), hidden.dtype)],
               "gcn_saved_backward_source")(hidden, slope, x["e"], x["v"], a, ds, dp)


def fused_target_grads(cfg, x, d_pre, d_sn):
  """`(d [S | N] with d N written, d [We; b1] partials [B, tiles, Fp, Hp])`: the written
  `d pre` rows summed by target, and `e^T d pre` over each target tile's in-edges."""
  batch, sp = d_pre.shape[0], _specs(cfg)
  bounds, order = _by_target(cfg, x)
  inputs = (bounds, order, x["tgt"], x["e"], d_pre, d_sn)
  d_we_spec = pl.BlockSpec((None, None, cfg.padded_features, cfg.block_hidden),
                           lambda b, i, c: (b, i, 0, c))
  return _call(cfg, batch,
               lambda *refs: fused_kernels.fused_target_grad_kernel(cfg, *refs[:5], *refs[6:]),
               _by_target_specs(cfg) + [sp["all_edges"], sp["all_edge_features"],
                                        sp["all_edge_rows"], sp["neighbour_tile"]],
               [sp["neighbour_tile"], d_we_spec],
               [jax.ShapeDtypeStruct(d_sn.shape, d_sn.dtype),
                jax.ShapeDtypeStruct((batch, cfg.node_tiles, cfg.padded_features,
                                      cfg.padded_hidden), F32)],
               "gcn_fused_backward_target", {len(inputs) - 1: 0})(*inputs)


def saved_target_grads(cfg, x, d_pre, d_sn):
  """`d [S | N]` with `d N` written, summing the written `d pre` rows (`_writing_d_n`)."""
  batch, sp = d_pre.shape[0], _specs(cfg)
  bounds, order = _by_target(cfg, x)
  inputs = (bounds, order, x["tgt"], d_pre, d_sn)
  return _call(cfg, batch,
               _writing_d_n(functools.partial(kernels.saved_target_grad_kernel, cfg)),
               _by_target_specs(cfg) + [sp["all_edges"], sp["all_edge_rows"],
                                        sp["neighbour_tile"]],
               sp["neighbour_tile"], jax.ShapeDtypeStruct(d_sn.shape, d_sn.dtype),
               "gcn_saved_backward_target", {len(inputs) - 1: 0})(*inputs)
