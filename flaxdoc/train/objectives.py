"""Losses: token tagging, masked language modelling and 1-LOP (DESIGN §3.4, §3.8).

Every loss is a weighted mean over valid positions and returns `(loss, aux)` with
the summed weight, so gradient accumulation and multi-host averaging stay exact.
Targets of -1 mean "ignore".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.custom_vjp
def log_softmax_pieces(logits: jax.Array, labels: jax.Array
                       ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`(logsumexp, the label's logit, the largest logit)` over the last axis, float32 `[...]`.

  Cross-entropy is `logsumexp - picked`, and the label is the argmax (up to ties) when
  `picked >= largest`. Written out instead of `optax.softmax_cross_entropy_with_integer_labels`
  for the MLM head's sake: there the logits are `[B, P, 119,547]` (1.8 GB in float32 at
  FormNet-A2's pre-training batch), and optax's `take_along_axis` differentiates into a
  scatter-add that writes a float32 array of that size, which a pad to the padded
  vocabulary then reads again. Here the backward is one elementwise pass over the logits
  in their own dtype, `g_lse softmax + g_picked onehot`, which XLA fuses with what
  follows (H100, deviceless compile of the step: docs/accelerators.md, session 11).
  """
  return _pieces_fwd(logits, labels)[0]


def _pieces_fwd(logits, labels):
  x = logits.astype(jnp.float32)
  largest = jnp.max(x, axis=-1)
  lse = largest + jnp.log(jnp.sum(jnp.exp(x - largest[..., None]), axis=-1))
  onehot = jnp.arange(x.shape[-1]) == labels[..., None]
  picked = jnp.sum(jnp.where(onehot, x, 0.0), axis=-1)
  return (lse, picked, largest), (logits, labels, lse)


def _pieces_bwd(res, grads):
  logits, labels, lse = res
  g_lse, g_picked, _ = grads  # the largest logit is a statistic: no gradient
  x = logits.astype(jnp.float32)
  onehot = jnp.arange(x.shape[-1]) == labels[..., None]
  d = g_lse[..., None] * jnp.exp(x - lse[..., None]) + jnp.where(onehot, g_picked[..., None], 0.0)
  return d.astype(logits.dtype), None


log_softmax_pieces.defvjp(_pieces_fwd, _pieces_bwd)


def weighted_cross_entropy_and_accuracy(logits: jax.Array, targets: jax.Array,
                                        weights: jax.Array | None = None
                                        ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`(mean loss, total weight, accuracy)`, as `weighted_cross_entropy` and `accuracy`,
  from one pass over the logits (a target counts as hit when no logit beats it; `accuracy`'s
  argmax differs only on exact ties)."""
  valid = targets >= 0  # [...]
  w = valid.astype(jnp.float32)
  if weights is not None:
    w = w * weights.astype(jnp.float32)
  safe = jnp.where(valid, targets, 0)
  lse, picked, largest = log_softmax_pieces(logits, safe)
  ce = lse - picked  # [...]
  total = jnp.sum(w)
  hits = jax.lax.stop_gradient((picked >= largest) & valid)
  acc = jnp.sum(hits) / jnp.maximum(jnp.sum(valid), 1)
  return jnp.sum(ce * w) / jnp.maximum(total, 1e-8), total, acc


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
  loss, total, _ = weighted_cross_entropy_and_accuracy(logits, targets, weights)
  return loss, total


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
  mlm, mlm_w, mlm_acc = weighted_cross_entropy_and_accuracy(outputs["mlm_logits"], mlm_targets,
                                                            mlm_weights)
  aux.update({"train/mlm_loss": mlm, "train/mlm_accuracy": mlm_acc, "train/tokens": mlm_w})
  loss = mlm
  if "lop_logits" in outputs and "lop_targets" in batch:
    lop_targets = jnp.where(batch["lop_weights"] > 0, batch["lop_targets"], -1)
    lop, _ = weighted_cross_entropy(outputs["lop_logits"], lop_targets, batch["lop_weights"])
    aux["train/lop_loss"] = lop
    aux["train/lop_accuracy"] = accuracy(outputs["lop_logits"], lop_targets)
    loss = loss + lop_weight * lop
  return loss, aux
