"""`flaxdoc.bench.gemm_floor`: every product of a lowered step, counted as often as it runs."""

import collections

import jax
import jax.numpy as jnp
import optax
import pytest

from flaxdoc.bench import accelerator as acc
from flaxdoc.bench import gemm_floor


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


def test_parse_dot_reads_dimension_numbers_and_refuses_what_it_cannot_read():
  line = ("%5 = stablehlo.dot_general %3, %4, batching_dims = [0] x [0], contracting_dims = "
          "[2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<4x8x16xbf16>, "
          "tensor<4x16x32xbf16>) -> tensor<4x8x32xf32>")
  d = gemm_floor.parse_dot(line)
  assert (d.lhs, d.rhs, d.out) == ((4, 8, 16), (4, 16, 32), (4, 8, 32))
  assert (d.lhs_contract, d.rhs_contract, d.out_dtype) == ((2,), (1,), "float32")
  assert d.flop == 2 * 4 * 8 * 32 * 16
  with pytest.raises(ValueError, match="cannot read"):
    gemm_floor.parse_dot("%5 = stablehlo.dot_general %3, %4 : (tensor<4xf32>)")
  with pytest.raises(ValueError, match="element type 'f8E4M3FN'"):
    gemm_floor.parse_dot(line.replace("xf32>", "xf8E4M3FN>"))
  with pytest.raises(ValueError, match="no @main"):
    gemm_floor.count_dots("func.func private @g() {\n}\n")


def test_the_shrunk_steps_products_match_the_analytic_flop_count():
  # The XLA paths keep every product in StableHLO: the parsed FLOPs must agree with
  # accelerator.train_step_tflop (an independent formula) up to the small products
  # it leaves out (global-token rows, the GCN input projection's extras).
  step, (p, o, data), _, head, sizes = acc.pretrain_step(128, 2, "bfloat16", "float32",
                                                         acc.LOCAL, True)
  counts = gemm_floor.count_dots(_lowered(step, p, o, data, jax.random.key(0)))
  parsed = sum(d.flop * n for d, n in counts.items()) / 1e12
  assert parsed == pytest.approx(acc.train_step_tflop(128, 2, sizes, head), rel=0.03)
  assert collections.Counter(d.out_dtype for d in counts)["bfloat16"] > len(counts) // 2


def test_the_timed_copies_are_all_computed():
  # Two earlier forms were wrong: one dispatch per product (the host's dispatch charged
  # to each), and copies on the same operands (XLA merged them into one product).
  d = gemm_floor.Dot((64, 32), (32, 48), (64, 48), "float32", "float32", "float32", (), (),
                     (1,), (0,))
  f, args = gemm_floor.chained_products(d, chain=5)
  assert len(args[0]) == 5
  hlo = jax.jit(f).lower(*args).compile().as_text()
  assert hlo.count(" dot(") == 5


def test_time_dot_and_adamw_run_the_product_and_the_update():
  d = gemm_floor.Dot((4, 8, 16), (4, 16, 32), (4, 8, 32), "float32", "float32", "float32",
                     (0,), (0,), (2,), (1,))
  assert gemm_floor.time_dot(d, iters=2) > 0
  bad = gemm_floor.Dot((8, 16), (16, 32), (8, 31), "float32", "float32", "float32", (), (),
                       (1,), (0,))
  with pytest.raises(ValueError, match="gives shape"):
    gemm_floor.time_dot(bad, iters=1)
  tx = optax.adamw(1e-3)
  params = {"w": jnp.ones((64, 64))}
  assert gemm_floor.time_adamw(tx, params, tx.init(params), iters=2) > 0


@pytest.mark.slow  # times ~70 products one by one
def test_summary_row_of_the_shrunk_step():
  summary, rows = gemm_floor.run(128, 2, "float32", "xla", "xla", iters=1, local=True,
                                 peak_tflops=1.0, step_ms=1e6)
  assert summary["dots"] == sum(r["count"] for r in rows) and summary["distinct"] == len(rows)
  assert summary["gemm_ms"] == pytest.approx(sum(r["ms_total"] for r in rows))
  assert summary["floor_ms"] == pytest.approx(summary["gemm_ms"] + summary["adamw_ms"])
  assert summary["bound_mfu"] == pytest.approx(
      summary["model_tflop"] / (summary["floor_ms"] / 1e3) / 1.0)
  assert summary["step_over_floor"] == pytest.approx(1e6 / summary["floor_ms"])
  assert [r["ms_total"] for r in rows] == sorted((r["ms_total"] for r in rows), reverse=True)
  assert sum(r["share"] for r in rows) == pytest.approx(1.0)
