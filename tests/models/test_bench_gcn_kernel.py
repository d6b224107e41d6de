"""`flaxdoc.bench.gcn_kernel` on CPU: the XLA row, a fused row, and their errors (interpreted)."""

import dataclasses

import pytest

from flaxdoc.bench import gcn_kernel
from flaxdoc.nn import gcn_pallas


def test_tiles_parse_and_the_sweep_is_valid():
  assert gcn_kernel.parse_tiles("16,32,32,4") == gcn_pallas.DEFAULT_TILES
  assert len({gcn_kernel.parse_tiles(t) for t in gcn_kernel.SWEEP}) == len(gcn_kernel.SWEEP)
  assert gcn_pallas.DEFAULT_TILES not in {gcn_kernel.parse_tiles(t) for t in gcn_kernel.SWEEP}
  with pytest.raises(ValueError, match="four integers"):
    gcn_kernel.parse_tiles("16,32")


def test_without_tiles_each_chosen_form_brings_its_default_tiling(monkeypatch):
  seen = []
  monkeypatch.setattr(gcn_kernel, "run", lambda p, dtype, tiles, *a, **k: seen.append(tiles) or [])
  monkeypatch.setattr(gcn_kernel.kernel_rows, "emit", lambda *a, **k: None)
  gcn_kernel.main(["--local", "--kernels", "pallas", "pallas_dpre"])
  gcn_kernel.main(["--local", "--kernels", "pallas_dpre", "--tiles", "16,32,32,4"])
  assert seen == [[gcn_pallas.DEFAULT_TILES, gcn_pallas.DPRE_TILES], [gcn_pallas.DEFAULT_TILES]]


@pytest.mark.slow  # the kernels' own tests cover the values; this is the bench's plumbing
@pytest.mark.parametrize("graph, kernels", [("local", ("pallas", "pallas_saved")),
                                            ("random", ("pallas",))])
def test_rows_report_times_and_errors_against_float32(graph, kernels):
  p = dataclasses.replace(gcn_kernel.LOCAL, graph=graph)
  rows = list(gcn_kernel.run(p, "float32", [gcn_pallas.Tiles(8, 16, 16, 4)], iters=1,
                             kernels=kernels))
  assert [r["impl"] for r in rows] == ["xla", *kernels]
  xla, *fused_rows = rows
  assert xla["xla_out_err"] == 0 and xla["xla_grad_err"] == 0  # float32 against itself
  for fused in fused_rows:
    assert xla["fwd_ms"] > 0 and fused["fwd_bwd_ms"] > 0
    assert fused["out_err"] < 1e-5 and fused["grad_err"] < 1e-5
    assert fused["speedup_fwd"] == pytest.approx(xla["fwd_ms"] / fused["fwd_ms"])


def test_unknown_graph_is_an_error():
  with pytest.raises(ValueError, match="graph must be"):
    gcn_kernel.make(dataclasses.replace(gcn_kernel.LOCAL, graph="grid"), "float32")
