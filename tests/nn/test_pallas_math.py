"""`flaxdoc.nn.pallas_math`: the kernels' base-2 transcendentals.

In the interpreter they run with `jnp.log2` and a division, so these tests check each
rewrite (`exp` through `exp2`, `ln(1 + x)` as the log of the rounded sum, log-sigmoid
and its slope) against float64 numpy; lowered for a GPU they must be the single PTX
instructions, not libdevice's sequences."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from flaxdoc.bench import kernel_sass
from flaxdoc.nn import pallas_math as pm


def f32(x):
  return jnp.asarray(np.asarray(x, np.float32))


def exp_bound(x):
  """Relative error of `2^(x log2 e)` in float32: the product's rounding scaled by |x|
  (twice over in the interpreter, whose `exp2` is XLA:CPU's `exp(x ln 2)`)."""
  return 3e-7 + 1.2e-7 * np.abs(x)


def test_exp_and_log_through_base_two():
  x = np.linspace(-87, 88, 7001).astype(np.float32).astype(np.float64)
  rel = np.abs(np.asarray(pm.exp(f32(x), True), np.float64) / np.exp(x) - 1)
  assert (rel <= exp_bound(x)).all(), rel.max()
  y = np.geomspace(1e-30, 1e30, 7001)
  np.testing.assert_allclose(np.asarray(pm.log(f32(y), True)), np.log(y), rtol=2e-7, atol=1e-6)


def test_log1p_of_coordinate_distances():
  """Rich Attention's `ln(1 + |c_i - c_j|)`: page coordinates 0..1000, halves included,
  to float32's rounding; and small arguments, where only an absolute 1e-7 is kept."""
  d = np.concatenate([np.arange(0, 1000.5, 0.5), np.geomspace(1e-9, 1e-2, 200)])
  np.testing.assert_allclose(np.asarray(pm.log1p(f32(d), True)), np.log1p(d), rtol=2e-7,
                             atol=1.2e-7)


@pytest.mark.parametrize("x", [np.linspace(-30, 30, 6001), np.array([-1e4, -200.0, -88.0, 0.0,
                                                                      88.0, 200.0, 1e4])])
def test_log_sigmoid_and_its_slope_over_the_whole_range(x):
  x = x.astype(np.float32).astype(np.float64)
  want_ls = np.minimum(x, 0) - np.log1p(np.exp(-np.abs(x)))
  got_ls = np.asarray(pm.log_sigmoid(f32(x), True))
  assert np.isfinite(got_ls).all()
  np.testing.assert_allclose(got_ls, want_ls, rtol=2e-7, atol=2e-7)
  with np.errstate(over="ignore"):
    want_s = 1.0 / (1.0 + np.exp(x))  # d log_sigmoid(x) / dx = sigmoid(-x)
  got_s = np.asarray(pm.log_sigmoid_slope(f32(x), True), np.float64)
  assert np.isfinite(got_s).all()
  tiny = want_s < 1e-37  # float32 underflows there: 0 is right
  assert (got_s[tiny] < 1e-37).all()
  rel = np.abs(got_s[~tiny] / want_s[~tiny] - 1)
  assert (rel <= exp_bound(x[~tiny])).all(), rel.max()


@pytest.mark.parametrize("exact", [False, True])
def test_on_a_gpu_one_instruction_each_unless_exact_math_is_asked_for(exact, monkeypatch):
  monkeypatch.setenv("FLAXDOC_PALLAS_EXACT_MATH", "1" if exact else "0")

  def kernel(x_ref, o_ref):
    x = x_ref[...]
    o_ref[...] = pm.log_sigmoid(x, False) + pm.log_sigmoid_slope(x, False) + pm.log1p(x * x,
                                                                                  False)

  call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 16), jnp.float32),
                        compiler_params=plgpu.CompilerParams(num_warps=4))
  text = jax.jit(call).trace(jnp.ones((16, 16))).lower(lowering_platforms=("cuda",)).as_text()
  for ptx in ("lg2.approx.ftz.f32", "rcp.approx.ftz.f32"):
    assert (ptx in text) is not exact
  assert ("__nv_exp2f" in text) is not exact  # jnp.exp2: one ex2 instruction once compiled
  for libdevice in ("__nv_expf", "__nv_log1pf"):
    assert (libdevice in text) is exact


@pytest.mark.parametrize("exact", [False, True])
def test_interpreted_values_agree_with_and_without_exact_math(exact, monkeypatch):
  monkeypatch.setenv("FLAXDOC_PALLAS_EXACT_MATH", "1" if exact else "0")
  x = np.linspace(-40, 40, 801).astype(np.float32).astype(np.float64)
  np.testing.assert_allclose(np.asarray(pm.log_sigmoid(f32(x), True)),
                             np.minimum(x, 0) - np.log1p(np.exp(-np.abs(x))), rtol=2e-7, atol=2e-7)
  autodiff = jax.vmap(jax.grad(jax.nn.log_sigmoid))(f32(x))
  np.testing.assert_allclose(np.asarray(pm.log_sigmoid_slope(f32(x), True)),
                             np.asarray(autodiff), rtol=6e-6, atol=1e-30)
  np.testing.assert_allclose(np.asarray(pm.log1p(f32(np.abs(x) * 25), True)),
                             np.log1p(np.abs(x) * 25), rtol=2e-7, atol=1.2e-7)


def test_the_fused_kernels_evaluate_no_libdevice_exp_or_log1p_per_pair():
  """ETC + Rich (three kernels) and the GCN (saving, five kernels) lowered for CUDA:
  per pair and per edge element only the single-instruction forms. The one `__nv_logf`
  left is the forward's log-sum-exp, once per query row."""
  etc, etc_args, *_ = kernel_sass.etc_problem(None, length=200, heads=2)
  gcn, gcn_args, *_ = kernel_sass.gcn_problem(None, save=True, nodes=64, hidden=96)
  for fn, args, kernels in ((etc, etc_args, 3), (gcn, gcn_args, 5)):
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    calls = [line for line in text.splitlines() if "xla.gpu.triton" in line]
    assert len(calls) == kernels
    for line in calls:
      name = re.search(r'name = \\?"([a-z_]+)', line).group(1)
      assert "__nv_expf" not in line and "__nv_log1pf" not in line, name
      assert line.count("__nv_logf") == (1 if name == "etc_rich_forward" else 0), name
      if name.startswith("etc"):
        assert "lg2.approx.ftz.f32" in line, name
      if name == "gcn_saving_scores":
        assert "rcp.approx.ftz.f32" in line, name
