"""Workdirs on object stores (`gs://bucket/run`): the files flaxdoc keeps there, via etils.epath.

Orbax writes and reads the checkpoints (array data through TensorStore, the rest through
`etils.epath`); everything else under a workdir -- `config.json`, `metrics.jsonl`,
`eval_<split>.json`, `predictions.jsonl`, the pictures, an export -- goes through
`etils.epath.Path` too, so a `gs://` workdir works for train, eval, predict and export.
Never `os.path`/`open` on such a path: they take `gs://b/run` for a relative local path and
create a folder literally named `gs:` in the current directory.

epath reaches `gs://` through fsspec and gcsfs (`pip install gcsfs`, in the `tpu` extra);
without it the first file operation raises an ImportError deep in a run.
`check_filesystem` makes that one line naming the package, before any work.
"""

from __future__ import annotations

import os
import tempfile
from typing import Callable, TypeVar

from flaxdoc.train.config_error import ConfigError

T = TypeVar("T")

# The package epath's fsspec backend needs per scheme (fsspec's registry names them too).
FILESYSTEM_PACKAGES = {"gs": "gcsfs", "s3": "s3fs", "az": "adlfs", "hf": "huggingface_hub"}


class RemoteFilesystemError(ConfigError):
  """A remote path whose filesystem package is missing, or a scheme epath cannot reach."""


def is_remote(path) -> bool:
  """gs://, s3://, ... paths: read and written through epath, never os.path."""
  return "://" in str(path)


def check_filesystem(path, flag: str):
  """Raises `RemoteFilesystemError` (one line) when `path` is remote and cannot be reached:
  its filesystem package is not installed, or epath knows no such scheme. Local paths: no I/O.

  `flag` names the setting the path came from (`--workdir`, `config.predict.output`).
  """
  if not path or not is_remote(path):
    return
  from etils import epath  # pylint: disable=import-outside-toplevel
  scheme = str(path).split("://", 1)[0]
  try:
    remote = epath.Path(path)
  except KeyError:  # file://, http://, ...: schemes epath has no path class for
    known = ", ".join(f"{s}://" for s in FILESYSTEM_PACKAGES)
    raise RemoteFilesystemError(f"{flag}={path}: flaxdoc reaches remote paths through "
                                f"etils.epath, which knows {known}; or give a local path"
                                ) from None
  try:
    remote.exists()  # epath makes the filesystem on the first operation: the cheapest one
  except ImportError as e:
    package = FILESYSTEM_PACKAGES.get(scheme)
    fix = f"pip install {package}" if package else str(e).strip().splitlines()[0]
    raise RemoteFilesystemError(f"{flag}={path}: {scheme}:// paths need {package or 'fsspec'} "
                                f"(etils.epath reaches them through fsspec): {fix}") from None


def write_through_local(dest, write: Callable[[str], T]) -> T:
  """`write(path)` for writers that need a real file path (Pillow's PNGs, safetensors): called
  with `dest` itself when it is local, else with a local temporary file that is then copied to
  `dest` through epath. Returns what `write` returns."""
  if not is_remote(dest):
    return write(os.fspath(dest))
  from etils import epath  # pylint: disable=import-outside-toplevel
  with tempfile.TemporaryDirectory(prefix="flaxdoc-") as tmp:
    local = os.path.join(tmp, epath.Path(dest).name)
    result = write(local)
    with open(local, "rb") as f:
      epath.Path(dest).write_bytes(f.read())
  return result
