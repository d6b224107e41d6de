"""Dense multi-head attention with additive layout terms (DESIGN §2, §3).

Three layers of API, from pure to module:

* `masked_softmax` and `dot_product_attention`: pure functions over projected
  queries, keys and values (t5x `layers.py` style). Masked logits are replaced by a
  large negative *finite* value and the softmax always runs in float32; a query row
  whose keys are all masked gets all-zero weights (and so a zero output), never NaN.
* `MultiHeadAttention`: the Linen module, `(x_q, x_kv, mask, terms, q_geom, k_geom)`,
  with the query/key/value/output projections annotated with logical axes
  (`embed`, `heads`, `kv`) so a trainer can shard them from config rules. The
  projections are `qkv_projections` and `out_projection`, which every flaxdoc
  attention uses, so all of them have the same parameter names and shapes.
* `DenseSelfAttention`: the same module behind the *shared self-attention signature*
  that every flaxdoc attention implements (dense, ETC, Linformer, cosFormer), so that
  `flaxdoc.nn.encoder.EncoderLayer` can take any of them:

      attention(x [B, N, E], mask bool [B, N], terms=(), geom=None,
                deterministic=True) -> [B, N, E]

Layout terms. A *score term* is a callable (usually a Linen module created by the
model, see `flaxdoc.nn.layout_terms`)

    term(q [..., Q, H, D], k [..., K, H, D], q_geom, k_geom) -> [..., H, Q, K]

returning additive logits added to `q.k / sqrt(D)` before the softmax. `q` and `k`
are the *unscaled* projected queries and keys (a term that belongs inside the
`1/sqrt(D)`, like DocPolarBERT's bucketed dot products, divides by itself).
`q_geom` / `k_geom` are dicts of per-token arrays whose leading dims are the token
dims of `q` / `k` (`"centers"` `[..., Q, 2]` in 0-1000 document units, `"boxes"`
`[..., Q, 4]`, `"positions"` `[..., Q]`, ...). Attention modules never know which
paper a term comes from. Dense attention calls each term once with all pairs; ETC
calls it per query block against its three key blocks (`etc_attention.py`).

Reserved geometry keys read by the attention modules themselves (not by terms):

* `"document_ids"` `int [B, N]`: when several documents are packed in one row,
  attention is restricted to pairs with equal ids (document boundaries).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

from flaxdoc.nn import dropout

Array = jax.Array
Dtype = Any
Term = Callable[[Array, Array, Any, Any], Array]

# Masked logits are set to this value (in float32) rather than -inf, so that a row
# with every key masked stays finite; `masked_softmax` then zeroes that row.
BIG_NEG = -1e9

# Geometry key holding per-token document ids of packed sequences.
DOCUMENT_IDS = "document_ids"


def default_kernel_init(stddev: float = 0.02):
  """BERT's initializer for projection kernels: normal with stddev 0.02."""
  return nn.initializers.normal(stddev)


def masked_softmax(logits: Array, mask: Array | None = None, axis: int = -1) -> Array:
  """Softmax over `axis` in float32, ignoring positions where `mask` is False.

  Args:
    logits: scores of any float dtype.
    mask: bool, broadcastable to `logits`; True = attend. None: nothing masked.
    axis: the key axis.

  Returns:
    float32 weights with the shape of `logits`. Rows whose mask is all False are
    all zeros (not uniform, not NaN), so fully padded queries produce zero output.
  """
  logits = logits.astype(jnp.float32)
  if mask is None:
    return jax.nn.softmax(logits, axis=axis)
  mask = jnp.broadcast_to(mask, logits.shape)
  # `where`, not `+ mask_bias`: a -inf or huge term on a masked pair cannot leak,
  # and its gradient is exactly zero there.
  logits = jnp.where(mask, logits, BIG_NEG)
  row_max = jax.lax.stop_gradient(jnp.max(logits, axis=axis, keepdims=True))
  unnorm = jnp.where(mask, jnp.exp(logits - row_max), 0.0)
  total = jnp.sum(unnorm, axis=axis, keepdims=True)
  # total >= 1 whenever one key is visible (the max contributes exp(0)); it is 0
  # only for fully masked rows, which must come out as zeros.
  return unnorm / jnp.maximum(total, 1e-30)


def attention_dropout(weights: Array, rate: float, rng: Array | None,
                      deterministic: bool) -> Array:
  """Inverted dropout on attention weights (no-op when deterministic or rate 0), its mask
  hashed from one word of `rng` and recomputed in the backward (`flaxdoc.nn.dropout`)."""
  if deterministic or rate <= 0.0:
    return weights
  if rng is None:
    raise ValueError("attention dropout: dropout_rng is required when deterministic=False "
                     f"and dropout_rate={rate}")
  return dropout.dropout(weights, rate, dropout.seed_from_key(rng))


def dot_product_attention(q: Array, k: Array, v: Array, bias: Array | None = None,
                          mask: Array | None = None, *, scale: float | None = None,
                          dropout_rate: float = 0.0, dropout_rng: Array | None = None,
                          deterministic: bool = True, dtype: Dtype | None = None,
                          precision: Any = None) -> Array:
  """Scaled dot-product attention with an additive bias and a boolean mask.

  `out = softmax(q.k * scale + bias, masked) @ v`, batched over leading dims.

  Args:
    q: `[..., Q, H, D]` queries.
    k: `[..., K, H, D]` keys.
    v: `[..., K, H, Dv]` values.
    bias: additive logits broadcastable to `[..., H, Q, K]` (already scaled).
    mask: bool broadcastable to `[..., H, Q, K]`, True = attend.
    scale: logit scale; default `1 / sqrt(D)`.
    dropout_rate: dropout on the attention weights.
    dropout_rng: PRNG key, needed when dropping out.
    deterministic: disables dropout.
    dtype: dtype of the output (default: `v.dtype`).
    precision: passed to the einsums.

  Returns:
    `[..., Q, H, Dv]`. Queries with no visible key get zeros.
  """
  if q.ndim != k.ndim or q.ndim != v.ndim or q.ndim < 3:
    raise ValueError(f"dot_product_attention: q, k, v must be [..., T, H, D] with equal rank, "
                     f"got shapes {q.shape}, {k.shape}, {v.shape}")
  if q.shape[-1] != k.shape[-1] or q.shape[-2] != k.shape[-2] or k.shape[:-1] != v.shape[:-1]:
    raise ValueError(f"dot_product_attention: incompatible q {q.shape}, k {k.shape}, v {v.shape}")
  dtype = dtype or v.dtype
  if scale is None:
    scale = 1.0 / math.sqrt(q.shape[-1])
  # Logits accumulate in float32 even for bfloat16 inputs.
  logits = jnp.einsum("...qhd,...khd->...hqk", q, k, precision=precision,
                      preferred_element_type=jnp.float32)  # [..., H, Q, K]
  logits = logits * scale
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)  # [..., H, Q, K]
  weights = masked_softmax(logits, mask)  # [..., H, Q, K] float32
  weights = attention_dropout(weights, dropout_rate, dropout_rng, deterministic)
  out = jnp.einsum("...hqk,...khd->...qhd", weights.astype(v.dtype), v,
                   precision=precision)  # [..., Q, H, Dv]
  return out.astype(dtype)


def make_attention_mask(q_valid: Array, k_valid: Array, q_document_ids: Array | None = None,
                        k_document_ids: Array | None = None) -> Array:
  """Pair mask `[..., 1, Q, K]` from token validity and (optional) document ids.

  Args:
    q_valid: bool `[..., Q]`.
    k_valid: bool `[..., K]`.
    q_document_ids, k_document_ids: int `[..., Q]` / `[..., K]`; pairs from different
      packed documents are masked. Give both or neither.
  """
  mask = q_valid[..., :, None] & k_valid[..., None, :]  # [..., Q, K]
  if (q_document_ids is None) != (k_document_ids is None):
    raise ValueError("make_attention_mask: give both q_document_ids and k_document_ids, "
                     "or neither")
  if q_document_ids is not None:
    mask = mask & (q_document_ids[..., :, None] == k_document_ids[..., None, :])
  return mask[..., None, :, :]  # [..., 1, Q, K]


def apply_terms(terms: Sequence[Term], q: Array, k: Array, q_geom: Any,
                k_geom: Any) -> Array | None:
  """Sum of the additive logits of `terms`, float32 `[..., H, Q, K]` (None if no term).

  Each term's output must broadcast *to* `[..., H, Q, K]` (e.g. `[..., 1, Q, K]` for
  a head-independent term); anything else is a `ValueError` naming the term.
  """
  total = None
  expected = tuple(q.shape[:-3]) + (q.shape[-2], q.shape[-3], k.shape[-3])
  for term in terms:
    logits = term(q, k, q_geom, k_geom)
    try:
      ok = jnp.broadcast_shapes(logits.shape, expected) == expected
    except ValueError:
      ok = False
    if not ok:
      raise ValueError(f"layout term {type(term).__name__} returned logits of shape "
                       f"{tuple(logits.shape)}, not broadcastable to [..., H, Q, K] = "
                       f"{expected}")
    logits = logits.astype(jnp.float32)
    total = logits if total is None else total + logits
  return total


def _check_geom(geom: Mapping[str, Array] | None, lead: tuple[int, ...], who: str) -> None:
  """Every geometry leaf must start with the token dims `lead` (e.g. `(B, N)`)."""
  if geom is None:
    return
  for name, leaf in geom.items():
    shape = tuple(jnp.shape(leaf))
    if shape[:len(lead)] != tuple(lead):
      raise ValueError(f"{who}: geometry {name!r} has shape {shape}; its leading dims must be "
                       f"the token dims {tuple(lead)}")


def qkv_projections(x_q: Array, x_kv: Array, num_heads: int, head_dim: int, *,
                    use_bias: bool, dtype: Dtype, param_dtype: Dtype,
                    kernel_init: Callable[..., Array], precision: Any = None
                    ) -> tuple[Array, Array, Array]:
  """The `query`, `key` and `value` projections `[..., T, E] -> [..., T, H, D]`.

  Every flaxdoc attention (dense, ETC, Linformer, cosFormer) projects through this
  one function, so their parameter trees (names, shapes, logical axes `embed`,
  `heads`, `kv`) agree and checkpoints and the PyTorch export can move between
  them. Call it from a compact method: the three `DenseGeneral`s become children
  of the calling module, with no extra level in the parameter tree.

  Returns:
    `(q [..., Q, H, D] from x_q, k [..., K, H, D], v [..., K, H, D] from x_kv)`.
  """

  def dense(name: str) -> nn.DenseGeneral:
    return nn.DenseGeneral(
        features=(num_heads, head_dim), axis=-1, use_bias=use_bias, dtype=dtype,
        param_dtype=param_dtype, precision=precision,
        kernel_init=nn.with_logical_partitioning(kernel_init, ("embed", "heads", "kv")),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("heads", "kv")),
        name=name)

  return dense("query")(x_q), dense("key")(x_kv), dense("value")(x_kv)


def out_projection(context: Array, features: int, *, use_bias: bool, dtype: Dtype,
                   param_dtype: Dtype, kernel_init: Callable[..., Array],
                   precision: Any = None) -> Array:
  """The `out` projection `[..., T, H, D] -> [..., T, features]`, heads merged.

  The counterpart of `qkv_projections` (same rules: call it from a compact method).
  """
  return nn.DenseGeneral(
      features=features, axis=(-2, -1), use_bias=use_bias, dtype=dtype,
      param_dtype=param_dtype, precision=precision,
      kernel_init=nn.with_logical_partitioning(kernel_init, ("heads", "kv", "embed")),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)),
      name="out")(context)


def check_token_inputs(x: Array, mask: Array, who: str) -> tuple[Array, Array]:
  """`x` as an array `[B, N, E]` and `mask` as bool `[B, N]`, else a ValueError naming `who`."""
  x = jnp.asarray(x)
  mask = jnp.asarray(mask, bool)
  if x.ndim != 3:
    raise ValueError(f"{who}: x must be [batch, length, features], got shape {tuple(x.shape)}")
  if tuple(mask.shape) != tuple(x.shape[:2]):
    raise ValueError(f"{who}: mask has shape {tuple(mask.shape)}, expected {tuple(x.shape[:2])}")
  return x, mask


class MultiHeadAttention(nn.Module):
  """Multi-head attention `x_q` -> `x_kv` with additive layout terms.

  Attributes:
    num_heads: `H`.
    head_dim: `D`; default `width // num_heads`.
    out_features: output width; default the width of `x_q`.
    dropout_rate: dropout on the attention weights.
    use_bias: biases on the four projections (BERT: yes).
    dtype: compute dtype (logits and softmax are float32 regardless).
    param_dtype: parameter dtype.
    kernel_init: initializer of the projection kernels.
    precision: einsum / matmul precision.
  """
  num_heads: int
  head_dim: int | None = None
  out_features: int | None = None
  dropout_rate: float = 0.0
  use_bias: bool = True
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  kernel_init: Callable[..., Array] = default_kernel_init()
  precision: Any = None

  def _head_dim(self, width: int) -> int:
    if self.head_dim is not None:
      return self.head_dim
    if width % self.num_heads:
      raise ValueError(f"{type(self).__name__}: width {width} is not divisible by "
                       f"num_heads={self.num_heads}; set head_dim explicitly")
    return width // self.num_heads

  @nn.compact
  def __call__(self, x_q: Array, x_kv: Array | None = None, mask: Array | None = None,
               terms: Sequence[Term] = (), q_geom: Any = None, k_geom: Any = None,
               deterministic: bool = True) -> Array:
    """Attend from `x_q` to `x_kv`.

    Args:
      x_q: `[..., Q, E]` query-side states.
      x_kv: `[..., K, E]` key/value-side states (default `x_q`: self-attention).
      mask: bool broadcastable to `[..., H, Q, K]` (e.g. `[B, 1, Q, K]` from
        `make_attention_mask`), True = attend. None: all pairs visible.
      terms: layout score terms (see module docstring), summed into the logits.
      q_geom, k_geom: geometry dicts for the terms (`k_geom` defaults to `q_geom`
        when `x_kv` is None).
      deterministic: disables dropout.

    Returns:
      `[..., Q, out_features]`.
    """
    if x_kv is None:
      x_kv = x_q
      if k_geom is None:
        k_geom = q_geom
    width = x_q.shape[-1]
    head_dim = self._head_dim(width)
    proj_args = dict(use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype,
                     kernel_init=self.kernel_init, precision=self.precision)
    q, k, v = qkv_projections(x_q, x_kv, self.num_heads, head_dim, **proj_args)  # [..., T, H, D]
    bias = apply_terms(terms, q, k, q_geom, k_geom)  # [..., H, Q, K] or None
    dropout_rng = None
    if not deterministic and self.dropout_rate > 0.0:
      dropout_rng = self.make_rng("dropout")
    context = dot_product_attention(
        q, k, v, bias=bias, mask=mask, dropout_rate=self.dropout_rate,
        dropout_rng=dropout_rng, deterministic=deterministic, dtype=self.dtype,
        precision=self.precision)  # [..., Q, H, D]
    return out_projection(context, self.out_features or width, **proj_args)  # [..., Q, E]


class DenseSelfAttention(nn.Module):
  """`MultiHeadAttention` as self-attention with the shared flaxdoc signature.

  Parameters live directly under this module (`query`, `key`, `value`, `out`), the
  same tree as `MultiHeadAttention`, ETC and Linformer attention, so checkpoints
  can move between them.

  Attributes: as `MultiHeadAttention`.
  """
  num_heads: int
  head_dim: int | None = None
  dropout_rate: float = 0.0
  use_bias: bool = True
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  kernel_init: Callable[..., Array] = default_kernel_init()
  precision: Any = None

  def setup(self):
    self.mha = MultiHeadAttention(
        num_heads=self.num_heads, head_dim=self.head_dim, dropout_rate=self.dropout_rate,
        use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype,
        kernel_init=self.kernel_init, precision=self.precision)
    # No extra nesting level in the parameter tree.
    nn.share_scope(self, self.mha)

  def __call__(self, x: Array, mask: Array, terms: Sequence[Term] = (),
               geom: Mapping[str, Array] | None = None, deterministic: bool = True) -> Array:
    """Self-attention over `x`.

    Args:
      x: `[B, N, E]`.
      mask: bool `[B, N]`, True for real tokens.
      terms: layout score terms, called once with all `N x N` pairs.
      geom: per-token geometry `[B, N, ...]` for the terms; `geom["document_ids"]`
        (if present) restricts attention to each packed document.
      deterministic: disables dropout.

    Returns:
      `[B, N, E]`; padded positions get the output bias only (their attention row is
      empty), and never influence real tokens.
    """
    if x.ndim != 3 or mask.shape != x.shape[:2]:
      raise ValueError(f"DenseSelfAttention: expected x [B, N, E] and mask [B, N], got "
                       f"{x.shape} and {mask.shape}")
    _check_geom(geom, x.shape[:2], "DenseSelfAttention")
    mask = jnp.asarray(mask, bool)
    doc = None if geom is None else geom.get(DOCUMENT_IDS)
    pair_mask = make_attention_mask(mask, mask, doc, doc)  # [B, 1, N, N]
    return self.mha(x, None, pair_mask, terms=terms, q_geom=geom, k_geom=geom,
                    deterministic=deterministic)
