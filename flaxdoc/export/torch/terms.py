"""Layout terms of the PyTorch export (`flaxdoc.nn.layout_terms` twins, no JAX).

A term maps `(q, k, q_geom, k_geom)` to additive attention logits `[..., H, Q, K]` (or
`[..., 1, Q, K]` when shared by the heads); `apply_terms` sums a layer's terms. Dense
attention calls them on whole sequences, ETC on its blocks (`q_geom` per block, `k_geom`
over the three key blocks).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from flaxdoc.export.torch import geometry as geo
from flaxdoc.export.torch.basic import _param


def apply_terms(terms: Sequence[nn.Module], q, k, q_geom, k_geom) -> torch.Tensor | None:
  total = None
  for term in terms:
    logits = term(q, k, q_geom, k_geom).to(torch.float32)
    total = logits if total is None else total + logits
  return total


# ------------------------------------------------------------------ embeddings


class RichAttentionTerm(nn.Module):
  """FormNet's Rich Attention (`flaxdoc.nn.layout_terms.RichAttentionTerm`).

  Fast path (default): `token_projections` projects every token once (one GEMM, laid
  out projection first and tokens last, so every `[..., Q]` / `[..., K]` operand is
  contiguous: what lets inductor vectorise the fused loop), and `pairwise` builds the
  logits in place: `theta^2 / 2 (L - mu)^2` as `m * m` with `m = (mu - L) |theta| /
  sqrt 2`, the order sign as a multiply by +-1 (exact). About seven passes over
  `[..., H, Q, K]` per axis instead of fifteen. Blocked attention (ETC) calls the two
  halves apart, projecting tokens before it blocks them. The reference form is kept for
  the tests.
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
    return self.pairwise(self.token_projections(q, "q"), self.token_projections(k, "k"),
                         q_geom, k_geom)

  def token_projections(self, x: torch.Tensor, side: str) -> torch.Tensor:
    """`[..., N, H, D]` queries (`side="q"`) or keys ("k") -> `[2A, ..., H, N]`: every
    token's order (first A) and distance projections, projection first and tokens last.

    One GEMM with a block-diagonal `[2A * H, H * D]` weight, written tokens-last so every
    pairwise operand below is contiguous along the keys: that is what lets inductor
    vectorise the fused pairwise loop (with the heads innermost it emits scalar code,
    4-6x slower); the per-head einsum it replaces ran as a batched matmul with 2A outputs
    at about 2 GFLOP/s. Blocked attention projects each token once and then blocks the
    result, instead of projecting its overlapping key windows.
    """
    order, dist = (self.w_q, self.v_q) if side == "q" else (self.w_k, self.v_k)
    heads, d, _ = order.shape
    if tuple(x.shape[-2:]) != (heads, d):
      raise ValueError(f"RichAttentionTerm: tokens {tuple(x.shape)} are not [..., N, {heads}, {d}]")
    w = torch.cat([order, dist], dim=-1)  # [H, D, 2A]
    eye = torch.eye(heads, dtype=w.dtype, device=w.device)
    block_diag = torch.einsum("hdc,hg->cghd", w, eye).reshape(-1, heads * d)  # [2A*H, H*D]
    out = block_diag.mm(x.reshape(-1, heads * d).T)  # [2A * H, L * N]
    out = out.reshape((w.shape[-1], heads) + tuple(x.shape[:-2]))  # [2A, H, ..., N]
    return out.movedim(1, -2)  # [2A, ..., H, N]

  def pairwise(self, pq: torch.Tensor, pk: torch.Tensor, q_geom, k_geom, cq=None,
               ck=None) -> torch.Tensor:
    """The logits from per-token projections: `pq [2A, ..., H, Q]`, `pk [2A, ..., H, K]`
    (`token_projections`, possibly blocked) -> `[..., H, Q, K]`. `cq [A, ..., Q]`, `ck [A,
    ..., K]`: the coordinates axis-first (contiguous per axis), else read from the geometry."""
    a = len(self.axes)
    half_theta = self.theta.abs() * math.sqrt(0.5)  # [H, A]
    total = None
    for i, axis in enumerate(self.axes):
      ci = (self._coordinate(q_geom, axis) if cq is None else cq[i])[..., None, :, None]
      cj = (self._coordinate(k_geom, axis) if ck is None else ck[i])[..., None, None, :]
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
