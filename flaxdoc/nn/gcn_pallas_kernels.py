"""The kernel bodies of `flaxdoc.nn.gcn_pallas`: FormNet's GCN message attention.

Every kernel works on *edge rows*: edge `e = node * Kp + slot` of one document row,
`Kp` the neighbour slots padded to a power of two. A program holds `BR = BL * Kp` rows
(the edges of `BL` consecutive nodes) or, in the target-side backward, `BE` rows taken
in order of their target node, and one chunk of `BH` hidden features. For its rows it
recomputes the message MLP's pre-activation from per-node vectors,

    pre[e, h] = S[src(e), h] + N[tgt(e), h] + (E[e] @ We)[h] + b1[h]
    x[e, h]   = gelu(pre[e, h])                  (exact GELU, as `nn.gelu(approximate=False)`)

(`S`: the self part of the first layer, `N`: its neighbour part, both `[Lp, Hp]` per
row; `E`: the edge features; `We`: the first layer's edge rows), so nothing `[L, K, H]`
is ever written to memory. `Config` carries the static sizes.

With `Config.save_activations` (`GCNLayer(kernel="pallas_saved")`) the forward's scores
kernel also writes each edge row's `x` and GELU slope `gelu'(pre)` in the inputs' dtype,
and the `saved_*` kernels read them instead of evaluating GELU again; the source-side
backward then also writes `d pre`, which the target side only sums. GELU runs once per
element a step instead of five times, for two `[rows, Hp]` arrays kept per layer until
the backward. The scores take `x` before that rounding; the pooled sum, `d a`, `d v` and
(through the slope) every other gradient take the rounded arrays.
"""

from __future__ import annotations

import dataclasses

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
  def padded_features(self) -> int:  # Triton's dots want >= 16 on the contracted axis
    return max(16, int(pl.next_power_of_2(max(self.features, 1))))

  @property
  def hidden_chunks(self) -> int:
    return -(-self.hidden // self.block_hidden)

  @property
  def padded_hidden(self) -> int:
    return self.hidden_chunks * self.block_hidden


# --------------------------------------------------------------------------- elementwise pieces
def _normal_cdf(x, interpret: bool):
  """`(Phi(x), e^(-x^2 / 2))`: the standard normal CDF, through erf(|x| / sqrt 2) by
  Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7, so Phi within 7.5e-8), and the Gaussian
  that formula already computes (`e^-a^2` with `a^2 = x^2 / 2`), which the GELU's slope
  needs too: one exponential an element for both, not two.

  Pallas' Triton lowering has no `erf`; this rational-exponential form needs only an
  exponential and a reciprocal, one instruction each on a GPU (`pallas_math`).
  """
  a = jnp.abs(x) * _SQRT_HALF
  t = pm.reciprocal(1.0 + 0.3275911 * a, interpret)
  poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741
                                                     + t * (-1.453152027 + t * 1.061405429))))
  gauss = pm.exp(-0.5 * x * x, interpret)
  half_erf = 0.5 - 0.5 * poly * gauss  # erf(a) / 2
  return 0.5 + jnp.where(x < 0, -half_erf, half_erf), gauss


def gelu(x, interpret: bool):
  """Exact GELU `x * Phi(x)`."""
  return x * _normal_cdf(x, interpret)[0]


def gelu_and_grad(x, interpret: bool):
  """`(gelu(x), gelu'(x))` with `gelu'(x) = Phi(x) + x * phi(x)`."""
  cdf, gauss = _normal_cdf(x, interpret)
  return x * cdf, cdf + x * _INV_SQRT_2PI * gauss


def _dot(cfg, a, b, trans_a=False):
  """`a @ b` (or `a.T @ b`) with float32 accumulation: bfloat16 operands for bfloat16
  inputs (as the XLA path), else exact float32 (Triton's default would be TF32)."""
  if trans_a:
    a = a.T
  if cfg.bf16:
    return jnp.dot(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), preferred_element_type=F32)
  return jnp.dot(a.astype(F32), b.astype(F32), precision=lax.Precision.HIGHEST,
                 preferred_element_type=F32)


def _per_edge(cfg, node_rows):
  """`[BL, BH]` per-node rows -> `[BR, BH]`, each repeated for its node's `Kp` edges."""
  bl, bh = node_rows.shape
  kp = cfg.padded_slots
  return jnp.broadcast_to(node_rows[:, None, :], (bl, kp, bh)).reshape(bl * kp, bh)


def _per_node(cfg, edge_rows):
  """`[BR, BH]` -> `[BL, BH]`: the sum over each node's `Kp` edges."""
  br, bh = edge_rows.shape
  kp = cfg.padded_slots
  return edge_rows.reshape(br // kp, kp, bh).sum(axis=1)


def _pre(cfg, s_rows, n_ref, tgt, e_rows, we_ref, b1_ref):
  """The pre-activation `[rows, BH]` of edge rows with targets `tgt` and features `e_rows`."""
  nb = n_ref[tgt, :].astype(F32)  # gathered rows [rows, BH]
  return s_rows + nb + _dot(cfg, e_rows, we_ref[...]) + b1_ref[...].astype(F32)[None, :]


# --------------------------------------------------------------------------- node-tile kernels
def edge_dot_kernel(cfg, per_node_u, s_ref, n_ref, tgt_ref, e_ref, we_ref, b1_ref, u_ref,
                    out_ref):
  """`out[e] = sum_h x[e, h] u[h]` over this chunk: `u` the score vector (forward), or the
  pooled gradient of the edge's source node (`per_node_u`, backward)."""
  s_rows = _per_edge(cfg, s_ref[...].astype(F32))
  x = gelu(_pre(cfg, s_rows, n_ref, tgt_ref[...], e_ref[...], we_ref, b1_ref), cfg.interpret)
  if per_node_u:
    u = _per_edge(cfg, u_ref[...].astype(F32))
  else:
    u = u_ref[...].astype(F32)[None, :]
  out_ref[...] = jnp.sum(x * u, axis=1)


def pool_kernel(cfg, s_ref, n_ref, tgt_ref, e_ref, we_ref, b1_ref, a_ref, out_ref):
  """`pooled[l, h] = sum_k a[l, k] x[l, k, h]` for this tile's nodes and chunk."""
  s_rows = _per_edge(cfg, s_ref[...].astype(F32))
  x = gelu(_pre(cfg, s_rows, n_ref, tgt_ref[...], e_ref[...], we_ref, b1_ref), cfg.interpret)
  out_ref[...] = _per_node(cfg, a_ref[...][:, None] * x).astype(out_ref.dtype)


def _d_hidden(a, ds, dp_rows, v_ref):
  """`dx = a dP + ds v` of edge rows: the gradient through the pooled sum (`dp_rows`, the
  pooled gradient of each edge's source node) and through the score (`ds`)."""
  return a[:, None] * dp_rows + ds[:, None] * v_ref[...].astype(F32)[None, :]


def _pre_grad(cfg, pre, a, ds, dp_rows, v_ref):
  """`(x, d pre)` of edge rows, `d pre = dx * gelu'(pre)`."""
  x, slope = gelu_and_grad(pre, cfg.interpret)
  return x, _d_hidden(a, ds, dp_rows, v_ref) * slope


def source_grad_kernel(cfg, s_ref, n_ref, tgt_ref, e_ref, we_ref, b1_ref, v_ref, a_ref, ds_ref,
                       dp_ref, d_self_ref, d_v_ref, d_we_ref):
  """Backward, per source node tile: `d S` (the sum over each node's edges) and this tile's
  partial sums of `d v` and `d We`."""
  s_rows = _per_edge(cfg, s_ref[...].astype(F32))
  e_rows = e_ref[...]
  pre = _pre(cfg, s_rows, n_ref, tgt_ref[...], e_rows, we_ref, b1_ref)
  ds = ds_ref[...]
  x, d_pre = _pre_grad(cfg, pre, a_ref[...], ds, _per_edge(cfg, dp_ref[...].astype(F32)), v_ref)
  d_self_ref[...] = _per_node(cfg, d_pre)
  d_v_ref[...] = jnp.sum(ds[:, None] * x, axis=0)
  d_we_ref[...] = _dot(cfg, e_rows, d_pre, trans_a=True)


# --------------------------------------------------------------------------- target-side backward
def _sum_by_target(cfg, bounds_ref, order_ref, tgt_ref, d_pre_of, out_ref):
  """`out[j] = sum over edges e with tgt(e) = j of d pre[e]` for this target tile's nodes.

  `order` lists a row's edges sorted by target (masked edges last, outside every tile);
  `bounds[i]:bounds[i + 1]` are the positions of the edges into tile `i`. They are taken
  `BE` at a time, `d_pre_of(edge, tgt)` gives their `[BE, BH]` rows, summed into the
  tile's rows with a one-hot matrix product: a scatter-add without atomics.
  """
  i = pl.program_id(1)
  bl, be = cfg.block_nodes, cfg.block_edges
  start, end = bounds_ref[i], bounds_ref[i + 1]
  first_node = i * bl

  def body(step, acc):
    pos = start + step * be
    edge = order_ref[pl.ds(pos, be)]  # [BE] edge ids (order is padded by BE)
    valid = (pos + lax.iota(jnp.int32, be)) < end
    tgt = tgt_ref[edge]
    onehot = ((tgt - first_node)[None, :] == lax.iota(jnp.int32, bl)[:, None]) & valid[None, :]
    return acc + _dot(cfg, onehot.astype(F32), d_pre_of(edge, tgt))

  steps = (end - start + be - 1) // be
  out_ref[...] = lax.fori_loop(0, steps, body, jnp.zeros((bl, out_ref.shape[-1]), F32))


def target_grad_kernel(cfg, bounds_ref, order_ref, s_ref, n_ref, tgt_ref, e_ref, we_ref, b1_ref,
                       v_ref, a_ref, ds_ref, dp_ref, d_nb_ref):
  """Backward, per target node tile: `d N[j] = sum over edges e with tgt(e) = j of d pre[e]`,
  each in-edge's `d pre` recomputed from the per-node vectors."""
  kp = cfg.padded_slots

  def d_pre_of(edge, tgt):
    src = edge // kp
    pre = _pre(cfg, s_ref[src, :].astype(F32), n_ref, tgt, e_ref[edge, :], we_ref, b1_ref)
    return _pre_grad(cfg, pre, a_ref[edge], ds_ref[edge], dp_ref[src, :].astype(F32), v_ref)[1]

  _sum_by_target(cfg, bounds_ref, order_ref, tgt_ref, d_pre_of, d_nb_ref)


# --------------------------------------------------------------------------- saved activations
def saving_scores_kernel(cfg, s_ref, n_ref, tgt_ref, e_ref, we_ref, b1_ref, u_ref, out_ref,
                         x_ref, slope_ref):
  """The forward scores (as `edge_dot_kernel`), also writing the tile's `x` and `gelu'(pre)`."""
  s_rows = _per_edge(cfg, s_ref[...].astype(F32))
  x, slope = gelu_and_grad(_pre(cfg, s_rows, n_ref, tgt_ref[...], e_ref[...], we_ref, b1_ref),
                           cfg.interpret)
  x_ref[...] = x.astype(x_ref.dtype)
  slope_ref[...] = slope.astype(slope_ref.dtype)
  out_ref[...] = jnp.sum(x * u_ref[...].astype(F32)[None, :], axis=1)


def saved_pool_kernel(cfg, x_ref, a_ref, out_ref):
  """`pooled[l, h] = sum_k a[l, k] x[l, k, h]` from the saved `x`."""
  out_ref[...] = _per_node(cfg, a_ref[...][:, None] * x_ref[...].astype(F32)).astype(
      out_ref.dtype)


def saved_edge_dot_kernel(cfg, x_ref, u_ref, out_ref):
  """`out[e] = sum_h x[e, h] u[src(e), h]` over this chunk, from the saved `x`."""
  out_ref[...] = jnp.sum(x_ref[...].astype(F32) * _per_edge(cfg, u_ref[...].astype(F32)), axis=1)


def saved_source_grad_kernel(cfg, x_ref, slope_ref, e_ref, v_ref, a_ref, ds_ref, dp_ref,
                             d_self_ref, d_v_ref, d_we_ref, d_pre_ref):
  """As `source_grad_kernel` from the saved `x` and slope; also writes `d pre` for the
  target side."""
  x, ds = x_ref[...].astype(F32), ds_ref[...]
  d_pre = _d_hidden(a_ref[...], ds, _per_edge(cfg, dp_ref[...].astype(F32)), v_ref) * (
      slope_ref[...].astype(F32))
  d_pre_ref[...] = d_pre.astype(d_pre_ref.dtype)
  d_self_ref[...] = _per_node(cfg, d_pre)
  d_v_ref[...] = jnp.sum(ds[:, None] * x, axis=0)
  d_we_ref[...] = _dot(cfg, e_ref[...], d_pre, trans_a=True)


def saved_target_grad_kernel(cfg, bounds_ref, order_ref, tgt_ref, d_pre_ref, d_nb_ref):
  """`d N` per target tile (as `target_grad_kernel`), summing the written `d pre` rows."""
  _sum_by_target(cfg, bounds_ref, order_ref, tgt_ref, lambda edge, tgt: d_pre_ref[edge, :],
                 d_nb_ref)
