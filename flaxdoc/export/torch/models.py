"""The PyTorch document encoder: every flaxdoc family from its exported spec (no JAX).

`TorchDocumentEncoder(spec, vocab_size, num_tags, max_len)` mirrors
`flaxdoc.models.document_encoder.DocumentEncoder` for inference:

    batch ─► Embeddings ─► [GCN Super-Tokens] ─► [prepend G global tokens]
          ─► Encoder(dense | ETC blocked | Linformer | cosFormer, layout terms)
          ─► [drop globals] ─► tagging head ─► tag logits [B, L, T]

`spec` is the dict of `EncoderSpec` fields (`config.json["model"]` of an export).
The families differ only in the spec: FormNet (ETC + Rich Attention + GCN, or the
`etc` ablation with ETC relative ids), DocPolarBERT (dense + polar tables), LAGaBi
(dense + Gaussian bias), LayoutLM variants (learned / LSPE / sine positions,
squircle / cross biases), LayoutLinformer and LayoutCosformer.

`forward(batch)` takes a dict of tensors with the featuriser's keys
(`flaxdoc.data.features`); the subset it reads is `BATCH_KEYS` (`positions`,
`page_ids`, `boxes` and the `neighbor_*` graph only where the model needs them).
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from flaxdoc.export.torch import geometry as geo
from flaxdoc.export.torch import layers as L
from flaxdoc.export.torch.linking import ENCODING_OUTPUTS, TorchLinkingHead

# Keys `forward` reads: required, then optional (defaults as in the Flax model).
BATCH_KEYS = ("input_ids", "attention_mask")
OPTIONAL_BATCH_KEYS = ("positions", "page_ids", "boxes", "neighbor_ids", "neighbor_features",
                       "neighbor_mask")
DEFAULT_EDGE_FEATURES = 16


class TorchDocumentEncoder(nn.Module):
  """Inference twin of the Flax `DocumentEncoder` (parameter names = Flax paths).

  Args:
    spec: `EncoderSpec` fields as a dict.
    vocab_size, num_tags, max_len: as `flaxdoc.models.build_model`.
    edge_features: width of the GCN edge features (`neighbor_features[..., F]`).
  """

  def __init__(self, spec: Mapping, vocab_size: int, num_tags: int, max_len: int,
               edge_features: int = DEFAULT_EDGE_FEATURES, linking: Mapping | None = None):
    super().__init__()
    s = dict(spec)
    self.spec = s
    self.max_len = int(max_len)
    e, h = int(s["width"]), int(s["num_heads"])
    d = e // h
    self.attention_kind = s["attention"]
    self.num_globals = int(s.get("num_globals", 0))
    self.gcn_layers = int(s.get("gcn_layers", 0))
    self.position_offset = int(s.get("position_offset", 0))
    self.embeddings = L.Embeddings(s, vocab_size)
    if self.gcn_layers:
      self.super_tokens = L.SuperTokenEncoder(e, self.gcn_layers, edge_features,
                                              s.get("gcn_message_hidden", "width"))
    if self.num_globals:
      self.global_embedding = nn.Parameter(torch.zeros(self.num_globals, e))

    dense_globals = self.attention_kind == "dense" and self.num_globals > 0
    shared = []
    if s.get("polar"):
      shared.append(L.PolarTerm(s, d))
    if s.get("gaussian"):
      shared.append(L.GaussianTerm(h, s["gaussian_corner"], s["gaussian_alpha"],
                                   s.get("gaussian_angle", "released")))
    if s.get("fixed_bias", "none") != "none":
      shared.append(L.FixedBiasTerm(s["fixed_bias"]))
    if dense_globals:
      shared = [L.LongPairsOnly(t) for t in shared]
    layers = []
    for _ in range(int(s["depth"])):
      terms = []
      if s.get("rich_attention"):
        rich = L.RichAttentionTerm(h, d, tuple(s["rich_axes"]))
        terms.append(L.LongPairsOnly(rich) if dense_globals else rich)
      layers.append(L.EncoderLayer(self._attention(s, e, h), e, int(s["mlp_dim"]),
                                   s["layer_norm_epsilon"], terms))
    self.encoder = L.Encoder(layers, shared)
    self.tagging_head = L.TaggingHead(e, num_tags, s.get("tagging_hidden", False))
    # Entity linking (`config.json["linking"]`, a `LinkingSpec`): link logits too.
    self.linking_head = TorchLinkingHead(e, **linking) if linking else None

  def _attention(self, s: Mapping, e: int, h: int) -> nn.Module:
    kind = s["attention"]
    if kind == "dense":
      return L.DenseSelfAttention(e, h)
    if kind == "etc":
      return L.EtcAttention(e, h, s["local_radius"], s["num_globals"],
                            s.get("etc_relative_positions", False))
    if kind == "linformer":
      return L.LinformerAttention(e, h, self.max_len, s["linformer_proj_length"])
    if kind == "cosformer":
      return L.CosformerAttention(e, h, s["cosformer_reweight"], self.max_len,
                                  length=s.get("cosformer_length", "max"))
    raise ValueError(f"unknown attention kind {kind!r} in the exported spec")

  @property
  def uses_layout_terms(self) -> bool:
    s = self.spec
    return bool(s.get("rich_attention") or s.get("polar") or s.get("gaussian")
                or s.get("fixed_bias", "none") != "none")

  def _geometry(self, boxes, mask, pages, positions):
    s = self.spec
    if self.attention_kind == "cosformer":
      if s["cosformer_reweight"] in ("squircle", "cross"):
        return geo.layout_geometry(boxes, mask, pages=None, positions=positions)
      return {"positions": positions}
    if not self.uses_layout_terms:
      return None
    return geo.layout_geometry(
        boxes, mask, pages=pages, positions=positions,
        distance_buckets_count=int(s["polar_distance_buckets"]) if s.get("polar") else None,
        distance_pool=s.get("polar_distance_pool", "document"))

  def forward(self, batch: Mapping[str, torch.Tensor]):
    """Tag logits `float32 [B, L, T]` for a featurised batch (see `BATCH_KEYS`).

    A model exported with a linking head, given a batch with the `link_*` arrays,
    returns `(tag_logits, link_logits [B, V, C + 1])`.
    """
    x = self.token_states(batch)  # [B, L, E]
    if self.linking_head is not None and "link_first" in batch:
      return self.tagging_head(x), self.linking_head(x, batch)
    return self.tagging_head(x)

  def link_outputs(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The Flax model's link outputs: `link_logits` and the window's entity encodings
    (`link_value_vectors`, `link_key_vectors`, `link_none`; `TorchLinkingHead.encode`)."""
    if self.linking_head is None:
      raise ValueError("this exported model has no linking head")
    encoded = self.linking_head.encode(self.token_states(batch), batch)
    return {"link_logits": self.linking_head.window_scores(encoded, batch),
            **{ENCODING_OUTPUTS[k]: v for k, v in encoded.items()}}

  def token_states(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The encoder's output `[B, L, E]` (without the global tokens)."""
    for key in BATCH_KEYS:
      if key not in batch:
        raise KeyError(f"batch lacks {key!r}; pass the featuriser's arrays as tensors")
    ids = batch["input_ids"].to(torch.int64)
    bsz, length = ids.shape
    mask = batch["attention_mask"] > 0
    positions = batch.get("positions")
    if positions is None:
      positions = torch.arange(length, device=ids.device).expand(bsz, length)
    positions = positions.to(torch.int64)
    pages = batch.get("page_ids")
    pages = (torch.zeros_like(ids) if pages is None
             else torch.where(mask, pages.to(torch.int64), torch.zeros_like(ids)))
    boxes = batch.get("boxes")
    if boxes is None:
      boxes = torch.zeros((bsz, length, 4), dtype=torch.int64, device=ids.device)
    boxes = boxes.to(torch.int64) if not torch.is_floating_point(boxes) else boxes
    x = self.embeddings(ids, positions + self.position_offset, boxes, pages)  # [B, L, E]
    if self.gcn_layers:
      for key in ("neighbor_ids", "neighbor_features", "neighbor_mask"):
        if key not in batch:
          raise KeyError(f"batch lacks {key!r}: this model has GCN layers (FormNet)")
      x = self.super_tokens(x, boxes, batch["neighbor_ids"].to(torch.int64),
                            batch["neighbor_features"].to(torch.float32),
                            batch["neighbor_mask"].to(torch.bool), mask)
    geom = self._geometry(boxes, mask, pages, positions)
    g = self.num_globals
    enc_mask = mask
    if g:
      gx = self.global_embedding[None].expand(bsz, g, x.shape[-1])
      x = torch.cat([gx, x], dim=1)
      enc_mask = torch.cat([torch.ones((bsz, g), dtype=torch.bool, device=ids.device), mask], 1)
      if geom is not None:
        if self.attention_kind == "dense":
          geom = dict(geom, is_long=torch.ones((bsz, length), dtype=torch.bool,
                                               device=ids.device))
        geom = {n: torch.cat([torch.zeros((bsz, g) + tuple(v.shape[2:]), dtype=v.dtype,
                                          device=v.device), v], dim=1)
                for n, v in geom.items()}
    return self.encoder(x, enc_mask, geom)[:, g:]  # [B, L, E]
