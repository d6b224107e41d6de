"""The losses' cross-entropy against optax's: values, accuracy and gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from flaxdoc.train import objectives


def problem(dtype, seed=0, shape=(3, 5, 37)):
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  logits = jax.random.normal(k1, shape) * 4
  targets = jax.random.randint(k2, shape[:-1], 0, shape[-1])
  if len(shape) == 3:  # a sure pick, a row far below 0, two ignored positions
    logits = logits.at[0, 0, 3].set(40.0).at[1, 2].add(-100.0)
    targets = targets.at[0, 1].set(-1).at[2, 4].set(-1)
  logits = logits.astype(dtype)
  weights = jax.random.uniform(k3, shape[:-1])
  return logits, targets, weights


def optax_reference(logits, targets, weights):
  valid = targets >= 0
  w = valid * weights
  ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32),
                                                        jnp.where(valid, targets, 0))
  acc = jnp.sum((jnp.argmax(logits, -1) == targets) & valid) / jnp.sum(valid)
  return jnp.sum(ce * w) / jnp.sum(w), jnp.sum(w), acc


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_loss_accuracy_and_gradient_match_optax(dtype):
  logits, targets, weights = problem(dtype)
  loss, total, acc = objectives.weighted_cross_entropy_and_accuracy(logits, targets, weights)
  ref_loss, ref_total, ref_acc = optax_reference(logits, targets, weights)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  assert total == ref_total and acc == ref_acc and 0 < acc < 1

  def f(fn):
    return jax.grad(lambda x: fn(x, targets, weights)[0])(logits)
  grad, ref_grad = f(objectives.weighted_cross_entropy_and_accuracy), f(optax_reference)
  assert grad.dtype == dtype  # the logits' own dtype: no float32 copy of the [.., V] gradient
  tol = 1e-7 if dtype == jnp.float32 else 4e-3
  np.testing.assert_allclose(np.asarray(grad, np.float32), np.asarray(ref_grad, np.float32),
                             atol=tol, rtol=0)
  # Ignored positions get no gradient; each kept row sums to zero (softmax minus one-hot).
  assert not np.any(np.asarray(grad, np.float32)[targets < 0])
  np.testing.assert_allclose(np.asarray(grad, np.float32).sum(-1), 0.0, atol=10 * tol)


def test_pieces_and_weighted_mean_by_brute_force():
  logits, targets, weights = problem(jnp.float32, seed=1, shape=(4, 9))
  lse, picked, largest = objectives.log_softmax_pieces(logits, jnp.maximum(targets, 0))
  x = np.asarray(logits, np.float64)
  for i in range(4):
    t = max(int(targets[i]), 0)
    np.testing.assert_allclose(lse[i], np.log(np.exp(x[i]).sum()), rtol=1e-6)
    assert picked[i] == x[i, t] and largest[i] == x[i].max()
  loss, _ = objectives.weighted_cross_entropy(logits, targets, weights)
  valid = np.asarray(targets) >= 0
  want = sum(float(weights[i]) * (np.log(np.exp(x[i]).sum()) - x[i, targets[i]])
             for i in range(4) if valid[i]) / float(np.sum(np.asarray(weights)[valid]))
  np.testing.assert_allclose(loss, want, rtol=1e-6)
