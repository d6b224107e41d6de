"""LayoutLinformer attention: keys and values projected along the sequence (DESIGN §3.6).

Linformer (Wang et al., 2020) approximates self-attention by a low-rank one: the
keys and values, `[N, d]` per head, are projected along the *sequence* axis to a
fixed `k` by learned matrices `E, F in R^{k x N}` (one pair per layer, shared by the
heads):

    K' = E K,  V' = F V           # [k, d]
    out = softmax(Q K'^T / sqrt(d)) V'   # [N, k] attention, O(N k) time and memory

Douzon et al. use `N = 2048, k = 512` and add LayoutLM's 2D and page embeddings at
the input (`flaxdoc.nn.embeddings.Embeddings`); the attention itself is unchanged.

Padding. The projection mixes all `N` positions, so padded keys and values are set
to zero *before* projecting: they contribute nothing to `K'` and `V'`, and real
outputs do not depend on what padded tokens hold. The learned projections are sized
for exactly `N = max_length` positions: shorter inputs are padded inside the module
(and the output cut back), longer ones are an error. Because padded keys are zero
rather than removed, the `k` projected slots stay in the softmax even for a very
short document; this is Linformer's behaviour, not a leak of padding.

Pairwise layout terms (Rich Attention, polar, Gaussian, squircle ...) need the full
`[N, N]` score matrix, which Linformer never forms: passing any raises `ValueError`.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

from flaxdoc.nn.attention import check_token_inputs, out_projection, qkv_projections
from flaxdoc.nn.dropout import Dropout

Array = jax.Array
Dtype = Any


def _partitioned(init, axes):
  return nn.with_logical_partitioning(init, axes)


class LinformerAttention(nn.Module):
  """Multi-head Linformer self-attention with the shared flaxdoc attention signature.

  Attributes:
    num_heads: attention heads; the model width must be divisible by it.
    max_length: `N`, the sequence length the projections are built for.
    proj_length: `k`, the projected key/value length.
    share_kv: use one projection for keys and values (`E = F`, Linformer's
      "key-value sharing"); default separate matrices as in the paper.
    dropout_rate: dropout on the attention weights.
  """
  num_heads: int
  max_length: int = 2048
  proj_length: int = 512
  share_kv: bool = False
  dropout_rate: float = 0.0
  use_bias: bool = True
  initializer_range: float = 0.02
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array, mask: Array, terms: Sequence[Any] = (),
               geom: dict | None = None, deterministic: bool = True) -> Array:
    """Self-attention over `x`.

    Args:
      x: `[B, N, E]` token states, `N <= max_length`.
      mask: `bool [B, N]`, True for real tokens.
      terms: must be empty (no pairwise layout term is possible).
      geom: ignored (accepted for the shared signature).
      deterministic: disables dropout when True.

    Returns:
      `[B, N, E]`.
    """
    del geom  # Linformer has no layout term.
    if terms:
      raise ValueError("LinformerAttention: pairwise layout terms cannot be applied, the "
                       "key axis is projected from N to k before any score exists; use "
                       "dense/ETC attention, or cosFormer re-weighting, for layout terms")
    x, mask = check_token_inputs(x, mask, "LinformerAttention")
    length, features = x.shape[1:]
    if length > self.max_length:
      raise ValueError(f"LinformerAttention: sequence length {length} exceeds max_length="
                       f"{self.max_length}; split the document or build a longer model")
    if features % self.num_heads:
      raise ValueError(f"LinformerAttention: width {features} is not divisible by "
                       f"num_heads={self.num_heads}")
    head_dim = features // self.num_heads

    # Pad to the projection length N; padded positions are masked out below.
    pad = self.max_length - length
    if pad:
      x = jnp.pad(x, ((0, 0), (0, pad), (0, 0)))
      mask = jnp.pad(mask, ((0, 0), (0, pad)))

    proj_args = dict(use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype,
                     kernel_init=nn.initializers.normal(self.initializer_range))
    q, k, v = qkv_projections(x, x, self.num_heads, head_dim, **proj_args)  # [B, N, H, D]

    # Zero padded keys/values so the sequence projection cannot see them.
    valid = mask[:, :, None, None]
    k = jnp.where(valid, k, 0)
    v = jnp.where(valid, v, 0)

    # Projections [k, N]; uniform(-1/sqrt(N), 1/sqrt(N)) like torch.nn.Linear(N, k),
    # so the projected keys keep the scale of a mean over positions.
    bound = 1.0 / math.sqrt(self.max_length)
    proj_init = _partitioned(
        lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound),
        (None, None))
    shape = (self.proj_length, self.max_length)
    proj_k = self.param("proj_k", proj_init, shape, self.param_dtype)
    proj_v = proj_k if self.share_kv else self.param("proj_v", proj_init, shape,
                                                     self.param_dtype)
    q, k, v, proj_k, proj_v = nn.dtypes.promote_dtype(q, k, v, proj_k, proj_v, dtype=self.dtype)
    k_proj = jnp.einsum("pn,bnhd->bphd", proj_k, k)  # [B, k, H, D]
    v_proj = jnp.einsum("pn,bnhd->bphd", proj_v, v)  # [B, k, H, D]

    scores = jnp.einsum("bqhd,bphd->bhqp", q, k_proj) / math.sqrt(head_dim)  # [B, H, N, k]
    weights = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(self.dtype)
    weights = Dropout(self.dropout_rate)(weights, deterministic=deterministic)
    context = jnp.einsum("bhqp,bphd->bqhd", weights, v_proj)  # [B, N, H, D]
    out = out_projection(context, features, **proj_args)  # [B, N, E]
    return out[:, :length]
