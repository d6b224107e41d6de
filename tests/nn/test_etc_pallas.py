"""The fused ETC + Rich Attention kernel (Pallas, interpreted on CPU) against dense references.

The reference builds the full `[N, N]` scores with the radius as a mask (not ETC's
blocks), the Rich term with `jax.nn.log_sigmoid`, and takes gradients by autodiff;
the kernel has its own hand-written backward. The XLA blocked path is checked too.
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flaxdoc.bench import kernel_sass
from flaxdoc.layout import rich as rich_lib
from flaxdoc.models.document_encoder import EncoderSpec
from flaxdoc.nn import etc_pallas as ep
from flaxdoc.nn import pallas_backend
from flaxdoc.nn.etc_attention import EtcAttention, global_local_attention
from flaxdoc.nn.layout_terms import RichAttentionTerm

SMALL = ep.Tiles(16, 16, 4, 16, 16, 4)
MIXED = ep.Tiles(16, 32, 4, 32, 16, 4)  # forward and backward tile the sequence differently


def dense_reference(q, k, v, kg, vg, lvalid, gvalid, radius, ldoc=None, gdoc=None, rich=None,
                    rate=0.0, seed=0):
  """All `[N, N]` pairs, masked to `|i - j| <= r`, plus the globals; one softmax."""
  b_, n, h_, d = q.shape
  g_ = kg.shape[1]
  ldoc = jnp.zeros((b_, n), jnp.int32) if ldoc is None else ldoc
  gdoc = jnp.zeros((b_, g_), jnp.int32) if gdoc is None else gdoc
  s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)  # [B, H, N, N]
  if rich is not None:
    oq, ok, dq, dk, theta, c = rich
    for a in range(oq.shape[-1]):
      z = oq[..., :, None, a] + ok[..., None, :, a]  # [B, H, N, N]
      ci, cj = c[:, None, :, None, a], c[:, None, None, :, a]
      resid = jnp.log1p(jnp.abs(ci - cj)) - (dq[..., :, None, a] + dk[..., None, :, a])
      s = s + jax.nn.log_sigmoid(jnp.where(ci < cj, z, -z))
      s = s - 0.5 * theta[:, a, None, None] ** 2 * resid ** 2
  i = jnp.arange(n)
  local = ((jnp.abs(i[:, None] - i[None, :]) <= radius)[None]
           & lvalid[:, :, None] & lvalid[:, None, :] & (ldoc[:, :, None] == ldoc[:, None, :]))
  sg = jnp.einsum("bqhd,bghd->bhqg", q, kg) / math.sqrt(d)  # [B, H, N, G]
  gmask = lvalid[:, :, None] & gvalid[:, None, :] & (ldoc[:, :, None] == gdoc[:, None, :])
  logits = jnp.concatenate([sg, s], -1)
  mask = jnp.concatenate([gmask, local], -1)[:, None]  # [B, 1, N, G + N]
  logits = jnp.where(mask, logits, -jnp.inf)
  m = jnp.max(jnp.where(mask, logits, -1e30), -1, keepdims=True)
  e = jnp.where(mask, jnp.exp(logits - m), 0.0)
  w = e / jnp.maximum(e.sum(-1, keepdims=True), 1e-30)
  if rate:
    bh = jnp.arange(b_)[:, None] * h_ + jnp.arange(h_)[None, :]  # [B, H]
    keys = jnp.concatenate([ep.GLOBAL_KEY_ID + jnp.arange(g_), i])
    keep = ep.dropout_keep(seed, bh[:, :, None, None], i[:, None], keys[None, :], rate)
    w = jnp.where(keep, w / (1.0 - rate), 0.0)
  return (jnp.einsum("bhqg,bghd->bqhd", w[..., :g_], vg)
          + jnp.einsum("bhqk,bkhd->bqhd", w[..., g_:], v))


def problem(b=2, n=70, h=2, d=16, g=2, axes=2, seed=0):
  # Drawn with numpy: jax.random compiles its draws (~5 s a problem on a 2-core CPU).
  rng = np.random.default_rng(seed)
  normal = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa: E731
  q, k, v = (normal(b, n, h, d) for _ in range(3))
  kg, vg = (normal(b, g, h, d) for _ in range(2))
  rich = (0.5 * normal(b, h, n, axes), 0.5 * normal(b, h, n, axes), normal(b, h, n, axes),
          normal(b, h, n, axes), (0.3 + rng.uniform(size=(h, axes))).astype(np.float32))
  coords = np.round(rng.uniform(size=(b, n, axes)) * 60).astype(np.float32)  # ties on purpose
  lvalid = np.arange(n)[None] < np.array([n, n - 23])[:b, None]
  gvalid = np.ones((b, g), bool)
  gvalid[-1, -1] = g < 2  # one invalid global when g >= 2
  # Two packed documents in row 0, with ids 0 and -1 (any int32 is an id), one in row 1.
  ldoc = -(np.arange(n)[None] >= n // 2).astype(np.int32) * np.array([1, 0], np.int32)[:b, None]
  gdoc = -np.minimum(np.arange(g), 1)[None].repeat(b, 0).astype(np.int32)
  ct = normal(b, n, h, d) * lvalid[..., None, None]
  return jax.tree.map(jnp.asarray, dict(q=q, k=k, v=v, kg=kg, vg=vg, rich=rich, coords=coords,
                                        lvalid=lvalid, gvalid=gvalid, ldoc=ldoc, gdoc=gdoc,
                                        ct=ct))


# Differentiable inputs; `rich` is (order_q, order_k, dist_q, dist_k, theta). The
# coordinates are geometry: constants for the kernel (no gradient flows to them).
DIFF = ("q", "k", "v", "kg", "vg", "rich")


def kernel_fn(p, radius, tiles, docs=True, use_rich=True, rate=0.0, seed=None):
  def f(q, k, v, kg, vg, rich):
    return ep.long_query_attention(
        q, k, v, kg, vg, p["lvalid"], p["gvalid"], local_radius=radius,
        long_document_ids=p["ldoc"] if docs else None,
        global_document_ids=p["gdoc"] if docs else None,
        rich=rich + (p["coords"],) if use_rich else None, dropout_rate=rate,
        dropout_seed=seed, tiles=tiles, interpret=True)
  return f


def reference_fn(p, radius, docs=True, use_rich=True, rate=0.0, seed=0):
  def f(q, k, v, kg, vg, rich):
    return dense_reference(q, k, v, kg, vg, p["lvalid"], p["gvalid"], radius,
                           p["ldoc"] if docs else None, p["gdoc"] if docs else None,
                           rich + (p["coords"],) if use_rich else None, rate, seed)
  return f


def value_and_grads(f, p):
  @jax.jit  # one compile instead of many small op-by-op ones
  def run(args, ct):
    out, vjp = jax.vjp(f, *args)
    return out, vjp(ct)
  return run(tuple(p[name] for name in DIFF), p["ct"])


def assert_tree_close(a, b, rtol=2e-5, atol=2e-5, what=""):
  for i, (x, y) in enumerate(zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol,
                               err_msg=f"{what} leaf {i}")


@pytest.mark.parametrize("tiles", [pytest.param(SMALL, marks=pytest.mark.slow), MIXED],
                         ids=["16x16", "mixed"])
def test_values_and_gradients_match_the_dense_reference(tiles):
  # A radius larger than every tile (as FormNet's 84 against tiles of 32 and 64): the
  # windows span several key tiles and several query tiles see each key tile.
  p = problem()
  out, grads = value_and_grads(kernel_fn(p, 37, tiles), p)
  ref_out, ref_grads = value_and_grads(reference_fn(p, 37), p)
  assert_tree_close(out, ref_out, what="output")
  for name, g, rg in zip(DIFF, grads, ref_grads):
    assert_tree_close(g, rg, rtol=1e-4, atol=1e-4, what=f"d {name}")
  # Padded queries get zeros; every gradient is finite.
  assert np.all(np.asarray(out)[1, -23:] == 0)
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(grads))


def test_bfloat16_gradients_come_back_in_bfloat16_and_near_the_reference():
  # The bf16 path end to end (its backward kernels write dq, dk, dv in bf16): gradients
  # in bf16, within bf16 rounding of the float32 reference.
  p = problem(n=40)
  for name in ("q", "k", "v", "kg", "vg"):
    p[name] = p[name].astype(jnp.bfloat16)
  out, grads = value_and_grads(kernel_fn(p, 7, MIXED), dict(p, ct=p["ct"].astype(jnp.bfloat16)))
  as32 = {name: p[name].astype(jnp.float32) for name in ("q", "k", "v", "kg", "vg")}
  as32["ct"] = p["ct"].astype(jnp.bfloat16).astype(jnp.float32)  # the same cotangent
  ref_out, ref_grads = value_and_grads(reference_fn(dict(p, **as32), 7), dict(p, **as32))
  assert out.dtype == jnp.bfloat16
  for name, g, rg in zip(DIFF, grads, ref_grads):
    if name != "rich":
      assert g.dtype == jnp.bfloat16, name
    assert_tree_close(jax.tree.map(lambda x: x.astype(jnp.float32), g), rg, rtol=3e-2,
                      atol=3e-2, what=f"d {name}")


@pytest.mark.slow
def test_matches_the_xla_blocked_path_with_the_rich_term():
  p = problem(g=1)
  oq, ok, dq, dk, theta = p["rich"]
  coords = p["coords"]

  per_token = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731  [B, H, N, A] -> [B, N, H, A]
  geom = {"oq": per_token(oq), "ok": per_token(ok), "dq": per_token(dq), "dk": per_token(dk),
          "c": coords}

  def blocked_term(qb, kb, qgeom, kgeom):  # the XLA path's blocked term, same scalars
    back = lambda x: jnp.swapaxes(x, -2, -3)  # noqa: E731  [..., N, H, A] -> [..., H, N, A]
    return rich_lib.rich_attention_logits(back(qgeom["oq"]), back(kgeom["ok"]),
                                           back(qgeom["dq"]), back(kgeom["dk"]), theta,
                                           qgeom["c"], kgeom["c"])

  xla, _ = global_local_attention(
      p["q"], p["k"], p["v"], p["q"][:, :1], p["kg"], p["vg"], p["lvalid"], p["gvalid"],
      local_radius=9, long_document_ids=p["ldoc"], global_document_ids=p["gdoc"],
      terms=[blocked_term], long_geom=geom)
  out = kernel_fn(p, 9, SMALL)(*(p[name] for name in DIFF))
  np.testing.assert_allclose(np.asarray(out), np.asarray(xla), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("g", [pytest.param(1, marks=pytest.mark.slow), 16])
def test_without_rich_or_documents_and_one_or_sixteen_globals(g):
  # 1 global: its dk / dv partial sums are written as one row; 16: as the whole tile.
  p = problem(b=1, n=40, g=g)
  out, grads = value_and_grads(kernel_fn(p, 5, MIXED, docs=False, use_rich=False), p)
  ref_out, ref_grads = value_and_grads(reference_fn(p, 5, docs=False, use_rich=False), p)
  assert_tree_close(out, ref_out)
  for name, g, rg in zip(DIFF[:5], grads[:5], ref_grads[:5]):
    assert_tree_close(g, rg, rtol=1e-4, atol=1e-4, what=f"d {name}")


def test_dropout_matches_the_reference_with_the_same_keep_mask():
  p = problem(n=40)
  p["lvalid"] = p["lvalid"].at[1].set(False)  # a row with no valid token: zeros, finite grads
  seed = jnp.array([1234], jnp.int32)
  f = kernel_fn(p, 7, MIXED, rate=0.3, seed=seed)
  out, grads = value_and_grads(f, p)
  ref_out, ref_grads = value_and_grads(reference_fn(p, 7, rate=0.3, seed=1234), p)
  assert_tree_close(out, ref_out)
  for name, g, rg in zip(DIFF, grads, ref_grads):
    assert_tree_close(g, rg, rtol=1e-4, atol=1e-4, what=f"d {name}")
  assert np.all(np.asarray(out)[1] == 0)
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(grads))
  no_dropout = kernel_fn(p, 7, MIXED)(*(p[name] for name in DIFF))
  assert not np.allclose(np.asarray(out), np.asarray(no_dropout))
  other_seed = kernel_fn(p, 7, MIXED, rate=0.3, seed=seed + 1)(*(p[name] for name in DIFF))
  assert not np.allclose(np.asarray(out), np.asarray(other_seed))


def test_dropout_keep_mask_statistics():
  i = jnp.arange(512)[:, None]
  j = jnp.arange(512)[None, :]
  a = np.asarray(ep.dropout_keep(7, 3, i, j, 0.1))
  assert abs(a.mean() - 0.9) < 0.005  # 262,144 pairs: 6 standard deviations
  assert np.array_equal(a, np.asarray(ep.dropout_keep(7, 3, i, j, 0.1)))  # a pure function
  for other in (ep.dropout_keep(8, 3, i, j, 0.1), ep.dropout_keep(7, 4, i, j, 0.1),
                ep.dropout_keep(7, 3, j, i, 0.1)):
    both = (a & np.asarray(other)).mean()
    assert abs(both - 0.81) < 0.005  # independent streams: P(keep, keep) = 0.9^2
  assert np.asarray(ep.dropout_keep(7, 3, i, j, 0.0)).all()
  assert abs(np.asarray(ep.dropout_keep(7, 3, i, j, 0.5)).mean() - 0.5) < 0.005


@pytest.mark.parametrize("kwargs, message", [
    (dict(dropout_rate=0.1), "needs dropout_seed"),
    (dict(dropout_rate=1.0, dropout_seed=np.zeros(1, np.int32)),
     r"dropout_rate must be in \[0, 1\)"),
    (dict(local_radius=-1), "local_radius must be >= 0"),
    (dict(long_document_ids=np.zeros((1, 20), np.int32)), "together"),
    (dict(tiles=ep.Tiles(block_q=24)), "tiles.block_q must be a power of two"),
])
def test_clear_errors(kwargs, message):
  x = np.zeros((1, 20, 2, 16), np.float32)
  g = np.zeros((1, 1, 2, 16), np.float32)
  kwargs = dict(dict(local_radius=3), **kwargs)
  with pytest.raises(ValueError, match=message):
    ep.long_query_attention(x, x, x, g, g, np.ones((1, 20), bool), np.ones((1, 1), bool),
                            **kwargs)


# --------------------------------------------------------------------------- the module
class RichEtc(nn.Module):
  kernel: str
  relative_positions: bool = False

  @nn.compact
  def __call__(self, x, mask, geom, deterministic=True, extra_term=None):
    terms = [RichAttentionTerm(num_heads=2, head_dim=8, name="rich")]
    if extra_term is not None:
      terms.append(extra_term)
    return EtcAttention(num_heads=2, local_radius=6, num_globals=2, dropout_rate=0.2,
                        kernel=self.kernel, relative_positions=self.relative_positions,
                        name="attention")(x, mask, terms, geom, deterministic)


def module_inputs(b=2, n=24):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(b, n, 16)), jnp.float32)
  mask = jnp.asarray(np.arange(n)[None] < np.array([n, n - 9])[:b, None])
  geom = {"centers": jnp.asarray(rng.uniform(0, 1000, size=(b, n, 2)), jnp.float32),
          "document_ids": jnp.asarray(np.r_[[0, 1], np.repeat([0, 1], (n - 2) // 2)][None]
                                      .repeat(b, 0), jnp.int32)}
  return x, mask, geom


def test_module_kernels_share_parameters_and_agree():
  x, mask, geom = module_inputs()
  xla, fused = RichEtc("xla"), RichEtc("pallas")
  params = jax.jit(xla.init)(jax.random.key(0), x, mask, geom)  # op by op: 20 s more
  assert (jax.tree.map(jnp.shape, jax.eval_shape(fused.init, jax.random.key(0), x, mask, geom))
          == jax.tree.map(jnp.shape, params))
  def value_and_grad(model):
    loss = lambda p: jnp.sum(jnp.sin(model.apply(p, x, mask, geom)))  # noqa: E731
    return jax.jit(lambda p: (model.apply(p, x, mask, geom), jax.grad(loss)(p)))(params)

  out_x, grad_x = value_and_grad(xla)
  out_f, grad_f = value_and_grad(fused)
  np.testing.assert_allclose(np.asarray(out_f), np.asarray(out_x), rtol=2e-5, atol=2e-5)
  assert_tree_close(grad_f, grad_x, rtol=1e-4, atol=1e-5, what="parameter gradients")
  # Dropout: a different stream from the XLA path's, but rate and finiteness hold.
  rngs = {"dropout": jax.random.key(3)}
  dropped = jax.jit(lambda p: fused.apply(p, x, mask, geom, deterministic=False,
                                          rngs=rngs))(params)
  assert np.isfinite(np.asarray(dropped)).all()
  assert not np.allclose(np.asarray(dropped), np.asarray(out_f))


def test_off_a_gpu_the_interpreter_runs_with_a_warning():
  x = jnp.ones((1, 8, 1, 16))
  g = jnp.ones((1, 1, 1, 16))
  with pytest.warns(UserWarning, match="interpreter"):
    out = ep.long_query_attention(x, x, x, g, g, jnp.ones((1, 8), bool), jnp.ones((1, 1), bool),
                                  local_radius=2, tiles=SMALL)
  np.testing.assert_allclose(np.asarray(out), 1.0, rtol=1e-6)  # every value is 1


def test_module_refuses_what_the_kernel_lacks():
  x, mask, geom = module_inputs(b=1, n=20)
  with pytest.raises(ValueError, match="relative position ids"):
    RichEtc("pallas", relative_positions=True).init(jax.random.key(0), x, mask, geom)
  other = lambda q, k, qg, kg: jnp.zeros(())  # noqa: E731
  with pytest.raises(ValueError, match="only layout term"):
    RichEtc("pallas").init(jax.random.key(0), x, mask, geom, extra_term=other)
  with pytest.raises(ValueError, match="kernel must be one of"):
    RichEtc("cuda").init(jax.random.key(0), x, mask, geom)


@pytest.mark.parametrize("fields, message", [
    (dict(attention="dense"), "not 'dense' attention"),
    (dict(attention="etc", num_globals=1, etc_relative_positions=True), "relative ids"),
    (dict(attention="etc", num_globals=1, polar=True), "only layout term"),
    (dict(attention="etc", num_globals=1, etc_kernel="triton"), "etc_kernel"),
])
def test_encoder_spec_names_the_field(fields, message):
  fields = dict(dict(etc_kernel="pallas"), **fields)
  with pytest.raises(ValueError, match=message):
    EncoderSpec(**fields).validate()
  EncoderSpec(attention="etc", num_globals=1, rich_attention=True,
              etc_kernel="pallas").validate()


def test_lowers_to_triton_for_a_gpu():
  """Forward and backward lowered for CUDA on this CPU (no GPU needed): a construct that
  Pallas' Triton backend lacks fails here, not on the first GPU. Three Triton kernels,
  bfloat16, Rich Attention, dropout and FormNet-A2's radius (`bench.kernel_sass`'s problem)."""
  grad, args, *_ = kernel_sass.etc_problem(None, length=200, heads=2)
  lowered = jax.jit(grad).trace(*args).lower(lowering_platforms=("cuda",))
  text = lowered.as_text()
  assert text.count("xla.gpu.triton") == 3
  # Each kernel's results: dq, dk and dv leave the backward kernels in bf16 (the rest,
  # Rich's scalars, lse and the global keys' partial sums, stay float32).
  results = {}
  for line in text.splitlines():
    if "xla.gpu.triton" in line:
      name = re.search(r'name = \\?"(etc_[a-z_]+)', line).group(1)
      results[name] = re.findall(r"x(bf16|f32)>", line.rsplit("->", 1)[-1])
  assert results == {"etc_rich_forward": ["bf16", "f32"],
                     "etc_rich_backward_dq": ["bf16"] + ["f32"] * 5,
                     "etc_rich_backward_dkv": ["bf16", "bf16", "f32", "f32"]}


@pytest.mark.parametrize("n, r, bq, bk", [(70, 37, 16, 32), (70, 37, 32, 16), (1024, 84, 16, 64),
                                          (1000, 84, 16, 32), (5, 0, 16, 16), (40, 100, 16, 16)])
def test_windows_visit_each_needed_row_once(n, r, bq, bk):
  """The kernels' loops (`Config.key_window` / `query_window` with `clamp_*_tile`), run in
  Python: the rows they keep (`fresh`) include every key within `r` of a query tile, or
  every query within `r` of a key tile, that exists in the padded arrays (the radius mask
  drops the rest), none twice, in as few tiles as those rows need, and every load stays
  inside the array (the last tile moves back instead of reading past it)."""
  cfg = ep.Config(radius=r, length=n, num_globals=1, num_axes=0, dropout_rate=0.0,
                  block_q=bq, block_k=bk, warps=4, interpret=True, backward_tiles=(bq, bk, 4))
  for starts, block, size, window, clamp, other_block, other_size in (
      (range(0, cfg.padded_q, bq), bk, cfg.padded_k, cfg.key_window, cfg.clamp_key_tile, bq,
       cfg.padded_q),
      (range(0, cfg.padded_k, bk), bq, cfg.padded_q, cfg.query_window, cfg.clamp_query_tile,
       bk, cfg.padded_k)):
    assert size % block == 0 and other_size % other_block == 0
    for o in starts:
      first, tiles = (int(x) for x in window(o, np))
      seen = []
      for t in range(tiles):
        start, fresh = clamp(first, t)
        start, fresh = int(start), np.asarray(fresh)
        assert 0 <= start and start + block <= size
        seen += [start + i for i in range(block) if fresh[i]]
      want = [j for j in range(size) if any(abs(i - j) <= r for i in range(o, o + other_block))]
      assert len(seen) == len(set(seen)) and set(want) <= set(seen), (o, seen, want)
      assert tiles == -(-len(want) // block), (o, tiles, len(want))


def test_no_copy_of_queries_keys_or_values_around_the_kernels():
  """At a length that is a multiple of the tiles, the layer's long queries, keys and values
  and their gradients reach and leave the kernels as they are: no pad or slice of a
  `[B, N, H, D]` array in the lowered forward and backward (before, the keys and values
  were padded by `r` on both sides, forward and again backward, and `dk`, `dv` cropped)."""
  grad, args, *_ = kernel_sass.etc_problem(None, length=256, heads=2)
  text = jax.jit(grad).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  per_token = re.compile(r"tensor<1x(?:256|\d{3})x2x64x(?:bf16|f32)>")
  copies = [line.strip()[:120] for line in text.splitlines()
            if re.search(r"= stablehlo\.(pad|slice|concatenate|dynamic_slice)\b", line)
            and per_token.search(line)]
  assert copies == []
  assert text.count("xla.gpu.triton") == 3
  # The one global key's dk / dv partial sums per query tile: one row each, not 16.
  dq_call = next(line for line in text.splitlines() if "etc_rich_backward_dq" in line)
  assert len(re.findall(r"tensor<1x2x16x1x64xf32>", dq_call.rsplit("->", 1)[-1])) == 2


@pytest.mark.parametrize("g", [2, 16])
def test_global_rows_lower_to_triton(g):
  """The global keys' dk / dv partial sums as `G` rows (2) or as the whole tile (16), lowered
  for CUDA: `_store_global_rows`'s two forms are both Triton-clean."""
  b, n, h, d = 1, 64, 2, 64
  x = jnp.zeros((b, n, h, d), jnp.bfloat16)
  kg = jnp.zeros((b, g, h, d), jnp.bfloat16)

  def loss(q, k, v, kg, vg):
    return ep.long_query_attention(q, k, v, kg, vg, jnp.ones((b, n), bool),
                                   jnp.ones((b, g), bool), local_radius=20,
                                   interpret=False).astype(jnp.float32).sum()
  text = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4))).trace(x, x, x, kg, kg).lower(
      lowering_platforms=("cuda",)).as_text()
  dq_call = next(line for line in text.splitlines() if "etc_rich_backward_dq" in line)
  assert len(re.findall(rf"tensor<1x2x\d+x{g}x64xf32>", dq_call.rsplit("->", 1)[-1])) == 2


def test_global_rows_come_first_and_take_their_gradient():
  """`global_rows` gives `concatenate([global_rows, out])` without the concatenation: the
  same values bit for bit (the kernel writes the long rows after them), the same
  gradients for every input, and `global_rows`' own gradient is its rows' cotangent. MIXED
  tiles and n = 70: the forward and backward pad the queries differently."""
  p = problem()
  base = kernel_fn(p, radius=9, tiles=MIXED, rate=0.2, seed=jnp.array([5], jnp.int32))
  rows = jax.random.normal(jax.random.key(9), p["kg"].shape)

  def joined(*args):
    *args, rows = args
    return jnp.concatenate([rows, base(*args)], axis=1)

  def in_place(q, k, v, kg, vg, rich, rows):
    return ep.long_query_attention(
        q, k, v, kg, vg, p["lvalid"], p["gvalid"], local_radius=9,
        long_document_ids=p["ldoc"], global_document_ids=p["gdoc"],
        rich=rich + (p["coords"],), dropout_rate=0.2, dropout_seed=jnp.array([5], jnp.int32),
        global_rows=rows, tiles=MIXED, interpret=True)

  ct = jnp.concatenate([jax.random.normal(jax.random.key(8), rows.shape), p["ct"]], axis=1)
  args = tuple(p[name] for name in DIFF) + (rows,)
  results = [jax.jit(lambda *a, f=f: (lambda out, vjp: (out, vjp(ct)))(*jax.vjp(f, *a)))(*args)
             for f in (joined, in_place)]
  (out_j, grads_j), (out_i, grads_i) = results
  assert out_i.shape == (2, 2 + 70, 2, 16)
  np.testing.assert_array_equal(np.asarray(out_i), np.asarray(out_j))
  assert_tree_close(grads_i, grads_j, rtol=1e-6, atol=1e-6, what="gradients")
  np.testing.assert_array_equal(np.asarray(grads_i[-1]), np.asarray(ct[:, :2]))
  with pytest.raises(ValueError, match="global_rows has shape"):
    in_place(*args[:-1], rows[:, :1])


def test_the_layer_concatenates_no_context_around_the_kernel():
  """`EtcAttention(kernel="pallas")` lowered for CUDA, forward and backward: the kernel
  writes the long rows after the global ones, so no `[B, G + N, H, D]` context is
  concatenated (forward), and the backward kernels take the context's gradient whole
  (not a `[B, N, H, D]` slice of it). Before, the concatenation was an XLA fusion (2% of
  the H100 step) and the slice a copy."""
  b, n, g, h, d = 2, 64, 2, 2, 8
  x = jnp.zeros((b, g + n, h * d), jnp.bfloat16)
  mask = jnp.ones((b, g + n), bool)
  layer = EtcAttention(num_heads=h, local_radius=6, num_globals=g, kernel="pallas",
                       dtype=jnp.bfloat16, tiles=ep.Tiles(16, 16, 4, 16, 16, 4))
  params = EtcAttention(num_heads=h, local_radius=6, num_globals=g).init(
      jax.random.key(0), x.astype(jnp.float32), mask)

  def loss(params, x):
    return layer.apply(params, x, mask).astype(jnp.float32).sum()

  with pallas_backend.lowering_for_gpu():
    text = jax.jit(jax.grad(loss, argnums=(0, 1))).trace(params, x).lower(
        lowering_platforms=("cuda",)).as_text()
  assert text.count("xla.gpu.triton") == 3
  context = f"tensor<{b}x{g + n}x{h}x{d}x(?:bf16|f32)>"
  joins = [line for line in text.splitlines() if "stablehlo.concatenate" in line
           and re.search(rf"-> {context}", line)]
  assert joins == []
  # The forward kernel returns the context; both backward kernels read its gradient.
  calls = {re.search(r'name = \\?"(etc_[a-z_]+)', line).group(1): line.rsplit("->", 1)
           for line in text.splitlines() if "xla.gpu.triton" in line}
  assert re.search(context, calls["etc_rich_forward"][1])
  for name in ("etc_rich_backward_dq", "etc_rich_backward_dkv"):
    assert re.search(context, calls[name][0].rsplit(": (", 1)[-1]), name
