"""ETC global-local attention against a windowed loop reference and dense attention."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flaxdoc.layout.relative import etc_membership_ids, etc_relative_ids
from flaxdoc.nn.attention import DenseSelfAttention, dot_product_attention, make_attention_mask
from flaxdoc.nn.etc_attention import (EtcAttention, global_local_attention, relative_vocab_size,
                                      three_blocks, with_global_tokens)

MD = 12  # ETC's clipping distance


def toy_term(q, k, q_geom, k_geom):
  """A term that depends on q, k and geometry, for any leading dims: [..., H, Q, K]."""
  qs = jnp.swapaxes(q.sum(-1), -1, -2)  # [..., H, Q]
  ks = jnp.swapaxes(k.mean(-1), -1, -2)  # [..., H, K]
  dx = q_geom["centers"][..., :, None, 0] - k_geom["centers"][..., None, :, 0]  # [..., Q, K]
  return 0.1 * qs[..., :, None] * ks[..., None, :] - 0.01 * jnp.abs(dx)[..., None, :, :]


def _softmax_out(logits, values):
  w = np.exp(np.array(logits) - max(logits))
  w /= w.sum()
  return sum(wi * vi for wi, vi in zip(w, values))


def etc_reference(ql, kl, vl, qg, kg, vg, lvalid, gvalid, radius, ldoc=None, gdoc=None,
                  term_full=None, table=None, bias=None, gids=None):
  """Plain loops over queries: the ETC attention pattern written out pair by pair."""
  b_, n, h_, d = ql.shape
  g_ = qg.shape[1]
  ldoc = np.zeros((b_, n), int) if ldoc is None else ldoc
  gdoc = np.zeros((b_, g_), int) if gdoc is None else gdoc
  gids_ = np.zeros((b_, n), int) if gids is None else gids

  def rel(qv, idx, h):
    if table is None:
      return 0.0
    return float(qv @ table[idx, h] + bias[idx, h])

  def member(b, j, g):
    return 2 * MD + 1 if (gids is None or gids_[b, j] == g) else 2 * MD + 2

  out_l = np.zeros(ql.shape)
  out_g = np.zeros(qg.shape)
  for b in range(b_):
    for h in range(h_):
      for i in range(n):
        if not lvalid[b, i]:
          continue
        logits, values = [], []
        for j in range(n):
          if abs(i - j) <= radius and lvalid[b, j] and ldoc[b, i] == ldoc[b, j]:
            s = (ql[b, i, h] @ kl[b, j, h] + rel(ql[b, i, h], np.clip(j - i, -MD, MD) + MD, h))
            s = s / np.sqrt(d) + (0.0 if term_full is None else term_full[b, h, i, j])
            logits.append(s)
            values.append(vl[b, j, h])
        for g in range(g_):
          if gvalid[b, g] and gdoc[b, g] == ldoc[b, i]:
            s = (ql[b, i, h] @ kg[b, g, h] + rel(ql[b, i, h], member(b, i, g), h)) / np.sqrt(d)
            logits.append(s)
            values.append(vg[b, g, h])
        if logits:
          out_l[b, i, h] = _softmax_out(logits, values)
      for g in range(g_):
        if not gvalid[b, g]:
          continue
        logits, values = [], []
        for g2 in range(g_):
          if gvalid[b, g2] and gdoc[b, g2] == gdoc[b, g]:
            idx = np.clip(g2 - g, -MD, MD) + MD
            logits.append((qg[b, g, h] @ kg[b, g2, h] + rel(qg[b, g, h], idx, h)) / np.sqrt(d))
            values.append(vg[b, g2, h])
        for j in range(n):
          if lvalid[b, j] and ldoc[b, j] == gdoc[b, g]:
            logits.append((qg[b, g, h] @ kl[b, j, h] + rel(qg[b, g, h], member(b, j, g), h))
                          / np.sqrt(d))
            values.append(vl[b, j, h])
        if logits:
          out_g[b, g, h] = _softmax_out(logits, values)
  return out_l, out_g


def _inputs(seed, b, g, n, h, d):
  rng = np.random.default_rng(seed)
  arrays = [rng.normal(size=(b, n, h, d)).astype(np.float32) for _ in range(3)]
  arrays += [rng.normal(size=(b, g, h, d)).astype(np.float32) for _ in range(3)]
  centers = rng.uniform(0, 1000, (b, n, 2)).astype(np.float32)
  table = (0.3 * rng.normal(size=(relative_vocab_size(MD), h, d))).astype(np.float32)
  bias = (0.3 * rng.normal(size=(relative_vocab_size(MD), h))).astype(np.float32)
  return rng, arrays, centers, table, bias


def test_three_blocks_layout():
  x = jnp.arange(1, 7).reshape(1, 3, 2)  # blocks [1 2] [3 4] [5 6]
  want = [[0, 0, 1, 2, 3, 4], [1, 2, 3, 4, 5, 6], [3, 4, 5, 6, 0, 0]]
  np.testing.assert_array_equal(np.asarray(three_blocks(x))[0], want)


def test_blocked_matches_windowed_reference():
  b, g, n, h, d, radius = 2, 2, 11, 2, 4, 2  # block 3: 4 blocks, one padded slot
  rng, (ql, kl, vl, qg, kg, vg), centers, table, bias = _inputs(0, b, g, n, h, d)
  lvalid = np.ones((b, n), bool)
  lvalid[1, 8:] = False  # padding at the end of row 1
  gvalid = np.array([[True, True], [True, False]])
  ldoc = np.array([[0] * 6 + [1] * 5, [0] * n])  # row 0 packs two documents
  gdoc = np.array([[0, 1], [0, 0]])
  gids = np.array([[0] * 6 + [1] * 5, [0] * 4 + [1] * 7])  # one global per "page"
  term_full = np.asarray(toy_term(jnp.asarray(ql), jnp.asarray(kl), {"centers": centers},
                                  {"centers": centers}))  # [B, H, N, N]

  fn = jax.jit(functools.partial(global_local_attention, local_radius=radius,
                                 terms=(toy_term,)))
  out_l, out_g = fn(ql, kl, vl, qg, kg, vg, lvalid, gvalid, long_document_ids=ldoc,
                    global_document_ids=gdoc, long_geom={"centers": centers},
                    relative_table=table, relative_bias=bias, long_global_ids=gids)
  want_l, want_g = etc_reference(ql, kl, vl, qg, kg, vg, lvalid, gvalid, radius, ldoc, gdoc,
                                 term_full, table, bias, gids)
  np.testing.assert_allclose(np.asarray(out_l), want_l, rtol=2e-4, atol=2e-5)
  np.testing.assert_allclose(np.asarray(out_g), want_g, rtol=2e-4, atol=2e-5)
  assert np.all(np.asarray(out_l)[1, 8:] == 0)  # padded queries give zeros
  assert np.all(np.asarray(out_g)[1, 1] == 0)


@pytest.mark.parametrize("radius", [0, 1])
def test_tiny_radius_without_globals(radius):
  b, g, n, h, d = 1, 0, 5, 1, 3
  _, (ql, kl, vl, qg, kg, vg), _, _, _ = _inputs(1, b, g, n, h, d)
  lvalid = np.ones((b, n), bool)
  out_l, out_g = global_local_attention(ql, kl, vl, qg, kg, vg, lvalid, np.ones((b, 0), bool),
                                        local_radius=radius)
  want_l, _ = etc_reference(ql, kl, vl, qg, kg, vg, lvalid, np.ones((b, 0), bool), radius)
  np.testing.assert_allclose(np.asarray(out_l), want_l, rtol=1e-5, atol=1e-6)
  assert out_g.shape == (b, 0, h, d)
  if radius == 0:  # each token sees only itself: its own value
    np.testing.assert_allclose(np.asarray(out_l), vl, rtol=1e-6)


def test_large_radius_equals_dense_attention():
  """The core check: r >= N gives dense attention over [globals; long] with the same terms."""
  b, g, n, h, d = 2, 1, 9, 2, 4
  rng, (ql, kl, vl, qg, kg, vg), centers, table, bias = _inputs(2, b, g, n, h, d)
  lvalid = np.ones((b, n), bool)
  lvalid[0, 6:] = False
  gvalid = np.ones((b, g), bool)
  out_l, out_g = jax.jit(functools.partial(global_local_attention, local_radius=n + 3,
                                           terms=(toy_term,)))(
      ql, kl, vl, qg, kg, vg, lvalid, gvalid, long_geom={"centers": centers},
      relative_table=table, relative_bias=bias)

  # Dense attention over T = G + N tokens, built with independent code.
  q = np.concatenate([qg, ql], 1)
  k = np.concatenate([kg, kl], 1)
  v = np.concatenate([vg, vl], 1)
  valid = np.concatenate([gvalid, lvalid], 1)
  pos_g, pos_l = np.arange(g), np.arange(n)
  owner_l, owner_g = np.zeros(n, int), np.arange(g)
  ids = np.zeros((g + n, g + n), int)
  ids[:g, :g] = etc_relative_ids(pos_g, pos_g, MD)
  ids[g:, g:] = etc_relative_ids(pos_l, pos_l, MD)
  ids[g:, :g] = etc_membership_ids(owner_l, owner_g, MD)
  ids[:g, g:] = etc_membership_ids(owner_g, owner_l, MD)
  # (q.r_id + b_id) / sqrt(d), by brute force over pairs.
  qr = np.einsum("bthd,vhd->bhtv", q, table) + bias.T[None, :, None, :]  # [B, H, T, V]
  rel_bias = np.take_along_axis(qr, np.broadcast_to(ids, (b, h) + ids.shape), -1) / np.sqrt(d)
  term = np.zeros((b, h, g + n, g + n), np.float32)
  term[:, :, g:, g:] = np.asarray(toy_term(jnp.asarray(ql), jnp.asarray(kl),
                                           {"centers": centers}, {"centers": centers}))
  mask = make_attention_mask(jnp.asarray(valid), jnp.asarray(valid))
  dense = np.asarray(dot_product_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                           bias=jnp.asarray(rel_bias + term), mask=mask))
  np.testing.assert_allclose(np.asarray(out_g), dense[:, :g], rtol=2e-4, atol=2e-5)
  np.testing.assert_allclose(np.asarray(out_l), dense[:, g:], rtol=2e-4, atol=2e-5)


def _random_params(module, x, mask, seed=0):
  """Random parameters (normal, stddev 0.3), shapes from `eval_shape` (no init compile)."""
  rng = np.random.default_rng(seed)
  shapes = nn.unbox(jax.eval_shape(module.init, jax.random.key(0), x, mask))
  return jax.tree_util.tree_map(lambda s: (0.3 * rng.normal(size=s.shape)).astype(np.float32),
                                shapes)


def _module_inputs(seed, b=2, g=1, n=10, e=8):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(b, g + n, e)).astype(np.float32)
  mask = np.ones((b, g + n), bool)
  mask[1, g + 7:] = False
  geom = {"centers": rng.uniform(0, 1000, (b, g + n, 2)).astype(np.float32),
          "positions": np.broadcast_to(np.arange(g + n) - g, (b, g + n)).astype(np.int32)}
  return rng, x, mask, geom


def test_module_with_large_radius_equals_dense_self_attention():
  _, x, mask, _ = _module_inputs(3)
  etc = EtcAttention(num_heads=2, local_radius=64, num_globals=1)
  variables = _random_params(etc, x, mask)
  got = jax.jit(etc.apply)(variables, x, mask)
  want = jax.jit(DenseSelfAttention(num_heads=2).apply)(variables, x, mask)
  rows = mask[..., None]
  np.testing.assert_allclose(np.asarray(got) * rows, np.asarray(want) * rows, rtol=1e-4, atol=1e-5)


def test_padding_never_changes_real_outputs_and_jit_compiles_once():
  rng, x, mask, geom = _module_inputs(4)
  etc = EtcAttention(num_heads=2, local_radius=2, num_globals=1, relative_positions=True)
  variables = _random_params(etc, x, mask)
  traces = []

  def run(v, x, mask, geom):
    traces.append(x.shape)
    return etc.apply(v, x, mask, terms=(toy_term,), geom=geom)

  run = jax.jit(run)
  base = np.asarray(run(variables, x, mask, geom))
  # Garbage in padded tokens (states and geometry).
  x2, geom2 = x.copy(), {k: v.copy() for k, v in geom.items()}
  x2[~mask] = 1e3 * rng.normal(size=(int((~mask).sum()), x.shape[-1]))
  geom2["centers"][~mask] = -5e4
  other = np.asarray(run(variables, x2, mask, geom2))
  np.testing.assert_allclose(other[mask], base[mask], rtol=1e-5, atol=1e-5)
  run(variables, x2 + 1.0, mask, geom2)
  assert len(traces) == 1  # same shapes: compiled once
  # More padding (a different block count) leaves real tokens unchanged too.
  pad = 5
  x3 = np.concatenate([x, rng.normal(size=(2, pad, x.shape[-1]))], 1).astype(np.float32)
  mask3 = np.concatenate([mask, np.zeros((2, pad), bool)], 1)
  geom3 = {k: np.concatenate([v, v[:, :pad]], 1) for k, v in geom.items()}
  longer = np.asarray(run(variables, x3, mask3, geom3))
  np.testing.assert_allclose(longer[:, :x.shape[1]][mask], base[mask], rtol=1e-5, atol=1e-5)
  assert len(traces) == 2


def _all_avals(jaxpr):
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      yield var.aval
    for param in eqn.params.values():
      for sub in (param if isinstance(param, (list, tuple)) else [param]):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          yield from _all_avals(inner)


def test_memory_is_linear_in_length():
  n, radius, g = 128, 3, 1
  q = jnp.zeros((1, n, 1, 2))
  qg = jnp.zeros((1, g, 1, 2))
  centers = jnp.zeros((1, n, 2))
  table = jnp.zeros((relative_vocab_size(MD), 1, 2))
  bias = jnp.zeros((relative_vocab_size(MD), 1))
  fn = functools.partial(global_local_attention, local_radius=radius, terms=(toy_term,),
                         long_document_ids=jnp.zeros((1, n), int),
                         global_document_ids=jnp.zeros((1, g), int))
  jaxpr = jax.make_jaxpr(lambda *a: fn(*a, long_geom={"centers": centers}, relative_table=table,
                                       relative_bias=bias))(
      q, q, q, qg, qg, qg, jnp.ones((1, n), bool), jnp.ones((1, g), bool))
  biggest = max(int(np.prod(a.shape)) for a in _all_avals(jaxpr.jaxpr) if hasattr(a, "shape"))
  # l2l logits are N * 3b = 1536 here, q @ table N * 27; an N x N array would be 16384.
  assert biggest < n * n // 4, biggest


def test_gradients_are_finite_with_padding_and_empty_rows():
  b, g, n, h, d = 1, 2, 7, 2, 3
  _, (ql, kl, vl, qg, kg, vg), centers, table, bias = _inputs(5, b, g, n, h, d)
  lvalid = np.array([[True] * 4 + [False] * 3])
  gvalid = np.array([[True, False]])

  def loss(ql, kl, vl, table):
    out_l, out_g = global_local_attention(ql, kl, vl, qg, kg, vg, lvalid, gvalid,
                                          local_radius=1, terms=(toy_term,),
                                          long_geom={"centers": centers},
                                          relative_table=table, relative_bias=bias)
    return (out_l ** 2).sum() + (out_g ** 2).sum()

  grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(ql, kl, vl, table)
  for grad in grads:
    assert np.all(np.isfinite(np.asarray(grad)))
  # Padded keys get no gradient.
  assert np.all(np.asarray(grads[1])[0, 4:] == 0)


def test_attention_dropout():
  _, x, mask, _ = _module_inputs(6)
  etc = EtcAttention(num_heads=2, local_radius=2, dropout_rate=0.5)
  variables = _random_params(etc, x, mask)
  det = np.asarray(jax.jit(etc.apply)(variables, x, mask))
  dropped = jax.jit(functools.partial(etc.apply, deterministic=False))
  out = np.asarray(dropped(variables, x, mask, rngs={"dropout": jax.random.key(1, impl="rbg")}))
  assert np.all(np.isfinite(out)) and not np.allclose(out, det)
  with pytest.raises(Exception, match="dropout"):
    jax.eval_shape(dropped, variables, x, mask)


def test_with_global_tokens_layout():
  x = jnp.ones((2, 5, 4))
  gx = jnp.zeros((2, 3, 4))
  geom = {"centers": jnp.ones((2, 5, 2)), "document_ids": jnp.ones((2, 5), jnp.int32)}
  out_x, out_mask, out_geom = with_global_tokens(
      gx, jnp.ones((2, 3), bool), x, jnp.ones((2, 5), bool), geom,
      {"document_ids": jnp.full((2, 3), 7, jnp.int32)})
  assert out_x.shape == (2, 8, 4) and out_mask.shape == (2, 8)
  np.testing.assert_array_equal(np.asarray(out_geom["document_ids"])[0], [7] * 3 + [1] * 5)
  np.testing.assert_array_equal(np.asarray(out_geom["centers"])[0, :3], 0)
  with pytest.raises(ValueError, match="not in geom"):
    with_global_tokens(gx, jnp.ones((2, 3), bool), x, jnp.ones((2, 5), bool), geom,
                       {"boxes": jnp.zeros((2, 3, 4))})


def test_clear_errors():
  etc = EtcAttention(num_heads=2, local_radius=2, num_globals=2)
  with pytest.raises(ValueError, match="no long token"):
    jax.eval_shape(etc.init, jax.random.key(0), jnp.ones((1, 2, 4)), jnp.ones((1, 2), bool))
  with pytest.raises(ValueError, match="mask"):
    jax.eval_shape(etc.init, jax.random.key(0), jnp.ones((1, 5, 4)), jnp.ones((1, 4), bool))
  q = jnp.zeros((1, 4, 1, 2))
  with pytest.raises(ValueError, match="together"):
    global_local_attention(q, q, q, q[:, :1], q[:, :1], q[:, :1], jnp.ones((1, 4), bool),
                           jnp.ones((1, 1), bool), local_radius=1,
                           long_document_ids=jnp.zeros((1, 4), int))
