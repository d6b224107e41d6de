"""PyTorch twin of `flaxdoc.nn.linking.LinkingHead` (parameter names = Flax paths).

`TorchLinkingHead(width, num_labels, dim, pooling, geometry)` takes the encoder's
token states `[B, L, H]` and the featuriser's `link_*` arrays (`flaxdoc.data.linking`)
and returns the link logits `[B, V, C + 1]` (last column: "no key"; masked candidates
-1e9), equal to the Flax head's. Candidates are gathered by index, as in Flax: the
cost is linear in the candidate pairs.
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from flaxdoc.export.torch.basic import Dense, _param

LINK_KEYS = ("link_first", "link_token_entity", "link_label", "link_box", "link_value",
             "link_candidates", "link_candidate_mask")
NEG_INF = -1e9


def pair_geometry(key_boxes: torch.Tensor, value_boxes: torch.Tensor) -> torch.Tensor:
  """`flaxdoc.nn.linking.pair_geometry`: `[..., 4]` x 2 -> `[..., 6]`."""
  kc = 0.5 * (key_boxes[..., :2] + key_boxes[..., 2:])
  vc = 0.5 * (value_boxes[..., :2] + value_boxes[..., 2:])
  feats = torch.stack([
      vc[..., 0] - kc[..., 0], vc[..., 1] - kc[..., 1],
      value_boxes[..., 0] - key_boxes[..., 2], value_boxes[..., 1] - key_boxes[..., 3],
      value_boxes[..., 0] - key_boxes[..., 0], value_boxes[..., 1] - key_boxes[..., 1],
  ], dim=-1)
  return feats / 1000.0


class _RoleFFN(nn.Module):

  def __init__(self, width: int, dim: int):
    super().__init__()
    self.dense_in = Dense(width, dim)
    self.dense_out = Dense(dim, dim)

  def forward(self, x):
    return self.dense_out(nn.functional.gelu(self.dense_in(x)))


def _gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
  """`x [B, E, F]`, `index [B, ...]` -> `[B, ..., F]`."""
  b = x.shape[0]
  flat = index.reshape(b, -1).to(torch.int64)
  out = torch.gather(x, 1, flat[..., None].expand(-1, -1, x.shape[-1]))
  return out.reshape(tuple(index.shape) + (x.shape[-1],))


class TorchLinkingHead(nn.Module):
  """Biaffine key -> value scores over candidate pairs (see `flaxdoc.nn.linking`)."""

  def __init__(self, width: int, num_labels: int, dim: int = 128, pooling: str = "first",
               geometry: bool = False, geometry_hidden: int = 32):
    super().__init__()
    self.pooling = pooling
    self.num_labels = int(num_labels)
    self.has_geometry = bool(geometry)
    self.label_embedding = _param(num_labels, width)
    self.key_ffn = _RoleFFN(width, dim)
    self.value_ffn = _RoleFFN(width, dim)
    self.bilinear = _param(dim, dim)
    self.key_bias = _param(dim)
    self.no_key = Dense(dim, 1)
    if self.has_geometry:
      self.geometry_in = Dense(6, geometry_hidden)
      self.geometry_out = Dense(geometry_hidden, 1)

  def _pool(self, hidden, first, token_entity, num_entities):
    if self.pooling == "first":
      return _gather_rows(hidden, first)
    onehot = (token_entity[..., None] == torch.arange(num_entities)).to(hidden.dtype)  # [B, L, E]
    sums = torch.einsum("ble,blh->beh", onehot, hidden)
    return sums / onehot.sum(1).clamp(min=1.0)[..., None]

  def forward(self, hidden: torch.Tensor, link: Mapping[str, torch.Tensor]) -> torch.Tensor:
    for key in LINK_KEYS:
      if key not in link:
        raise KeyError(f"batch lacks {key!r}: link arrays come from flaxdoc.data.linking")
    first = link["link_first"].to(torch.int64)
    num_entities = first.shape[1]
    pooled = self._pool(hidden, first, link["link_token_entity"].to(torch.int64), num_entities)
    labels = link["link_label"].to(torch.int64).clamp(0, self.num_labels - 1)
    reps = pooled + self.label_embedding[labels]
    keys, values = self.key_ffn(reps), self.value_ffn(reps)  # [B, E, D]
    value_idx = link["link_value"].to(torch.int64)  # [B, V]
    cand = link["link_candidates"].to(torch.int64)  # [B, V, C]
    t = _gather_rows(values, value_idx)  # [B, V, D]
    h = _gather_rows(keys, cand)  # [B, V, C, D]
    scores = (torch.einsum("bve,bvce->bvc", t @ self.bilinear, h) +
              torch.einsum("bvce,e->bvc", h, self.key_bias))
    if self.has_geometry:
      boxes = link["link_box"].to(torch.float32)
      feats = pair_geometry(_gather_rows(boxes, cand), _gather_rows(boxes, value_idx)[:, :, None])
      g = self.geometry_out(nn.functional.gelu(self.geometry_in(feats)))
      scores = scores + g[..., 0]
    scores = torch.where(link["link_candidate_mask"].to(torch.bool), scores,
                         torch.full_like(scores, NEG_INF))
    return torch.cat([scores, self.no_key(t)], dim=-1)  # [B, V, C + 1]
