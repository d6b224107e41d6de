"""Pairwise layout geometry in PyTorch: the torch twins of `flaxdoc.layout` (no JAX).

Each function mirrors the numbered function of `flaxdoc.layout.*` named in its
docstring, with the same shapes and conventions (DESIGN §2: query geometry
`[..., Q, G]`, key geometry `[..., K, G]`, pairs `[..., Q, K]`; boxes in 0-1000 units,
pages stacked as `y_doc = 1000 * page + y`). They are exercised against the Flax
models end to end by `tests/export/test_torch_parity.py`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

PAGE_HEIGHT = 1000.0
NUM_ANGLE_CODES = 14
NUM_ANGLE_SECTORS8_CODES = 10
ANGLE_SELF = 0
ANGLE_PADDING = 13
SECTORS8_PADDING = 9
SIGMA_FLOOR = 1e-3


def sine_features(positions: torch.Tensor, dim: int, max_period: float = 10000.0
                  ) -> torch.Tensor:
  """`flaxdoc.layout.sine.sine_features`: `[...]` -> `[..., dim]` interleaved sin/cos."""
  freqs = float(max_period) ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
  freqs = torch.tensor(freqs, dtype=torch.float32, device=positions.device)  # [dim / 2]
  angles = positions.to(torch.float32)[..., None] * freqs  # [..., dim / 2]
  pe = torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1)  # [..., dim / 2, 2]
  return pe.reshape(pe.shape[:-2] + (dim,))  # [..., dim]


def stack_pages(boxes: torch.Tensor, pages: torch.Tensor) -> torch.Tensor:
  """`flaxdoc.layout.geometry.stack_pages`: y shifted down by `1000 * page`."""
  offset = PAGE_HEIGHT * pages.to(torch.float32)  # [...]
  zero = torch.zeros_like(offset)
  return boxes.to(torch.float32) + torch.stack([zero, offset, zero, offset], dim=-1)


def box_centers(boxes: torch.Tensor) -> torch.Tensor:
  """`[..., 4]` -> `[..., 2]` box centres."""
  boxes = boxes.to(torch.float32)
  return 0.5 * (boxes[..., 0:2] + boxes[..., 2:4])


def box_point(boxes: torch.Tensor, which: str) -> torch.Tensor:
  """`flaxdoc.layout.geometry.box_point` for "center", "top_left", "bottom_left"."""
  boxes = boxes.to(torch.float32)
  if which == "center":
    return box_centers(boxes)
  columns = {"top_left": (0, 1), "bottom_left": (0, 3), "top_right": (2, 1),
             "bottom_right": (2, 3)}
  cx, cy = columns[which]
  return torch.stack([boxes[..., cx], boxes[..., cy]], dim=-1)


def pairwise_deltas(pts_q: torch.Tensor, pts_k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
  """Key-minus-query `(dx, dy)`, each `[..., Q, K]`."""
  dx = pts_k[..., None, :, 0] - pts_q[..., :, None, 0]
  dy = pts_k[..., None, :, 1] - pts_q[..., :, None, 1]
  return dx, dy


def safe_norm(dx: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
  r2 = dx * dx + dy * dy
  positive = r2 > 0
  return torch.where(positive, torch.sqrt(torch.where(positive, r2, torch.ones_like(r2))),
                     torch.zeros_like(r2))


def pairwise_distances(pts_q: torch.Tensor, pts_k: torch.Tensor) -> torch.Tensor:
  return safe_norm(*pairwise_deltas(pts_q, pts_k))  # [..., Q, K]


def distance_quantile_edges(centers: torch.Tensor, mask: torch.Tensor, num_buckets: int,
                            pool: str = "document") -> torch.Tensor:
  """`flaxdoc.layout.polar.distance_quantile_edges`: `[B, num_buckets + 1]` (linear quantiles)."""
  b, n = mask.shape
  dist = pairwise_distances(centers, centers)  # [B, N, N]
  upper = torch.triu(torch.ones((n, n), dtype=torch.bool, device=mask.device), diagonal=1)
  pair_ok = mask[:, :, None] & mask[:, None, :] & upper  # [B, N, N]
  groups = 1 if pool == "batch" else b
  flat_d = dist.reshape(groups, -1)  # [G, M]
  flat_ok = pair_ok.reshape(groups, -1)  # [G, M]
  count = flat_ok.sum(dim=-1)  # [G]
  ordered = torch.sort(torch.where(flat_ok, flat_d, torch.full_like(flat_d, math.inf)),
                       dim=-1).values  # [G, M]
  probs = torch.linspace(0.0, 1.0, num_buckets + 1, dtype=torch.float32,
                         device=mask.device)  # [E]
  last = torch.clamp(count - 1, min=0).to(torch.float32)  # [G]
  pos = probs[None, :] * last[:, None]  # [G, E]
  lo = torch.floor(pos)
  frac = pos - lo
  lo_i = lo.to(torch.int64)
  hi_i = torch.minimum(lo_i + 1, torch.clamp(count - 1, min=0)[:, None])
  v_lo = torch.gather(ordered, -1, lo_i)
  v_hi = torch.gather(ordered, -1, hi_i)
  edges = v_lo + (v_hi - v_lo) * frac  # [G, E]
  edges = torch.where(count[:, None] > 0, edges, torch.zeros_like(edges))
  return edges.expand(b, num_buckets + 1)  # [B, E]


def distance_buckets(centers_q: torch.Tensor, centers_k: torch.Tensor,
                     edges: torch.Tensor) -> torch.Tensor:
  """`flaxdoc.layout.polar.distance_buckets`: `int64 [..., Q, K]`."""
  rho = pairwise_distances(centers_q, centers_k)  # [..., Q, K]
  bucket = torch.zeros(rho.shape, dtype=torch.int64, device=rho.device)
  for i in range(1, edges.shape[-1] - 1):
    bucket = bucket + (rho >= edges[..., i, None, None]).to(torch.int64)
  return bucket


def angle_octants(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
  """`flaxdoc.layout.polar.angle_octants`: exact `floor(phi / 45)` in 0..7."""
  q1 = (u <= 0) & (v > 0)
  q2 = (u < 0) & (v <= 0)
  q3 = (u >= 0) & (v < 0)
  one = torch.ones_like(u, dtype=torch.int64)
  quadrant = torch.where(q1, one, torch.where(q2, 2 * one, torch.where(q3, 3 * one, 0 * one)))
  ur = torch.where(q1, v, torch.where(q2, -u, torch.where(q3, -v, u)))
  vr = torch.where(q1, -u, torch.where(q2, -v, torch.where(q3, u, v)))
  origin = (u == 0) & (v == 0)
  half = ((vr >= ur) & ~origin).to(torch.int64)
  return 2 * quadrant + half


def _extents_overlap(lo_q, hi_q, lo_k, hi_k) -> torch.Tensor:
  lo = torch.maximum(lo_q[..., :, None], lo_k[..., None, :])
  hi = torch.minimum(hi_q[..., :, None], hi_k[..., None, :])
  return lo < hi


def angle_codes_released(boxes_q, boxes_k, is_self, valid) -> torch.Tensor:
  """`flaxdoc.layout.polar.angle_codes_released`: 14 codes, `int64 [..., Q, K]`."""
  bq, bk = boxes_q.to(torch.float32), boxes_k.to(torch.float32)
  dx, dy = pairwise_deltas(box_centers(bq), box_centers(bk))
  u, v = dx, -dy
  sector = angle_octants(u, v) + 5
  right = (u > 0) | ((u == 0) & (v == 0))
  above = (v > 0) | ((v == 0) & (u >= 0))
  same_row = _extents_overlap(bq[..., 1], bq[..., 3], bk[..., 1], bk[..., 3])
  same_col = _extents_overlap(bq[..., 0], bq[..., 2], bk[..., 0], bk[..., 2])
  one = torch.ones_like(sector)
  code = torch.where(same_row, torch.where(right, one, 3 * one), sector)
  code = torch.where(same_col, torch.where(above, 2 * one, 4 * one), code)
  code = torch.where(is_self, ANGLE_SELF * one, code)
  return torch.where(valid, code, ANGLE_PADDING * one)


def angle_sectors8(boxes_q, boxes_k, is_self, valid) -> torch.Tensor:
  """`flaxdoc.layout.polar.angle_sectors8`: the paper's 8 sectors, codes 0..9."""
  dx, dy = pairwise_deltas(box_centers(boxes_q), box_centers(boxes_k))
  phi = torch.remainder(torch.rad2deg(torch.atan2(-dy, dx)), 360.0)
  sector = torch.remainder(torch.floor((phi + 22.5) / 45.0).to(torch.int64), 8)
  code = torch.where(is_self, torch.zeros_like(sector), sector + 1)
  return torch.where(valid, code, torch.full_like(code, SECTORS8_PADDING))


def _log_bucket_thresholds(max_exact: int, num_buckets: int, max_distance: int) -> np.ndarray:
  steps = num_buckets - max_exact
  k = np.arange(1, steps, dtype=np.float64)
  t = max_exact * (max_distance / max_exact) ** (k / steps)
  snapped = np.round(t)
  t = np.where(np.abs(t - snapped) <= 1e-9 * t, snapped, t)
  return np.ceil(t).astype(np.int64)


def relative_position_buckets(pos_q: torch.Tensor, pos_k: torch.Tensor, num_buckets: int = 32,
                              max_distance: int = 128) -> torch.Tensor:
  """`flaxdoc.layout.relative.relative_position_buckets` (T5, bidirectional)."""
  rel = pos_k.to(torch.int64)[..., None, :] - pos_q.to(torch.int64)[..., :, None]  # [..., Q, K]
  buckets = num_buckets // 2
  ret = torch.where(rel > 0, torch.full_like(rel, buckets), torch.zeros_like(rel))
  n = torch.abs(rel)
  max_exact = buckets // 2
  thresholds = torch.tensor(_log_bucket_thresholds(max_exact, buckets, int(max_distance)),
                            dtype=torch.int64, device=rel.device)
  large = max_exact + torch.searchsorted(thresholds, n.contiguous(), right=True)
  return ret + torch.where(n < max_exact, n, large)


def layout_geometry(boxes: torch.Tensor, mask: torch.Tensor, *, pages: torch.Tensor | None,
                    positions: torch.Tensor, distance_buckets_count: int | None = None,
                    distance_pool: str = "document") -> dict[str, torch.Tensor]:
  """`flaxdoc.nn.layout_terms.layout_geometry`: the per-token geometry the terms read."""
  boxes = boxes.to(torch.float32)
  if pages is not None:
    boxes = stack_pages(boxes, pages)  # [B, N, 4]
  geom = {"boxes": boxes, "centers": box_centers(boxes), "positions": positions.to(torch.int64),
          "valid": mask}
  if distance_buckets_count is not None:
    edges = distance_quantile_edges(geom["centers"], mask, distance_buckets_count,
                                    distance_pool)  # [B, E]
    geom["dist_edges"] = edges[:, None, :].expand(mask.shape[0], mask.shape[1], edges.shape[-1])
  return geom
