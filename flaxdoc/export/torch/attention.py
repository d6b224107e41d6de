"""Attention modules of the PyTorch export (`flaxdoc.nn` attention twins, no JAX).

| torch | Flax twin |
|---|---|
| `DenseSelfAttention` | `flaxdoc.nn.attention` (masked float32 softmax, empty rows -> 0) |
| `EtcAttention` | `flaxdoc.nn.etc_attention` (reference: Flax's 3 key blocks; fast: sliding windows) |
| `LinformerAttention`, `CosformerAttention` | `flaxdoc.nn.linformer`, `flaxdoc.nn.cosformer` |

Each has a reference form (einsum + `masked_softmax`, what the tests compare with) and,
where the terms allow, a fast one through `scaled_dot_product_attention`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from flaxdoc.export.torch import native
from flaxdoc.export.torch.basic import (BIG_NEG, ETC_MAX_RELATIVE_DISTANCE, HeadsProjection,
                                         OutProjection, _param)
from flaxdoc.export.torch.terms import RichAttentionTerm, apply_terms


def sdpa_with_bias(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                   mask: torch.Tensor, scale: float) -> torch.Tensor:
  """`masked_softmax(q.k * scale + bias, mask) @ v` through PyTorch's fused attention.

  q `[..., Q, D]`, k, v `[..., K, D]`, bias `[..., Q, K]` (or None), mask bool broadcastable
  to `[..., Q, K]`. The mask becomes `BIG_NEG` in one float mask with the bias (finite, so
  a row with no visible key gives no NaN); such rows are zeroed afterwards, as
  `masked_softmax` gives them all-zero weights.
  """
  neg = torch.tensor(BIG_NEG, dtype=q.dtype, device=q.device)
  if bias is None:
    attn_mask = torch.where(mask, torch.zeros((), dtype=q.dtype, device=q.device), neg)
  else:
    attn_mask = torch.where(mask, bias.to(q.dtype), neg)
  attn_mask = attn_mask.expand(q.shape[:-1] + (k.shape[-2],))
  out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
  visible = mask.any(dim=-1, keepdim=True)  # [..., Q, 1] (or 1 where the mask broadcasts)
  return out * visible.to(out.dtype)


def masked_softmax(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
  """`flaxdoc.nn.attention.masked_softmax`: rows with no visible key come out all zero."""
  logits = logits.to(torch.float32)
  mask = mask.expand(logits.shape)
  logits = torch.where(mask, logits, torch.full_like(logits, BIG_NEG))
  row_max = logits.amax(dim=-1, keepdim=True)
  unnorm = torch.where(mask, torch.exp(logits - row_max), torch.zeros_like(logits))
  total = unnorm.sum(dim=-1, keepdim=True)
  return unnorm / torch.clamp(total, min=1e-30)


class DenseSelfAttention(nn.Module):
  """`flaxdoc.nn.attention.DenseSelfAttention`: all pairs, additive terms."""

  def __init__(self, width: int, heads: int):
    super().__init__()
    d = width // heads
    self.query, self.key, self.value = (HeadsProjection(width, heads, d) for _ in range(3))
    self.out = OutProjection(heads, d, width)
    self.fast = True

  def forward(self, x, mask, terms=(), geom=None) -> torch.Tensor:
    q, k, v = self.query(x), self.key(x), self.value(x)  # [B, N, H, D]
    if self.fast:
      bias = apply_terms(terms, q, k, geom, geom)  # [B, H, N, N] or None
      pair = (mask[:, :, None] & mask[:, None, :])[:, None]  # [B, 1, N, N]
      out = sdpa_with_bias(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bias, pair,
                           1.0 / math.sqrt(q.shape[-1]))  # [B, H, N, D]
      return self.out(out.transpose(1, 2))
    logits = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    bias = apply_terms(terms, q, k, geom, geom)
    if bias is not None:
      logits = logits + bias
    pair = (mask[:, :, None] & mask[:, None, :])[:, None]  # [B, 1, N, N]
    weights = masked_softmax(logits, pair)
    return self.out(torch.einsum("bhqk,bkhd->bqhd", weights, v))


def _split_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
  return x.reshape((x.shape[0], x.shape[1] // block, block) + tuple(x.shape[2:]))


def _pad_long(x: torch.Tensor, padded: int) -> torch.Tensor:
  pad = padded - x.shape[1]
  if pad == 0:
    return x
  zeros = torch.zeros((x.shape[0], pad) + tuple(x.shape[2:]), dtype=x.dtype, device=x.device)
  return torch.cat([x, zeros], dim=1)


def _three_blocks(blocks: torch.Tensor) -> torch.Tensor:
  """`[B, nb, b, ...]` -> `[B, nb, 3b, ...]` (previous, own, next; zeros outside)."""
  zero = torch.zeros_like(blocks[:, :1])
  padded = torch.cat([zero, blocks, zero], dim=1)  # [B, nb + 2, b, ...]
  return torch.cat([padded[:, :-2], padded[:, 1:-1], padded[:, 2:]], dim=2)


def _local_offsets(block: int) -> np.ndarray:
  q = np.arange(block)[:, None]
  k = np.arange(3 * block)[None, :]
  return (k - block) - q  # [b, 3b]


def _pad_for_windows(x: torch.Tensor, block: int, radius: int, nb: int,
                     dim: int = 1) -> torch.Tensor:
  """Pads the token axis `dim` of `x` (`N` tokens) to `nb * block + 2 radius`: `radius`
  zeros before, the rest after. `_windows` of it views the keys each query block sees,
  tokens `n * block - radius` to `(n + 1) * block + radius - 1`, with no copy per window
  (at batch 1); with `radius = 0` it is the query blocks' padding."""
  dim = dim % x.dim()
  after = nb * block - x.shape[dim] + radius
  return F.pad(x, (0, 0) * (x.dim() - 1 - dim) + (radius, after))


def _windows(padded: torch.Tensor, block: int, radius: int, dim: int = 1) -> torch.Tensor:
  """`_pad_for_windows` output -> its `nb` windows of `block + 2 radius` tokens, a view:
  `[B, nb, kk, ...]` for `dim = 1`, `[..., nb, kk]` for the last axis."""
  w = padded.unfold(dim, block + 2 * radius, block)
  return w.movedim(-1, dim + 1) if dim % padded.dim() != padded.dim() - 1 else w


def _window_offsets(block: int, radius: int) -> np.ndarray:
  """`[b, b + 2r]` key minus query position inside `_pad_for_windows` windows."""
  return (np.arange(block + 2 * radius)[None, :] - radius) - np.arange(block)[:, None]


def _flash_with_lse():
  """PyTorch's CPU flash-attention op, which also returns the log-sum-exp (None if absent)."""
  return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


class EtcAttention(nn.Module):
  """`flaxdoc.nn.etc_attention.EtcAttention`: blocked global-local attention, `O(N * 3b)`.

  `x [B, G + N, E]` holds the `G` global tokens first; long queries see the keys with
  `|i - j| <= r` plus all globals, global queries see everything. The reference form
  blocks as Flax does (blocks of `r + 1`, 3 key blocks each); the fast one uses smaller
  query blocks over sliding key windows (`query_block`), the same attention.
  """

  def __init__(self, width: int, heads: int, local_radius: int, num_globals: int,
               relative_positions: bool):
    super().__init__()
    d = width // heads
    self.query, self.key, self.value = (HeadsProjection(width, heads, d) for _ in range(3))
    self.out = OutProjection(heads, d, width)
    self.radius, self.g = int(local_radius), int(num_globals)
    self.relative = bool(relative_positions)
    if self.relative:
      vocab = 2 * ETC_MAX_RELATIVE_DISTANCE + 3
      self.relative_table = _param(vocab, heads, d)
      self.relative_bias = _param(vocab, heads)
    self.fast = True
    # The fast path's query block: `b` queries see `b + 2r` keys, so smaller blocks waste
    # fewer keys (the reference's `r + 1` blocks see `3(r + 1)`: 255 at r = 84, 196 here),
    # down to where the kernel's per-block overhead wins. Set before the first call.
    self.query_block = max(8, (self.radius + 1) // 3)
    # Rich Attention's window logits through the native kernel (`native.py`) where it can
    # run (float32 CPU forward without gradients); False keeps the tensor form.
    self.native = True

  def forward(self, x, mask, terms=(), geom=None) -> torch.Tensor:
    q, k, v = self.query(x), self.key(x), self.value(x)  # [B, G+N, H, D]
    out_global = self._global_queries(q, k, v, mask)
    if self.fast:
      out_long = self._fast_long_queries(q, k, v, mask, terms, geom)
    else:
      out_long = self._long_queries(q, k, v, mask, terms, geom)
    return self.out(torch.cat([out_global, out_long], dim=1))

  def _blocking(self, length: int):
    block = self.radius + 1
    nb = -(-length // block)
    return block, nb, nb * block

  def _long_blocks(self, q, k, v, mask, terms, geom) -> dict:
    """The reference form's blocks (Flax's), masks and additive logits.

    Returns `ql [B, nb, b, H, D]`, `kl`, `vl [B, nb, 3b, H, D]`, `kg`, `vg [B, G, H, D]`,
    `pmask [B, nb, 1, b, 3b + G]`, and the additive logits, already scaled, or None:
    `local [B, nb, H, b, 3b]` (relative positions + layout terms) and `l2g [..., 1]`.
    """
    g, r = self.g, self.radius
    length = q.shape[1] - g
    block, nb, padded = self._blocking(length)
    scale = 1.0 / math.sqrt(q.shape[-1])
    blk = lambda a: _split_blocks(_pad_long(a, padded), block)  # noqa: E731
    ql = blk(q[:, g:])  # [B, nb, b, H, D]
    valid_q = blk(mask[:, g:])  # [B, nb, b]
    offsets = _local_offsets(block)
    window = torch.tensor(np.abs(offsets) <= r, device=q.device)  # [b, 3b]
    l2l_mask = window & valid_q[..., :, None] & _three_blocks(valid_q)[..., None, :]
    l2g_mask = valid_q[..., :, None] & mask[:, None, None, :g]  # [B, nb, b, G]
    out = dict(ql=ql, kl=_three_blocks(blk(k[:, g:])), vl=_three_blocks(blk(v[:, g:])),
               kg=k[:, :g], vg=v[:, :g], block=block, length=length, padded=padded,
               pmask=torch.cat([l2l_mask, l2g_mask], dim=-1)[:, :, None], local=None, l2g=None)
    if self.relative:
      md = ETC_MAX_RELATIVE_DISTANCE
      qr = (torch.einsum("bnqhd,vhd->bnhqv", ql, self.relative_table)
            + self.relative_bias.T[:, None, :]) * scale  # [B, nb, H, b, V]
      ids = torch.tensor(np.clip(offsets, -md, md) + md, dtype=torch.int64, device=q.device)
      out["local"] = torch.gather(qr, -1, ids.expand(qr.shape[:-1] + (3 * block,)))
      # One global per document: every long token is a member of every global.
      out["l2g"] = qr[..., 2 * md + 1:2 * md + 2]
    if terms:
      q_geom = {n: blk(leaf[:, g:]) for n, leaf in geom.items()}
      k_geom = {n: _three_blocks(leaf) for n, leaf in q_geom.items()}
      t = apply_terms(terms, ql, out["kl"], q_geom, k_geom)
      out["local"] = t if out["local"] is None else out["local"].add_(t)
    return out

  def _long_queries(self, q, k, v, mask, terms, geom) -> torch.Tensor:
    """The reference form (einsum + masked softmax): `[B, N, H, D]` long-query outputs."""
    x = self._long_blocks(q, k, v, mask, terms, geom)
    batch, _, heads, d = q.shape
    block = x["block"]
    scale = 1.0 / math.sqrt(d)
    l2l = torch.einsum("bnqhd,bnkhd->bnhqk", x["ql"], x["kl"]) * scale  # [B, nb, H, b, 3b]
    l2g = torch.einsum("bnqhd,bghd->bnhqg", x["ql"], x["kg"]) * scale  # [B, nb, H, b, G]
    if x["local"] is not None:
      l2l = l2l + x["local"]
    if x["l2g"] is not None:
      l2g = l2g + x["l2g"]
    w = masked_softmax(torch.cat([l2l, l2g], dim=-1), x["pmask"])  # [B, nb, H, b, 3b + G]
    out_long = (torch.einsum("bnhqk,bnkhd->bnqhd", w[..., :3 * block], x["vl"])
                + torch.einsum("bnhqg,bghd->bnqhd", w[..., 3 * block:], x["vg"]))
    return out_long.reshape(batch, x["padded"], heads, d)[:, :x["length"]]

  def _global_queries(self, q, k, v, mask) -> torch.Tensor:
    """The `G` global queries see every token: `[B, G, H, D]`."""
    g = self.g
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d)
    qg, kg, vg, kl_, vl_ = q[:, :g], k[:, :g], v[:, :g], k[:, g:], v[:, g:]
    long_valid, global_valid = mask[:, g:], mask[:, :g]
    md = ETC_MAX_RELATIVE_DISTANCE
    member_id = 2 * md + 1
    g2g = torch.einsum("bqhd,bkhd->bhqk", qg, kg)  # [B, H, G, G]
    g2l = torch.einsum("bqhd,bkhd->bhqk", qg, kl_)  # [B, H, G, N]
    if self.relative:
      qrg = (torch.einsum("bghd,vhd->bhgv", qg, self.relative_table)
             + self.relative_bias.T[None, :, None, :])
      pos = np.arange(g)
      gids = torch.tensor(np.clip(pos[None, :] - pos[:, None], -md, md) + md, dtype=torch.int64,
                          device=q.device)  # [G, G]
      g2g = g2g + torch.gather(qrg, -1, gids.expand(qrg.shape[:-1] + (g,)))
      g2l = g2l + qrg[..., member_id:member_id + 1]
    g2g_mask = global_valid[:, :, None] & global_valid[:, None, :]
    g2l_mask = global_valid[:, :, None] & long_valid[:, None, :]
    logits = torch.cat([g2g, g2l], dim=-1) * scale
    wg = masked_softmax(logits, torch.cat([g2g_mask, g2l_mask], dim=-1)[:, None])
    out_global = (torch.einsum("bhqk,bkhd->bqhd", wg[..., :g], vg)
                  + torch.einsum("bhqk,bkhd->bqhd", wg[..., g:], vl_))
    return out_global

  def _fast_long_queries(self, q, k, v, mask, terms, geom) -> torch.Tensor:
    """The long queries through fused attention over sliding key windows.

    Query block `n` (`c = query_block` tokens) sees the `c + 2r` keys around it, a strided
    view of the padded keys (no copy per window at batch 1; folding a larger batch into
    the kernel's batch copies the windows once), every block one batch entry of the
    kernel. The additive parts (relative positions, layout terms) and the mask are one
    float mask `[B * nb, H, c, c + 2r]`. The globals' keys are merged afterwards through
    the kernel's log-sum-exp (CPU), so the windows are never copied to append them.
    A Rich Attention term and the mask come from one native kernel where it can run
    (`_native_rich_term`).
    """
    g, r, c = self.g, self.radius, int(self.query_block)
    batch, _, heads, d = q.shape
    length = q.shape[1] - g
    if length == 0:  # globals only
      return q.new_zeros((batch, 0, heads, d))
    nb = -(-length // c)
    padded, kk = nb * c, c + 2 * r
    scale = 1.0 / math.sqrt(d)
    q_long, k_long, v_long = q[:, g:], k[:, g:], v[:, g:]

    def blk(a):  # [B, N, ...] -> [B, nb, c, ...]
      return _split_blocks(_pad_long(a, padded), c)

    def win(a):  # [B, N, ...] -> [B, nb, kk, ...] (a view of one padded copy)
      return _windows(_pad_for_windows(a, c, r, nb), c, r)

    rich = self._native_rich_term(terms, q, k, v)
    if rich is not None and len(terms) == 1 and not self.relative and d % 8 == 0:
      # FormNet's case: the long queries' whole attention in one native kernel, which
      # reads q, k, v as they are (no padded copies).
      return native.etc_rich_attention(
          *self._native_rich_args(rich, q_long, k_long, geom, mask, nb, c), q, k, v,
          mask[:, :g], nb, c, r, scale, BIG_NEG)
    q_pad, k_pad = _pad_long(q_long, padded), _pad_for_windows(k_long, c, r, nb)
    ql, kw, vw = _split_blocks(q_pad, c), _windows(k_pad, c, r), win(v_long)  # [B, nb, c|kk, H, D]
    valid_q = blk(mask[:, g:])  # [B, nb, c]
    offsets = _window_offsets(c, r)
    # |key - query| <= r inside the window: the band a <= t <= a + 2r, built by torch
    # (a traced numpy constant became per-element int64 index arithmetic in inductor).
    window = torch.ones((c, kk), dtype=torch.bool, device=q.device).triu(0).tril(2 * r)
    l2l_mask = window & valid_q[..., :, None] & win(mask[:, g:])[..., None, :]
    l2g_mask = valid_q[..., :, None] & mask[:, None, None, :g]  # [B, nb, c, G]
    local, l2g = None, None
    if self.relative:
      md = ETC_MAX_RELATIVE_DISTANCE
      qr = (torch.einsum("bnqhd,vhd->bnhqv", ql, self.relative_table)
            + self.relative_bias.T[:, None, :]) * scale  # [B, nb, H, c, V]
      ids = torch.tensor(np.clip(offsets, -md, md) + md, dtype=torch.int64, device=q.device)
      local = torch.gather(qr, -1, ids.expand(qr.shape[:-1] + (kk,)))
      l2g = qr[..., 2 * md + 1:2 * md + 2]  # every long token is a member of every global
    if rich is not None:  # Rich's logits and the mask from one fused kernel
      bias = self._native_rich(rich, q_long, k_long, geom, mask, nb, c)  # [B, nb, H, c, kk]
      others = [t for t in terms if t is not rich]
      if others:
        bias.add_(self._window_terms(others, q_pad, k_pad, ql, kw, geom, blk, win))
      if local is not None:
        bias.add_(local)
    else:
      if terms:
        t = self._window_terms(terms, q_pad, k_pad, ql, kw, geom, blk, win)
        local = t if local is None else local.add_(t)
      # Head-shared 0 / BIG_NEG: the mask enters as one add, not a select over all heads.
      neg = torch.where(l2l_mask, 0.0, BIG_NEG).to(q.dtype)[:, :, None]  # [B, nb, 1, c, kk]
      bias = neg if local is None else local.add_(neg)  # [B, nb, H | 1, c, kk]
    qb = ql.reshape(batch * nb, c, heads, d).transpose(1, 2)  # views (kernels take strides)
    kb = kw.permute(0, 1, 3, 2, 4).reshape(batch * nb, heads, kk, d)
    vb = vw.permute(0, 1, 3, 2, 4).reshape(batch * nb, heads, kk, d)
    bias = bias.reshape((batch * nb,) + tuple(bias.shape[2:]))
    flash = _flash_with_lse()
    # The op passes no gradient through its log-sum-exp (nor to the mask), so anything
    # that needs gradients goes the concatenating way.
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, bias))
    if g and flash is not None and q.device.type == "cpu" and not needs_grad:
      out, lse = flash(qb, kb, vb, attn_mask=bias, scale=scale)  # [B*nb, H, c, D], [B*nb, H, c]
      out = self._merge_globals(out.reshape(batch, nb, heads, c, d),
                                lse.reshape(batch, nb, heads, c, 1), ql, l2g, l2g_mask,
                                k[:, :g], v[:, :g], scale)
    else:
      if g:  # the globals appended to every window (a copy of the windows)
        kg = k[:, None, :g].expand(batch, nb, g, heads, d).permute(0, 1, 3, 2, 4)
        vg = v[:, None, :g].expand(batch, nb, g, heads, d).permute(0, 1, 3, 2, 4)
        kb = torch.cat([kb, kg.reshape(batch * nb, heads, g, d)], dim=2)
        vb = torch.cat([vb, vg.reshape(batch * nb, heads, g, d)], dim=2)
        g_bias = torch.where(l2g_mask, 0.0, BIG_NEG).to(q.dtype)[:, :, None]  # [B, nb, 1, c, G]
        if l2g is not None:
          g_bias = g_bias + l2g
        g_bias = g_bias.reshape((batch * nb,) + tuple(g_bias.shape[2:]))
        hb = max(bias.shape[1], g_bias.shape[1])  # 1 (mask only) or H
        bias = torch.cat([bias.expand(-1, hb, -1, -1), g_bias.expand(-1, hb, -1, -1)], dim=-1)
      out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=bias, scale=scale)
      out = out.reshape(batch, nb, heads, c, d)
    visible = l2l_mask.any(dim=-1) | l2g_mask.any(dim=-1)  # [B, nb, c]
    out = out * visible[:, :, None, :, None].to(out.dtype)  # no visible key: 0, as the reference
    out = out.permute(0, 1, 3, 2, 4)  # [B, nb, c, H, D]
    return out.reshape(batch, padded, heads, d)[:, :length]

  def _native_rich_term(self, terms, q, k, v):
    """The Rich Attention term the native kernel computes (`native.rich_window_bias`), or
    None: it needs a float32 CPU forward without gradients (the kernel has no backward)
    and at most two axes; any other case keeps the tensor form."""
    if not self.native or q.device.type != "cpu" or q.dtype != torch.float32:
      return None
    rich = next((t for t in terms if isinstance(t, RichAttentionTerm) and t.fast
                 and len(t.axes) <= 2), None)
    if rich is None:
      return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, *rich.parameters())):
      return None
    # Tracing (torch.compile) must not run the compiler: it reads what an eager call or
    # `compile_layers` already built.
    ready = native.loaded() if torch.compiler.is_compiling() else native.available()
    return rich if ready else None

  def _native_rich(self, term, q_long, k_long, geom, mask, nb: int, c: int) -> torch.Tensor:
    """Rich Attention over the windows plus the window/validity mask: `[B, nb, H, c, kk]`
    logits, `BIG_NEG` where a key is not visible (the tensor form's bias + mask)."""
    return native.rich_window_bias(
        *self._native_rich_args(term, q_long, k_long, geom, mask, nb, c), nb, c, self.radius,
        BIG_NEG)

  def _native_rich_args(self, term, q_long, k_long, geom, mask, nb: int, c: int) -> tuple:
    """The native kernels' Rich Attention arguments from the long tokens' queries and keys
    `[B, N, H, D]`: per-token projections (each token projected once, then padded as the
    blocks and windows need them), `|theta| / sqrt 2`, coordinates and validity."""
    g, r, a = self.g, self.radius, len(term.axes)
    th = term.theta.abs() * math.sqrt(0.5)  # [H, A]
    per_head = th.T[:, None, :, None]  # [A, 1, H, 1]
    pq = _pad_for_windows(term.token_projections(q_long, "q"), c, 0, nb, dim=-1)  # [2A, B, H, nq]
    pk = _pad_for_windows(term.token_projections(k_long, "k"), c, r, nb, dim=-1)  # [.., nk]
    oq = pq[:a] + term.b.T[:, None, :, None]
    dq = (pq[a:] + term.c.T[:, None, :, None]) * per_head
    dk = pk[a:] * per_head
    coords = torch.stack([term._coordinate(geom, ax)[:, g:] for ax in term.axes])  # [A, B, N]
    valid = mask[:, g:]
    return (oq, pk[:a], dq, dk, th, _pad_for_windows(coords, c, 0, nb, dim=-1),
            _pad_for_windows(coords, c, r, nb, dim=-1), _pad_for_windows(valid, c, 0, nb, dim=-1),
            _pad_for_windows(valid, c, r, nb, dim=-1))

  def _window_terms(self, terms, q_pad, k_pad, ql, kw, geom, blk, win) -> torch.Tensor:
    """The layout terms on the query blocks and their key windows: `[B, nb, H | 1, c, kk]`.

    A term that projects tokens (Rich Attention) projects the padded queries and keys
    once, then blocks / windows the projections and its coordinates tokens-last
    (`[2A | A, B, nb, (H,) c | kk]`, contiguous along the keys); the others see the
    blocked queries, windowed keys and blocked geometry.
    """
    g, r = self.g, self.radius
    nb, c = ql.shape[1], ql.shape[2]
    blocked_geom = None
    total = None
    for term in terms:
      if getattr(term, "fast", False) and hasattr(term, "token_projections"):
        pq = term.token_projections(q_pad, "q")  # [2A, B, H, nb * c]
        pq = pq.reshape(pq.shape[:-1] + (nb, c)).transpose(-3, -2)  # [2A, B, nb, H, c]
        pk = _windows(term.token_projections(k_pad, "k"), c, r, dim=-1).transpose(-3, -2)
        coords = torch.stack([term._coordinate(geom, a)[:, g:] for a in term.axes])  # [A, B, N]
        cq = _pad_for_windows(coords, c, 0, nb, dim=-1).reshape(coords.shape[:-1] + (nb, c))
        ck = _windows(_pad_for_windows(coords, c, r, nb, dim=-1), c, r, dim=-1)
        t = term.pairwise(pq, pk, None, None, cq, ck)
      else:
        if blocked_geom is None:
          blocked_geom = ({n: blk(leaf[:, g:]) for n, leaf in geom.items()},
                          {n: win(leaf[:, g:]) for n, leaf in geom.items()})
        t = term(ql, kw, *blocked_geom)
      t = t.to(torch.float32)
      total = t if total is None else total + t
    return total

  @staticmethod
  def _merge_globals(out, lse, ql, l2g, l2g_mask, kg, vg, scale) -> torch.Tensor:
    """Adds the `G` global keys to attention computed over the local windows alone.

    `out [B, nb, H, c, D]` and its log-sum-exp `lse [B, nb, H, c, 1]` over the local keys;
    the softmax over local + global keys is `(e^lse out + sum_g e^s_g v_g) / (e^lse +
    sum_g e^s_g)`, taken relative to the largest exponent. A row with no visible local
    key has `lse` about `BIG_NEG`, so its weight vanishes as in one joint softmax.
    """
    s_g = torch.einsum("bnqhd,bghd->bnhqg", ql, kg) * scale  # [B, nb, H, c, G]
    if l2g is not None:
      s_g = s_g + l2g
    s_g = torch.where(l2g_mask[:, :, None], s_g, float("-inf"))
    top = torch.maximum(lse, s_g.amax(dim=-1, keepdim=True))  # finite: lse is
    w_local = torch.exp(lse - top)
    w_global = torch.exp(s_g - top)  # [B, nb, H, c, G]
    num = out * w_local + torch.einsum("bnhqg,bghd->bnhqd", w_global, vg)
    return num / (w_local + w_global.sum(dim=-1, keepdim=True))


class LinformerAttention(nn.Module):
  """`flaxdoc.nn.linformer.LinformerAttention`: keys/values projected from `N` to `k`."""

  def __init__(self, width: int, heads: int, max_length: int, proj_length: int):
    super().__init__()
    d = width // heads
    self.query, self.key, self.value = (HeadsProjection(width, heads, d) for _ in range(3))
    self.out = OutProjection(heads, d, width)
    self.proj_k = _param(proj_length, max_length)
    self.proj_v = _param(proj_length, max_length)
    self.max_length = int(max_length)

  def forward(self, x, mask, terms=(), geom=None) -> torch.Tensor:
    length = x.shape[1]
    x = _pad_long(x, self.max_length)
    mask = _pad_long(mask, self.max_length)
    q, k, v = self.query(x), self.key(x), self.value(x)  # [B, N, H, D]
    valid = mask[:, :, None, None]
    k = torch.where(valid, k, torch.zeros_like(k))
    v = torch.where(valid, v, torch.zeros_like(v))
    kp = torch.einsum("pn,bnhd->bphd", self.proj_k, k)
    vp = torch.einsum("pn,bnhd->bphd", self.proj_v, v)
    scores = torch.einsum("bqhd,bphd->bhqp", q, kp) / math.sqrt(q.shape[-1])
    w = torch.softmax(scores, dim=-1)
    return self.out(torch.einsum("bhqp,bphd->bqhd", w, vp))[:, :length]


class CosformerAttention(nn.Module):
  """`flaxdoc.nn.cosformer.CosformerAttention`: relu linear attention with cos re-weighting."""

  def __init__(self, width: int, heads: int, reweight: str, max_length: int,
               extent: float = 1000.0, eps: float = 1e-4, length: str = "max"):
    super().__init__()
    d = width // heads
    self.query, self.key, self.value = (HeadsProjection(width, heads, d) for _ in range(3))
    self.out = OutProjection(heads, d, width)
    self.reweight, self.max_length, self.length = reweight, int(max_length), length
    self.extent, self.eps = float(extent), float(eps)

  @staticmethod
  def _cos_factors(p: torch.Tensor, m) -> torch.Tensor:
    a = math.pi / (2.0 * m)  # m: a number, or [B, 1] per-document lengths
    p = a * p.to(torch.float32)
    return torch.stack([torch.cos(p), torch.sin(p)], dim=-1)  # [B, N, 2]

  def _factors(self, mask, geom, length) -> list[torch.Tensor]:
    batch = mask.shape[0]
    if self.reweight == "none":
      return [torch.ones((batch, length, 1), device=mask.device)]
    if self.reweight == "1d":
      if self.length == "document":
        m = torch.clamp(mask.to(torch.float32).sum(-1, keepdim=True), min=1.0)  # [B, 1]
        return [self._cos_factors(geom["positions"], m)]
      return [self._cos_factors(geom["positions"], self.max_length or length)]
    c = geom["centers"]
    fx = self._cos_factors(c[..., 0], self.extent)
    fy = self._cos_factors(c[..., 1], self.extent)
    if self.reweight == "squircle":
      prod = fx[..., :, None] * fy[..., None, :]
      return [prod.reshape(prod.shape[:-2] + (4,))]
    return [fx, fy]

  def forward(self, x, mask, terms=(), geom=None) -> torch.Tensor:
    q, k, v = self.query(x), self.key(x), self.value(x)
    valid = mask[:, :, None, None]
    q = torch.relu(q)
    k = torch.where(valid, torch.relu(k), torch.zeros_like(k))
    v = torch.where(valid, v, torch.zeros_like(v))
    outs = []
    for f in self._factors(mask, geom, x.shape[1]):
      f = torch.where(mask[..., None], f, torch.zeros_like(f))
      kv = torch.einsum("bmhd,bmr,bmhe->bhrde", k, f, v)
      k_sum = torch.einsum("bmhd,bmr->bhrd", k, f)
      qw = torch.einsum("bnhd,bnr->bnhrd", q, f)
      num = torch.einsum("bnhrd,bhrde->bnhe", qw, kv)
      den = torch.einsum("bnhrd,bhrd->bnh", qw, k_sum)
      outs.append(num / torch.clamp(den, min=self.eps)[..., None])
    ctx = outs[0] if len(outs) == 1 else torch.where(outs[0].abs() >= outs[1].abs(), outs[0],
                                                     outs[1])
    return self.out(ctx)


# ------------------------------------------------------------------ GCN
