r"""Accelerator figures: FormNet-A2 pre-training step, ETC vs dense attention, cuDNN attention.

    python -m flaxdoc.bench.accelerator [--json] [--parts pretrain attention sdpa]
        [--lengths 1024 4096] [--batches 8 16] [--attention_lengths 2048 8192 16384]
        [--dtype bfloat16] [--peak_tflops 989] [--local] [--profile DIR]
        [--ablation full etc_rich etc] [--gcn_backward scatter_f32 scatter]
        [--mlm_positions capped all] [--etc_kernel xla pallas]
        [--gcn_kernel xla pallas pallas_saved pallas_dpre pallas_fused pallas_fused_forward]
        [--etc_tiles 32,64,4,32,32,4]
        [--gcn_tiles 16,32,32,4] [--pad_to_multiple_of 1 8]

Three tables, each row in its own subprocess (so the device's `peak_bytes_in_use`
belongs to that row alone):

* `pretrain`: one FormNet-A2 pre-training (MLM) step — GCN Super-Tokens, 12 ETC
  layers with Rich Attention, 768 wide, MLM head over the BERT-multilingual
  vocabulary (119,547) — forward, backward and AdamW update, jitted with the
  parameters and optimiser state donated, as `flaxdoc.train.state.make_train_step`
  builds it, on a random batch with BERT's 15% MLM targets. The MLM head scores
  only the targets, at most `masking.default_max_predictions` per sequence, as the
  trainer does (`--mlm_positions all`: every position, as before 2026-11-26; the
  FLOP count follows what is computed). Compute in `--dtype` (parameters float32,
  as the trainer keeps them, or `--param_dtype bfloat16`). Reports step time,
  tokens/s, the device's peak memory, and MFU: *model* matmul FLOPs (below) per
  second over `--peak_tflops` (H100 / H200 SXM dense bf16: 989 TFLOP/s). XLA's own
  count (`cost_analysis()["flops"]`, element-wise work included) is printed beside it
  as `xla_tflop`. `--pad_to_multiple_of N`: the encoder's rows (1 global + the tokens)
  padded with masked rows to a multiple of N (`EncoderSpec.pad_to_multiple_of`; 1025 ->
  1032 at 1,024 tokens with 8), for the GEMMs' sake; the model FLOPs stay those of the
  real rows, so a padded row's MFU is comparable with an unpadded one's.
* `attention`: forward of the 12 x 768 encoder (the `flaxdoc.bench.attention`
  rows `etc_rich` and `dense`; `etc_rich_pallas`, the same with the fused ETC
  kernel, when `--etc_kernel` names `pallas`) at 2k / 8k / 16k tokens in `--dtype`.
* `sdpa`: one dense attention (12 heads x 64, batch 1) as a plain einsum-softmax-
  einsum, through `jax.nn.dot_product_attention(implementation="xla")` and
  `implementation="cudnn"` (fused flash attention), forward and forward+backward,
  with and without an additive `[H, N, N]` bias (what Rich Attention adds).

Model FLOPs, the step itself and its options (`StepOptions`) are
`flaxdoc.bench.pretrain_step`'s, shared with `bench.gemm_floor` and `bench.hlo_traffic`.
`--local` runs a shrunk model at tiny sizes (the CPU tests).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time

from flaxdoc.bench import common
from flaxdoc.bench.pretrain_step import (LOCAL, Sizes, StepOptions, mfu, pretrain_step,
                                         train_step_tflop)

H100_BF16_TFLOPS = 989.0  # H100 SXM5 dense bf16 peak (NVIDIA datasheet; sparsity doubles it)
COLUMNS_PRETRAIN = ("ablation", "etc_kernel", "gcn_kernel", "gcn_backward", "mlm_positions",
                    "pad_to_multiple_of", "length", "batch", "dtype", "param_dtype", "prng",
                    "dropout", "step_ms", "tokens_per_s", "model_tflop", "xla_tflop", "tflops",
                    "mfu", "peak_gb", "compile_s", "note")
COLUMNS_ATTENTION = ("impl", "tokens", "dtype", "time_ms", "tokens_per_s", "gflop", "tflops",
                     "peak_gb")
COLUMNS_SDPA = ("impl", "tokens", "bias", "pass", "time_ms", "tflops", "max_err")


# --------------------------------------------------------------------------- FLOPs
def dense_attention_gflop(length: int, heads: int, head_dim: int, backward: bool = False) -> float:
  """`QK^T` and `PV` (2 * 2 N^2 D per head); backward does 2.5x more (5 products, not 2)."""
  fwd = 4.0 * length * length * heads * head_dim / 1e9
  return fwd * 3.5 if backward else fwd


# --------------------------------------------------------------------------- helpers
def _device_peak_gb() -> float | None:
  import jax  # pylint: disable=import-outside-toplevel
  stats = jax.devices()[0].memory_stats() or {}
  peak = stats.get("peak_bytes_in_use")
  return None if peak is None else peak / 2 ** 30


def _cost_flops(compiled) -> float | None:
  try:
    cost = compiled.cost_analysis()
  except Exception:  # pylint: disable=broad-except
    return None
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  return float(cost["flops"]) if cost and "flops" in cost else None


# --------------------------------------------------------------------------- rows
def run_pretrain(length: int, batch: int, dtype: str, param_dtype: str, s: Sizes, local: bool,
                 peak_tflops: float, iters: int, opts: StepOptions = StepOptions(),
                 prng: str = "threefry", profile: str | None = None) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  from flaxdoc import models  # pylint: disable=import-outside-toplevel
  if prng != "threefry":
    # The default PRNG draws each dropout site's seed word (flaxdoc.nn.dropout hashes
    # the masks from it) and the model's other keys: threefry or "rbg". Until session 14
    # it drew every mask bit; the step timed the same with either (README, session 14).
    jax.config.update("jax_default_prng_impl", prng)
  step, (params, opt_state, data), _, head_positions, s = pretrain_step(
      length, batch, dtype, param_dtype, s, local, opts)
  t0 = time.perf_counter()
  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, opt_state, data,
                                                          jax.random.key(0)).compile()
  compile_s = time.perf_counter() - t0
  xla = _cost_flops(compiled)
  state = {"p": params, "o": opt_state, "i": 0}
  row = dict(part="pretrain", length=length, batch=batch, dtype=dtype, param_dtype=param_dtype,
             compile_s=compile_s, xla_tflop=None if xla is None else xla / 1e12,
             **dataclasses.asdict(opts), prng=prng)
  row.update(etc_tiles=list(opts.etc_tiles) or None, gcn_tiles=list(opts.gcn_tiles) or None,
             mlm_positions=opts.mlm_positions if head_positions is None else head_positions,
             note=os.environ.get("XLA_FLAGS") or None, device=str(jax.devices()[0].device_kind),
             params=models.count_tree(params))
  return _time_pretrain(compiled, state, data, length, batch, s, peak_tflops, iters, profile, row,
                        head_positions)


def _time_pretrain(compiled, state, data, length, batch, s, peak_tflops, iters, profile,
                   row, head_positions) -> dict:
  import jax  # pylint: disable=import-outside-toplevel

  def call():
    state["i"] += 1
    state["p"], state["o"], loss = compiled(state["p"], state["o"], data,
                                            jax.random.key(state["i"]))
    return loss

  seconds = common.time_back_to_back(call, warmup=2, iters=iters)
  loss = float(call())
  tflop = train_step_tflop(length, batch, s, head_positions)
  extra = {}
  if profile:  # three more steps under the profiler, summed by kernel (after the timing)
    from flaxdoc.bench import profile_summary  # pylint: disable=import-outside-toplevel
    folder = os.path.join(profile, f"pretrain_{row['ablation']}_{row['etc_kernel']}_"
                                   f"gcn{row['gcn_kernel']}_"
                                   f"{row['gcn_backward']}_"
                                   f"mlm{row['mlm_positions']}_{length}x{batch}_{row['dtype']}"
                                   + (f"_pad{row['pad_to_multiple_of']}"
                                      if row["pad_to_multiple_of"] != 1 else ""))
    with jax.profiler.trace(folder, create_perfetto_trace=True):
      for _ in range(3):
        jax.block_until_ready(call())
    events = profile_summary.load_events(folder)
    summary = profile_summary.summarise(events, top=30)
    hlo_text = compiled.as_text()  # for profile_summary and hlo_traffic --hlo
    profile_summary.write_hlo_text(os.path.join(folder, "step.hlo.txt.gz"), hlo_text)
    parts = profile_summary.summarise_parts(events, profile_summary.hlo_op_names(hlo_text))
    extra = dict(profile=folder, profile_kinds={k["kind"]: round(k["share"], 4)
                                                for k in summary["kinds"]},
                 profile_parts={p["part"]: round(p["share"], 4) for p in parts},
                 profile_top=[(k["name"][:100], round(k["share"], 4), k["count"])
                              for k in summary["kernels"]],
                 profile_ms_per_step=summary["total_us"] / 3e3)
  return dict(row, step_ms=seconds * 1e3, tokens_per_s=batch * length / seconds,
              model_tflop=tflop, tflops=tflop / seconds, mfu=mfu(tflop, seconds, peak_tflops),
              peak_gb=_device_peak_gb(), loss=loss, **extra)


def run_attention(impl: str, length: int, dtype: str, s: Sizes) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  from flaxdoc import models  # pylint: disable=import-outside-toplevel
  from flaxdoc.bench import attention as ab  # pylint: disable=import-outside-toplevel
  from flaxdoc.models import document_encoder as de  # pylint: disable=import-outside-toplevel
  config = ab.model_config(impl.removesuffix("_pallas"), s)
  if impl.endswith("_pallas"):  # the same encoder with ETC's long queries fused
    config.etc_kernel = "pallas"
  model = de.build_document_encoder(config, vocab_size=ab.VOCAB,
                                    num_tags=ab.TAGS, max_len=length, pretraining=False,
                                    dtype=dtype)
  batch = models.example_batch(1, length, vocab_size=ab.VOCAB, num_tags=ab.TAGS)
  batch = {k: batch[k] for k in ("input_ids", "boxes", "page_ids", "positions",
                                 "attention_mask")}
  params = jax.device_put(models.random_parameters(model, batch))
  batch = jax.device_put(batch)
  fwd = jax.jit(lambda p, b: model.apply({"params": p}, b)["tag_logits"])
  compiled = fwd.lower(params, batch).compile()
  seconds = common.time_back_to_back(lambda: compiled(params, batch), warmup=1,
                                     iters=3 if length > 8192 else 5)
  gflop = ab.forward_gflop(impl.removesuffix("_pallas"), length, s)
  return dict(part="attention", impl=impl, tokens=length, dtype=dtype, time_ms=seconds * 1e3,
              tokens_per_s=length / seconds, gflop=gflop, tflops=gflop / seconds / 1e3,
              peak_gb=_device_peak_gb())


def sdpa_impls() -> tuple[str, ...]:
  return ("einsum", "xla", "cudnn")


def dense_attention(impl: str):
  """`(q, k, v, bias) -> out` for q, k, v `[B, N, H, D]` and bias `[B, H, N, N]` or None."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  if impl == "einsum":
    def attend(q, k, v, bias):
      logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
      if bias is not None:
        logits = logits + bias
      weights = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(q.dtype)
      return jnp.einsum("bhqk,bkhd->bqhd", weights, v)
    return attend

  def attend_lib(q, k, v, bias):
    return jax.nn.dot_product_attention(q, k, v, bias=bias, implementation=impl)
  return attend_lib


def run_sdpa_all(impls, length: int, dtype: str, s: Sizes):
  """Every implementation, without and with a bias, at one length (one process).

  Yields each row as soon as it is measured, so that a row that runs out of time or
  memory leaves the ones before it (the driver keeps what was printed).
  """
  for bias in (False, True):
    for impl in impls:
      try:
        yield from run_sdpa(impl, length, bias, dtype, s)
      except Exception as e:  # pylint: disable=broad-except  # e.g. cuDNN absent on CPU
        yield dict(part="sdpa", impl=impl, tokens=length, bias=bias, dtype=dtype,
                   error=f"{type(e).__name__}: {str(e)[:200]}")


# Queries the float32 reference checks (all of them up to this many): at 16,384 tokens a
# full float32 reference alone is a [12, N, N] logit array of 12.9 GB.
REFERENCE_QUERIES = 512


def run_sdpa(impl: str, length: int, bias: bool, dtype: str, s: Sizes):
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  d = s.width // s.heads
  keys = jax.random.split(jax.random.key(length), 4)
  q, k, v = (jax.random.normal(kk, (1, length, s.heads, d), jnp.float32).astype(dtype)
             for kk in keys[:3])
  b = (jax.random.normal(keys[3], (1, s.heads, length, length), dtype) if bias else None)
  attend = dense_attention(impl)
  fwd = jax.jit(attend)
  # Error against a float32 einsum over the first REFERENCE_QUERIES queries (rows of the
  # output are independent, so a slice of queries checks those rows exactly).
  m = min(length, REFERENCE_QUERIES)
  out = fwd(q, k, v, b)[:, :m].astype(jnp.float32)
  f32 = lambda x: None if x is None else x.astype(jnp.float32)  # noqa: E731
  ref = jax.jit(dense_attention("einsum"))(f32(q[:, :m]), f32(k), f32(v),
                                           None if b is None else f32(b[:, :, :m]))
  err = float(jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref))
  del out, ref
  common_ = dict(part="sdpa", impl=impl, tokens=length, bias=bias, dtype=dtype, max_err=err,
                 err_queries=m)
  seconds = common.time_back_to_back(lambda: fwd(q, k, v, b), iters=5)
  gflop = dense_attention_gflop(length, s.heads, d)
  yield dict(common_, **{"pass": "fwd"}, time_ms=seconds * 1e3, tflops=gflop / seconds / 1e3)
  grad = jax.jit(jax.grad(lambda q_, k_, v_: attend(q_, k_, v_, b).astype(jnp.float32).sum(),
                          argnums=(0, 1, 2)))
  seconds = common.time_back_to_back(lambda: grad(q, k, v), iters=5)
  gflop = dense_attention_gflop(length, s.heads, d, backward=True)
  yield dict(common_, **{"pass": "fwd+bwd"}, time_ms=seconds * 1e3,
             tflops=gflop / seconds / 1e3)


# --------------------------------------------------------------------------- driver
def run_one(spec: dict) -> list[dict]:
  s = LOCAL if spec.get("local") else Sizes()
  part = spec["part"]
  if part == "pretrain":
    return [run_pretrain(spec["length"], spec["batch"], spec["dtype"], spec["param_dtype"], s,
                         spec.get("local", False), spec["peak_tflops"], spec.get("iters", 10),
                         StepOptions.from_spec(spec), spec.get("prng", "threefry"),
                         spec.get("profile"))]
  if part == "attention":
    return [run_attention(spec["impl"], spec["length"], spec["dtype"], s)]
  if part == "sdpa":
    return run_sdpa_all(spec["impls"], spec["length"], spec["dtype"], s)
  raise ValueError(f"unknown part {part!r}")


def plan(a) -> list[dict]:
  """The subprocess specs of a run, in order."""
  specs = []
  common_ = dict(local=a.local, dtype=a.dtype)
  if "pretrain" in a.parts:
    for length in a.lengths:
      for batch in a.batches:
        if batch * length > a.max_tokens_per_step:
          continue
        for ablation, etc_kernel in [(ab, ek) for ab in a.ablation for ek in a.etc_kernel
                                     if not (ab == "etc" and ek == "pallas")]:
          # The other ablations have no GCN; --gcn_backward is the XLA path's only.
          gcn_rows = [("xla", a.gcn_backward[0])]
          if ablation == "full":
            gcn_rows = [(gk, gb) for gk in a.gcn_kernel
                        for gb in (a.gcn_backward if gk == "xla" else a.gcn_backward[:1])]
          for gcn_kernel, gcn_backward in gcn_rows:
            for mlm_positions, pad in [(m, n) for m in a.mlm_positions
                                       for n in a.pad_to_multiple_of]:
              specs.append(dict(part="pretrain", length=length, batch=batch,
                                param_dtype=a.param_dtype, peak_tflops=a.peak_tflops,
                                iters=a.iters, ablation=ablation, etc_kernel=etc_kernel,
                                gcn_kernel=gcn_kernel, prng=a.prng,
                                dropout=not a.no_dropout, profile=a.profile,
                                gcn_backward=gcn_backward, mlm_positions=mlm_positions,
                                etc_tiles=a.etc_tiles if etc_kernel == "pallas" else None,
                                gcn_tiles=a.gcn_tiles if gcn_kernel != "xla" else None,
                                pad_to_multiple_of=pad, **common_))
  if "attention" in a.parts:
    for length in a.attention_lengths:
      fused = ("etc_rich_pallas",) if "pallas" in a.etc_kernel else ()
      for impl in ("etc_rich",) + fused + ("dense",):
        specs.append(dict(part="attention", impl=impl, length=length, **common_))
  if "sdpa" in a.parts:
    for length in a.attention_lengths:
      specs.append(dict(part="sdpa", impls=list(a.sdpa_impls), length=length, **common_))
  return specs


def _ints(text: str) -> list[int]:
  return [int(v) for v in text.split(",")]


def collect_rows(stdout, spec: dict, error: str | None = None) -> list[dict]:
  """The JSON rows a `--one` process printed, plus one row for `error` if it failed.

  A process that timed out or crashed keeps the rows it printed before (`stdout` may
  be the bytes `subprocess.TimeoutExpired` holds, or None).
  """
  if isinstance(stdout, bytes):
    stdout = stdout.decode("utf-8", "replace")
  rows = []
  for line in (stdout or "").splitlines():
    if line.startswith("{"):
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:  # a line cut off by the kill
        continue
  if error is not None:
    rows.append(dict(spec, error=error))
  return rows


def run_spec(spec: dict, timeout: float) -> list[dict]:
  cmd = [sys.executable, "-m", "flaxdoc.bench.accelerator", "--one", json.dumps(spec)]
  try:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                         env=dict(os.environ))
  except subprocess.TimeoutExpired as e:
    return collect_rows(e.stdout, spec, f"timed out after {timeout:.0f} s")
  if out.returncode != 0:
    tail = (out.stderr.strip().splitlines() or ["?"])[-1]
    return collect_rows(out.stdout, spec, tail[-300:])
  return collect_rows(out.stdout, spec)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--parts", nargs="+", default=["pretrain", "attention", "sdpa"],
                 choices=["pretrain", "attention", "sdpa"])
  p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
  p.add_argument("--batches", type=int, nargs="+", default=[8, 16, 32])
  p.add_argument("--max_tokens_per_step", type=int, default=65_536)
  p.add_argument("--attention_lengths", type=int, nargs="+", default=[2048, 8192, 16384])
  p.add_argument("--sdpa_impls", nargs="+", default=list(sdpa_impls()))
  p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
  p.add_argument("--param_dtype", default="float32", choices=["bfloat16", "float32"])
  p.add_argument("--peak_tflops", type=float, default=H100_BF16_TFLOPS)
  p.add_argument("--iters", type=int, default=10)
  p.add_argument("--ablation", nargs="+", default=["full"], choices=["full", "etc_rich", "etc"],
                 help="etc_rich: without the GCN; etc: without GCN and Rich Attention "
                      "(where the time goes)")
  p.add_argument("--gcn_backward", nargs="+", default=["scatter_f32"],
                 choices=["scatter_f32", "scatter"],
                 help="precision of the GCN neighbour gather's gradient scatter-add "
                      "(flaxdoc.nn.gcn.NEIGHBOR_GRADIENT); one row each")
  p.add_argument("--mlm_positions", nargs="+", default=["capped"], choices=["capped", "all"],
                 help="capped: the MLM head scores only the targets, at most "
                      "masking.default_max_predictions per sequence (the trainer's default); "
                      "all: every position (the FLOP count follows); one row each")
  p.add_argument("--etc_kernel", nargs="+", default=["xla"], choices=["xla", "pallas"],
                 help="ETC's long queries as XLA arrays or in the fused Pallas kernel "
                      "(flaxdoc.nn.etc_pallas; not with --ablation etc, whose relative ids it "
                      "lacks); one row each")
  p.add_argument("--gcn_kernel", nargs="+", default=["xla"],
                 choices=common.GCN_KERNELS,
                 help="the GCN's per-edge part as XLA arrays or in the fused Pallas kernels "
                      "(flaxdoc.nn.gcn_pallas; pallas_saved keeps each edge's GELU for the "
                      "backward, pallas_dpre passes d pre within the backward, pallas_fused "
                      "also runs the forward and the backward's node side each as one "
                      "kernel (pallas_fused_forward: the forward only); only with "
                      "--ablation full; --gcn_backward does not apply to them); one row each")
  p.add_argument("--etc_tiles", type=_ints, default=None, metavar="Q,K,W,BQ,BK,BW",
                 help="the fused ETC kernel's tiles in the pre-training rows "
                      "(flaxdoc.nn.etc_pallas.Tiles' fields in order; default: its defaults; "
                      "bench.etc_kernel --tiles times one layer)")
  p.add_argument("--gcn_tiles", type=_ints, default=None, metavar="NODES,HIDDEN,EDGES,WARPS",
                 help="the fused GCN kernels' tiles (flaxdoc.nn.gcn_pallas.Tiles, four or "
                      "six values; default: their defaults)")
  p.add_argument("--pad_to_multiple_of", type=int, nargs="+", default=[1], metavar="N",
                 help="pad the encoder's rows (1 global + the tokens) with masked rows to a "
                      "multiple of N in the pre-training rows (EncoderSpec.pad_to_multiple_of; "
                      "1: off; 8: 1025 -> 1032 rows at 1,024 tokens, for the GEMMs); one row "
                      "each, back to back")
  p.add_argument("--timeout", type=float, default=600)
  p.add_argument("--local", action="store_true", help="shrunk model, for CPU smoke tests")
  p.add_argument("--prng", default="threefry", choices=["threefry", "rbg", "unsafe_rbg"],
                 help="JAX's default PRNG (threefry), which draws the dropout sites' seed words")
  p.add_argument("--no_dropout", action="store_true", help="time the step without dropout")
  p.add_argument("--profile", default=None, metavar="DIR",
                 help="after timing each pre-training row, trace 3 steps into DIR/<row> "
                      "(jax.profiler, Perfetto JSON) and print time by kernel kind "
                      "(flaxdoc.bench.profile_summary)")
  p.add_argument("--json", action="store_true")
  p.add_argument("--out", default=None, help="also append JSON rows to this file as they come")
  p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: one spec in-process
  a = p.parse_args(argv)
  if a.one:
    for row in run_one(json.loads(a.one)):
      print(json.dumps(row), flush=True)
    return 0
  rows = []
  for spec in plan(a):
    new = run_spec(spec, a.timeout)
    rows += new
    if a.out:
      with open(a.out, "a") as f:
        for r in new:
          f.write(json.dumps(r) + "\n")
    if not a.json:
      for r in new:
        print("#", json.dumps(r), flush=True)
        if r.get("profile_kinds"):
          kinds = ", ".join(f"{k} {100 * v:.1f}%" for k, v in r["profile_kinds"].items())
          print(f"#   kernel time by kind ({r['profile']}): {kinds}", flush=True)
          parts = ", ".join(f"{k} {100 * v:.1f}%" for k, v in r["profile_parts"].items())
          print(f"#   kernel time by model part: {parts}", flush=True)
  for part, columns, title in (
      ("pretrain", COLUMNS_PRETRAIN, "FormNet-A2 pre-training step (MLM)"),
      ("attention", COLUMNS_ATTENTION, "encoder forward, ETC vs dense attention"),
      ("sdpa", COLUMNS_SDPA, "one dense attention: einsum vs jax.nn.dot_product_attention")):
    part_rows = [r for r in rows if r.get("part") == part]
    if part_rows:
      common.emit(part_rows, as_json=a.json, title=title,
                  columns=None if a.json else list(columns) + ["error"])
  return 0


if __name__ == "__main__":
  sys.exit(main())
