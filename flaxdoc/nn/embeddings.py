"""Input embeddings: tokens, 1D positions, 2D layout, pages and token types.

One `Embeddings` module covers every family in flaxdoc, each piece switchable:

* token embedding (`vocab x embed`), also the tied MLM output layer via `attend`;
* 1D position: a learned table (BERT / LayoutLM), fixed sines (Vaswani et al.),
  LSPE or LSPE with skip connection (DESIGN §3.7), or nothing;
* 2D layout: LayoutLM's learned tables (x0 and x1 share the x table, y0 and y1 the
  y table, plus height and width tables, 1024 entries each), fixed sines (the LSPE
  paper's "Sine" baseline: `PE(x0) + PE(y0) + PE(x1) + PE(y1)`), LSPE networks for
  the x and y axes, or nothing (DocPolarBERT encodes layout only in attention);
* a page embedding (LayoutLinformer / LayoutCosformer, DESIGN §3.6);
* a token-type embedding;
* a learned "mask position" vector that replaces the 1D position term of chosen
  tokens (DocPolarBERT's 1-LOP pre-training objective, DESIGN §3.4).

The terms are summed, then LayerNorm and dropout, as in BERT and LayoutLM.

LSPE (DESIGN §3.7): `LSPE(p) = W2 gelu(W1 PE_sine(p) + b1) + b2`, the skip variant
adds `PE_sine(p)`. There is one network for the 1D index and one each for the x and
y axes; the position term is
`LSPE_1d(p) + LSPE_x(x0) + LSPE_y(y0) + LSPE_x(x1) + LSPE_y(y1)`.

Index inputs are checked eagerly when they are concrete arrays (a `ValueError`
naming the field). Under `jax.jit` they cannot be checked, so they are clipped into
range before the table lookup: an out-of-range id must never turn into the NaN that
`jnp.take` returns for out-of-bounds gathers.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from flaxdoc.layout.sine import sine_features
from flaxdoc.nn.dropout import Dropout
from flaxdoc.nn.gelu import erf_gelu

Array = jax.Array
Dtype = Any

POSITION_1D_KINDS = ("learned", "sine", "lspe", "lspe_skip", "none")
POSITION_2D_KINDS = ("learned", "sine", "lspe", "lspe_skip", "none")
# The tied output product runs over the token table padded to this many rows (see
# `Embeddings.attend`): 128 is what Megatron-LM pads its vocabularies to.
VOCAB_PRODUCT_MULTIPLE = 128


def _normal(stddev: float, axes: tuple[str | None, ...]):
  """A N(0, stddev^2) initialiser annotated with logical axis names."""
  return nn.with_logical_partitioning(nn.initializers.normal(stddev), axes)


def check_index_range(name: str, values, upper: int, *, owner: str = "Embeddings") -> None:
  """Raises `ValueError` if concrete integer `values` leave `[0, upper)`.

  Tracers (inside `jax.jit`) cannot be inspected and are let through; the caller
  clips them instead.
  """
  if isinstance(values, jax.core.Tracer):
    return
  arr = np.asarray(values)
  if arr.size == 0:
    return
  lo, hi = int(arr.min()), int(arr.max())
  if lo < 0 or hi >= upper:
    raise ValueError(f"{owner}: field {name!r} must lie in [0, {upper}); got values in "
                     f"[{lo}, {hi}]")


def _check_shape(name: str, values, expected: tuple[int, ...], owner: str = "Embeddings") -> None:
  if tuple(values.shape) != tuple(expected):
    raise ValueError(f"{owner}: field {name!r} has shape {tuple(values.shape)}, expected "
                     f"{tuple(expected)}")


class LSPE(nn.Module):
  """Learnable sinusoidal positional encoding of scalar positions (LSPE paper, eqs. 2–3).

  `LSPE(p) = W2 gelu(W1 PE_sine(p) + b1) + b2`; with `skip=True` the sine features
  are added back: `PE_sine(p) + LSPE(p)` (the paper's LSPE_SC). Positions may be
  fractional (box coordinates), which is the point of a continuous encoding.

  Attributes:
    features: output width (= model width).
    hidden_features: width of the hidden layer (default: `features`).
    skip: add `PE_sine(p)` to the network output.
    max_period: the sine wavelength base (10000 in Vaswani et al.).
  """
  features: int
  hidden_features: int | None = None
  skip: bool = False
  max_period: float = 10000.0
  initializer_range: float = 0.02
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, positions: Array) -> Array:
    """`positions [...]` (int or float) -> `[..., features]`."""
    hidden = self.hidden_features or self.features
    sine = sine_features(jnp.asarray(positions, jnp.float32), self.features,
                         max_period=self.max_period)  # [..., features]
    sine = sine.astype(self.dtype)
    h = nn.Dense(hidden, dtype=self.dtype, param_dtype=self.param_dtype,
                 kernel_init=_normal(self.initializer_range, ("embed", "mlp")),
                 bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)),
                 name="fc1")(sine)  # [..., hidden]
    # Exact (erf) GELU, as in BERT / LayoutLM.
    h = erf_gelu(h)
    out = nn.Dense(self.features, dtype=self.dtype, param_dtype=self.param_dtype,
                   kernel_init=_normal(self.initializer_range, ("mlp", "embed")),
                   bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                   name="fc2")(h)  # [..., features]
    if self.skip:
      out = out + sine
    return out


class Embeddings(nn.Module):
  """Token + position + layout + page + token-type embeddings, then LayerNorm and dropout.

  Attributes:
    vocab_size: number of token ids.
    features: model width `E`.
    max_length: size of the learned 1D position table.
    position_1d: "learned" | "sine" | "lspe" | "lspe_skip" | "none".
    position_2d: "learned" (LayoutLM tables) | "sine" | "lspe" | "lspe_skip" | "none".
    box_size: with learned 2D tables, also embed box height and width (LayoutLM).
    coord_size: entries of each learned 2D table (LayoutLM: 1024 for 0..1000 units).
    page: add a learned page embedding (`max_pages` entries).
    type_vocab_size: token types (0 disables the token-type embedding).
    mask_position: create the learned vector that replaces the 1D position term
      where `position_mask` is True (1-LOP pre-training).
    lspe_hidden_features: hidden width of the LSPE networks (default `features`).
    max_period: sine wavelength base for "sine" and LSPE.
    dropout_rate: dropout after the LayerNorm.
  """
  vocab_size: int
  features: int
  max_length: int = 512
  position_1d: str = "learned"
  position_2d: str = "learned"
  box_size: bool = True
  coord_size: int = 1024
  page: bool = False
  max_pages: int = 64
  type_vocab_size: int = 0
  mask_position: bool = False
  lspe_hidden_features: int | None = None
  max_period: float = 10000.0
  dropout_rate: float = 0.1
  layer_norm_epsilon: float = 1e-12
  initializer_range: float = 0.02
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def setup(self):
    if self.position_1d not in POSITION_1D_KINDS:
      raise ValueError(f"Embeddings: position_1d={self.position_1d!r}, expected one of "
                       f"{POSITION_1D_KINDS}")
    if self.position_2d not in POSITION_2D_KINDS:
      raise ValueError(f"Embeddings: position_2d={self.position_2d!r}, expected one of "
                       f"{POSITION_2D_KINDS}")
    if self.mask_position and self.position_1d == "none":
      raise ValueError("Embeddings: mask_position=True needs a 1D position term "
                       "(position_1d != 'none')")
    std = self.initializer_range
    embed = lambda n, axes, name: nn.Embed(  # noqa: E731
        n, self.features, dtype=self.dtype, param_dtype=self.param_dtype,
        embedding_init=_normal(std, axes), name=name)
    lspe = lambda skip, name: LSPE(  # noqa: E731
        self.features, hidden_features=self.lspe_hidden_features, skip=skip,
        max_period=self.max_period, initializer_range=std, dtype=self.dtype,
        param_dtype=self.param_dtype, name=name)

    self.word_embeddings = embed(self.vocab_size, ("vocab", "embed"), "word_embeddings")
    if self.position_1d == "learned":
      self.position_embeddings = embed(self.max_length, (None, "embed"), "position_embeddings")
    elif self.position_1d in ("lspe", "lspe_skip"):
      self.position_lspe = lspe(self.position_1d == "lspe_skip", "position_lspe")
    if self.position_2d == "learned":
      self.x_embeddings = embed(self.coord_size, (None, "embed"), "x_position_embeddings")
      self.y_embeddings = embed(self.coord_size, (None, "embed"), "y_position_embeddings")
      if self.box_size:
        self.h_embeddings = embed(self.coord_size, (None, "embed"), "h_position_embeddings")
        self.w_embeddings = embed(self.coord_size, (None, "embed"), "w_position_embeddings")
    elif self.position_2d in ("lspe", "lspe_skip"):
      skip = self.position_2d == "lspe_skip"
      self.x_lspe = lspe(skip, "x_lspe")
      self.y_lspe = lspe(skip, "y_lspe")
    if self.page:
      self.page_embeddings = embed(self.max_pages, (None, "embed"), "page_embeddings")
    if self.type_vocab_size > 0:
      self.token_type_embeddings = embed(self.type_vocab_size, (None, "embed"),
                                         "token_type_embeddings")
    if self.mask_position:
      self.mask_position_embedding = self.param(
          "mask_position_embedding", _normal(std, ("embed",)), (self.features,),
          self.param_dtype)
    self.layer_norm = nn.LayerNorm(
        epsilon=self.layer_norm_epsilon, dtype=self.dtype, param_dtype=self.param_dtype,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
        name="layer_norm")
    self.dropout = Dropout(self.dropout_rate)

  def _lookup(self, table: nn.Embed, name: str, ids: Array, size: int) -> Array:
    """Table lookup with an eager range check and a clip under jit (never NaN)."""
    check_index_range(name, ids, size)
    ids = jnp.clip(jnp.asarray(ids).astype(jnp.int32), 0, size - 1)
    return table(ids)

  def __call__(self, input_ids: Array, *, positions: Array | None = None,
               boxes: Array | None = None, pages: Array | None = None,
               token_types: Array | None = None, position_mask: Array | None = None,
               deterministic: bool = True) -> Array:
    """Embeds a batch of token sequences.

    Args:
      input_ids: `int32 [B, N]` token ids.
      positions: `int32 [B, N]` 1D position indices (default `0..N-1` per row).
      boxes: `[B, N, 4]` `[x0, y0, x1, y1]` in LayoutLM 0..1000 units (required when
        `position_2d != "none"`; integer for learned tables, may be float for sine
        and LSPE).
      pages: `int32 [B, N]` page index of each token (required when `page=True`).
      token_types: `int32 [B, N]` (default all 0 when the embedding is on).
      position_mask: `bool [B, N]`; where True the 1D position term is replaced by
        the learned mask-position vector (requires `mask_position=True`).
      deterministic: disables dropout when True.

    Returns:
      `[B, N, features]` in `dtype`.
    """
    input_ids = jnp.asarray(input_ids)
    if input_ids.ndim != 2:
      raise ValueError(f"Embeddings: field 'input_ids' must be [batch, length], got shape "
                       f"{tuple(input_ids.shape)}")
    batch, length = input_ids.shape
    x = self._lookup(self.word_embeddings, "input_ids", input_ids, self.vocab_size)  # [B, N, E]

    # 1D position term.
    if self.position_1d != "none":
      if positions is None:
        positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
      positions = jnp.asarray(positions)
      _check_shape("positions", positions, (batch, length))
      if self.position_1d == "learned":
        pos = self._lookup(self.position_embeddings, "positions", positions, self.max_length)
      elif self.position_1d == "sine":
        pos = sine_features(positions.astype(jnp.float32), self.features,
                            max_period=self.max_period).astype(self.dtype)
      else:
        pos = self.position_lspe(positions)  # [B, N, E]
      if position_mask is not None:
        if not self.mask_position:
          raise ValueError("Embeddings: 'position_mask' given but mask_position=False "
                           "(no mask-position vector was created)")
        position_mask = jnp.asarray(position_mask, bool)
        _check_shape("position_mask", position_mask, (batch, length))
        pos = jnp.where(position_mask[..., None],
                        self.mask_position_embedding.astype(pos.dtype), pos)
      x = x + pos
    elif position_mask is not None:
      raise ValueError("Embeddings: 'position_mask' given but position_1d='none'")

    # 2D layout term.
    if self.position_2d != "none":
      if boxes is None:
        raise ValueError(f"Embeddings: field 'boxes' is required with "
                         f"position_2d={self.position_2d!r}")
      boxes = jnp.asarray(boxes)
      _check_shape("boxes", boxes, (batch, length, 4))
      if self.position_2d == "learned":
        # LayoutLM: x0 and x1 share the x table, y0 and y1 the y table.
        xs = self._lookup(self.x_embeddings, "boxes[x]", boxes[..., 0::2], self.coord_size)
        ys = self._lookup(self.y_embeddings, "boxes[y]", boxes[..., 1::2], self.coord_size)
        x = x + xs.sum(axis=-2) + ys.sum(axis=-2)  # [B, N, 2, E] -> [B, N, E]
        if self.box_size:
          heights = boxes[..., 3] - boxes[..., 1]
          widths = boxes[..., 2] - boxes[..., 0]
          x = x + self._lookup(self.h_embeddings, "box height", heights, self.coord_size)
          x = x + self._lookup(self.w_embeddings, "box width", widths, self.coord_size)
      elif self.position_2d == "sine":
        sines = sine_features(boxes.astype(jnp.float32), self.features,
                              max_period=self.max_period)  # [B, N, 4, E]
        x = x + sines.sum(axis=-2).astype(self.dtype)
      else:
        # One LSPE network per axis, applied to both corners at once.
        x = x + self.x_lspe(boxes[..., 0::2]).sum(axis=-2)  # [B, N, 2, E] -> [B, N, E]
        x = x + self.y_lspe(boxes[..., 1::2]).sum(axis=-2)

    if self.page:
      if pages is None:
        raise ValueError("Embeddings: field 'pages' is required with page=True")
      pages = jnp.asarray(pages)
      _check_shape("pages", pages, (batch, length))
      x = x + self._lookup(self.page_embeddings, "pages", pages, self.max_pages)
    if self.type_vocab_size > 0:
      if token_types is None:
        token_types = jnp.zeros((batch, length), jnp.int32)
      token_types = jnp.asarray(token_types)
      _check_shape("token_types", token_types, (batch, length))
      x = x + self._lookup(self.token_type_embeddings, "token_types", token_types,
                           self.type_vocab_size)

    x = self.layer_norm(x)
    return self.dropout(x, deterministic=deterministic)

  def attend(self, query: Array) -> Array:
    """Tied output layer: `query [..., E] @ word_embeddings.T -> [..., vocab]`.

    The product runs over the table padded with zero rows to a multiple of
    `VOCAB_PRODUCT_MULTIPLE` and the extra logits are sliced off, so the values are
    those of the plain product. Why: an odd vocabulary (BERT-multilingual's 119,547)
    leaves the matrix unit's tiles misaligned; on an H200 the three products of the
    MLM head ran at 125-270 TFLOP/s timed alone over 119,547 rows, at 704-767 over
    119,552. The pad copies the table once in the compute dtype (184 MB at that size
    in bfloat16), small beside the products; the parameters (and checkpoints) keep
    the true size. Measured on one device; with the vocabulary split over a `tensor`
    mesh axis the pad and the slice cross shard boundaries (XLA handles it; untimed).
    """
    query, table = nn.dtypes.promote_dtype(query, self.word_embeddings.embedding,
                                           dtype=self.dtype)
    vocab = table.shape[0]  # [V, E]
    padded = -(-vocab // VOCAB_PRODUCT_MULTIPLE) * VOCAB_PRODUCT_MULTIPLE
    table = jnp.pad(table, ((0, padded - vocab), (0, 0)))  # [Vp, E]
    return jnp.dot(query, table.T)[..., :vocab]  # [..., V]
