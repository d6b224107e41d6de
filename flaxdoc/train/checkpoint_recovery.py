"""Surviving damaged checkpoints: per-step digests, integrity checks, newest-good fallback.

A checkpoint step can be damaged after Orbax committed it (a full disk, a
preempted `cp`, a bit flip on a flaky drive) or never finish (a kill during an
async save). Orbax restores one step and raises whatever TensorStore says
("OUT_OF_RANGE: Error reading opt_state..."), so one bad file used to stop
eval, predict, export and training resume although an older step was intact.

What this module adds (`checkpoint.py` calls it; its API is unchanged):
* a digest per step: once a save has committed, `flaxdoc.sha256` (sha256sum
  format, so `sha256sum -c flaxdoc.sha256` works in the step folder) records
  every file of the step, so a truncated, missing or bit-flipped file is caught
  before TensorStore reads it. `DigestWriter` hashes on a background thread
  (reading gigabytes of a large model's step would otherwise stall training).
  Steps written before this existed, killed between the commit and the digest,
  or whose digest is still being written have no digest: that check is skipped
  for them and Orbax's own read errors still mark them damaged;
* cheap checks before a restore: the commit marker is there, the JSON metadata
  parses, the digest matches;
* `newest_good`: walk the steps newest -> oldest, log one warning line per
  skipped step with its reason, return the first that restores. A checkpoint
  whose tree does not fit the model is *not* damage (another config): it raises
  `CheckpointMismatchError` naming the first mismatching parameter;
* nothing is ever deleted. Training resume moves a damaged step that is newer
  than the restored one to `WORKDIR/damaged_checkpoints/` (the manager could
  not save that step number again otherwise) and logs how to remove it; eval,
  predict, export and `init_from` only skip it.

Digests are local-filesystem only: on gs:// / s3:// paths the checks are the
commit marker and metadata ones, plus Orbax's read errors.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import logging
import os
import shutil
import time
from typing import Any, Callable, TypeVar

import jax

from flaxdoc.train.remote import is_remote

log = logging.getLogger(__name__)

T = TypeVar("T")

DIGEST_FILE = "flaxdoc.sha256"
COMMIT_MARKER = "commit_success.txt"
DAMAGED_DIR = "damaged_checkpoints"
# Test hook: seconds to sleep inside an async save just before Orbax writes the
# commit marker, so a test can SIGKILL a run at exactly that point.
PAUSE_ENV = "FLAXDOC_TEST_PAUSE_BEFORE_COMMIT"
PAUSE_MARKER = "test_paused_before_commit"


class CheckpointError(RuntimeError):
  """A checkpoint problem worth one line to the user (no traceback by default)."""


class NoRestorableCheckpointError(CheckpointError):
  """Every step in the workdir is damaged; the message lists each step's reason."""

  def __init__(self, directory: str, reasons: list[tuple[int, str]]):
    self.directory = directory
    self.reasons = list(reasons)
    listed = "; ".join(f"step {s}: {r}" for s, r in self.reasons)
    super().__init__(f"no restorable checkpoint in {directory} ({listed})")


class CheckpointMismatchError(CheckpointError):
  """The checkpoint's tree does not fit the model being restored (another config)."""


def step_dir(directory: str, step: int) -> str:
  return f"{str(directory).rstrip('/')}/{int(step)}"


def one_line(exc: BaseException, limit: int = 240) -> str:
  """`TypeName: first line of the message`, cut to `limit` characters."""
  text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
  text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
  return text if len(text) <= limit else text[:limit - 3] + "..."


# ---------------------------------------------------------------- digests

def _files(path: str) -> list[str]:
  out = []
  for root, _, names in os.walk(path):
    for name in names:
      rel = os.path.relpath(os.path.join(root, name), path)
      if rel != DIGEST_FILE:
        out.append(rel)
  return sorted(out)


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def write_digest(path: str) -> str | None:
  """Writes `path/flaxdoc.sha256` over every file of a committed step (atomically)."""
  if is_remote(path) or not os.path.isdir(path):
    return None
  lines = [f"{_sha256(os.path.join(path, rel))}  {rel}\n" for rel in _files(path)]
  target = os.path.join(path, DIGEST_FILE)
  tmp = target + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.writelines(lines)
  os.replace(tmp, target)
  return target


def _write_committed_digest(path: str) -> str | None:
  """`write_digest` for a step that may be gone (retention) or uncommitted: logs, never raises."""
  try:
    if not os.path.exists(os.path.join(path, COMMIT_MARKER)):
      return None  # removed by retention already, or the save failed
    return write_digest(path)
  except FileNotFoundError:
    log.info("checkpoint %s was removed while its digest was written; no digest", path)
  except OSError as e:  # the digest is an extra check: its failure must not stop training
    log.warning("could not write the digest of checkpoint %s: %s", path, one_line(e))
  return None


class DigestWriter:
  """Writes step digests on one background thread, in submission order.

  `submit` returns at once; `wait` blocks until every digest submitted so far is
  written. Threads of a `ThreadPoolExecutor` are joined at interpreter exit, so
  a normal exit also waits for the submitted digests (a kill loses them: that
  step then restores without the digest check, like one saved before digests).
  """

  def __init__(self):
    self._pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="flaxdoc-digest")
    self._futures: list[concurrent.futures.Future] = []

  def submit(self, path: str):
    if is_remote(path):
      return  # digests are local-filesystem only
    self._futures.append(self._pool.submit(_write_committed_digest, path))

  def wait(self):
    futures, self._futures = self._futures, []
    concurrent.futures.wait(futures)


def _digest_reason(path: str) -> str | None:
  digest = os.path.join(path, DIGEST_FILE)
  if not os.path.exists(digest):
    return None  # written before digests existed, or killed before it: skip this check
  with open(digest, encoding="utf-8") as f:
    for line in f:
      want, _, rel = line.rstrip("\n").partition("  ")
      full = os.path.join(path, rel)
      if not os.path.isfile(full):
        return f"file {rel} is missing"
      if _sha256(full) != want:
        return f"file {rel} does not match its sha256 in {DIGEST_FILE} (truncated or corrupted)"
  return None


# ----------------------------------------------------------------- checks

def check_step(path: str) -> str | None:
  """The one-line reason why the step folder `path` is damaged, or None when it looks sound."""
  from etils import epath  # pylint: disable=import-outside-toplevel
  p = epath.Path(path)
  if not p.exists():
    return "folder is missing"
  if not (p / COMMIT_MARKER).exists():
    return f"no commit marker ({COMMIT_MARKER}): the save never finished"
  for item in ("meta", "data"):
    meta = p / item / "metadata"
    if not meta.exists():
      return f"{item}/metadata is missing"
    try:
      json.loads(meta.read_text())
    except (ValueError, UnicodeDecodeError) as e:
      return f"{item}/metadata does not parse as JSON ({one_line(e, 120)})"
  if not is_remote(path):
    return _digest_reason(path)
  return None


def _key_name(entry) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(entry, attr):
      return str(getattr(entry, attr))
  return str(entry)


def _shapes(tree) -> dict[str, tuple]:
  leaves = jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda x: hasattr(x, "shape") and not isinstance(x, dict))[0]
  return {"/".join(_key_name(k) for k in path): tuple(leaf.shape) for path, leaf in leaves}


def _params_of(tree):
  if hasattr(tree, "params"):
    return tree.params
  if isinstance(tree, dict) and "params" in tree:
    return tree["params"]
  return tree


def saved_param_shapes(path: str) -> dict[str, tuple]:
  """{parameter path: shape} of `path/state` from its Orbax metadata (no array is read)."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  from etils import epath  # pylint: disable=import-outside-toplevel
  meta = ocp.PyTreeCheckpointHandler().metadata(epath.Path(path) / "state")
  return _shapes(_params_of(getattr(meta, "tree", meta)))


def check_fits(path: str, abstract_state: Any, *, subset: bool = False):
  """Raises `CheckpointMismatchError` when the saved parameters do not fit `abstract_state`.

  `subset=True` (init_from): only parameters present on both sides must agree in shape.
  """
  saved = saved_param_shapes(path)
  wanted = _shapes(_params_of(abstract_state))
  for name in sorted(set(saved) | set(wanted)):
    have, want = saved.get(name), wanted.get(name)
    if have == want or (subset and (have is None or want is None)):
      continue
    raise CheckpointMismatchError(
        f"checkpoint {path} does not fit this model (another config?): parameter {name} is "
        f"{_describe(have)} in the checkpoint, {_describe(want)} in the model")


def _describe(shape) -> str:
  return "absent" if shape is None else f"shape {shape}"


# --------------------------------------------------------------- fallback

def newest_good(directory: str, steps, attempt: Callable[[int], T], *,
                fits: Callable[[int], None] | None = None,
                move_damaged_newer: bool = False, manager: Any = None) -> tuple[int, T]:
  """(step, attempt(step)) for the newest step that passes the checks and restores.

  `fits(step)` may raise `CheckpointMismatchError`, which propagates (a config
  problem, not damage). Any other failure marks the step damaged: one warning
  line, then the next older step. `move_damaged_newer` (training resume) moves
  damaged steps newer than the restored one aside so the manager can save those
  step numbers again; `manager.reload()` then forgets them.
  """
  reasons: list[tuple[int, str]] = []
  for step in sorted((int(s) for s in steps), reverse=True):
    path = step_dir(directory, step)
    reason = check_step(path)
    if reason is None:
      try:
        if fits is not None:
          fits(step)
        result = attempt(step)
      except CheckpointMismatchError:
        raise
      except Exception as e:  # pylint: disable=broad-except
        reason = f"restore failed: {one_line(e)}"
      else:
        if move_damaged_newer and reasons:
          if jax.process_index() == 0:  # one mover; the others wait for it below
            for bad, why in reasons:
              move_aside(directory, bad, why)
          if jax.process_count() > 1:
            from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
            multihost_utils.sync_global_devices("flaxdoc_move_damaged_checkpoints")
          if manager is not None:
            manager.reload()
        return step, result
    log.warning("checkpoint step %d in %s is damaged, skipping it: %s", step, directory, reason)
    reasons.append((step, reason))
  raise NoRestorableCheckpointError(directory, reasons)


def move_aside(directory: str, step: int, reason: str) -> str:
  """Moves step `step` to `WORKDIR/damaged_checkpoints/<step>` (never deletes it)."""
  workdir = os.path.dirname(str(directory).rstrip("/"))
  dest_root = os.path.join(workdir, DAMAGED_DIR)
  dest = os.path.join(dest_root, str(step))
  if is_remote(directory):  # os calls on gs://b/run would make a local folder named `gs:`
    from etils import epath  # pylint: disable=import-outside-toplevel
    if epath.Path(dest).exists():
      dest = f"{dest}.{time.strftime('%Y%m%d-%H%M%S')}"
    _move_remote(epath.Path(step_dir(directory, step)), epath.Path(dest))
  else:
    os.makedirs(dest_root, exist_ok=True)
    if os.path.exists(dest):
      dest = f"{dest}.{time.strftime('%Y%m%d-%H%M%S')}"
    shutil.move(step_dir(directory, step), dest)
  log.warning("moved damaged checkpoint step %d (%s) to %s so training can save step %d again; "
              "nothing was deleted: inspect it, then remove it with `%s %s`", step, reason, dest,
              step, _REMOVE_COMMANDS.get(str(directory).split("://")[0], "rm -r"), dest)
  return dest


# What removes a folder, by the scheme of its path (a local path: "rm -r").
_REMOVE_COMMANDS = {"gs": "gcloud storage rm -r", "s3": "aws s3 rm --recursive"}


def _move_remote(source, dest):
  """Moves a folder on an object store: copies its files, then removes it (after every copy,
  so a failure leaves the step where it was). Object stores have no folder rename, and
  epath's rename wants `dest`'s parent to exist, which a bucket's "folders" (prefixes of
  object names) do not until a file is under them."""
  _copy_tree(source, dest)
  source.rmtree()


def _copy_tree(source, dest):
  dest.mkdir(parents=True, exist_ok=True)  # a no-op on gs://; a local stand-in needs it
  for child in source.iterdir():
    if child.is_dir():
      _copy_tree(child, dest / child.name)
    else:
      child.copy(dest / child.name)


# --------------------------------------------------------------- test hook

def install_test_pause():
  """With $FLAXDOC_TEST_PAUSE_BEFORE_COMMIT=SECONDS[:STEP], sleep before a step's commit marker.

  Only for tests: it lets one SIGKILL a run inside an async save, after the
  arrays are written and before Orbax commits the step (every step, or only
  STEP). A file `WORKDIR/test_paused_before_commit` names the paused step folder.
  """
  spec = os.environ.get(PAUSE_ENV) or ""
  seconds_text, _, only_step = spec.partition(":")
  seconds = float(seconds_text or 0)
  if seconds <= 0:
    return
  from orbax.checkpoint._src.path import atomicity  # pylint: disable=import-outside-toplevel
  cls = atomicity.AtomicRenameTemporaryPath
  if getattr(cls.finalize, "_flaxdoc_pause", False):
    return
  original = cls.finalize

  async def finalize(self):
    final = str(self.get_final())
    parent = os.path.dirname(final)
    if (os.path.basename(parent) == "checkpoints"  # the step folder, not its items
        and (not only_step or os.path.basename(final) == only_step)):
      with open(os.path.join(os.path.dirname(parent), PAUSE_MARKER), "w", encoding="utf-8") as f:
        f.write(final)
      await asyncio.sleep(seconds)
    return await original(self)

  finalize._flaxdoc_pause = True  # pylint: disable=protected-access
  cls.finalize = finalize
