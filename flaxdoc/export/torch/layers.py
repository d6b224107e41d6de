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
`[b] x [3b + G]` attentions, the terms and the mask written once into that mask);
Rich Attention projects axis-first and computes its pairwise part in a few in-place
passes (see `RichAttentionTerm`); projections are single `addmm`s. No Python loop runs
over blocks or edges, and nothing breaks a Dynamo graph (one graph per model), so the
modules trace cleanly under `torch.compile` and `torch.export`.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from flaxdoc.export.torch import geometry as geo
# The modules live in one file per concept (basic, terms, attention, etc_attention, gcn); their names
# stay importable from here, where user code and the tests have always found them.
from flaxdoc.export.torch.attention import (
    CosformerAttention, DenseSelfAttention, LinformerAttention, masked_softmax, sdpa_with_bias)
from flaxdoc.export.torch.basic import (
    BIG_NEG, ETC_MAX_RELATIVE_DISTANCE, Dense, Embed, HeadsProjection, LayerNorm, OutProjection,
    set_fast_paths)
from flaxdoc.export.torch.etc_attention import EtcAttention
from flaxdoc.export.torch.gcn import GCNLayer, SuperTokenEncoder
from flaxdoc.export.torch.terms import (
    FixedBiasTerm, GaussianTerm, LongPairsOnly, PolarTerm, RichAttentionTerm, apply_terms)


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


__all__ = [
    "BIG_NEG", "ETC_MAX_RELATIVE_DISTANCE", "CosformerAttention", "Dense", "DenseSelfAttention",
    "Embed", "Embeddings", "Encoder", "EncoderLayer", "EtcAttention", "FixedBiasTerm",
    "GCNLayer", "GaussianTerm", "HeadsProjection", "LSPE", "LayerNorm", "LinformerAttention",
    "LongPairsOnly", "OutProjection", "PolarTerm", "RichAttentionTerm", "SuperTokenEncoder",
    "TaggingHead", "apply_terms", "masked_softmax", "sdpa_with_bias", "set_fast_paths",
]
