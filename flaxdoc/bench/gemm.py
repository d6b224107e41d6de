r"""CPU matrix-multiply rate on the encoder's shapes: JAX (XLA:CPU) against PyTorch.

    python -m flaxdoc.bench.gemm [--json] [--tokens 2048] [--width 768] [--mlp 3072]
        [--variants default precision_highest no_thunks ...] [--repeats 5]

The encoder's matmuls at `N` tokens are `[N, E] x [E, E]` (Q, K, V, output),
`[N, E] x [E, M]` and `[N, M] x [M, E]` (feed-forward), float32. Each JAX variant runs
in its own subprocess, since XLA reads its flags once per process:

| variant | what |
|---|---|
| `default` | XLA:CPU as installed |
| `precision_highest` | `jax_default_matmul_precision="highest"` (float32 is already exact on CPU: a control) |
| `no_thunks` | `XLA_FLAGS=--xla_cpu_use_thunk_runtime=false` (the older, whole-program runtime) |
| `no_fast_min_max` | `XLA_FLAGS=--xla_cpu_enable_fast_min_max=false` (control: touches no dot) |
| `single_thread_eigen` | `XLA_FLAGS=--xla_cpu_multi_thread_eigen=false` (one thread per dot) |

and PyTorch (`torch.matmul`, its default intra-op threads) on the same arrays.
Reported: GFLOP/s per shape and over all three (2 FLOPs per multiply-add), and the
JAX / PyTorch ratio (issue 14's target: >= 0.8). Flags that XLA does not know make
the variant's row print the error instead of a rate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from flaxdoc.bench import common

VARIANTS = {
    "default": ({}, None),
    "precision_highest": ({}, "highest"),
    "no_thunks": ({"XLA_FLAGS": "--xla_cpu_use_thunk_runtime=false"}, None),
    "no_fast_min_max": ({"XLA_FLAGS": "--xla_cpu_enable_fast_min_max=false"}, None),
    "single_thread_eigen": ({"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}, None),
}


def shapes(tokens: int, width: int, mlp: int) -> list[tuple[int, int, int]]:
  """(m, k, n) of the encoder's three distinct matmuls."""
  return [(tokens, width, width), (tokens, width, mlp), (tokens, mlp, width)]


def gflop(m: int, k: int, n: int) -> float:
  return 2.0 * m * k * n / 1e9


def _rate(fn, flops: float, repeats: int) -> float:
  fn()
  seconds = common.time_call(fn, repeats=repeats, warmup=1)
  return flops / seconds


def run_jax(tokens: int, width: int, mlp: int, repeats: int, precision: str | None) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  if precision:
    jax.config.update("jax_default_matmul_precision", precision)
  rng = np.random.default_rng(0)
  out, total_flop, total_s = {}, 0.0, 0.0
  dot = jax.jit(lambda a, b: a @ b)
  for m, k, n in shapes(tokens, width, mlp):
    a = jax.device_put(rng.standard_normal((m, k), dtype=np.float32))
    b = jax.device_put(rng.standard_normal((k, n), dtype=np.float32))
    rate = _rate(lambda: jax.block_until_ready(dot(a, b)), gflop(m, k, n), repeats)
    out[f"{m}x{k}x{n}"] = rate
    total_flop += gflop(m, k, n)
    total_s += gflop(m, k, n) / rate
  return dict(shapes=out, gflop_per_s=total_flop / total_s)


def run_torch(tokens: int, width: int, mlp: int, repeats: int) -> dict:
  import torch  # pylint: disable=import-outside-toplevel
  torch.manual_seed(0)
  out, total_flop, total_s = {}, 0.0, 0.0
  for m, k, n in shapes(tokens, width, mlp):
    a, b = torch.randn(m, k), torch.randn(k, n)
    rate = _rate(lambda: torch.matmul(a, b), gflop(m, k, n), repeats)
    out[f"{m}x{k}x{n}"] = rate
    total_flop += gflop(m, k, n)
    total_s += gflop(m, k, n) / rate
  return dict(shapes=out, gflop_per_s=total_flop / total_s, threads=torch.get_num_threads())


def run_variant(name: str, a) -> dict:
  env_extra, _ = VARIANTS[name]
  env = dict(os.environ)
  for k, v in env_extra.items():
    env[k] = (env.get(k, "") + " " + v).strip()
  cmd = [sys.executable, "-m", "flaxdoc.bench.gemm", "--one", name, "--tokens", str(a.tokens),
         "--width", str(a.width), "--mlp", str(a.mlp), "--repeats", str(a.repeats)]
  out = subprocess.run(cmd, capture_output=True, text=True, env=env)
  if out.returncode != 0:
    return dict(impl=f"jax:{name}", error=(out.stderr.strip().splitlines() or ["?"])[-1][-200:])
  return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--tokens", type=int, default=2048)
  p.add_argument("--width", type=int, default=768)
  p.add_argument("--mlp", type=int, default=3072)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
  p.add_argument("--json", action="store_true")
  p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: one JAX variant
  a = p.parse_args(argv)
  if a.one:
    r = run_jax(a.tokens, a.width, a.mlp, a.repeats, VARIANTS[a.one][1])
    print(json.dumps(dict(impl=f"jax:{a.one}", **r)))
    return 0
  rows = [dict(impl="torch", **run_torch(a.tokens, a.width, a.mlp, a.repeats))]
  rows += [run_variant(v, a) for v in a.variants]
  torch_rate = rows[0]["gflop_per_s"]
  for r in rows:
    if "gflop_per_s" in r:
      r["vs_torch"] = r["gflop_per_s"] / torch_rate
    for shape, rate in r.pop("shapes", {}).items():
      r[shape] = rate
  common.emit(rows, as_json=a.json, title=f"GEMM GFLOP/s, float32, {a.tokens} tokens")
  return 0


if __name__ == "__main__":
  sys.exit(main())
