"""`flaxdoc.bench.accelerator` on CPU at tiny sizes: the FLOP counts and one row of each part."""

import dataclasses
import math

import numpy as np
import pytest

from flaxdoc.bench import accelerator as acc
from flaxdoc.bench import pretrain_step as ps


def test_dense_attention_flops():
  assert acc.dense_attention_gflop(1000, 2, 64) == pytest.approx(4 * 1000 ** 2 * 2 * 64 / 1e9)
  assert acc.dense_attention_gflop(10, 1, 8, backward=True) == pytest.approx(
      3.5 * acc.dense_attention_gflop(10, 1, 8))


def test_dense_attention_impls_agree_with_a_numpy_softmax():
  import jax.numpy as jnp
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(size=(1, 6, 2, 4)).astype(np.float32) for _ in range(3))
  bias = rng.normal(size=(1, 2, 6, 6)).astype(np.float32)
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(4) + bias
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  ref = np.einsum("bhqk,bkhd->bqhd", w, v)
  for impl in ("einsum", "xla"):
    out = acc.dense_attention(impl)(*(jnp.asarray(x) for x in (q, k, v, bias)))
    np.testing.assert_allclose(np.asarray(out), ref, atol=1e-5, err_msg=impl)


def test_plan_skips_steps_over_the_token_budget():
  a = type("A", (), dict(parts=["pretrain", "sdpa"], lengths=[1024, 4096], batches=[8, 32],
                         max_tokens_per_step=65536, attention_lengths=[2048], sdpa_impls=["einsum"],
                         local=True, dtype="bfloat16", param_dtype="float32", peak_tflops=989.0,
                         iters=2, ablation=["full"], prng="threefry", no_dropout=False,
                         profile=None, gcn_backward=["scatter_f32"],
                         mlm_positions=["capped"], etc_kernel=["xla"], gcn_kernel=["xla"],
                         etc_tiles=None, gcn_tiles=None, pad_to_multiple_of=[1]))()
  specs = acc.plan(a)
  steps = [(s["length"], s["batch"]) for s in specs if s["part"] == "pretrain"]
  assert steps == [(1024, 8), (1024, 32), (4096, 8)]
  assert [s["part"] for s in specs].count("sdpa") == 1
  # One row per ETC kernel, except the `etc` ablation, whose relative ids the fused
  # kernel does not have.
  a.lengths, a.batches, a.ablation, a.etc_kernel = [1024], [8], ["full", "etc"], ["xla", "pallas"]
  rows = [(s["ablation"], s["etc_kernel"]) for s in acc.plan(a) if s["part"] == "pretrain"]
  assert rows == [("full", "xla"), ("full", "pallas"), ("etc", "xla")]
  # One row per GCN kernel, only where there is a GCN; the scatter's precision is the
  # XLA path's alone.
  a.etc_kernel, a.gcn_kernel, a.gcn_backward = ["xla"], ["xla", "pallas"], ["scatter_f32",
                                                                           "scatter"]
  rows = [(s["ablation"], s["gcn_kernel"], s["gcn_backward"])
          for s in acc.plan(a) if s["part"] == "pretrain"]
  assert rows == [("full", "xla", "scatter_f32"), ("full", "xla", "scatter"),
                  ("full", "pallas", "scatter_f32"), ("etc", "xla", "scatter_f32")]
  # Tiles go to the rows whose kernel is fused, and only there.
  a.gcn_tiles = [16, 64, 64, 4]
  rows = [(s["gcn_kernel"], s["gcn_tiles"]) for s in acc.plan(a) if s["part"] == "pretrain"]
  assert rows == [("xla", None), ("xla", None), ("pallas", [16, 64, 64, 4]), ("xla", None)]
  # Padded rows: one row per multiple, back to back, for every pre-training row.
  a.gcn_kernel, a.pad_to_multiple_of = ["xla"], [1, 8]
  rows = [(s["ablation"], s["gcn_backward"], s["pad_to_multiple_of"])
          for s in acc.plan(a) if s["part"] == "pretrain"]
  assert rows == [("full", "scatter_f32", 1), ("full", "scatter_f32", 8),
                  ("full", "scatter", 1), ("full", "scatter", 8),
                  ("etc", "scatter_f32", 1), ("etc", "scatter_f32", 8)]
  assert "pad_to_multiple_of" in acc.COLUMNS_PRETRAIN
  # Every step option travels in the spec (none falls back to its default unseen), and
  # StepOptions reads each back as planned.
  a.gcn_kernel, a.gcn_tiles, a.etc_kernel, a.etc_tiles = ["pallas"], [16, 64, 64, 4], \
      ["pallas"], [32, 64, 4, 32, 32, 4]
  fields = [f.name for f in dataclasses.fields(ps.StepOptions)]
  specs = [s for s in acc.plan(a) if s["part"] == "pretrain"]
  assert len(specs) == 2  # the full and etc ablations
  for spec in specs:
    assert set(fields) <= set(spec)
    expect = {k: spec[k] for k in fields}
    expect.update(etc_tiles=tuple(spec["etc_tiles"] or ()),
                  gcn_tiles=tuple(spec["gcn_tiles"] or ()))
    assert dataclasses.asdict(ps.StepOptions.from_spec(spec)) == expect
  a.parts, a.etc_kernel = ["attention"], ["xla", "pallas"]
  assert [s["impl"] for s in acc.plan(a)] == ["etc_rich", "etc_rich_pallas", "dense"]


@pytest.mark.slow
def test_one_tiny_pretrain_step_runs_on_cpu():
  row = acc.run_one(dict(part="pretrain", length=64, batch=2, dtype="float32",
                         param_dtype="float32", local=True, peak_tflops=1.0, iters=1))[0]
  assert row["step_ms"] > 0 and np.isfinite(row["loss"])
  # The MLM head scores the capped targets only (ceil(1.5 * 15% * 64) = 15 per sequence).
  assert row["mlm_positions"] == 15
  assert row["model_tflop"] == pytest.approx(ps.train_step_tflop(64, 2, ps.LOCAL, 15))
  assert row["model_tflop"] < ps.train_step_tflop(64, 2, ps.LOCAL)


def test_sdpa_rows_come_one_by_one_and_check_a_slice_of_queries(monkeypatch):
  monkeypatch.setattr(acc, "REFERENCE_QUERIES", 16)
  rows = acc.run_sdpa_all(["einsum", "xla", "cudnn"], 48, "float32", ps.LOCAL)
  first = next(rows)  # a generator: the first row exists before the others are measured
  rows = [first] + list(rows)
  ok = [r for r in rows if "error" not in r]
  assert {(r["impl"], r["bias"], r["pass"]) for r in ok} >= {
      (impl, bias, p) for impl in ("einsum", "xla") for bias in (False, True)
      for p in ("fwd", "fwd+bwd")}
  assert all(r["err_queries"] == 16 and r["max_err"] < 1e-5 for r in ok)
  # cuDNN has no CPU kernel: its rows are errors, and they do not stop the others.
  assert all(r["impl"] == "cudnn" for r in rows if "error" in r)


def test_a_timed_out_row_keeps_what_it_printed():
  spec = {"part": "sdpa", "length": 16384}
  printed = (b'{"part": "sdpa", "impl": "einsum", "pass": "fwd", "time_ms": 1.5}\n'
             b'{"part": "sdpa", "impl": "xla", "pa')  # killed mid-line
  rows = acc.collect_rows(printed, spec, "timed out after 600 s")
  assert rows == [{"part": "sdpa", "impl": "einsum", "pass": "fwd", "time_ms": 1.5},
                  dict(spec, error="timed out after 600 s")]
  assert acc.collect_rows(None, spec, "boom") == [dict(spec, error="boom")]
  assert acc.collect_rows('{"a": 1}\nnoise\n', spec) == [{"a": 1}]
