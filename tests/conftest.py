"""Shared pytest fixtures.

`datasets_dir`: the folder with the FUNSD / CORD / SROIE copies, i.e.
`$FLAXDOC_DATASETS` if set, else `../shared/datasets` next to the repository
root. Tests that use it are skipped, with the reason, when it is absent.
"""

import os
from pathlib import Path

import pytest


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
