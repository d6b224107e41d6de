"""Learning-rate schedules, weight-decay masks and gradient accumulation."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from flaxdoc.train import optimizer
from flaxdoc.train.config_error import ConfigError


def _cfg(**kw):
  base = dict(name="adamw", lr=1e-3, total_steps=100, warmup_steps=10, schedule="linear",
              end_lr_fraction=0.0, weight_decay=0.01, clip_norm=1.0, grad_accum_steps=1)
  base.update(kw)
  return ml_collections.ConfigDict(base)


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
def test_schedule_matches_formula(kind):
  cfg = _cfg(schedule=kind, end_lr_fraction=0.1)
  sched = optimizer.learning_rate_schedule(cfg)
  lr, w, total, end = 1e-3, 10, 100, 1e-4
  for step in [0, 1, 5, 9, 10, 11, 50, 99, 100]:
    if step < w:
      want = lr * step / w
    else:
      t = min((step - w) / (total - w), 1.0)
      want = {"constant": lr, "linear": lr + (end - lr) * t,
              "cosine": end + (lr - end) * 0.5 * (1 + np.cos(np.pi * t))}[kind]
    np.testing.assert_allclose(float(sched(step)), want, rtol=1e-5, atol=1e-9, err_msg=f"step {step}")


def test_warmup_fraction_and_bad_schedule():
  sched = optimizer.learning_rate_schedule(_cfg(warmup_steps=0, warmup_fraction=0.2))
  assert float(sched(10)) == pytest.approx(0.5e-3)
  with pytest.raises(ConfigError, match=r"config.optim.schedule='exp': must be one of \("):
    optimizer.learning_rate_schedule(_cfg(schedule="exp"))


def test_decay_mask_skips_biases_and_norms():
  params = {"Dense_0": {"kernel": 1, "bias": 2}, "LayerNorm_0": {"scale": 3, "bias": 4},
            "embed": {"embedding": 5}, "attn_norm": {"scale": 6}}
  mask = optimizer.decay_mask(params)
  assert mask == {"Dense_0": {"kernel": True, "bias": False},
                  "LayerNorm_0": {"scale": False, "bias": False},
                  "embed": {"embedding": True}, "attn_norm": {"scale": False}}


def test_gradient_accumulation_equals_large_batch():
  """Two accumulated half-batches give the same update as one full batch (mean loss)."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(8, 3)), jnp.float32)
  y = jnp.asarray(rng.normal(size=(8,)), jnp.float32)
  params = {"w": jnp.asarray([0.1, -0.2, 0.3])}

  def loss(p, xb, yb):
    return jnp.mean((xb @ p["w"] - yb) ** 2)

  full_tx, _ = optimizer.make_optimizer(_cfg(grad_accum_steps=1, warmup_steps=0, clip_norm=0))
  acc_tx, _ = optimizer.make_optimizer(_cfg(grad_accum_steps=2, warmup_steps=0, clip_norm=0))
  s_full = full_tx.init(params)
  g = jax.grad(loss)(params, x, y)
  upd, _ = full_tx.update(g, s_full, params)
  want = optax.apply_updates(params, upd)

  s_acc = acc_tx.init(params)
  p = params
  for half in (slice(0, 4), slice(4, 8)):
    g = jax.grad(loss)(p, x[half], y[half])
    upd, s_acc = acc_tx.update(g, s_acc, p)
    p = optax.apply_updates(p, upd)
  np.testing.assert_allclose(p["w"], want["w"], rtol=1e-6, atol=1e-7)
  assert not np.allclose(want["w"], params["w"])  # the step did something
