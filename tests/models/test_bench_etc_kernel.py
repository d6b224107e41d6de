"""`flaxdoc.bench.etc_kernel` on CPU: the XLA row, a fused row, and their errors (interpreted)."""

import dataclasses

import pytest

from flaxdoc.bench import etc_kernel
from flaxdoc.nn import etc_pallas


def test_tiles_parse_and_the_sweep_is_valid():
  assert etc_kernel.parse_tiles("16,64,2,16,32,2") == etc_pallas.DEFAULT_TILES
  assert len({etc_kernel.parse_tiles(t) for t in etc_kernel.SWEEP}) == len(etc_kernel.SWEEP)
  with pytest.raises(ValueError, match="six integers"):
    etc_kernel.parse_tiles("32,64")


@pytest.mark.slow
def test_rows_report_times_and_errors_against_float32():
  p = dataclasses.replace(etc_kernel.LOCAL, length=64)
  rows = list(etc_kernel.run(p, "float32", [etc_pallas.Tiles(16, 32, 4, 32, 16, 4)], iters=1))
  assert [r["impl"] for r in rows] == ["xla", "pallas"]
  xla, fused = rows
  assert xla["fwd_ms"] > 0 and fused["fwd_bwd_ms"] > 0
  assert xla["xla_out_err"] == 0 and xla["xla_grad_err"] == 0  # float32 against itself
  assert fused["out_err"] < 1e-5 and fused["grad_err"] < 1e-5
  assert fused["speedup_fwd"] == pytest.approx(xla["fwd_ms"] / fused["fwd_ms"])
