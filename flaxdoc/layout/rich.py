"""FormNet's Rich Attention term (DESIGN §3.2, FormNet eqs. 1-4).

For each head and each axis `a` (x, y, optionally the sequence index), with
`c_i` the coordinate of token `i` on that axis (box centre, 0-1000 units, pages
stacked):

* actual order `o_ij = 1[c_i < c_j]` and log-distance `d_ij = ln(1 + |c_i - c_j|)`;
* predicted order logit `z_ij = (w_q . q_i + b) + w_k . k_j` and predicted
  log-distance `mu_ij = (v_q . q_i + c) + v_k . k_j` - affine functions of the
  per-head query and key (FormNet footnote 5), so each is an *outer sum* of a
  per-query and a per-key scalar;
* `s_o = o log sigmoid(z) + (1 - o) log sigmoid(-z)` (sigmoid cross-entropy of
  the predicted against the actual order) and `s_d = -theta^2 (d - mu)^2 / 2`;
* the term added to `q.k / sqrt(d)` is `sum_a (s_o + s_d)`.

The caller (the attention layer, which owns `w_q, w_k, b, v_q, v_k, c, theta`)
computes the per-token scalars with `rich_projection_scalars`; this module
never sees a `[Q, K, head_dim]` tensor - only `[..., H, Q, K]` per axis.
Global tokens have no box: the caller applies no Rich term to pairs that
involve them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from flaxdoc.layout.geometry import check_pair_shapes

__all__ = ["rich_projection_scalars", "rich_axis_coordinates", "rich_attention_logits"]


def rich_projection_scalars(q, w, b=None) -> jnp.ndarray:
  """Per-head, per-axis affine scalars `w[h, :, a] . q[..., i, h, :] + b[h, a]`: `[..., H, Q, A]`.

  Args:
    q: `[..., Q, H, D]` per-head queries (or keys).
    w: `[H, D, A]` one weight vector per head and axis.
    b: optional `[H, A]` bias (the query side carries the affine bias in
      FormNet; pass None for the key side).
  """
  if np.ndim(q) < 3 or np.ndim(w) != 3 or np.shape(w)[:2] != np.shape(q)[-2:]:
    raise ValueError(f"q must be [..., Q, H, D] and w [H, D, A]; got {list(np.shape(q))} and "
                     f"{list(np.shape(w))}")
  # A product with A (2-6) outputs a head, written as a multiply and a sum so that the
  # widening of a bfloat16 `q` to `w`'s float32 happens inside the reduction: as an
  # einsum of `q.astype(float32)`, XLA on an H100 wrote float32 copies of the queries and
  # keys (0.2 GB a layer at FormNet-A2's 16 x 1,024 pre-training batch) for a GEMM with
  # four columns. The same sums in float32 (the order of the D terms may differ).
  dtype = jnp.promote_types(jnp.result_type(q), jnp.result_type(w))
  out = jnp.sum(jnp.asarray(q, dtype)[..., None] * jnp.asarray(w, dtype), axis=-2)  # [..., Q, H, A]
  out = jnp.swapaxes(out, -3, -2)  # [..., H, Q, A]
  if b is not None:
    if np.shape(b) != (np.shape(w)[0], np.shape(w)[2]):
      raise ValueError(f"b must be [H, A] = {[np.shape(w)[0], np.shape(w)[2]]}, got "
                       f"{list(np.shape(b))}")
    out = out + jnp.asarray(b, out.dtype)[:, None, :]  # [..., H, Q, A]
  return out


def rich_axis_coordinates(centers, positions=None) -> jnp.ndarray:
  """Centres `[..., N, 2]` (+ sequence positions `[..., N]`) -> Rich Attention axes `[..., N, A]`.

  A = 2 (x, y) without `positions`, 3 (x, y, sequence index) with them.
  """
  c = jnp.asarray(centers, jnp.float32)  # [..., N, 2]
  if c.ndim < 2 or c.shape[-1] != 2:
    raise ValueError(f"centers must be [..., N, 2], got {list(c.shape)}")
  if positions is None:
    return c
  p = jnp.asarray(positions, jnp.float32)  # [..., N]
  if p.shape != c.shape[:-1]:
    raise ValueError(f"positions must be {list(c.shape[:-1])}, got {list(p.shape)}")
  return jnp.concatenate([c, p[..., None]], axis=-1)  # [..., N, 3]


def rich_attention_logits(order_q, order_k, dist_q, dist_k, theta, coord_q,
                          coord_k) -> jnp.ndarray:
  """The Rich Attention term `sum_a (s_o + s_d)` for every head and pair: `[..., H, Q, K]`.

  Args:
    order_q: `[..., H, Q, A]` per-query order scalars `w_q . q_i + b`.
    order_k: `[..., H, K, A]` per-key order scalars `w_k . k_j`.
    dist_q: `[..., H, Q, A]` per-query log-distance scalars `v_q . q_i + c`.
    dist_k: `[..., H, K, A]` per-key log-distance scalars `v_k . k_j`.
    theta: `[H, A]` learned precision per head and axis (`[H]`: shared by axes).
    coord_q: `[..., Q, A]` query coordinates per axis (`rich_axis_coordinates`).
    coord_k: `[..., K, A]` key coordinates per axis.

  Returns:
    `[..., H, Q, K]` in the dtype of the scalars, to add to the scaled `q.k`.
    Always `<= 0`; differentiable in all scalars and `theta`.
  """
  oq, ok = jnp.asarray(order_q), jnp.asarray(order_k)
  dq, dk = jnp.asarray(dist_q), jnp.asarray(dist_k)
  cq = jnp.asarray(coord_q, jnp.float32)  # [..., Q, A]
  ck = jnp.asarray(coord_k, jnp.float32)  # [..., K, A]
  check_pair_shapes(cq, ck, "coord_q", "coord_k")
  num_axes = cq.shape[-1]
  if ck.shape[-1] != num_axes:
    raise ValueError(f"coord_q and coord_k must have the same number of axes, got "
                     f"{list(cq.shape)} and {list(ck.shape)}")
  for name, x, n in (("order_q", oq, cq.shape[-2]), ("dist_q", dq, cq.shape[-2]),
                     ("order_k", ok, ck.shape[-2]), ("dist_k", dk, ck.shape[-2])):
    if x.ndim < 3 or x.shape[-1] != num_axes or x.shape[-2] != n:
      raise ValueError(f"{name} must be [..., H, {n}, {num_axes}], got {list(x.shape)}")
  heads = oq.shape[-3]
  th = jnp.asarray(theta, oq.dtype)
  if th.ndim == 1:
    th = jnp.broadcast_to(th[:, None], (th.shape[0], num_axes))  # [H, A]
  if th.shape != (heads, num_axes):
    raise ValueError(f"theta must be [H, A] = {[heads, num_axes]} (or [H]), got {list(th.shape)}")

  total = None
  # One axis at a time: never a [..., H, Q, K, A] tensor.
  for a in range(num_axes):
    ci = cq[..., :, None, a]  # [..., Q, 1]
    cj = ck[..., None, :, a]  # [..., 1, K]
    order = (ci < cj)[..., None, :, :]  # [..., 1, Q, K]
    log_dist = jnp.log1p(jnp.abs(ci - cj))[..., None, :, :].astype(oq.dtype)  # [..., 1, Q, K]
    z = oq[..., :, None, a] + ok[..., None, :, a]  # [..., H, Q, K]
    # o log sigmoid(z) + (1 - o) log sigmoid(-z), with o in {0, 1}.
    s_order = jax.nn.log_sigmoid(jnp.where(order, z, -z))  # [..., H, Q, K]
    mu = dq[..., :, None, a] + dk[..., None, :, a]  # [..., H, Q, K]
    t2 = jnp.square(th[:, a])[:, None, None]  # [H, 1, 1]
    s_dist = -0.5 * t2 * jnp.square(log_dist - mu)  # [..., H, Q, K]
    term = s_order + s_dist  # [..., H, Q, K]
    total = term if total is None else total + term
  return total
