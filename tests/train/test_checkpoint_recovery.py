"""Damaged checkpoints: digests, fall back to the newest good step, one-line errors, mismatch.

Unit tests on a small hand-made train state (fast), then the same damage on a
tiny trained workdir: eval restores the previous step, a resumed run ends
bit-identical to the uninterrupted one, `python -m flaxdoc.main` prints one line.
"""

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxdoc.train import checkpoint as ckpt_lib
from flaxdoc.train import checkpoint_recovery as recovery
from flaxdoc.train.state import TrainState

sys.path.insert(0, os.path.dirname(__file__))
from damage import DAMAGE_KINDS, damage  # pylint: disable=import-error,wrong-import-position
from tiny import ROOT, override_flags, tiny_config  # pylint: disable=import-error,wrong-import-position


def _state(seed, shape=(4, 3)):
  rng = np.random.default_rng(seed)
  return TrainState(step=jnp.asarray(seed, jnp.int32),
                    params={"dense": {"kernel": jnp.asarray(rng.normal(size=shape), jnp.float32)}},
                    opt_state={"mu": jnp.asarray(rng.normal(size=shape), jnp.float32)},
                    rng=jnp.asarray([seed, 7], jnp.uint32))


def _abstract(state):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)


def _saved(tmp_path, steps=(1, 2), shape=(64, 32)):
  mngr = ckpt_lib.make_manager(str(tmp_path), keep=5, keep_best=False, save_every=1,
                               async_save=False)
  for step in steps:
    ckpt_lib.save(mngr, step, _state(step, shape), data_state={"next": step})
  ckpt_lib.wait_until_finished(mngr)
  return mngr


def test_digest_lists_every_file_in_sha256sum_format(tmp_path):
  mngr = _saved(tmp_path)
  step_path = recovery.step_dir(str(mngr.directory), 2)
  lines = open(os.path.join(step_path, recovery.DIGEST_FILE), encoding="utf-8").read().splitlines()
  listed = {}
  for line in lines:
    digest, rel = line.split("  ", 1)
    listed[rel] = digest
  on_disk = {os.path.relpath(os.path.join(r, n), step_path)
             for r, _, names in os.walk(step_path) for n in names} - {recovery.DIGEST_FILE}
  assert set(listed) == on_disk and "commit_success.txt" in listed
  for rel, digest in listed.items():
    assert hashlib.sha256(open(os.path.join(step_path, rel), "rb").read()).hexdigest() == digest
  assert recovery.check_step(step_path) is None


@pytest.mark.parametrize("kind", DAMAGE_KINDS)
def test_restore_falls_back_from_each_damage_kind(tmp_path, kind, caplog):
  mngr = _saved(tmp_path)
  damage(recovery.step_dir(str(mngr.directory), 2), kind)
  with caplog.at_level(logging.WARNING):
    state, data_state, meta = ckpt_lib.restore(mngr, _abstract(_state(0, (64, 32))))
  jax.tree.map(np.testing.assert_array_equal, state, _state(1, (64, 32)))
  assert data_state == {"next": 1} and meta["step"] == 1
  warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert len(warnings) == 1 and "step 2" in warnings[0] and "\n" not in warnings[0]
  assert os.path.isdir(recovery.step_dir(str(mngr.directory), 2))  # skipped, never deleted


def test_without_digest_orbax_read_errors_still_mark_the_step_damaged(tmp_path):
  """Steps from before digests existed: the digest check is skipped, the read error is caught."""
  mngr = _saved(tmp_path)
  step_path = recovery.step_dir(str(mngr.directory), 2)
  os.remove(os.path.join(step_path, recovery.DIGEST_FILE))
  damage(step_path, "truncated")
  assert recovery.check_step(step_path) is None  # nothing cheap to see
  state, _, meta = ckpt_lib.restore(mngr, _abstract(_state(0, (64, 32))))
  assert meta["step"] == 1 and int(state.step) == 1


def test_all_steps_damaged_is_one_line_naming_each_step(tmp_path):
  mngr = _saved(tmp_path)
  damage(recovery.step_dir(str(mngr.directory), 2), "bit_flip")
  damage(recovery.step_dir(str(mngr.directory), 1), "no_commit_marker")
  with pytest.raises(recovery.NoRestorableCheckpointError) as info:
    ckpt_lib.restore(mngr, _abstract(_state(0, (64, 32))))
  message = str(info.value)
  assert "\n" not in message and str(mngr.directory) in message
  assert "step 2: file state/" in message and "step 1: no commit marker" in message
  assert [s for s, _ in info.value.reasons] == [2, 1]


def test_wrong_config_is_a_mismatch_not_damage(tmp_path):
  mngr = _saved(tmp_path)
  with pytest.raises(recovery.CheckpointMismatchError, match=r"dense/kernel is shape \(64, 32\) "
                     r"in the checkpoint, shape \(64, 16\) in the model"):
    ckpt_lib.restore(mngr, _abstract(_state(0, (64, 16))))
  other = _abstract(_state(0, (64, 32)))
  other = other.replace(params={"dense": other.params["dense"], "head": other.params["dense"]})
  with pytest.raises(recovery.CheckpointMismatchError, match="head/kernel is absent in the checkpoint"):
    ckpt_lib.restore(mngr, other)


def test_training_resume_moves_newer_damaged_steps_aside_and_saves_again(tmp_path, caplog):
  mngr = _saved(tmp_path, steps=(1, 2, 3))
  damage(recovery.step_dir(str(mngr.directory), 3), "truncated")
  damage(recovery.step_dir(str(mngr.directory), 2), "bad_metadata")
  with caplog.at_level(logging.WARNING):
    state, _, _ = ckpt_lib.restore(mngr, _abstract(_state(0, (64, 32))), move_damaged_newer=True)
  assert int(state.step) == 1 and sorted(mngr.all_steps()) == [1]
  moved = tmp_path / recovery.DAMAGED_DIR
  assert sorted(os.listdir(moved)) == ["2", "3"]
  assert any(f"rm -r {moved / '3'}" in r.getMessage() for r in caplog.records)
  ckpt_lib.save(mngr, 2, _state(2, (64, 32)))
  ckpt_lib.wait_until_finished(mngr)
  assert ckpt_lib.restore(mngr, _abstract(_state(0, (64, 32))))[2]["step"] == 2


def _digest_path(mngr, step):
  return os.path.join(recovery.step_dir(str(mngr.directory), step), recovery.DIGEST_FILE)


def test_digests_are_hashed_off_the_training_thread(tmp_path, monkeypatch):
  """A held hash does not delay `save`; a step awaiting its digest restores; `wait` waits."""
  release = threading.Event()
  hashed_on = []
  original = recovery.write_digest

  def held(path):
    hashed_on.append(threading.current_thread())
    release.wait(timeout=60)
    return original(path)

  monkeypatch.setattr(recovery, "write_digest", held)
  mngr = ckpt_lib.make_manager(str(tmp_path), keep=5, keep_best=False, save_every=1,
                               async_save=False)
  ckpt_lib.save(mngr, 1, _state(1, (64, 32)), data_state={"next": 1})
  ckpt_lib.save(mngr, 2, _state(2, (64, 32)), data_state={"next": 2})  # queues step 1's digest
  # Had the save waited for the held hash (released only after 60 s), step 1's digest
  # would be written by now.
  assert not os.path.exists(_digest_path(mngr, 1)) and not os.path.exists(_digest_path(mngr, 2))
  # No digest yet: restored without that check, like a step saved before digests existed.
  _, data_state, meta = ckpt_lib.restore(mngr, _abstract(_state(0, (64, 32))))
  assert meta["step"] == 2 and data_state == {"next": 2}
  release.set()
  ckpt_lib.close(mngr)
  for step in (1, 2):
    assert os.path.exists(_digest_path(mngr, step))
    assert recovery.check_step(recovery.step_dir(str(mngr.directory), step)) is None
  assert hashed_on and threading.main_thread() not in hashed_on


def test_keeping_one_step_digests_it_before_retention_removes_it(tmp_path, caplog):
  mngr = ckpt_lib.make_manager(str(tmp_path), keep=1, keep_best=False, save_every=1,
                               async_save=False)
  with caplog.at_level(logging.WARNING):
    for step in (1, 2, 3):
      ckpt_lib.save(mngr, step, _state(step, (64, 32)))
    ckpt_lib.close(mngr)
  assert mngr.all_steps() == [3] and os.path.exists(_digest_path(mngr, 3))
  assert not [r for r in caplog.records if "digest" in r.getMessage()]


def test_process_exit_waits_for_queued_digests(tmp_path):
  """A script that never waits still leaves the digest it queued (the worker is joined at exit)."""
  script = textwrap.dedent(f"""
      import time
      import jax.numpy as jnp
      from flaxdoc.train import checkpoint as ckpt_lib, checkpoint_recovery as recovery
      original = recovery.write_digest
      recovery.write_digest = lambda path: (time.sleep(2), original(path))[1]
      mngr = ckpt_lib.make_manager({str(tmp_path)!r}, keep=5, save_every=1, async_save=False)
      ckpt_lib.save(mngr, 1, {{"w": jnp.ones(3)}})
      ckpt_lib.save(mngr, 2, {{"w": jnp.zeros(3)}})  # queues step 1's digest, then exits
  """)
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       timeout=300, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  step_1 = recovery.step_dir(ckpt_lib.checkpoint_dir(str(tmp_path)), 1)
  assert os.path.exists(os.path.join(step_1, recovery.DIGEST_FILE))
  assert recovery.check_step(step_1) is None


# ------------------------------------------------------- a tiny trained workdir

@pytest.fixture
def trained_copy(trained, tmp_path):
  """A private copy of the session's tiny trained workdir (steps 3 and 6)."""
  workdir, _ = trained
  dest = tmp_path / "run"
  shutil.copytree(workdir, dest)
  return str(dest)


def _step_params(workdir, step):
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  mngr = ckpt_lib.make_manager(workdir)
  restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  return restored.state["params"]


@pytest.mark.parametrize("kind", DAMAGE_KINDS)
def test_eval_restore_falls_back_to_step_3(trained_copy, kind):
  from flaxdoc.train import inference  # pylint: disable=import-outside-toplevel
  expected = _step_params(trained_copy, 3)
  damage(os.path.join(trained_copy, "checkpoints", "6"), kind)
  _, params, _ = inference.restore_for_inference(tiny_config(), trained_copy)
  jax.tree.map(np.testing.assert_array_equal, params, expected)
  assert os.path.isdir(os.path.join(trained_copy, "checkpoints", "6"))


@pytest.mark.slow
@pytest.mark.parametrize("kind", DAMAGE_KINDS)
def test_resume_from_damaged_step_ends_equal_to_uninterrupted(trained_copy, kind):
  """Step 6 damaged: training resumes from 3, re-saves 6, and ends bit-identical."""
  from flaxdoc.train import trainer  # pylint: disable=import-outside-toplevel
  expected = _step_params(trained_copy, 6)
  damage(os.path.join(trained_copy, "checkpoints", "6"), kind)
  result = trainer.train_and_evaluate(tiny_config(), trained_copy)
  assert result["step"] == 6
  assert os.listdir(os.path.join(trained_copy, recovery.DAMAGED_DIR)) == ["6"]
  jax.tree.map(np.testing.assert_array_equal, _step_params(trained_copy, 6), expected)


def _main(workdir, *extra):
  cmd = [sys.executable, "-m", "flaxdoc.main", "--config=configs/formnet_a2.py:local",
         f"--workdir={workdir}", *override_flags(), "--config.mode=eval", *extra]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_main_all_damaged_prints_one_line_and_exits_1(trained_copy):
  damage(os.path.join(trained_copy, "checkpoints", "6"), "truncated")
  damage(os.path.join(trained_copy, "checkpoints", "3"), "bad_metadata")
  out = _main(trained_copy)
  assert out.returncode == 1
  errors = [l for l in out.stderr.splitlines() if l.startswith("flaxdoc: error:")]
  assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
  assert "step 6: file state/" in errors[0] and "step 3: meta/metadata" in errors[0]
  shown = _main(trained_copy, "--traceback")
  assert shown.returncode == 1 and "Traceback" in shown.stderr


@pytest.mark.slow
def test_main_wrong_config_names_the_parameter(trained_copy):
  out = _main(trained_copy, "--config.model.width=48")
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
  line = next(l for l in out.stderr.splitlines() if l.startswith("flaxdoc: error:"))
  assert "does not fit this model" in line and "in the checkpoint" in line


def test_init_from_params_fall_back_too(tmp_path):
  """`restore_params_only` (init_from of a flaxdoc run) skips a damaged newest step as well."""
  _saved(tmp_path)
  damage(recovery.step_dir(ckpt_lib.checkpoint_dir(str(tmp_path)), 2), "bit_flip")
  params = ckpt_lib.restore_params_only(str(tmp_path), _abstract(_state(0, (64, 32))).params)
  np.testing.assert_array_equal(params["dense"]["kernel"], _state(1, (64, 32)).params["dense"]["kernel"])
