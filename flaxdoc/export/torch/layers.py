"""PyTorch twins of the `flaxdoc.nn` Linen modules (no JAX at import or run time).

Parameters are `torch.nn.Parameter`s named *and laid out* exactly like the Flax
parameters (`query.kernel [E, H, D]`, Dense `kernel [in, out]`, LayerNorm `scale`),
so `state_dict()` keys are the dot-joined Flax paths of `flaxdoc.export.weights` and
a checkpoint loads with `load_state_dict` and no renaming table.

| torch | Flax twin |
|---|---|
| `Dense`, `LayerNorm`, `Embed` | `nn.Dense`, `nn.LayerNorm` (fast variance), `nn.Embed` |
| `Embeddings`, `LSPE` | `flaxdoc.nn.embeddings` |
| `DenseSelfAttention` | `flaxdoc.nn.attention` (masked float32 softmax, empty rows -> 0) |
| `EtcAttention` | `flaxdoc.nn.etc_attention` (blocked: 3 key blocks + globals) |
| `LinformerAttention`, `CosformerAttention` | `flaxdoc.nn.linformer`, `flaxdoc.nn.cosformer` |
| `RichAttentionTerm`, `PolarTerm`, `GaussianTerm`, `FixedBiasTerm` | `flaxdoc.nn.layout_terms` |
| `SuperTokenEncoder` (GCN) | `flaxdoc.nn.gcn` |
| `EncoderLayer`, `Encoder` | `flaxdoc.nn.encoder` (post-LN) |
| `TaggingHead` | `flaxdoc.nn.heads.TaggingHead` |

Only inference is mirrored: no dropout, no pre-training heads.

Fast paths (default; `set_fast_paths(model, False)` selects the reference forms,
which the tests compare them with): the GCN applies its message MLP's second layer
once per node, not per edge (the JAX form, `flaxdoc.nn.gcn`); dense and ETC attention
run through `torch.nn.functional.scaled_dot_product_attention` with the layout terms
and the mask as one additive float mask (ETC: all blocks as one batch of
`[b] x [3b + G]` attentions). No Python loop runs over blocks or edges, so the
modules trace cleanly under `torch.compile` and `torch.export`.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from flaxdoc.export.torch import geometry as geo

BIG_NEG = -1e9
ETC_MAX_RELATIVE_DISTANCE = 12


def _param(*shape: int) -> nn.Parameter:
  # Values come from the exported file; zeros only mark the shape.
  return nn.Parameter(torch.zeros(*shape, dtype=torch.float32))


# ------------------------------------------------------------------ basic layers
class Dense(nn.Module):
  """`y = x @ kernel + bias` with Flax's `[in, out]` kernel."""

  def __init__(self, in_features: int, out_features: int, use_bias: bool = True):
    super().__init__()
    self.kernel = _param(in_features, out_features)
    self.bias = _param(out_features) if use_bias else None

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    if self.bias is None:
      return x @ self.kernel
    # One fused GEMM + bias on a 2-D view (what nn.Linear does): no second pass for the bias.
    y = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.kernel)
    return y.reshape(x.shape[:-1] + y.shape[-1:])


class HeadsProjection(nn.Module):
  """Flax `DenseGeneral(features=(H, D))`: `[..., E] -> [..., H, D]`."""

  def __init__(self, width: int, heads: int, head_dim: int):
    super().__init__()
    self.kernel = _param(width, heads, head_dim)
    self.bias = _param(heads, head_dim)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    # `einsum("...e,ehd->...hd") + bias` as one 2-D addmm (about 10% faster on CPU).
    y = torch.addmm(self.bias.reshape(-1), x.reshape(-1, x.shape[-1]),
                    self.kernel.reshape(self.kernel.shape[0], -1))
    return y.reshape(x.shape[:-1] + self.bias.shape)


class OutProjection(nn.Module):
  """Flax `DenseGeneral(axis=(-2, -1))`: `[..., H, D] -> [..., E]`."""

  def __init__(self, heads: int, head_dim: int, width: int):
    super().__init__()
    self.kernel = _param(heads, head_dim, width)
    self.bias = _param(width)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    # `einsum("...hd,hde->...e") + bias` as one 2-D addmm.
    h, d, e = self.kernel.shape
    y = torch.addmm(self.bias, x.reshape(-1, h * d), self.kernel.reshape(h * d, e))
    return y.reshape(x.shape[:-2] + (e,))


class LayerNorm(nn.Module):
  """Flax `nn.LayerNorm`: variance as `E[x^2] - E[x]^2` (Flax's fast variance)."""

  def __init__(self, features: int, eps: float):
    super().__init__()
    self.scale = _param(features)
    self.bias = _param(features)
    self.eps = float(eps)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    mean = x.mean(dim=-1, keepdim=True)
    var = torch.clamp((x * x).mean(dim=-1, keepdim=True) - mean * mean, min=0.0)
    return (x - mean) * torch.rsqrt(var + self.eps) * self.scale + self.bias


class Embed(nn.Module):
  """Flax `nn.Embed` (`embedding [n, E]`); ids are clipped into range like the Flax lookup."""

  def __init__(self, num: int, features: int):
    super().__init__()
    self.embedding = _param(num, features)
    self.num = num

  def forward(self, ids: torch.Tensor) -> torch.Tensor:
    return F.embedding(torch.clamp(ids.to(torch.int64), 0, self.num - 1), self.embedding)


def set_fast_paths(model: nn.Module, enabled: bool = True) -> nn.Module:
  """Switches every submodule with a fast path to it (`enabled`) or to its reference form."""
  for module in model.modules():
    if hasattr(module, "fast"):
      module.fast = bool(enabled)
  return model


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


def apply_terms(terms: Sequence[nn.Module], q, k, q_geom, k_geom) -> torch.Tensor | None:
  total = None
  for term in terms:
    logits = term(q, k, q_geom, k_geom).to(torch.float32)
    total = logits if total is None else total + logits
  return total


# ------------------------------------------------------------------ embeddings
class LSPE(nn.Module):
  """`flaxdoc.nn.embeddings.LSPE`: `W2 gelu(W1 PE_sine(p) + b1) + b2` (+ `PE_sine` with skip)."""

  def __init__(self, features: int, skip: bool, max_period: float = 10000.0):
    super().__init__()
    self.fc1 = Dense(features, features)
    self.fc2 = Dense(features, features)
    self.features, self.skip, self.max_period = features, skip, max_period

  def forward(self, positions: torch.Tensor) -> torch.Tensor:
    sine = geo.sine_features(positions, self.features, self.max_period)
    out = self.fc2(F.gelu(self.fc1(sine)))
    return out + sine if self.skip else out


class Embeddings(nn.Module):
  """`flaxdoc.nn.embeddings.Embeddings` (inference: no dropout, no mask-position vector)."""

  def __init__(self, spec: Mapping, vocab_size: int):
    super().__init__()
    e = int(spec["width"])
    self.width = e
    self.position_1d = spec["position_1d"]
    self.position_2d = spec["position_2d"]
    self.box_size = bool(spec["box_size"])
    self.max_length = int(spec["max_position_embeddings"])
    self.page = bool(spec["page_embedding"])
    self.type_vocab_size = int(spec["type_vocab_size"])
    self.word_embeddings = Embed(vocab_size, e)
    if self.position_1d == "learned":
      self.position_embeddings = Embed(self.max_length, e)
    elif self.position_1d in ("lspe", "lspe_skip"):
      self.position_lspe = LSPE(e, self.position_1d == "lspe_skip")
    if self.position_2d == "learned":
      self.x_position_embeddings = Embed(1024, e)
      self.y_position_embeddings = Embed(1024, e)
      if self.box_size:
        self.h_position_embeddings = Embed(1024, e)
        self.w_position_embeddings = Embed(1024, e)
    elif self.position_2d in ("lspe", "lspe_skip"):
      self.x_lspe = LSPE(e, self.position_2d == "lspe_skip")
      self.y_lspe = LSPE(e, self.position_2d == "lspe_skip")
    if self.page:
      self.page_embeddings = Embed(int(spec["max_pages"]), e)
    if self.type_vocab_size > 0:
      self.token_type_embeddings = Embed(self.type_vocab_size, e)
    self.layer_norm = LayerNorm(e, spec["layer_norm_epsilon"])

  def forward(self, ids: torch.Tensor, positions: torch.Tensor, boxes: torch.Tensor,
              pages: torch.Tensor) -> torch.Tensor:
    x = self.word_embeddings(ids)  # [B, N, E]
    if self.position_1d == "learned":
      x = x + self.position_embeddings(positions)
    elif self.position_1d == "sine":
      x = x + geo.sine_features(positions, self.width)
    elif self.position_1d != "none":
      x = x + self.position_lspe(positions)
    if self.position_2d == "learned":
      x = x + self.x_position_embeddings(boxes[..., 0::2]).sum(dim=-2)
      x = x + self.y_position_embeddings(boxes[..., 1::2]).sum(dim=-2)
      if self.box_size:
        x = x + self.h_position_embeddings(boxes[..., 3] - boxes[..., 1])
        x = x + self.w_position_embeddings(boxes[..., 2] - boxes[..., 0])
    elif self.position_2d == "sine":
      x = x + geo.sine_features(boxes.to(torch.float32), self.width).sum(dim=-2)
    elif self.position_2d != "none":
      x = x + self.x_lspe(boxes[..., 0::2].to(torch.float32)).sum(dim=-2)
      x = x + self.y_lspe(boxes[..., 1::2].to(torch.float32)).sum(dim=-2)
    if self.page:
      x = x + self.page_embeddings(pages)
    if self.type_vocab_size > 0:
      x = x + self.token_type_embeddings(torch.zeros_like(ids))
    return self.layer_norm(x)


# ------------------------------------------------------------------ layout terms
class RichAttentionTerm(nn.Module):
  """FormNet's Rich Attention (`flaxdoc.nn.layout_terms.RichAttentionTerm`).

  Fast path (default): the four per-token projections in one einsum, laid out axis
  first so every `[..., Q]` / `[..., K]` operand is contiguous (what lets inductor
  vectorise the fused loop; with the axis last it falls back to scalar code, 6x
  slower), and the pairwise part in place: `theta^2 / 2 (L - mu)^2` as `m * m` with
  `m = (mu - L) |theta| / sqrt 2`, the order sign as a multiply by +-1 (exact). About
  seven passes over `[..., H, Q, K]` per axis instead of fifteen; the reference form
  is kept for the tests.
  """

  def __init__(self, heads: int, head_dim: int, axes: Sequence[str]):
    super().__init__()
    a = len(axes)
    self.axes = tuple(axes)
    for name in ("w_q", "w_k", "v_q", "v_k"):
      setattr(self, name, _param(heads, head_dim, a))
    for name in ("b", "c", "theta"):
      setattr(self, name, _param(heads, a))
    self.fast = True

  def _coordinate(self, geom, axis: str) -> torch.Tensor:
    if axis == "index":
      return geom["positions"].to(torch.float32)
    return geom["centers"][..., "xy".index(axis)].to(torch.float32)

  def _coordinates(self, geom) -> torch.Tensor:
    return torch.stack([self._coordinate(geom, a) for a in self.axes], dim=-1)  # [..., N, A]

  def forward(self, q, k, q_geom, k_geom) -> torch.Tensor:
    if self.fast:
      return self._fast_forward(q, k, q_geom, k_geom)
    oq = torch.einsum("...qhd,hda->...hqa", q, self.w_q) + self.b[:, None, :]  # [..., H, Q, A]
    ok = torch.einsum("...khd,hda->...hka", k, self.w_k)  # [..., H, K, A]
    dq = torch.einsum("...qhd,hda->...hqa", q, self.v_q) + self.c[:, None, :]
    dk = torch.einsum("...khd,hda->...hka", k, self.v_k)
    cq, ck = self._coordinates(q_geom), self._coordinates(k_geom)  # [..., Q, A], [..., K, A]
    total = None
    for a in range(cq.shape[-1]):
      ci = cq[..., :, None, a]
      cj = ck[..., None, :, a]
      order = (ci < cj)[..., None, :, :]  # [..., 1, Q, K]
      log_dist = torch.log1p(torch.abs(ci - cj))[..., None, :, :]
      z = oq[..., :, None, a] + ok[..., None, :, a]  # [..., H, Q, K]
      s_order = F.logsigmoid(torch.where(order, z, -z))
      mu = dq[..., :, None, a] + dk[..., None, :, a]
      t2 = torch.square(self.theta[:, a])[:, None, None]  # [H, 1, 1]
      term = s_order - 0.5 * t2 * torch.square(log_dist - mu)
      total = term if total is None else total + term
    return total  # [..., H, Q, K]

  def _fast_forward(self, q, k, q_geom, k_geom) -> torch.Tensor:
    a = len(self.axes)
    # [2A, ..., H, Q]: rows 0..A-1 the order projections, A..2A-1 the distance ones.
    pq = torch.einsum("...qhd,hdc->...hqc", q, torch.cat([self.w_q, self.v_q], dim=-1))
    pk = torch.einsum("...khd,hdc->...hkc", k, torch.cat([self.w_k, self.v_k], dim=-1))
    pq, pk = pq.movedim(-1, 0).contiguous(), pk.movedim(-1, 0).contiguous()
    half_theta = self.theta.abs() * math.sqrt(0.5)  # [H, A]
    total = None
    for i, axis in enumerate(self.axes):
      ci = self._coordinate(q_geom, axis)[..., None, :, None]  # [..., 1, Q, 1]
      cj = self._coordinate(k_geom, axis)[..., None, None, :]  # [..., 1, 1, K]
      sign = torch.where(ci < cj, 1.0, -1.0)  # [..., 1, Q, K], shared by the heads
      log_dist = torch.log1p(torch.abs(ci - cj))
      th = half_theta[:, i, None]  # [H, 1]
      oq = pq[i] + self.b[:, i, None]  # [..., H, Q]
      dq = (pq[a + i] + self.c[:, i, None]) * th
      dk = pk[a + i] * th
      s = F.logsigmoid(torch.add(oq[..., :, None], pk[i][..., None, :]).mul_(sign))
      m = torch.add(dq[..., :, None], dk[..., None, :])  # theta' mu   [..., H, Q, K]
      m.addcmul_(log_dist, th[..., None], value=-1.0)  # theta' (mu - L)
      total = s if total is None else total.add_(s)
      total.addcmul_(m, m, value=-1.0)
    return total  # [..., H, Q, K]


class PolarTerm(nn.Module):
  """DocPolarBERT's bucketed relative terms (`flaxdoc.nn.layout_terms.PolarTerm`)."""

  def __init__(self, spec: Mapping, head_dim: int):
    super().__init__()
    self.head_dim = head_dim
    self.num_1d = int(spec["polar_1d_buckets"])
    self.max_1d = int(spec["polar_1d_max_distance"])
    self.angle = spec["polar_angle"]
    self.use_1d = bool(spec.get("polar_1d", True))
    self.zero_bucket = bool(spec.get("polar_zero_bucket", False))
    if self.use_1d:
      self.table_1d = _param(self.num_1d, head_dim)
    self.table_distance = _param(int(spec["polar_distance_buckets"]) + int(self.zero_bucket),
                                 head_dim)
    codes = geo.NUM_ANGLE_CODES if self.angle == "released" else geo.NUM_ANGLE_SECTORS8_CODES
    self.table_angle = _param(codes, head_dim)

  @staticmethod
  def _bucketed(q: torch.Tensor, table: torch.Tensor, buckets: torch.Tensor) -> torch.Tensor:
    scores = torch.einsum("...qhd,nd->...hqn", q, table)  # [..., H, Q, nb]
    idx = buckets[..., None, :, :]  # [..., 1, Q, K]
    lead = torch.broadcast_shapes(scores.shape[:-3], idx.shape[:-3])
    scores = scores.expand(lead + scores.shape[-3:])
    idx = idx.expand(lead + (scores.shape[-3],) + idx.shape[-2:])
    idx = torch.clamp(idx, 0, table.shape[0] - 1)
    return torch.gather(scores, -1, idx)  # [..., H, Q, K]

  def forward(self, q, k, q_geom, k_geom) -> torch.Tensor:
    pos_q, pos_k = q_geom["positions"], k_geom["positions"]
    bdist = geo.distance_buckets(q_geom["centers"][..., :, None, :],
                                 k_geom["centers"][..., None, :, :],
                                 q_geom["dist_edges"])[..., 0, :]  # [..., Q, K]
    if self.zero_bucket:  # distance 0 gets a bucket of its own (layout.polar.ZERO_DISTANCE)
      rho = geo.pairwise_distances(q_geom["centers"], k_geom["centers"])
      bdist = torch.where(rho <= 1e-3, torch.zeros_like(bdist), bdist + 1)
    is_self = pos_q[..., :, None] == pos_k[..., None, :]
    valid = q_geom["valid"][..., :, None] & k_geom["valid"][..., None, :]
    codes_fn = geo.angle_codes_released if self.angle == "released" else geo.angle_sectors8
    bangle = codes_fn(q_geom["boxes"], k_geom["boxes"], is_self, valid)
    total = (self._bucketed(q, self.table_distance, bdist)
             + self._bucketed(q, self.table_angle, bangle))
    if self.use_1d:
      b1d = geo.relative_position_buckets(pos_q, pos_k, self.num_1d, self.max_1d)
      total = total + self._bucketed(q, self.table_1d, b1d)
    return total / math.sqrt(self.head_dim)


class GaussianTerm(nn.Module):
  """LAGaBi's Gaussian polar bias (`flaxdoc.nn.layout_terms.GaussianTerm`)."""

  def __init__(self, heads: int, corner: str, alpha: float, angle: str = "released"):
    super().__init__()
    self.mu_rho, self.mu_theta = _param(heads), _param(heads)
    self.sigma_rho, self.sigma_theta = _param(heads), _param(heads)
    self.corner, self.alpha, self.angle = corner, float(alpha), angle

  def forward(self, q, k, q_geom, k_geom) -> torch.Tensor:
    unit = 1000.0  # corners stay in 0-1000 units, parameters scaled (see the Flax term)
    pts_q = geo.box_point(q_geom["boxes"], self.corner)
    pts_k = geo.box_point(k_geom["boxes"], self.corner)
    floor2 = geo.SIGMA_FLOOR ** 2
    sigma_rho = torch.sqrt(unit ** 2 * (torch.square(self.sigma_rho) + floor2) - floor2)
    m_rho = (unit * self.mu_rho)[:, None, None]
    m_theta = self.mu_theta[:, None, None]
    var_rho = torch.square(sigma_rho)[:, None, None] + floor2
    var_theta = torch.square(self.sigma_theta)[:, None, None] + floor2
    dx, dy = geo.pairwise_deltas(pts_q, pts_k)
    rho = geo.safe_norm(dx, dy)
    origin = (dx == 0) & (dy == 0)
    one = torch.ones_like(dx)
    theta = torch.where(origin, torch.zeros_like(dx),
                        torch.atan2(torch.where(origin, one, dx), torch.where(origin, one, dy)))
    if self.angle == "paper":  # arctan(dy / dx) in [-pi/2, pi/2], plain difference
      vertical = dx == 0
      atan = torch.atan(dy / torch.where(vertical, one, dx))
      theta = torch.where(vertical, torch.sign(dy) * (math.pi / 2), atan)
      theta = torch.where(origin, torch.zeros_like(dx), theta)
    rho, theta = rho[..., None, :, :], theta[..., None, :, :]  # [..., 1, Q, K]
    if self.angle == "paper":
      dtheta = theta - m_theta
    else:
      wrapped = torch.remainder(theta - m_theta, 2.0 * math.pi)
      dtheta = torch.minimum(wrapped, 2.0 * math.pi - wrapped)
    exponent = torch.square(rho - m_rho) / (2.0 * var_rho) + torch.square(dtheta) / (2.0 * var_theta)
    return self.alpha * (torch.exp(-exponent) - 1.0)  # [..., H, Q, K]


class FixedBiasTerm(nn.Module):
  """Squircle / cross `log(max(w, 1e-5))` (`flaxdoc.nn.layout_terms.FixedBiasTerm`)."""

  def __init__(self, kind: str, extent: float = 1000.0, floor: float = 1e-5):
    super().__init__()
    self.kind, self.extent, self.floor = kind, float(extent), float(floor)

  def forward(self, q, k, q_geom, k_geom) -> torch.Tensor:
    a = math.pi / (2.0 * self.extent)
    dx, dy = geo.pairwise_deltas(q_geom["centers"], k_geom["centers"])
    cx, cy = torch.cos(a * dx), torch.cos(a * dy)
    w = cx * cy if self.kind == "squircle" else torch.maximum(cx, cy)
    return torch.log(torch.clamp(w, min=self.floor))[..., None, :, :]  # [..., 1, Q, K]


class LongPairsOnly(nn.Module):
  """A term zeroed on pairs with a global token (dense attention with globals)."""

  def __init__(self, term: nn.Module):
    super().__init__()
    self.term = term

  def forward(self, q, k, q_geom, k_geom) -> torch.Tensor:
    logits = self.term(q, k, q_geom, k_geom)
    keep = q_geom["is_long"][..., None, :, None] & k_geom["is_long"][..., None, None, :]
    return torch.where(keep, logits, torch.zeros_like(logits))

  def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
    # Flax shares this wrapper's scope with the wrapped term: no `term.` level.
    for key in list(state_dict):
      if key.startswith(prefix) and not key.startswith(prefix + "term."):
        state_dict[prefix + "term." + key[len(prefix):]] = state_dict.pop(key)
    super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


# ------------------------------------------------------------------ attentions
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


class EtcAttention(nn.Module):
  """`flaxdoc.nn.etc_attention.EtcAttention`: blocked global-local attention, `O(N * 3b)`.

  `x [B, G + N, E]` holds the `G` global tokens first; long queries see 3 key blocks
  (masked to `|i - j| <= r`) plus all globals, global queries see everything.
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

  def _long_queries(self, q, k, v, mask, terms, geom) -> torch.Tensor:
    """The reference form: `[B, N, H, D]` outputs of the long queries."""
    g, r = self.g, self.radius
    batch, total, heads, d = q.shape
    length = total - g
    block, nb, padded = self._blocking(length)
    scale = 1.0 / math.sqrt(d)
    ql_, kl_, vl_ = q[:, g:], k[:, g:], v[:, g:]
    kg, vg = k[:, :g], v[:, :g]
    long_valid, global_valid = mask[:, g:], mask[:, :g]
    blk = lambda a: _split_blocks(_pad_long(a, padded), block)  # noqa: E731
    ql = blk(ql_)  # [B, nb, b, H, D]
    kl = _three_blocks(blk(kl_))  # [B, nb, 3b, H, D]
    vl = _three_blocks(blk(vl_))
    valid_q = blk(long_valid)  # [B, nb, b]
    valid_k = _three_blocks(valid_q)  # [B, nb, 3b]
    offsets = _local_offsets(block)
    window = torch.tensor(np.abs(offsets) <= r, device=q.device)  # [b, 3b]
    l2l_mask = window & valid_q[..., :, None] & valid_k[..., None, :]  # [B, nb, b, 3b]
    l2g_mask = valid_q[..., :, None] & global_valid[:, None, None, :]  # [B, nb, b, G]
    l2l = torch.einsum("bnqhd,bnkhd->bnhqk", ql, kl)  # [B, nb, H, b, 3b]
    l2g = torch.einsum("bnqhd,bghd->bnhqg", ql, kg)  # [B, nb, H, b, G]
    md = ETC_MAX_RELATIVE_DISTANCE
    if self.relative:
      member_id = 2 * md + 1
      bias_hv = self.relative_bias.T  # [H, V]
      qr = torch.einsum("bnqhd,vhd->bnhqv", ql, self.relative_table) + bias_hv[:, None, :]
      ids = torch.tensor(np.clip(offsets, -md, md) + md, dtype=torch.int64, device=q.device)
      l2l = l2l + torch.gather(qr, -1, ids.expand(qr.shape[:-1] + (3 * block,)))
      # One global per document: every long token is a member of every global.
      l2g = l2g + qr[..., member_id:member_id + 1]
    l2l, l2g = l2l * scale, l2g * scale
    if terms:
      geom_long = {n: leaf[:, g:] for n, leaf in geom.items()}
      q_geom = {n: blk(leaf) for n, leaf in geom_long.items()}
      k_geom = {n: _three_blocks(leaf) for n, leaf in q_geom.items()}
      l2l = l2l + apply_terms(terms, ql, kl, q_geom, k_geom)
    pmask = torch.cat([l2l_mask, l2g_mask], dim=-1)[:, :, None]  # [B, nb, 1, b, 3b + G]
    logits = torch.cat([l2l, l2g], dim=-1)  # [B, nb, H, b, 3b + G]
    w = masked_softmax(logits, pmask)
    out_long = (torch.einsum("bnhqk,bnkhd->bnqhd", w[..., :3 * block], vl)
                + torch.einsum("bnhqg,bghd->bnqhd", w[..., 3 * block:], vg))
    return out_long.reshape(batch, padded, heads, d)[:, :length]

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
    """The long queries through fused attention, every block one batch entry.

    The additive parts (relative positions, layout terms) and the mask are written once
    into one `[B, nb, H, b, 3b + G]` float mask; `q.k` comes from the SDPA kernel.
    """
    g, r = self.g, self.radius
    batch, total, heads, d = q.shape
    length = total - g
    block, nb, padded = self._blocking(length)
    kk = 3 * block + g
    scale = 1.0 / math.sqrt(d)
    blk = lambda a: _split_blocks(_pad_long(a, padded), block)  # noqa: E731
    ql = blk(q[:, g:])  # [B, nb, b, H, D]
    kl, vl = _three_blocks(blk(k[:, g:])), _three_blocks(blk(v[:, g:]))  # [B, nb, 3b, H, D]
    kg, vg = k[:, :g], v[:, :g]
    valid_q = blk(mask[:, g:])  # [B, nb, b]
    valid_k = _three_blocks(valid_q)  # [B, nb, 3b]
    offsets = _local_offsets(block)
    window = torch.tensor(np.abs(offsets) <= r, device=q.device)  # [b, 3b]
    l2l_mask = window & valid_q[..., :, None] & valid_k[..., None, :]  # [B, nb, b, 3b]
    l2g_mask = valid_q[..., :, None] & mask[:, None, None, :g]  # [B, nb, b, G]
    pmask = torch.cat([l2l_mask, l2g_mask], dim=-1)[:, :, None]  # [B, nb, 1, b, 3b + G]
    # Head-shared 0 / BIG_NEG: the mask enters as one add, not a select over all heads.
    neg = torch.where(pmask, 0.0, BIG_NEG).to(q.dtype)
    local = None  # [B, nb, H, b, 3b]: what is added to the local logits
    l2g = None
    if self.relative:
      md = ETC_MAX_RELATIVE_DISTANCE
      qr = (torch.einsum("bnqhd,vhd->bnhqv", ql, self.relative_table)
            + self.relative_bias.T[:, None, :]) * scale  # [B, nb, H, b, V]
      ids = torch.tensor(np.clip(offsets, -md, md) + md, dtype=torch.int64, device=q.device)
      local = torch.gather(qr, -1, ids.expand(qr.shape[:-1] + (3 * block,)))
      l2g = qr[..., 2 * md + 1:2 * md + 2]  # every long token is a member of every global
    if terms:
      geom_long = {n: leaf[:, g:] for n, leaf in geom.items()}
      q_geom = {n: blk(leaf) for n, leaf in geom_long.items()}
      k_geom = {n: _three_blocks(leaf) for n, leaf in q_geom.items()}
      t = apply_terms(terms, ql, kl, q_geom, k_geom)
      local = t if local is None else local.add_(t)
    if local is None and l2g is None:
      bias = neg  # broadcast over the heads by the kernel
    else:
      shape = (batch, nb, heads, block)
      parts = [((q.new_zeros(()) if p is None else p).expand(shape + (c.stop - c.start,)), c)
               for p, c in ((local, slice(0, 3 * block)), (l2g, slice(3 * block, kk)))]
      if any(p.requires_grad for p, _ in parts):  # traced with autograd (torch.export)
        bias = torch.cat([p for p, _ in parts], dim=-1) + neg
      else:  # inference: both parts and the mask written straight into one buffer
        bias = q.new_empty(shape + (kk,))
        for part, cols in parts:
          torch.add(part, neg[..., cols], out=bias[..., cols])
    keys = torch.cat([kl, kg[:, None].expand(batch, nb, g, heads, d)], dim=2)  # [B, nb, kk, H, D]
    values = torch.cat([vl, vg[:, None].expand(batch, nb, g, heads, d)], dim=2)
    # Blocks folded into the batch: 4-D inputs, the layout every SDPA kernel (and
    # inductor's lowering) takes.
    qb = ql.permute(0, 1, 3, 2, 4).reshape(batch * nb, heads, block, d)
    keys = keys.permute(0, 1, 3, 2, 4).reshape(batch * nb, heads, kk, d)
    values = values.permute(0, 1, 3, 2, 4).reshape(batch * nb, heads, kk, d)
    bias = bias.reshape((batch * nb,) + tuple(bias.shape[2:]))
    out = F.scaled_dot_product_attention(qb, keys, values, attn_mask=bias, scale=scale)
    visible = pmask.reshape(batch * nb, 1, block, kk).any(dim=-1, keepdim=True)
    out = out * visible.to(out.dtype)  # a query with no visible key gets 0, as the reference
    out = out.reshape(batch, nb, heads, block, d).permute(0, 1, 3, 2, 4)  # [B, nb, b, H, D]
    return out.reshape(batch, padded, heads, d)[:, :length]


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
class GCNLayer(nn.Module):
  """`flaxdoc.nn.gcn.GCNLayer`: `h_k <- LN(h_k + sum_l softmax(w . m_kl) m_kl)`."""

  def __init__(self, width: int, edge_features: int, hidden: int | None = None,
               eps: float = 1e-6):
    super().__init__()
    hidden = int(hidden or width)
    self.message_in_kernel = _param(2 * width + edge_features, hidden)
    self.message_in_bias = _param(hidden)
    self.message_out = Dense(hidden, width)
    self.attention = Dense(width, 1, use_bias=False)
    self.layer_norm = LayerNorm(width, eps)
    self.fast = True

  def forward(self, h, ids, feats, nb_mask, node_mask) -> torch.Tensor:
    batch, nodes, width = h.shape
    k = ids.shape[2]
    ids = torch.clamp(torch.where(nb_mask, ids, torch.zeros_like(ids)), 0, nodes - 1)
    flat = ids.reshape(batch, nodes * k)
    nb_mask = nb_mask & torch.gather(node_mask, 1, flat).reshape(batch, nodes, k)
    edges = torch.where(nb_mask[..., None], feats, torch.zeros_like(feats))
    w1 = self.message_in_kernel
    from_self = h @ w1[:width]
    hidden = w1.shape[1]
    if self.fast:
      # One row gather over the flattened batch instead of a gather with an expanded index.
      rows = (flat + torch.arange(batch, device=h.device)[:, None] * nodes).reshape(-1)
      from_nb = (h @ w1[width:2 * width]).reshape(batch * nodes, hidden)[rows]
    else:
      from_nb = torch.gather(h @ w1[width:2 * width], 1,
                             flat[..., None].expand(batch, nodes * k, hidden))
    from_nb = from_nb.reshape(batch, nodes, k, hidden)
    pre = from_self[:, :, None, :] + from_nb + edges @ w1[2 * width:] + self.message_in_bias
    if self.fast:
      return self._once_per_node(h, F.gelu(pre), nb_mask)
    messages = self.message_out(F.gelu(pre))  # [B, L, K, E]
    scores = self.attention(messages)[..., 0]  # [B, L, K]
    scores = torch.where(nb_mask, scores, torch.full_like(scores, torch.finfo(torch.float32).min))
    weights = torch.softmax(scores, dim=-1)
    weights = torch.where(nb_mask, weights, torch.zeros_like(weights))
    return self.layer_norm(h + torch.einsum("blk,blke->ble", weights, messages))

  def _once_per_node(self, h, hidden, nb_mask) -> torch.Tensor:
    """The message MLP's second layer commutes with the weighted sum (`flaxdoc.nn.gcn`).

    score_kl = w . (W2 x_kl + b2) = x_kl . (W2 w) + b2 . w;
    sum_l a_kl m_kl = W2 (sum_l a_kl x_kl) + b2 sum_l a_kl.
    """
    w2, b2 = self.message_out.kernel, self.message_out.bias
    w_att = self.attention.kernel[:, 0]
    scores = hidden @ (w2 @ w_att) + b2 @ w_att  # [B, L, K]
    scores = torch.where(nb_mask, scores, torch.full_like(scores, torch.finfo(torch.float32).min))
    weights = torch.softmax(scores, dim=-1)
    weights = torch.where(nb_mask, weights, torch.zeros_like(weights))
    pooled = torch.einsum("blk,blkh->blh", weights, hidden)  # [B, L, H]
    aggregated = pooled @ w2 + weights.sum(-1, keepdim=True) * b2
    return self.layer_norm(h + aggregated)


class SuperTokenEncoder(nn.Module):
  """`flaxdoc.nn.gcn.SuperTokenEncoder`: node input projection, then GCN layers."""

  def __init__(self, width: int, num_layers: int, edge_features: int,
               message_hidden: str = "width"):
    super().__init__()
    self.node_input = Dense(width + 6, width)
    self.num_layers = num_layers
    if message_hidden not in ("width", "input"):
      raise ValueError(f"gcn_message_hidden must be 'width' or 'input', got {message_hidden!r}")
    hidden = width if message_hidden == "width" else 2 * width + edge_features
    for i in range(num_layers):
      self.add_module(f"layer_{i}", GCNLayer(width, edge_features, hidden))

  def forward(self, x, boxes, ids, feats, nb_mask, node_mask) -> torch.Tensor:
    b = boxes.to(torch.float32)
    spatial = torch.cat([b, (b[..., 2] - b[..., 0])[..., None],
                         (b[..., 3] - b[..., 1])[..., None]], dim=-1) / 1000.0
    h = self.node_input(torch.cat([x, spatial], dim=-1))
    for i in range(self.num_layers):
      h = getattr(self, f"layer_{i}")(h, ids, feats, nb_mask, node_mask)
    return h


# ------------------------------------------------------------------ encoder and head
class EncoderLayer(nn.Module):
  """`flaxdoc.nn.encoder.EncoderLayer`: post-LN attention + erf-GELU MLP."""

  def __init__(self, attention: nn.Module, width: int, mlp_dim: int, eps: float,
               terms: Sequence[nn.Module] = ()):
    super().__init__()
    self.attention = attention
    self.attention_norm = LayerNorm(width, eps)
    self.mlp_in = Dense(width, mlp_dim)
    self.mlp_out = Dense(mlp_dim, width)
    self.mlp_norm = LayerNorm(width, eps)
    for i, term in enumerate(terms):
      self.add_module(f"term_{i}", term)
    self.num_terms = len(terms)

  def forward(self, x, mask, geom, shared_terms=()) -> torch.Tensor:
    terms = [getattr(self, f"term_{i}") for i in range(self.num_terms)] + list(shared_terms)
    x = self.attention_norm(x + self.attention(x, mask, terms, geom))
    return self.mlp_norm(x + self.mlp_out(F.gelu(self.mlp_in(x))))


class Encoder(nn.Module):
  """`flaxdoc.nn.encoder.Encoder` (unscanned names `layer_{i}`, `shared_term_{i}`)."""

  def __init__(self, layers: Sequence[EncoderLayer], shared_terms: Sequence[nn.Module] = ()):
    super().__init__()
    self.num_layers, self.num_shared = len(layers), len(shared_terms)
    for i, layer in enumerate(layers):
      self.add_module(f"layer_{i}", layer)
    for i, term in enumerate(shared_terms):
      self.add_module(f"shared_term_{i}", term)

  def forward(self, x, mask, geom) -> torch.Tensor:
    shared = [getattr(self, f"shared_term_{i}") for i in range(self.num_shared)]
    for i in range(self.num_layers):
      x = getattr(self, f"layer_{i}")(x, mask, geom, shared)
    return x


class TaggingHead(nn.Module):
  """`flaxdoc.nn.heads.TaggingHead` (optional dense + tanh, then the output layer)."""

  def __init__(self, width: int, num_tags: int, hidden: bool):
    super().__init__()
    self.has_hidden = bool(hidden)
    if self.has_hidden:
      self.hidden = Dense(width, width)
    self.output = Dense(width, num_tags)

  def forward(self, x) -> torch.Tensor:
    if self.has_hidden:
      x = torch.tanh(self.hidden(x))
    return self.output(x)
