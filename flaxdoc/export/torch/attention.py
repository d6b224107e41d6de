"""Attention modules of the PyTorch export (`flaxdoc.nn` attention twins, no JAX).

| torch | Flax twin |
|---|---|
| `DenseSelfAttention` | `flaxdoc.nn.attention` (masked float32 softmax, empty rows -> 0) |
| `EtcAttention` (`etc_attention.py`) | `flaxdoc.nn.etc_attention` (reference: Flax's 3 key blocks; fast: sliding windows) |
| `LinformerAttention`, `CosformerAttention` | `flaxdoc.nn.linformer`, `flaxdoc.nn.cosformer` |

Each has a reference form (einsum + `masked_softmax`, what the tests compare with) and,
where the terms allow, a fast one through `scaled_dot_product_attention`.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from flaxdoc.export.torch.basic import BIG_NEG, HeadsProjection, OutProjection, _param
from flaxdoc.export.torch.terms import apply_terms


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


def _pad_long(x: torch.Tensor, padded: int) -> torch.Tensor:
  pad = padded - x.shape[1]
  if pad == 0:
    return x
  zeros = torch.zeros((x.shape[0], pad) + tuple(x.shape[2:]), dtype=x.dtype, device=x.device)
  return torch.cat([x, zeros], dim=1)



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
