"""BERT's exact GELU, `x Phi(x) = x (1 + erf(x / sqrt 2)) / 2`, for flaxdoc's exact-GELU layers.

Why not `nn.gelu(x, approximate=False)` (`jax.nn.gelu`): it is `x erfc(-x / sqrt 2) / 2`. XLA has
no erfc instruction, so JAX expands it into both of its float32 branches (a polynomial for
`|x| < 1`, an exponential times a rational function beyond) and a select, for every
element; `erf` is one clamped rational function (an XLA instruction). In the H100 profile
of the FormNet-A2 step the erfc form's forward and backward of the feed-forward GELU took
0.16 and 0.23 ms a layer for 50 M elements, above their memory time; the erf form made
the step 2.3% faster, and on this CPU its forward is 1.6-2.7x and its gradient 2.4-2.8x
faster (docs/accelerators.md, session 14).
It is also BERT's, Hugging Face's and PyTorch's formula, which the export uses.

The two agree to a few float32 ulps wherever `Phi(x)` is not tiny (within 1.2e-6 of the
float64 GELU everywhere on this CPU; the erfc form within 4e-7); below `x ~ -3` the
`1 + erf` loses relative precision as `Phi(x)` shrinks, as PyTorch's does, while GELU
there is within 4.1e-3 of 0. Computed in float32, rounded once
to the input's dtype.

(The fused Pallas GCN kernels evaluate the same function their own way:
`flaxdoc.nn.gcn_pallas_kernels.gelu`.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_SQRT_HALF = 0.7071067811865476


def erf_gelu(x: jax.Array) -> jax.Array:
  """`x (1 + erf(x / sqrt 2)) / 2` elementwise, in float32, in `x`'s dtype."""
  xf = x.astype(jnp.float32)
  return (xf * (0.5 + 0.5 * jax.lax.erf(xf * _SQRT_HALF))).astype(x.dtype)


@jax.checkpoint
def bias_erf_gelu(y: jax.Array, bias: jax.Array) -> jax.Array:
  """`erf_gelu(y + bias)`, keeping only `y` and `bias` for the backward.

  Why `jax.checkpoint`: differentiated as written, the GELU keeps more `[tokens, M]` arrays
  from its forward for the backward (its erf factor, a scaled copy of its input, and the
  biased input), each written by the forward besides its output. Here the backward
  recomputes all of it from `y`, the feed-forward product's output, which is in memory
  anyway. In the compiled FormNet-A2 step (H100, deviceless compile) that was about 0.3 GB
  less traffic per layer (docs/accelerators.md, session 11); values and gradients are the
  same functions.
  """
  return erf_gelu(y + bias)
