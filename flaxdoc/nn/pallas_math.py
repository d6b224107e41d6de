"""Float32 transcendentals for the fused Pallas kernels: one GPU instruction where one will do.

Pallas' Triton lowering calls libdevice for `exp`, `log` and `log1p` (`__nv_expf`,
`__nv_logf`, `__nv_log1pf`: correctly rounded to about an ulp, and long: compiled for
sm_90 they take about 8, 24 and 28 instructions an element, `log1p` with a branch), and
a float division is about 8. The kernels evaluate these per pair (ETC + Rich Attention)
or per edge and hidden unit (the GCN), where those sequences were about half the
per-pair instructions (`python -m flaxdoc.bench.kernel_sass`). The hardware's special
function unit computes `2^x`, `log2 x` and `1/x` in one instruction each to about 2^-22
(PTX ISA, `ex2.approx`, `lg2.approx`, `rcp.approx`): far below the bfloat16 rounding of
the kernels' outputs, well inside the float32 tolerances of their log-sum-exp and Rich
gradients, and the base-2 softmax Triton's own flash attention uses.

So the kernels compute through base 2: `exp(x) = 2^(x log2 e)`, `ln x = log2(x) ln 2`.
`jnp.exp2` already lowers to the single instruction; `log2` and the reciprocal go through
inline PTX. Rounding `x log2 e` to float32 costs `exp` a relative error of about
`7e-8 |x|` (2e-6 at |x| = 30): what every base-2 softmax pays. With `interpret=True` (the
CPU tests, Pallas' interpreter) the same formulas run with `jnp.log2` and a division, so
the tests check every rewrite below exactly; only the last bits of the three primitives
differ on a GPU (checked on an H100 in session 9 against float64 on edge inputs: no inf or
NaN where the answer is finite, absolute errors of at most 8e-6; docs/accelerators.md).
`lg2` and `rcp` only ever see arguments >= 1 here (`1 + x`, `1 + e^-|x|`), so their `.ftz`
(subnormals flushed to zero) changes nothing; an `exp` under 1e-38 may come out as 0, which
no softmax weight or slope here can tell apart.

`FLAXDOC_PALLAS_EXACT_MATH=1` puts libdevice's functions and IEEE division back: for timing
the two forms on one GPU, or for ruling them out when a result looks wrong. It is read
when a kernel is traced, so it takes effect in a new process (or an uncached function).
"""

from __future__ import annotations

import math
import os

import jax
import jax.numpy as jnp
from jax.experimental.pallas import triton as plgpu

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


def _ptx(instruction: str, x):
  """One float32 PTX instruction `instruction $0, $1;` applied elementwise."""
  out = jax.ShapeDtypeStruct(x.shape, jnp.float32)
  return plgpu.elementwise_inline_asm(f"{instruction} $0, $1;", args=[x.astype(jnp.float32)],
                                      constraints="=r,r", pack=1, result_shape_dtypes=[out])[0]


def exact() -> bool:
  """Whether `FLAXDOC_PALLAS_EXACT_MATH=1` asks for libdevice's functions on the GPU."""
  return os.environ.get("FLAXDOC_PALLAS_EXACT_MATH", "0") == "1"


def exp2(x, interpret: bool):
  """`2^x`: `jnp.exp2` lowers to one `ex2` instruction already; with exact math it is
  libdevice's `exp` of `x ln 2`, as the `exp` it replaces in the GCN's GELU."""
  del interpret
  return jnp.exp(x * LN2) if exact() else jnp.exp2(x)


def log2(x, interpret: bool):
  return jnp.log2(x) if interpret or exact() else _ptx("lg2.approx.ftz.f32", x)


def reciprocal(x, interpret: bool):
  return 1.0 / x if interpret or exact() else _ptx("rcp.approx.ftz.f32", x)


def exp(x, interpret: bool):
  return jnp.exp(x) if exact() else exp2(x * LOG2E, interpret)


def log(x, interpret: bool):
  return jnp.log(x) if exact() else log2(x, interpret) * LN2


def log1p(x, interpret: bool):
  """`ln(1 + x)` as `ln` of the rounded sum: float32's rounding of the result, plus an
  absolute 6e-8 from the sum, not log1p's relative accuracy near 0. Used where the result
  is added to terms of order 1 (Rich Attention's logits), never where it divides by `x`."""
  return jnp.log1p(x) if exact() else log(1.0 + x, interpret)


def log_sigmoid(x, interpret: bool):
  """`log sigmoid(x) = min(x, 0) - ln(1 + e^-|x|)`, finite for every finite `x`."""
  return jnp.minimum(x, 0.0) - log1p(exp(-jnp.abs(x), interpret), interpret)


def log_sigmoid_slope(x, interpret: bool):
  """`d log_sigmoid(x) / dx = sigmoid(-x)`, as `(1 or e^-|x|) / (1 + e^-|x|)`: nothing
  overflows, and it is built from the same `e^-|x|` and `1 + e^-|x|` as `log_sigmoid(x)`,
  so a kernel taking both (Rich Attention's backward) computes them once: two special
  function instructions a pair fewer there (`bench.kernel_sass`)."""
  e = exp(-jnp.abs(x), interpret)
  return jnp.where(x <= 0, 1.0, e) * reciprocal(1.0 + e, interpret)
