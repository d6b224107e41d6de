"""Output heads: token tagging, tied masked-language modelling, 1D local order (1-LOP).

* `TaggingHead`: per-token tag logits (BIOES / BIO, see `flaxdoc.tags`). A single
  linear layer (LayoutLM's token classifier) or, with `hidden=True`, dense-tanh-linear
  (a small extra non-linearity some fine-tuning recipes use).
* `MLMHead`: BERT's prediction head, dense + GELU + LayerNorm, then the *token
  embedding table transposed* (`embedding.attend`) plus a per-token bias. There is
  no separate output matrix: gradients of the MLM loss flow into the input
  embedding table.
* `LocalOrderHead`: DocPolarBERT's 1-LOP objective (DESIGN §3.4): for tokens whose 1D
  position embedding was masked, predict the token's index inside its OCR segment,
  clipped to 0..10 (11 classes). Same transform as the MLM head, then a linear layer.

All heads take encoder outputs `[B, N, E]` and return logits in float32 (the loss
wants full precision even when the encoder computes in bfloat16).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from flaxdoc.nn.dropout import Dropout
from flaxdoc.nn.gelu import erf_gelu

Array = jax.Array
Dtype = Any

LOCAL_ORDER_CLASSES = 11


def _partitioned(init, axes):
  return nn.with_logical_partitioning(init, axes)


class _Transform(nn.Module):
  """BERT's head transform: dense (E -> E) + exact GELU + LayerNorm."""
  layer_norm_epsilon: float = 1e-12
  initializer_range: float = 0.02
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    width = x.shape[-1]
    x = nn.Dense(width, dtype=self.dtype, param_dtype=self.param_dtype,
                 kernel_init=_partitioned(nn.initializers.normal(self.initializer_range),
                                          ("embed", "mlp")),
                 bias_init=_partitioned(nn.initializers.zeros, ("mlp",)),
                 name="dense")(x)  # [B, N, E]
    x = erf_gelu(x)
    return nn.LayerNorm(epsilon=self.layer_norm_epsilon, dtype=self.dtype,
                        param_dtype=self.param_dtype,
                        scale_init=_partitioned(nn.initializers.ones, ("mlp",)),
                        bias_init=_partitioned(nn.initializers.zeros, ("mlp",)),
                        name="layer_norm")(x)


class TaggingHead(nn.Module):
  """Token tagging logits.

  Attributes:
    num_tags: size of the tag vocabulary (`len(flaxdoc.tags.tag_names(...))`).
    hidden: insert a dense + tanh layer before the output layer.
    dropout_rate: dropout on the encoder output (and on the hidden layer).
  """
  num_tags: int
  hidden: bool = False
  dropout_rate: float = 0.1
  initializer_range: float = 0.02
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array, deterministic: bool = True) -> Array:
    """`x [B, N, E]` -> logits `float32 [B, N, num_tags]`."""
    init = nn.initializers.normal(self.initializer_range)
    x = Dropout(self.dropout_rate)(x, deterministic=deterministic)
    if self.hidden:
      x = nn.Dense(x.shape[-1], dtype=self.dtype, param_dtype=self.param_dtype,
                   kernel_init=_partitioned(init, ("embed", "mlp")),
                   bias_init=_partitioned(nn.initializers.zeros, ("mlp",)),
                   name="hidden")(x)
      x = jnp.tanh(x)
      x = Dropout(self.dropout_rate)(x, deterministic=deterministic)
      in_axis = "mlp"
    else:
      in_axis = "embed"
    logits = nn.Dense(self.num_tags, dtype=self.dtype, param_dtype=self.param_dtype,
                      kernel_init=_partitioned(init, (in_axis, "classes")),
                      bias_init=_partitioned(nn.initializers.zeros, ("classes",)),
                      name="output")(x)  # [B, N, T]
    return logits.astype(jnp.float32)


class MLMHead(nn.Module):
  """Masked-LM logits tied to the token embedding (BERT).

  Attributes:
    embedding: the module owning the token table; it must have `attend(x [..., E])
      -> [..., vocab]` (`flaxdoc.nn.embeddings.Embeddings` or `nn.Embed`). Pass the
      same instance the encoder uses so the table is shared, not copied.
    vocab_size: size of the output bias (= the embedding's vocabulary).
  """
  embedding: nn.Module
  vocab_size: int
  layer_norm_epsilon: float = 1e-12
  initializer_range: float = 0.02
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """`x [B, N, E]` (or any `[..., E]`) -> logits `float32 [..., vocab_size]`."""
    x = _Transform(layer_norm_epsilon=self.layer_norm_epsilon,
                   initializer_range=self.initializer_range, dtype=self.dtype,
                   param_dtype=self.param_dtype, name="transform")(x)
    logits = self.embedding.attend(x)  # [..., V]
    if logits.shape[-1] != self.vocab_size:
      raise ValueError(f"MLMHead: the tied embedding has {logits.shape[-1]} rows but "
                       f"vocab_size={self.vocab_size}")
    bias = self.param("bias", _partitioned(nn.initializers.zeros, ("vocab",)),
                      (self.vocab_size,), self.param_dtype)
    return logits.astype(jnp.float32) + bias.astype(jnp.float32)


class LocalOrderHead(nn.Module):
  """1-LOP logits: index of a token inside its OCR segment, clipped to 0..10.

  Attributes:
    num_classes: 11 in DocPolarBERT (indices 0..9 and "10 or more").
    transform: apply BERT's dense + GELU + LayerNorm transform first.
  """
  num_classes: int = LOCAL_ORDER_CLASSES
  transform: bool = True
  layer_norm_epsilon: float = 1e-12
  initializer_range: float = 0.02
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """`x [B, N, E]` -> logits `float32 [B, N, num_classes]`."""
    if self.transform:
      x = _Transform(layer_norm_epsilon=self.layer_norm_epsilon,
                     initializer_range=self.initializer_range, dtype=self.dtype,
                     param_dtype=self.param_dtype, name="transform")(x)
      in_axis = "mlp"
    else:
      in_axis = "embed"
    logits = nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=self.param_dtype,
                      kernel_init=_partitioned(nn.initializers.normal(self.initializer_range),
                                               (in_axis, "classes")),
                      bias_init=_partitioned(nn.initializers.zeros, ("classes",)),
                      name="output")(x)
    return logits.astype(jnp.float32)


def local_order_targets(segments: Array, valid: Array | None = None,
                        num_classes: int = LOCAL_ORDER_CLASSES) -> Array:
  """1-LOP labels: each token's index inside its run of equal segment ids, clipped.

  A segment is a maximal run of consecutive tokens with the same id (the linearised
  OCR order); padding (`valid == False`) gets label 0 and must be masked in the loss.

  Args:
    segments: `int32 [B, N]` segment id of each token.
    valid: optional `bool [B, N]`.
    num_classes: labels are clipped to `num_classes - 1`.

  Returns:
    `int32 [B, N]`.
  """
  segments = jnp.asarray(segments)
  n = segments.shape[-1]
  idx = jnp.arange(n, dtype=jnp.int32)
  starts = jnp.concatenate([jnp.ones(segments.shape[:-1] + (1,), bool),
                            segments[..., 1:] != segments[..., :-1]], axis=-1)  # [B, N]
  # Index of the latest run start at or before each token (running maximum).
  run_start = jax.lax.cummax(jnp.where(starts, idx, 0), axis=segments.ndim - 1)
  labels = jnp.minimum(idx - run_start, num_classes - 1).astype(jnp.int32)
  if valid is not None:
    labels = jnp.where(jnp.asarray(valid, bool), labels, 0)
  return labels
