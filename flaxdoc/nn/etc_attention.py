"""ETC global-local attention (Ainslie et al., 2020), the FormNet backbone (DESIGN §3.1).

Tokens are `G` *global* tokens followed by `N` *long* tokens. Four pieces under two
softmaxes, with query/key/value/output projections shared by both kinds (ETC default):

* long queries (`l2l` + `l2g`): the long sequence is padded to a multiple of the
  block length `b = r + 1` (`r` the local radius) and cut into blocks; each query
  block attends to the previous, own and next key blocks (`3b` keys), masked to
  `|i - j| <= r`, to padding and to packed-document boundaries, *plus* all `G` global
  keys. One softmax over the `3b + G` keys.
* global queries (`g2g` + `g2l`): all globals and all long tokens, one softmax.

Cost per layer is `O(N * 3b + G * N)` time and memory; no `N x N` array is built.

Layout terms (see `flaxdoc.nn.attention`) apply to long-long pairs only: global
tokens have no geometry (DESIGN §3.2). Each term is called once with the blocked
queries `[B, nb, b, H, D]` against the blocked keys `[B, nb, 3b, H, D]`, and the
geometry is blocked exactly like them: a `[B, N, ...]` leaf becomes `[B, nb, b, ...]`
on the query side and `[B, nb, 3b, ...]` on the key side (zeros where a key block
falls outside the sequence; those pairs are masked). The term returns
`[B, nb, H, b, 3b]`.

ETC's own relative positions (optional, `relative_positions=True`): per layer a table
`[V, H, D]` and a bias `[V, H]` with `V = 2 * 12 + 1 + 2 = 27` ids: long-long and
global-global pairs get `clip(j - i, -12, 12) + 12` (position within the long or
the global sequence), long-global and global-long pairs get `25` when the long token
belongs to the global token ("membership": `geom["global_ids"]`, e.g. its page; all
tokens belong to every global of their document when absent) and `26` otherwise.
The score is `(q.k + q.r_id + b_id) / sqrt(D)`, computed as `q @ table` (`[.., V]`)
followed by a gather, never a `[Q, K, D]` tensor.

Module input layout (shared self-attention signature, see `flaxdoc.nn.encoder`):
`x [B, G + N, E]` with the globals first, `mask [B, G + N]`, and geometry leaves
`[B, G + N, ...]` whose first `G` rows are ignored by the terms (use
`with_global_tokens` to build them). Reserved geometry keys: `"document_ids"`
(packed documents; the globals' rows say which document each global serves) and
`"global_ids"` (membership, see above).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from flaxdoc.nn import etc_pallas
from flaxdoc.nn.attention import (DOCUMENT_IDS, Term, _check_geom, apply_terms,
                                  attention_dropout, default_kernel_init, masked_softmax,
                                  out_projection, qkv_projections)
from flaxdoc.nn.layout_terms import RichAttentionTerm

Array = jax.Array
Dtype = Any

# Geometry key: for each long token, the index (0..G-1) of the global token it
# belongs to (its page when there is one global per page). Used by the relative ids.
GLOBAL_IDS = "global_ids"

# ETC's clipping distance for relative position ids.
ETC_MAX_RELATIVE_DISTANCE = 12

# `EtcAttention.kernel`: XLA arrays (any terms, relative ids) or the fused Pallas kernel
# for the long queries (`flaxdoc.nn.etc_pallas`: Rich Attention or no term, no relative ids).
KERNELS = ("xla", "pallas")


def relative_vocab_size(max_distance: int = ETC_MAX_RELATIVE_DISTANCE) -> int:
  """Number of relative ids: `2 * max_distance + 1` offsets plus member / non-member."""
  return 2 * max_distance + 3


def split_blocks(x: Array, block_len: int) -> Array:
  """`[B, nb * b, ...]` -> `[B, nb, b, ...]`."""
  batch, length = x.shape[:2]
  if length % block_len:
    raise ValueError(f"split_blocks: length {length} is not a multiple of block_len {block_len}")
  return x.reshape((batch, length // block_len, block_len) + x.shape[2:])


def three_blocks(blocks: Array) -> Array:
  """Previous, own and next block side by side: `[B, nb, b, ...]` -> `[B, nb, 3b, ...]`.

  The blocks before the first and after the last are zeros (False for masks).
  """
  pad = [(0, 0), (1, 1)] + [(0, 0)] * (blocks.ndim - 2)
  padded = jnp.pad(blocks, pad)  # [B, nb + 2, b, ...]
  return jnp.concatenate([padded[:, :-2], padded[:, 1:-1], padded[:, 2:]],
                         axis=2)  # [B, nb, 3b, ...]


def pad_long(x: Array, padded_length: int) -> Array:
  """Zero-pad axis 1 of `[B, N, ...]` to `padded_length`."""
  pad = padded_length - x.shape[1]
  return jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))


def block_geometry(geom: Mapping[str, Array] | None, block_len: int,
                   padded_length: int) -> tuple[dict | None, dict | None]:
  """Block each `[B, N, ...]` leaf as queries `[B, nb, b, ...]` and keys `[B, nb, 3b, ...]`."""
  if geom is None:
    return None, None
  q_geom, k_geom = {}, {}
  for name, leaf in geom.items():
    blocks = split_blocks(pad_long(jnp.asarray(leaf), padded_length), block_len)
    q_geom[name] = blocks  # [B, nb, b, ...]
    k_geom[name] = three_blocks(blocks)  # [B, nb, 3b, ...]
  return q_geom, k_geom


def local_window(block_len: int, radius: int) -> np.ndarray:
  """Static bool `[b, 3b]`: key `j` of the 3 blocks is within `radius` of query `i`."""
  offsets = local_offsets(block_len)
  return np.abs(offsets) <= radius


def local_offsets(block_len: int) -> np.ndarray:
  """Static int `[b, 3b]`: key position minus query position inside a 3-block window.

  Query `i` of block `n` sits at `n*b + i`; key `j` of its window at `(n-1)*b + j`.
  """
  q = np.arange(block_len)[:, None]  # [b, 1]
  k = np.arange(3 * block_len)[None, :]  # [1, 3b]
  return (k - block_len) - q  # [b, 3b]


def _gather_ids(scores: Array, ids: Array) -> Array:
  """`scores [..., Q, V]` gathered at `ids [..., Q, K]` (broadcast) -> `[..., Q, K]`."""
  ids = jnp.broadcast_to(ids, scores.shape[:-1] + ids.shape[-1:])
  return jnp.take_along_axis(scores, ids, axis=-1)


def _same_document(q_doc: Array | None, k_doc: Array | None) -> Array | None:
  if q_doc is None:
    return None
  return q_doc[..., :, None] == k_doc[..., None, :]


def global_local_attention(
    q_long: Array, k_long: Array, v_long: Array,
    q_global: Array, k_global: Array, v_global: Array,
    long_valid: Array, global_valid: Array, *,
    local_radius: int,
    long_document_ids: Array | None = None,
    global_document_ids: Array | None = None,
    terms: Sequence[Term] = (),
    long_geom: Mapping[str, Array] | None = None,
    relative_table: Array | None = None,
    relative_bias: Array | None = None,
    long_global_ids: Array | None = None,
    max_relative_distance: int = ETC_MAX_RELATIVE_DISTANCE,
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
    precision: Any = None,
) -> tuple[Array, Array]:
  """ETC global-local attention on projected queries, keys and values (pure).

  Args:
    q_long, k_long, v_long: `[B, N, H, D]` long-token projections.
    q_global, k_global, v_global: `[B, G, H, D]` global-token projections (`G >= 0`).
    long_valid: bool `[B, N]`, True for real long tokens.
    global_valid: bool `[B, G]`.
    local_radius: `r`; long tokens see long tokens at distance `<= r`. Block length
      is `r + 1`.
    long_document_ids, global_document_ids: int `[B, N]` / `[B, G]` for packed
      documents (both or neither); pairs across documents are masked.
    terms: layout score terms, applied to long-long pairs only (blocked, see module
      docstring), with geometry `long_geom` (leaves `[B, N, ...]`).
    relative_table: `[V, H, D]` ETC relative-position table (None: no relative ids).
    relative_bias: `[V, H]`, required with `relative_table`.
    long_global_ids: int `[B, N]`, the global each long token belongs to (None: all).
    max_relative_distance: clipping distance of relative ids (`V = 2 md + 3`).
    dropout_rate, dropout_rng, deterministic: dropout on attention weights.
    precision: einsum precision.

  Returns:
    `(out_long [B, N, H, D], out_global [B, G, H, D])` in the dtype of `v_long`.
    Padded / fully masked queries get zeros.
  """
  batch, length, heads, head_dim = q_long.shape
  num_globals = q_global.shape[1]
  if length < 1:
    raise ValueError("global_local_attention: need at least one long token")
  if local_radius < 0:
    raise ValueError(f"global_local_attention: local_radius must be >= 0, got {local_radius}")
  if (long_document_ids is None) != (global_document_ids is None):
    raise ValueError("global_local_attention: give long_document_ids and global_document_ids "
                     "together (a global token must know its document)")
  if (relative_table is None) != (relative_bias is None):
    raise ValueError("global_local_attention: relative_table and relative_bias go together")
  block = local_radius + 1
  num_blocks = -(-length // block)
  padded = num_blocks * block
  scale = 1.0 / math.sqrt(head_dim)
  dtype = v_long.dtype
  f32 = jnp.float32
  long_valid = jnp.asarray(long_valid, bool)
  global_valid = jnp.asarray(global_valid, bool)

  # ---- Long queries: 3 local key blocks + all globals, one softmax. ----
  blk = lambda a: split_blocks(pad_long(a, padded), block)  # noqa: E731
  ql = blk(q_long)  # [B, nb, b, H, D]
  kl = three_blocks(blk(k_long))  # [B, nb, 3b, H, D]
  vl = three_blocks(blk(v_long))  # [B, nb, 3b, H, D]
  valid_q = blk(long_valid)  # [B, nb, b]
  valid_k = three_blocks(valid_q)  # [B, nb, 3b]

  l2l_mask = jnp.asarray(local_window(block, local_radius))  # [b, 3b]
  l2l_mask = l2l_mask & valid_q[..., :, None] & valid_k[..., None, :]  # [B, nb, b, 3b]
  l2g_mask = valid_q[..., :, None] & global_valid[:, None, None, :]  # [B, nb, b, G]
  if long_document_ids is not None:
    doc_q = blk(long_document_ids)  # [B, nb, b]
    doc_k = three_blocks(doc_q)  # [B, nb, 3b]
    l2l_mask = l2l_mask & _same_document(doc_q, doc_k)
    l2g_mask = l2g_mask & (doc_q[..., :, None] == global_document_ids[:, None, None, :])

  l2l = jnp.einsum("bnqhd,bnkhd->bnhqk", ql, kl, precision=precision,
                   preferred_element_type=f32)  # [B, nb, H, b, 3b]
  l2g = jnp.einsum("bnqhd,bghd->bnhqg", ql, k_global, precision=precision,
                   preferred_element_type=f32)  # [B, nb, H, b, G]

  member_ids = non_member_id = None
  if relative_table is not None:
    offsets_id = 2 * max_relative_distance + 1  # first membership id
    non_member_id = offsets_id + 1
    # Per-token scores against every relative id, then gather: never [Q, K, D].
    bias_hv = relative_bias.astype(f32).T  # [H, V]
    qr_long = jnp.einsum("bnqhd,vhd->bnhqv", ql, relative_table.astype(ql.dtype),
                         precision=precision, preferred_element_type=f32)
    qr_long = qr_long + bias_hv[:, None, :]  # [B, nb, H, b, V]
    l2l_ids = np.clip(local_offsets(block), -max_relative_distance,
                      max_relative_distance) + max_relative_distance  # [b, 3b]
    l2l = l2l + _gather_ids(qr_long, jnp.asarray(l2l_ids, jnp.int32))  # [B, nb, H, b, 3b]
    if long_global_ids is None:
      member = jnp.ones((batch, length, num_globals), bool)  # [B, N, G]
    else:
      member = long_global_ids[:, :, None] == jnp.arange(num_globals)  # [B, N, G]
    member_ids = jnp.where(member, offsets_id, non_member_id).astype(jnp.int32)  # [B, N, G]
    l2g_ids = blk(member_ids)[:, :, None]  # [B, nb, 1, b, G]
    l2g = l2g + _gather_ids(qr_long, l2g_ids)  # [B, nb, H, b, G]

  l2l = l2l * scale
  l2g = l2g * scale
  if terms:
    q_geom, k_geom = block_geometry(long_geom, block, padded)
    l2l = l2l + apply_terms(terms, ql, kl, q_geom, k_geom)  # [B, nb, H, b, 3b]

  logits = jnp.concatenate([l2l, l2g], axis=-1)  # [B, nb, H, b, 3b + G]
  mask = jnp.concatenate([l2l_mask, l2g_mask], axis=-1)[:, :, None]  # [B, nb, 1, b, 3b + G]
  weights = masked_softmax(logits, mask)  # [B, nb, H, b, 3b + G]
  rng_long = rng_global = None
  if dropout_rng is not None:
    rng_long, rng_global = jax.random.split(dropout_rng)
  weights = attention_dropout(weights, dropout_rate, rng_long, deterministic).astype(dtype)
  w_l2l, w_l2g = weights[..., :3 * block], weights[..., 3 * block:]
  out_long = (jnp.einsum("bnhqk,bnkhd->bnqhd", w_l2l, vl, precision=precision)
              + jnp.einsum("bnhqg,bghd->bnqhd", w_l2g, v_global.astype(dtype),
                           precision=precision))  # [B, nb, b, H, D]
  out_long = out_long.reshape((batch, padded, heads, v_long.shape[-1]))[:, :length]

  # ---- Global queries: all globals + all long tokens, one softmax. ----
  out_global = global_query_attention(
      q_global, k_global, v_global, k_long, v_long, long_valid, global_valid,
      long_document_ids=long_document_ids, global_document_ids=global_document_ids,
      relative=None if relative_table is None else (relative_table, bias_hv, member_ids),
      max_relative_distance=max_relative_distance, dropout_rate=dropout_rate,
      dropout_rng=rng_global, deterministic=deterministic, precision=precision)
  return out_long, out_global


def global_query_attention(
    q_global: Array, k_global: Array, v_global: Array, k_long: Array, v_long: Array,
    long_valid: Array, global_valid: Array, *,
    long_document_ids: Array | None = None,
    global_document_ids: Array | None = None,
    relative: tuple[Array, Array, Array] | None = None,
    max_relative_distance: int = ETC_MAX_RELATIVE_DISTANCE,
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
    precision: Any = None,
) -> Array:
  """ETC's global queries (`g2g` + `g2l`): all globals and all long tokens, one softmax.

  Shapes as `global_local_attention`; `relative` is `(table [V, H, D], bias [H, V],
  member_ids [B, N, G])` when ETC's relative ids are on. Returns `[B, G, H, D]`.
  """
  num_globals = q_global.shape[1]
  scale = 1.0 / math.sqrt(q_global.shape[-1])
  dtype = v_long.dtype
  f32 = jnp.float32
  g2g = jnp.einsum("bqhd,bkhd->bhqk", q_global, k_global, precision=precision,
                   preferred_element_type=f32)  # [B, H, G, G]
  g2l = jnp.einsum("bqhd,bkhd->bhqk", q_global, k_long, precision=precision,
                   preferred_element_type=f32)  # [B, H, G, N]
  if relative is not None:
    relative_table, bias_hv, member_ids = relative
    qr_global = jnp.einsum("bghd,vhd->bhgv", q_global, relative_table.astype(q_global.dtype),
                           precision=precision, preferred_element_type=f32)
    qr_global = qr_global + bias_hv[None, :, None, :]  # [B, H, G, V]
    pos = np.arange(num_globals)
    g2g_ids = np.clip(pos[None, :] - pos[:, None], -max_relative_distance,
                      max_relative_distance) + max_relative_distance  # [G, G]
    g2g = g2g + _gather_ids(qr_global, jnp.asarray(g2g_ids, jnp.int32))
    g2l_ids = jnp.swapaxes(member_ids, 1, 2)[:, None]  # [B, 1, G, N]
    g2l = g2l + _gather_ids(qr_global, g2l_ids)  # [B, H, G, N]
  g2g_mask = global_valid[:, :, None] & global_valid[:, None, :]  # [B, G, G]
  g2l_mask = global_valid[:, :, None] & long_valid[:, None, :]  # [B, G, N]
  if long_document_ids is not None:
    g2g_mask = g2g_mask & _same_document(global_document_ids, global_document_ids)
    g2l_mask = g2l_mask & _same_document(global_document_ids, long_document_ids)
  logits = jnp.concatenate([g2g, g2l], axis=-1) * scale  # [B, H, G, G + N]
  mask = jnp.concatenate([g2g_mask, g2l_mask], axis=-1)[:, None]  # [B, 1, G, G + N]
  weights = masked_softmax(logits, mask)  # [B, H, G, G + N]
  weights = attention_dropout(weights, dropout_rate, dropout_rng, deterministic).astype(dtype)
  out_global = (jnp.einsum("bhqk,bkhd->bqhd", weights[..., :num_globals],
                           v_global.astype(dtype), precision=precision)
                + jnp.einsum("bhqk,bkhd->bqhd", weights[..., num_globals:], v_long,
                             precision=precision))  # [B, G, H, D]
  return out_global


def with_global_tokens(global_x: Array, global_valid: Array, x: Array, mask: Array,
                       geom: Mapping[str, Array] | None = None,
                       global_geom: Mapping[str, Array] | None = None
                       ) -> tuple[Array, Array, dict | None]:
  """Prepend `G` global tokens to a long sequence in the layout `EtcAttention` reads.

  Args:
    global_x: `[B, G, E]` global token states (e.g. a learned embedding per page).
    global_valid: bool `[B, G]`.
    x: `[B, N, E]` long token states.
    mask: bool `[B, N]`.
    geom: long-token geometry, leaves `[B, N, ...]`.
    global_geom: rows for the globals, leaves `[B, G, ...]`, for the keys of `geom`
      that matter for globals (`"document_ids"` when packing). Missing keys get zeros
      (terms never read global rows).

  Returns:
    `(x [B, G+N, E], mask [B, G+N], geom with leaves [B, G+N, ...] or None)`.
  """
  batch, num_globals = global_x.shape[:2]
  out_x = jnp.concatenate([global_x.astype(x.dtype), x], axis=1)  # [B, G + N, E]
  out_mask = jnp.concatenate([jnp.asarray(global_valid, bool), jnp.asarray(mask, bool)], axis=1)
  if geom is None:
    return out_x, out_mask, None
  global_geom = dict(global_geom or {})
  unknown = set(global_geom) - set(geom)
  if unknown:
    raise ValueError(f"with_global_tokens: global_geom keys {sorted(unknown)} are not in geom")
  out_geom = {}
  for name, leaf in geom.items():
    leaf = jnp.asarray(leaf)
    rows = global_geom.get(name)
    if rows is None:
      rows = jnp.zeros((batch, num_globals) + leaf.shape[2:], leaf.dtype)
    out_geom[name] = jnp.concatenate([jnp.asarray(rows, leaf.dtype), leaf], axis=1)
  return out_x, out_mask, out_geom


class EtcAttention(nn.Module):
  """ETC global-local self-attention with the shared flaxdoc signature.

  Attributes:
    num_heads: `H`.
    local_radius: `r`; block length `r + 1`. FormNet/ETC use e.g. `r = 84`.
    num_globals: `G`, the number of leading global tokens of `x` (FormNet: 1; one
      per page is also common).
    head_dim: `D`; default `width // num_heads`.
    relative_positions: add ETC's relative-position ids (table + bias per layer).
    max_relative_distance: clipping of relative ids (ETC: 12).
    dropout_rate: dropout on the attention weights.
    use_bias, dtype, param_dtype, kernel_init, precision: as `MultiHeadAttention`.
    kernel: "xla" (default) or "pallas": the long queries through the fused kernel of
      `flaxdoc.nn.etc_pallas` (GPU; the Pallas interpreter elsewhere, slow). Takes Rich
      Attention as its only layout term and no relative ids. Same parameters and, up to
      rounding, the same outputs; dropout draws from a different random stream, the
      long queries ignore `precision`, and no gradient flows into the geometry.
    tiles: the fused kernel's `etc_pallas.Tiles` (None: its defaults, tuned on an H100).
  """
  num_heads: int
  local_radius: int
  num_globals: int = 1
  head_dim: int | None = None
  relative_positions: bool = False
  max_relative_distance: int = ETC_MAX_RELATIVE_DISTANCE
  dropout_rate: float = 0.0
  use_bias: bool = True
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  kernel_init: Callable[..., Array] = default_kernel_init()
  precision: Any = None
  kernel: str = "xla"
  tiles: etc_pallas.Tiles | None = None

  @nn.compact
  def __call__(self, x: Array, mask: Array, terms: Sequence[Term] = (),
               geom: Mapping[str, Array] | None = None, deterministic: bool = True) -> Array:
    """Global-local self-attention.

    Args:
      x: `[B, G + N, E]`, the `G = num_globals` global tokens first.
      mask: bool `[B, G + N]`.
      terms: layout score terms, applied to long-long pairs.
      geom: geometry leaves `[B, G + N, ...]` (global rows ignored by terms).
      deterministic: disables dropout.

    Returns:
      `[B, G + N, E]`.
    """
    g = self.num_globals
    if x.ndim != 3 or tuple(mask.shape) != tuple(x.shape[:2]):
      raise ValueError(f"EtcAttention: expected x [B, G+N, E] and mask [B, G+N], got "
                       f"{x.shape} and {jnp.shape(mask)}")
    if x.shape[1] <= g:
      raise ValueError(f"EtcAttention: sequence of length {x.shape[1]} has no long token "
                       f"after the num_globals={g} global tokens")
    _check_geom(geom, x.shape[:2], "EtcAttention")
    width = x.shape[-1]
    if self.head_dim is None and width % self.num_heads:
      raise ValueError(f"EtcAttention: width {width} is not divisible by "
                       f"num_heads={self.num_heads}; set head_dim explicitly")
    head_dim = self.head_dim or width // self.num_heads
    mask = jnp.asarray(mask, bool)

    # Same parameter tree as MultiHeadAttention (query/key/value/out).
    proj_args = dict(use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype,
                     kernel_init=self.kernel_init, precision=self.precision)
    q, k, v = qkv_projections(x, x, self.num_heads, head_dim, **proj_args)  # [B, G+N, H, D]

    geom = dict(geom or {})
    doc = geom.get(DOCUMENT_IDS)
    global_ids = geom.get(GLOBAL_IDS)
    long_geom = {name: leaf[:, g:] for name, leaf in geom.items()} or None

    table = bias = None
    if self.relative_positions:
      vocab = relative_vocab_size(self.max_relative_distance)
      table = self.param(
          "relative_table",
          nn.with_logical_partitioning(self.kernel_init, ("relpos", "heads", "kv")),
          (vocab, self.num_heads, head_dim), self.param_dtype)  # [V, H, D]
      bias = self.param(
          "relative_bias",
          nn.with_logical_partitioning(nn.initializers.zeros_init(), ("relpos", "heads")),
          (vocab, self.num_heads), self.param_dtype)  # [V, H]
      table = jnp.asarray(table, self.dtype)

    dropout_rng = None
    if not deterministic and self.dropout_rate > 0.0:
      dropout_rng = self.make_rng("dropout")
    if self.kernel == "pallas":
      context = self._fused(q, k, v, mask, terms, long_geom, doc, dropout_rng)
      return out_projection(context, width, **proj_args)  # [B, G+N, E]
    if self.kernel != "xla":
      raise ValueError(f"EtcAttention: kernel must be one of {KERNELS}, got {self.kernel!r}")
    out_long, out_global = global_local_attention(
        q[:, g:], k[:, g:], v[:, g:], q[:, :g], k[:, :g], v[:, :g],
        mask[:, g:], mask[:, :g], local_radius=self.local_radius,
        long_document_ids=None if doc is None else doc[:, g:],
        global_document_ids=None if doc is None else doc[:, :g],
        terms=terms, long_geom=long_geom, relative_table=table, relative_bias=bias,
        long_global_ids=None if global_ids is None else global_ids[:, g:],
        max_relative_distance=self.max_relative_distance,
        dropout_rate=self.dropout_rate, dropout_rng=dropout_rng,
        deterministic=deterministic, precision=self.precision)
    context = jnp.concatenate([out_global, out_long], axis=1)  # [B, G+N, H, D]
    return out_projection(context, width, **proj_args)  # [B, G+N, E]

  def _fused(self, q, k, v, mask, terms, long_geom, doc, dropout_rng) -> Array:
    """`kernel="pallas"`: long queries fused (`etc_pallas`), global queries as XLA arrays."""
    g = self.num_globals
    if self.relative_positions:
      raise ValueError("EtcAttention(kernel='pallas'): ETC's relative position ids are not "
                       "in the fused kernel; use kernel='xla'")
    terms = tuple(terms)
    if len(terms) > 1 or any(not isinstance(t, RichAttentionTerm) for t in terms):
      names = [type(t).__name__ for t in terms]
      raise ValueError(f"EtcAttention(kernel='pallas'): the fused kernel takes Rich Attention "
                       f"as its only layout term, got {names}; use kernel='xla'")
    rich = None
    if terms:
      coords = terms[0].coordinates(long_geom)  # [B, N, A]
      rich = terms[0].scalars(q[:, g:], k[:, g:]) + (coords,)
    rng_long = rng_global = seed = None
    if dropout_rng is not None:
      rng_long, rng_global = jax.random.split(dropout_rng)
      seed = jax.random.bits(rng_long, (1,), jnp.uint32).astype(jnp.int32)
    long_doc = None if doc is None else doc[:, g:]
    global_doc = None if doc is None else doc[:, :g]
    out_global = global_query_attention(
        q[:, :g], k[:, :g], v[:, :g], k[:, g:], v[:, g:], mask[:, g:], mask[:, :g],
        long_document_ids=long_doc, global_document_ids=global_doc,
        dropout_rate=self.dropout_rate, dropout_rng=rng_global,
        deterministic=dropout_rng is None, precision=self.precision)
    # The kernel writes the long rows after the global ones: no concatenation.
    return etc_pallas.long_query_attention(
        q[:, g:], k[:, g:], v[:, g:], k[:, :g], v[:, :g], mask[:, g:], mask[:, :g],
        local_radius=self.local_radius, long_document_ids=long_doc,
        global_document_ids=global_doc, rich=rich,
        dropout_rate=self.dropout_rate if seed is not None else 0.0, dropout_seed=seed,
        global_rows=out_global.astype(v.dtype), tiles=self.tiles)  # [B, G+N, H, D]
