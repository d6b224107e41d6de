"""Shared pytest fixtures, and XLA:CPU's compile level for the tests.

`datasets_dir`: the folder with the FUNSD / CORD / SROIE copies, i.e.
`$FLAXDOC_DATASETS` if set, else `../shared/datasets` next to the repository
root. Tests that use it are skipped, with the reason, when it is absent.

Most of the default run is XLA compiling, not running: the Pallas kernels interpreted on
the CPU, whole models compiled for a step or two. XLA:CPU's lowest backend optimisation
level (LLVM's `-O0`) halves that: the default run went from 998 s to 654 s of wall time
and from 1,538 s to 1,115 s of CPU (2 workers on this 2-core machine, back to back), its
in-process compiles from 1,027 s to 500 s, and no test took more CPU beyond noise (the
tests run a few steps on tiny shapes). Both sides of every comparison are compiled alike,
and every test passes at either level. It goes into `XLA_FLAGS` before any test starts
JAX, so subprocesses inherit it too; a level already set there wins
(`XLA_FLAGS=--xla_backend_optimization_level=3` for the default one).

XLA:CPU's older loop emitters (`--xla_cpu_use_fusion_emitters=false`) cut most of what
compiling still costs: a one-layer FormNet's gradient compiled in 3-5 s of CPU instead of
12-15 s, and `tests/models/test_document_encoder.py` with `tests/nn/test_dropout.py` took
227 s of CPU instead of 320 s (on a slower 2-core machine, where the default run took
about an hour). Both emitters are XLA's own and both sides of every comparison are
compiled alike; a setting already in `XLA_FLAGS` wins here too.
"""

import os
from pathlib import Path

import pytest

for _flag, _value in (("--xla_backend_optimization_level", "0"),
                      ("--xla_cpu_use_fusion_emitters", "false")):
  if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}={_value}".strip()


def find_datasets_dir() -> Path:
  env = os.environ.get("FLAXDOC_DATASETS")
  if env:
    return Path(env)
  return Path(__file__).resolve().parents[1] / ".." / "shared" / "datasets"


@pytest.fixture(scope="session")
def datasets_dir() -> Path:
  path = find_datasets_dir()
  if not path.is_dir():
    pytest.skip(f"datasets folder {path} not found (set FLAXDOC_DATASETS to the folder that "
                "holds funsd/, cord/ and sroie/)")
  return path.resolve()
