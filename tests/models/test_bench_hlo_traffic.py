"""`flaxdoc.bench.hlo_traffic`: bytes per op of a compiled module, by class and model part.

A hand-written module (a fusion that only slices a big operand, a cuBLAS call, a Triton
call, tuples) checks the counting rules exactly; a module XLA:CPU compiles here checks
that real compiler output parses to the bytes its shapes give. The deviceless H100
compile runs only where JAX's CUDA plugin is installed (it is not in CI).
"""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from flaxdoc.bench import hlo_traffic
from flaxdoc.bench import profile_summary

MODULE = """HloModule jit_step, entry_computation_layout={(bf16[64,32]{1,0})->bf16[8,32]{1,0}}

%fused_slice (param_0.1: bf16[64,32], param_1.2: f32[32]) -> bf16[8,32] {
  %param_0.1 = bf16[64,32]{1,0} parameter(0)
  %slice.3 = bf16[8,32]{1,0} slice(%param_0.1), slice={[0:8], [0:32]}
  %param_1.2 = f32[32]{0} parameter(1)
  %convert.4 = bf16[32]{0} convert(%param_1.2)
  %broadcast.5 = bf16[8,32]{1,0} broadcast(%convert.4), dimensions={1}
  ROOT %add.6 = bf16[8,32]{1,0} add(%slice.3, %broadcast.5), metadata={op_name="jit(step)/jvp(M)/encoder/layer_0/attention/add"}
}

ENTRY %main.9 (p0: bf16[64,32], p1: f32[32], p2: bf16[32,32]) -> bf16[8,32] {
  %p0 = bf16[64,32]{1,0} parameter(0), metadata={op_name="x"}
  %p1 = f32[32]{0} parameter(1), metadata={op_name="b"}
  %p2 = bf16[32,32]{1,0} parameter(2), metadata={op_name="w"}
  %loop_slice_fusion = bf16[8,32]{1,0} fusion(%p0, %p1), kind=kLoop, calls=%fused_slice
  %custom-call.1 = (bf16[8,32]{1,0}, s8[1024]{0}) custom-call(%loop_slice_fusion, %p2), custom_call_target="__cublas$gemm", metadata={op_name="jit(step)/transpose(jvp(M))/encoder/layer_0/mlp_in/dot_general"}
  %get-tuple-element.2 = bf16[8,32]{1,0} get-tuple-element(%custom-call.1), index=0
  %pallas_call.3 = bf16[8,32]{1,0} custom-call(%get-tuple-element.2), custom_call_target="__gpu$xla.gpu.triton", metadata={op_name="jit(step)/jvp(M)/super_tokens/layer_0/gcn_pool/pallas_call"}
  ROOT %copy.4 = bf16[8,32]{1,0} copy(%pallas_call.3)
}
"""


def test_counts_by_the_rules_on_a_hand_written_module():
  rows = {r["name"]: r for r in hlo_traffic.op_traffic(MODULE)}
  assert set(rows) == {"loop_slice_fusion", "custom-call.1", "pallas_call.3", "copy.4"}
  fusion = rows["loop_slice_fusion"]
  # It slices 8 of p0's 64 rows: 8 * 32 * 2 bytes read from p0, all of p1 (32 * 4).
  assert (fusion["read"], fusion["written"]) == (8 * 32 * 2 + 32 * 4, 8 * 32 * 2)
  assert (fusion["cls"], fusion["part"]) == ("xla", "attention")  # op_name from its body
  gemm = rows["custom-call.1"]
  assert gemm["cls"] == "gemm" and gemm["part"] == "feed-forward (backward)"
  assert (gemm["read"], gemm["written"]) == (8 * 32 * 2 + 32 * 32 * 2, 8 * 32 * 2 + 1024)
  assert rows["pallas_call.3"]["cls"] == "pallas" and rows["pallas_call.3"]["part"] == "gcn"
  # A copy without metadata takes its operand's op_name (profile_summary.hlo_op_names).
  assert rows["copy.4"]["cls"] == "xla" and rows["copy.4"]["part"] == "gcn"
  s = hlo_traffic.summarise(list(rows.values()), bandwidth=1e9)
  assert s["totals"]["xla"]["gb"] * 1e9 == fusion["read"] + fusion["written"] + 2 * 512
  assert s["totals"]["xla"]["ms_at_bandwidth"] == pytest.approx(
      1e3 * (fusion["read"] + fusion["written"] + 1024) / 1e9)
  assert "while" not in hlo_traffic.format_summary(s)


TWICE_AND_ALIASED = """HloModule jit_step

ENTRY %main.3 (p0: bf16[8,64], p1: bf16[8,64]) -> bf16[8,64] {
  %p0 = bf16[8,64]{1,0} parameter(0)
  %p1 = bf16[8,64]{1,0} parameter(1)
  ROOT %pallas_call.2 = bf16[8,64]{1,0} custom-call(%p0, %p0, %p1), custom_call_target="__gpu$xla.gpu.triton", output_to_operand_aliasing={{}: (2, {})}, metadata={op_name="jit(step)/transpose(jvp(M))/super_tokens/layer_0/gcn_saved_backward_target/pallas_call"}
}
"""


def test_a_buffer_passed_twice_is_read_once_and_an_aliased_one_not_at_all():
  """The GCN kernels take `[S | N]` as two operands, and the target-side backward writes
  into the array the source side wrote (its last operand, aliased to its output)."""
  (row,) = hlo_traffic.op_traffic(TWICE_AND_ALIASED)
  assert (row["read"], row["written"]) == (8 * 64 * 2, 8 * 64 * 2)
  assert row["cls"] == "pallas" and row["part"] == "gcn (backward)"


def test_a_module_xla_compiled_here_parses_to_its_shapes_bytes():
  def f(x, y):
    return jnp.tanh(x[:256] * 2.0) @ y, jnp.sum(x, axis=0)

  x = jnp.ones((1024, 512), jnp.float32)
  y = jnp.ones((512, 128), jnp.float32)
  text = jax.jit(f).lower(x, y).compile().as_text()
  rows = hlo_traffic.op_traffic(text)
  assert rows and all(r["read"] >= 0 and r["written"] >= 0 for r in rows)
  # Every output the function returns is written by some op; the column sums read all of x.
  written = sum(r["written"] for r in rows)
  assert written >= 256 * 128 * 4 + 512 * 4
  assert max(r["read"] for r in rows) >= 1024 * 512 * 4


@pytest.mark.skipif(not hlo_traffic.cuda_plugin_available(),
                    reason="JAX's CUDA plugin is absent (pip install jax-cuda13-plugin==<jax "
                           "version>; no GPU needed)")
@pytest.mark.slow
def test_the_step_compiles_for_an_h100_without_one(tmp_path):
  # In a process of its own: the CUDA plugin must register before JAX starts its backends,
  # which other tests in this process may have done.
  out = subprocess.run([sys.executable, "-m", "flaxdoc.bench.hlo_traffic", "--length", "128",
                        "--batch", "2", "--json", "--save", str(tmp_path / "step.hlo.txt.gz")],
                       capture_output=True, text=True, timeout=1200)
  assert out.returncode == 0, out.stderr[-3000:]
  s = json.loads(out.stdout)
  assert {"xla", "gemm", "pallas"} <= set(s["totals"])
  # The saved module reads back (gzipped) to the same summary.
  again = hlo_traffic.summarise(hlo_traffic.op_traffic(
      profile_summary.read_hlo_text(tmp_path / "step.hlo.txt.gz")))
  s.pop("note")  # the command line's remark on while loops; the counts must agree
  again.pop("note")
  assert json.loads(json.dumps(again)) == s


def test_the_command_line_reads_a_saved_module_plain_or_gzipped(tmp_path, capsys):
  """`--hlo` takes the module text as saved here (`--save`) or gzipped, as `bench.accelerator
  --profile` writes the module a GPU ran (too large to bring back from a lent machine
  otherwise): both give the summary of the text itself."""
  want = hlo_traffic.summarise(hlo_traffic.op_traffic(MODULE))
  for name in ("m.hlo.txt", "m.hlo.txt.gz"):
    profile_summary.write_hlo_text(tmp_path / name, MODULE)
    capsys.readouterr()
    assert hlo_traffic.main(["--hlo", str(tmp_path / name), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(want))
  assert (tmp_path / "m.hlo.txt.gz").read_bytes()[:2] == b"\x1f\x8b"  # gzip's magic


def test_no_cuda_backend_is_a_clear_error(monkeypatch):
  """Where JAX's backends started before the CUDA plugin could register (or there is no
  plugin), JAX says "topology not implemented"; the compile says what to do instead."""
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel

  def no_cuda(**_):
    raise NotImplementedError("topology not implemented for cuda")

  monkeypatch.setattr(topologies, "get_topology_desc", no_cuda)
  with pytest.raises(RuntimeError, match="process of its own"):
    hlo_traffic.compile_step_text(128, 2)
