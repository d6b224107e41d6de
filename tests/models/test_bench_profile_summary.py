"""`flaxdoc.bench.profile_summary`: kernel time by name and kind, from a Chrome trace."""

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from flaxdoc.bench import accelerator as acc
from flaxdoc.bench import profile_summary as ps


def _write(tmp_path, events):
  f = tmp_path / "plugins" / "profile" / "run" / "perfetto_trace.json.gz"
  f.parent.mkdir(parents=True)
  with gzip.open(f, "wt") as fh:
    json.dump({"traceEvents": events}, fh)
  return tmp_path


def _lane(pid, name):
  return {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}}


def test_device_lanes_summed_by_name_and_kind(tmp_path):
  x = lambda pid, name, dur: {"ph": "X", "pid": pid, "name": name, "dur": dur, "ts": 0}  # noqa
  events = [_lane(1, "/device:GPU:0"), _lane(2, "/host:CPU"),
            x(1, "sm90_xmma_gemm_bf16", 50.0), x(1, "sm90_xmma_gemm_bf16", 30.0),
            x(1, "scatter_add_fusion", 60.0), x(1, "loop_gather_fusion", 20.0),
            x(1, "input_reduce_fusion", 10.0), x(1, "loop_multiply_fusion", 25.0),
            x(1, "cudnn_flash_fprop", 5.0),
            x(2, "PjitFunction(step)", 1000.0)]  # host work is not kernel time
  s = ps.summarise(ps.load_events(_write(tmp_path, events)))
  assert s["lanes"] == ["/device:GPU:0"]
  assert s["total_us"] == pytest.approx(200.0)
  kinds = {k["kind"]: k["us"] for k in s["kinds"]}
  assert kinds == {"matmul": 80.0, "scatter": 60.0, "gather": 20.0, "reduce": 10.0,
                   "fusion": 25.0, "attention": 5.0}
  assert [k["kind"] for k in s["kinds"]][:2] == ["matmul", "scatter"]  # largest first
  top = s["kernels"][0]
  assert (top["name"], top["us"], top["count"], top["share"]) == (
      "sm90_xmma_gemm_bf16", 80.0, 2, pytest.approx(0.4))
  assert sum(k["share"] for k in s["kinds"]) == pytest.approx(1.0)
  text = ps.format_summary(s)
  assert "scatter" in text and "30.0%" in text


def test_missing_and_broken_traces_name_the_path(tmp_path):
  with pytest.raises(ps.TraceError, match="no such"):
    ps.find_trace(tmp_path / "nope")
  with pytest.raises(ps.TraceError, match="perfetto_trace"):
    ps.find_trace(tmp_path)
  bad = tmp_path / "bad.json.gz"
  bad.write_bytes(b"not gzip")
  with pytest.raises(ps.TraceError, match="bad.json.gz"):
    ps.load_events(bad)
  assert ps.main([str(tmp_path / "nope")]) == 1


def test_a_real_cpu_trace_has_the_jitted_kernels(tmp_path):
  import jax
  import jax.numpy as jnp
  f = jax.jit(lambda a: jnp.tanh(a @ a).sum())
  a = jnp.asarray(np.ones((128, 128), np.float32))
  f(a).block_until_ready()
  with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True):
    for _ in range(3):
      f(a).block_until_ready()
  s = ps.summarise(ps.load_events(tmp_path))
  assert s["total_us"] > 0 and s["kernels"]
  assert not any(k["name"].startswith("$") for k in s["kernels"])  # Python frames dropped
  assert sum(k["share"] for k in s["kinds"]) == pytest.approx(1.0)


@pytest.mark.slow
def test_accelerator_profile_flag_writes_a_trace_and_its_summary(tmp_path):
  row = acc.run_one(dict(part="pretrain", length=64, batch=2, dtype="float32",
                         param_dtype="float32", local=True, peak_tflops=1.0, iters=1,
                         profile=str(tmp_path)))[0]
  assert row["profile"].startswith(str(tmp_path))
  assert ps.find_trace(row["profile"]).exists()
  assert sum(row["profile_kinds"].values()) == pytest.approx(1.0, abs=1e-3)
  # Kernel time by model part: the GCN, attention and MLM head are each found in the step.
  parts = row["profile_parts"]
  assert sum(parts.values()) == pytest.approx(1.0, abs=1e-3)
  assert {"gcn", "gcn (backward)", "attention", "mlm head"} <= set(parts)
  # XLA:CPU names kernels after their HLO ops; what stays unnamed is mostly loop-state copies.
  assert parts.get("unattributed", 0.0) < 0.1
  assert ps.read_hlo_text(Path(row["profile"]) / "step.hlo.txt.gz").startswith("HloModule")


HLO = """HloModule jit_step

%fused_computation.7 (param_0: f32[8]) -> f32[8] {
  %param_0 = f32[8]{0} parameter(0)
  ROOT %multiply.1 = f32[8]{0} multiply(%param_0, %param_0), metadata={op_name="jit(step)/transpose(jvp(FormNet))/super_tokens/gcn_layer_0/mul" source_file="gcn.py"}
}

ENTRY %main.9 (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %dot.3 = f32[8]{0} dot(%p, %p), metadata={op_name="jit(step)/jvp(FormNet)/encoder/layer_0/attention/dot_general"}
  %loop_multiply_fusion.7 = f32[8]{0} fusion(%dot.3), kind=kLoop, calls=%fused_computation.7
  %custom-call.2 = f32[8]{0} custom-call(%p), custom_call_target="__cublas$gemm", metadata={op_name="jit(step)/jvp(FormNet)/mlm_head/dot_general"}
  %custom-call.5 = f32[8]{0} custom-call(%p), custom_call_target="__gpu$xla.gpu.triton", metadata={op_name="jit(step)/jvp(FormNet)/super_tokens/layer_0/gcn_edge_dot/pallas_call"}
  %custom-call.6 = f32[8]{0} custom-call(%p), custom_call_target="__gpu$xla.gpu.triton", metadata={op_name="jit(step)/transpose(jvp(FormNet))/super_tokens/layer_0/gcn_edge_dot/pallas_call"}
  %custom-call.7 = f32[8]{0} custom-call(%p), custom_call_target="__gpu$xla.gpu.triton", metadata={op_name="jit(step)/jvp(FormNet)/encoder/layer_0/attention/attention._fused/etc_rich_forward/pallas_call"}
  ROOT %custom-call.8 = f32[8]{0} custom-call(%p), custom_call_target="__gpu$xla.gpu.triton", metadata={op_name="jit(step)/transpose(jvp(FormNet))/super_tokens/layer_0/gcn_backward_source_writing/pallas_call"}
}
"""


def test_kernel_time_by_model_part_from_the_hlo_metadata(tmp_path, capsys):
  names = ps.hlo_op_names(HLO)
  assert names["dot.3"].endswith("attention/dot_general")
  assert "gcn_layer_0" in names["loop_multiply_fusion.7"]  # from the computation it calls
  x = lambda name, dur, **args: {"ph": "X", "pid": 1, "name": name, "dur": dur, "ts": 0,  # noqa
                                 "args": args}
  events = [_lane(1, "/device:GPU:0"),
            x("loop_multiply_fusion_7", 40.0, hlo_op="command_buffer_1"),  # GPU: `.` -> `_`
            x("dot.3", 30.0),  # CPU: the instruction's own name
            x("nvjet_sm90_tst_128x256", 20.0, hlo_op="custom-call.2"),  # named by its hlo_op
            x("nvjet_sm90_tst_64x64", 10.0, hlo_op="command_buffer_1"),  # inside a CUDA graph
            # Pallas kernels, by their pallas_call's name (XLA's `__1` for a second copy)
            x("gcn_backward_source_writing", 7.0, hlo_op="command_buffer_1"),
            x("gcn_edge_dot", 5.0), x("gcn_edge_dot__1", 4.0),  # forward and backward alike
            x("etc_rich_forward", 3.0), x("my_kernel", 1.0)]
  parts = {p["part"]: p["us"] for p in ps.summarise_parts(events, names)}
  assert parts == {"gcn (backward)": 47.0, "attention": 33.0, "mlm head": 20.0,
                   "gcn / gcn (backward)": 9.0, "unattributed": 11.0}
  assert ps.part_of("jit(step)/jvp(FormNet)/encoder/layer_2/attention/term_0/log_sigmoid") == \
      "layout terms"
  assert ps.part_of("jit(step)/transpose(jvp(FormNet))/encoder/layer_2/attention_norm/mul") == \
      "layer norm (backward)"
  assert ps.part_of("jit(step)/jvp(FormNet)/super_tokens/gcn_0/layer_norm/mul") == "gcn"
  assert ps.part_of("jit(step)/add") == "optimizer"  # outside the model's jvp: the update
  # The command line finds the module text beside the trace.
  folder = _write(tmp_path, events)
  (folder / "step.hlo.txt").write_text(HLO)
  capsys.readouterr()
  assert ps.main([str(folder), "--json"]) == 0
  printed = json.loads(capsys.readouterr().out)
  assert {p["part"]: p["us"] for p in printed["parts"]} == parts
  assert ps.main([str(folder), "--hlo", str(tmp_path / "missing.txt")]) == 1
  # Gzipped (as `bench.accelerator --profile` writes it: a GPU step's text is ~17 MB).
  ps.write_hlo_text(tmp_path / "m.hlo.txt.gz", HLO)
  with gzip.open(tmp_path / "m.hlo.txt.gz", "rt") as f:
    assert f.read() == HLO
  assert ps.read_hlo_text(tmp_path / "m.hlo.txt.gz") == HLO
  (folder / "step.hlo.txt").unlink()
  (folder / "step.hlo.txt.gz").write_bytes((tmp_path / "m.hlo.txt.gz").read_bytes())
  capsys.readouterr()
  assert ps.main([str(folder), "--json"]) == 0
  assert {p["part"]: p["us"] for p in json.loads(capsys.readouterr().out)["parts"]} == parts
