"""The kernel bodies of `flaxdoc.nn.gcn_pallas`: FormNet's GCN message attention.

Every kernel works on *edge rows*: edge `e = node * Kp + slot` of one document row,
`Kp` the neighbour slots padded to a power of two. A program holds `BR = BL * Kp` rows
(the edges of `BL` consecutive nodes) or, in the target-side backward, `BE` rows taken
in order of their target node, and one chunk of `BH` hidden features. For its rows it
recomputes the message MLP's pre-activation from per-node vectors,

    pre[e, h] = S[src(e), h] + N[tgt(e), h] + (E[e] @ We)[h] + b1[h]
              = S[src(e), h] + N[tgt(e), h] + ([E[e], 1] @ [We; b1])[h]
    x[e, h]   = gelu(pre[e, h])                  (exact GELU, as `flaxdoc.nn.gelu.erf_gelu`)

(`S`: the self part of the first layer, `N`: its neighbour part, both `[Lp, Hp]` per
row; `E`: the edge features; `We`: the first layer's edge rows), so nothing `[L, K, H]`
is ever written to memory. The bias rides in the edge product: each real edge's row
carries a 1 in its padding to `Fp` (masked and padded rows are all zero) and the kernel
matrix `b1` in that row, so no kernel adds it, and the backward's `d We` product gives
`d b1` in that row. `Config` carries the static sizes.

With `Config.save_activations` (`GCNLayer(kernel="pallas_saved")`) the forward's scores
kernel also writes each edge row's `x` and GELU slope `gelu'(pre)` in the inputs' dtype,
and the `saved_*` kernels read them instead of evaluating GELU again; the source-side
backward then also writes `d pre`, which the target side only sums. GELU runs once per
element a step instead of five times, for two `[rows, Hp]` arrays kept per layer until
the backward. The scores take `x` before that rounding; the pooled sum, `d a`, `d v` and
(through the slope) every other gradient take the rounded arrays (the pooled sum rounds
`x` to the inputs' dtype in either form: it is a product's operand).
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from flaxdoc.nn import pallas_math as pm

F32 = jnp.float32
_SQRT_HALF = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


@dataclasses.dataclass(frozen=True)
class Config:
  """Static sizes of one call (hashable: it is the custom VJP's non-differentiable part)."""
  nodes: int  # L
  slots: int  # K, neighbour slots per node
  features: int  # F, edge features
  hidden: int  # H, the message MLP's hidden width
  block_nodes: int  # BL
  block_hidden: int  # BH
  block_edges: int  # BE, in-edges per step of the target-side backward
  warps: int
  interpret: bool
  bf16: bool  # the inputs are bfloat16: dots take bfloat16 operands (float32 accumulation)
  save_activations: bool = False  # the forward keeps x and gelu'(pre) for the backward
  write_d_pre: bool = False  # recomputing: the source side writes d pre for the target side
  fused_forward: bool = False  # the forward in one kernel, BLf nodes x all of H a program
  fused_backward: bool = False  # the backward's node side so (`d a` to `d pre`), too
  fused_nodes: int = 2  # BLf: the fused kernels' nodes a program (divides block_nodes)
  fused_warps: int = 8  # their Triton warps

  @property
  def padded_slots(self) -> int:  # Kp: whole edge rows per node, a power of two
    return int(pl.next_power_of_2(max(self.slots, 1)))

  @property
  def node_tiles(self) -> int:
    return -(-self.nodes // self.block_nodes)

  @property
  def padded_nodes(self) -> int:
    return self.node_tiles * self.block_nodes

  @property
  def block_rows(self) -> int:  # BR
    return self.block_nodes * self.padded_slots

  @property
  def rows(self) -> int:  # edge rows of one document row
    return self.padded_nodes * self.padded_slots

  @property
  def padded_features(self) -> int:  # F + 1 (the bias' column); Triton's dots want >= 16
    return max(16, int(pl.next_power_of_2(self.features + 1)))

  @property
  def hidden_chunks(self) -> int:
    return -(-self.hidden // self.block_hidden)

  @property
  def padded_hidden(self) -> int:
    return self.hidden_chunks * self.block_hidden

  @property
  def fused_tiles(self) -> int:  # programs a row of the fused kernels (BLf divides BL)
    return self.padded_nodes // self.fused_nodes


# --------------------------------------------------------------------------- elementwise pieces
# Abramowitz & Stegun 7.1.26: erfc(a) = t (A1 + A2 t + A3 t^2 + A4 t^3 + A5 t^4) e^(-a^2)
# with t = 1 / (1 + P a), a >= 0, |error| <= 1.5e-7.
_P = 0.3275911
_A1, _A2, _A3, _A4, _A5 = 0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429
_LOG2_HALF_A5 = math.log2(0.5 * _A5)
_HALF_LOG2E = 0.5 * math.log2(math.e)
_PHI_PER_G = _INV_SQRT_2PI / (0.5 * _A5)  # phi(x) = g * this


def _normal_tail(x, interpret: bool):
  """`(h, g)`: `h = Phi(-|x|)`, the standard normal's tail beyond `|x|` (A&S: within
  7.5e-8; with float32's rounding within 2.5e-7), and `g = (A5 / 2) e^(-x^2 / 2)`, the
  Gaussian factor it is built from.

  With `a = |x| / sqrt 2`, `h = erfc(a) / 2` by A&S 7.1.26, arranged for few instructions
  (each is an element's, five times a step in the recomputing kernels; `bench.kernel_sass`
  counts them): `1/sqrt 2` goes into `P`; the polynomial is divided by `A5`, so Horner
  starts with an add of `t`, not a multiply-add of two constants (which needs a register
  move for one of them); `A5 / 2` goes into the exponent, `x (x (-log2(e) / 2)) +
  log2(A5 / 2)`: two instructions, and a small constant, so rounding the exponent moves
  `h` by at most about 1e-7 (absolute; relative to `g`, ~7e-8 x |exponent|). (Folding
  more into the exponent, e.g. the polynomial's scale in `1 / (|x| + sqrt 2 / P)`, saves
  one more instruction but rounds an exponent near 10, 3.7e-7 on `Phi`.) Pallas' Triton
  lowering has no `erf`; this needs one reciprocal and one `2^x`, a special-function
  instruction each (`pallas_math`).
  """
  t = pm.reciprocal(1.0 + (_P * _SQRT_HALF) * jnp.abs(x), interpret)
  q = t * (_A1 / _A5 + t * (_A2 / _A5 + t * (_A3 / _A5 + t * (_A4 / _A5 + t))))
  g = pm.exp2(x * (x * -_HALF_LOG2E) + _LOG2_HALF_A5, interpret)
  return q * g, g


def _cdf_from_tail(x, h):
  """`Phi(x)` from `h = Phi(-|x|)`: `1 - h` for `x >= 0`, `h` below."""
  return jnp.where(x >= 0, 1.0 - h, h)


def _gelu_from_tail(x, h):
  """`x Phi(x)` as `max(x, 0) - |x| Phi(-|x|)` (the same for either sign: a max and a fused
  multiply-add, where `x * Phi(x)` from `h` takes a compare, a select, an add and a
  multiply)."""
  return jnp.maximum(x, 0.0) - jnp.abs(x) * h


def normal_cdf(x, interpret: bool):
  """`Phi(x)`."""
  return _cdf_from_tail(x, _normal_tail(x, interpret)[0])


def gelu(x, interpret: bool):
  """Exact GELU `x Phi(x)`."""
  return _gelu_from_tail(x, _normal_tail(x, interpret)[0])


def gelu_and_grad(x, interpret: bool):
  """`(gelu(x), gelu'(x))` with `gelu'(x) = Phi(x) + x phi(x)`, `phi` the Gaussian density
  (`g` rescaled: `phi = g / (A5 sqrt(pi / 2))`)."""
  h, g = _normal_tail(x, interpret)
  return _gelu_from_tail(x, h), _cdf_from_tail(x, h) + x * g * _PHI_PER_G


def dot(cfg, a, b, trans_a=False):
  """`a @ b` (or `a.T @ b`) with float32 accumulation: bfloat16 operands for bfloat16
  inputs (as the XLA path), else exact float32 (Triton's default would be TF32)."""
  if trans_a:
    a = a.T
  if cfg.bf16:
    return jnp.dot(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), preferred_element_type=F32)
  return jnp.dot(a.astype(F32), b.astype(F32), precision=lax.Precision.HIGHEST,
                 preferred_element_type=F32)


def per_edge(cfg, node_rows):
  """`[BL, BH]` per-node rows -> `[BR, BH]`, each repeated for its node's `Kp` edges."""
  bl, bh = node_rows.shape
  kp = cfg.padded_slots
  return jnp.broadcast_to(node_rows[:, None, :], (bl, kp, bh)).reshape(bl * kp, bh)


def _per_node(cfg, edge_rows, weights=None):
  """`[BR, BH]` -> `[BL, BH]`: the sum over each node's `Kp` edges, each edge row times
  `weights[row]` if given (`[BR]`).

  As a matrix product with the `[BL, BR]` matrix that holds each row's weight (or 1) in its
  node's row: the rows of one node lie across threads, so a sum over them would be
  shuffles and adds for every element; on the tensor cores it is one small product. With
  bfloat16 inputs its operands are bfloat16 (`dot`), as the XLA path's bfloat16 sums: the
  pooled sum's `x` and weights, and `d S`'s `d pre`, are rounded before they are added.
  """
  br = edge_rows.shape[0]
  kp = cfg.padded_slots
  mine = lax.broadcasted_iota(jnp.int32, (br // kp, br), 1) // kp == lax.broadcasted_iota(
      jnp.int32, (br // kp, br), 0)
  if weights is None:
    picks = mine.astype(F32)
  else:
    picks = jnp.where(mine, weights[None, :].astype(F32), 0.0)
  return dot(cfg, picks, edge_rows)


def _pre(cfg, s_rows, n_ref, tgt, e_rows, we_ref):
  """The pre-activation `[rows, BH]` of edge rows with targets `tgt` and features `e_rows`
  (the bias included: `e_rows` end in a column of ones, `we` in `b1`)."""
  nb = n_ref[tgt, :].astype(F32)  # gathered rows [rows, BH]
  return s_rows + nb + dot(cfg, e_rows, we_ref[...])


# --------------------------------------------------------------------------- node-tile kernels
def edge_dot_kernel(cfg, per_node_u, s_ref, n_ref, tgt_ref, e_ref, we_ref, u_ref, out_ref):
  """`out[e] = sum_h x[e, h] u[h]` over this chunk: `u` the score vector (forward), or the
  pooled gradient of the edge's source node (`per_node_u`, backward)."""
  s_rows = per_edge(cfg, s_ref[...].astype(F32))
  x = gelu(_pre(cfg, s_rows, n_ref, tgt_ref[...], e_ref[...], we_ref), cfg.interpret)
  if per_node_u:
    u = per_edge(cfg, u_ref[...].astype(F32))
  else:
    u = u_ref[...].astype(F32)[None, :]
  out_ref[...] = jnp.sum(x * u, axis=1)


def pool_kernel(cfg, s_ref, n_ref, tgt_ref, e_ref, we_ref, a_ref, out_ref):
  """`pooled[l, h] = sum_k a[l, k] x[l, k, h]` for this tile's nodes and chunk."""
  s_rows = per_edge(cfg, s_ref[...].astype(F32))
  x = gelu(_pre(cfg, s_rows, n_ref, tgt_ref[...], e_ref[...], we_ref), cfg.interpret)
  out_ref[...] = _per_node(cfg, x, a_ref[...]).astype(out_ref.dtype)


def d_hidden(a, ds, dp_rows, v):
  """`dx = a dP + ds v` of edge rows: the gradient through the pooled sum (`dp_rows`, the
  pooled gradient of each edge's source node) and through the score (`ds`; `v` the score
  vector's chunk)."""
  return a[:, None] * dp_rows + ds[:, None] * v.astype(F32)[None, :]


def ds_rows(ds):
  """`ds` `[rows]` as row 0 of a `[16, rows]` matrix, zeros below: `dot(ds_rows(ds), x)`'s
  row 0 is `d v = ds . x`, a product of 16 rows (Triton's minimum), not a sum over the
  rows, which lie across threads."""
  first = lax.broadcasted_iota(jnp.int32, (16, ds.shape[0]), 0) == 0
  return jnp.where(first, ds[None, :], 0.0)


def slot_softmax(scores, mask):
  """Softmax over each node's valid slots (the last axis, `Kp`; float32): all zero for a
  node with none. Elementwise `jnp`, so XLA (`gcn_pallas_calls.softmax`) and the fused
  kernels take the same one."""
  scores = jnp.where(mask, scores, jnp.finfo(F32).min)
  e = jnp.where(mask, jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True)), 0.0)
  total = jnp.sum(e, axis=-1, keepdims=True)
  return e / jnp.where(total > 0, total, 1.0)


def slot_softmax_grad(a, d_a):
  """The softmax's backward over the last axis: `ds = a (da - sum_k a da)`; zero where `a`
  is (masked slots)."""
  return a * (d_a - jnp.sum(a * d_a, axis=-1, keepdims=True))


def _pre_grad(cfg, pre, a, ds, dp_rows, v_ref):
  """`(x, d pre)` of edge rows, `d pre = dx * gelu'(pre)`."""
  x, slope = gelu_and_grad(pre, cfg.interpret)
  return x, d_hidden(a, ds, dp_rows, v_ref[...]) * slope


def _store_source_grads(cfg, x, ds, d_pre, e_rows, d_self_ref, d_v_ref, d_we_ref):
  """`d S` (each node's sum over its edges, rounded once to the output's dtype) and this
  tile's float32 partial sums of `d [We; b1]` (`e_rows`' column of ones makes the bias'
  row the sum of `d pre` over the tile's edges) and `d v`.

  Each a small product (bfloat16 operands for bfloat16 inputs, `dot`): `d v = ds . x`
  as the first row of a 16-row product (`ds_rows`). In this order (`bench.kernel_sass`,
  sm_90) the recomputing kernel keeps 167 registers (12 warps an SM; other orders took
  174-255, 8 warps) and the saving one loses 2.7 instructions an edge element.
  """
  d_we_ref[...] = dot(cfg, e_rows, d_pre, trans_a=True)
  d_v_ref[...] = jnp.sum(dot(cfg, ds_rows(ds), x), axis=0)
  d_self_ref[...] = _per_node(cfg, d_pre).astype(d_self_ref.dtype)


def source_grad_kernel(cfg, s_ref, n_ref, tgt_ref, e_ref, we_ref, v_ref, a_ref, ds_ref,
                       dp_ref, d_self_ref, d_v_ref, d_we_ref, *d_pre_ref):
  """Backward, per source node tile: `d S` and this tile's partial sums of `d v` and
  `d [We; b1]` (`_store_source_grads`); with `Config.write_d_pre` also every edge row's
  `d pre`, for the target side to sum (`saved_target_grad_kernel`)."""
  s_rows = per_edge(cfg, s_ref[...].astype(F32))
  e_rows = e_ref[...]
  pre = _pre(cfg, s_rows, n_ref, tgt_ref[...], e_rows, we_ref)
  ds = ds_ref[...]
  x, d_pre = _pre_grad(cfg, pre, a_ref[...], ds, per_edge(cfg, dp_ref[...].astype(F32)), v_ref)
  _store_source_grads(cfg, x, ds, d_pre, e_rows, d_self_ref, d_v_ref, d_we_ref)
  if d_pre_ref:
    d_pre_ref[0][...] = d_pre.astype(d_pre_ref[0].dtype)


# --------------------------------------------------------------------------- target-side backward
def sum_by_target(cfg, bounds_ref, order_ref, tgt_ref, d_pre_of, out_ref, e_ref=None,
                   d_we_ref=None):
  """`out[j] = sum over edges e with tgt(e) = j of d pre[e]` for this target tile's nodes
  (summed in float32, rounded once to `out`'s dtype).

  `order` lists a row's edges sorted by target (masked edges last, outside every tile);
  `bounds[i]:bounds[i + 1]` are the positions of the edges into tile `i`. They are taken
  `BE` at a time, `d_pre_of(edge, tgt)` gives their `[BE, BH]` rows, summed into the
  tile's rows with a one-hot matrix product: a scatter-add without atomics.

  With `d_we_ref`, also this tile's float32 partial sum of `d [We; b1] = e^T d pre` over
  its in-edges (`e_ref`'s rows gathered; each valid edge is in exactly one target tile),
  for the fused backward, whose node-side programs are too small to keep one.
  """
  i = pl.program_id(1)
  bl, be = cfg.block_nodes, cfg.block_edges
  start, end = bounds_ref[i], bounds_ref[i + 1]
  first_node = i * bl
  with_d_we = d_we_ref is not None

  def body(step, carry):
    pos = start + step * be
    edge = order_ref[pl.ds(pos, be)]  # [BE] edge ids (order is padded by BE)
    valid = (pos + lax.iota(jnp.int32, be)) < end
    tgt = tgt_ref[edge]
    onehot = ((tgt - first_node)[None, :] == lax.iota(jnp.int32, bl)[:, None]) & valid[None, :]
    d_pre = d_pre_of(edge, tgt)
    acc = carry[0] + dot(cfg, onehot.astype(F32), d_pre)
    if not with_d_we:
      return (acc,)
    # `valid` keeps the edges past this tile's (read by the last step) out of `d We`.
    e_rows = jnp.where(valid[:, None], e_ref[edge, :].astype(F32), 0.0)  # [BE, Fp]
    return acc, carry[1] + dot(cfg, e_rows, d_pre, trans_a=True)

  steps = (end - start + be - 1) // be
  bh = out_ref.shape[-1]
  init = (jnp.zeros((bl, bh), F32),) + ((jnp.zeros((cfg.padded_features, bh), F32),)
                                        if with_d_we else ())
  sums = lax.fori_loop(0, steps, body, init)
  out_ref[...] = sums[0].astype(out_ref.dtype)
  if with_d_we:
    d_we_ref[...] = sums[1]


def target_grad_kernel(cfg, bounds_ref, order_ref, s_ref, n_ref, tgt_ref, e_ref, we_ref,
                       v_ref, a_ref, ds_ref, dp_ref, d_nb_ref):
  """Backward, per target node tile: `d N[j] = sum over edges e with tgt(e) = j of d pre[e]`,
  each in-edge's `d pre` recomputed from the per-node vectors."""
  kp = cfg.padded_slots

  def d_pre_of(edge, tgt):
    src = edge // kp
    pre = _pre(cfg, s_ref[src, :].astype(F32), n_ref, tgt, e_ref[edge, :], we_ref)
    return _pre_grad(cfg, pre, a_ref[edge], ds_ref[edge], dp_ref[src, :].astype(F32), v_ref)[1]

  sum_by_target(cfg, bounds_ref, order_ref, tgt_ref, d_pre_of, d_nb_ref)


# --------------------------------------------------------------------------- saved activations
def saving_scores_kernel(cfg, s_ref, n_ref, tgt_ref, e_ref, we_ref, u_ref, out_ref,
                         x_ref, slope_ref):
  """The forward scores (as `edge_dot_kernel`), also writing the tile's `x` and `gelu'(pre)`."""
  s_rows = per_edge(cfg, s_ref[...].astype(F32))
  x, slope = gelu_and_grad(_pre(cfg, s_rows, n_ref, tgt_ref[...], e_ref[...], we_ref),
                           cfg.interpret)
  x_ref[...] = x.astype(x_ref.dtype)
  slope_ref[...] = slope.astype(slope_ref.dtype)
  out_ref[...] = jnp.sum(x * u_ref[...].astype(F32)[None, :], axis=1)


def saved_pool_kernel(cfg, x_ref, a_ref, out_ref):
  """`pooled[l, h] = sum_k a[l, k] x[l, k, h]` from the saved `x`."""
  out_ref[...] = _per_node(cfg, x_ref[...].astype(F32), a_ref[...]).astype(out_ref.dtype)


def saved_edge_dot_kernel(cfg, x_ref, u_ref, out_ref):
  """`out[e] = sum_h x[e, h] u[src(e), h]` over this chunk, from the saved `x`."""
  out_ref[...] = jnp.sum(x_ref[...].astype(F32) * per_edge(cfg, u_ref[...].astype(F32)), axis=1)


def saved_source_grad_kernel(cfg, x_ref, slope_ref, e_ref, v_ref, a_ref, ds_ref, dp_ref,
                             d_self_ref, d_v_ref, d_we_ref, d_pre_ref):
  """As `source_grad_kernel` from the saved `x` and slope; also writes `d pre` for the
  target side."""
  x, ds = x_ref[...].astype(F32), ds_ref[...]
  d_pre = d_hidden(a_ref[...], ds, per_edge(cfg, dp_ref[...].astype(F32)), v_ref[...]) * (
      slope_ref[...].astype(F32))
  d_pre_ref[...] = d_pre.astype(d_pre_ref.dtype)
  _store_source_grads(cfg, x, ds, d_pre, e_ref[...], d_self_ref, d_v_ref, d_we_ref)


def saved_target_grad_kernel(cfg, bounds_ref, order_ref, tgt_ref, d_pre_ref, d_nb_ref):
  """`d N` per target tile (as `target_grad_kernel`), summing the written `d pre` rows."""
  sum_by_target(cfg, bounds_ref, order_ref, tgt_ref, lambda edge, tgt: d_pre_ref[edge, :],
                 d_nb_ref)
