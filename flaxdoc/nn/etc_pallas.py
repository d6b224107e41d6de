r"""ETC's long queries with Rich Attention as one fused Pallas kernel, forward and backward.

`flaxdoc.nn.etc_attention.global_local_attention` builds ETC's long-query scores as
XLA arrays: blocked keys `[B, nb, 3b, H, D]` (copies), logits `[B, nb, H, b, 3b + G]`
in float32, Rich Attention's pairwise terms per axis, a mask, a softmax and dropout,
each a pass over memory, forward and again backward. On an H100 that is 47% of a
FormNet-A2 pre-training step's kernel time (docs/accelerators.md). This module computes
the same thing flash-attention style: for each query tile of `BQ` long queries and one
head, the keys of its window `[i0 - r, i0 + BQ - 1 + r]` are visited in tiles of
`BK`, and for each tile the kernel forms `q.k / sqrt(D)`, adds Rich Attention from
the per-token scalars, masks, and folds the tile into an online softmax; the `G`
global keys are one more tile. Nothing pairwise is written to memory. The backward
recomputes the scores (FlashAttention-2): one kernel per query tile (`dq`, the query
side of Rich, `d theta`, the global keys' `dk`/`dv` as per-tile partial sums) and one
per key tile (`dk`, `dv`, the key side of Rich).

What it computes (DESIGN §3.1-3.2), for long query `i` and key `j`:

    logit_ij = q_i.k_j / sqrt(D) + sum_a [log_sigmoid(+-(oq_ia + ok_ja))
                                          - theta_a^2 / 2 (ln(1 + |c_ia - c_ja|) - dq_ia - dk_ja)^2]

over the keys with `|i - j| <= r` of the same document (ETC's three blocks masked to the
radius are exactly this window, because the block length is `r + 1`), plus the global
keys of the query's document without a Rich term; one softmax; dropout on the weights;
the weighted values. `+` when `c_ia < c_ja`. Masked rows give zeros.

Dropout draws its keep mask from a counter hash of `(seed, batch row, head, query, key)`
(murmur3's finaliser), so the backward kernels regenerate it instead of storing it.
It is a different random stream from the XLA path's (`flaxdoc.nn.dropout`, which hashes
`(seed, row, column)` of the weights' array): both are inverted dropout at the same rate
(`dropout_keep` is the kernels' hash in `jnp`).

The kernel bodies are in `flaxdoc.nn.etc_pallas_kernels`; this module lays out their
inputs, calls them and ties them into a custom VJP. They run on GPUs through Pallas'
Triton backend; elsewhere (CPU tests) with `interpret=True`. ETC's relative position ids
and layout terms other than Rich Attention are not supported here
(`EtcAttention(kernel="pallas")` says so).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from flaxdoc.nn import batch_parallel
from flaxdoc.nn import etc_pallas_kernels as kernels
from flaxdoc.nn import pallas_backend
# Re-exported: the tests build references with the same dropout hash.
from flaxdoc.nn.etc_pallas_kernels import (GLOBAL_KEY_ID, INVALID_KEY, INVALID_QUERY, Config,
                                           dropout_keep)

__all__ = ["DEFAULT_TILES", "GLOBAL_KEY_ID", "INVALID_KEY", "INVALID_QUERY", "Config", "Tiles",
           "dropout_keep", "long_query_attention"]

Array = jax.Array
F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Tiles:
  """Tile sizes (powers of two, >= 16 on a GPU) and Triton warps, forward and backward.

  The backward holds more `[BQ, BK]` arrays at once (weights, their gradient, Rich's
  pieces), so it gets its own sizes: too many live tiles spill registers. The defaults
  are the fastest forward + backward of the four tilings `bench.etc_kernel` timed on an
  H100 with the kernels as they are (FormNet-A2's layer, 16 x 1,024 tokens, bf16;
  docs/accelerators.md, session 9; the sweep's other tilings were last timed with the older
  code, all slower then): 1.31 ms with 16-query tiles
  (a 16-row tile reads 192 keys where a 32-row one reads 224-256 for the 169 a query
  needs, and holds fewer registers: more resident warps), 1.53-1.62 ms with 32-row
  tiles; 64 x 64 backward tiles spill registers.
  """
  block_q: int = 16
  block_k: int = 64
  warps: int = 2
  backward_block_q: int = 16
  backward_block_k: int = 32
  backward_warps: int = 2


DEFAULT_TILES = Tiles()


# --------------------------------------------------------------------------- layout helpers
def _specs(cfg, head_dim, tiled_q: bool):
  """BlockSpecs for the kernels' inputs; `tiled_q`: one query tile per program (else all)."""
  bq, a, nq = cfg.block_q, cfg.padded_a, cfg.padded_q
  q_rows = bq if tiled_q else nq
  q_at = (lambda b, h, i: (b, i, h, 0)) if tiled_q else (lambda b, h, i: (b, 0, h, 0))
  q_vec = (lambda b, h, i: (b, h, i)) if tiled_q else (lambda b, h, i: (b, h, 0))
  q_ax = (lambda b, h, i: (b, h, 0, i)) if tiled_q else (lambda b, h, i: (b, h, 0, 0))
  q_cd = (lambda b, h, i: (b, 0, i)) if tiled_q else (lambda b, h, i: (b, 0, 0))
  q_doc = (lambda b, h, i: (b, i)) if tiled_q else (lambda b, h, i: (b, 0))
  lk, g = cfg.padded_k, cfg.padded_g
  return dict(
      seed=pl.BlockSpec((2,), lambda b, h, i: (0,)),  # (seed, global index of row 0)
      q=pl.BlockSpec((None, q_rows, None, head_dim), q_at),
      k=pl.BlockSpec((None, lk, None, head_dim), lambda b, h, i: (b, 0, h, 0)),
      g=pl.BlockSpec((None, g, None, head_dim), lambda b, h, i: (b, 0, h, 0)),
      qdoc=pl.BlockSpec((None, q_rows), q_doc),
      kdoc=pl.BlockSpec((None, lk), lambda b, h, i: (b, 0)),
      gdoc=pl.BlockSpec((None, g), lambda b, h, i: (b, 0)),
      q_axes=pl.BlockSpec((None, None, a, q_rows), q_ax),
      k_axes=pl.BlockSpec((None, None, a, lk), lambda b, h, i: (b, h, 0, 0)),
      q_coord=pl.BlockSpec((None, a, q_rows), q_cd),
      k_coord=pl.BlockSpec((None, a, lk), lambda b, h, i: (b, 0, 0)),
      theta=pl.BlockSpec((None, a), lambda b, h, i: (h, 0)),
      q_vec=pl.BlockSpec((None, None, q_rows), q_vec),
  )


def _call(cfg, kernel, grid, in_specs, out_specs, out_shape, name, input_output_aliases=None):
  kwargs = {"input_output_aliases": input_output_aliases} if input_output_aliases else {}
  if not cfg.interpret:
    from jax.experimental.pallas import triton as plgpu  # pylint: disable=import-outside-toplevel
    kwargs["compiler_params"] = plgpu.CompilerParams(num_warps=cfg.warps, num_stages=2)
  return pl.pallas_call(functools.partial(kernel, cfg), grid=grid, in_specs=in_specs,
                        out_specs=out_specs, out_shape=out_shape, interpret=cfg.interpret,
                        name=name, **kwargs)


def _rows_at(cfg, head_dim, offset, tiled_q: bool):
  """A BlockSpec for `[B, offset + Nq, H, D]` arrays whose long rows start at row `offset`
  (the context with the global rows first, and its gradient): one query tile a program,
  or all of them. Element-indexed, since `offset` (ETC's `G`, 1 for FormNet) is not a
  multiple of a tile."""
  if tiled_q:
    return pl.BlockSpec((None, pl.Element(cfg.block_q), None, head_dim),
                        lambda b, h, i: (b, offset + i * cfg.block_q, h, 0))
  return pl.BlockSpec((None, pl.Element(cfg.padded_q), None, head_dim),
                      lambda b, h, i: (b, offset, h, 0))


def _with_unread_input(kernel, outputs: int):
  """`kernel` given one more input, after its others, that it does not read: the buffer its
  first output is aliased to (so the rows it does not write keep their values)."""
  def wrapped(cfg, *refs):
    return kernel(cfg, *refs[:-outputs - 1], *refs[-outputs:])
  return wrapped


def _pad_right(x, axis, extra, value=0):
  """`x` with `extra` entries of `value` after the end of `axis` (`x` itself for none:
  not even a no-op pad in the lowered module)."""
  if not extra:
    return x
  return jnp.pad(x, [(0, extra) if d == axis else (0, 0) for d in range(x.ndim)],
                 constant_values=value)


def _prepare(cfg, q, k, v, kg, vg, oq, ok, dq, dk, theta, coords, long_doc, global_doc):
  """Pads everything to the kernels' layout (zeros / invalid documents in the padding):
  queries and keys to whole tiles, on the right, which is nothing at lengths that are
  multiples of the tiles (then `q`, `k`, `v` reach the kernels uncopied)."""
  n, nq, lk = cfg.length, cfg.padded_q, cfg.padded_k
  pad_q = lambda x, axis: _pad_right(x, axis, nq - n)  # noqa: E731
  pad_k = lambda x, axis: _pad_right(x, axis, lk - n)  # noqa: E731
  batch, heads = q.shape[0], q.shape[2]
  g, gp, a, ap = cfg.num_globals, cfg.padded_g, cfg.num_axes, cfg.padded_a
  pad_g = lambda x: jnp.pad(x, [(0, 0), (0, gp - g)] + [(0, 0)] * (x.ndim - 2))  # noqa: E731
  query_doc, key_doc = long_doc  # document ids, or INVALID_QUERY / INVALID_KEY
  if a:
    axes_pad = lambda x: jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, ap - a), (0, 0)])  # noqa: E731
    hq = lambda x: axes_pad(jnp.swapaxes(x, -1, -2))  # [B, H, N, A] -> [B, H, Ap, N]  # noqa: E731
    oq_, dq_ = pad_q(hq(oq), 3), pad_q(hq(dq), 3)
    ok_, dk_ = pad_k(hq(ok), 3), pad_k(hq(dk), 3)
    c = axes_pad(jnp.swapaxes(jnp.asarray(coords, F32), -1, -2))  # [B, Ap, N]
    cq, ck = pad_q(c, 2), pad_k(c, 2)
    th = jnp.pad(jnp.asarray(theta, F32), [(0, 0), (0, ap - a)])
  else:
    oq_ = dq_ = jnp.zeros((batch, heads, ap, nq), F32)
    ok_ = dk_ = jnp.zeros((batch, heads, ap, lk), F32)
    cq, ck = jnp.zeros((batch, ap, nq), F32), jnp.zeros((batch, ap, lk), F32)
    th = jnp.zeros((heads, ap), F32)
  return dict(
      q=pad_q(q, 1), k=pad_k(k, 1), v=pad_k(v, 1), kg=pad_g(kg), vg=pad_g(vg.astype(v.dtype)),
      qdoc=_pad_right(query_doc, 1, nq - n, INVALID_QUERY),
      kdoc=_pad_right(key_doc, 1, lk - n, INVALID_KEY),
      gdoc=jnp.pad(global_doc, [(0, 0), (0, gp - g)], constant_values=INVALID_KEY),
      oq=oq_, ok=ok_, dq=dq_, dk=dk_, cq=cq, ck=ck, theta=th)


# --------------------------------------------------------------------------- the kernel calls
def _forward(cfg, seed, x, context=None):
  """`(o, lse)`: `o` `[B, Nq, H, D]`, or, given `context` (`[B, G + Nq, H, D]`, the global
  rows first), that array with the long rows written after them, in place."""
  batch, _, heads, head_dim = x["q"].shape
  sp = _specs(cfg, head_dim, tiled_q=True)
  in_specs = [sp["seed"], sp["q"], sp["k"], sp["k"], sp["g"], sp["g"], sp["qdoc"], sp["kdoc"],
              sp["gdoc"], sp["q_axes"], sp["k_axes"], sp["q_axes"], sp["k_axes"], sp["q_coord"],
              sp["k_coord"], sp["theta"]]
  inputs = (seed, x["q"], x["k"], x["v"], x["kg"], x["vg"], x["qdoc"], x["kdoc"], x["gdoc"],
            x["oq"], x["ok"], x["dq"], x["dk"], x["cq"], x["ck"], x["theta"])
  lse_shape = jax.ShapeDtypeStruct((batch, heads, cfg.padded_q), F32)
  if context is None:
    return _call(cfg, kernels.forward_kernel, (batch, heads, cfg.q_tiles), in_specs,
                 [sp["q"], sp["q_vec"]],
                 [jax.ShapeDtypeStruct(x["q"].shape, x["v"].dtype), lse_shape],
                 "etc_rich_forward")(*inputs)
  rows = _rows_at(cfg, head_dim, cfg.num_globals, tiled_q=True)
  return _call(cfg, _with_unread_input(kernels.forward_kernel, 2),
               (batch, heads, cfg.q_tiles), in_specs + [rows], [rows, sp["q_vec"]],
               [jax.ShapeDtypeStruct(context.shape, context.dtype), lse_shape],
               "etc_rich_forward", {len(inputs): 0})(*inputs, context)


def _backward(cfg, seed, x, o, lse, do, offset=0):
  """The gradients. `o` and `do` hold the long rows from row `offset` on (`[B, offset + N,
  H, D]`: with the global rows first, the kernels read `do`'s long rows where they are)."""
  batch, _, heads, head_dim = x["q"].shape
  nq, lk, ap, nqt = cfg.padded_q, cfg.padded_k, cfg.padded_a, cfg.q_tiles
  n = cfg.length
  delta = jnp.swapaxes(jnp.sum(do[:, offset:offset + n].astype(F32)
                               * o[:, offset:offset + n].astype(F32), axis=-1), 1, 2)
  delta = _pad_right(delta, 2, nq - n)  # [B, H, Nq]
  do = _pad_right(do, 1, offset + nq - do.shape[1])

  sp = _specs(cfg, head_dim, tiled_q=True)
  sg = cfg.stored_g
  tile_parts = pl.BlockSpec((None, None, None, sg, head_dim), lambda b, h, i: (b, h, i, 0, 0))
  dq, d_oq, d_dq, d_theta, dkg, dvg = _call(
      cfg, kernels.dq_kernel, (batch, heads, nqt),
      [sp["seed"], sp["q"], sp["k"], sp["k"], sp["g"], sp["g"], sp["qdoc"], sp["kdoc"],
       sp["gdoc"], sp["q_axes"], sp["k_axes"], sp["q_axes"], sp["k_axes"], sp["q_coord"],
       sp["k_coord"], sp["theta"], _rows_at(cfg, head_dim, offset, tiled_q=True), sp["q_vec"],
       sp["q_vec"]],
      [sp["q"], sp["q_axes"], sp["q_axes"], sp["q_axes"], tile_parts, tile_parts],
      # dq, dk and dv leave the kernels in the inputs' dtype: the caller rounds them to it
      # anyway (elementwise, so the same values), and bf16 halves their writes.
      [jax.ShapeDtypeStruct((batch, nq, heads, head_dim), x["q"].dtype)]
      + [jax.ShapeDtypeStruct((batch, heads, ap, nq), F32)] * 3
      + [jax.ShapeDtypeStruct((batch, heads, nqt, sg, head_dim), F32)] * 2,
      "etc_rich_backward_dq")(
          seed, x["q"], x["k"], x["v"], x["kg"], x["vg"], x["qdoc"], x["kdoc"], x["gdoc"],
          x["oq"], x["ok"], x["dq"], x["dk"], x["cq"], x["ck"], x["theta"], do, lse, delta)

  full = _specs(cfg, head_dim, tiled_q=False)
  bk = cfg.block_k
  k_tile = pl.BlockSpec((None, bk, None, head_dim), lambda b, h, j: (b, j, h, 0))
  k_axes = pl.BlockSpec((None, None, ap, bk), lambda b, h, j: (b, h, 0, j))
  dk, dv, d_ok, d_dk = _call(
      cfg, kernels.dkv_kernel, (batch, heads, lk // bk),
      [full["seed"], full["q"], k_tile, k_tile, full["qdoc"],
       pl.BlockSpec((None, bk), lambda b, h, j: (b, j)), full["q_axes"], k_axes,
       full["q_axes"], k_axes, full["q_coord"],
       pl.BlockSpec((None, ap, bk), lambda b, h, j: (b, 0, j)), full["theta"],
       _rows_at(cfg, head_dim, offset, tiled_q=False), full["q_vec"], full["q_vec"]],
      [k_tile, k_tile, k_axes, k_axes],
      [jax.ShapeDtypeStruct((batch, lk, heads, head_dim), x["k"].dtype),
       jax.ShapeDtypeStruct((batch, lk, heads, head_dim), x["v"].dtype)]
      + [jax.ShapeDtypeStruct((batch, heads, ap, lk), F32)] * 2,
      "etc_rich_backward_dkv")(
          seed, x["q"], x["k"], x["v"], x["qdoc"], x["kdoc"], x["oq"], x["ok"], x["dq"],
          x["dk"], x["cq"], x["ck"], x["theta"], do, lse, delta)
  return dict(dq=dq, dk=dk, dv=dv, dkg=dkg.sum(axis=2), dvg=dvg.sum(axis=2), d_oq=d_oq,
              d_dq=d_dq, d_theta=d_theta, d_ok=d_ok, d_dk=d_dk)


# --------------------------------------------------------------------------- public function
# `global_rows` `[B, G', H, D]` with `G'` 0 or `G`: with `G` the output is the context with
# those rows first (`[B, G + N, H, D]`), the kernel writing the long rows after them in place
# and the backward reading their gradient there, so neither direction concatenates or
# splits a `[B, N, H, D]` array (a 2% fusion of the H100 step, session 13's profile).
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attend(cfg, *args):
  return _attend_fwd(cfg, *args)[0]


def _attend_fwd(cfg, seed, q, k, v, kg, vg, oq, ok, dq, dk, theta, coords, long_doc,
                global_doc, global_rows):
  x = _prepare(cfg, q, k, v, kg, vg, oq, ok, dq, dk, theta, coords, long_doc, global_doc)
  offset = global_rows.shape[1]
  if offset:
    context = _pad_right(global_rows.astype(v.dtype), 1, cfg.padded_q)  # [B, G + Nq, H, D]
    o, lse = _forward(cfg, seed, x, context)
  else:
    o, lse = _forward(cfg, seed, x)
  res = (seed, q, k, v, kg, vg, oq, ok, dq, dk, theta, coords, long_doc, global_doc, o, lse,
         global_rows)
  return o[:, :offset + cfg.length], res


def _attend_bwd(cfg, res, do):
  (seed, q, k, v, kg, vg, oq, ok, dq, dk, theta, coords, long_doc, global_doc, o, lse,
   global_rows) = res
  offset, n = global_rows.shape[1], cfg.length
  cfg = cfg.backward()  # its own tiles: the padded layout may differ from the forward's
  x = _prepare(cfg, q, k, v, kg, vg, oq, ok, dq, dk, theta, coords, long_doc, global_doc)
  lse = _pad_right(lse[..., :n], 2, cfg.padded_q - n)
  g = _backward(cfg, seed, x, o, lse, do, offset)
  a = cfg.num_axes

  def keys(y):  # padded keys -> the N long keys
    return y[:, :n]

  def globals_(y, like):  # [B, H, stored_g, D] -> [B, G, H, D]
    return jnp.swapaxes(y, 1, 2)[:, :cfg.num_globals].astype(like.dtype)

  def per_q(y, like):  # [B, H, Ap, Nq] -> [B, H, N, A]
    return jnp.swapaxes(y[:, :, :a, :n], -1, -2).astype(like.dtype)

  def per_k(y, like):  # [B, H, Ap, Lk] -> [B, H, N, A]
    return jnp.swapaxes(y[:, :, :a, :n], -1, -2).astype(like.dtype)

  if a:
    rich = (per_q(g["d_oq"], oq), per_k(g["d_ok"], ok), per_q(g["d_dq"], dq),
            per_k(g["d_dk"], dk), g["d_theta"][:, :, :a].sum(axis=(0, 3)).astype(theta.dtype))
  else:
    rich = tuple(jnp.zeros_like(y) for y in (oq, ok, dq, dk, theta))
  return ((None, g["dq"][:, :n].astype(q.dtype), keys(g["dk"]).astype(k.dtype),
           keys(g["dv"]).astype(v.dtype), globals_(g["dkg"], kg), globals_(g["dvg"], vg))
          + rich + (None, None, None, do[:, :offset].astype(global_rows.dtype)))


_attend.defvjp(_attend_fwd, _attend_bwd)


def long_query_attention(q_long: Array, k_long: Array, v_long: Array, k_global: Array,
                         v_global: Array, long_valid: Array, global_valid: Array, *,
                         local_radius: int, long_document_ids: Array | None = None,
                         global_document_ids: Array | None = None, rich=None,
                         dropout_rate: float = 0.0, dropout_seed: Array | None = None,
                         global_rows: Array | None = None, tiles: Tiles | None = None,
                         interpret: bool | None = None) -> Array:
  """ETC's long queries (`l2l` + `l2g`, one softmax) in one fused kernel: `[B, N, H, D]`,
  or `[B, G + N, H, D]` with `global_rows` first.

  Args:
    q_long, k_long, v_long: `[B, N, H, D]`.
    k_global, v_global: `[B, G, H, D]`.
    long_valid, global_valid: bool `[B, N]`, `[B, G]`.
    local_radius: `r`.
    long_document_ids, global_document_ids: int `[B, N]` / `[B, G]` (packed documents;
      any int32 but `INVALID_QUERY` and `INVALID_KEY`) or None, both or neither.
    rich: None, or `(order_q, order_k, dist_q, dist_k, theta, coords)`: the Rich
      scalars `[B, H, N, A]` (`flaxdoc.layout.rich.rich_projection_scalars`), `theta
      [H, A]` and the coordinates `[B, N, A]`.
    dropout_rate: inverted dropout on the weights; `dropout_seed` (int32 `[1]`) is then
      required. 0 (or None seed): no dropout.
    global_rows: None, or `[B, G, H, D]`: the global queries' outputs, to be the first `G`
      rows of the returned context. The kernel writes the long rows after them in place,
      and the backward reads their gradient where it is, so no `[B, N, H, D]` array is
      concatenated forward or split backward (as `jnp.concatenate([global_rows, out])`
      would: a copy of both each way).
    tiles: `Tiles` (default `DEFAULT_TILES`).
    interpret: run the Pallas interpreter (default: when the backend is not a GPU).

  Returns:
    `[B, N, H, D]` in `v_long`'s dtype (`[B, G + N, H, D]` with `global_rows`); queries with
    no valid key get zeros.
  """
  batch, length, heads, head_dim = q_long.shape
  num_globals = k_global.shape[1]
  if interpret is None:
    interpret = pallas_backend.default_interpret("etc_pallas", "the fused ETC kernel runs",
                                                 "etc_kernel='xla'", stacklevel=2)
  t = tiles or DEFAULT_TILES
  for name, value in dataclasses.asdict(t).items():
    if "warps" not in name and (value < 1 or value & (value - 1)):
      raise ValueError(f"long_query_attention: tiles.{name} must be a power of two, got {value}")
  if local_radius < 0:
    raise ValueError(f"long_query_attention: local_radius must be >= 0, got {local_radius}")
  if not 0.0 <= dropout_rate < 1.0:
    raise ValueError(f"long_query_attention: dropout_rate must be in [0, 1), got {dropout_rate}")
  if dropout_rate and dropout_seed is None:
    raise ValueError("long_query_attention: dropout_rate > 0 needs dropout_seed")
  if (long_document_ids is None) != (global_document_ids is None):
    raise ValueError("long_query_attention: give long_document_ids and global_document_ids "
                     "together (a global token must know its document)")
  rate = float(dropout_rate) if dropout_seed is not None else 0.0
  seed = (jnp.zeros((1,), jnp.int32) if dropout_seed is None
          else jnp.asarray(dropout_seed, jnp.int32).reshape((1,)))
  long_valid = jnp.asarray(long_valid, bool)
  global_valid = jnp.asarray(global_valid, bool)
  if long_document_ids is None:
    long_document_ids = jnp.zeros((batch, length), jnp.int32)
    global_document_ids = jnp.zeros((batch, num_globals), jnp.int32)
  long_document_ids = jnp.asarray(long_document_ids, jnp.int32)
  long_doc = (jnp.where(long_valid, long_document_ids, INVALID_QUERY),
              jnp.where(long_valid, long_document_ids, INVALID_KEY))
  global_doc = jnp.where(global_valid, jnp.asarray(global_document_ids, jnp.int32), INVALID_KEY)
  if rich is None:
    zeros = jnp.zeros((batch, heads, length, 0), F32)
    rich = (zeros, zeros, zeros, zeros, jnp.zeros((heads, 0), F32),
            jnp.zeros((batch, length, 0), F32))
  oq, ok, dq, dk, theta, coords = rich
  theta = jnp.asarray(theta, F32)
  if theta.ndim == 1:
    theta = jnp.broadcast_to(theta[:, None], (heads, oq.shape[-1]))
  cfg = Config(radius=int(local_radius), length=length, num_globals=num_globals,
               num_axes=int(oq.shape[-1]), dropout_rate=rate, block_q=t.block_q,
               block_k=t.block_k, warps=t.warps, interpret=bool(interpret),
               backward_tiles=(t.backward_block_q, t.backward_block_k, t.backward_warps))
  if global_rows is None:
    global_rows = jnp.zeros((batch, 0, heads, head_dim), v_long.dtype)
  elif tuple(global_rows.shape) != (batch, num_globals, heads, head_dim):
    raise ValueError(f"long_query_attention: global_rows has shape {tuple(global_rows.shape)}, "
                     f"expected {(batch, num_globals, heads, head_dim)}")
  args = (seed, q_long, k_long, v_long, k_global, v_global.astype(v_long.dtype), oq, ok, dq, dk,
          theta, jnp.asarray(coords, F32), long_doc, global_doc, global_rows)

  def attend(first_row, seed, *rest):
    # The dropout hash takes the global row, so its draws do not depend on the split.
    return _attend(cfg, jnp.stack([seed[0], first_row]), *rest)

  # Per example: each device runs its own rows when the mesh splits the batch.
  return batch_parallel.over_batch(attend, args, (False,) + (True,) * 9 + (False,)
                                   + (True,) * 4)
