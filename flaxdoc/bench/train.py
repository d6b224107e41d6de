r"""Training-step benchmark: step time, tokens/s and peak memory for a config.

    python -m flaxdoc.bench.train                                  # shrunk FormNet + FormNet-A1
    python -m flaxdoc.bench.train --config configs/formnet_a2.py:local --batch 8 --json
    python -m flaxdoc.bench.train --config configs/formnet_a1.py --max_len 512 --batch 1

Each configuration runs in its own subprocess so peak memory (`ru_maxrss`, and the
accelerator's peak where the backend reports it) is not mixed between rows. The
batch is real featurised synthetic documents; the step is the trainer's own
jitted, donated train step on a mesh over all local devices.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

from flaxdoc.bench import common

DEFAULT_RUNS = (
    ("configs/formnet_a2.py:local", 8, None),
    ("configs/formnet_a1.py", 1, 512),
)


def _load_config(spec: str):
  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("bench_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg or None)


def measure(spec: str, batch: int, max_len: int | None, steps: int, dtype: str) -> dict:
  """Times `steps` train steps after one compile step (in this process)."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from flaxdoc.train import optimizer, setup, sharding, state as state_lib  # pylint: disable=import-outside-toplevel
  from flaxdoc.data import synthetic  # pylint: disable=import-outside-toplevel
  from flaxdoc.data.features import batch_features, featurize  # pylint: disable=import-outside-toplevel

  config = _load_config(spec)
  config.unlock()
  if max_len:
    config.data.max_len = max_len
  config.batch_size = batch
  config.dtype = dtype
  env = setup.Experiment.create(config)
  windows = []
  i = 0
  while len(windows) < batch:
    doc = synthetic.make_document(0, i, synthetic.SyntheticConfig(target_words=2 * env.feature_config.max_len))
    windows += featurize(doc, env.tokenizer, env.feature_config)
    i += 1
  host = {k: v for k, v in batch_features(windows[:batch]).items()
          if k not in ("window_index", "window_start", "subtoken_index")}
  mesh = sharding.make_mesh(dict(config.mesh.shape))
  oc = config.optim
  oc.total_steps = max(steps, 10)
  tx, _ = optimizer.make_optimizer(oc)
  init_fn = state_lib.make_init_fn(env.model, tx, {k: v[:1] for k, v in host.items()})
  t0 = time.perf_counter()
  st, shardings, _ = state_lib.sharded_init(init_fn, jax.random.PRNGKey(0), mesh, config.mesh.rules)
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(st.params))
  step = state_lib.jit_train_step(state_lib.make_train_step(env.model, tx, mode="train"), mesh,
                                  shardings, state_lib.batch_shardings_for(host, mesh))
  with jax.set_mesh(mesh):
    b = sharding.global_batch(host, mesh, batch)
    st, m = step(st, b)
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
      t = time.perf_counter()
      st, m = step(st, b)
      jax.block_until_ready(m)
      times.append(time.perf_counter() - t)
  times.sort()
  step_s = times[len(times) // 2]
  tokens = int(host["attention_mask"].sum())
  row = {"bench": "train", "config": spec, "model": config.model.name,
         "variant": config.model.get("variant"), "params": num_params, "batch": batch,
         "max_len": int(config.data.max_len), "dtype": dtype, "device": jax.devices()[0].platform,
         "devices": jax.device_count(), "step_s": step_s, "steps_per_s": 1.0 / step_s,
         "tokens_per_s": tokens / step_s, "compile_s": compile_s, "peak_mb": common.peak_rss_mb(),
         "loss": float(m["train/loss"])}
  stats = jax.devices()[0].memory_stats() if hasattr(jax.devices()[0], "memory_stats") else None
  if stats and "peak_bytes_in_use" in stats:
    row["device_peak_mb"] = stats["peak_bytes_in_use"] / 2**20
  return row


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--config", action="append", help="config[:arg]; repeatable (default: shrunk FormNet and FormNet-A1)")
  p.add_argument("--batch", type=int, default=None)
  p.add_argument("--max_len", type=int, default=None)
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  p.add_argument("--json", action="store_true")
  p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # internal: run in-process
  a = p.parse_args(argv)
  if a.one:
    print(json.dumps(measure(a.config[0], a.batch, a.max_len, a.steps, a.dtype)))
    return 0
  runs = [(c, a.batch or 8, a.max_len) for c in a.config] if a.config else DEFAULT_RUNS
  rows = []
  for spec, batch, max_len in runs:
    cmd = [sys.executable, "-m", "flaxdoc.bench.train", "--one", "--config", spec,
           "--batch", str(a.batch or batch), "--steps", str(a.steps), "--dtype", a.dtype]
    if a.max_len or max_len:
      cmd += ["--max_len", str(a.max_len or max_len)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    if out.returncode != 0:
      rows.append({"bench": "train", "config": spec, "error": out.stderr.strip().splitlines()[-1:]})
      continue
    rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
  common.emit(rows, as_json=a.json, title="train step (median of steps after one compile step)",
              columns=None if a.json else ["config", "params", "batch", "max_len", "dtype", "device",
                                           "step_s", "tokens_per_s", "compile_s", "peak_mb", "error"])
  return 0


if __name__ == "__main__":
  sys.exit(main())
