"""Train state, sharded initialisation and the jitted train / predict steps.

big_vision / Flax-examples pattern:

    abstract = jax.eval_shape(init, rng)                 # no allocation
    shardings = logical_to_mesh_sharding(abstract, rules)  # from the config
    state = jax.jit(init, out_shardings=shardings)(rng)  # born sharded
    step = jax.jit(train_step, in_shardings=..., donate_argnums=0)
"""

from __future__ import annotations

from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding

from flaxdoc.train import objectives, sharding as sharding_lib


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array  # raw uint32 key data, so checkpoints need no key type support


def make_init_fn(model: nn.Module, tx: optax.GradientTransformation, example_batch: dict
                 ) -> Callable[[jax.Array], TrainState]:
  """`init(rng) -> TrainState` with logically-boxed parameters (for eval_shape)."""
  def init(rng):
    params_rng, dropout_rng, state_rng = jax.random.split(rng, 3)
    variables = model.init({"params": params_rng, "dropout": dropout_rng}, example_batch,
                           deterministic=True)
    params = variables["params"]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      rng=jax.random.key_data(state_rng) if _is_typed(state_rng) else state_rng)
  return init


def _is_typed(key) -> bool:
  return jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)


def sharded_init(init_fn, rng, mesh: Mesh, rules) -> tuple[TrainState, Any, Any]:
  """Initialises the state directly into its shardings.

  Returns `(state, state_shardings, abstract_state)`; `abstract_state` carries the
  shardings too (for Orbax restores onto this mesh).
  """
  boxed = jax.eval_shape(init_fn, rng)
  shardings = sharding_lib.logical_shardings(boxed, mesh, rules)
  # Parameters are placed by out_shardings (from their logical names). No
  # `nn.logical_axis_rules` context is active while tracing: flax 0.12's
  # DenseGeneral re-evaluates its boxed initialiser on every apply (a shape
  # check) and, under active rules, constrains the 2D-reshaped kernel with its
  # 3D logical spec, which fails. Activation constraints are therefore no-ops
  # and XLA propagates activation shardings from the parameters and the batch.
  with jax.set_mesh(mesh):
    state = jax.jit(lambda r: nn.unbox(init_fn(r)), out_shardings=shardings)(rng)
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          nn.unbox(boxed), shardings)
  return state, shardings, abstract


def make_train_step(model: nn.Module, tx: optax.GradientTransformation, *, mode: str,
                    lop_weight: float = 0.5, task_loss: Callable | None = None) -> Callable:
  """One optimisation step: loss, grads, update; returns (state, metrics).

  `task_loss(outputs, batch) -> (loss, aux)` replaces the tagging loss when fine-tuning
  (e.g. `flaxdoc.train.linking.LinkingTask.loss`).
  """
  def loss_fn(params, batch, dropout_rng):
    outputs = model.apply({"params": params}, batch, deterministic=False,
                          rngs={"dropout": dropout_rng})
    if mode == "pretrain":
      return objectives.pretraining_loss(outputs, batch, lop_weight=lop_weight)
    if task_loss is not None:
      return task_loss(outputs, batch)
    return objectives.tagging_loss(outputs, batch)

  def train_step(state: TrainState, batch: dict):
    dropout_rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch,
                                                                  dropout_rng)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    metrics = {"train/loss": loss, "train/grad_norm": optax.tree.norm(grads), **aux}
    return new_state, metrics

  return train_step


def make_predict_fn(model: nn.Module) -> Callable:
  """`predict(params, batch) -> log-probabilities [B, L, T]` of the tagging head."""
  def predict(params, batch):
    outputs = model.apply({"params": params}, batch, deterministic=True)
    return jax.nn.log_softmax(outputs["tag_logits"].astype(jnp.float32), axis=-1)
  return predict


def jit_train_step(train_step, mesh: Mesh, state_shardings, batch_shardings):
  return jax.jit(train_step, in_shardings=(state_shardings, batch_shardings),
                 out_shardings=(state_shardings, sharding_lib.replicated(mesh)),
                 donate_argnums=(0,))


def batch_shardings_for(batch: dict, mesh: Mesh) -> dict[str, NamedSharding]:
  return {k: sharding_lib.batch_sharding(mesh, max(v.ndim, 1)) for k, v in batch.items()}
