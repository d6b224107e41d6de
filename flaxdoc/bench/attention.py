"""Attention scaling: forward latency and peak memory of a 12-layer, 768-wide encoder.

    python -m flaxdoc.bench.attention [--json] [--quick] [--lengths 512 2048 ...]
        [--impls etc_rich dense ...] [--memory_limit_gb 24] [--timeout 1200]

One row per (attention, length), batch 1, forward only (`deterministic=True`):

| impl | what |
|---|---|
| `etc_rich` | FormNet's backbone: ETC global-local attention (radius 84, 1 global token) with Rich Attention on x, y |
| `dense_rich` | dense softmax attention with the same Rich Attention terms (all pairs) |
| `dense` | plain dense softmax attention (BERT / LayoutLM) |
| `linformer` | LayoutLinformer attention, `k = 512` (keys / values projected from N) |
| `cosformer` | LayoutCosformer attention (ReLU linear attention, 1D cos re-weighting) |
| `layoutlm_torch` | Hugging Face `transformers` `LayoutLMModel` (random init from a `LayoutLMConfig`, offline, PyTorch CPU), up to 2,048 tokens |

Every flaxdoc row is the full `flaxdoc.models.DocumentEncoder` (token table of
30,522, fixed sine 1D positions so no table limits the length, LayoutLM's learned
2D tables, 12 post-LN layers of width 768 / 12 heads / MLP 3072, tagging head);
parameters are drawn with numpy (`random_parameters`), so nothing but the forward
pass is compiled. Each row runs in its own subprocess
(`python -m flaxdoc.bench.attention --one IMPL --length N`) so that `ru_maxrss`
(the peak resident memory) belongs to that configuration alone; the parent kills a
child whose resident memory passes `--memory_limit_gb` and skips, with a note, rows
whose estimated peak exceeds it (dense attention keeps a few `[12, N, N]` float32
arrays alive per layer: 13 GB each at N = 16,384).

Timing: compile once (`compile_s`), then the median of a few calls (fewer for rows
that take more than a few seconds). `--quick` is a smoke test of the machinery (one
layer of width 128, six short rows, no PyTorch, about half a minute): its first row
runs in a subprocess, the others in-process, so their `peak_rss_mb` is cumulative.
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

from flaxdoc.bench.common import emit, peak_rss_mb, time_call

IMPLS = ("etc_rich", "dense_rich", "dense", "linformer", "cosformer", "layoutlm_torch")
LENGTHS = (512, 2048, 8192, 16384)
TORCH_MAX_LENGTH = 2048
VOCAB = 30_522
TAGS = 13
COLUMNS = ("bench", "impl", "tokens", "layers", "width", "gflop", "compile_s", "time_s", "cpu_s",
           "gflop_per_s", "tokens_per_s", "peak_rss_mb", "note")


@dataclasses.dataclass(frozen=True)
class Size:
  layers: int = 12
  width: int = 768
  heads: int = 12
  mlp: int = 3072
  local_radius: int = 84
  linformer_k: int = 512


QUICK = Size(layers=1, width=128, heads=4, mlp=512, local_radius=32, linformer_k=128)
# (impl, length) rows of `--quick`; the first runs in a subprocess like a full row.
QUICK_ROWS = (("etc_rich", 256), ("etc_rich", 1024), ("dense_rich", 256), ("dense", 256),
              ("linformer", 256), ("cosformer", 256))


# --------------------------------------------------------------------------- one row
def model_config(impl: str, size: Size):
  """The `DocumentEncoder` config of a flaxdoc row."""
  from flaxdoc.models import document_encoder as de  # pylint: disable=import-outside-toplevel
  common = dict(name=f"bench_{impl}", width=size.width, depth=size.layers, num_heads=size.heads,
                mlp_dim=size.mlp, position_1d="sine", position_2d="learned", box_size=True,
                type_vocab_size=0, dropout_rate=0.0, attention_dropout_rate=0.0)
  if impl == "etc_rich":
    return de.spec_config(attention="etc", local_radius=size.local_radius, num_globals=1,
                          rich_attention=True, **common)
  if impl == "dense_rich":
    return de.spec_config(attention="dense", rich_attention=True, **common)
  if impl == "dense":
    return de.spec_config(attention="dense", **common)
  if impl == "linformer":
    return de.spec_config(attention="linformer", linformer_proj_length=size.linformer_k, **common)
  if impl == "cosformer":
    return de.spec_config(attention="cosformer", cosformer_reweight="1d", **common)
  raise ValueError(f"unknown flaxdoc impl {impl!r}")


def _repeats(first_call_s: float) -> int:
  return 1 if first_call_s > 20 else 2 if first_call_s > 5 else 5


def measure(call) -> dict:
  """Wall time (median) and process CPU time (mean, all threads) of `call()`.

  One untimed call first (allocations, thread pools); rows slower than 20 s are
  timed once. CPU seconds are the steadier number on a shared machine: other
  processes stretch the wall time, not the work done.
  """
  t0 = time.perf_counter()
  call()
  repeats = _repeats(time.perf_counter() - t0)
  c0 = time.process_time()
  seconds = time_call(call, repeats=repeats, warmup=0)
  return {"time_s": seconds, "cpu_s": (time.process_time() - c0) / repeats}


def run_flaxdoc(impl: str, length: int, size: Size) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  from flaxdoc import models  # pylint: disable=import-outside-toplevel
  from flaxdoc.models import document_encoder as de  # pylint: disable=import-outside-toplevel
  model = de.build_document_encoder(model_config(impl, size), vocab_size=VOCAB, num_tags=TAGS,
                                    max_len=max(length, size.linformer_k), pretraining=False)
  batch = models.example_batch(1, length, vocab_size=VOCAB, num_tags=TAGS)
  batch = {k: batch[k] for k in ("input_ids", "boxes", "page_ids", "positions",
                                 "attention_mask")}
  params = jax.device_put(models.random_parameters(model, batch))
  forward = jax.jit(lambda p, b: model.apply({"params": p}, b)["tag_logits"])
  t0 = time.perf_counter()
  compiled = forward.lower(params, batch).compile()
  compile_s = time.perf_counter() - t0
  row = measure(lambda: jax.block_until_ready(compiled(params, batch)))
  return dict(row, compile_s=compile_s)


def run_torch(length: int, size: Size) -> dict:
  import numpy as np  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from flaxdoc import models  # pylint: disable=import-outside-toplevel
  torch.manual_seed(0)
  config = transformers.LayoutLMConfig(
      vocab_size=VOCAB, hidden_size=size.width, num_hidden_layers=size.layers,
      num_attention_heads=size.heads, intermediate_size=size.mlp,
      max_position_embeddings=max(512, length))
  model = transformers.LayoutLMModel(config).eval()
  batch = models.example_batch(1, length, vocab_size=VOCAB)
  inputs = dict(input_ids=torch.from_numpy(batch["input_ids"].astype(np.int64)),
                bbox=torch.from_numpy(batch["boxes"].astype(np.int64)),
                attention_mask=torch.from_numpy(batch["attention_mask"].astype(np.int64)))

  def call():
    with torch.inference_mode():
      model(**inputs)

  row = measure(call)
  impl = getattr(model.config, "_attn_implementation", None) or "eager"
  return dict(row, compile_s=None, note=f"torch {torch.__version__}, {torch.get_num_threads()} "
                                        f"threads, attn_implementation={impl}")


def run_one(impl: str, length: int, size: Size) -> dict:
  """Measures one row in this process (called in the `--one` subprocess)."""
  if impl == "layoutlm_torch":
    row = run_torch(length, size)
  else:
    row = run_flaxdoc(impl, length, size)
  gflop = forward_gflop(impl, length, size)
  row.update(bench="attention", impl=impl, tokens=length, layers=size.layers, width=size.width,
             gflop=gflop, gflop_per_s=gflop / row["time_s"], tokens_per_s=length / row["time_s"],
             peak_rss_mb=peak_rss_mb())
  return row


def forward_gflop(impl: str, length: int, size: Size) -> float:
  """Matrix-multiply FLOPs of one forward pass (2 per multiply-add), in GFLOP.

  The floor every implementation pays: projections `8 N E^2` and feed-forward
  `4 N E M` per layer, plus the attention products: dense `4 N^2 E`, ETC
  `4 N (3b + G) E` (+ the globals' row), Linformer `4 k N E` (projecting keys and
  values) `+ 4 N k E`, cosFormer `4 N E D` per re-weighting factor. Element-wise
  work (softmax, Rich Attention terms, LayerNorm) is not counted: it is what makes
  `dense_rich` slow, but it is memory-bound, not a FLOP count.
  """
  n, e, m = float(length), float(size.width), float(size.mlp)
  d = e / size.heads
  dense_part = 8 * n * e * e + 4 * n * e * m  # [N, E] x [E, E] x4, [N, E] x [E, M] x2
  if impl in ("dense", "dense_rich", "layoutlm_torch"):
    attn = 4 * n * n * e
  elif impl == "etc_rich":
    block = size.local_radius + 1
    padded = math.ceil(n / block) * block
    globals_ = 1
    attn = 4 * padded * (3 * block + globals_) * e + 4 * globals_ * (n + globals_) * e
  elif impl == "linformer":
    k = float(size.linformer_k)
    attn = 4 * k * n * e + 4 * n * k * e
  elif impl == "cosformer":
    factors = 2  # 1D re-weighting: cos and sin
    attn = factors * 4 * n * e * d
  else:
    raise ValueError(f"unknown impl {impl!r}")
  return size.layers * (dense_part + attn) / 1e9


# --------------------------------------------------------------------------- parent
def estimated_peak_gb(impl: str, length: int, size: Size) -> float:
  """A rough forward-pass peak: parameters plus the largest per-layer activations."""
  params = (VOCAB + 4 * 1024) * size.width + size.layers * 12 * size.width ** 2
  base = 4 * params * 2 + 1.0e9  # parameters (+ a copy while loading) and the runtime
  act = 4 * length * max(size.mlp, 3 * size.width) * 4
  pairs = 4.0 * size.heads * length * length  # one [H, N, N] float32 array
  if impl == "dense":
    act += 3 * pairs  # logits, exponentials, weights
  elif impl == "dense_rich":
    act += 5 * pairs  # + the Rich term and its per-axis pieces
  elif impl == "layoutlm_torch":
    act += 3 * pairs
  elif impl == "etc_rich":
    block = size.local_radius + 1
    act += 5 * 4.0 * size.heads * length * 3 * block
  return (base + act) / 2 ** 30


def _available_gb() -> float | None:
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) / 2 ** 20
  except OSError:
    pass
  return None


def _rss_gb(pid: int) -> float:
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmRSS:"):
          return int(line.split()[1]) / 2 ** 20
  except OSError:
    pass
  return 0.0


def run_subprocess(impl: str, length: int, size: Size, *, limit_gb: float,
                   timeout: float) -> dict:
  """Runs `--one` in a child; kills it past `limit_gb` resident or `timeout` seconds."""
  cmd = [sys.executable, "-m", "flaxdoc.bench.attention", "--one", impl, "--length", str(length),
         "--size", json.dumps(dataclasses.asdict(size))]
  row = dict(bench="attention", impl=impl, tokens=length, layers=size.layers, width=size.width)
  start = time.monotonic()
  with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
    peak = 0.0
    while child.poll() is None:
      peak = max(peak, _rss_gb(child.pid))
      if peak > limit_gb:
        child.kill()
        child.wait()
        return dict(row, peak_rss_mb=peak * 1024,
                    note=f"killed: resident memory passed {limit_gb:.1f} GiB")
      if time.monotonic() - start > timeout:
        child.kill()
        child.wait()
        return dict(row, note=f"killed: still running after {timeout:.0f} s")
      time.sleep(0.2)
    out, err = child.communicate()
  lines = [l for l in out.splitlines() if l.startswith("{")]
  if child.returncode != 0 or not lines:
    tail = (err.strip().splitlines() or ["no output"])[-1][:200]
    return dict(row, note=f"failed (exit {child.returncode}): {tail}")
  return json.loads(lines[-1])


def targets(rows: list[dict], size: Size = Size()) -> list[dict]:
  """The scaling targets, from the measured rows (wall-time ratio; CPU-time ratio beside it).

  The last row is no target but the bound on the dense / ETC ratios at 2,048: the
  ratio of their matmul FLOPs, i.e. the speed-up if both ran at the same FLOP rate.
  """
  wall = {(r["impl"], r["tokens"]): r.get("time_s") for r in rows}
  cpu = {(r["impl"], r["tokens"]): r.get("cpu_s") for r in rows}

  def ratio(a, b, name, goal, at_most=True):
    row = {"bench": "attention_target", "target": name, "goal": goal, "value": None,
           "value_cpu": None, "met": None}
    if wall.get(a) and wall.get(b):
      row["value"] = wall[a] / wall[b]
      row["met"] = row["value"] <= goal if at_most else row["value"] >= goal
    if cpu.get(a) and cpu.get(b):
      row["value_cpu"] = cpu[a] / cpu[b]
    return row

  bound = forward_gflop("dense", 2048, size) / forward_gflop("etc_rich", 2048, size)
  floor = {"bench": "attention_target", "target": "FLOP bound: dense / ETC matmul FLOPs at 2048",
           "goal": None, "value": bound, "value_cpu": None, "met": None}
  return [
      ratio(("etc_rich", 16384), ("etc_rich", 2048), "ETC time(16384) / time(2048) <= 10", 10),
      ratio(("dense_rich", 2048), ("etc_rich", 2048), "dense+Rich / ETC at 2048 >= 2", 2,
            at_most=False),
      ratio(("dense", 2048), ("etc_rich", 2048), "dense (plain) / ETC at 2048 >= 2", 2,
            at_most=False),
      ratio(("layoutlm_torch", 2048), ("etc_rich", 2048), "LayoutLM-torch / ETC at 2048 >= 2",
            2, at_most=False),
      ratio(("etc_rich", 512), ("layoutlm_torch", 512), "ETC / LayoutLM-torch at 512 <= 1", 1),
      floor,
  ]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m flaxdoc.bench.attention",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--json", action="store_true", help="one JSON object per row")
  parser.add_argument("--quick", action="store_true", help="reduced smoke-test set (< 1 min)")
  parser.add_argument("--lengths", type=int, nargs="+", default=None)
  parser.add_argument("--impls", nargs="+", choices=IMPLS, default=None)
  parser.add_argument("--memory_limit_gb", type=float, default=24.0,
                      help="skip / kill rows past this resident memory (GiB)")
  parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per row")
  parser.add_argument("--one", choices=IMPLS, help=argparse.SUPPRESS)
  parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
  parser.add_argument("--size", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)

  if args.one:
    size = Size(**json.loads(args.size)) if args.size else Size()
    print(json.dumps(run_one(args.one, args.length, size)), flush=True)
    return 0

  size = QUICK if args.quick else Size()
  if args.quick:
    plan = list(QUICK_ROWS)
  else:
    plan = [(impl, length) for impl in (args.impls or IMPLS) for length in (args.lengths or LENGTHS)
            if not (impl == "layoutlm_torch" and length > TORCH_MAX_LENGTH)]
  available = _available_gb()
  # Kill children before the machine runs out: at the limit, or below what is free.
  kill_gb = min(args.memory_limit_gb, 0.9 * available) if available else args.memory_limit_gb
  rows = []
  for i, (impl, length) in enumerate(plan):
    base = dict(bench="attention", impl=impl, tokens=length, layers=size.layers,
                width=size.width)
    estimate = estimated_peak_gb(impl, length, size)
    if estimate > args.memory_limit_gb:
      rows.append(dict(base, note=f"skipped: estimated peak {estimate:.0f} GiB > "
                                  f"{args.memory_limit_gb:.0f} GiB"))
    elif args.quick and i > 0:
      rows.append(dict(run_one(impl, length, size), note="in-process"))
    else:
      rows.append(run_subprocess(impl, length, size, limit_gb=kill_gb, timeout=args.timeout))
    if args.json:
      emit(rows[-1:], as_json=True)
    else:  # progress on stderr: a full run takes a while
      print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
  machine = (f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f} at the end, "
             f"{available:.0f} GiB available at the start" if available else "")
  if not args.json:
    emit(rows, as_json=False, columns=COLUMNS,
         title=f"attention scaling, batch 1, forward only ({machine})")
    if not args.quick:
      print()
      emit(targets(rows, size), as_json=False, title="targets")
  elif not args.quick:
    emit(targets(rows, size), as_json=True)
  failed = [r for r in rows if str(r.get("note", "")).startswith("failed")]
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
