"""ETC's global-local attention in the PyTorch export (`flaxdoc.nn.etc_attention`'s twin).

`EtcAttention` has the reference form (Flax's blocking: blocks of `r + 1`, three key
blocks each, einsum + `masked_softmax`) and the fast one (small query blocks over
sliding key windows through `scaled_dot_product_attention`, or, for FormNet's layers on
CPU, the native kernel of `native.py`); the tests compare them.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from flaxdoc.export.torch import native
from flaxdoc.export.torch.attention import _pad_long, masked_softmax
from flaxdoc.export.torch.basic import (BIG_NEG, ETC_MAX_RELATIVE_DISTANCE, HeadsProjection,
                                         OutProjection, _param)
from flaxdoc.export.torch.terms import RichAttentionTerm, apply_terms


def _split_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
  return x.reshape((x.shape[0], x.shape[1] // block, block) + tuple(x.shape[2:]))


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
    # The native kernels (`native.py`) where they can run (a float32 CPU forward without
    # gradients): FormNet's whole long-query attention, or Rich's window logits beside
    # other terms. False keeps the tensor form.
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
    Where a native kernel can run (`_native_rich_term`), FormNet's case (Rich alone) is
    one kernel call, and otherwise Rich's logits and the mask come from one.
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
      coords, valid = self._native_positions(rich, geom, mask, nb, c)
      return native.etc_rich_attention(
          rich.w_q, rich.w_k, rich.v_q, rich.v_k, rich.b, rich.c,
          rich.theta.abs() * math.sqrt(0.5), *coords, *valid, q, k, v, mask[:, :g], nb, c, r,
          scale, BIG_NEG)
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
    """The Rich Attention term the native kernels compute (`native.etc_rich_attention`
    when it is the only term, else `native.rich_window_bias`), or None: they need a float32
    CPU forward without gradients (they have no backward) and at most two axes; any other
    case keeps the tensor form."""
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
    """The bias kernel's Rich Attention arguments from the long tokens' queries and keys
    `[B, N, H, D]`: per-token projections (each token projected once, then padded as the
    blocks and windows need them), `|theta| / sqrt 2`, coordinates and validity. (The
    attention kernel projects the tokens itself.)"""
    r, a = self.radius, len(term.axes)
    th = term.theta.abs() * math.sqrt(0.5)  # [H, A]
    per_head = th.T[:, None, :, None]  # [A, 1, H, 1]
    pq = _pad_for_windows(term.token_projections(q_long, "q"), c, 0, nb, dim=-1)  # [2A, B, H, nq]
    pk = _pad_for_windows(term.token_projections(k_long, "k"), c, r, nb, dim=-1)  # [.., nk]
    oq = pq[:a] + term.b.T[:, None, :, None]
    dq = (pq[a:] + term.c.T[:, None, :, None]) * per_head
    dk = pk[a:] * per_head
    coords, valid = self._native_positions(term, geom, mask, nb, c)
    return (oq, pk[:a], dq, dk, th, *coords, *valid)

  def _native_positions(self, term, geom, mask, nb: int, c: int) -> tuple:
    """Rich's coordinates `[A, B, nq]`, `[A, B, nk]` and the validity `[B, nq]`, `[B, nk]`
    of the block (queries) and window (keys) positions, padded as the kernels index them."""
    g, r = self.g, self.radius
    coords = torch.stack([term._coordinate(geom, ax)[:, g:] for ax in term.axes])  # [A, B, N]
    valid = mask[:, g:]
    pad = _pad_for_windows
    return ((pad(coords, c, 0, nb, dim=-1), pad(coords, c, r, nb, dim=-1)),
            (pad(valid, c, 0, nb, dim=-1), pad(valid, c, r, nb, dim=-1)))

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
