"""Inverted dropout whose mask is a counter hash, recomputed in the backward, never stored.

    y = where(keep, x / (1 - rate), 0),   keep[i, j] = H(seed, row i, column j) >= rate * 2^32

`H` chains murmur3's 32-bit finaliser (`fmix32`) over the seed, the row (every axis but
the last, flattened) and the column, as the fused ETC kernel hashes its attention pairs
(`flaxdoc.nn.etc_pallas_kernels.dropout_keep`). `seed` is one 32-bit word drawn from the
module's `dropout` RNG stream (`Dropout`) or from a given key (`attention_dropout`), so a
mask still depends on the step's key, the module's path and the element, and training
resumes bit for bit.

Why not `flax.linen.Dropout`: it draws `jax.random.bernoulli` over the whole array, and
autodiff keeps the mask for the backward. In the FormNet-A2 pre-training step on an H100
the compiled module wrote each encoder dropout's random words (`u32[16, 1025, 768]`) and
its boolean mask to memory, kept every mask until the backward, and ran the GCN's pooled
dropout as a pass of its own; the step without dropout was 5.15 ms (5.7%) faster, and
drawing the bits with the `rbg` generator instead of threefry changed nothing (docs/accelerators.md,
session 14). Here the mask is a few integer operations an element that XLA
fuses into whatever reads or writes `x`, forward and backward (`jax.checkpoint`: the
backward keeps only `seed`).

The hash is a bijection of the element's index for a given row stream, so no two
elements of a row share their bits; rows beyond 2^32 in one array would repeat streams.
The drop probability is `round(rate * 2^32) / 2^32`, within 2.4e-10 of `rate`.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax import lax

_U32 = jnp.uint32
# Odd multipliers that spread a row and a column index before they are hashed (shared with
# the fused ETC kernel's pair hash, `etc_pallas_kernels.dropout_keep`).
ROW_MIX, COLUMN_MIX = 0x27D4EB2F, 0x165667B1


def fmix32(x):
  """murmur3's 32-bit finaliser: a bijection that mixes every input bit into every output bit."""
  x = x ^ lax.shift_right_logical(x, _U32(16))
  x = x * _U32(0x85EBCA6B)
  x = x ^ lax.shift_right_logical(x, _U32(13))
  x = x * _U32(0xC2B2AE35)
  return x ^ lax.shift_right_logical(x, _U32(16))


def drop_threshold(rate: float) -> int:
  """The 32-bit threshold below which a hash drops its element."""
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
  return min(int(round(rate * 2.0 ** 32)), 2 ** 32 - 1)


def keep_mask(seed, shape: Sequence[int], rate: float) -> jax.Array:
  """`bool[shape]`: the elements that dropout at `rate` keeps for the uint32 `seed`."""
  shape = tuple(int(d) for d in shape)
  if not shape:
    shape_rows, columns = (), 1
  else:
    shape_rows, columns = shape[:-1], shape[-1]
  row = jnp.zeros(shape_rows, _U32)
  for axis, size in enumerate(shape_rows):  # the flat row index (wraps past 2^32 rows)
    row = row * _U32(size) + lax.broadcasted_iota(_U32, shape_rows, axis)
  stream = fmix32(fmix32(jnp.asarray(seed, _U32)) ^ (row * _U32(ROW_MIX)))  # [rows]
  column = lax.broadcasted_iota(_U32, shape_rows + (columns,), len(shape_rows))
  bits = fmix32(stream[..., None] ^ (column * _U32(COLUMN_MIX)))
  return (bits >= _U32(drop_threshold(rate))).reshape(shape)


def dropout(x: jax.Array, rate: float, seed, broadcast_dims: Sequence[int] = ()) -> jax.Array:
  """`where(keep, x / (1 - rate), 0)` in `x`'s dtype (scaled in float32, rounded once); the
  mask is shared along `broadcast_dims` (as `flax.linen.Dropout`'s) and recomputed, not
  kept, for the backward. Rate 1 gives zeros."""
  if rate == 1.0:
    return jnp.zeros_like(x)
  drop_threshold(rate)  # checks the rate
  if rate == 0.0:
    return x
  axes = _axes(broadcast_dims, x.ndim)
  mask_shape = tuple(1 if axis in axes else d for axis, d in enumerate(x.shape))
  scale = 1.0 / (1.0 - rate)

  @jax.checkpoint
  def apply(x, seed):
    keep = jnp.broadcast_to(keep_mask(seed, mask_shape, rate), x.shape)
    return jnp.where(keep, x.astype(jnp.float32) * scale, 0.0).astype(x.dtype)

  return apply(x, jnp.asarray(seed, _U32))


def seed_from_key(key: jax.Array) -> jax.Array:
  """One uint32 word from a JAX PRNG key (typed or raw)."""
  return jax.random.bits(key, (), _U32)


def _axes(dims: Sequence[int], ndim: int) -> set[int]:
  """`broadcast_dims` as non-negative axes; one outside `[-ndim, ndim)` is an error."""
  for d in dims:
    if not -ndim <= d < ndim:
      raise IndexError(f"dropout: broadcast dimension {d} is out of range for an array of "
                       f"{ndim} dimensions")
  return {d % ndim for d in dims}


class Dropout(nn.Module):
  """`flax.linen.Dropout`'s interface and semantics (inverted dropout, `broadcast_dims`,
  `deterministic` at construction or call, rate 1 gives zeros, the `dropout` RNG stream),
  with the hashed mask of `dropout`."""
  rate: float
  broadcast_dims: Sequence[int] = ()
  deterministic: bool | None = None
  rng_collection: str = "dropout"

  @nn.compact
  def __call__(self, inputs: jax.Array, deterministic: bool | None = None,
               rng: jax.Array | None = None) -> jax.Array:
    deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
    if self.rate == 0.0 or deterministic:
      return inputs
    if self.rate == 1.0:
      return jnp.zeros_like(inputs)
    if rng is None:
      rng = self.make_rng(self.rng_collection)
    return dropout(inputs, self.rate, seed_from_key(rng), self.broadcast_dims)
