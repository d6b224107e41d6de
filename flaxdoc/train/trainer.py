"""The training loop: fine-tuning (tagging) and pre-training (MLM, 1-LOP).

One readable function, `train_and_evaluate(config, workdir)`, big_vision style:
data -> model -> sharded state -> (resume) -> loop {step, log, eval, checkpoint}.

Robustness:
* resume: the latest checkpoint (state + data iterator + RNG) is restored, so a
  run killed at any point continues exactly where its last checkpoint left it;
* SIGTERM (preemption): finish the current step, save, exit cleanly;
* a non-finite loss stops the run with a clear message; the last good
  checkpoint is kept (the bad state is never saved).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time

import grain
import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from flaxdoc.train import checkpoint as ckpt_lib
from flaxdoc.train import evaluate as eval_lib
from flaxdoc.train import hf_init, input_pipeline, linking, metrics_writer, optimizer, remote
from flaxdoc.train import setup
from flaxdoc.train import sharding as sharding_lib
from flaxdoc.train import state as state_lib

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
  pass


class _Preemption:
  """Turns SIGTERM into a flag the loop checks after each step."""

  def __init__(self):
    self.requested = False
    self._old = None

  def __enter__(self):
    try:
      self._old = signal.signal(signal.SIGTERM, self._handler)
    except ValueError:  # not in the main thread (e.g. a notebook worker)
      self._old = None
    return self

  def _handler(self, signum, frame):  # pylint: disable=unused-argument
    log.warning("SIGTERM received: saving a checkpoint and stopping")
    self.requested = True

  def __exit__(self, *exc):
    if self._old is not None:
      signal.signal(signal.SIGTERM, self._old)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains (or pre-trains) per `config.mode`; returns the final metrics."""
  mode = config.mode
  if mode not in ("train", "pretrain"):
    raise ValueError(f"train_and_evaluate handles modes 'train' and 'pretrain', not {mode!r}")
  # gs:// without gcsfs (epath reads config.json, Orbax the checkpoints): one line, now.
  remote.check_filesystem(workdir, "--workdir")
  if not remote.is_remote(workdir):
    os.makedirs(workdir, exist_ok=True)
  # The experiment resolves init_from=hf:DIR (sizes + tokenizer) once; the written
  # config.json and everything below use that resolved config. A resume takes what the
  # command leaves out and the run's state depends on (an hf: start, jsonl labels) from
  # the run's config.json.
  if ckpt_lib.has_checkpoint(workdir):
    config = setup.with_the_runs_record(config, workdir)
  env = setup.Experiment.create(config)
  config = env.config
  mesh = sharding_lib.make_mesh(dict(config.mesh.shape))
  rules = sharding_lib.rules_from_config(config.mesh.get("rules"))
  log.info("mesh %s over %d devices (%d processes)", dict(mesh.shape), jax.device_count(),
           jax.process_count())

  # Before the data: a bad optimiser setting (a ConfigError) is named before minutes of
  # featurising.
  tx, schedule = optimizer.make_optimizer(optimizer.run_optim_config(config),
                                          pretrained=hf_init.pretrained_mask(config))

  # --- data
  train_split = env.featurized(config.data.train_split, progress=True)
  eval_split = (env.featurized(config.data.eval_split, progress=True)
                if mode == "train" and config.data.get("eval_split") else None)
  log.info("train: %d documents, %d windows, %d tokens", len(train_split.documents),
           len(train_split.windows), train_split.num_tokens)

  # --- model and state
  model = env.model
  example = env.example_batch(1)
  init_fn = state_lib.make_init_fn(model, tx, example)
  rng = jax.random.PRNGKey(config.seed)
  state, state_shardings, abstract_state = state_lib.sharded_init(init_fn, rng, mesh, rules)
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
  log.info("model %s: %s parameters", config.model.name, f"{num_params:,}")

  manager = ckpt_lib.make_manager(workdir, keep=config.get("keep_checkpoints", 2),
                                  save_every=config.checkpoint_every,
                                  async_save=config.get("async_checkpoints", True))
  data_state = None
  if manager.latest_step() is not None:
    # A damaged newer step is skipped and moved aside so its step number can be saved again.
    state, data_state, meta = ckpt_lib.restore(manager, abstract_state, move_damaged_newer=True)
    log.info("resumed from step %d (%s)", int(state.step), manager.directory)
  elif config.get("init_from"):
    state = state.replace(params=env.load_pretrained(config.init_from, state.params,
                                                     abstract_state.params, workdir=workdir))
  if jax.process_index() == 0:
    # Written once the state fits the config: a resume with another config fails above
    # and leaves the run's record (which eval, predict and export read) as it was.
    save_config(config, workdir)

  shard_index, shard_count = sharding_lib.process_batch_shard(mesh, config.batch_size)
  train_iter = iter(input_pipeline.train_dataset(
      train_split, tokenizer=env.tokenizer, config=env.feature_config,
      global_batch=config.batch_size, seed=config.seed, mode=mode,
      block_shuffle=config.data.get("block_shuffle", 0.0),
      neighbour_swap=config.data.get("neighbour_swap", 0.0),
      mlm_rate=config.data.get("mlm_rate", 0.15), lop_rate=config.data.get("lop_rate", 0.0),
      mlm_max_predictions=env.model.mlm_max_predictions if mode == "pretrain" else None,
      shard=grain.sharding.ShardOptions(shard_index, shard_count)))
  if data_state:
    train_iter.set_state(data_state)

  first = next(train_iter)
  batch_shardings = state_lib.batch_shardings_for(first, mesh)
  train_step = state_lib.jit_train_step(
      state_lib.make_train_step(model, tx, mode=mode, lop_weight=config.get("lop_weight", 0.5),
                                task_loss=env.linking.loss if env.linking else None),
      mesh, state_shardings, batch_shardings)
  predict = jax.jit(state_lib.make_predict_fn(model),
                    in_shardings=(state_shardings.params, batch_shardings))

  def predict_fn(batch):
    with jax.set_mesh(mesh):
      out = predict(state.params, sharding_lib.replicated_batch_to_global(batch, mesh))
    return np.asarray(multihost_utils.process_allgather(out, tiled=True))

  if env.linking is not None:  # entity linking (config.task): flaxdoc.train.linking
    linker = linking.make_linker(model, lambda: state.params, mesh)

  writer = metrics_writer.MetricsWriter(workdir)
  total = int(config.total_steps)
  start_step = int(state.step)
  bar = metrics_writer.make_progress_bar(total, initial=start_step, desc=mode)
  last_metrics: dict = {}
  pending = first
  tokens_seen, t_last, steps_since = 0, time.perf_counter(), 0
  # closing: a run that stops on an error still uploads its buffered gs:// metrics.
  with _Preemption() as preempt, jax.set_mesh(mesh), contextlib.closing(writer):
    step = start_step
    while step < total:
      batch = pending if pending is not None else next(train_iter)
      pending = None
      tokens_seen += int(np.sum(batch["attention_mask"])) * shard_count
      new_state, metrics = train_step(state, sharding_lib.global_batch(batch, mesh,
                                                                       config.batch_size))
      step += 1
      steps_since += 1
      loss = float(metrics["train/loss"])
      if not np.isfinite(loss):
        bar.close()
        ckpt_lib.wait_until_finished(manager)  # + digests
        raise NonFiniteLossError(
            f"non-finite training loss ({loss}) at step {step}; stopping. The last good "
            f"checkpoint (step {manager.latest_step()}) is kept in {manager.directory}. Lower "
            "config.optim.lr, enable clipping (config.optim.clip_norm) or use float32.")
      state = new_state
      bar.update(1)
      if step % config.log_every == 0 or step == total:
        dt = time.perf_counter() - t_last
        row = {k: float(v) for k, v in metrics.items()}
        row["train/lr"] = float(schedule(step - 1))
        row["train/steps_per_s"] = steps_since / dt
        row["train/tokens_per_s"] = tokens_seen / dt
        writer.write(step, row)
        bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{row['train/tokens_per_s']:.0f}")
        tokens_seen, t_last, steps_since = 0, time.perf_counter(), 0
      eval_metrics = None
      if eval_split is not None and (step % config.eval_every == 0 or step == total):
        scores, preds = eval_lib.evaluate_split(eval_split, predict_fn, env.feature_config,
                                                config.eval_batch_size)
        eval_metrics = {"eval/f1": scores["f1"], "eval/precision": scores["precision"],
                        "eval/recall": scores["recall"]}
        if env.linking is not None:
          rel = env.linking.evaluate(eval_split, preds, linker, config.eval_batch_size)
          eval_metrics.update(linking.eval_metrics(rel))
          log.info("step %d: relation F1 %s", step, linking.summary(rel))
        writer.write(step, eval_metrics)
        last_metrics.update(eval_metrics)
        log.info("step %d: eval F1 %.4f (P %.4f, R %.4f)", step, scores["f1"],
                 scores["precision"], scores["recall"])
      force = preempt.requested or step == total
      if step % config.checkpoint_every == 0 or force:
        ckpt_lib.save(manager, step, state, data_state=train_iter.get_state(),
                      metrics=eval_metrics, force=force)
        writer.flush()
      if preempt.requested:
        break
  bar.close()
  ckpt_lib.close(manager)  # waits for the last save and its digest
  last_metrics["step"] = int(state.step)
  last_metrics["train/loss"] = float(metrics["train/loss"]) if int(state.step) > start_step else None
  return last_metrics


def save_config(config: ml_collections.ConfigDict, workdir: str):
  """Writes `WORKDIR/config.json` so eval/predict/export can rebuild the run's model."""
  from etils import epath  # pylint: disable=import-outside-toplevel
  path = epath.Path(workdir) / "config.json"
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(config.to_json_best_effort(indent=1, sort_keys=True))
