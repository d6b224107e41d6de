"""Sinusoidal position features `PE_sine(p)` (Vaswani et al. 2017), LSPE's input (DESIGN §3.7).

The interleaved layout of the original paper and of the LSPE paper's eq. (1):

  PE(p, 2i)     = sin(p / max_period^(2i / dim))
  PE(p, 2i + 1) = cos(p / max_period^(2i / dim))

(as opposed to the "concatenated" `[sin..., cos...]` layout of tensor2tensor /
some Flax examples; the two differ only by a fixed permutation of features,
which the LSPE feed-forward network would absorb, but checkpoints and tests
need one fixed convention).

Positions may be integers (sequence indices) or floats (box coordinates in
0..1000 units, stacked pages up to tens of thousands); they are computed in
float32, so the features of a position `p` carry an absolute error of about
`2e-7 * p` (1e-4 at p = 500, 5e-3 at p = 25,000) - fine for a feature that an
FFN consumes.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

DEFAULT_MAX_PERIOD = 10000.0

__all__ = ["DEFAULT_MAX_PERIOD", "sine_frequencies", "sine_features"]


def sine_frequencies(dim: int, max_period: float = DEFAULT_MAX_PERIOD) -> np.ndarray:
  """The `dim // 2` angular frequencies `max_period^(-2i / dim)` (float64 numpy, cast later)."""
  if dim <= 0 or dim % 2:
    raise ValueError(f"dim must be a positive even number, got {dim}")
  if not max_period > 0:
    raise ValueError(f"max_period must be positive, got {max_period}")
  return float(max_period) ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)  # [dim / 2]


def sine_features(positions, dim: int, max_period: float = DEFAULT_MAX_PERIOD) -> jnp.ndarray:
  """`[...]` positions -> `float32 [..., dim]` interleaved sin/cos features."""
  freqs = jnp.asarray(sine_frequencies(dim, max_period), jnp.float32)  # [dim / 2]
  p = jnp.asarray(positions, jnp.float32)  # [...]
  angles = p[..., None] * freqs  # [..., dim / 2]
  pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [..., dim / 2, 2]
  return pe.reshape(pe.shape[:-2] + (dim,))  # [..., dim]
