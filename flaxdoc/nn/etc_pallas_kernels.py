"""The kernel bodies of `flaxdoc.nn.etc_pallas` (forward, and the two backward kernels).

Each runs on one `(batch, head, tile)` grid point with the refs `etc_pallas` lays out:
long queries padded to whole query tiles, long keys padded to whole key tiles (on the
right only, so at the usual lengths, multiples of the tiles, nothing is padded and the
projections' outputs go to the kernels as they are), per-axis Rich scalars as rows
`[A, tokens]`, one int per token for its document or `INVALID_QUERY` / `INVALID_KEY`.
A query tile's key window is clipped to the keys that exist (`Config.key_window`).
Everything pairwise lives in registers: a `[BQ, BK]` tile of scores, its Rich term, its
mask and (backward) its gradient; the key-tile backward holds the same tiles transposed,
`[BK, BQ]`. `Config` carries the static sizes.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from flaxdoc.nn import pallas_math as pm
from flaxdoc.nn.dropout import COLUMN_MIX, ROW_MIX, fmix32

F32 = jnp.float32
NEG = -1e30  # the max of a row with no key yet; finite, so exp(m_old - m_new) is never NaN
GLOBAL_KEY_ID = 1 << 30  # key id of global g in the dropout hash: GLOBAL_KEY_ID + g
# The kernels see one int per token: its document id, or one of these for an invalid
# query / key (so they never match). Document ids may be any other int32.
INVALID_QUERY = -(2 ** 31)
INVALID_KEY = -(2 ** 31) + 1


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
  def padded_k(self) -> int:  # long keys padded to whole key tiles (the dk/dv grid)
    return -(-self.length // self.block_k) * self.block_k

  def key_window(self, i0, lib=jnp):
    """`(first key, key tiles)` of query tile `i0`: its window `[i0 - r, i0 + BQ - 1 + r]`
    clipped to the padded keys. Clipping instead of padding `r` keys on each side: no
    copy of `k` / `v` around the kernels, and edge tiles visit fewer keys. `lib`: `jnp`
    in a kernel, `numpy` where `bench.kernel_sass` counts passes."""
    return _window(i0 - self.radius, i0 + self.block_q - 1 + self.radius, self.padded_k,
                   self.block_k, lib)

  def query_window(self, j0, lib=jnp):
    """`(first query, query tiles)` that see key tile `j0`: queries in `[j0 - r, j0 + BK - 1
    + r]`, clipped to the padded queries. Tiled from the window's first query, not on the
    forward's query grid: 13 tiles of 16 for FormNet's 200-query windows, where the grid
    would need 14 (r = 84 is 4 mod 16)."""
    return _window(j0 - self.radius, j0 + self.block_k - 1 + self.radius, self.padded_q,
                   self.block_q, lib)

  def clamp_key_tile(self, first, t):
    """`(start, fresh)` of tile `t` of a key window from `first` (`_clamp_tile`)."""
    return _clamp_tile(first, t, self.padded_k, self.block_k)

  def clamp_query_tile(self, first, t):
    """`(start, fresh)` of tile `t` of a query window from `first` (`_clamp_tile`)."""
    return _clamp_tile(first, t, self.padded_q, self.block_q)

  @property
  def padded_g(self) -> int:  # Triton's dots want >= 16 rows
    return max(16, int(pl.next_power_of_2(max(self.num_globals, 1))))

  @property
  def stored_g(self) -> int:
    """Rows of the global keys' `dk` / `dv` partial sums a `dq` program writes: the `G`
    real ones, as a power of two, not the `Gp >= 16` of the dots (with FormNet's one
    global, 1 row instead of 16: 3 MB a layer at 16 x 1,024 instead of 50 per array)."""
    return int(pl.next_power_of_2(max(self.num_globals, 1)))

  @property
  def padded_a(self) -> int:
    return max(1, int(pl.next_power_of_2(max(self.num_axes, 1))))


def _window(lo, hi, size, block, lib):
  """`(first, tiles)`: tiles of `block` from `first` covering `[lo, hi]` clipped to
  `[0, size)` (0 tiles when nothing is left)."""
  first = lib.maximum(lo, 0)
  return first, (lib.minimum(hi, size - 1) - first) // block + 1


def _clamp_tile(first, t, size, block):
  """`(start, fresh)`: where tile `t` of a window from `first` is loaded, and a `[block]`
  mask of its rows that tile `t - 1` has not visited. A window's last tile may reach past
  the array; it is moved back to end at `size` (a multiple of `block`), so no load ever
  leaves the array, and the rows it shares with the tile before are masked out."""
  nominal = first + t * block
  start = jnp.minimum(nominal, size - block)
  return start, start + jnp.arange(block) >= nominal


# --------------------------------------------------------------------------- pairwise pieces
def dropout_keep(seed, batch_head, query, key, rate: float):
  """Keep mask of pair `(query, key)` (broadcasting int arrays) for stream `(seed, batch_head)`.

  `batch_head = b * H + h`; `key` is the long key index or `GLOBAL_KEY_ID + g`. Keeps
  with probability `1 - rate` (24-bit resolution). Used inside the kernels and by tests.
  """
  u32 = jnp.uint32
  stream = fmix32(jnp.asarray(seed).astype(u32) + jnp.asarray(batch_head).astype(u32)
                   * u32(0x9E3779B9))
  row = fmix32(stream ^ (jnp.asarray(query).astype(u32) * u32(ROW_MIX)))
  pair = fmix32(row ^ (jnp.asarray(key).astype(u32) * u32(COLUMN_MIX)))
  bits = lax.shift_right_logical(pair, u32(8)).astype(jnp.int32)  # [0, 2^24)
  return bits >= int(round(rate * (1 << 24)))


def _dot(a, b):
  return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=F32)


def _dot_t(a, b):  # a @ b.T
  return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=F32)


def _pair(transposed: bool, q_vec, k_vec):
  """A per-query and a per-key vector broadcast against each other: as a `[BQ, BK]` tile,
  or `[BK, BQ]` when `transposed` (the key-tile backward's orientation)."""
  if transposed:
    return q_vec[None, :], k_vec[:, None]
  return q_vec[:, None], k_vec[None, :]


def _rich_pieces(cfg, q_side_a, k_side_a, transposed):
  """`(before, z, resid)` of one Rich axis over a tile (see `_rich`)."""
  (oq, dq, cq), (ok, dk, ck) = q_side_a, k_side_a
  (oq, ok), (dq, dk), (cq, ck) = (_pair(transposed, *v) for v in ((oq, ok), (dq, dk), (cq, ck)))
  # ln(1 + |c_i - c_j|) of page coordinates (0..1000): the log of the rounded sum agrees
  # with log1p to float32's rounding here, at a tenth of its instructions (`pallas_math`).
  return cq < ck, oq + ok, pm.log1p(jnp.abs(cq - ck), cfg.interpret) - (dq + dk)


def _rich(cfg, q_side, k_side, theta_ref, transposed=False):
  """Rich logits of a `[BQ, BK]` tile (`[BK, BQ]` when `transposed`).

  q_side: per axis `(order, dist, coord)`, each `[BQ]`; k_side likewise, `[BK]`.
  """
  total = 0.0
  for a in range(cfg.num_axes):
    before, z, resid = _rich_pieces(cfg, q_side[a], k_side[a], transposed)
    u = jnp.where(before, z, -z)
    theta = theta_ref[a]
    total = total + pm.log_sigmoid(u, cfg.interpret) - 0.5 * theta * theta * resid * resid
  return total


def _q_side(cfg, oq_ref, dq_ref, cq_ref, at):
  return [(oq_ref[a, at], dq_ref[a, at], cq_ref[a, at]) for a in range(cfg.num_axes)]


def _key_doc(kdoc_ref, at, fresh):
  """The key tile's documents, with keys an earlier tile visited made invalid (a `[BK]`
  select, cheaper than masking the `[BQ, BK]` pairs)."""
  return jnp.where(fresh, kdoc_ref[at], INVALID_KEY)


# --------------------------------------------------------------------------- forward
def forward_kernel(cfg, seed_ref, q_ref, k_ref, v_ref, kg_ref, vg_ref, qdoc_ref, kdoc_ref,
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
  seed, bh = seed_ref[0], (seed_ref[1] + b) * pl.num_programs(1) + h
  keep_scale = 1.0 / (1.0 - cfg.dropout_rate) if cfg.dropout_rate else 1.0

  def fold(carry, s, valid, vals, key_ids):
    m, l, acc = carry
    s = jnp.where(valid, s, NEG)
    m_new = jnp.maximum(m, s.max(axis=1))
    p = jnp.where(valid, pm.exp(s - m_new[:, None], cfg.interpret), 0.0)
    alpha = pm.exp(m - m_new, cfg.interpret)
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

  first, tiles = cfg.key_window(i0)

  def body(t, carry):
    ks, fresh = cfg.clamp_key_tile(first, t)
    at = pl.ds(ks, bk)
    kj = ks + jnp.arange(bk)
    s = _dot_t(q, k_ref[at, :]) * scale
    if cfg.num_axes:
      k_side = _q_side(cfg, okk_ref, dk_ref, ck_ref, at)
      s = s + _rich(cfg, q_side, k_side, theta_ref)
    valid = ((jnp.abs(qi[:, None] - kj[None, :]) <= r)
             & (qdoc[:, None] == _key_doc(kdoc_ref, at, fresh)[None, :]))
    return fold(carry, s, valid, v_ref[at, :], kj)

  m, l, acc = lax.fori_loop(0, tiles, body, carry)
  o_ref[...] = jnp.where(l[:, None] > 0, acc / jnp.where(l > 0, l, 1.0)[:, None],
                         0.0).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), 0.0)


# --------------------------------------------------------------------------- backward
def _pair_grads(cfg, seed, bh, qi, kj, q, k, v, do, lse, delta, q_side, k_side, theta_ref,
                valid, rich_sum=None, transposed=False):
  """Recomputed weights of a tile and the gradient of its logits.

  The tile is `[BQ, BK]`, or `[BK, BQ]` when `transposed` (as is `valid`): the key-tile
  backward works transposed so that `dv += p.T do` and `dk += ds.T q` take their tile
  as it is, with no transpose of a register tile, and its per-key sums run along rows.
  Returns `(p_dropped, ds, rich)`: the weights after dropout (for `dv`), `dL/dlogit`,
  and per Rich axis the gradients of the order and distance scalars summed per query
  (`rich_sum="query"`, with `d theta` too) or per key (`"key"`). Rich's pairwise
  pieces are recomputed here rather than kept from the logits: keeping them alive
  through the softmax spills registers.
  """
  if rich_sum not in (None, "query", "key"):
    raise ValueError(f"_pair_grads: rich_sum={rich_sum!r}, expected 'query' or 'key'")
  scale = 1.0 / math.sqrt(q.shape[-1])
  s = (_dot_t(k, q) if transposed else _dot_t(q, k)) * scale
  use_rich = cfg.num_axes and k_side is not None
  if use_rich:
    s = s + _rich(cfg, q_side, k_side, theta_ref, transposed)
  lse_b, delta_b = (lse[None, :], delta[None, :]) if transposed else (lse[:, None],
                                                                        delta[:, None])
  p = jnp.where(valid, pm.exp(s - lse_b, cfg.interpret), 0.0)
  dp = _dot_t(v, do) if transposed else _dot_t(do, v)  # d(loss)/d(dropped weight)
  if cfg.dropout_rate:
    keep = dropout_keep(seed, bh, *_pair(transposed, qi, kj), cfg.dropout_rate)
    keep_scale = 1.0 / (1.0 - cfg.dropout_rate)
    dp = jnp.where(keep, dp * keep_scale, 0.0)
    p_dropped = jnp.where(keep, p * keep_scale, 0.0)
  else:
    p_dropped = p
  ds = p * (dp - delta_b)
  rich = []
  query_axis, key_axis = (1, 0) if transposed else (0, 1)
  axis = key_axis if rich_sum == "query" else query_axis  # the axis summed over
  for a in range(cfg.num_axes if use_rich else 0):
    before, z, resid = _rich_pieces(cfg, q_side[a], k_side[a], transposed)
    u = jnp.where(before, z, -z)
    d_order = ds * pm.log_sigmoid_slope(u, cfg.interpret)
    d_order = jnp.where(before, d_order, -d_order).sum(axis=axis)
    theta = theta_ref[a]
    ds_resid = ds * resid
    d_dist = (theta * theta) * ds_resid.sum(axis=axis)
    if rich_sum == "query":
      rich.append((d_order, d_dist, -theta * (ds_resid * resid).sum(axis=axis)))
    else:
      rich.append((d_order, d_dist))
  return p_dropped, ds, rich


def _store_global_rows(cfg, out_ref, weights, rows, scale):
  """`weights.T @ rows * scale` (`[Gp, BQ] x [BQ, D]`) into `[stored_g, D]`: as a
  tensor-core product when every row is kept, else only the `G` real rows, each a
  weighted sum of the tile's rows (no `[Gp, D]` product to take rows from)."""
  if cfg.stored_g == cfg.padded_g:
    out_ref[...] = _dot(weights.T.astype(rows.dtype), rows) * scale
    return
  cols = jnp.arange(cfg.padded_g)[None, :]
  for g in range(cfg.num_globals):
    w = jnp.sum(jnp.where(cols == g, weights, 0.0), axis=1)  # [BQ]: global key g's column
    out_ref[g, :] = jnp.sum(w[:, None] * rows.astype(F32), axis=0) * scale


def dq_kernel(cfg, seed_ref, q_ref, k_ref, v_ref, kg_ref, vg_ref, qdoc_ref, kdoc_ref, gdoc_ref,
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
  seed, bh = seed_ref[0], (seed_ref[1] + b) * pl.num_programs(1) + h

  # Global keys: their dk / dv are this tile's partial sums (added up outside).
  kg, vg = kg_ref[...], vg_ref[...]
  valid = qdoc[:, None] == gdoc_ref[...][None, :]
  g_ids = GLOBAL_KEY_ID + jnp.arange(cfg.padded_g)
  p_dropped, ds, _ = _pair_grads(cfg, seed, bh, qi, g_ids, q, kg, vg, do, lse, delta, q_side,
                                 None, theta_ref, valid)
  _store_global_rows(cfg, dkg_out, ds, q, scale)
  _store_global_rows(cfg, dvg_out, p_dropped, do, 1.0)
  dq = _dot(ds.astype(kg.dtype), kg)
  zeros = jnp.zeros((bq,), F32)
  rich_acc = tuple((zeros, zeros, zeros) for _ in range(cfg.num_axes))

  first, tiles = cfg.key_window(i0)

  def body(t, carry):
    dq, rich_acc = carry
    ks, fresh = cfg.clamp_key_tile(first, t)
    at = pl.ds(ks, bk)
    kj = ks + jnp.arange(bk)
    k = k_ref[at, :]
    k_side = _q_side(cfg, okk_ref, dk_ref, ck_ref, at) if cfg.num_axes else None
    valid = ((jnp.abs(qi[:, None] - kj[None, :]) <= r)
             & (qdoc[:, None] == _key_doc(kdoc_ref, at, fresh)[None, :]))
    _, ds, grads = _pair_grads(cfg, seed, bh, qi, kj, q, k, v_ref[at, :], do, lse, delta,
                               q_side, k_side, theta_ref, valid, rich_sum="query")
    dq = dq + _dot(ds.astype(k.dtype), k)
    rich_acc = tuple(tuple(acc + g for acc, g in zip(accs, gs))
                     for accs, gs in zip(rich_acc, grads))
    return dq, rich_acc

  dq, rich_acc = lax.fori_loop(0, tiles, body, (dq, rich_acc))
  dq_out[...] = (dq * scale).astype(dq_out.dtype)
  for a, (d_order, d_dist, d_theta) in enumerate(rich_acc):
    doq_out[a, :] = d_order
    ddq_out[a, :] = d_dist
    dth_out[a, :] = d_theta


def dkv_kernel(cfg, seed_ref, q_ref, k_ref, v_ref, qdoc_ref, kdoc_ref, oq_ref, okk_ref, dq_ref,
                dk_ref, cq_ref, ck_ref, theta_ref, do_ref, lse_ref, delta_ref,
                dk_out, dv_out, dok_out, ddk_out):
  b, h, jk = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  bq, bk, r = cfg.block_q, cfg.block_k, cfg.radius
  scale = 1.0 / math.sqrt(q_ref.shape[-1])
  j0 = jk * bk
  kj = j0 + jnp.arange(bk)
  k, v, kdoc = k_ref[...], v_ref[...], kdoc_ref[...]
  k_side = _q_side(cfg, okk_ref, dk_ref, ck_ref, slice(None)) if cfg.num_axes else None
  seed, bh = seed_ref[0], (seed_ref[1] + b) * pl.num_programs(1) + h
  first, tiles = cfg.query_window(j0)
  zeros = jnp.zeros((bk,), F32)
  rich_acc = tuple((zeros, zeros) for _ in range(cfg.num_axes))
  acc0 = jnp.zeros((bk, k.shape[-1]), F32)

  def body(t, carry):
    dk, dv, rich_acc = carry
    qs, fresh = cfg.clamp_query_tile(first, t)
    at = pl.ds(qs, bq)
    qi = qs + jnp.arange(bq)
    q, do = q_ref[at, :], do_ref[at, :]
    q_side = _q_side(cfg, oq_ref, dq_ref, cq_ref, at)
    qdoc = jnp.where(fresh, qdoc_ref[at], INVALID_QUERY)  # rows the tile before visited
    valid = ((jnp.abs(kj[:, None] - qi[None, :]) <= r)
             & (kdoc[:, None] == qdoc[None, :]))  # [BK, BQ]: transposed tiles
    p_dropped, ds, grads = _pair_grads(cfg, seed, bh, qi, kj, q, k, v, do, lse_ref[at],
                                       delta_ref[at], q_side, k_side, theta_ref, valid,
                                       rich_sum="key", transposed=True)
    dv = dv + _dot(p_dropped.astype(do.dtype), do)  # [BK, BQ] @ [BQ, D]
    dk = dk + _dot(ds.astype(q.dtype), q)
    rich_acc = tuple((acc_o + g[0], acc_d + g[1]) for (acc_o, acc_d), g in zip(rich_acc, grads))
    return dk, dv, rich_acc

  dk, dv, rich_acc = lax.fori_loop(0, tiles, body, (acc0, acc0, rich_acc))
  dk_out[...] = (dk * scale).astype(dk_out.dtype)
  dv_out[...] = dv.astype(dv_out.dtype)
  for a, (d_order, d_dist) in enumerate(rich_acc):
    dok_out[a, :] = d_order
    ddk_out[a, :] = d_dist
