"""Optimiser and learning-rate schedule from a config (optax).

AdamW with warm-up then constant / linear / cosine decay, global-norm clipping,
weight decay masked off biases and LayerNorm scales (as BERT), and gradient
accumulation via `optax.MultiSteps`.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import traverse_util

from flaxdoc.train.config_error import ConfigError

SCHEDULES = ("constant", "linear", "cosine")


def learning_rate_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
  """Warm-up (linear from 0) then `config.schedule` decay to `config.end_lr_fraction * lr`.

  Reads `lr`, `total_steps`, `warmup_steps` (or `warmup_fraction`), `schedule`
  and `end_lr_fraction` (default 0).
  """
  lr = float(config.lr)
  total = max(int(config.total_steps), 1)
  warmup = int(config.get("warmup_steps", 0) or 0)
  if not warmup and config.get("warmup_fraction", 0.0):
    warmup = int(round(float(config.warmup_fraction) * total))
  warmup = min(warmup, total)
  kind = config.get("schedule", "linear")
  if kind not in SCHEDULES:
    raise ConfigError(f"config.optim.schedule={kind!r}: must be one of {SCHEDULES}")
  end = lr * float(config.get("end_lr_fraction", 0.0))
  decay_steps = max(total - warmup, 1)
  if kind == "constant":
    decay = optax.constant_schedule(lr)
  elif kind == "linear":
    decay = optax.linear_schedule(lr, end, decay_steps)
  else:
    decay = optax.cosine_decay_schedule(lr, decay_steps, alpha=end / lr if lr else 0.0)
  if warmup == 0:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), decay], [warmup])


def decay_mask(params):
  """True for parameters that get weight decay: kernels and embeddings, not biases or norms."""
  flat = traverse_util.flatten_dict(params)
  def wants_decay(path):
    name = path[-1]
    under_norm = any("norm" in str(p).lower() or str(p).startswith("LayerNorm") for p in path)
    return name not in ("bias", "scale") and not under_norm
  return traverse_util.unflatten_dict({k: wants_decay(k) for k in flat})


def run_optim_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config.optim` with the run's `total_steps`, which the schedule needs: what
  `make_optimizer` gets from the trainer and from eval/predict (whose restored optimiser
  state must have the same structure)."""
  oc = ml_collections.ConfigDict(config.optim.to_dict())
  oc.total_steps = config.total_steps
  return oc


def make_optimizer(config: ml_collections.ConfigDict, pretrained: Callable | None = None
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """The optimiser of `config.optim` and its schedule (for logging).

  Reads `optim.{name, lr, b1, b2, eps, weight_decay, clip_norm, grad_accum_steps}`
  plus the schedule fields. `name` is "adamw" (default) or "adam" (FormNet's
  fine-tuning recipe: Adam without decoupled weight decay).

  `pretrained` (`params -> tree of bool`, from `flaxdoc.train.hf_init.pretrained_mask`)
  marks parameters imported from a checkpoint: they follow the schedule times
  `optim.pretrained_lr_scale`, and a learning rate of 0 for the first
  `optim.freeze_pretrained_steps` steps (their Adam moments still accumulate, so
  they start moving with sensible statistics), while the new parts train at full rate.
  The scaling multiplies the final updates (`scale_pretrained`), which for Adam(W) is
  exactly a per-parameter learning-rate factor, and keeps one step counter as its only
  state (no per-parameter masked states to shard).
  """
  schedule = learning_rate_schedule(config)
  opt = _base_optimizer(config, schedule)
  if pretrained is not None:
    opt = optax.chain(opt, scale_pretrained(pretrained, config))
  chain = []
  clip = config.get("clip_norm", 1.0)
  if clip:
    chain.append(optax.clip_by_global_norm(float(clip)))
  chain.append(opt)
  tx = optax.chain(*chain)
  accum = int(config.get("grad_accum_steps", 1) or 1)
  if accum > 1:
    tx = optax.MultiSteps(tx, every_k_schedule=accum)
  return tx, schedule


def scale_pretrained(pretrained: Callable, config: ml_collections.ConfigDict
                     ) -> optax.GradientTransformation:
  """Updates of the parameters `pretrained(params)` marks: times 0 for N steps, then the scale."""
  scale = config.get("pretrained_lr_scale", 1.0)
  scale = 1.0 if scale is None else float(scale)
  freeze = int(config.get("freeze_pretrained_steps", 0) or 0)
  if scale < 0 or freeze < 0:
    raise ConfigError(f"config.optim.pretrained_lr_scale={scale} / freeze_pretrained_steps="
                      f"{freeze}: must be >= 0")

  def init(params):
    del params
    return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

  def update(updates, state, params=None):
    del params
    factor = jnp.where(state.count < freeze, 0.0, scale)
    mask = pretrained(updates)
    updates = jax.tree.map(lambda u, m: u * factor.astype(u.dtype) if m else u, updates, mask)
    return updates, optax.ScaleByScheduleState(count=optax.safe_int32_increment(state.count))

  return optax.GradientTransformation(init, update)


def _base_optimizer(config, schedule) -> optax.GradientTransformation:
  name = config.get("name", "adamw")
  b1, b2, eps = float(config.get("b1", 0.9)), float(config.get("b2", 0.999)), float(config.get("eps", 1e-8))
  if name == "adamw":
    return optax.adamw(schedule, b1=b1, b2=b2, eps=eps,
                       weight_decay=float(config.get("weight_decay", 0.01)), mask=decay_mask)
  if name == "adam":
    return optax.adam(schedule, b1=b1, b2=b2, eps=eps)
  raise ConfigError(f"config.optim.name={name!r}: unknown optimiser; expected 'adamw' or 'adam'")


def global_norm(tree) -> jax.Array:
  return optax.global_norm(tree)
