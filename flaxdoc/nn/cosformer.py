"""LayoutCosformer attention: linear attention with cos re-weighting (DESIGN §3.6).

cosFormer (Qin et al., 2022) replaces `exp(q . k)` by `phi(q) . phi(k)` with
`phi = relu`, and multiplies the similarity by a re-weighting `B_ij` that favours
nearby tokens:

    s_ij  = (phi(q_i) . phi(k_j)) * B_ij
    out_i = sum_j s_ij v_j / max(sum_j s_ij, eps)          (eps = 1e-4)

Computed naively that is `O(N^2)`. Because every `B` used here is a sum of products
`B_ij = sum_r f_r(i) f_r(j)`, the sums factor (Douzon et al. §4.3):

    sum_j s_ij v_j = sum_r (f_r(i) phi(q_i)) . [sum_j f_r(j) phi(k_j) v_j^T]

so each head keeps `R` matrices `[d, d_v]` and cost is `O(N R d d_v)`. The factors
come from `flaxdoc.layout.squircle`:

* "1d":       `cos(pi/2M (i - j))` -> `[cos(pi i/2M), sin(pi i/2M)]` (R = 2), `M` the
  configured `max_length` or the sequence length; `geom["positions"]` (default
  `0..N-1`) gives `i`.
* "squircle": `cos(pi/2 dx/1000) cos(pi/2 dy/1000)` over box centres
  (`geom["centers"]`, 0..1000 units) -> the four cos/sin products (R = 4).
* "cross":    `max(cos(pi/2 dx/1000), cos(pi/2 dy/1000))` is not a sum of products;
  as in the released code it is approximated by two linear attentions, one
  re-weighted along x and one along y, keeping per element the output of larger
  magnitude.
* "none":     plain ReLU linear attention (R = 1, `f = 1`).

Every `B_ij` above is non-negative only while `|i - j| <= M` (`|dx|, |dy| <= 1000`);
pass per-page centres (as the released model does) or set `extent` to the
coordinate range (e.g. `1000 * max_pages` for page-stacked y).

The epsilon clamps the denominator like the reference cosFormer implementation
(`clamp_min`), so a query whose `phi(q)` is all zero gets a zero output, not NaN.

Padding: `phi(k)`, `v` and the factors of padded tokens are zeroed, so padded keys
cannot influence real outputs; padded queries get zero outputs. Attention is
bidirectional (no causal prefix sums). Pairwise layout terms need `[N, N]` scores,
which this module never forms: passing any raises `ValueError`.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

from flaxdoc.layout.squircle import (cos_reweight_factors_1d, cross_factors_2d,
                                     squircle_factors_2d)
from flaxdoc.nn.attention import check_token_inputs, out_projection, qkv_projections

Array = jax.Array
Dtype = Any

REWEIGHT_KINDS = ("none", "1d", "squircle", "cross")
DEFAULT_EPS = 1e-4


def linear_attention(q: Array, k: Array, v: Array, q_factors: Array, k_factors: Array,
                     eps: float = DEFAULT_EPS) -> Array:
  """Re-weighted linear attention in `O(N)`.

  Computes `out_i = sum_j s_ij v_j / max(sum_j s_ij, eps)` with
  `s_ij = (q_i . k_j) * sum_r q_factors[i, r] * k_factors[j, r]`, without forming
  `s`. Feature maps (`phi`), masking and dtype are the caller's business.

  Args:
    q: `[B, N, H, D]` query features (already `phi(q)`).
    k: `[B, M, H, D]` key features (already `phi(k)`, zero at padding).
    v: `[B, M, H, Dv]` values.
    q_factors: `[B, N, R]` query-side factors of the re-weighting.
    k_factors: `[B, M, R]` key-side factors.
    eps: lower clamp of the denominator.

  Returns:
    `[B, N, H, Dv]`.
  """
  kv = jnp.einsum("bmhd,bmr,bmhe->bhrde", k, k_factors, v)  # [B, H, R, D, Dv]
  k_sum = jnp.einsum("bmhd,bmr->bhrd", k, k_factors)  # [B, H, R, D]
  q_weighted = jnp.einsum("bnhd,bnr->bnhrd", q, q_factors)  # [B, N, H, R, D]
  numerator = jnp.einsum("bnhrd,bhrde->bnhe", q_weighted, kv)  # [B, N, H, Dv]
  denominator = jnp.einsum("bnhrd,bhrd->bnh", q_weighted, k_sum)  # [B, N, H]
  return numerator / jnp.maximum(denominator, eps)[..., None]


def combine_cross(out_x: Array, out_y: Array) -> Array:
  """Elementwise, keeps the value of larger magnitude (ties go to `out_x`)."""
  return jnp.where(jnp.abs(out_x) >= jnp.abs(out_y), out_x, out_y)


class CosformerAttention(nn.Module):
  """Multi-head cosFormer self-attention with the shared flaxdoc attention signature.

  Attributes:
    num_heads: attention heads; the model width must be divisible by it.
    reweight: "none" | "1d" | "squircle" | "cross" (see the module docstring).
    max_length: `M` of the 1D re-weighting (default: the sequence length `N`).
    length: "max" (`M = max_length`) or "document" (`M` = each row's own number of
      valid tokens, the released code's choice; `model.cosformer_length`).
    extent: the coordinate offset of `geom["centers"]` that maps to a quarter
      period of the 2D cosines (`M` of `pi / 2M`; 1000 for per-page LayoutLM units).
    eps: denominator clamp (1e-4 as in Douzon et al.'s configuration).
  """
  num_heads: int
  reweight: str = "1d"
  max_length: int | None = None
  length: str = "max"  # M of the 1D re-weighting: "max" (max_length) or "document"
  extent: float = 1000.0
  eps: float = DEFAULT_EPS
  use_bias: bool = True
  initializer_range: float = 0.02
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def _factors(self, mask: Array, geom: dict | None, length: int) -> list[Array]:
    """The re-weighting factors, one `[B, N, R]` array per linear attention."""
    batch = mask.shape[0]
    geom = geom or {}
    if self.reweight == "none":
      return [jnp.ones((batch, length, 1), jnp.float32)]
    if self.reweight == "1d":
      positions = geom.get("positions")
      if positions is None:
        positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
      positions = jnp.asarray(positions)
      if tuple(positions.shape) != (batch, length):
        raise ValueError(f"CosformerAttention: geom['positions'] has shape "
                         f"{tuple(positions.shape)}, expected {(batch, length)}")
      if self.length == "document":
        # The released code's M: the document's (window's) own token count, per row.
        m = jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True), 1).astype(jnp.float32)  # [B, 1]
        a = math.pi / (2.0 * m) * positions.astype(jnp.float32)  # [B, N]
        return [jnp.stack([jnp.cos(a), jnp.sin(a)], axis=-1)]  # [B, N, 2]
      m = self.max_length or length
      return [cos_reweight_factors_1d(positions.astype(jnp.float32), m)]
    centers = geom.get("centers")
    if centers is None:
      raise ValueError(f"CosformerAttention: reweight={self.reweight!r} needs "
                       f"geom['centers'] [batch, length, 2] (box centres, 0..1000 units)")
    centers = jnp.asarray(centers, jnp.float32)
    if tuple(centers.shape) != (batch, length, 2):
      raise ValueError(f"CosformerAttention: geom['centers'] has shape "
                       f"{tuple(centers.shape)}, expected {(batch, length, 2)}")
    if self.reweight == "squircle":
      return [squircle_factors_2d(centers, self.extent)]  # [B, N, 4]
    # Cross: one 1D cos re-weighting per axis, [B, N, 2] each.
    return list(cross_factors_2d(centers, self.extent))

  @nn.compact
  def __call__(self, x: Array, mask: Array, terms: Sequence[Any] = (),
               geom: dict | None = None, deterministic: bool = True) -> Array:
    """Self-attention over `x`.

    Args:
      x: `[B, N, E]` token states.
      mask: `bool [B, N]`, True for real tokens.
      terms: must be empty (cosFormer applies its own re-weighting instead).
      geom: `{"positions": [B, N]}` for "1d" (optional), `{"centers": [B, N, 2]}` for
        "squircle" and "cross".
      deterministic: unused (no attention dropout in linear attention); kept for
        the shared signature.

    Returns:
      `[B, N, E]`.
    """
    del deterministic
    if self.reweight not in REWEIGHT_KINDS:
      raise ValueError(f"CosformerAttention: reweight={self.reweight!r}, expected one of "
                       f"{REWEIGHT_KINDS}")
    if terms:
      raise ValueError("CosformerAttention: pairwise layout terms cannot be applied to "
                       "linear attention (they need the [N, N] score matrix); use "
                       "reweight='squircle' or 'cross' for 2D locality")
    x, mask = check_token_inputs(x, mask, "CosformerAttention")
    length, features = x.shape[1:]
    if features % self.num_heads:
      raise ValueError(f"CosformerAttention: width {features} is not divisible by "
                       f"num_heads={self.num_heads}")
    head_dim = features // self.num_heads
    factor_sets = self._factors(mask, geom, length)

    proj_args = dict(use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype,
                     kernel_init=nn.initializers.normal(self.initializer_range))
    q, k, v = qkv_projections(x, x, self.num_heads, head_dim, **proj_args)  # [B, N, H, D]

    # The sums over N run in float32 even when the model computes in bfloat16.
    valid = mask[:, :, None, None]
    q = jax.nn.relu(q.astype(jnp.float32))
    k = jnp.where(valid, jax.nn.relu(k.astype(jnp.float32)), 0.0)
    v = jnp.where(valid, v.astype(jnp.float32), 0.0)
    outputs = []
    for factors in factor_sets:
      # Zeroed factors keep padding (even NaN geometry there) out of every sum.
      factors = jnp.where(mask[..., None], factors.astype(jnp.float32), 0.0)  # [B, N, R]
      outputs.append(linear_attention(q, k, v, factors, factors, self.eps))  # [B, N, H, D]
    context = outputs[0] if len(outputs) == 1 else combine_cross(*outputs)
    context = context.astype(self.dtype)
    return out_projection(context, features, **proj_args)  # [B, N, E]
