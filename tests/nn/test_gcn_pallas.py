"""The fused GCN kernels (Pallas, interpreted on CPU) against per-edge references.

The reference gathers every edge's `[K, H]` message, applies `jax.nn.gelu(approximate=
False)` and a masked softmax, and takes gradients by autodiff; the kernels have their own
backward (the gather's transpose sorted by target, no scatter). `GCNLayer(kernel=
"pallas")` is checked against the XLA layer with the same parameters, and every kernel
is lowered to Triton's IR for a GPU (no GPU needed), so a construct the Triton backend
lacks fails here, not on the first GPU.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from scipy.special import erf

from flaxdoc.bench import common as bench_common
from flaxdoc.models.document_encoder import EncoderSpec
from flaxdoc.nn import gcn
from flaxdoc.nn import gcn_pallas as gp
from flaxdoc.nn import gcn_pallas_kernels as gk
from flaxdoc.nn import pallas_backend
from flaxdoc.nn.gcn import GCNLayer, SuperTokenEncoder

# XLA:CPU's default backend optimisation level, for a test that compares bits of two forms
# (tests/conftest.py runs the tests at the lowest).
DEFAULT_LEVEL = {"xla_backend_optimization_level": 3}

# 4 nodes a tile, 8 in-edges a step: several steps per target tile, tiles without in-edges.
SMALL = gp.Tiles(block_nodes=4, block_hidden=32, block_edges=8)


def reference(s, n, e, ids, mask, we, b1, v):
  """Every edge's message as an array: `(pooled [B, L, H], weights [B, L, K])`."""
  ids = jnp.where(mask, ids, 0)
  gathered = jax.vmap(lambda table, i: table[i])(n, ids)  # [B, L, K, H]
  x = jax.nn.gelu(s[:, :, None] + gathered + e @ we + b1, approximate=False)
  scores = jnp.where(mask, x @ v, -jnp.inf)
  w = jnp.where(mask, jax.nn.softmax(jnp.where(mask, scores, -1e30), axis=-1), 0.0)
  return jnp.einsum("blk,blkh->blh", w, x), w


def problem(seed=0, b=2, nodes=37, k=5, f=11, h=70):
  """Random graph: masked slots with junk ids, an isolated node, repeated neighbours."""
  rng = np.random.default_rng(seed)
  normal = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
  ids = rng.integers(0, nodes, (b, nodes, k)).astype(np.int32)
  mask = rng.random((b, nodes, k)) < 0.7
  mask[0, min(3, nodes - 1)] = False  # isolated: zero weights, zero pooled vector
  ids[-1, -1] = ids[-1, -1, 0]  # one neighbour in every slot
  ids = np.where(mask, ids, rng.choice([-1, nodes + 7], size=ids.shape))  # junk in padding
  return dict(s=normal(b, nodes, h), n=normal(b, nodes, h), e=normal(b, nodes, k, f),
              ids=jnp.asarray(ids), mask=jnp.asarray(mask), we=normal(f, h) * 0.3,
              b1=normal(h), v=normal(h))


def fused(tiles=SMALL, save=False, write_d_pre=False, fused_forward=False,
          fused_backward=False):
  def run(s, n, e, ids, mask, we, b1, v):
    return gp.attention_pool(s, n, e, ids, mask, we, b1, v, tiles=tiles, interpret=True,
                             save_activations=save, write_d_pre=write_d_pre,
                             fused_forward=fused_forward, fused_backward=fused_backward)
  return run


# The forms `pallas_fused` (forward and the backward's node side each in one kernel) and
# `pallas_fused_forward` (the forward only), as `fused`'s options: a test's `save`.
FUSED_BOTH = dict(write_d_pre=True, fused_forward=True, fused_backward=True)
FUSED_FORWARD = dict(write_d_pre=True, fused_forward=True)


def form(save):
  """`fused`'s options for a test's `save` parameter: False, True or `FUSED_FORWARD`."""
  return dict(save) if isinstance(save, dict) else dict(save=save)


def loss(fn, p, cot_pooled, cot_weights):
  pooled, weights = fn(**p)
  return jnp.sum(pooled * cot_pooled) + jnp.sum(weights * cot_weights)


DIFF = ("s", "n", "we", "b1", "v")


def grads(fn, p, cots):
  def f(*diff):
    return loss(fn, dict(p, **dict(zip(DIFF, diff))), *cots)
  return jax.grad(f, argnums=tuple(range(len(DIFF))))(*(p[k] for k in DIFF))


def training_forward_and_grads(fn, p, cots):
  """`fn`'s outputs as differentiation computes them (the custom VJP's forward rule, which
  with saved activations runs other kernels than a plain call), and `grads(fn, p, cots)`
  from the same `jax.vjp`: the pullback of `cots` in the outputs' dtypes, as `jax.grad`
  passes them."""
  out, pullback = jax.vjp(lambda *diff: fn(**dict(p, **dict(zip(DIFF, diff)))),
                          *(p[k] for k in DIFF))
  return out, pullback(tuple(c.astype(o.dtype) for c, o in zip(cots, out)))


# Each side of a comparison runs as one compiled program, not op by op (where every small op
# compiles on its own).
def kernel_side(run, p, cots):
  """`(run(**p), training_forward_and_grads(run, p, cots))`: the kernels' inference forward,
  then their training forward and backward."""
  return jax.jit(lambda p, cots: (run(**p), training_forward_and_grads(run, p, cots)))(p, cots)


def reference_side(p, cots):
  """`training_forward_and_grads(reference, p, cots)`."""
  return jax.jit(functools.partial(training_forward_and_grads, reference))(p, cots)


@pytest.mark.parametrize("save", [
    False,
    # the node products' wiring is the same for both; the saving kernels are checked below
    pytest.param(True, marks=pytest.mark.slow)])
def test_message_attention_is_attention_pool_of_the_node_products(save):
  """`message_attention` computes the node parts at the kernels' padded sizes (13 nodes in
  tiles of 4, 40 features in chunks of 32): values and the gradients of `h` and both node
  kernels against the per-edge reference of `h @ kernel`. 15 edge features: the bias'
  column of ones is the 16th, the last of the padded features."""
  p = problem(seed=4, b=1, nodes=13, k=3, f=15, h=40)
  rng = np.random.default_rng(8)
  hs = jnp.asarray(rng.normal(size=p["s"].shape[:2] + (9,)), jnp.float32)
  ws, wn = (jnp.asarray(rng.normal(size=(9, 40)) * 0.4, jnp.float32) for _ in range(2))
  rest = {k: p[k] for k in ("e", "ids", "mask", "we", "b1", "v")}
  cots = (jnp.asarray(rng.normal(size=p["s"].shape), jnp.float32),
          jnp.asarray(rng.normal(size=p["mask"].shape), jnp.float32))

  def fused_products(h, ws, wn):
    return gp.message_attention(h, ws, wn, rest["e"], rest["ids"], rest["mask"], rest["we"],
                                rest["b1"], rest["v"], tiles=SMALL, save_activations=save,
                                interpret=True)

  def reference_products(h, ws, wn):
    return reference(h @ ws, h @ wn, **rest)

  def outputs_and_grads(fn, *args):  # the gradients of sum(outputs x cots)
    out, pullback = jax.vjp(fn, *args)
    return out, pullback(cots)

  # One compiled program a side (op by op, every small op would compile on its own).
  inference, (training, got) = jax.jit(lambda *a: (
      fused_products(*a), outputs_and_grads(fused_products, *a)))(hs, ws, wn)
  want_out, want = jax.jit(functools.partial(outputs_and_grads, reference_products))(hs, ws, wn)
  for outs in (inference, training):
    for g, w in zip(outs, want_out):
      assert g.shape == w.shape
      np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-5)
  for name, g, w in zip(("h", "self_kernel", "neighbor_kernel"), got, want):
    scale = float(jnp.abs(w).max())
    assert scale > 0, name
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0, atol=2e-5 * scale,
                               err_msg=name)


def test_normal_cdf_and_gelu_pieces_match_scipy_and_autodiff():
  x = np.linspace(-9, 9, 4001).astype(np.float32)
  x64 = x.astype(np.float64)
  phi = 0.5 * (1 + erf(x64 / np.sqrt(2)))
  np.testing.assert_allclose(np.asarray(gk.normal_cdf(jnp.asarray(x), True)), phi,
                             atol=2.5e-7)  # A&S: 7.5e-8 on Phi, plus float32 rounding
  tail, g = gk._normal_tail(jnp.asarray(x), True)
  np.testing.assert_allclose(np.asarray(tail), 0.5 * (1 + erf(-np.abs(x64) / np.sqrt(2))),
                             rtol=0, atol=2.5e-7)
  np.testing.assert_allclose(np.asarray(g), 0.5 * gk._A5 * np.exp(-0.5 * x64 * x64), rtol=5e-6,
                             atol=1e-30)  # the exponent's rounding: ~7e-8 x |x^2 log2(e) / 2|
  value, slope = gk.gelu_and_grad(jnp.asarray(x), True)
  exact = jax.vmap(jax.grad(lambda t: jax.nn.gelu(t, approximate=False)))(jnp.asarray(x))
  np.testing.assert_allclose(np.asarray(value), np.asarray(jax.nn.gelu(x, approximate=False)),
                             atol=2e-6)
  np.testing.assert_allclose(np.asarray(slope), np.asarray(exact), atol=2e-6)
  # Either sign, far out and at zero: nothing but the limits.
  far = jnp.asarray([-1e4, -40.0, -0.0, 0.0, 40.0, 1e4], jnp.float32)
  np.testing.assert_array_equal(np.asarray(gk.gelu(far, True)), [0, 0, 0, 0, 40, 1e4])
  np.testing.assert_allclose(np.asarray(gk.gelu_and_grad(far, True)[1]), [0, 0, .5, .5, 1, 1],
                             atol=1e-7)


def check_against_reference(p, tiles=SMALL, seed=5, zero=(), save=False):
  """Values and the gradients of every differentiable input, against `reference`
  (those named in `zero` are zero by the problem's construction). `save`: as `form`.
  Returns the inference forward's `(pooled, weights)`."""
  rng = np.random.default_rng(seed)
  cots = (jnp.asarray(rng.normal(size=p["s"].shape), jnp.float32),
          jnp.asarray(rng.normal(size=p["mask"].shape), jnp.float32))
  inference, (training, got_grads) = kernel_side(fused(tiles, **form(save)), p, cots)
  want, want_grads = reference_side(p, cots)
  for got in (inference, training):
    for g, w in zip(got, want):
      np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-5)
  for name, g, w in zip(DIFF, got_grads, want_grads):
    scale = float(jnp.abs(w).max())
    assert (scale == 0) == (name in zero), name  # no comparison passes by being all zero
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0,
                               atol=2e-5 * max(scale, 1e-6), err_msg=name)
  return inference


@pytest.mark.parametrize("tiles, save", [
    (SMALL, False), (SMALL, True),  # recomputing every edge's GELU, or saving it
    # the forward and the backward's node side in one kernel each, 2 nodes a program (so 16
    # pooled rows span the tile's neighbours and, at the row's end, the last 16 nodes: 37
    # nodes padded to 40)
    (SMALL, FUSED_BOTH),
    # the fused forward is FUSED_BOTH's, the backward `write_d_pre`'s: their wiring together
    pytest.param(SMALL, FUSED_FORWARD, marks=pytest.mark.slow),
    # 32 nodes a fused program: more than the 16 rows of the pooled products' least window
    (gp.Tiles(block_nodes=32, block_hidden=32, block_edges=16, fused_nodes=32), FUSED_BOTH),
    pytest.param(gp.Tiles(block_nodes=8, block_hidden=16, block_edges=32), False,
                 marks=pytest.mark.slow),
    # 8 nodes a fused program, the whole node tile
    pytest.param(gp.Tiles(block_nodes=8, block_hidden=16, block_edges=32, fused_nodes=8),
                 FUSED_BOTH, marks=pytest.mark.slow)])
def test_values_and_gradients_match_the_reference(tiles, save):
  pooled, weights = check_against_reference(problem(), tiles, save=save)
  assert not np.asarray(weights)[0, 3].any() and not np.asarray(pooled)[0, 3].any()


@pytest.mark.parametrize("dtype", [
    jnp.bfloat16,  # the form it is for
    pytest.param(jnp.float32, marks=pytest.mark.slow)])  # for the 15-minute budget
def test_writing_d_pre_gives_the_recomputing_gradients_bit_for_bit(dtype):
  """`write_d_pre`: the target side sums the `d pre` the source side wrote instead of
  recomputing it; the recomputed values are the written ones, so every gradient is the
  recomputing form's (and, in float32, the reference's as those are)."""
  p = problem(seed=10, b=1, nodes=13, k=3, f=6, h=40)
  rng = np.random.default_rng(11)
  cots = (jnp.asarray(rng.normal(size=p["s"].shape), jnp.float32),
          jnp.asarray(rng.normal(size=p["mask"].shape), jnp.float32))
  tiles = gp.Tiles(block_nodes=8, block_hidden=64, block_edges=16)  # few programs: quick
  q = dict(p, s=p["s"].astype(dtype), n=p["n"].astype(dtype))
  # Both forms' gradients in one compiled program (op by op, every small op would compile on
  # its own); their forwards are the same kernels, their backwards not. At XLA:CPU's default
  # optimisation level, not the tests' lowest (tests/conftest.py), at which the two forms'
  # float32 `d N` differ in the last bit (eager or compiled whole alike).
  step = jax.jit(lambda q, cots: (grads(fused(tiles, write_d_pre=True), q, cots),
                                  grads(fused(tiles), q, cots)))
  written, recomputed = step.lower(q, cots).compile(DEFAULT_LEVEL)(q, cots)
  for name, g, w in zip(DIFF, written, recomputed):
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32),
                                  err_msg=name)
  if dtype == jnp.float32:  # the reference's gradients, computed only where compared
    for name, g, r in zip(DIFF, written, grads(reference, p, cots)):
      np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=0,
                                 atol=2e-5 * max(float(jnp.abs(r).max()), 1e-6), err_msg=name)


@pytest.mark.parametrize("save", [
    # The last step's read past the edges is `sum_by_target`'s, which every target kernel
    # shares: the saved one covers it in the default run; the recomputing one is in the slow
    # set (its values are checked above), for the 15-minute budget.
    pytest.param(False, marks=pytest.mark.slow),
    True,
    # the fused backward's target side also sums `d We`, where the read past its edges
    # must be left out too
    FUSED_BOTH])
def test_every_slot_valid_and_the_last_step_reading_past_the_edges(save):
  """No masked edge sorts last, so the last target tile's last step reads the order's
  padding (edge 0, whose target is in that tile): only the step's `valid` mask keeps it out."""
  b, nodes, k = 2, 16, 4
  p = problem(seed=3, b=b, nodes=nodes, k=k, f=5, h=40)
  ids = np.asarray(p["ids"]).copy()
  ids[(ids < 0) | (ids >= 12)] = 0  # in range (padding held junk); few in-edges into the
  # last tile (nodes 12-15): fewer than BE
  ids[:, 0, 0] = nodes - 1  # edge 0 points into it
  check_against_reference(dict(p, ids=jnp.asarray(ids), mask=jnp.ones((b, nodes, k), bool)),
                          save=save)


@pytest.mark.parametrize("shape", [
    # with every id 5 below: one hub takes all edges (many in-edge steps into one tile; the
    # default run has several steps a tile in the tests above): slow, for the budget
    pytest.param(dict(b=1, nodes=24, k=3, f=4, h=20), marks=pytest.mark.slow),
    dict(b=1, nodes=1, k=1, f=3, h=8),  # one node, one slot (its own neighbour)
    # FormNet's 8 slots and 12 features with the default tiles (the layer test has them too)
    pytest.param(dict(b=1, nodes=40, k=8, f=12, h=50), marks=pytest.mark.slow),
])
def test_hub_single_node_and_formnet_slots(shape):
  p = problem(seed=2, **shape)
  if shape["nodes"] == 24:
    p["ids"] = jnp.full_like(p["ids"], 5)
  if shape["nodes"] == 1:
    p["ids"], p["mask"] = jnp.zeros_like(p["ids"]), jnp.ones_like(p["mask"])
  # One slot: its weight is 1 whatever the score, so the score vector gets no gradient.
  check_against_reference(p, gp.DEFAULT_TILES if shape["k"] == 8 else SMALL,
                          zero=("v",) if shape["k"] == 1 else ())


@pytest.mark.parametrize("run", [
    False,
    pytest.param(True, marks=pytest.mark.slow)])  # the kernels at F = 16: 15 s interpreted
def test_the_bias_column_when_the_features_fill_a_power_of_two(run):
  """The bias rides in the edge product as a column of ones after the `F` features: with
  15 features it is the 16th column (the `message_attention` test runs that), with 16 the
  padding grows to 32."""
  def padded(f):
    return gk.Config(nodes=9, slots=3, features=f, hidden=20, block_nodes=4, block_hidden=32,
                     block_edges=8, warps=4, interpret=True, bf16=False).padded_features
  assert (padded(11), padded(15), padded(16), padded(31)) == (16, 16, 32, 32)
  if run:
    check_against_reference(problem(seed=9, b=1, nodes=9, k=3, f=16, h=20))


def test_valid_ids_out_of_range_are_clamped_as_xla_gathers_them():
  p = problem(seed=7, b=1, nodes=10, k=3, f=4, h=20)
  ids = np.asarray(p["ids"]).copy()
  ids[0, 2, 1], ids[0, 5, 0] = 11, -2
  mask = np.asarray(p["mask"]).copy()
  mask[0, 2, 1] = mask[0, 5, 0] = True
  p = dict(p, ids=jnp.asarray(ids), mask=jnp.asarray(mask))
  clamped = dict(p, ids=jnp.asarray(np.clip(ids, 0, 9)))
  got, want = jax.jit(lambda p, clamped: (fused()(**p), reference(**clamped)))(p, clamped)
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-5)


def test_no_gradient_reaches_the_edge_features():
  p = problem(b=1, nodes=8, k=3, f=4, h=16)
  d_e = jax.jit(jax.grad(lambda e: fused()(**dict(p, e=e))[0].sum()))(p["e"])
  assert not np.asarray(d_e).any()


@pytest.mark.parametrize("save", [
    # The recomputing kernels' bfloat16 dots are the saved ones' (`dot`, cfg.bf16), which the
    # default run checks below; in the slow set for the 15-minute budget.
    pytest.param(False, marks=pytest.mark.slow),
    True,  # saved: x, its slope and d pre in bfloat16
    FUSED_BOTH])  # x (and, backward, its slope) kept in bfloat16 within a program
def test_bfloat16_inputs_stay_close_to_float32(save):
  p = problem(seed=1)
  low = dict(p, s=p["s"].astype(jnp.bfloat16), n=p["n"].astype(jnp.bfloat16))
  rounded = dict(p, s=low["s"].astype(jnp.float32), n=low["n"].astype(jnp.float32))
  rng = np.random.default_rng(6)
  cots = (jnp.asarray(rng.normal(size=p["s"].shape), jnp.float32),
          jnp.asarray(rng.normal(size=p["mask"].shape), jnp.float32))
  # Inference, and the training forward (with saved activations it pools the saved x) and
  # its backward.
  inference, (training, got_grads) = kernel_side(fused(**form(save)), low, cots)
  (want, want_w), want_grads = reference_side(rounded, cots)
  for pooled, weights in (inference, training):
    assert pooled.dtype == jnp.bfloat16 and weights.dtype == jnp.float32
    err = float(jnp.linalg.norm(pooled.astype(jnp.float32) - want) / jnp.linalg.norm(want))
    assert err < 1e-2, err
    np.testing.assert_allclose(np.asarray(weights), np.asarray(want_w), atol=3e-2)
  if save is True:  # the saved x and the recomputed x enter one bfloat16 product: same bits
    # (the fused forms run one kernel for both, so there is nothing to compare)
    np.testing.assert_array_equal(np.asarray(inference[0], np.float32),
                                  np.asarray(training[0], np.float32))
  for name, g, w in zip(DIFF, got_grads, want_grads):
    assert g.dtype == low[name].dtype, name
    err = float(jnp.linalg.norm(g.astype(jnp.float32) - w) / jnp.linalg.norm(w))
    assert err < 2e-2, (name, err)  # ~0.8% measured: dots on bfloat16 operands


def layer_inputs(seed=0, b=2, nodes=20, k=4, width=16, f=6):
  rng = np.random.default_rng(seed)
  h = rng.normal(size=(b, nodes, width)).astype(np.float32)
  ids = rng.integers(0, nodes, (b, nodes, k)).astype(np.int32)
  mask = rng.random((b, nodes, k)) < 0.75
  feats = rng.normal(size=(b, nodes, k, f)).astype(np.float32)
  node_mask = np.ones((b, nodes), bool)
  node_mask[1, -3:] = False  # padded nodes: edges into them are dropped
  return h, np.where(mask, ids, -1), feats, mask, node_mask


@pytest.mark.parametrize("kernel", [
    # The layer's wiring is the same for all forms; every form's kernels are checked against
    # the per-edge reference above (`pallas`'s recomputing target side by
    # test_values_and_gradients_match_the_reference[tiles0-False]). `pallas_dpre` (the one
    # the README recommends, timed on an H100 in session 12) in the default run, the others
    # in the slow set, for the 15-minute budget.
    pytest.param("pallas", marks=pytest.mark.slow),
    "pallas_dpre",
    pytest.param("pallas_saved", marks=pytest.mark.slow),
    # the fused forward's values and gradients are checked against the reference above
    pytest.param("pallas_fused", marks=pytest.mark.slow)])
def test_layer_kernels_share_parameters_and_agree(kernel):
  h, ids, feats, mask, node_mask = layer_inputs()
  hidden = 2 * h.shape[-1] + feats.shape[-1]
  xla = GCNLayer(hidden_features=hidden)
  # Compiled whole, not op by op (where every small op compiles on its own).
  params = nn.unbox(jax.jit(xla.init)(jax.random.key(0), h, ids, feats, mask, node_mask))
  rng = np.random.default_rng(2)  # weights far from the 0.02 init: a peaked softmax
  params = jax.tree.map(lambda a: a + rng.normal(size=a.shape).astype(np.float32) * 0.3, params)
  cot = rng.normal(size=h.shape).astype(np.float32)

  def run(module):
    f = lambda p: jnp.sum(module.apply(p, h, ids, feats, mask, node_mask) * cot)  # noqa: E731
    return jax.jit(lambda p: (module.apply(p, h, ids, feats, mask, node_mask),
                              jax.grad(f)(p)))(params)

  out_x, g_x = run(xla)
  fused_layer = GCNLayer(hidden_features=hidden, kernel=kernel)
  assert jax.tree.structure(params) == jax.tree.structure(nn.unbox(jax.eval_shape(
      fused_layer.init, jax.random.key(0), h, ids, feats, mask, node_mask)))
  out_p, g_p = run(fused_layer)
  np.testing.assert_allclose(np.asarray(out_p), np.asarray(out_x), atol=3e-5, err_msg=kernel)
  for path, gx in jax.tree_util.tree_leaves_with_path(g_x):
    gp_ = dict(jax.tree_util.tree_leaves_with_path(g_p))[path]
    # b2 reaches the score only through a constant the softmax cancels: ~0 either way.
    np.testing.assert_allclose(np.asarray(gp_), np.asarray(gx), rtol=0,
                               atol=5e-5 * max(float(jnp.abs(gx).max()), 1.0),
                               err_msg=f"{kernel} {jax.tree_util.keystr(path)}")


# The encoder's wiring also runs in tests/models/test_kernel_tiles.py (FormNet with
# gcn_kernel="pallas" through it); here in the slow set, for the 15-minute budget.
@pytest.mark.slow
def test_super_token_encoder_passes_the_kernel_on():
  h, ids, feats, mask, node_mask = layer_inputs(nodes=10)
  boxes = np.tile(np.array([10, 20, 30, 40], np.float32), h.shape[:2] + (1,))
  encoders = [SuperTokenEncoder(features=16, num_layers=2, kernel=k) for k in ("xla", "pallas")]
  params = encoders[0].init(jax.random.key(0), h, boxes, ids, feats, mask, node_mask)
  outs = [e.apply(params, h, boxes, ids, feats, mask, node_mask) for e in encoders]
  np.testing.assert_allclose(np.asarray(outs[1]), np.asarray(outs[0]), atol=3e-5)


RECOMPUTING = ["gcn_backward_source", "gcn_backward_target", "gcn_edge_dot", "gcn_pool"]
SAVING = ["gcn_saved_backward_source", "gcn_saved_backward_target", "gcn_saved_edge_dot",
          "gcn_saved_pool", "gcn_saving_scores"]
WRITING = ["gcn_backward_source_writing", "gcn_edge_dot", "gcn_pool",
           "gcn_saved_backward_target"]
FUSED = ["gcn_fused_backward", "gcn_fused_backward_target", "gcn_fused_forward"]
FUSED_FWD = ["gcn_backward_source_writing", "gcn_edge_dot", "gcn_fused_forward",
             "gcn_saved_backward_target"]


@pytest.mark.parametrize("save", [
    False, True, FUSED_BOTH,
    pytest.param(FUSED_FORWARD, marks=pytest.mark.slow)])  # its kernels are the others'
@pytest.mark.parametrize("nodes, k, f, h, dtype", [
    (64, 8, 12, 1548, jnp.bfloat16),  # FormNet-A2's hidden width: not a multiple of the chunk
    (37, 5, 11, 70, jnp.float32),  # nothing a power of two or a multiple of a tile
])
def test_lowers_to_triton_for_a_gpu(nodes, k, f, h, dtype, save):
  """Forward and backward lowered for CUDA on this CPU: five Triton kernels (the scores'
  kernel twice when recomputing), three with both fused kernels, four with the fused
  forward only (the scores' kernel once, for `d a`); the forward alone saves nothing either
  way."""
  b = 2
  s = jnp.zeros((b, nodes, h), dtype)
  ids, mask = jnp.zeros((b, nodes, k), jnp.int32), jnp.ones((b, nodes, k), bool)
  e = jnp.zeros((b, nodes, k, f))

  def step(s, n, we, b1, v):
    options = dict(save) if isinstance(save, dict) else dict(save_activations=save)
    pooled, weights = gp.attention_pool(s, n, e, ids, mask, we, b1, v, interpret=False,
                                        **options)
    return pooled.astype(jnp.float32).sum() + weights.sum()

  def kernels(fn):
    text = jax.jit(fn).trace(s, s, jnp.zeros((f, h)), jnp.zeros(h), jnp.zeros(h)).lower(
        lowering_platforms=("cuda",)).as_text()
    names = re.findall(r'name = "(gcn_[a-z_]+)"', text)
    assert len(names) == text.count("xla.gpu.triton")
    return sorted(set(names)), len(names)

  if isinstance(save, dict):
    want = (FUSED, 3) if save.get("fused_backward") else (FUSED_FWD, 4)
    assert kernels(jax.grad(step, argnums=(0, 1, 2, 3, 4))) == want
    assert kernels(step) == (["gcn_fused_forward"], 1)
    return
  want = (SAVING, 5) if save else (RECOMPUTING, 5)
  assert kernels(jax.grad(step, argnums=(0, 1, 2, 3, 4))) == want
  assert kernels(step) == (["gcn_edge_dot", "gcn_pool"], 2)


@pytest.mark.parametrize("kernel", [
    "pallas", "pallas_saved", "pallas_dpre", "pallas_fused",
    pytest.param("pallas_fused_forward", marks=pytest.mark.slow)])  # the others' kernels
def test_no_node_array_is_padded_cropped_or_converted_around_the_kernels(kernel):
  """The layer's forward and backward lowered for CUDA (bfloat16, 64 nodes, H = 43 in
  chunks of 32): the only operations on a `[B, L, H]` node array outside the kernels are
  the pooled output's crop and, in the backward, its transpose (a pad) and, for `pallas`
  only, whose target side gathers its rows, the pooled gradient's widening to float32
  (elementwise on the pad: one pass). The node parts come
  out of their products at the padded size, and the kernels write `d S` and `d N` in
  bfloat16 at that size, so nothing pads `s` / `n` or converts and crops the gradients.
  Both parts are one product's output `[S | N]` and their gradients one array, so nothing
  slices the one or concatenates the other either."""
  b, nodes, k, width, f = 2, 64, 8, 16, 11
  hidden = 2 * width + f
  h = jnp.zeros((b, nodes, width), jnp.bfloat16)
  ids, mask = jnp.zeros((b, nodes, k), jnp.int32), jnp.ones((b, nodes, k), bool)
  feats = jnp.zeros((b, nodes, k, f))
  layer = GCNLayer(hidden_features=hidden, kernel=kernel, dtype=jnp.bfloat16,
                   pallas_tiles=gp.Tiles(16, 32, 16, 4))
  params = nn.unbox(GCNLayer(hidden_features=hidden).init(
      jax.random.key(0), h.astype(jnp.float32), ids, feats, mask))["params"]

  def loss(params, h):
    return layer.apply({"params": params}, h, ids, feats, mask).astype(jnp.float32).sum()

  with pallas_backend.lowering_for_gpu():  # the kernels' Triton form, not the interpreter
    text = jax.jit(jax.grad(loss, argnums=(0, 1))).trace(params, h).lower(
        lowering_platforms=("cuda",)).as_text()
  # [B, L, H], [B, Lp, Hp] and [B, Lp, 2 Hp] (`[S | N]` and its gradient: one product's
  # output and the kernels' one gradient, never sliced or concatenated)
  node_array = re.compile(rf"tensor<{b}x{nodes}x(?:{hidden}|64|128)x(?:bf16|f32)>")
  passes = [m.group(1) for line in text.splitlines()
            if (m := re.search(r"= stablehlo\.(pad|slice|convert|concatenate)\b", line))
            and node_array.search(line)]
  # The pooled gradient is widened to float32 only for the kernel that gathers its rows.
  want = ["convert", "pad", "slice"] if kernel == "pallas" else ["pad", "slice"]
  assert sorted(passes) == want, passes
  names = sorted(set(re.findall(r'name = "(gcn_[a-z_]+)"', text)))
  assert names == {"pallas": RECOMPUTING, "pallas_saved": SAVING, "pallas_dpre": WRITING,
                   "pallas_fused": FUSED, "pallas_fused_forward": FUSED_FWD}[kernel]


def test_off_a_gpu_the_interpreter_runs_with_a_warning():
  p = problem(b=1, nodes=4, k=2, f=3, h=8)
  with pytest.warns(UserWarning, match="interpreter"):
    gp.attention_pool(*(p[k] for k in ("s", "n", "e", "ids", "mask", "we", "b1", "v")))


@pytest.mark.parametrize("change, message", [
    (dict(tiles=gp.Tiles(block_nodes=12)), "block_nodes must be a power of two"),
    (dict(we=jnp.zeros((4, 8))), "edge_kernel has shape"),
    (dict(v=jnp.zeros(7)), "score_vector has shape"),
    (dict(mask=jnp.ones((1, 4, 3), bool)), "neighbor_mask has shape"),
    (dict(n=jnp.zeros((1, 5, 8))), "from_neighbor has shape"),
    (dict(interpret=False), "on a GPU tiles.block_nodes must be >= 16"),
    (dict(interpret=False, tiles=gp.Tiles(warps=3)), "warps must be a power of two"),
    (dict(interpret=False, tiles=gp.Tiles(fused_warps=6), fused_forward=True,
          write_d_pre=True), "fused_warps must be a power of two"),
    (dict(fused_forward=True), "fused_forward / fused_backward run with write_d_pre=True"),
    (dict(fused_backward=True, write_d_pre=True, save_activations=True),
     "run with write_d_pre=True and save_activations=False"),
    (dict(tiles=gp.Tiles(block_nodes=4, block_hidden=32, block_edges=8, fused_nodes=8),
          fused_forward=True, write_d_pre=True), "fused_nodes=8 must divide"),
    (dict(interpret=False, tiles=gp.Tiles(fused_nodes=4), fused_forward=True,
          write_d_pre=True), r"fused_nodes x the padded slots \(2\) must be >= 16"),
])
def test_clear_errors(change, message):
  p = problem(b=1, nodes=4, k=2, f=3, h=8)
  p = dict(p, **change)
  tiles, interpret = p.pop("tiles", SMALL), p.pop("interpret", True)
  options = {k: p.pop(k) for k in ("fused_forward", "fused_backward", "write_d_pre",
                                    "save_activations") if k in p}
  with pytest.raises(ValueError, match=message):
    gp.attention_pool(p["s"], p["n"], p["e"], p["ids"], p["mask"], p["we"], p["b1"], p["v"],
                      tiles=tiles, interpret=interpret, **options)


def test_layer_and_spec_name_a_bad_kernel():
  h, ids, feats, mask, _ = layer_inputs(nodes=6)
  with pytest.raises(ValueError, match="kernel must be one of"):
    GCNLayer(kernel="cuda").init(jax.random.key(0), h, ids, feats, mask)
  with pytest.raises(ValueError, match="gcn_kernel"):
    EncoderSpec(gcn_layers=1, gcn_kernel="triton").validate()
  EncoderSpec(gcn_layers=1, gcn_kernel="pallas").validate()
  EncoderSpec(gcn_layers=1, gcn_kernel="pallas_saved").validate()
  EncoderSpec(gcn_layers=1, gcn_kernel="pallas_dpre").validate()
  EncoderSpec(gcn_layers=1, gcn_kernel="pallas_fused").validate()
  EncoderSpec(gcn_layers=1, gcn_kernel="pallas_fused_forward").validate()


def test_form_names_map_to_the_kernels_options():
  """The names `GCNLayer(kernel=...)` takes, and their `message_attention` options."""
  none = dict(save_activations=False, write_d_pre=False, fused_forward=False,
              fused_backward=False)
  assert gp.form_options("pallas") == none
  assert gp.form_options("pallas_saved") == dict(none, save_activations=True)
  assert gp.form_options("pallas_dpre") == dict(none, write_d_pre=True)
  assert gp.form_options("pallas_fused") == dict(none, **FUSED_BOTH)
  assert gp.form_options("pallas_fused_forward") == dict(none, **FUSED_FORWARD)
  assert gcn.FUSED_KERNELS == ("pallas", "pallas_saved", "pallas_dpre", "pallas_fused",
                               "pallas_fused_forward")
  assert bench_common.GCN_KERNELS == gcn.KERNELS  # the benchmarks' --gcn_kernel choices
  with pytest.raises(ValueError, match="unknown fused GCN form 'xla'"):
    gp.form_options("xla")


@pytest.mark.parametrize("form", list(gp.FORMS))
def test_gcn_layer_passes_its_forms_options(form, monkeypatch):
  """`GCNLayer(kernel=form)` reaches `message_attention` with that form's options."""
  seen = {}

  class Reached(Exception):
    pass

  def spy(*args, **kwargs):
    seen.update(kwargs)
    raise Reached

  monkeypatch.setattr(gp, "message_attention", spy)
  p = problem(b=1, nodes=8, k=2, f=3, h=6)
  h = jnp.zeros((1, 8, 4))
  with pytest.raises(Reached):
    GCNLayer(hidden_features=6, kernel=form).init(
        jax.random.key(0), h, p["ids"], p["e"], p["mask"])
  assert {k: seen[k] for k in gp.form_options(form)} == gp.form_options(form)


@pytest.mark.parametrize("save, write_d_pre, tiles", [
    (False, False, gp.DEFAULT_TILES), (True, False, gp.DEFAULT_TILES),
    (False, True, gp.DPRE_TILES), (True, True, gp.DEFAULT_TILES)])
def test_each_form_runs_its_default_tiles(save, write_d_pre, tiles):
  """Without `tiles`, `write_d_pre` runs 64 hidden features a program (measured faster in
  the step on an H100), the other forms 32: seen in the kernels' grids (H = 70 is 2
  chunks of 64, 3 of 32)."""
  assert gp.default_tiles(save, write_d_pre) == tiles
  p = problem(b=1, nodes=8, k=2, f=3, h=70)
  args = [p[k] for k in ("s", "n", "e", "ids", "mask", "we", "b1", "v")]

  def loss(s, n):
    pooled, _ = gp.attention_pool(s, n, *args[2:], save_activations=save,
                                  write_d_pre=write_d_pre, interpret=True)
    return pooled.sum()

  jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(*args[:2])
  grids = set()

  def visit(jx):
    for eqn in jx.eqns:
      if eqn.primitive.name == "pallas_call":
        grids.add(tuple(eqn.params["grid_mapping"].grid))
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        visit(sub)

  visit(jaxpr.jaxpr)
  chunks = -(-70 // tiles.block_hidden)
  assert grids and all(g[-1] == chunks for g in grids), grids
