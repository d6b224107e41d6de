"""End-to-end smoke tests of every mode on tiny shapes, determinism and resume after SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from flaxdoc.data import datasets
from flaxdoc.train import checkpoint as ckpt_lib, inference, metrics_writer, setup, trainer

sys.path.insert(0, os.path.dirname(__file__))
from tiny import ROOT, override_flags, tiny_config  # pylint: disable=import-error


def _losses(workdir):
  return [r["train/loss"] for r in metrics_writer.read_metrics(workdir) if "train/loss" in r]


def test_train_writes_metrics_checkpoints_and_tensorboard(trained):
  workdir, result = trained
  rows = metrics_writer.read_metrics(workdir)
  steps = [r["step"] for r in rows if "train/loss" in r]
  assert steps == [1, 2, 3, 4, 5, 6]
  evals = [r for r in rows if "eval/f1" in r]
  assert [r["step"] for r in evals] == [3, 6]
  assert all(0.0 <= r["eval/f1"] <= 1.0 and {"eval/precision", "eval/recall"} <= set(r) for r in evals)
  assert all(np.isfinite(r["train/loss"]) and r["train/tokens_per_s"] > 0 for r in rows if "train/loss" in r)
  assert result["step"] == 6
  mngr = ckpt_lib.make_manager(workdir)
  assert mngr.latest_step() == 6
  assert any(f.startswith("events") for f in os.listdir(os.path.join(workdir, "tensorboard")))


@pytest.mark.slow  # the default run has it through resumed == uninterrupted (checkpoint tests)
def test_same_seed_same_loss_curve(trained, tmp_path):
  workdir, _ = trained
  trainer.train_and_evaluate(tiny_config(), str(tmp_path))
  assert _losses(str(tmp_path)) == _losses(workdir)


def test_eval_mode_reports_seqeval(trained, capsys):
  workdir, _ = trained
  scores = inference.run_eval(tiny_config(mode="eval"), workdir)
  assert 0.0 <= scores["f1"] <= 1.0 and "per_label" in scores
  assert "micro avg" in capsys.readouterr().out
  assert os.path.exists(os.path.join(workdir, "eval_dev.json"))


def test_predict_mode_writes_entities_with_words_boxes_page_score(trained, tmp_path):
  workdir, _ = trained
  from flaxdoc.data import jsonl, synthetic
  docs = synthetic.generate(2, seed=5)
  src = tmp_path / "in.jsonl"
  jsonl.write_jsonl(src, [d.replace(entities=None) for d in docs])
  out = tmp_path / "pred.jsonl"
  config = tiny_config(mode="predict")
  config.predict.input = str(src)
  config.predict.output = str(out)
  config.predict.draw = True
  config.predict.draw_dir = str(tmp_path / "png")
  inference.run_predict(config, workdir)
  rows = [json.loads(l) for l in out.read_text().splitlines()]
  assert [r["id"] for r in rows] == [d.id for d in docs]
  for r in rows:
    for e in r["entities"]:
      assert {"label", "text", "words", "word_boxes", "box", "page", "score"} <= set(e)
      assert len(e["words"]) == len(e["word_boxes"]) and 0.0 <= e["score"] <= 1.0
  assert sorted(os.listdir(tmp_path / "png")) == sorted(f"{d.id}_p0.png" for d in docs)


def test_export_cli_on_the_trained_workdir_matches_flax(trained, tmp_path):
  """`python -m flaxdoc.export` on a real run; the torch model predicts what the checkpoint does."""
  torch = pytest.importorskip("torch")
  from flaxdoc.data.features import batch_features
  from flaxdoc.export.torch import load_exported
  workdir, _ = trained
  out = tmp_path / "export"
  proc = subprocess.run([sys.executable, "-m", "flaxdoc.export", "--workdir", workdir,
                         "--out", str(out), "--json"], cwd=ROOT, capture_output=True, text=True,
                        timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
  env, params, predict_fn = inference.restore_for_inference(tiny_config(), workdir)
  assert summary["parameters"] == sum(int(np.size(x)) for x in jax.tree.leaves(params))
  exported = json.loads((out / "config.json").read_text())
  assert summary["step"] == exported["checkpoint_step"] == env.restored_step == 6
  assert exported["model"]["gcn_message_hidden"] == "input"
  assert len(exported["tag_names"]) == env.feature_config.num_tags
  tmodel = load_exported(out)
  windows = env.featurized("dev").windows[:4]
  batch = batch_features(windows)
  want = predict_fn(batch)  # Flax log-probabilities from the checkpoint
  with torch.no_grad():
    logits = tmodel({k: torch.as_tensor(np.asarray(v)) for k, v in batch.items()})
    got = torch.log_softmax(logits, dim=-1).numpy()
  mask = np.asarray(batch["attention_mask"], bool)
  assert mask.sum() > 0
  np.testing.assert_allclose(got[mask], want[mask], atol=1e-4, rtol=0)
  # A missing file is a clear error from the CLI, not a traceback.
  bad = subprocess.run([sys.executable, "-m", "flaxdoc.export", "--workdir", str(tmp_path / "none"),
                        "--out", str(tmp_path / "o2")], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, check=False)
  assert bad.returncode == 2 and "flaxdoc.export:" in bad.stderr


def test_pretrain_mode_runs_mlm(tmp_path):
  config = tiny_config(mode="pretrain")
  config.total_steps = 2
  result = trainer.train_and_evaluate(config, str(tmp_path))
  rows = metrics_writer.read_metrics(str(tmp_path))
  assert result["step"] == 2 and all("train/mlm_loss" in r for r in rows if "train/loss" in r)
  # The MLM head scored ceil(1.5 * 15% * 48) = 11 positions per window, and no target
  # was left out (the masking is capped at the same number).
  assert all(r["train/mlm_dropped"] == 0 for r in rows if "train/loss" in r)


def test_mlm_max_predictions_resolves_from_the_config():
  config = tiny_config(mode="pretrain")
  assert setup.mlm_max_predictions(config) == 11  # ceil(1.5 * 0.15 * 48)
  assert setup.Experiment.create(config).model.mlm_max_predictions == 11
  config.data.mlm_rate = 0.3
  assert setup.mlm_max_predictions(config) == 22  # follows the rate
  config.data.mlm_max_predictions = 0
  assert setup.mlm_max_predictions(config) is None  # every position
  config.data.mlm_max_predictions = 500
  assert setup.mlm_max_predictions(config) == 48  # never more than the window
  config.data.mlm_max_predictions = -3
  with pytest.raises(ValueError, match="mlm_max_predictions"):
    setup.mlm_max_predictions(config)
  assert setup.Experiment.create(tiny_config()).model.mlm_max_predictions is None  # fine-tuning


def test_non_finite_loss_stops_with_message_and_keeps_last_checkpoint(tmp_path):
  config = tiny_config()
  config.optim.lr = 1e30  # diverges
  config.optim.clip_norm = 0.0
  config.checkpoint_every = 1
  config.total_steps = 30
  with pytest.raises(trainer.NonFiniteLossError, match="non-finite training loss") as info:
    trainer.train_and_evaluate(config, str(tmp_path))
  last = ckpt_lib.make_manager(str(tmp_path)).latest_step()
  assert f"step {last}" in str(info.value)


def _run_main(workdir, *extra, wait=True, env_extra=None):
  cmd = [sys.executable, "-m", "flaxdoc.main", "--config=configs/formnet_a2.py:local",
         f"--workdir={workdir}", *override_flags(), *extra]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", **(env_extra or {}))
  if wait:
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)


def _final_params(workdir):
  mngr = ckpt_lib.make_manager(workdir)
  step = mngr.latest_step()
  import orbax.checkpoint as ocp
  restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  return step, restored.state["params"]


def _wait_for_pause(workdir, proc, deadline):
  """The step folder an async save is paused in, just before its commit marker (test hook)."""
  from flaxdoc.train import checkpoint_recovery  # pylint: disable=import-outside-toplevel
  marker = workdir / checkpoint_recovery.PAUSE_MARKER
  while time.time() < deadline and proc.poll() is None and not marker.exists():
    time.sleep(0.2)
  assert marker.exists(), "the run never reached the paused commit"
  time.sleep(1.0)  # well inside the pause: the arrays are written, the commit is not
  return marker.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("where", ["after_checkpoint", "inside_async_save"])
def test_sigkill_then_resume_equals_uninterrupted(tmp_path, where):
  """Killed with SIGKILL at a random point after a checkpoint, or inside an async save just
  before its commit marker is written, then resumed: identical parameters."""
  steps = ["--config.total_steps=12", "--config.checkpoint_every=2", "--config.eval_every=100"]
  ref = _run_main(tmp_path / "ref", *steps)
  assert ref.returncode == 0, ref.stderr[-3000:]
  killed_dir = tmp_path / "killed"
  rng = np.random.default_rng(int(time.time()))
  deadline = time.time() + 600
  if where == "inside_async_save":
    from flaxdoc.train import checkpoint_recovery  # pylint: disable=import-outside-toplevel
    steps.append("--config.async_checkpoints=True")
    target = int(rng.choice([4, 6, 8, 10]))  # an older committed step exists to resume from
    proc = _run_main(killed_dir, *steps, wait=False,
                     env_extra={checkpoint_recovery.PAUSE_ENV: f"300:{target}"})
    paused = _wait_for_pause(killed_dir, proc, deadline)
    assert paused.endswith(f"checkpoints/{target}")
    assert not (killed_dir / "checkpoints" / str(target)).exists()  # not committed
  else:
    proc = _run_main(killed_dir, *steps, wait=False)
    target = int(rng.integers(2, 10))
    while time.time() < deadline:
      mngr = ckpt_lib.make_manager(str(killed_dir)) if (killed_dir / "checkpoints").exists() else None
      if mngr is not None and (mngr.latest_step() or 0) >= target:
        break
      if proc.poll() is not None:
        break
      time.sleep(0.2)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  if where == "inside_async_save":
    assert ckpt_lib.make_manager(str(killed_dir)).latest_step() == target - 2
  resumed = _run_main(killed_dir, *steps)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  (s1, p1), (s2, p2) = _final_params(str(tmp_path / "ref")), _final_params(str(killed_dir))
  assert s1 == s2 == 12
  jax.tree.map(np.testing.assert_array_equal, p1, p2)


@pytest.mark.slow
def test_finetune_from_pretraining_checkpoint(tmp_path, caplog):
  """init_from: the encoder comes from the pre-training run, the tagging head is new."""
  pre = tiny_config(mode="pretrain")
  pre.total_steps = 2
  trainer.train_and_evaluate(pre, str(tmp_path / "pre"))
  ft = tiny_config()
  ft.total_steps = 1
  ft.init_from = str(tmp_path / "pre")
  import logging
  with caplog.at_level(logging.INFO):
    trainer.train_and_evaluate(ft, str(tmp_path / "ft"))
  line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("init_from"))
  assert "tagging_head" in line and " 0 tensors loaded" not in line, line


def _jsonl_dataset(path, label_sets, bad_line=False):
  """One small document per label set (None: no label_set), each with one entity."""
  lines = []
  for i, labels in enumerate(label_sets):
    doc = {"format": "flaxdoc.document/1", "id": f"doc-{i}", "words": ["Key", "9.00"],
           "boxes": [[10, 10, 40, 20], [50, 10, 90, 20]], "page_sizes": [[100, 100]],
           "entities": [{"label": (labels or ["total"])[0], "words": [1]}]}
    if labels is not None:
      doc["label_set"] = labels
    lines.append(json.dumps(doc))
  if bad_line:
    lines.insert(1, '{"format": "flaxdoc.document/1", "id": ')
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return f"jsonl:{path}"


def test_jsonl_labels_come_from_the_documents_and_are_saved_with_the_run(tmp_path):
  name = _jsonl_dataset(tmp_path / "docs.jsonl", [["total", "date"], None,
                                                  ["date", "company"], ["total"]])
  # Merged in the order first seen: the tag ids follow it.
  assert setup.dataset_labels(name) == ("total", "date", "company")
  config = tiny_config(**{"data.dataset": name, "data.dataset_options": {}})
  env = setup.Experiment.create(config)
  assert tuple(env.config.data.labels) == ("total", "date", "company")
  assert env.feature_config.labels == ("total", "date", "company")
  assert tuple(config.data.labels) == ()  # the caller's config is left as it was
  trainer.save_config(env.config, str(tmp_path))
  saved = json.loads((tmp_path / "config.json").read_text())
  assert saved["data"]["labels"] == ["total", "date", "company"]
  # Given labels win; no label_set anywhere is an error that names the flag.
  given = tiny_config(**{"data.dataset": name, "data.dataset_options": {},
                         "data.labels": ("date", "total", "company")})
  assert setup.Experiment.create(given).feature_config.labels == ("date", "total", "company")
  bare = _jsonl_dataset(tmp_path / "bare.jsonl", [None, None])
  with pytest.raises(setup.ConfigError, match=r"none of its 2 train documents has a "
                                              r"label_set; set config.data.labels"):
    setup.dataset_labels(bare)
  # A misspelt dataset is named as such, with the names there are.
  with pytest.raises(setup.ConfigError, match=r"config.data.dataset='funds': unknown dataset; "
                                              r"expected one of \['synthetic', 'cord', 'funsd'"):
    setup.dataset_labels("funds")


def test_a_jsonl_train_file_is_read_once_at_setup(tmp_path, monkeypatch):
  """The labels' read of the train file at create serves documents("train") and its dev."""
  from flaxdoc.data import jsonl  # pylint: disable=import-outside-toplevel
  path = tmp_path / "docs.jsonl"
  name = _jsonl_dataset(path, [["total", "date"]] * 3 + [["date"]] * 5)
  want = {s: datasets.load_dataset(name, s) for s in ("train", "dev")}  # each read on its own
  reads, read_jsonl = [], jsonl.read_jsonl
  monkeypatch.setattr(jsonl, "read_jsonl", lambda p, **o: reads.append(p) or read_jsonl(p, **o))
  env = setup.Experiment.create(tiny_config(**{"data.dataset": name,
                                               "data.dataset_options": {}}))
  got = {s: env.documents(s) for s in ("train", "dev")}
  assert reads == [path]
  assert env.feature_config.labels == ("total", "date")
  for s, (docs, _) in want.items():  # the same documents as reads of their own
    assert [(d.id, d.words) for d in got[s]] == [(d.id, d.words) for d in docs], s
  assert len(got["train"]) == 7 and len(got["dev"]) == 1


def test_relative_jsonl_and_hf_paths_are_recorded_absolute(tmp_path, monkeypatch, caplog):
  """So eval, predict, export and a resume find them from any directory."""
  _jsonl_dataset(tmp_path / "docs.jsonl", [["total"]] * 3)
  monkeypatch.chdir(tmp_path)
  here = os.getcwd()
  with caplog.at_level("INFO"):
    env = setup.Experiment.create(tiny_config(**{"data.dataset": "jsonl:docs.jsonl",
                                                 "data.dataset_options": {}}))
  absolute = f"jsonl:{os.path.join(here, 'docs.jsonl')}"
  assert env.config.data.dataset == absolute and env.feature_config.labels == ("total",)
  assert f"config.data.dataset=jsonl:docs.jsonl -> {absolute}" in caplog.text
  trainer.save_config(env.config, "run")
  assert json.loads((tmp_path / "run" / "config.json").read_text())["data"]["dataset"] == absolute
  config = tiny_config(init_from="hf:models/minilm")
  assert setup.absolute_paths(config).init_from == f"hf:{os.path.join(here, 'models/minilm')}"
  assert config.init_from == "hf:models/minilm"  # the caller's config is left as it was
  for given in ("wordpiece:vocab/vocab.txt", "sentencepiece:sp.model", "bpe:bpe", "hf:m"):
    kind, _, path = given.partition(":")
    want = f"{kind}:{os.path.join(here, path)}"
    assert setup.absolute_paths(tiny_config(**{"data.tokenizer": given})).data.tokenizer == want
  for field, given in (("init_from", "hf:/models/minilm"), ("init_from", "/tmp/pretrain_run"),
                       ("init_from", ""), ("data.dataset", "jsonl:/data/{split}.jsonl"),
                       ("data.tokenizer", "default"), ("data.tokenizer", "wordpiece:/v/vocab.txt"),
                       ("data.tokenizer", "sentencepiece:gs://b/sp.model")):
    config = tiny_config(**{field: given})
    assert setup.absolute_paths(config) is config, given
  # A record written before (a relative hf: path) is taken as it is and resolved here.
  (tmp_path / "run" / "config.json").write_text(json.dumps({"init_from": "hf:models/minilm"}))
  taken = setup.with_the_runs_record(tiny_config(), "run")
  assert taken.init_from == "hf:models/minilm"
  assert setup.absolute_paths(taken).init_from == f"hf:{os.path.join(here, 'models/minilm')}"


def test_reader_options_leave_the_generators_out_and_name_an_unknown_one(tmp_path, caplog):
  name = _jsonl_dataset(tmp_path / "docs.jsonl", [["total"]] * 3)
  # What `:local` sets for the synthetic default, then the dataset switched by flag.
  options = {"num_train": 2000, "num_dev": 60, "on_error": "skip"}
  with caplog.at_level("INFO"):
    assert setup.reader_options(name, options) == {"on_error": "skip"}
  assert "num_train, num_dev are another dataset's: not used" in caplog.text
  caplog.clear()  # read again (the next split): said once, not once per split
  with caplog.at_level("INFO"):
    assert setup.reader_options(name, options) == {"on_error": "skip"}
  assert "another dataset's" not in caplog.text
  assert setup.reader_options("synthetic", options) == options
  # `:dataset=funsd` sets FUNSD's OCR switches off: left out for other datasets while off.
  funsd = {"ocr": "", "ocr_cache_dir": "", "on_error": "skip"}
  assert setup.reader_options("cord", funsd) == {"on_error": "skip"}
  assert setup.reader_options("funsd", funsd) == funsd
  assert setup.reader_options("cord", dict(funsd, ocr="tesseract"))["ocr"] == "tesseract"
  # A dev_fraction option does not clash with reading every train document's labels.
  assert setup.dataset_labels(name, {"dev_fraction": 0.5}) == ("total",)
  docs, _ = setup.load_documents(name, "train", dev_fraction=0.0,
                                 **setup.reader_options(name, options))
  assert len(docs) == 3
  # Checked against the reader's signature before it runs, naming what it does take.
  with pytest.raises(setup.ConfigError, match=r"config.data.dataset_options: the reader of "
                                              r"dataset 'jsonl:.*' takes no option 'box_polcy'; "
                                              r"its options are dev_fraction, seed, on_error, "
                                              r"box_policy, text_policy$"):
    setup.load_documents(name, "train", box_polcy="clip")
  # The generator's **overrides are SyntheticConfig's fields: checked like the others.
  assert {"num_train", "ocr_noise", "link_keys"} <= set(datasets.option_names("synthetic"))
  with pytest.raises(setup.ConfigError, match=r"dataset 'synthetic' takes no option 'ocr'"):
    setup.load_documents("synthetic", "train", ocr="tesseract")


def test_bad_input_is_one_line_naming_the_file(tmp_path):
  name = _jsonl_dataset(tmp_path / "docs.jsonl", [["total"], ["total"]], bad_line=True)
  cmd = [sys.executable, "-m", "flaxdoc.main", "--config=configs/formnet_a2.py:local",
         f"--workdir={tmp_path / 'w'}", f"--config.data.dataset={name}"]
  out = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"),
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
  errors = [l for l in out.stderr.splitlines() if l.startswith("flaxdoc: error:")]
  assert len(errors) == 1 and f"{tmp_path / 'docs.jsonl'}:2" in errors[0], out.stderr[-3000:]
  assert "invalid JSON" in errors[0]


@pytest.mark.parametrize("flag, message", [
    # data/ raises a bare ValueError for it (unaware of flags): setup checks it first.
    ("--config.data.dev_fraction=1.5", "config.data.dev_fraction=1.5: must be in [0, 1)"),
    # train/optimizer, made before the data is featurised.
    ("--config.optim.schedule=cosin", "config.optim.schedule='cosin': must be one of"),
])
def test_a_setting_that_cannot_work_is_one_line_through_main(tmp_path, flag, message):
  out = _run_main(tmp_path / "w", flag)
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
  errors = [l for l in out.stderr.splitlines() if l.startswith("flaxdoc: error:")]
  assert len(errors) == 1 and message in errors[0], out.stderr[-3000:]
  assert not (tmp_path / "w" / "checkpoints").exists()


def test_settings_the_lower_layers_reject_are_config_errors_naming_the_flag():
  """Each is a ConfigError (one line in flaxdoc.main) raised before any compilation."""
  from flaxdoc.train import optimizer, sharding  # pylint: disable=import-outside-toplevel
  cases = {
      "data.dataset_options": ({"dev_fraction": -0.1},
                               "config.data.dataset_options.dev_fraction=-0.1: must be in"),
      "data.eval_split": ("valid", "config.data.eval_split='valid': must be one of"),
      "data.mlm_rate": (2.0, "config.data.mlm_rate=2.0: must be in [0, 1]"),
      "data.max_len": (2, "config.data: FeatureConfig.max_len=2 leaves no room"),
      "data.tokenizer": ("wordpiece", "config.data.tokenizer='wordpiece': tokenizer spec"),
      "model.name": ("formnit", "config.model.name='formnit': unknown model"),
      "model.num_heads": (5, "config.model.num_heads (formnet): width 32 is not divisible"),
  }
  for key, (value, message) in cases.items():
    with pytest.raises(setup.ConfigError) as info:
      setup.Experiment.create(tiny_config(**{key: value}))
    assert str(info.value).startswith(message), (key, str(info.value))
  with pytest.raises(setup.ConfigError, match=r"config.data.mlm_max_predictions=-3: must be"):
    setup.mlm_max_predictions(tiny_config(mode="pretrain", **{"data.mlm_max_predictions": -3}))
  with pytest.raises(setup.ConfigError, match=r"config.mesh.shape=\{'data': 3\}: mesh"):
    sharding.mesh_shape({"data": 3}, 1)
  with pytest.raises(setup.ConfigError, match=r"config.optim.name='sgd': unknown optimiser"):
    optimizer.make_optimizer(tiny_config(**{"optim.name": "sgd", "optim.total_steps": 6}).optim)


def test_eval_or_predict_without_a_checkpoint_is_a_checkpoint_error_and_creates_nothing(tmp_path):
  from flaxdoc.train.checkpoint_recovery import CheckpointError
  workdir = tmp_path / "typo"
  no_step = r"no finished checkpoint step in .*{}/checkpoints: nothing to restore \(train first"
  for run in (inference.run_eval, inference.run_predict):
    with pytest.raises(CheckpointError, match=no_step.format("typo")):
      run(tiny_config(mode=run.__name__[4:]), str(workdir))
  assert not workdir.exists()
  # An empty checkpoints folder, or one with only a save that never finished: the same error.
  for name, inside in (("empty", ()), ("unfinished", ("3.orbax-checkpoint-tmp-1",))):
    folder = tmp_path / name / "checkpoints"
    folder.mkdir(parents=True)
    for sub in inside:
      (folder / sub).mkdir()
    with pytest.raises(CheckpointError, match=no_step.format(name)):
      inference.run_eval(tiny_config(mode="eval"), str(tmp_path / name))
    assert sorted(p.name for p in folder.iterdir()) == list(inside)


def test_a_resume_that_does_not_fit_leaves_the_runs_config_json(trained, tmp_path):
  import shutil
  from flaxdoc.train.checkpoint_recovery import CheckpointMismatchError
  workdir, _ = trained
  copy = tmp_path / "run"
  shutil.copytree(workdir, copy)
  before = (copy / "config.json").read_text()
  with pytest.raises(CheckpointMismatchError):
    trainer.train_and_evaluate(tiny_config(**{"model.width": 48, "total_steps": 9}), str(copy))
  assert (copy / "config.json").read_text() == before


def test_an_unknown_ocr_engine_is_named_before_any_work(tmp_path):
  config = tiny_config(mode="predict")
  config.predict.ocr = "easyocr"
  config.predict.input = str(tmp_path / "scan.pdf")
  # Checked before the restore (the workdir has no checkpoint: that error would come next).
  with pytest.raises(setup.ConfigError, match=r"config.predict.ocr='easyocr': unknown OCR engine"):
    inference.run_predict(config, str(tmp_path / "w"))
  with pytest.raises(setup.ConfigError, match=r"dataset_options.ocr='easyocr'"):
    setup.reader_options("funsd", {"ocr": "easyocr"})
  assert setup.reader_options("funsd", {"ocr": ""}) == {"ocr": ""}
