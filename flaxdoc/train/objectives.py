"""Losses: token tagging, masked language modelling and 1-LOP (DESIGN §3.4, §3.8).

Every loss is a weighted mean over valid positions and returns `(loss, aux)` with
the summed weight, so gradient accumulation and multi-host averaging stay exact.
Targets of -1 mean "ignore".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def weighted_cross_entropy(logits: jax.Array, targets: jax.Array, weights: jax.Array | None = None
                           ) -> tuple[jax.Array, jax.Array]:
  """Mean cross-entropy over positions with `targets >= 0` (times `weights`).

  Args:
    logits: `[..., C]` (any float dtype; computed in float32).
    targets: `[...]` int, -1 = ignore.
    weights: optional `[...]` float.
  Returns:
    (mean loss, total weight).
  """
  valid = targets >= 0  # [...]
  w = valid.astype(jnp.float32)
  if weights is not None:
    w = w * weights.astype(jnp.float32)
  safe = jnp.where(valid, targets, 0)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), safe)  # [...]
  total = jnp.sum(w)
  return jnp.sum(ce * w) / jnp.maximum(total, 1e-8), total


def accuracy(logits: jax.Array, targets: jax.Array) -> jax.Array:
  valid = targets >= 0
  correct = (jnp.argmax(logits, -1) == targets) & valid
  return jnp.sum(correct) / jnp.maximum(jnp.sum(valid), 1)


def tagging_loss(outputs: dict, batch: dict) -> tuple[jax.Array, dict]:
  loss, weight = weighted_cross_entropy(outputs["tag_logits"], batch["tags"])
  return loss, {"train/tag_loss": loss, "train/tag_accuracy": accuracy(outputs["tag_logits"], batch["tags"]),
                "train/tokens": weight}


def pretraining_loss(outputs: dict, batch: dict, *, lop_weight: float = 0.5) -> tuple[jax.Array, dict]:
  """MLM (+ 1-LOP weighted `lop_weight` when the model predicts it).

  When the model scored only some positions (`outputs["mlm_positions"] [B, P]`, its
  `mlm_max_predictions`), the targets and weights are read at those positions: the
  same loss as over every position whenever no target was dropped, and
  `train/mlm_dropped` counts the ones that were (0 with the trainer's capped masking).
  """
  mlm_targets = jnp.where(batch["mlm_weights"] > 0, batch["mlm_targets"], -1)
  mlm_weights = batch["mlm_weights"]
  aux = {}
  if "mlm_positions" in outputs:
    positions = outputs["mlm_positions"]
    mlm_targets = jnp.take_along_axis(mlm_targets, positions, axis=1)  # [B, P]
    mlm_weights = jnp.take_along_axis(mlm_weights, positions, axis=1)  # [B, P]
    aux["train/mlm_dropped"] = jnp.sum(outputs["mlm_dropped"])
  mlm, mlm_w = weighted_cross_entropy(outputs["mlm_logits"], mlm_targets, mlm_weights)
  aux.update({"train/mlm_loss": mlm,
              "train/mlm_accuracy": accuracy(outputs["mlm_logits"], mlm_targets),
              "train/tokens": mlm_w})
  loss = mlm
  if "lop_logits" in outputs and "lop_targets" in batch:
    lop_targets = jnp.where(batch["lop_weights"] > 0, batch["lop_targets"], -1)
    lop, _ = weighted_cross_entropy(outputs["lop_logits"], lop_targets, batch["lop_weights"])
    aux["train/lop_loss"] = lop
    aux["train/lop_accuracy"] = accuracy(outputs["lop_logits"], lop_targets)
    loss = loss + lop_weight * lop
  return loss, aux
