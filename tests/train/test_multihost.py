"""Multi-host on one CPU: 2 processes x 4 devices log the same losses as 1 process x 8 devices."""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from tiny import ROOT, override_flags  # pylint: disable=import-error,wrong-import-position

from flaxdoc.train import metrics_writer  # pylint: disable=wrong-import-position


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _cmd(workdir, *extra):
  return [sys.executable, "-m", "flaxdoc.main", "--config=configs/formnet_a2.py:local",
          f"--workdir={workdir}", *override_flags(), "--config.total_steps=4",
          "--config.batch_size=8", "--config.eval_every=1000", "--config.checkpoint_every=2",
          *extra]


def _env(devices, **extra):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  env.update(extra)
  return env


def _losses(workdir):
  return [r["train/loss"] for r in metrics_writer.read_metrics(str(workdir)) if "train/loss" in r]


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
  single = subprocess.run(_cmd(tmp_path / "single"), cwd=ROOT, env=_env(8), capture_output=True,
                          text=True, timeout=900)
  assert single.returncode == 0, single.stderr[-3000:]

  port = _free_port()
  procs = [subprocess.Popen(
      _cmd(tmp_path / "multi", "--multihost"), cwd=ROOT, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True,
      env=_env(4, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
               JAX_PROCESS_ID=str(i))) for i in range(2)]
  outs = [p.communicate(timeout=900)[0] for p in procs]
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
  assert "2 process(es), 8 device(s)" in outs[0]
  a, b = _losses(tmp_path / "single"), _losses(tmp_path / "multi")
  assert len(a) == len(b) == 4
  np.testing.assert_allclose(a, b, rtol=1e-5)
