"""Dense attention: the pure function and the modules against plain numpy references."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flaxdoc.nn.attention import (BIG_NEG, DenseSelfAttention, MultiHeadAttention,
                                  dot_product_attention, make_attention_mask, masked_softmax)


def _np_attention(q, k, v, bias=None, mask=None):
  """Loop reference: q [B, Q, H, D], k/v [B, K, H, D], bias/mask [B, H, Q, K]."""
  b, nq, h, d = q.shape
  nk = k.shape[1]
  out = np.zeros((b, nq, h, v.shape[-1]), np.float64)
  for bi in range(b):
    for hi in range(h):
      for i in range(nq):
        scores, keys = [], []
        for j in range(nk):
          if mask is not None and not mask[bi, hi, i, j]:
            continue
          s = float(np.dot(q[bi, i, hi], k[bi, j, hi])) / np.sqrt(d)
          if bias is not None:
            s += float(bias[bi, hi, i, j])
          scores.append(s)
          keys.append(j)
        if not keys:
          continue  # fully masked row: zeros
        scores = np.array(scores)
        w = np.exp(scores - scores.max())
        w /= w.sum()
        for wj, j in zip(w, keys):
          out[bi, i, hi] += wj * v[bi, j, hi]
  return out


def _rand(rng, *shape):
  return rng.normal(size=shape).astype(np.float32)


def test_dot_product_attention_matches_loop_reference():
  rng = np.random.default_rng(0)
  b, nq, nk, h, d = 2, 5, 7, 3, 4
  q, k, v = _rand(rng, b, nq, h, d), _rand(rng, b, nk, h, d), _rand(rng, b, nk, h, d)
  bias = _rand(rng, b, h, nq, nk)
  mask = rng.random((b, h, nq, nk)) < 0.7
  mask[1, 2, 3, :] = False  # one fully masked row
  got = jax.jit(dot_product_attention)(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                       bias=jnp.asarray(bias), mask=jnp.asarray(mask))
  want = _np_attention(q, k, v, bias, mask)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
  assert np.all(np.asarray(got)[1, 3, 2] == 0.0)


def test_dot_product_attention_leading_dims_and_broadcast_mask():
  # Extra leading dims (as ETC blocks) and a head-broadcast mask [B, 1, Q, K].
  rng = np.random.default_rng(1)
  q, k, v = _rand(rng, 2, 3, 4, 2, 5), _rand(rng, 2, 3, 6, 2, 5), _rand(rng, 2, 3, 6, 2, 5)
  mask = rng.random((2, 3, 1, 4, 6)) < 0.6
  got = np.asarray(jax.jit(dot_product_attention)(jnp.asarray(q), jnp.asarray(k),
                                                  jnp.asarray(v), mask=jnp.asarray(mask)))
  for i in range(3):
    want = _np_attention(q[:, i], k[:, i], v[:, i], None,
                         np.broadcast_to(mask[:, i], (2, 2, 4, 6)))
    np.testing.assert_allclose(got[:, i], want, rtol=1e-5, atol=1e-5)


def test_masked_softmax_no_nan_and_masked_bias_cannot_leak():
  logits = jnp.array([[1.0, 2.0, 3.0], [0.5, 0.1, -0.3]])
  mask = jnp.array([[True, False, True], [False, False, False]])
  w = jax.jit(masked_softmax)(logits, mask)
  assert float(w[0, 1]) == 0.0
  np.testing.assert_allclose(float(w[0, 0]), np.exp(1) / (np.exp(1) + np.exp(3)), rtol=1e-6)
  np.testing.assert_allclose(float(w[0, 2]), np.exp(3) / (np.exp(1) + np.exp(3)), rtol=1e-6)
  assert np.all(np.asarray(w[1]) == 0.0)
  # An infinite bias on masked pairs changes nothing, and gradients stay finite.
  rng = np.random.default_rng(2)
  q, k, v = (jnp.asarray(_rand(rng, 1, 4, 2, 3)) for _ in range(3))
  mask = jnp.asarray(rng.random((1, 2, 4, 4)) < 0.5).at[0, 0, 1].set(False)
  bias_bad = jnp.where(mask, 0.0, -jnp.inf)
  bias_bad = bias_bad.at[0, 1, 0, :].set(jnp.where(mask[0, 1, 0], 0.0, jnp.inf))
  attend = jax.jit(dot_product_attention)
  out_ref = attend(q, k, v, mask=mask)
  out_bad = attend(q, k, v, bias=bias_bad, mask=mask)
  np.testing.assert_allclose(np.asarray(out_bad), np.asarray(out_ref), rtol=1e-6, atol=1e-6)
  grads = jax.jit(jax.grad(lambda q, k, v: attend(q, k, v, bias=bias_bad, mask=mask).sum(),
                           argnums=(0, 1, 2)))(q, k, v)
  assert all(bool(jnp.isfinite(g).all()) for g in grads)
  assert BIG_NEG < -1e8


def test_make_attention_mask_documents():
  valid = jnp.array([[True, True, True, False]])
  docs = jnp.array([[0, 0, 1, 1]])
  m = np.asarray(make_attention_mask(valid, valid, docs, docs))[0, 0]
  want = np.array([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]], bool)
  np.testing.assert_array_equal(m, want)
  with pytest.raises(ValueError, match="both"):
    make_attention_mask(valid, valid, docs, None)


def _unboxed(variables):
  return nn.unbox(variables)["params"]


def _np_mha(params, x_q, x_kv, bias=None, mask=None):
  """numpy MHA from the parameter tree (independent of Flax)."""
  p = jax.tree_util.tree_map(np.asarray, params)
  q = np.einsum("bqe,ehd->bqhd", x_q, p["query"]["kernel"]) + p["query"]["bias"]
  k = np.einsum("bke,ehd->bkhd", x_kv, p["key"]["kernel"]) + p["key"]["bias"]
  v = np.einsum("bke,ehd->bkhd", x_kv, p["value"]["kernel"]) + p["value"]["bias"]
  ctx = _np_attention(q, k, v, bias, mask)
  return np.einsum("bqhd,hde->bqe", ctx, p["out"]["kernel"]) + p["out"]["bias"], q, k


def test_multi_head_attention_matches_numpy_with_term():
  rng = np.random.default_rng(3)
  b, nq, nk, e, h = 2, 4, 6, 8, 2
  x_q, x_kv = _rand(rng, b, nq, e), _rand(rng, b, nk, e)
  pos_q = rng.integers(0, 50, (b, nq))
  pos_k = rng.integers(0, 50, (b, nk))
  mask = rng.random((b, 1, nq, nk)) < 0.8

  def term(q, k, q_geom, k_geom):
    # Depends on q, k and geometry, like a real layout term: [..., H, Q, K].
    dist = jnp.abs(q_geom["positions"][..., :, None] - k_geom["positions"][..., None, :])
    qs = jnp.swapaxes(q.sum(-1), -1, -2)  # [..., H, Q]
    return 0.05 * qs[..., :, None] - 0.02 * dist[..., None, :, :]

  mha = MultiHeadAttention(num_heads=h)
  geom_q, geom_k = {"positions": jnp.asarray(pos_q)}, {"positions": jnp.asarray(pos_k)}
  variables = jax.jit(mha.init)(jax.random.key(0), x_q, x_kv)
  apply = jax.jit(functools.partial(mha.apply, terms=(term,)))
  got = apply(variables, jnp.asarray(x_q), jnp.asarray(x_kv), jnp.asarray(mask),
              q_geom=geom_q, k_geom=geom_k)
  params = _unboxed(variables)
  _, q, _ = _np_mha(params, x_q, x_kv)
  dist = np.abs(pos_q[:, :, None] - pos_k[:, None, :])
  bias = 0.05 * np.swapaxes(q.sum(-1), 1, 2)[..., None] - 0.02 * dist[:, None]
  want, _, _ = _np_mha(params, x_q, x_kv, bias, np.broadcast_to(mask, (b, h, nq, nk)))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)


def test_parameters_have_logical_axes():
  mha = MultiHeadAttention(num_heads=2, head_dim=3)
  variables = jax.eval_shape(mha.init, jax.random.key(0), jnp.zeros((1, 2, 5)))
  p = variables["params"]
  assert p["query"]["kernel"].names == ("embed", "heads", "kv")
  assert p["query"]["bias"].names == ("heads", "kv")
  assert p["out"]["kernel"].names == ("heads", "kv", "embed")
  assert p["out"]["kernel"].value.shape == (2, 3, 5)


def test_bad_term_shape_is_a_clear_error():
  mha = MultiHeadAttention(num_heads=2)
  x = jnp.ones((1, 3, 4))
  variables = jax.jit(mha.init)(jax.random.key(0), x)
  bad = lambda q, k, qg, kg: jnp.zeros((1, 5, 3, 3))  # noqa: E731
  with pytest.raises(ValueError, match="not broadcastable"):
    mha.apply(variables, x, terms=(bad,))


def test_dense_self_attention_padding_and_packing():
  rng = np.random.default_rng(4)
  e, h = 8, 2
  attn = DenseSelfAttention(num_heads=h)
  x = _rand(rng, 1, 7, e)
  variables = jax.jit(attn.init)(jax.random.key(0), jnp.asarray(x), jnp.ones((1, 7), bool))
  apply = jax.jit(functools.partial(attn.apply, variables))
  # Padding: real outputs ignore whatever padded tokens hold.
  mask = np.array([[1, 1, 1, 1, 1, 0, 0]], bool)
  x2 = x.copy()
  x2[0, 5:] = 100 * _rand(rng, 2, e)
  out1 = np.asarray(apply(jnp.asarray(x), jnp.asarray(mask)))
  out2 = np.asarray(apply(jnp.asarray(x2), jnp.asarray(mask)))
  np.testing.assert_allclose(out1[0, :5], out2[0, :5], rtol=1e-5, atol=1e-6)
  # Packing two documents equals running them separately.
  docs = jnp.array([[0, 0, 0, 1, 1, 1, 1]])
  packed = np.asarray(apply(jnp.asarray(x), jnp.ones((1, 7), bool),
                            geom={"document_ids": docs}))
  first = np.asarray(apply(jnp.asarray(x[:, :3]), jnp.ones((1, 3), bool)))
  second = np.asarray(apply(jnp.asarray(x[:, 3:]), jnp.ones((1, 4), bool)))
  np.testing.assert_allclose(packed, np.concatenate([first, second], 1), rtol=1e-5, atol=1e-6)
  # Same parameter tree as MultiHeadAttention, and the same numbers.
  mha_out = jax.jit(MultiHeadAttention(num_heads=h).apply)(variables, jnp.asarray(x))
  np.testing.assert_allclose(np.asarray(apply(jnp.asarray(x), jnp.ones((1, 7), bool))),
                             np.asarray(mha_out), rtol=1e-5, atol=1e-6)


def test_dense_self_attention_checks_geometry_shape():
  attn = DenseSelfAttention(num_heads=2)
  x, mask = jnp.ones((2, 3, 4)), jnp.ones((2, 3), bool)
  variables = jax.eval_shape(attn.init, jax.random.key(0), x, mask)
  with pytest.raises(ValueError, match="positions"):
    attn.apply(variables, x, mask, geom={"positions": jnp.zeros((2, 4))})


def test_dropout_and_bfloat16():
  rng = np.random.default_rng(5)
  x = jnp.asarray(_rand(rng, 2, 6, 8))
  mask = jnp.ones((2, 6), bool)
  attn = DenseSelfAttention(num_heads=2, dropout_rate=0.5)
  variables = jax.jit(attn.init)(jax.random.key(0), x, mask)
  det = jax.jit(attn.apply)(variables, x, mask)
  dropped = jax.jit(functools.partial(attn.apply, deterministic=False))
  # "rbg" keys: same semantics as the default, much quicker to compile on CPU.
  drop1 = dropped(variables, x, mask, rngs={"dropout": jax.random.key(1, impl="rbg")})
  drop2 = dropped(variables, x, mask, rngs={"dropout": jax.random.key(2, impl="rbg")})
  assert not np.allclose(np.asarray(drop1), np.asarray(det))
  assert not np.allclose(np.asarray(drop1), np.asarray(drop2))
  with pytest.raises(Exception, match="dropout"):
    jax.eval_shape(dropped, variables, x, mask)  # no dropout rng
  bf16 = DenseSelfAttention(num_heads=2, dtype=jnp.bfloat16)
  out = jax.jit(bf16.apply)(variables, x, mask)
  assert out.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(det), atol=0.05, rtol=0.05)
