"""A `gs://` workdir for eval, predict and export, on a fake bucket (no network, no gcsfs).

`fake_gcs(store)` redirects every `etils.epath` operation on `gs://bucket/...` to the local
folder `store/...` (etils' own `mock_epath` hook), so flaxdoc's code sees and passes around
real `gs://` strings. What this exercises: every file flaxdoc itself reads or writes in the
workdir -- `config.json` (read by `setup.with_the_runs_record` and the exporter),
`eval_<split>.json`, `predictions.jsonl`, the PNG pictures (drawn to a local temporary
file, then copied), the export's `model.safetensors` and `config.json`, `metrics.jsonl`
(read), a damaged step moved aside -- going through epath, giving the same files as a
local workdir, and no `os.path`/`open` on a `gs://` string (that would create a folder
named `gs:` in the current directory, which each test checks is still empty).

What it does not: Orbax reads the checkpoint's arrays through TensorStore, which cannot be
faked, so `checkpoint.make_manager` gets the local folder behind the fake bucket (the test
checks it was asked for the `gs://` one); every restore is real and must give the first
one's parameters, but then uses its compiled predict function (one XLA compile, not six);
gcsfs itself (object-store semantics such as folders that exist only once a file is under
them, credentials, retries); a multi-host run (that the other processes write nothing is
checked with a process index of 1 in this one process).
"""

import contextlib
import importlib.util
import os
import shutil
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from etils.epath import testing as epath_testing

from flaxdoc.export import exporter
from flaxdoc.train import checkpoint as ckpt_lib
from flaxdoc.train import checkpoint_recovery as recovery
from flaxdoc.train import inference, metrics_writer, remote

sys.path.insert(0, os.path.dirname(__file__))
from tiny import tiny_config  # pylint: disable=import-error,wrong-import-position

BUCKET = "gs://bucket"


@contextlib.contextmanager
def fake_gcs(store: Path):
  """epath on `gs://bucket/<rest>` acts on `store/<rest>`; other paths are left alone."""
  def local(path):
    text = os.fspath(path)
    if text == BUCKET or text.startswith(BUCKET + "/"):
      return str(store) + text[len(BUCKET):]
    return text

  def to_remote(path):
    text = os.fspath(path)
    return BUCKET + text[len(str(store)):] if text.startswith(str(store)) else text

  def redirect(original, path, *args, **kwargs):
    # rename, replace and copy take a second path
    args = [local(a) if isinstance(a, (str, os.PathLike)) else a for a in args]
    return original(local(path), *args, **kwargs)

  def glob(original, pattern):
    return [to_remote(p) for p in original(local(pattern))]

  def walk(original, top, **kwargs):
    for root, dirs, files in original(local(top), **kwargs):
      yield to_remote(root), dirs, files

  ops = ("copy", "exists", "isdir", "listdir", "makedirs", "mkdir", "open", "remove", "rename",
         "replace", "rmtree", "stat")
  with epath_testing.mock_epath(glob=glob, walk=walk, **{op: redirect for op in ops}):
    yield


@pytest.fixture
def cwd(tmp_path, monkeypatch):
  """An empty current directory: `os.makedirs("gs://b/run")` would make `gs:/b/run` here."""
  folder = tmp_path / "cwd"
  folder.mkdir()
  monkeypatch.chdir(folder)
  yield folder
  assert not list(folder.iterdir()), "a gs:// path was used as a local one"


@pytest.fixture
def runs(trained, tmp_path, monkeypatch):
  """(local root, bucket store): the trained run copied to `local/run` and `store/run`."""
  roots = tmp_path / "local", tmp_path / "store"
  for root in roots:
    for name in ("checkpoints", "config.json", "metrics.jsonl"):
      src = Path(trained[0]) / name
      (shutil.copytree if src.is_dir() else shutil.copy)(src, root / "run" / name)
  asked = []
  make_manager = ckpt_lib.make_manager

  def manager_on_the_local_folder(workdir, **kwargs):
    # The seam: Orbax (TensorStore) gets the folder behind the fake bucket.
    asked.append(str(workdir))
    return make_manager(str(workdir).replace(BUCKET, str(roots[1]), 1), **kwargs)
  monkeypatch.setattr(ckpt_lib, "make_manager", manager_on_the_local_folder)
  # One XLA compile in all, not six (6 s each on a CPU): see the module docstring.
  restore = inference.restore_for_inference
  first = []

  def restore_sharing_the_compile(config, workdir):
    env, params, predict_fn = restore(config, workdir)
    if not first:
      first.extend((params, predict_fn))
    jax.tree.map(np.testing.assert_array_equal, params, first[0])
    return env, params, first[1]
  monkeypatch.setattr(inference, "restore_for_inference", restore_sharing_the_compile)
  yield roots
  assert all(w == f"{BUCKET}/run" or not w.startswith("gs:") for w in asked), asked
  assert f"{BUCKET}/run" in asked


class _AnotherProcess:
  """`jax` as process 1 of a multi-host run sees it (`process_index`); the rest is jax's."""

  def __getattr__(self, name):
    return getattr(jax, name)

  def process_index(self, *args):
    del args
    return 1


def _tree(root: Path) -> dict[str, bytes]:
  return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
          if p.is_file()}


def test_eval_predict_export_on_a_gs_workdir_write_what_a_local_one_does(runs, cwd, capsys):
  local_root, store = runs
  before = _tree(store)
  assert before == _tree(local_root)
  predict = tiny_config(mode="predict")
  predict.predict.draw = True  # pictures into WORKDIR/predictions/
  for root in (str(local_root), BUCKET):
    with fake_gcs(store):
      workdir = f"{root}/run"
      scores = inference.run_eval(tiny_config(mode="eval"), workdir)
      out = inference.run_predict(predict, workdir)
      summary = exporter.export_workdir(workdir, f"{root}/export")
      rows = metrics_writer.read_metrics(workdir)
    assert out == f"{workdir}/predictions.jsonl" and summary["out"] == f"{root}/export"
    assert summary["step"] == 6 and [r["step"] for r in rows if "eval/f1" in r] == [3, 6]
    assert 0.0 <= scores["f1"] <= 1.0
  assert f"to {BUCKET}/run/predictions.jsonl" in capsys.readouterr().out
  after = _tree(store)
  assert after == _tree(local_root)  # the same files, byte for byte
  written = sorted(set(after) - set(before))
  assert "run/eval_dev.json" in written and "run/predictions.jsonl" in written
  assert written[:2] == ["export/config.json", "export/model.safetensors"]
  assert any(w.startswith("run/predictions/") and w.endswith(".png") for w in written)
  # The other processes of a multi-host run write nothing (process 0 writes for all: the
  # files are shared, on a bucket or on the filesystem SLURM's processes share).
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(inference, "jax", _AnotherProcess())  # inference's own jax calls only
    for name in ("eval_dev.json", "predictions.jsonl", "predictions"):
      shutil.rmtree(local_root / "run" / name) if name == "predictions" else (
          local_root / "run" / name).unlink()
    inference.run_eval(tiny_config(mode="eval"), f"{local_root}/run")
    inference.run_predict(predict, f"{local_root}/run")
  assert _tree(local_root / "run") == {k[4:]: v for k, v in before.items()}


def test_an_exports_tokenizer_files_go_to_a_gs_folder_through_epath(tmp_path, cwd):
  """The export copies its tokenizer beside the weights: to gs:// as to a local folder."""
  from flaxdoc.export import tokenizer_files  # pylint: disable=import-outside-toplevel
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\ntotal\n", encoding="utf-8")
  store = tmp_path / "store"
  with fake_gcs(store):
    spec = tokenizer_files.copy_tokenizer(f"wordpiece:{vocab}", f"{BUCKET}/export")
  assert spec == "wordpiece:tokenizer/vocab.txt"
  assert (store / "export" / "tokenizer" / "vocab.txt").read_bytes() == vocab.read_bytes()
  tok = tokenizer_files.load_export_tokenizer(store / "export", {"tokenizer": spec,
                                                                 "format_version": 2})
  assert tok.encode_word("Total") == [5]


def test_a_damaged_step_on_a_gs_workdir_is_moved_aside_through_epath(tmp_path, cwd, caplog):
  store = tmp_path / "store"
  for step in ("9", "9b"):  # the second 9 finds the first one's place taken
    step_dir = store / "run" / "checkpoints" / "9"
    (step_dir / "state").mkdir(parents=True)
    (step_dir / "state" / "array").write_bytes(step.encode() * 100)
    (step_dir / "commit_success.txt").write_text(step)
    with fake_gcs(store):
      dest = recovery.move_aside(f"{BUCKET}/run/checkpoints", 9, "truncated")
    assert dest.startswith(f"{BUCKET}/run/damaged_checkpoints/9") and not step_dir.exists()
    moved = store / dest[len(BUCKET) + 1:]
    assert (moved / "state" / "array").read_bytes() == step.encode() * 100
  assert len(list((store / "run" / "damaged_checkpoints").iterdir())) == 2
  # The log says how to remove it, with the bucket's own tool.
  assert f"remove it with `gcloud storage rm -r {dest}`" in caplog.text


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is not None, reason="gcsfs is installed")
def test_a_gs_path_without_gcsfs_is_one_line_naming_the_package(tmp_path, cwd, capsys):
  from flaxdoc import main
  from flaxdoc.export.__main__ import main as export_main
  assert issubclass(remote.RemoteFilesystemError, main.input_errors())  # printed as one line
  want = "--workdir=gs://bucket/run: gs:// paths need gcsfs"
  for run in (inference.run_eval, inference.run_predict):
    with pytest.raises(remote.RemoteFilesystemError, match=want) as info:
      run(tiny_config(mode=run.__name__[4:]), f"{BUCKET}/run")
    assert str(info.value).endswith("pip install gcsfs") and "\n" not in str(info.value)
  # A remote output of a local run: named before the restore (this workdir has no checkpoint).
  config = tiny_config(mode="predict")
  config.predict.output = f"{BUCKET}/out.jsonl"
  with pytest.raises(remote.RemoteFilesystemError, match="config.predict.output=gs://bucket"):
    inference.run_predict(config, str(tmp_path / "none"))
  assert export_main(["--workdir", f"{BUCKET}/run", "--out", str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.strip().endswith("pip install gcsfs"), err
  assert not (tmp_path / "o").exists()


def test_a_scheme_epath_does_not_know_is_a_config_error(cwd):
  with pytest.raises(remote.RemoteFilesystemError, match=r"--workdir=file:///x/run: .*gs://"):
    remote.check_filesystem("file:///x/run", "--workdir")
  remote.check_filesystem("relative/run", "--workdir")  # local: nothing checked, nothing made


def test_tensorboard_on_gs_without_its_package_is_a_warning_not_silence(caplog, monkeypatch):
  """tensorboardX writes gs:// through google-cloud-storage; without it, a warning names the
  package (it used to be dropped silently) and metrics.jsonl is still written."""
  monkeypatch.setattr(metrics_writer, "_installed", lambda module: False)
  with caplog.at_level("WARNING", "flaxdoc.train.metrics_writer"):
    writer = metrics_writer._summary_writer(  # pylint: disable=protected-access
        "gs://bucket/run/tensorboard")
  assert writer is None
  assert "pip install google-cloud-storage" in caplog.text
  assert "gs://bucket/run/tensorboard" in caplog.text


def test_remote_metrics_are_uploaded_in_batches_and_on_flush(tmp_path, cwd, monkeypatch):
  """gs:// cannot append, so metrics.jsonl is rewritten whole: at most every upload_every_s
  seconds and on flush/close (rewriting it on every write made a long run's uploads quadratic)."""
  store = tmp_path / "store"
  store.mkdir()
  clock = [100.0]
  monkeypatch.setattr(metrics_writer.time, "monotonic", lambda: clock[0])
  with fake_gcs(store):
    writer = metrics_writer.MetricsWriter(f"{BUCKET}/run", tensorboard=False, upload_every_s=60)
    steps = lambda: [r["step"] for r in metrics_writer.read_metrics(f"{BUCKET}/run")]  # noqa: E731
    for step in (1, 2, 3):
      writer.write(step, {"train/loss": 1.0 / step})
    assert steps() == []  # nothing uploaded within the interval
    clock[0] += 61
    writer.write(4, {"train/loss": 0.2})
    assert steps() == [1, 2, 3, 4]  # the interval passed: everything so far, once
    writer.write(5, {"eval/f1": 0.5})
    assert steps() == [1, 2, 3, 4]
    writer.flush()  # the trainer flushes with every checkpoint
    assert steps() == [1, 2, 3, 4, 5]
    writer.write(6, {"train/loss": 0.1})
    writer.close()
    assert steps() == [1, 2, 3, 4, 5, 6]
    # A resumed run reads the stored rows back and goes on after them.
    again = metrics_writer.MetricsWriter(f"{BUCKET}/run", tensorboard=False, upload_every_s=0)
    again.write(7, {"train/loss": 0.05})
    assert steps() == [1, 2, 3, 4, 5, 6, 7]  # upload_every_s=0: every write
  assert (store / "run" / "metrics.jsonl").exists() and not (cwd / "gs:").exists()
