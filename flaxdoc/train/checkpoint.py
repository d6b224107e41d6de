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

Damage (`checkpoint_recovery`): each committed step gets a sha256 digest, written
on a background thread (`wait_until_finished` / `close` wait for it), and
`restore` without a step falls back from a damaged newest step to the newest
one that restores, with one warning line per skipped step.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import weakref
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocm

from flaxdoc.train import checkpoint_recovery as recovery
from flaxdoc.train.remote import is_remote  # gs://, s3://, ...: Orbax/epath, never os.path

log = logging.getLogger(__name__)

BEST_METRIC = "eval/f1"


@dataclasses.dataclass
class _Digests:
  """This process's digest work for one manager."""
  # Retention may delete the newest-but-one step during the next save only when it
  # keeps a single latest step; then that step's digest must be done before the save.
  keep: int = 1
  saved: list[int] = dataclasses.field(default_factory=list)  # save maybe still running
  writer: recovery.DigestWriter = dataclasses.field(default_factory=recovery.DigestWriter)


_DIGESTS: "weakref.WeakKeyDictionary[ocp.CheckpointManager, _Digests]" = (
    weakref.WeakKeyDictionary())


def _digests(manager: ocp.CheckpointManager) -> _Digests:
  return _DIGESTS.setdefault(manager, _Digests())


def make_manager(workdir: str, *, keep: int = 2, keep_best: bool = True,
                 save_every: int = 1000, async_save: bool = True,
                 create: bool = True) -> ocp.CheckpointManager:
  """A CheckpointManager in `WORKDIR/checkpoints` keeping the latest `keep` (+ best by F1).

  `create=False` (eval, predict, export: they only restore) leaves a missing folder missing,
  so a mistyped workdir gets `finished_steps`' error and nothing on disk.
  """
  policies: list[ocm.PreservationPolicy] = [ocm.LatestN(n=keep)]
  if keep_best:
    policies.append(ocm.BestN(get_metric_fn=lambda m: m.get(BEST_METRIC, float("-inf")), n=1,
                              keep_checkpoints_without_metrics=False))
  options = ocp.CheckpointManagerOptions(
      save_interval_steps=max(int(save_every), 1),
      preservation_policy=ocm.AnyPreservationPolicy(policies),
      enable_async_checkpointing=async_save,
      create=create,
  )
  directory = checkpoint_dir(workdir)
  recovery.install_test_pause()
  manager = ocp.CheckpointManager(directory, options=options,
                                  item_names=("state", "data", "meta"))
  _DIGESTS[manager] = _Digests(keep=int(keep))
  return manager


def has_checkpoint(workdir: str) -> bool:
  """Whether `WORKDIR/checkpoints` holds a step folder (read only: creates nothing)."""
  from etils import epath  # pylint: disable=import-outside-toplevel
  directory = epath.Path(checkpoint_dir(workdir))
  return directory.is_dir() and any(p.name.isdigit() for p in directory.iterdir())


def checkpoint_dir(workdir: str) -> str:
  """`WORKDIR/checkpoints` (accepts the checkpoints folder itself; keeps gs:// paths intact)."""
  workdir = str(workdir).rstrip("/")
  path = workdir if workdir.endswith("/checkpoints") else f"{workdir}/checkpoints"
  return path if is_remote(path) else os.path.abspath(path)


def save(manager: ocp.CheckpointManager, step: int, state: Any, *, data_state: dict | None = None,
         meta: dict | None = None, metrics: dict | None = None, force: bool = False) -> bool:
  """Starts an (async) save of `state` and the iterator state at `step`.

  Hashing runs off this thread: the previous step's digest is queued here and
  written while training goes on. Only digests queued at the save before (a whole
  checkpoint interval ago) are waited for, because this save's retention may
  delete their steps.
  """
  digests = _digests(manager)
  digests.writer.wait()
  # Orbax waits for the previous save before starting this one anyway; waiting
  # here first tells us that step has committed, so its digest can be queued.
  _queue_committed(manager)
  if digests.keep < 2:
    digests.writer.wait()
  args = ocp.args.Composite(
      state=ocp.args.StandardSave(state),
      data=ocp.args.JsonSave(data_state or {}),
      meta=ocp.args.JsonSave({"step": int(step), **(meta or {})}),
  )
  saved = manager.save(int(step), args=args, metrics=_scalar_metrics(metrics), force=force)
  if saved:
    log.info("checkpoint: saving step %d to %s", step, manager.directory)
    digests.saved.append(int(step))
  return saved


def _queue_committed(manager: ocp.CheckpointManager):
  """Waits for the running save and queues the digests of the steps it committed."""
  manager.wait_until_finished()
  digests = _digests(manager)
  steps, digests.saved = digests.saved, []
  if jax.process_index() != 0:
    return  # one writer: the step folders are shared
  for step in steps:
    digests.writer.submit(recovery.step_dir(str(manager.directory), step))


def wait_until_finished(manager: ocp.CheckpointManager):
  """Waits for the running save and for the digests of every step saved so far."""
  _queue_committed(manager)
  _digests(manager).writer.wait()


def close(manager: ocp.CheckpointManager):
  """`wait_until_finished` (saves and digests), then closes the manager."""
  wait_until_finished(manager)
  manager.close()


def latest_step(manager: ocp.CheckpointManager) -> int | None:
  return manager.latest_step()


def finished_steps(manager: ocp.CheckpointManager) -> list[int]:
  """The manager's committed steps; a `CheckpointError` naming its folder when there are none
  (a missing or empty folder, or only a save that never finished)."""
  steps = list(manager.all_steps())
  if not steps:
    raise recovery.CheckpointError(f"no finished checkpoint step in {manager.directory}: "
                                   "nothing to restore (train first, or check --workdir)")
  return steps


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
    _, restored = recovery.newest_good(
        directory, finished_steps(manager), lambda s: _restore_step(manager, abstract_state, s),
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
    path = str(mngr.directory)
    return recovery.newest_good(
        path, finished_steps(mngr), read,
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
