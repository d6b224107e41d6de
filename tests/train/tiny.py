"""A tiny FormNet config for trainer tests (seconds per compile on a CPU)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TINY_OVERRIDES = {
    "model.width": 32, "model.depth": 1, "model.gcn_layers": 1, "model.mlp_dim": 64,
    "model.num_heads": 2, "model.local_radius": 8,
    "data.max_len": 48, "batch_size": 4, "eval_batch_size": 8,
    "total_steps": 6, "log_every": 1, "eval_every": 3, "checkpoint_every": 3,
    "async_checkpoints": False,
}


def load_config(path="configs/formnet_a2.py", arg="local"):
  spec = importlib.util.spec_from_file_location("cfg", ROOT / path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def tiny_config(path="configs/formnet_a2.py", arg="local", **overrides):
  config = load_config(path, arg)
  config.data.dataset_options = {"num_train": 12, "num_dev": 4}
  for key, value in {**TINY_OVERRIDES, **overrides}.items():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config


def override_flags(**overrides) -> list[str]:
  """The same tiny config as command-line flags for `python -m flaxdoc.main`."""
  flags = [f"--config.{k}={v}" for k, v in {**TINY_OVERRIDES, **overrides}.items()]
  flags += ["--config.data.dataset_options.num_train=12", "--config.data.dataset_options.num_dev=4"]
  return flags
