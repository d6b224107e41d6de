r"""ETC's long queries with Rich Attention as one fused Pallas kernel, forward and backward.

`flaxdoc.nn.etc_attention.global_local_attention` builds ETC's long-query scores as
XLA arrays: blocked keys `[B, nb, 3b, H, D]` (copies), logits `[B, nb, H, b, 3b + G]`
in float32, Rich Attention's pairwise terms per axis, a mask, a softmax and dropout,
each a pass over memory, forward and again backward. On an H100 that is 47% of a
FormNet-A2 pre-training step's kernel time (README, Accelerators). This module computes
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

Dropout draws its keep mask from a counter hash of `(seed, batch, head, query, key)`
(murmur3's finaliser), so the backward kernels regenerate it instead of storing it.
It is a different random stream from the XLA path's `jax.random.bernoulli`: both are
inverted dropout at the same rate (`dropout_keep` is the same hash in `jnp`).

The kernels run on GPUs through Pallas' Triton backend; elsewhere (CPU tests) with
`interpret=True`. ETC's relative position ids and layout terms other than Rich
Attention are not supported here (`EtcAttention(kernel="pallas")` says so).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

Array = jax.Array
F32 = jnp.float32
NEG = -1e30  # the max of a row with no key yet; finite, so exp(m_old - m_new) is never NaN
GLOBAL_KEY_ID = 1 << 30  # key id of global g in the dropout hash: GLOBAL_KEY_ID + g
# The kernels see one int per token: its document id, or one of these for an invalid
# query / key (so they never match). Document ids may be any other int32.
INVALID_QUERY = -(2 ** 31)
INVALID_KEY = -(2 ** 31) + 1


@dataclasses.dataclass(frozen=True)
class Tiles:
  """Tile sizes (powers of two, >= 16 on a GPU) and Triton warps, forward and backward.

  The backward holds more `[BQ, BK]` arrays at once (weights, their gradient, Rich's
  pieces), so it gets its own sizes: too many live tiles spill registers. The defaults
  are the fastest of seven tried on an H100 (FormNet-A2's layer, 16 x 1,024 tokens,
  bf16; README, Accelerators): the backward took 7.2 ms with 64 x 64 tiles and 4 warps,
  13.2 ms with 8 warps, 2.3 ms with 32 x 32.
  """
  block_q: int = 32
  block_k: int = 64
  warps: int = 4
  backward_block_q: int = 32
  backward_block_k: int = 32
  backward_warps: int = 4


DEFAULT_TILES = Tiles()


@dataclasses.dataclass(frozen=True)
class Config:
  """Static sizes of one call (hashable: it is the custom VJP's non-differentiable part)."""
  radius: int
  length: int  # N, long tokens
  num_globals: int  # G
  num_axes: int  # A, Rich axes (0: no Rich term)
  dropout_rate: float
  block_q: int
  block_k: int
  warps: int
  interpret: bool
  backward_tiles: tuple[int, int, int]  # (block_q, block_k, warps) of the backward kernels

  def backward(self) -> "Config":
    bq, bk, warps = self.backward_tiles
    return dataclasses.replace(self, block_q=bq, block_k=bk, warps=warps)

  @property
  def q_tiles(self) -> int:
    return -(-self.length // self.block_q)

  @property
  def padded_q(self) -> int:  # long queries padded to whole tiles
    return self.q_tiles * self.block_q

  @property
  def key_tiles(self) -> int:  # key tiles per query tile: the window [i0 - r, i0 + BQ - 1 + r]
    return -(-(self.block_q + 2 * self.radius) // self.block_k)

  @property
  def padded_k(self) -> int:  # r zero keys on the left, enough on the right for the last window
    last = self.padded_q - self.block_q + self.key_tiles * self.block_k
    return -(-last // self.block_k) * self.block_k  # whole key tiles (the dk/dv grid)

  @property
  def padded_g(self) -> int:  # Triton's dots want >= 16 rows
    return max(16, int(pl.next_power_of_2(max(self.num_globals, 1))))

  @property
  def padded_a(self) -> int:
    return max(1, int(pl.next_power_of_2(max(self.num_axes, 1))))


# --------------------------------------------------------------------------- pairwise pieces
def _fmix32(x):
  """murmur3's 32-bit finaliser: a bijection that mixes every input bit into every output bit."""
  x = x ^ lax.shift_right_logical(x, jnp.uint32(16))
  x = x * jnp.uint32(0x85EBCA6B)
  x = x ^ lax.shift_right_logical(x, jnp.uint32(13))
  x = x * jnp.uint32(0xC2B2AE35)
  return x ^ lax.shift_right_logical(x, jnp.uint32(16))


def dropout_keep(seed, batch_head, query, key, rate: float):
  """Keep mask of pair `(query, key)` (broadcasting int arrays) for stream `(seed, batch_head)`.

  `batch_head = b * H + h`; `key` is the long key index or `GLOBAL_KEY_ID + g`. Keeps
  with probability `1 - rate` (24-bit resolution). Used inside the kernels and by tests.
  """
  u32 = jnp.uint32
  stream = _fmix32(jnp.asarray(seed).astype(u32) + jnp.asarray(batch_head).astype(u32)
                   * u32(0x9E3779B9))
  row = _fmix32(stream ^ (jnp.asarray(query).astype(u32) * u32(0x27D4EB2F)))
  pair = _fmix32(row ^ (jnp.asarray(key).astype(u32) * u32(0x165667B1)))
  bits = lax.shift_right_logical(pair, u32(8)).astype(jnp.int32)  # [0, 2^24)
  return bits >= int(round(rate * (1 << 24)))


def _log_sigmoid(x):
  return jnp.minimum(x, 0.0) - jnp.log1p(jnp.exp(-jnp.abs(x)))


def _dot(a, b):
  return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=F32)


def _dot_t(a, b):  # a @ b.T
  return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=F32)


def _rich(cfg, q_side, k_side, theta_ref):
  """Rich logits of a `[BQ, BK]` tile; q_side per axis `(order, dist, coord)` `[BQ]`, k_side `[BK]`."""
  total = 0.0
  for a in range(cfg.num_axes):
    (oq, dq, cq), (ok, dk, ck) = q_side[a], k_side[a]
    z = oq[:, None] + ok[None, :]
    u = jnp.where(cq[:, None] < ck[None, :], z, -z)
    resid = jnp.log1p(jnp.abs(cq[:, None] - ck[None, :])) - (dq[:, None] + dk[None, :])
    theta = theta_ref[a]
    total = total + _log_sigmoid(u) - 0.5 * theta * theta * resid * resid
  return total


def _q_side(cfg, oq_ref, dq_ref, cq_ref, at):
  return [(oq_ref[a, at], dq_ref[a, at], cq_ref[a, at]) for a in range(cfg.num_axes)]


# --------------------------------------------------------------------------- forward
def _forward_kernel(cfg, seed_ref, q_ref, k_ref, v_ref, kg_ref, vg_ref, qdoc_ref, kdoc_ref,
                    gdoc_ref, oq_ref, okk_ref, dq_ref, dk_ref, cq_ref, ck_ref, theta_ref,
                    o_ref, lse_ref):
  b, h, iq = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  bq, bk, r = cfg.block_q, cfg.block_k, cfg.radius
  scale = 1.0 / math.sqrt(q_ref.shape[-1])
  i0 = iq * bq
  qi = i0 + jnp.arange(bq)
  q = q_ref[...]  # [BQ, D]
  qdoc = qdoc_ref[...]  # [BQ]
  q_side = _q_side(cfg, oq_ref, dq_ref, cq_ref, slice(None))
  seed, bh = seed_ref[0], b * pl.num_programs(1) + h
  keep_scale = 1.0 / (1.0 - cfg.dropout_rate) if cfg.dropout_rate else 1.0

  def fold(carry, s, valid, vals, key_ids):
    m, l, acc = carry
    s = jnp.where(valid, s, NEG)
    m_new = jnp.maximum(m, s.max(axis=1))
    p = jnp.where(valid, jnp.exp(s - m_new[:, None]), 0.0)
    alpha = jnp.exp(m - m_new)
    l = alpha * l + p.sum(axis=1)
    if cfg.dropout_rate:
      keep = dropout_keep(seed, bh, qi[:, None], key_ids[None, :], cfg.dropout_rate)
      p = jnp.where(keep, p * keep_scale, 0.0)
    acc = alpha[:, None] * acc + _dot(p.astype(vals.dtype), vals)
    return m_new, l, acc

  # The global keys first: one tile of Gp (padding invalid), no Rich term.
  kg = kg_ref[...]
  s = _dot_t(q, kg) * scale
  valid = qdoc[:, None] == gdoc_ref[...][None, :]
  g_ids = GLOBAL_KEY_ID + jnp.arange(cfg.padded_g)
  carry = (jnp.full((bq,), NEG, F32), jnp.zeros((bq,), F32),
           jnp.zeros((bq, v_ref.shape[-1]), F32))
  carry = fold(carry, s, valid, vg_ref[...], g_ids)

  def body(t, carry):
    ks = i0 + t * bk  # padded key position; long index ks - r
    at = pl.ds(ks, bk)
    kj = ks - r + jnp.arange(bk)
    s = _dot_t(q, k_ref[at, :]) * scale
    if cfg.num_axes:
      k_side = _q_side(cfg, okk_ref, dk_ref, ck_ref, at)
      s = s + _rich(cfg, q_side, k_side, theta_ref)
    valid = ((jnp.abs(qi[:, None] - kj[None, :]) <= r)
             & (qdoc[:, None] == kdoc_ref[at][None, :]))
    return fold(carry, s, valid, v_ref[at, :], kj)

  m, l, acc = lax.fori_loop(0, cfg.key_tiles, body, carry)
  o_ref[...] = jnp.where(l[:, None] > 0, acc / jnp.where(l > 0, l, 1.0)[:, None],
                         0.0).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), 0.0)


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
      seed=pl.BlockSpec((1,), lambda b, h, i: (0,)),
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


def _call(cfg, kernel, grid, in_specs, out_specs, out_shape, name):
  kwargs = {}
  if not cfg.interpret:
    from jax.experimental.pallas import triton as plgpu  # pylint: disable=import-outside-toplevel
    kwargs["compiler_params"] = plgpu.CompilerParams(num_warps=cfg.warps, num_stages=2)
  return pl.pallas_call(functools.partial(kernel, cfg), grid=grid, in_specs=in_specs,
                        out_specs=out_specs, out_shape=out_shape, interpret=cfg.interpret,
                        name=name, **kwargs)


def _prepare(cfg, q, k, v, kg, vg, oq, ok, dq, dk, theta, coords, long_doc, global_doc):
  """Pads everything to the kernels' layout (zeros / invalid documents in the padding)."""
  n, nq, lk, r = cfg.length, cfg.padded_q, cfg.padded_k, cfg.radius
  pad_q = lambda x, axis: jnp.pad(x, [(0, nq - n) if d == axis else (0, 0)  # noqa: E731
                                      for d in range(x.ndim)])
  pad_k = lambda x, axis: jnp.pad(x, [(r, lk - r - n) if d == axis else (0, 0)  # noqa: E731
                                      for d in range(x.ndim)])
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
      qdoc=jnp.pad(query_doc, [(0, 0), (0, nq - n)], constant_values=INVALID_QUERY),
      kdoc=jnp.pad(key_doc, [(0, 0), (r, lk - r - n)], constant_values=INVALID_KEY),
      gdoc=jnp.pad(global_doc, [(0, 0), (0, gp - g)], constant_values=INVALID_KEY),
      oq=oq_, ok=ok_, dq=dq_, dk=dk_, cq=cq, ck=ck, theta=th)


def _forward(cfg, seed, x):
  batch, _, heads, head_dim = x["q"].shape
  sp = _specs(cfg, head_dim, tiled_q=True)
  in_specs = [sp["seed"], sp["q"], sp["k"], sp["k"], sp["g"], sp["g"], sp["qdoc"], sp["kdoc"],
              sp["gdoc"], sp["q_axes"], sp["k_axes"], sp["q_axes"], sp["k_axes"], sp["q_coord"],
              sp["k_coord"], sp["theta"]]
  out_shape = [jax.ShapeDtypeStruct(x["q"].shape, x["v"].dtype),
               jax.ShapeDtypeStruct((batch, heads, cfg.padded_q), F32)]
  o, lse = _call(cfg, _forward_kernel, (batch, heads, cfg.q_tiles), in_specs,
                 [sp["q"], sp["q_vec"]], out_shape, "etc_rich_forward")(
                     seed, x["q"], x["k"], x["v"], x["kg"], x["vg"], x["qdoc"], x["kdoc"],
                     x["gdoc"], x["oq"], x["ok"], x["dq"], x["dk"], x["cq"], x["ck"],
                     x["theta"])
  return o, lse


# --------------------------------------------------------------------------- backward
def _pair_grads(cfg, seed, bh, qi, kj, q, k, v, do, lse, delta, q_side, k_side, theta_ref,
                valid, rich_axis=None):
  """Recomputed weights of a `[BQ, BK]` tile and the gradient of its logits.

  Returns `(p_dropped, ds, rich)`: the weights after dropout (for `dv`), `dL/dlogit`,
  and per Rich axis the gradients of the order and distance scalars summed over
  `rich_axis` (1: per query, with `d theta` per query too; 0: per key). Rich's pairwise
  pieces are recomputed here rather than kept from the logits: keeping them alive
  through the softmax spills registers.
  """
  scale = 1.0 / math.sqrt(q.shape[-1])
  s = _dot_t(q, k) * scale
  use_rich = cfg.num_axes and k_side is not None
  if use_rich:
    s = s + _rich(cfg, q_side, k_side, theta_ref)
  p = jnp.where(valid, jnp.exp(s - lse[:, None]), 0.0)
  dp = _dot_t(do, v)  # d(loss)/d(dropped weight)
  if cfg.dropout_rate:
    keep = dropout_keep(seed, bh, qi[:, None], kj[None, :], cfg.dropout_rate)
    keep_scale = 1.0 / (1.0 - cfg.dropout_rate)
    dp = jnp.where(keep, dp * keep_scale, 0.0)
    p_dropped = jnp.where(keep, p * keep_scale, 0.0)
  else:
    p_dropped = p
  ds = p * (dp - delta[:, None])
  rich = []
  for a in range(cfg.num_axes if use_rich else 0):
    (oq, dq, cq), (ok, dk, ck) = q_side[a], k_side[a]
    before = cq[:, None] < ck[None, :]
    z = oq[:, None] + ok[None, :]
    u = jnp.where(before, z, -z)
    d_order = ds / (1.0 + jnp.exp(u))  # d log_sigmoid(u) / du = sigmoid(-u)
    d_order = jnp.where(before, d_order, -d_order).sum(axis=rich_axis)
    resid = jnp.log1p(jnp.abs(cq[:, None] - ck[None, :])) - (dq[:, None] + dk[None, :])
    theta = theta_ref[a]
    ds_resid = ds * resid
    d_dist = (theta * theta) * ds_resid.sum(axis=rich_axis)
    if rich_axis == 1:
      rich.append((d_order, d_dist, -theta * (ds_resid * resid).sum(axis=1)))
    else:
      rich.append((d_order, d_dist))
  return p_dropped, ds, rich


def _dq_kernel(cfg, seed_ref, q_ref, k_ref, v_ref, kg_ref, vg_ref, qdoc_ref, kdoc_ref, gdoc_ref,
               oq_ref, okk_ref, dq_ref, dk_ref, cq_ref, ck_ref, theta_ref, do_ref, lse_ref,
               delta_ref, dq_out, doq_out, ddq_out, dth_out, dkg_out, dvg_out):
  b, h, iq = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  bq, bk, r = cfg.block_q, cfg.block_k, cfg.radius
  scale = 1.0 / math.sqrt(q_ref.shape[-1])
  i0 = iq * bq
  qi = i0 + jnp.arange(bq)
  q, do = q_ref[...], do_ref[...]
  lse, delta, qdoc = lse_ref[...], delta_ref[...], qdoc_ref[...]
  q_side = _q_side(cfg, oq_ref, dq_ref, cq_ref, slice(None))
  seed, bh = seed_ref[0], b * pl.num_programs(1) + h

  # Global keys: their dk / dv are this tile's partial sums (added up outside).
  kg, vg = kg_ref[...], vg_ref[...]
  valid = qdoc[:, None] == gdoc_ref[...][None, :]
  g_ids = GLOBAL_KEY_ID + jnp.arange(cfg.padded_g)
  p_dropped, ds, _ = _pair_grads(cfg, seed, bh, qi, g_ids, q, kg, vg, do, lse, delta, q_side,
                                 None, theta_ref, valid)
  dkg_out[...] = _dot(ds.T.astype(q.dtype), q) * scale
  dvg_out[...] = _dot(p_dropped.T.astype(do.dtype), do)
  dq = _dot(ds.astype(kg.dtype), kg)
  zeros = jnp.zeros((bq,), F32)
  rich_acc = tuple((zeros, zeros, zeros) for _ in range(cfg.num_axes))

  def body(t, carry):
    dq, rich_acc = carry
    ks = i0 + t * bk
    at = pl.ds(ks, bk)
    kj = ks - r + jnp.arange(bk)
    k = k_ref[at, :]
    k_side = _q_side(cfg, okk_ref, dk_ref, ck_ref, at) if cfg.num_axes else None
    valid = ((jnp.abs(qi[:, None] - kj[None, :]) <= r)
             & (qdoc[:, None] == kdoc_ref[at][None, :]))
    _, ds, grads = _pair_grads(cfg, seed, bh, qi, kj, q, k, v_ref[at, :], do, lse, delta,
                               q_side, k_side, theta_ref, valid, rich_axis=1)
    dq = dq + _dot(ds.astype(k.dtype), k)
    rich_acc = tuple(tuple(acc + g for acc, g in zip(accs, gs))
                     for accs, gs in zip(rich_acc, grads))
    return dq, rich_acc

  dq, rich_acc = lax.fori_loop(0, cfg.key_tiles, body, (dq, rich_acc))
  dq_out[...] = dq * scale
  for a, (d_order, d_dist, d_theta) in enumerate(rich_acc):
    doq_out[a, :] = d_order
    ddq_out[a, :] = d_dist
    dth_out[a, :] = d_theta


def _dkv_kernel(cfg, seed_ref, q_ref, k_ref, v_ref, qdoc_ref, kdoc_ref, oq_ref, okk_ref, dq_ref,
                dk_ref, cq_ref, ck_ref, theta_ref, do_ref, lse_ref, delta_ref,
                dk_out, dv_out, dok_out, ddk_out):
  b, h, jk = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  bq, bk, r = cfg.block_q, cfg.block_k, cfg.radius
  scale = 1.0 / math.sqrt(q_ref.shape[-1])
  j0 = jk * bk  # padded key position of the tile; long index j0 - r
  kj = j0 - r + jnp.arange(bk)
  k, v, kdoc = k_ref[...], v_ref[...], kdoc_ref[...]
  k_side = _q_side(cfg, okk_ref, dk_ref, ck_ref, slice(None)) if cfg.num_axes else None
  seed, bh = seed_ref[0], b * pl.num_programs(1) + h
  # Query tiles that can see these keys: long queries [j0 - 2r, j0 + BK - 1].
  lo = jnp.maximum(j0 - 2 * r, 0) // bq
  hi = jnp.minimum((j0 + bk - 1) // bq, cfg.q_tiles - 1) + 1
  zeros = jnp.zeros((bk,), F32)
  rich_acc = tuple((zeros, zeros) for _ in range(cfg.num_axes))
  acc0 = jnp.zeros((bk, k.shape[-1]), F32)

  def body(t, carry):
    dk, dv, rich_acc = carry
    at = pl.ds(t * bq, bq)
    qi = t * bq + jnp.arange(bq)
    q, do = q_ref[at, :], do_ref[at, :]
    q_side = _q_side(cfg, oq_ref, dq_ref, cq_ref, at)
    valid = ((jnp.abs(qi[:, None] - kj[None, :]) <= r)
             & (qdoc_ref[at][:, None] == kdoc[None, :]))
    p_dropped, ds, grads = _pair_grads(cfg, seed, bh, qi, kj, q, k, v, do, lse_ref[at],
                                       delta_ref[at], q_side, k_side, theta_ref, valid,
                                       rich_axis=0)
    dv = dv + _dot(p_dropped.T.astype(do.dtype), do)
    dk = dk + _dot(ds.T.astype(q.dtype), q)
    rich_acc = tuple((acc_o + g[0], acc_d + g[1]) for (acc_o, acc_d), g in zip(rich_acc, grads))
    return dk, dv, rich_acc

  dk, dv, rich_acc = lax.fori_loop(lo, hi, body, (acc0, acc0, rich_acc))
  dk_out[...] = dk * scale
  dv_out[...] = dv
  for a, (d_order, d_dist) in enumerate(rich_acc):
    dok_out[a, :] = d_order
    ddk_out[a, :] = d_dist


def _backward(cfg, seed, x, o, lse, do):
  batch, _, heads, head_dim = x["q"].shape
  nq, lk, ap, gp, nqt = cfg.padded_q, cfg.padded_k, cfg.padded_a, cfg.padded_g, cfg.q_tiles
  do = jnp.pad(do, [(0, 0), (0, nq - cfg.length), (0, 0), (0, 0)])
  delta = jnp.swapaxes(jnp.sum(do.astype(F32) * o.astype(F32), axis=-1), 1, 2)  # [B, H, Nq]

  sp = _specs(cfg, head_dim, tiled_q=True)
  tile_parts = pl.BlockSpec((None, None, None, gp, head_dim), lambda b, h, i: (b, h, i, 0, 0))
  dq, d_oq, d_dq, d_theta, dkg, dvg = _call(
      cfg, _dq_kernel, (batch, heads, nqt),
      [sp["seed"], sp["q"], sp["k"], sp["k"], sp["g"], sp["g"], sp["qdoc"], sp["kdoc"],
       sp["gdoc"], sp["q_axes"], sp["k_axes"], sp["q_axes"], sp["k_axes"], sp["q_coord"],
       sp["k_coord"], sp["theta"], sp["q"], sp["q_vec"], sp["q_vec"]],
      [sp["q"], sp["q_axes"], sp["q_axes"], sp["q_axes"], tile_parts, tile_parts],
      [jax.ShapeDtypeStruct((batch, nq, heads, head_dim), F32)]
      + [jax.ShapeDtypeStruct((batch, heads, ap, nq), F32)] * 3
      + [jax.ShapeDtypeStruct((batch, heads, nqt, gp, head_dim), F32)] * 2,
      "etc_rich_backward_dq")(
          seed, x["q"], x["k"], x["v"], x["kg"], x["vg"], x["qdoc"], x["kdoc"], x["gdoc"],
          x["oq"], x["ok"], x["dq"], x["dk"], x["cq"], x["ck"], x["theta"], do, lse, delta)

  full = _specs(cfg, head_dim, tiled_q=False)
  bk = cfg.block_k
  k_tile = pl.BlockSpec((None, bk, None, head_dim), lambda b, h, j: (b, j, h, 0))
  k_axes = pl.BlockSpec((None, None, ap, bk), lambda b, h, j: (b, h, 0, j))
  dk, dv, d_ok, d_dk = _call(
      cfg, _dkv_kernel, (batch, heads, lk // bk),
      [full["seed"], full["q"], k_tile, k_tile, full["qdoc"],
       pl.BlockSpec((None, bk), lambda b, h, j: (b, j)), full["q_axes"], k_axes,
       full["q_axes"], k_axes, full["q_coord"],
       pl.BlockSpec((None, ap, bk), lambda b, h, j: (b, 0, j)), full["theta"], full["q"],
       full["q_vec"], full["q_vec"]],
      [k_tile, k_tile, k_axes, k_axes],
      [jax.ShapeDtypeStruct((batch, lk, heads, head_dim), F32)] * 2
      + [jax.ShapeDtypeStruct((batch, heads, ap, lk), F32)] * 2,
      "etc_rich_backward_dkv")(
          seed, x["q"], x["k"], x["v"], x["qdoc"], x["kdoc"], x["oq"], x["ok"], x["dq"],
          x["dk"], x["cq"], x["ck"], x["theta"], do, lse, delta)
  return dict(dq=dq, dk=dk, dv=dv, dkg=dkg.sum(axis=2), dvg=dvg.sum(axis=2), d_oq=d_oq,
              d_dq=d_dq, d_theta=d_theta, d_ok=d_ok, d_dk=d_dk)


# --------------------------------------------------------------------------- public function
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attend(cfg, seed, q, k, v, kg, vg, oq, ok, dq, dk, theta, coords, long_doc, global_doc):
  x = _prepare(cfg, q, k, v, kg, vg, oq, ok, dq, dk, theta, coords, long_doc, global_doc)
  return _forward(cfg, seed, x)[0][:, :cfg.length]


def _attend_fwd(cfg, seed, q, k, v, kg, vg, oq, ok, dq, dk, theta, coords, long_doc,
                global_doc):
  x = _prepare(cfg, q, k, v, kg, vg, oq, ok, dq, dk, theta, coords, long_doc, global_doc)
  o, lse = _forward(cfg, seed, x)
  res = (seed, q, k, v, kg, vg, oq, ok, dq, dk, theta, coords, long_doc, global_doc, o, lse)
  return o[:, :cfg.length], res


def _attend_bwd(cfg, res, do):
  seed, q, k, v, kg, vg, oq, ok, dq, dk, theta, coords, long_doc, global_doc, o, lse = res
  cfg = cfg.backward()  # its own tiles: the padded layout may differ from the forward's
  x = _prepare(cfg, q, k, v, kg, vg, oq, ok, dq, dk, theta, coords, long_doc, global_doc)
  extra = cfg.padded_q - cfg.length
  o = jnp.pad(o[:, :cfg.length], [(0, 0), (0, extra), (0, 0), (0, 0)])
  lse = jnp.pad(lse[..., :cfg.length], [(0, 0), (0, 0), (0, extra)])
  g = _backward(cfg, seed, x, o, lse, do)
  n, r, a = cfg.length, cfg.radius, cfg.num_axes
  keys = lambda y: y[:, r:r + n]  # noqa: E731
  globals_ = lambda y, like: jnp.swapaxes(y, 1, 2)[:, :cfg.num_globals].astype(like.dtype)  # noqa: E731
  if a:
    per_q = lambda y, like: jnp.swapaxes(y[:, :, :a, :n], -1, -2).astype(like.dtype)  # noqa: E731
    per_k = lambda y, like: jnp.swapaxes(y[:, :, :a, r:r + n], -1, -2).astype(like.dtype)  # noqa: E731
    rich = (per_q(g["d_oq"], oq), per_k(g["d_ok"], ok), per_q(g["d_dq"], dq),
            per_k(g["d_dk"], dk), g["d_theta"][:, :, :a].sum(axis=(0, 3)).astype(theta.dtype))
  else:
    rich = tuple(jnp.zeros_like(y) for y in (oq, ok, dq, dk, theta))
  return ((None, g["dq"][:, :n].astype(q.dtype), keys(g["dk"]).astype(k.dtype),
           keys(g["dv"]).astype(v.dtype), globals_(g["dkg"], kg), globals_(g["dvg"], vg))
          + rich + (None, None, None))


_attend.defvjp(_attend_fwd, _attend_bwd)


def long_query_attention(q_long: Array, k_long: Array, v_long: Array, k_global: Array,
                         v_global: Array, long_valid: Array, global_valid: Array, *,
                         local_radius: int, long_document_ids: Array | None = None,
                         global_document_ids: Array | None = None, rich=None,
                         dropout_rate: float = 0.0, dropout_seed: Array | None = None,
                         tiles: Tiles | None = None, interpret: bool | None = None) -> Array:
  """ETC's long queries (`l2l` + `l2g`, one softmax) in one fused kernel: `[B, N, H, D]`.

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
    tiles: `Tiles` (default `DEFAULT_TILES`).
    interpret: run the Pallas interpreter (default: when the backend is not a GPU).

  Returns:
    `[B, N, H, D]` in `v_long`'s dtype; queries with no valid key get zeros.
  """
  batch, length, heads, head_dim = q_long.shape
  num_globals = k_global.shape[1]
  if interpret is None:
    interpret = jax.default_backend() != "gpu"
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
  return _attend(cfg, seed, q_long, k_long, v_long, k_global, v_global.astype(v_long.dtype),
                 oq, ok, dq, dk, theta, jnp.asarray(coords, F32), long_doc, global_doc)
