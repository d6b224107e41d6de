"""Metrics to `WORKDIR/metrics.jsonl` and TensorBoard event files, plus a progress bar.

`metrics.jsonl` holds one JSON object per log event, e.g.
`{"step": 100, "time": 12.3, "train/loss": 0.41, "train/lr": 1e-4}` or
`{"step": 500, "eval/f1": 0.93, "eval/precision": ..., "eval/recall": ...}`.
TensorBoard files are written with tensorboardX (no TensorFlow needed). Only
process 0 writes.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import sys
import time
from typing import Mapping

import jax
import numpy as np

from flaxdoc.train import remote


log = logging.getLogger(__name__)


class MetricsWriter:
  """Appends scalar metrics to JSON Lines and TensorBoard (process 0 only)."""

  def __init__(self, workdir: str, *, tensorboard: bool = True, upload_every_s: float = 60.0):
    self.active = jax.process_index() == 0
    # Object stores (gs://) cannot append: remote metrics are kept in memory and the whole
    # file is rewritten via etils.epath. Rewriting it on every write made a long run's uploads
    # quadratic in its length (a 10,000-row file re-sent 10,000 times), so it is rewritten at
    # most every `upload_every_s` seconds, and on `flush()` (the trainer flushes with every
    # checkpoint, so the stored metrics are never older than the stored weights) and `close()`.
    self.remote = remote.is_remote(workdir)
    self.path = f"{str(workdir).rstrip('/')}/metrics.jsonl"
    self.upload_every_s = upload_every_s
    self._rows: list[str] = []
    self._pending = False  # remote rows not uploaded yet
    self._uploaded_at = time.monotonic()
    self._tb = None
    self._start = time.time()
    if self.active:
      if self.remote:
        from etils import epath  # pylint: disable=import-outside-toplevel
        self._epath = epath.Path(self.path)
        self._epath.parent.mkdir(parents=True, exist_ok=True)
        if self._epath.exists():
          self._rows = self._epath.read_text().splitlines()
      else:
        os.makedirs(workdir, exist_ok=True)
      if tensorboard:
        self._tb = _summary_writer(f"{str(workdir).rstrip('/')}/tensorboard")

  def write(self, step: int, metrics: Mapping[str, float]):
    if not self.active:
      return
    row = {"step": int(step), "time": round(time.time() - self._start, 3)}
    for k, v in metrics.items():
      v = _to_python(v)
      row[k] = v
      if self._tb is not None and isinstance(v, (int, float)) and math.isfinite(v):
        self._tb.add_scalar(k, v, int(step))
    line = json.dumps(row)
    if self.remote:
      self._rows.append(line)
      self._pending = True
      if time.monotonic() - self._uploaded_at >= self.upload_every_s:
        self._upload()
      return
    with open(self.path, "a", encoding="utf-8") as f:
      f.write(line + "\n")

  def _upload(self):
    self._epath.write_text("\n".join(self._rows) + "\n")
    self._pending = False
    self._uploaded_at = time.monotonic()

  def flush(self):
    """Everything written so far reaches storage (remote rows included)."""
    if self._pending:
      self._upload()
    if self._tb is not None:
      self._tb.flush()

  def close(self):
    if self._pending:
      self._upload()
    if self._tb is not None:
      self._tb.close()
      self._tb = None


def _summary_writer(logdir: str):
  """A tensorboardX SummaryWriter, or None with a warning saying why (metrics.jsonl is
  written either way). tensorboardX writes gs:// through google-cloud-storage (which gcsfs,
  in the `tpu` extra, installs); without it the writer fails (and its half-made file
  object prints a traceback when collected), so that is checked first."""
  try:
    if logdir.startswith("gs://") and not _installed("google.cloud.storage"):
      raise ImportError("gs:// needs google-cloud-storage")
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
    return SummaryWriter(logdir=logdir)
  except ImportError as e:
    log.warning("no TensorBoard files in %s (%s: pip install %s); metrics.jsonl is written",
                logdir, e, "google-cloud-storage" if logdir.startswith("gs://") else
                "tensorboardX")
    return None


def _installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # a parent package (google.cloud) is missing
    return False


def read_metrics(workdir: str) -> list[dict]:
  """All rows of `WORKDIR/metrics.jsonl` (for tests and notebooks; gs:// too, via epath)."""
  from etils import epath  # pylint: disable=import-outside-toplevel
  path = epath.Path(workdir) / "metrics.jsonl"
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _to_python(v):
  if isinstance(v, (jax.Array, np.ndarray, np.generic)):
    v = np.asarray(v)
    return v.item() if v.size == 1 else v.tolist()
  return v


def make_progress_bar(total: int, initial: int = 0, desc: str = "train"):
  """A tqdm bar (rate, ETA) on stderr for process 0; a no-op object elsewhere."""
  if jax.process_index() != 0:
    return _NullBar()
  from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
  return tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True,
              file=sys.stderr, mininterval=1.0, smoothing=0.1)


class _NullBar:
  def update(self, n=1):
    pass

  def set_postfix(self, *a, **k):
    pass

  def close(self):
    pass
