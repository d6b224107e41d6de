"""`flaxdoc.bench.gemm_floor`: every product of a lowered step, counted as often as it runs."""

import collections

import jax
import jax.numpy as jnp
import optax
import pytest

from flaxdoc.bench import pretrain_step as ps
from flaxdoc.bench import gemm_floor
from flaxdoc.data import masking


def _lowered(f, *args) -> str:
  return jax.jit(f).lower(*args).as_text()


def test_products_in_a_called_function_count_once_per_call():
  g = jax.jit(lambda x, w: x @ w)  # a private function of the outer module

  def f(x, w, y):
    return g(x, w) + g(x + 1.0, w), jnp.einsum("bij,bjk->bik", y, y)

  x, w, y = jnp.ones((8, 16)), jnp.ones((16, 32)), jnp.ones((3, 4, 4), jnp.bfloat16)
  text = _lowered(f, x, w, y)
  assert text.count("stablehlo.dot_general") == 2  # g's body once, the einsum once
  counts = gemm_floor.count_dots(text)
  assert sorted(counts.values()) == [1, 2]
  matmul = next(d for d in counts if d.lhs == (8, 16))
  assert counts[matmul] == 2
  assert (matmul.rhs, matmul.out, matmul.out_dtype) == ((16, 32), (8, 32), "float32")
  assert matmul.flop == 2 * 8 * 16 * 32
  batched = next(d for d in counts if d.lhs_batch)
  assert (batched.lhs_batch, batched.rhs_batch, batched.lhs_dtype) == ((0,), (0,), "bfloat16")
  assert batched.flop == 2 * 3 * 4 * 4 * 4


def test_products_count_through_nested_calls():
  inner = jax.jit(lambda x, w: x @ w)
  mid = jax.jit(lambda x, w: inner(x, w) + inner(x + 1.0, w))
  x = jnp.ones((4, 8))
  w = jnp.ones((8, 8))
  text = _lowered(lambda x, w: mid(x, w) + mid(2.0 * x, w) + x @ w, x, w)
  assert text.count("stablehlo.dot_general") == 2  # inner's body and the last product
  assert sum(gemm_floor.count_dots(text).values()) == 2 * 2 + 1


@pytest.mark.parametrize("where", ["scan", "scan_call", "cond"])
def test_a_product_in_a_loop_or_branch_is_an_error_not_a_miscount(where):
  inner = jax.jit(lambda x, w: x @ w)
  bodies = {
      "scan": lambda x, w: jax.lax.scan(lambda c, _: (c @ w, None), x, None, length=5)[0],
      "scan_call": lambda x, w: jax.lax.scan(lambda c, _: (inner(c, w), None), x, None,
                                             length=5)[0],
      "cond": lambda x, w: jax.lax.cond(x[0, 0] > 0, lambda: x @ w, lambda: x),
  }
  text = _lowered(bodies[where], jnp.ones((4, 4)), jnp.ones((4, 4)))
  with pytest.raises(ValueError, match="inside a loop or branch"):
    gemm_floor.count_dots(text)
  # A loop without products (as the PRNG's) is fine.
  plain = _lowered(lambda x: jax.lax.fori_loop(0, 3, lambda i, c: c + 1.0, x) @ x,
                   jnp.ones((4, 4)))
  assert sum(gemm_floor.count_dots(plain).values()) == 1


def test_parse_dot_reads_dimension_numbers_and_refuses_what_it_cannot_read():
  line = ("%5 = stablehlo.dot_general %3, %4, batching_dims = [0] x [0], contracting_dims = "
          "[2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<4x8x16xbf16>, "
          "tensor<4x16x32xbf16>) -> tensor<4x8x32xf32>")
  d = gemm_floor.parse_dot(line)
  assert (d.lhs, d.rhs, d.out) == ((4, 8, 16), (4, 16, 32), (4, 8, 32))
  assert (d.lhs_contract, d.rhs_contract, d.out_dtype) == ((2,), (1,), "float32")
  assert d.flop == 2 * 4 * 8 * 32 * 16
  assert d.precision == ()  # DEFAULT
  assert gemm_floor.parse_dot(line.replace("[DEFAULT, DEFAULT]", "[HIGHEST, HIGHEST]")
                              ).precision == ("HIGHEST", "HIGHEST")
  with pytest.raises(ValueError, match="not a number"):
    gemm_floor.parse_dot(line.replace("tensor<4x8x16xbf16>", "tensor<?x8x16xbf16>"))
  with pytest.raises(ValueError, match="cannot read"):
    gemm_floor.parse_dot("%5 = stablehlo.dot_general %3, %4 : (tensor<4xf32>)")
  with pytest.raises(ValueError, match="element type 'f8E4M3FN'"):
    gemm_floor.parse_dot(line.replace("xf32>", "xf8E4M3FN>"))
  with pytest.raises(ValueError, match="no @main"):
    gemm_floor.count_dots("func.func private @g() {\n}\n")


def test_the_shrunk_steps_products_match_the_analytic_flop_count():
  # The XLA paths keep every product in StableHLO: the parsed FLOPs must agree with
  # pretrain_step.train_step_tflop (an independent formula) up to the small products
  # it leaves out (global-token rows, the GCN input projection's extras).
  step, (p, o, data), _, head, sizes = ps.pretrain_step(128, 2, "bfloat16", "float32",
                                                        ps.LOCAL, True)
  counts = gemm_floor.count_dots(_lowered(step, p, o, data, jax.random.key(0)))
  parsed = sum(d.flop * n for d, n in counts.items()) / 1e12
  assert parsed == pytest.approx(ps.train_step_tflop(128, 2, sizes, head), rel=0.03)
  assert collections.Counter(d.out_dtype for d in counts)["bfloat16"] > len(counts) // 2


def test_padded_rows_reach_the_steps_products():
  # 128 tokens and the global are 129 rows; padded to 8, every product over the encoder's
  # rows runs over 136 (the ETC blocks of 17 hold 136 long rows either way).
  def row_counts(pad):
    step, (p, o, data), *_ = ps.pretrain_step(128, 2, "float32", "float32", ps.LOCAL, True,
                                              ps.StepOptions(pad_to_multiple_of=pad))
    dots = gemm_floor.count_dots(_lowered(step, p, o, data, jax.random.key(0)))
    return collections.Counter(n for d in dots for n in d.lhs + d.rhs if n in (129, 136))

  unpadded, padded = row_counts(1), row_counts(8)
  assert unpadded[129] > 0 and padded[129] == 0
  assert padded[136] > unpadded[136]


def test_braces_and_calls_inside_strings_are_not_structure():
  # A Pallas kernel's custom call carries its Triton module in strings, braces and all:
  # an unbalanced brace there once ended @main early, and the GPU floor counted 4 of
  # the step's products.
  dot = ("    %{n} = stablehlo.dot_general %0, %1, contracting_dims = [1] x [0] : "
         "(tensor<4x8xf32>, tensor<8x2xf32>) -> tensor<4x2xf32>")
  text = "\n".join([
      "func.func public @main(%0: tensor<4x8xf32>, %1: tensor<8x2xf32>) {",
      dot.format(n=2),
      '    %3 = stablehlo.custom_call @__gpu$xla.gpu.triton(%0) {backend_config = "", '
      'mhlo.backend_config = {name = "k}", ir = "call @g \\" ("}} : (tensor<4x8xf32>)',
      dot.format(n=4),
      "    %5 = call @g(%0) : (tensor<4x8xf32>) -> tensor<4x8xf32>",
      '    %6 = call @"<lambda>"(%0) {mhlo.frontend_attributes = {a = "}"}} : '
      "(tensor<4x8xf32>) -> tensor<4x8xf32>",
      "    return %5",
      "  }",
      "func.func private @g(%0: tensor<4x8xf32>) {",
      dot.format(n=1).replace("%1", "%0"),
      "  }",
      'func.func private @"<lambda>"(%0: tensor<4x8xf32> {mhlo.sharding = "{replicated}"}) {',
      dot.format(n=1).replace("%1", "%0"),
      dot.format(n=2).replace("%1", "%0"),
      "  }",
  ])
  # The custom call's and the call's attribute strings each hold an unbalanced brace,
  # which once ended @main early.
  # Two in @main, one in @g (called once), two in @"<lambda>" (called once).
  assert sum(gemm_floor.count_dots(text).values()) == 5


def test_the_gpu_steps_products_are_all_found(monkeypatch):
  # The shrunk step with both fused kernels, lowered for CUDA on this CPU (the kernels
  # compile for a GPU when the backend says so): the products outside the kernels carry
  # most of the analytic FLOPs (the kernels' own scores and messages are not products).
  step, (p, o, data), _, head, sizes = ps.pretrain_step(
      128, 2, "bfloat16", "float32", ps.LOCAL, True,
      ps.StepOptions(etc_kernel="pallas", gcn_kernel="pallas_saved"))
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  text = jax.jit(step).trace(p, o, data, jax.random.key(0)).lower(
      lowering_platforms=("cuda",)).as_text()
  assert text.count("xla.gpu.triton") >= 3 * sizes.layers
  counts = gemm_floor.count_dots(text)
  parsed = sum(d.flop * n for d, n in counts.items()) / 1e12
  analytic = ps.train_step_tflop(128, 2, sizes, head)
  assert 0.8 * analytic < parsed < analytic


def test_the_timed_copies_are_all_computed():
  # Two earlier forms were wrong: one dispatch per product (the host's dispatch charged
  # to each), and copies on the same operands (XLA merged them into one product).
  d = gemm_floor.Dot((64, 32), (32, 48), (64, 48), "float32", "float32", "float32", (), (),
                     (1,), (0,))
  f, args = gemm_floor.chained_products(d, chain=5)
  assert len(args[0]) == len(args[1]) == 5
  # Neither operand is shared between copies (XLA's GPU dot merger joins products
  # that share one, which this CPU compile would not show).
  for operands in args:
    assert len({float(x.sum()) for x in operands}) == 5
  hlo = jax.jit(f).lower(*args).compile().as_text()
  assert hlo.count(" dot(") == 5


def test_time_dot_divides_by_the_copies_and_adamw_updates_in_place(monkeypatch):
  d = gemm_floor.Dot((4, 8, 16), (4, 16, 32), (4, 8, 32), "float32", "float32", "float32",
                     (0,), (0,), (2,), (1,))
  calls = []

  def fake_timer(fn, warmup, iters):
    outputs = fn()
    calls.append(len(outputs))
    assert outputs[0].shape == (4, 8, 32)
    return 1.0

  monkeypatch.setattr(gemm_floor.common, "time_back_to_back", fake_timer)
  assert gemm_floor.time_dot(d, iters=2, chain=4) == pytest.approx(1 / 4)
  assert calls == [4]
  monkeypatch.undo()
  assert gemm_floor.time_dot(d, iters=2) > 0
  bad = gemm_floor.Dot((8, 16), (16, 32), (8, 31), "float32", "float32", "float32", (), (),
                       (1,), (0,))
  with pytest.raises(ValueError, match="gives shape"):
    gemm_floor.time_dot(bad, iters=1)
  tx = optax.adamw(1e-3)
  params = {"w": jnp.ones((64, 64))}
  opt_state = tx.init(params)
  assert gemm_floor.time_adamw(tx, params, opt_state, iters=2) > 0
  assert params["w"].is_deleted()  # donated: updated in place, as in the step


@pytest.mark.slow  # times ~70 products one by one
def test_summary_row_of_the_shrunk_step():
  summary, rows = gemm_floor.run(128, 2, "float32", iters=1, local=True, peak_tflops=1.0,
                                 step_ms=1e6)
  assert summary["dots"] == sum(r["count"] for r in rows) and summary["distinct"] == len(rows)
  assert summary["gemm_ms"] == pytest.approx(sum(r["ms_total"] for r in rows))
  assert summary["floor_ms"] == pytest.approx(summary["gemm_ms"] + summary["adamw_ms"])
  assert summary["bound_mfu"] == pytest.approx(
      summary["model_tflop"] / (summary["floor_ms"] / 1e3) / 1.0)
  assert summary["step_over_floor"] == pytest.approx(1e6 / summary["floor_ms"])
  assert [r["ms_total"] for r in rows] == sorted((r["ms_total"] for r in rows), reverse=True)
  assert sum(r["share"] for r in rows) == pytest.approx(1.0)
  # Independent of run()'s own sums: the rows' FLOPs, rates and the analytic count.
  assert summary["dot_tflop"] == pytest.approx(sum(r["gflop"] * r["count"] for r in rows) / 1e3)
  for r in rows:
    assert r["tflops"] == pytest.approx(r["gflop"] / r["ms_each"])
  assert summary["model_tflop"] == pytest.approx(
      ps.train_step_tflop(128, 2, ps.LOCAL, masking.default_max_predictions(128, ps.MLM_RATE)))
  assert summary["dot_tflop"] == pytest.approx(summary["model_tflop"], rel=0.03)
