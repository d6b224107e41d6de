"""Orbax checkpoints: train state + data-iterator state + metadata, maxtext style.

One `CheckpointManager` per workdir (`WORKDIR/checkpoints/<step>/{state,data,meta}`):
* `state`: the sharded train state (params, optimiser state, step, RNG key), saved
  asynchronously; restored onto whatever mesh the restoring run uses (the target
  shardings come from the new run's abstract state).
* `data`: the input pipeline's iterator state as JSON, so a resumed run sees the
  same batches an uninterrupted run would have seen.
* `meta`: JSON with the step and the metrics of the last evaluation.

Retention: the latest `keep` checkpoints plus the best one by `eval/f1`.
Checkpoints are never pickled (Orbax / TensorStore / JSON only).

Damage (`checkpoint_recovery`): each committed step gets a sha256 digest, and
`restore` without a step falls back from a damaged newest step to the newest
one that restores, with one warning line per skipped step.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocm

from flaxdoc.train import checkpoint_recovery as recovery

log = logging.getLogger(__name__)

# Steps this process saved whose digest is not written yet (their save may still be running).
_PENDING_DIGESTS: "weakref.WeakKeyDictionary[ocp.CheckpointManager, list[int]]" = (
    weakref.WeakKeyDictionary())

BEST_METRIC = "eval/f1"


def make_manager(workdir: str, *, keep: int = 2, keep_best: bool = True,
                 save_every: int = 1000, async_save: bool = True) -> ocp.CheckpointManager:
  """A CheckpointManager in `WORKDIR/checkpoints` keeping the latest `keep` (+ best by F1)."""
  policies: list[ocm.PreservationPolicy] = [ocm.LatestN(n=keep)]
  if keep_best:
    policies.append(ocm.BestN(get_metric_fn=lambda m: m.get(BEST_METRIC, float("-inf")), n=1,
                              keep_checkpoints_without_metrics=False))
  options = ocp.CheckpointManagerOptions(
      save_interval_steps=max(int(save_every), 1),
      preservation_policy=ocm.AnyPreservationPolicy(policies),
      enable_async_checkpointing=async_save,
      create=True,
  )
  directory = checkpoint_dir(workdir)
  recovery.install_test_pause()
  return ocp.CheckpointManager(directory, options=options,
                               item_names=("state", "data", "meta"))


def is_remote(path: str) -> bool:
  """gs://, s3://, ... paths (handled by Orbax/TensorStore, never by os.path)."""
  return "://" in str(path)


def checkpoint_dir(workdir: str) -> str:
  """`WORKDIR/checkpoints` (accepts the checkpoints folder itself; keeps gs:// paths intact)."""
  workdir = str(workdir).rstrip("/")
  path = workdir if workdir.endswith("/checkpoints") else f"{workdir}/checkpoints"
  return path if is_remote(path) else os.path.abspath(path)


def save(manager: ocp.CheckpointManager, step: int, state: Any, *, data_state: dict | None = None,
         meta: dict | None = None, metrics: dict | None = None, force: bool = False) -> bool:
  """Starts an (async) save of `state` and the iterator state at `step`."""
  # Orbax waits for the previous save before starting this one anyway; waiting
  # here first lets us digest that step once it has committed.
  wait_until_finished(manager)
  args = ocp.args.Composite(
      state=ocp.args.StandardSave(state),
      data=ocp.args.JsonSave(data_state or {}),
      meta=ocp.args.JsonSave({"step": int(step), **(meta or {})}),
  )
  saved = manager.save(int(step), args=args, metrics=_scalar_metrics(metrics), force=force)
  if saved:
    log.info("checkpoint: saving step %d to %s", step, manager.directory)
    _PENDING_DIGESTS.setdefault(manager, []).append(int(step))
  return saved


def wait_until_finished(manager: ocp.CheckpointManager):
  """Waits for the running save, then writes the digest of every step it committed."""
  manager.wait_until_finished()
  pending = _PENDING_DIGESTS.pop(manager, [])
  if jax.process_index() != 0:
    return
  for step in pending:
    path = recovery.step_dir(str(manager.directory), step)
    if recovery.is_remote(path) or not os.path.exists(os.path.join(path, recovery.COMMIT_MARKER)):
      continue  # removed by retention already, or remote
    recovery.write_digest(path)


def latest_step(manager: ocp.CheckpointManager) -> int | None:
  return manager.latest_step()


def restore(manager: ocp.CheckpointManager, abstract_state: Any, step: int | None = None, *,
            move_damaged_newer: bool = False) -> tuple[Any, dict, dict]:
  """Restores (state, data_state, meta) at `step` (default: the newest step that restores).

  `abstract_state` is a tree of `jax.ShapeDtypeStruct`s with the *target*
  shardings, so a checkpoint written on one mesh restores onto another.
  Without `step`, damaged steps are skipped with one warning line each
  (`checkpoint_recovery.newest_good`); `move_damaged_newer` (training resume)
  moves the damaged steps newer than the restored one to
  `WORKDIR/damaged_checkpoints/`. Raises `NoRestorableCheckpointError` when no
  step restores and `CheckpointMismatchError` when the tree does not fit.
  """
  directory = str(manager.directory)
  if step is None:
    steps = manager.all_steps()
    if not steps:
      raise FileNotFoundError(f"no checkpoint in {directory}")
    _, restored = recovery.newest_good(
        directory, steps, lambda s: _restore_step(manager, abstract_state, s),
        fits=lambda s: recovery.check_fits(recovery.step_dir(directory, s), abstract_state),
        move_damaged_newer=move_damaged_newer, manager=manager)
    return restored
  return _restore_step(manager, abstract_state, step)


def _restore_step(manager: ocp.CheckpointManager, abstract_state: Any, step: int
                  ) -> tuple[Any, dict, dict]:
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract_state),
      data=ocp.args.JsonRestore(),
      meta=ocp.args.JsonRestore(),
  ))
  return restored.state, dict(restored.data or {}), dict(restored.meta or {})


def restore_params_only(directory: str, abstract_params: Any, step: int | None = None) -> Any:
  """Reads only `params` from another run's checkpoint (e.g. pre-training -> fine-tuning).

  `abstract_params` holds the target shapes/shardings of the subset to read;
  missing parameters (new heads) are left to the caller's initialiser.
  """
  mngr = ocp.CheckpointManager(checkpoint_dir(directory), item_names=("state", "data", "meta"),
                               options=ocp.CheckpointManagerOptions(read_only=True))
  target = {"params": abstract_params}

  def read(s):
    return mngr.restore(s, args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(
            item=target,
            restore_args=jax.tree.map(_restore_arg, target),
            partial_restore=True,
        ))).state["params"]

  try:
    if step is not None:
      return read(step)
    if not mngr.all_steps():
      raise FileNotFoundError(f"no checkpoint in {directory}")
    path = str(mngr.directory)
    return recovery.newest_good(
        path, mngr.all_steps(), read,
        fits=lambda s: recovery.check_fits(recovery.step_dir(path, s), target, subset=True))[1]
  finally:
    mngr.close()


def _restore_arg(x):
  sharding = getattr(x, "sharding", None)
  if sharding is not None:
    return ocp.ArrayRestoreArgs(sharding=sharding, global_shape=x.shape, dtype=x.dtype)
  return ocp.RestoreArgs()


def _scalar_metrics(metrics: dict | None) -> dict | None:
  if not metrics:
    return None
  return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
