"""`python -m flaxdoc.bench.attention`: the row plan, memory estimates, targets, and a smoke run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flaxdoc.bench import attention as bench

REPO = Path(__file__).resolve().parents[2]


def test_memory_estimates_skip_only_quadratic_rows():
  size = bench.Size()
  limit = 24
  # Linear-cost attentions fit at every length; dense attention not at 16k tokens.
  for impl in ("etc_rich", "linformer", "cosformer"):
    assert bench.estimated_peak_gb(impl, 16384, size) < limit
  assert bench.estimated_peak_gb("dense", 16384, size) > limit
  assert bench.estimated_peak_gb("dense_rich", 16384, size) > limit
  assert bench.estimated_peak_gb("dense", 8192, size) < limit
  # Quadratic growth: 4x the tokens, ~16x the pair memory.
  small = bench.estimated_peak_gb("dense", 4096, size) - bench.estimated_peak_gb("dense", 0, size)
  big = bench.estimated_peak_gb("dense", 16384, size) - bench.estimated_peak_gb("dense", 0, size)
  assert 14 < big / small < 17


def test_targets_are_ratios_of_the_rows():
  rows = [dict(impl="etc_rich", tokens=2048, time_s=2.0, cpu_s=3.0),
          dict(impl="etc_rich", tokens=16384, time_s=18.0, cpu_s=33.0),
          dict(impl="dense_rich", tokens=2048, time_s=5.0, cpu_s=9.0),
          dict(impl="etc_rich", tokens=512, time_s=1.0, cpu_s=1.0),
          dict(impl="layoutlm_torch", tokens=512, time_s=0.8, cpu_s=1.5)]
  got = {t["target"]: t for t in bench.targets(rows)}
  scaling = got["ETC time(16384) / time(2048) <= 10"]
  assert scaling["value"] == 9.0 and scaling["value_cpu"] == 11.0 and scaling["met"]
  dense = got["dense+Rich / ETC at 2048 >= 2"]
  assert dense["value"] == 2.5 and dense["met"]
  small = got["ETC / LayoutLM-torch at 512 <= 1"]
  assert small["value"] == 1.25 and not small["met"]
  missing = got["LayoutLM-torch / ETC at 2048 >= 2"]
  assert missing["value"] is None and missing["met"] is None


def test_flop_bound_is_the_dense_over_etc_flop_ratio():
  got = {t["target"]: t for t in bench.targets([])}
  bound = got["FLOP bound: dense / ETC matmul FLOPs at 2048"]["value"]
  size = bench.Size()
  assert bound == bench.forward_gflop("dense", 2048, size) / bench.forward_gflop("etc_rich", 2048,
                                                                                   size)
  # At width 768 the projections and feed-forward dominate: even free attention
  # could not make ETC 2x faster than dense attention at 2,048 tokens.
  assert 1.3 < bound < 1.45


@pytest.mark.parametrize("impl", ["etc_rich", "dense", "linformer", "cosformer"])
def test_flop_count_against_xla_cost_analysis(impl):
  """Our matmul count is a lower bound of XLA's count (which adds element-wise work), within 10%."""
  import jax  # pylint: disable=import-outside-toplevel
  from flaxdoc import models  # pylint: disable=import-outside-toplevel
  from flaxdoc.models import document_encoder as de  # pylint: disable=import-outside-toplevel
  size = bench.Size(layers=2, width=256, heads=4, mlp=1024, local_radius=32, linformer_k=64)
  n, vocab = 512, 1000
  model = de.build_document_encoder(bench.model_config(impl, size), vocab_size=vocab, num_tags=3,
                                    max_len=n, pretraining=False)
  batch = models.example_batch(1, n, vocab_size=vocab, num_tags=3)
  batch = {k: batch[k] for k in ("input_ids", "boxes", "page_ids", "positions", "attention_mask")}
  params = models.random_parameters(model, batch)
  compiled = jax.jit(lambda p, b: model.apply({"params": p}, b)["tag_logits"]).lower(
      params, batch).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  xla = cost["flops"] / 1e9
  ours = bench.forward_gflop(impl, n, size)
  assert 0.9 * xla <= ours <= xla, (ours, xla)


def test_row_configs_share_everything_but_the_attention():
  configs = {impl: bench.model_config(impl, bench.Size()) for impl in bench.IMPLS
             if impl != "layoutlm_torch"}
  attention_fields = {"name", "attention", "rich_attention", "num_globals", "local_radius",
                      "linformer_proj_length", "cosformer_reweight"}
  reference = configs["dense"].to_dict()
  for impl, config in configs.items():
    d = config.to_dict()
    assert {k for k in d if d[k] != reference[k]} <= attention_fields, impl
  assert configs["etc_rich"].rich_attention and configs["dense_rich"].rich_attention
  assert (configs["etc_rich"].depth, configs["etc_rich"].width) == (12, 768)


@pytest.mark.slow
def test_quick_run_in_a_subprocess():
  env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  out = subprocess.run([sys.executable, "-m", "flaxdoc.bench.attention", "--quick", "--json"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=True)
  rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
  assert [(r["impl"], r["tokens"]) for r in rows] == list(bench.QUICK_ROWS)
  for r in rows:
    assert r["time_s"] > 0 and r["peak_rss_mb"] > 0 and r["tokens_per_s"] > 0, r
