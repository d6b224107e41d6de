"""Fixtures shared by the trainer tests: one tiny training run per test session (per worker)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from tiny import tiny_config  # pylint: disable=import-error,wrong-import-position


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
  """(workdir, result) of the tiny FormNet config trained for 6 steps (evals at 3 and 6).

  Tests may read the workdir and add files to it (eval reports, predictions), but
  must not train in it again.
  """
  from flaxdoc.train import trainer  # pylint: disable=import-outside-toplevel
  workdir = str(tmp_path_factory.mktemp("trained"))
  result = trainer.train_and_evaluate(tiny_config(), workdir)
  return workdir, result
