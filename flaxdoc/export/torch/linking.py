"""PyTorch twin of `flaxdoc.nn.linking.LinkingHead` (parameter names = Flax paths).

`TorchLinkingHead(width, num_labels, dim, pooling, geometry, text)` takes the encoder's
token states `[B, L, H]` and the featuriser's `link_*` arrays (`flaxdoc.data.linking`)
and returns the link logits `[B, V, C + 1]` (last column: "no key"; masked candidates
-1e9), equal to the Flax head's. Candidates are gathered by index, as in Flax: the
cost is linear in the candidate pairs. As in Flax, `encode` (a window's entity vectors)
and `score` (candidate pairs from those vectors) also run apart, for linking across
windows (`config.linking.scope="document"`, `flaxdoc.train.linking`).
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from flaxdoc.export.torch.basic import Dense, _param

LINK_KEYS = ("link_first", "link_token_entity", "link_label", "link_box", "link_value",
             "link_candidates", "link_candidate_mask")
NEG_INF = -1e9
NUM_GEOMETRY_INPUTS = 12  # flaxdoc.nn.linking.NUM_GEOMETRY_INPUTS
# flaxdoc.nn.linking.ENCODING_OUTPUTS: `encode`'s entries as the model's outputs.
ENCODING_OUTPUTS = {"value": "link_value_vectors", "key": "link_key_vectors",
                    "none": "link_none"}


def _signed_log(x: torch.Tensor) -> torch.Tensor:
  return torch.sign(x) * torch.log1p(torch.abs(x))


def pair_geometry(key_boxes: torch.Tensor, value_boxes: torch.Tensor) -> torch.Tensor:
  """`flaxdoc.nn.linking.pair_geometry`: `[..., 4]` x 2 -> `[..., 11]`."""
  kx0, ky0, kx1, ky1 = key_boxes.unbind(-1)
  vx0, vy0, vx1, vy1 = value_boxes.unbind(-1)
  gap_x, gap_y = vx0 - kx1, vy0 - ky1
  apart_x = torch.maximum(gap_x, kx0 - vx1).clamp(min=0.0)
  apart_y = torch.maximum(gap_y, ky0 - vy1).clamp(min=0.0)

  def overlap(a0, a1, b0, b1):
    shorter = torch.minimum(a1 - a0, b1 - b0).clamp(min=1.0)
    return ((torch.minimum(a1, b1) - torch.maximum(a0, b0)) / shorter).clamp(0.0, 1.0)
  return torch.stack([
      _signed_log(0.5 * ((vx0 - kx0) + (vx1 - kx1))),
      _signed_log(0.5 * ((vy0 - ky0) + (vy1 - ky1))),
      _signed_log(gap_x), _signed_log(gap_y),
      _signed_log(vx0 - kx0), _signed_log(vy0 - ky0),
      torch.log1p(torch.hypot(apart_x, apart_y)),
      overlap(ky0, ky1, vy0, vy1), overlap(kx0, kx1, vx0, vx1),
      (gap_x >= 0).to(key_boxes.dtype), (gap_y >= 0).to(key_boxes.dtype),
  ], dim=-1)


def candidate_geometry(key_boxes: torch.Tensor, value_boxes: torch.Tensor) -> torch.Tensor:
  """`flaxdoc.nn.linking.candidate_geometry`: `[B, V, C, 4]`, `[B, V, 4]` -> `[B, V, C, 12]`,
  pair geometry and log(1 + rank)."""
  feats = pair_geometry(key_boxes, value_boxes[:, :, None])
  rank = torch.log1p(torch.arange(key_boxes.shape[2], dtype=feats.dtype, device=feats.device))
  return torch.cat([feats, rank[:, None].expand(feats.shape[:-1] + (1,))], dim=-1)


def geometry_inputs(boxes: torch.Tensor, value_idx: torch.Tensor,
                    cand: torch.Tensor) -> torch.Tensor:
  """`flaxdoc.nn.linking.geometry_inputs`: `[B, V, C, 12]` of a window's candidates."""
  return candidate_geometry(_gather_rows(boxes, cand), _gather_rows(boxes, value_idx))


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
               geometry: bool = True, text: bool = True, text_dropout: float = 0.0,
               geometry_hidden: int = 32):
    super().__init__()
    del text_dropout  # training only (the spec in config.json carries it)
    self.pooling = pooling
    self.num_labels = int(num_labels)
    self.has_geometry = bool(geometry)
    self.has_text = bool(text)
    self.label_embedding = _param(num_labels, width)
    self.value_ffn = _RoleFFN(width, dim)
    if self.has_text:
      self.key_ffn = _RoleFFN(width, dim)
      self.bilinear = _param(dim, dim)
      self.key_bias = _param(dim)
    self.no_key = Dense(dim, 1)
    if self.has_geometry:
      self.geometry_in = Dense(NUM_GEOMETRY_INPUTS, geometry_hidden)
      self.geometry_out = Dense(geometry_hidden, 1)

  def _pool(self, hidden, first, token_entity, num_entities):
    if self.pooling == "first":
      return _gather_rows(hidden, first)
    onehot = (token_entity[..., None] == torch.arange(num_entities)).to(hidden.dtype)  # [B, L, E]
    sums = torch.einsum("ble,blh->beh", onehot, hidden)
    return sums / onehot.sum(1).clamp(min=1.0)[..., None]

  def encode(self, hidden: torch.Tensor, link: Mapping[str, torch.Tensor]) -> dict:
    """`LinkingHead.encode`: `{"value": [B, E, D], "key": [B, E, D] (text), "none": [B, E]}`."""
    for key in LINK_KEYS:
      if key not in link:
        raise KeyError(f"batch lacks {key!r}: link arrays come from flaxdoc.data.linking")
    first = link["link_first"].to(torch.int64)
    num_entities = first.shape[1]
    pooled = self._pool(hidden, first, link["link_token_entity"].to(torch.int64), num_entities)
    labels = link["link_label"].to(torch.int64).clamp(0, self.num_labels - 1)
    reps = pooled + self.label_embedding[labels]
    out = {"value": self.value_ffn(reps)}
    if self.has_text:
      out["key"] = self.key_ffn(reps)
    out["none"] = self.no_key(out["value"])[..., 0]
    return out

  def score(self, value, none, key, value_box, key_box, mask) -> torch.Tensor:
    """`LinkingHead.score`: logits `[B, V, C + 1]` of candidate pairs from their encodings
    (`value [B, V, D]`, `none [B, V]`, `key [B, V, C, D]` or None, boxes, `mask [B, V, C]`)."""
    scores = torch.zeros(mask.shape, dtype=value.dtype, device=value.device)
    if self.has_text:
      scores = (torch.einsum("bve,bvce->bvc", value @ self.bilinear, key) +
                torch.einsum("bvce,e->bvc", key, self.key_bias))
    if self.has_geometry:
      feats = candidate_geometry(key_box.to(torch.float32), value_box.to(torch.float32))
      g = self.geometry_out(nn.functional.gelu(self.geometry_in(feats)))
      scores = scores + g[..., 0]
    scores = torch.where(mask.to(torch.bool), scores, torch.full_like(scores, NEG_INF))
    return torch.cat([scores, none[..., None]], dim=-1)  # [B, V, C + 1]

  def window_scores(self, encoded: dict, link: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """`score` over the window's own candidates."""
    value_idx = link["link_value"].to(torch.int64)  # [B, V]
    cand = link["link_candidates"].to(torch.int64)  # [B, V, C]
    boxes = link["link_box"].to(torch.float32)  # [B, E, 4]
    return self.score(_gather_rows(encoded["value"], value_idx),
                      _gather_rows(encoded["none"][..., None], value_idx)[..., 0],
                      _gather_rows(encoded["key"], cand) if self.has_text else None,
                      _gather_rows(boxes, value_idx), _gather_rows(boxes, cand),
                      link["link_candidate_mask"])

  def forward(self, hidden: torch.Tensor, link: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return self.window_scores(self.encode(hidden, link), link)
