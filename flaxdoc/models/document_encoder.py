"""The one document encoder every paper's model is a configuration of (DESIGN §1, §3).

    batch ─► Embeddings ─► [GCN Super-Tokens] ─► [prepend G global tokens]
          ─► [pad rows] ─► Encoder(attention, layout terms) ─► [drop globals, padding]
          ─► heads

* **Embeddings** (`flaxdoc.nn.embeddings`): tokens + 1D positions (learned / sine /
  LSPE / none) + 2D layout (LayoutLM tables / LSPE / none) + pages + token types.
* **Super-Tokens** (`flaxdoc.nn.gcn`, FormNet): `gcn_layers` graph layers over the
  featuriser's neighbour arrays; their output feeds the transformer.
* **Global tokens** (ETC, FormNet: `G = 1`): learned vectors prepended by the model;
  they have no box, so layout terms never touch pairs that involve them.
* **Encoder** (`flaxdoc.nn.encoder`): post-LN layers with a pluggable attention
  ("dense", "etc", "linformer", "cosformer") and layout score terms
  (`flaxdoc.nn.layout_terms`): Rich Attention per layer; polar, Gaussian and fixed
  squircle / cross terms shared by all layers.
* **Row padding** (`pad_to_multiple_of`, default 1 = off): masked rows round `G + L` up
  to a multiple for the GEMMs' sake (`pad_rows`); real tokens' outputs are unchanged.
* **Heads** (`flaxdoc.nn.heads`): tagging always; MLM (tied to the token table) and
  1-LOP when pre-training.

`EncoderSpec` (`flaxdoc.models.encoder_spec`) is the frozen, validated form of a model
config (`ml_collections` fields of the same names, see `EncoderSpec.from_config`);
`DocumentEncoder` is the Linen module (`flaxdoc.models` adds `count_parameters`,
`example_batch` and `random_parameters` for tests and benchmarks). The per-paper files
(`formnet.py`, `docpolarbert.py`, ...) only hold a variants table and the defaults of their
family.

Geometry for the pairwise terms comes from the batch: box centres in document units
with pages stacked (`y_doc = 1000 * page + y`, DESIGN §2), 1D positions from
`batch["positions"]`. cosFormer's 2D re-weighting reads per-page centres instead
(the released model's convention; its cosines must stay within one page).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import ml_collections
from flax import linen as nn

from flaxdoc.models.encoder_spec import ATTENTION_KINDS, CHOICES, EncoderSpec, spec_config
from flaxdoc.nn.attention import DenseSelfAttention, default_kernel_init
from flaxdoc.nn.cosformer import CosformerAttention
from flaxdoc.nn.embeddings import Embeddings
from flaxdoc.nn.encoder import Encoder
from flaxdoc.nn.etc_attention import EtcAttention, with_global_tokens
from flaxdoc.nn.gcn import SuperTokenEncoder
from flaxdoc.nn.heads import LOCAL_ORDER_CLASSES, LocalOrderHead, MLMHead, TaggingHead
from flaxdoc.nn.layout_terms import (FixedBiasTerm, GaussianTerm, PolarTerm, RichAttentionTerm,
                                     layout_geometry)
from flaxdoc.nn.linformer import LinformerAttention
from flaxdoc.nn.linking import ENCODING_OUTPUTS, LinkingHead

# Re-exported: the spec and its tables have always been importable from here.
__all__ = ["ATTENTION_KINDS", "CHOICES", "DTYPES", "IS_LONG", "DocumentEncoder", "EncoderSpec",
           "LongPairsOnly", "build_document_encoder", "mlm_positions", "pad_rows",
           "spec_config"]

Array = jax.Array

# Geometry key marking real (non-global) rows, read by `LongPairsOnly`.
IS_LONG = "is_long"

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def _dtype(name: str | Any) -> Any:
  if isinstance(name, str):
    if name not in DTYPES:
      raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPES)}")
    return DTYPES[name]
  return name


# --------------------------------------------------------------------------- terms
class LongPairsOnly(nn.Module):
  """A layout term restricted to pairs of real tokens: pairs with a global token get 0.

  Used when global tokens go through *dense* attention (ETC does this itself by
  applying terms to long-long blocks only). The wrapped term's parameters live
  directly in this module's scope, so the parameter tree is the same as the bare
  term's (an ETC checkpoint loads into the dense model and vice versa).

  Attributes:
    make_term: factory of the wrapped term (called with no arguments).
  """
  make_term: Callable[..., nn.Module]

  def setup(self):
    self.term = self.make_term()
    nn.share_scope(self, self.term)

  def __call__(self, q, k, q_geom, k_geom):
    logits = self.term(q, k, q_geom, k_geom)  # [..., H|1, Q, K]
    keep = (q_geom[IS_LONG][..., None, :, None]
            & k_geom[IS_LONG][..., None, None, :])  # [..., 1, Q, K]
    return jnp.where(keep, logits, 0.0)


def mlm_positions(batch: dict, count: int, length: int) -> tuple[Array, Array]:
  """The `count` positions the MLM head scores: those with `mlm_weights > 0`, in order.

  Returns `positions int32 [B, P]` (`P = min(count, L)`; rows with fewer targets are
  filled with untargeted positions, which the loss weighs 0) and `dropped int32 [B]`,
  the targets beyond `P` that were not scored (0 when the masking was capped at `count`;
  the pre-training loss reports their sum as `train/mlm_dropped`).
  """
  if "mlm_weights" not in batch:
    raise ValueError("DocumentEncoder: mlm_max_predictions is set, so the batch needs "
                     "'mlm_weights' [B, L] to choose the positions the MLM head scores")
  if isinstance(count, bool) or int(count) < 1:
    raise ValueError(f"DocumentEncoder: mlm_max_predictions must be a positive integer or "
                     f"None, got {count!r}")
  targeted = jnp.asarray(batch["mlm_weights"]) > 0  # [B, L]
  # A stable sort of "not targeted" puts the targeted positions first, in order.
  order = jnp.argsort(jnp.logical_not(targeted).astype(jnp.int32), axis=1, stable=True)
  positions = order[:, :min(int(count), length)].astype(jnp.int32)  # [B, P]
  dropped = jnp.maximum(targeted.sum(axis=1) - positions.shape[1], 0).astype(jnp.int32)
  return positions, dropped


# --------------------------------------------------------------------------- module
class DocumentEncoder(nn.Module):
  """A layout-aware encoder with tagging / MLM / 1-LOP heads, built from an `EncoderSpec`.

  Attributes:
    spec: the architecture (validated by `build_document_encoder`).
    vocab_size: token vocabulary (rows of the token table, tied to the MLM output).
    num_tags: tag vocabulary size (tagging head outputs).
    max_len: the sequence length the model is built for (Linformer's `N`, cosFormer's
      1D `M`); inputs may be shorter.
    pretraining: also return `"mlm_logits"` (and `"lop_logits"` with a 1-LOP head).
    dtype: compute dtype (parameters stay `param_dtype`).
    param_dtype: parameter dtype.
  """
  spec: EncoderSpec
  vocab_size: int
  num_tags: int
  max_len: int
  pretraining: bool = False
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  # A `flaxdoc.nn.linking.LinkingSpec`: also return `"link_logits"` (entity linking) and
  # the window's entity encodings (`ENCODING_OUTPUTS`).
  linking: Any = None
  # Pre-training: the MLM head scores only this many positions per sequence, the ones
  # with `batch["mlm_weights"] > 0` in order (BERT's max_predictions_per_seq; the
  # trainer caps the masking at the same number). None: every position.
  mlm_max_predictions: int | None = None

  # ---------------------------------------------------------------- pieces
  def _attention_factory(self) -> Callable[..., nn.Module]:
    s = self.spec
    kernel_init = default_kernel_init(s.initializer_range)
    common = dict(num_heads=s.num_heads, dtype=self.dtype, param_dtype=self.param_dtype)
    if s.attention == "dense":
      return functools.partial(DenseSelfAttention, dropout_rate=s.attention_dropout_rate,
                               kernel_init=kernel_init, **common)
    if s.attention == "etc":
      return functools.partial(EtcAttention, local_radius=s.local_radius,
                               num_globals=s.num_globals,
                               relative_positions=s.etc_relative_positions,
                               kernel=s.etc_kernel, tiles=s.tiles("etc_tiles"),
                               dropout_rate=s.attention_dropout_rate, kernel_init=kernel_init,
                               **common)
    if s.attention == "linformer":
      return functools.partial(LinformerAttention, max_length=self.max_len,
                               proj_length=s.linformer_proj_length,
                               dropout_rate=s.attention_dropout_rate,
                               initializer_range=s.initializer_range, **common)
    return functools.partial(CosformerAttention, reweight=s.cosformer_reweight,
                             max_length=self.max_len, length=s.cosformer_length,
                             initializer_range=s.initializer_range,
                             **common)

  def _terms(self) -> tuple[tuple[Callable[..., nn.Module], ...], tuple[nn.Module, ...]]:
    """(per-layer term factories, shared term templates)."""
    s = self.spec
    layer_terms, shared_terms = [], []
    if s.rich_attention:
      rich = functools.partial(RichAttentionTerm, num_heads=s.num_heads, head_dim=s.head_dim,
                               axes=tuple(s.rich_axes), param_dtype=self.param_dtype)
      if s.attention == "dense" and s.num_globals:
        rich = functools.partial(LongPairsOnly, make_term=rich)
      layer_terms.append(rich)
    # Shared terms are unbound templates (parent=None): the Encoder creates their
    # parameters once and hands them to every layer.
    if s.polar:
      shared_terms.append(PolarTerm(
          head_dim=s.head_dim, num_1d_buckets=s.polar_1d_buckets,
          max_1d_distance=s.polar_1d_max_distance,
          num_distance_buckets=s.polar_distance_buckets, angle=s.polar_angle,
          use_1d=s.polar_1d, zero_bucket=s.polar_zero_bucket,
          param_dtype=self.param_dtype, parent=None))
    if s.gaussian:
      shared_terms.append(GaussianTerm(num_heads=s.num_heads, corner=s.gaussian_corner,
                                       alpha=s.gaussian_alpha, angle=s.gaussian_angle, param_dtype=self.param_dtype,
                                       parent=None))
    if s.fixed_bias != "none":
      shared_terms.append(FixedBiasTerm(kind=s.fixed_bias, parent=None))
    if s.num_globals and s.attention == "dense" and shared_terms:
      shared_terms = [LongPairsOnly(make_term=_factory_of(t), parent=None) for t in shared_terms]
    return tuple(layer_terms), tuple(shared_terms)

  def _geometry(self, boxes: Array, mask: Array, pages: Array, positions: Array
                ) -> dict[str, Array] | None:
    s = self.spec
    if s.attention == "cosformer":
      if s.cosformer_reweight in ("squircle", "cross"):
        # Per-page centres: the cosines must stay within a quarter period.
        return layout_geometry(boxes, mask, positions=positions)
      return {"positions": positions}
    if not s.uses_layout_terms:
      return None
    distance_buckets = s.polar_distance_buckets if s.polar else None
    return layout_geometry(boxes, mask, pages=pages, positions=positions,
                           distance_buckets=distance_buckets,
                           distance_pool=s.polar_distance_pool)

  # ---------------------------------------------------------------- call
  @nn.compact
  def __call__(self, batch: Mapping[str, Any], deterministic: bool = True) -> dict[str, Array]:
    """Tags (and, when pre-training, MLM / 1-LOP logits) for a featurised batch.

    Args:
      batch: the featuriser's keys (`flaxdoc.data.features`): `input_ids [B, L]`,
        `attention_mask [B, L]`, `boxes [B, L, 4]` (0..1000 per page), `page_ids`,
        `positions` (default `0..L-1`), `neighbor_*` (GCN), `lop_mask` (1-LOP).
        Other keys are ignored.
      deterministic: disables dropout.

    Returns:
      `{"tag_logits": float32 [B, L, T]}`, plus `"mlm_logits" [B, L, V]` and (1-LOP)
      `"lop_logits" [B, L, 11]` when `pretraining`. With `mlm_max_predictions = P`
      the MLM head scores P positions: `"mlm_logits" [B, P, V]`, `"mlm_positions"
      int32 [B, P]` and `"mlm_dropped" int32 [B]` (see `mlm_positions`).
    """
    s = self.spec
    ids = _field(batch, "input_ids", ndim=2)
    batch_size, length = ids.shape
    tokens = (batch_size, length)
    mask = _field(batch, "attention_mask", shape=tokens) > 0  # [B, L]
    if batch.get("positions") is None:
      positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), tokens)
    else:
      positions = _field(batch, "positions", shape=tokens).astype(jnp.int32)  # [B, L]
    if batch.get("page_ids") is None:
      pages = jnp.zeros(tokens, jnp.int32)
    else:
      # Page ids of padding may be anything: they must not index past the page table.
      pages = jnp.where(mask, _field(batch, "page_ids", shape=tokens), 0).astype(jnp.int32)
    if batch.get("boxes") is not None:
      boxes = _field(batch, "boxes", shape=tokens + (4,))  # [B, L, 4]
    elif self._needs_boxes():
      raise ValueError(f"batch lacks 'boxes' [B, L, 4], which this model "
                       f"(attention={s.attention!r}, position_2d={s.position_2d!r}) reads")
    else:
      boxes = jnp.zeros(tokens + (4,), jnp.int32)
    if s.attention == "linformer" and length > self.max_len:
      raise ValueError(f"batch length {length} exceeds the Linformer's max_len={self.max_len}")

    position_mask = None
    if self.pretraining and s.local_order_head and "lop_mask" in batch:
      lop = _field(batch, "lop_mask", shape=tokens)
      position_mask = jnp.asarray(lop, bool) & mask  # [B, L]

    embeddings = Embeddings(
        vocab_size=self.vocab_size, features=s.width,
        max_length=s.max_position_embeddings, position_1d=s.position_1d,
        position_2d=s.position_2d, box_size=s.box_size, page=s.page_embedding,
        max_pages=s.max_pages, type_vocab_size=s.type_vocab_size,
        mask_position=self.pretraining and s.local_order_head,
        dropout_rate=s.dropout_rate, layer_norm_epsilon=s.layer_norm_epsilon,
        initializer_range=s.initializer_range, dtype=self.dtype,
        param_dtype=self.param_dtype, name="embeddings")
    x = embeddings(ids, positions=positions + s.position_offset, boxes=boxes, pages=pages,
                   position_mask=position_mask, deterministic=deterministic)  # [B, L, E]

    if s.gcn_layers:
      graph = {}
      for key in ("neighbor_ids", "neighbor_features", "neighbor_mask"):
        if key not in batch:
          raise ValueError(f"batch lacks {key!r}: a model with gcn_layers={s.gcn_layers} needs "
                           "the featuriser's graph (FeatureConfig(graph=True); "
                           "flaxdoc.models.needs_graph tells the trainer)")
        graph[key] = jnp.asarray(batch[key])
      x = SuperTokenEncoder(
          features=s.width, num_layers=s.gcn_layers, message_hidden=s.gcn_message_hidden,
          dropout_rate=s.dropout_rate, kernel=s.gcn_kernel,
          pallas_tiles=s.tiles("gcn_tiles"),
          initializer_range=s.initializer_range, dtype=self.dtype,
          param_dtype=self.param_dtype, name="super_tokens")(
              x, boxes, graph["neighbor_ids"], graph["neighbor_features"],
              graph["neighbor_mask"], node_mask=mask, deterministic=deterministic)  # [B, L, E]

    geom = self._geometry(boxes, mask, pages, positions)
    g = s.num_globals
    enc_mask = mask
    if g:
      global_table = self.param(
          "global_embedding",
          nn.with_logical_partitioning(nn.initializers.normal(s.initializer_range),
                                       (None, "embed")),
          (g, s.width), self.param_dtype)  # [G, E]
      global_x = jnp.broadcast_to(jnp.asarray(global_table, self.dtype),
                                  (batch_size, g, s.width))  # [B, G, E]
      global_valid = jnp.ones((batch_size, g), bool)  # [B, G]
      if geom is not None and s.attention == "dense":
        geom = dict(geom, **{IS_LONG: jnp.ones((batch_size, length), bool)})
      x, enc_mask, geom = with_global_tokens(global_x, global_valid, x, mask, geom)
      # x [B, G+L, E], enc_mask [B, G+L], geometry leaves [B, G+L, ...]

    rows = x.shape[1]  # G + L
    x, enc_mask, geom = pad_rows(x, enc_mask, geom, s.pad_to_multiple_of)
    if s.attention == "linformer" and x.shape[1] > self.max_len:
      raise ValueError(f"config.model.pad_to_multiple_of={s.pad_to_multiple_of} pads the "
                       f"batch's {rows} rows to {x.shape[1]}, more than the Linformer's "
                       f"max_len={self.max_len}")

    layer_terms, shared_terms = self._terms()
    x = Encoder(
        num_layers=s.depth, attention=self._attention_factory(), mlp_dim=s.mlp_dim,
        dropout_rate=s.dropout_rate, layer_norm_epsilon=s.layer_norm_epsilon,
        layer_terms=layer_terms, shared_terms=shared_terms, scan_layers=s.scan_layers,
        remat=s.remat, remat_policy=s.remat_policy, dtype=self.dtype,
        param_dtype=self.param_dtype, kernel_init=default_kernel_init(s.initializer_range),
        name="encoder")(x, enc_mask, geom, deterministic=deterministic)  # [B, R, E]
    x = x[:, g:rows]  # [B, L, E]: without the globals and the rows padding added

    outputs = {"tag_logits": TaggingHead(
        num_tags=self.num_tags, hidden=s.tagging_hidden, dropout_rate=s.dropout_rate,
        initializer_range=s.initializer_range, dtype=self.dtype,
        param_dtype=self.param_dtype, name="tagging_head")(x, deterministic=deterministic)}
    if self.pretraining:
      mlm_head = MLMHead(
          embedding=embeddings, vocab_size=self.vocab_size,
          layer_norm_epsilon=s.layer_norm_epsilon, initializer_range=s.initializer_range,
          dtype=self.dtype, param_dtype=self.param_dtype, name="mlm_head")
      if self.mlm_max_predictions is None:
        outputs["mlm_logits"] = mlm_head(x)  # [B, L, V]
      else:
        positions, dropped = mlm_positions(batch, self.mlm_max_predictions, length)
        chosen = jnp.take_along_axis(x, positions[..., None], axis=1)  # [B, P, E]
        outputs["mlm_logits"] = mlm_head(chosen)  # [B, P, V]
        outputs["mlm_positions"] = positions  # int32 [B, P]
        outputs["mlm_dropped"] = dropped  # int32 [B]
      if s.local_order_head:
        outputs["lop_logits"] = LocalOrderHead(
            num_classes=LOCAL_ORDER_CLASSES, layer_norm_epsilon=s.layer_norm_epsilon,
            initializer_range=s.initializer_range, dtype=self.dtype,
            param_dtype=self.param_dtype, name="lop_head")(x)  # [B, L, 11]
    if self.linking is not None and "link_first" in batch:
      head = linking_head(self, name="linking_head")
      encoded = head.encode(x, batch, deterministic=deterministic)
      outputs["link_logits"] = head.window_scores(encoded, batch, deterministic)  # [B, V, C + 1]
      # The entities' encodings too, for linking across windows (`config.linking.scope`).
      outputs.update({ENCODING_OUTPUTS[k]: v for k, v in encoded.items()})  # [B, E, D], [B, E]
    return outputs

  def _needs_boxes(self) -> bool:
    s = self.spec
    return (s.position_2d != "none" or s.uses_layout_terms or s.gcn_layers > 0
            or (s.attention == "cosformer" and s.cosformer_reweight in ("squircle", "cross")))


def linking_head(model: DocumentEncoder, **kwargs) -> LinkingHead:
  """The `LinkingHead` of `model` (its `linking` spec, dropout, init and dtypes): inside the
  model, and alone for `LinkingHead.score` on candidates across windows."""
  ls, s = model.linking, model.spec
  return LinkingHead(
      num_labels=ls.num_labels, dim=ls.dim, pooling=ls.pooling, geometry=ls.geometry,
      text=ls.text, text_dropout=ls.text_dropout, dropout_rate=s.dropout_rate,
      initializer_range=s.initializer_range, dtype=model.dtype, param_dtype=model.param_dtype,
      **kwargs)


def pad_rows(x: Array, mask: Array, geom: dict[str, Array] | None, multiple: int
             ) -> tuple[Array, Array, dict[str, Array] | None]:
  """`x [B, N, E]`, `mask [B, N]` and geometry leaves `[B, N, ...]` padded along the rows to
  `R`, the next multiple of `multiple` (unchanged when `N` already is one): zero rows, mask
  False, zero (False) geometry. Every attention kind masks those rows as keys (dense and ETC
  by `mask`, ETC's global queries included; Linformer and cosFormer zero their keys, values
  and factors), so real rows' outputs do not change; their own outputs are to be cropped.
  Their geometry is what padding tokens and the global rows already carry."""
  extra = -x.shape[1] % multiple
  if not extra:
    return x, mask, geom

  def pad(a):
    return jnp.pad(a, [(0, 0), (0, extra)] + [(0, 0)] * (a.ndim - 2))

  geom = None if geom is None else {k: pad(jnp.asarray(v)) for k, v in geom.items()}
  return pad(x), pad(jnp.asarray(mask, bool)), geom


def _factory_of(template: nn.Module) -> Callable[..., nn.Module]:
  """A factory re-creating `template` (same attributes, fresh parent and name)."""
  attrs = {f.name: getattr(template, f.name) for f in dataclasses.fields(template)
           if f.init and f.name not in ("parent", "name")}
  return functools.partial(type(template), **attrs)


def _field(batch: Mapping[str, Any], key: str, *, ndim: int | None = None,
           shape: tuple[int, ...] | None = None) -> Array:
  """`batch[key]` as a jax array, with a `ValueError` naming the key on a bad shape."""
  if key not in batch:
    raise ValueError(f"batch lacks {key!r}; pass the featuriser's batch "
                     f"(flaxdoc.data.features.featurize + batch_features)")
  value = jnp.asarray(batch[key])
  if ndim is not None and value.ndim != ndim:
    raise ValueError(f"batch[{key!r}] must have {ndim} dims, got shape {tuple(value.shape)}")
  if shape is not None and tuple(value.shape) != tuple(shape):
    raise ValueError(f"batch[{key!r}] has shape {tuple(value.shape)}, expected {tuple(shape)}")
  return value


# --------------------------------------------------------------------------- helpers
def build_document_encoder(model_config: ml_collections.ConfigDict | Mapping[str, Any], *,
                           vocab_size: int, num_tags: int, max_len: int, pretraining: bool,
                           dtype: str | Any = "float32") -> DocumentEncoder:
  """A `DocumentEncoder` from a model config (validated; `ValueError` names bad fields)."""
  name = model_config.get("name", "model") if hasattr(model_config, "get") else "model"
  spec = EncoderSpec.from_config(model_config).validate(max_len=max_len, name=name)
  if vocab_size < 1:
    raise ValueError(f"{name}: vocab_size must be >= 1, got {vocab_size}")
  if num_tags < 1:
    raise ValueError(f"{name}: num_tags must be >= 1, got {num_tags}")
  return DocumentEncoder(spec=spec, vocab_size=int(vocab_size), num_tags=int(num_tags),
                         max_len=int(max_len), pretraining=bool(pretraining),
                         dtype=_dtype(dtype), param_dtype=jnp.float32)
