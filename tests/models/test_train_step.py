"""Every model compiles once per shape and trains (forward + backward) in float32 and bfloat16.

The step is the trainer's: `model.apply(..., deterministic=False)` with a dropout key,
then `flaxdoc.train.objectives` (tagging loss, or MLM + 1-LOP when pre-training).
A Python counter inside the jitted function counts traces: two batches of the same
shape must reuse one compilation. The `local` configs are compiled in the slow
tests; the fast test runs a shrunken FormNet (the most complex assembly).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flaxdoc import models
from flaxdoc.train import objectives

VOCAB, TAGS = 96, 5


def make_step(model, pretraining):
  traces = []

  def loss_fn(params, batch, rng):
    traces.append(1)  # runs once per trace, not per call
    outputs = model.apply({"params": params}, batch, deterministic=False,
                          rngs={"dropout": rng})
    if pretraining:
      loss, _ = objectives.pretraining_loss(outputs, batch, lop_weight=0.5)
    else:
      loss, _ = objectives.tagging_loss(outputs, batch)
    return loss, outputs

  step = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
  return step, traces


def check_trains(config, *, length, pretraining, dtypes=("float32", "bfloat16")):
  batches = [models.example_batch(2, length, vocab_size=VOCAB, num_tags=TAGS, seed=s,
                                  graph=models.needs_graph(config), pretraining=pretraining)
             for s in (0, 1)]
  logits = {}
  for dtype in dtypes:
    model = models.build_model(config, vocab_size=VOCAB, num_tags=TAGS, max_len=length,
                               pretraining=pretraining, dtype=dtype)
    # `init` works abstractly (the trainer's eval_shape + sharded init path).
    abstract = jax.eval_shape(lambda r, b: model.init({"params": r, "dropout": r}, b),
                              jax.random.key(0), batches[0])
    params = models.random_parameters(model, batches[0], stddev=0.05)
    assert jax.tree.structure(params) == jax.tree.structure(
        jax.tree.map(lambda x: 0, nn.unbox(abstract["params"])))
    step, traces = make_step(model, pretraining)
    for i, batch in enumerate(batches):
      (loss, outputs), grads = step(params, batch, jax.random.key(i))
      assert np.isfinite(float(loss)), (config.name, dtype)
      leaves = jax.tree.leaves(grads)
      assert all(g.dtype == jnp.float32 for g in leaves)  # parameters stay float32
      assert all(np.isfinite(np.asarray(g)).all() for g in leaves), (config.name, dtype)
      assert sum(float(jnp.abs(g).sum()) > 0 for g in leaves) > 0.9 * len(leaves)
      for key, value in outputs.items():
        assert value.dtype == jnp.float32 and value.shape[:2] == (2, length), key
    assert len(traces) == 1, f"{config.name} ({dtype}) traced {len(traces)} times for one shape"
    if len(dtypes) > 1:
      apply = jax.jit(lambda p, b: model.apply({"params": p}, b)["tag_logits"])
      logits[dtype] = np.asarray(apply(params, batches[0]))
  if len(logits) == 2:
    # bfloat16 computes the same function, roughly.
    np.testing.assert_allclose(logits["bfloat16"], logits["float32"], atol=0.25, rtol=0.1)


def test_shrunken_formnet_trains_in_bfloat16_with_one_compilation():
  # ETC + Rich Attention (the GCN's backward pass is compiled in the slow tests).
  config = models.get_model_config("formnet", "A1/etc_rich", local=True)
  config.update(dict(width=32, num_heads=2, mlp_dim=64, depth=1, local_radius=5))
  check_trains(config, length=24, pretraining=False, dtypes=("bfloat16",))


LOCAL_MODELS = [
    ("formnet", "A1", False),
    ("formnet", "A2/etc", False),
    ("formnet", "A3/etc_gcn", True),
    ("docpolarbert", "base", True),
    ("docpolarbert", "base", False),
    ("lagabi", "roberta_base", False),
    ("lagabi", "layoutlm_base", False),
    ("layoutlm", "base/squircle", False),
    ("layoutlm", "base/lspe_sc", True),
    ("layout_linformer", "base", False),
    ("layout_cosformer", "base/cross", False),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,variant,pretraining", LOCAL_MODELS)
def test_local_configs_train_in_float32_and_bfloat16(name, variant, pretraining):
  config = models.get_model_config(name, variant, local=True)
  check_trains(config, length=64, pretraining=pretraining)


def test_mlm_head_on_the_targets_only_equals_the_full_head():
  """`mlm_max_predictions`: the head scores P positions; loss and gradients are unchanged."""
  config = models.get_model_config("docpolarbert", "base", local=True)
  config.update(dict(width=32, num_heads=2, mlp_dim=64, depth=1))
  length = 40
  batch = models.example_batch(2, length, vocab_size=VOCAB, num_tags=TAGS, seed=3,
                               pretraining=True)
  targets = (batch["mlm_weights"] > 0).sum(1)
  full = models.build_model(config, vocab_size=VOCAB, num_tags=TAGS, max_len=length,
                            pretraining=True)
  params = models.random_parameters(full, batch, stddev=0.05)

  def run(model, b):
    def loss_fn(p):
      out = model.apply({"params": p}, b)
      loss, aux = objectives.pretraining_loss(out, b, lop_weight=0.5)
      return loss, (aux, out)
    (loss, (aux, out)), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
    return out, loss, aux, grads

  out_full, loss_full, aux_full, grads_full = run(full, batch)
  p = int(targets.max()) + 3  # room for every target, plus untargeted filler slots
  capped = full.clone(mlm_max_predictions=p)
  out, loss, aux, grads = run(capped, batch)
  positions = np.asarray(out["mlm_positions"])
  assert out["mlm_logits"].shape == (2, p, VOCAB) and positions.shape == (2, p)
  for row in range(2):  # the targets first, in order, then untargeted positions
    want = np.flatnonzero(batch["mlm_weights"][row] > 0)
    np.testing.assert_array_equal(positions[row, :len(want)], want)
    assert (batch["mlm_weights"][row][positions[row, len(want):]] == 0).all()
  np.testing.assert_allclose(np.asarray(out["mlm_logits"]),
                             np.take_along_axis(np.asarray(out_full["mlm_logits"]),
                                                positions[..., None], axis=1), atol=1e-5)
  np.testing.assert_allclose(float(loss), float(loss_full), rtol=1e-6)
  assert float(aux["train/mlm_accuracy"]) == float(aux_full["train/mlm_accuracy"])
  assert int(aux["train/mlm_dropped"]) == 0
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_full)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-7)

  # Too few slots: the targets beyond P are counted, never silently lost (a count of the
  # loss's: the forward alone, compiled without the backward).
  short = full.clone(mlm_max_predictions=int(targets.min()) - 2)
  aux = jax.jit(lambda p: objectives.pretraining_loss(short.apply({"params": p}, batch), batch,
                                                      lop_weight=0.5)[1])(params)
  assert int(aux["train/mlm_dropped"]) == int((targets - (int(targets.min()) - 2)).sum())
  with pytest.raises(ValueError, match="mlm_weights"):  # traced: no encoder run op by op
    jax.eval_shape(lambda p: capped.apply({"params": p}, {k: v for k, v in batch.items()
                                                          if not k.startswith("mlm")}), params)
