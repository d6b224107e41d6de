"""Serving an export in PyTorch: `DocumentPipeline` rows equal `predict` mode's rows.

Each export is moved to another folder and the tokenizer files it was trained with are
deleted before the pipeline loads it: the folder must be self-contained. Runs: the
session's tiny tagging run (`conftest.trained`, default tokenizer), a tiny
tagging+linking run trained here with a SentencePiece file of its own, and (with the real
MiniLM folder) a tiny run with MiniLM's WordPiece vocabulary as `hf:` and as `wordpiece:`.
"""

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

# pylint: disable=wrong-import-position
from flaxdoc.data import jsonl, tokenizers
from flaxdoc.data.synthetic import SyntheticConfig, make_document
from flaxdoc.export import exporter
from flaxdoc.export.torch.pipeline import DocumentPipeline
from flaxdoc.train import inference, trainer

sys.path.insert(0, os.path.dirname(__file__))
from tiny import ROOT, tiny_config  # pylint: disable=import-error
# pylint: enable=wrong-import-position

MODELS = Path(os.environ.get("FLAXDOC_MODELS") or ROOT.parent / "shared" / "models")
MINILM = MODELS / "all-MiniLM-L6-v2"


def _documents(tmp_path, link_keys=False, count=3):
  """Unseen synthetic documents (no entities) in a JSON Lines file."""
  docs = [make_document(11, i, SyntheticConfig(link_keys=link_keys)).replace(entities=None,
                                                                             relations=())
          for i in range(count)]
  src = tmp_path / "in.jsonl"
  jsonl.write_jsonl(src, docs)
  return src


def _predict_rows(config, workdir, source, out):
  """`predict` mode's predictions.jsonl rows (JAX) for `source`."""
  config = config.copy_and_resolve_references()
  config.mode = "predict"
  config.predict.input = str(source)
  config.predict.output = str(out)
  inference.run_predict(config, str(workdir))
  return [json.loads(line) for line in Path(out).read_text().splitlines()]


def _copy_run(workdir, dest, tokenizer):
  """The run's checkpoints and record, its record naming another tokenizer spec."""
  shutil.copytree(Path(workdir) / "checkpoints", dest / "checkpoints")
  record = json.loads((Path(workdir) / "config.json").read_text())
  record["data"]["tokenizer"] = tokenizer
  (dest / "config.json").write_text(json.dumps(record))
  return dest


def _export_and_move(workdir, tmp_path, name):
  """Exports `workdir`, then moves the folder: only the moved copy exists afterwards."""
  out = tmp_path / f"{name}_export"
  exporter.export_workdir(str(workdir), str(out))
  moved = tmp_path / "serving" / name
  shutil.copytree(out, moved)
  shutil.rmtree(out)
  return moved


def _without_scores(entities):
  return [{k: v for k, v in e.items() if k != "score"} for e in entities]


def assert_rows_match(got, want):
  """Entities (and pairs) exactly, scores to 1e-4: torch and XLA round differently."""
  assert [r["id"] for r in got] == [r["id"] for r in want]
  for g, w in zip(got, want):
    assert set(g) == set(w)
    assert _without_scores(g["entities"]) == _without_scores(w["entities"]), g["id"]
    np.testing.assert_allclose([e["score"] for e in g["entities"]],
                               [e["score"] for e in w["entities"]], atol=1e-4, rtol=0)
    if "pairs" in w:
      assert ([(_without_scores([p["key"], p["value"]])) for p in g["pairs"]] ==
              [(_without_scores([p["key"], p["value"]])) for p in w["pairs"]]), g["id"]
      np.testing.assert_allclose([p["score"] for p in g["pairs"]],
                                 [p["score"] for p in w["pairs"]], atol=1e-4, rtol=0)


# ----------------------------------------------------------------------------- tagging
@pytest.fixture(scope="module")
def tagging(trained, tmp_path_factory):
  """(moved export of the session's run, documents' JSON Lines file, predict's rows)."""
  tmp = tmp_path_factory.mktemp("tagging")
  source = _documents(tmp)
  rows = _predict_rows(tiny_config(), trained[0], source, tmp / "pred.jsonl")
  return _export_and_move(trained[0], tmp, "tagging"), source, rows


def test_pipeline_rows_equal_predict_modes(tagging):
  export, source, want = tagging
  config = json.loads((export / "config.json").read_text())
  assert config["format_version"] == 2 and config["tokenizer"] == "default"
  assert sorted(os.listdir(export)) == ["config.json", "model.safetensors"]  # nothing to copy
  pipe = DocumentPipeline.from_exported(export, batch_size=2)
  assert_rows_match(pipe(str(source)), want)
  docs, _ = jsonl.read_jsonl(source)
  assert_rows_match(pipe(docs), want)  # Documents in, one by one or as a list
  assert_rows_match([pipe(d)[0] for d in docs], want)
  assert "pairs" not in want[0]  # no linking head: predict writes no pairs either
  assert pipe([]) == []


def test_a_pdf_path_gives_the_rows_of_its_document(tagging, tmp_path):
  pytest.importorskip("matplotlib")
  pytest.importorskip("pypdfium2")
  from flaxdoc.data import pdf  # pylint: disable=import-outside-toplevel
  from flaxdoc.data.synthetic.render_pdf import write_pdf  # pylint: disable=import-outside-toplevel
  docs = [make_document(13, i) for i in range(2)]
  for doc in docs:
    write_pdf(doc, tmp_path / f"{doc.id}.pdf")
  pipe = DocumentPipeline.from_exported(tagging[0])
  got = pipe(str(tmp_path / "*.pdf"))
  paths = sorted(str(p) for p in tmp_path.glob("*.pdf"))
  read, _ = pdf.read_pdfs(paths)
  assert [r["id"] for r in got] == sorted(d.id for d in docs)
  assert got == pipe(read) == pipe(paths)  # a glob, the documents, a list of paths
  with pytest.raises(ValueError, match=r"DocumentPipeline input=.*photo.png.*ocr=ENGINE"):
    pipe(str(tmp_path / "photo.png"))


@pytest.mark.slow  # torch.compile takes a minute on 2 cores; the rows are the plain model's
def test_compiled_pipeline_gives_the_same_entities(tagging):
  export, source, want = tagging
  got = DocumentPipeline.from_exported(export, compile=True)(str(source))
  assert_rows_match(got, want)


def test_a_missing_tokenizer_file_is_one_line_from_the_export_cli(trained, tmp_path, capsys):
  from flaxdoc.export.__main__ import main as export_main  # pylint: disable=import-outside-toplevel
  gone = tmp_path / "moved_away" / "sp.model"
  run = _copy_run(trained[0], tmp_path / "run", f"sentencepiece:{gone}")
  assert export_main(["--workdir", str(run), "--out", str(tmp_path / "out")]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and str(gone) in err and "config.data.tokenizer" in err, err
  assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- linking
@pytest.fixture(scope="module")
def linking(tmp_path_factory):
  """A tagging+linking run with its own SentencePiece file, exported and moved, the file
  deleted: (export, documents' file, predict's rows)."""
  tmp = tmp_path_factory.mktemp("linking")
  sp = tmp / "train_machine" / "sp.model"
  sp.parent.mkdir()
  shutil.copy(tokenizers.default_tokenizer().model_file, sp)
  config = tiny_config(arg="local,task=tagging+linking", **{
      "data.max_len": 128, "data.tokenizer": f"sentencepiece:{sp}", "total_steps": 2,
      "eval_every": 2, "checkpoint_every": 2})
  config.data.dataset_options = {"num_train": 6, "num_dev": 2, "link_keys": True}
  trainer.train_and_evaluate(config, str(tmp / "run"))
  source = _documents(tmp, link_keys=True)
  rows = _predict_rows(config, tmp / "run", source, tmp / "pred.jsonl")
  export = _export_and_move(tmp / "run", tmp, "linking")
  shutil.rmtree(sp.parent)
  return export, source, rows


def test_linking_pipeline_rows_equal_predict_modes(linking):
  export, source, want = linking
  config = json.loads((export / "config.json").read_text())
  assert config["tokenizer"] == "sentencepiece:tokenizer/sp.model"
  assert sorted(os.listdir(export / "tokenizer")) == ["sp.model"]
  assert all(isinstance(r["pairs"], list) for r in want)
  assert sum(len(r["pairs"]) for r in want) > 0  # pairs to compare
  for batch_size in (1, 8):  # several calls per document; one call for all
    assert_rows_match(DocumentPipeline.from_exported(export, batch_size=batch_size)(str(source)),
                      want)


def test_an_export_of_format_1_with_an_absolute_spec_still_loads(linking, tmp_path):
  export, source, want = linking
  old = tmp_path / "old"
  shutil.copytree(export, old)
  shutil.rmtree(old / "tokenizer")
  config = json.loads((old / "config.json").read_text())
  config["format_version"] = 1  # written before the folder held its tokenizer
  config["tokenizer"] = f"sentencepiece:{tokenizers.default_tokenizer().model_file}"
  (old / "config.json").write_text(json.dumps(config))
  assert_rows_match(DocumentPipeline.from_exported(old)(str(source)), want)
  # Its file gone (another machine): the error says what to do; a tokenizer given is used.
  config["tokenizer"] = f"sentencepiece:{tmp_path / 'training_machine' / 'sp.model'}"
  (old / "config.json").write_text(json.dumps(config))
  with pytest.raises(FileNotFoundError, match=r"format version 1.*export it again"):
    DocumentPipeline.from_exported(old)
  given = DocumentPipeline.from_exported(old, tokenizer=f"sentencepiece:{export / 'tokenizer'}"
                                         "/sp.model")
  assert_rows_match(given(str(source)), want)


# ----------------------------------------------------------------------------- MiniLM
@pytest.fixture(scope="module")
def minilm_run(tmp_path_factory):
  """A tiny run on MiniLM's vocabulary (`hf:` a copy of its tokenizer files)."""
  if not (MINILM / "vocab.txt").is_file():
    pytest.skip(f"no MiniLM folder at {MINILM} (set $FLAXDOC_MODELS)")
  tmp = tmp_path_factory.mktemp("minilm")
  hf = tmp / "train_machine" / "minilm"
  hf.mkdir(parents=True)
  for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "config.json"):
    if (MINILM / name).is_file():
      shutil.copy(MINILM / name, hf / name)
  config = tiny_config(**{"data.tokenizer": f"hf:{hf}", "total_steps": 3, "eval_every": 3,
                          "checkpoint_every": 3})
  trainer.train_and_evaluate(config, str(tmp / "run"))
  source = _documents(tmp)
  rows = _predict_rows(config, tmp / "run", source, tmp / "pred.jsonl")
  return tmp, hf, source, rows


# Slow (a run of its own, half a minute): each kind's files are copied and load from a moved
# folder in tests/export/test_tokenizer_files.py, and a run's export end to end is the
# SentencePiece linking run's above.
@pytest.mark.slow
def test_hf_and_wordpiece_exports_carry_minilms_vocabulary(minilm_run):
  tmp, hf, source, want = minilm_run
  hf_export = _export_and_move(tmp / "run", tmp, "hf")
  wp = tmp / "train_machine" / "wordpiece" / "vocab.txt"
  wp.parent.mkdir()
  shutil.copy(hf / "vocab.txt", wp)
  run = _copy_run(tmp / "run", tmp / "run_wordpiece", f"wordpiece:{wp}")
  wp_export = _export_and_move(run, tmp, "wordpiece")
  shutil.rmtree(tmp / "train_machine")
  assert json.loads((hf_export / "config.json").read_text())["tokenizer"] == "hf:tokenizer"
  assert sorted(os.listdir(hf_export / "tokenizer")) == ["tokenizer_config.json", "vocab.txt"]
  assert (json.loads((wp_export / "config.json").read_text())["tokenizer"] ==
          "wordpiece:tokenizer/vocab.txt")
  for export in (hf_export, wp_export):  # MiniLM lowercases, as `wordpiece:` does
    assert_rows_match(DocumentPipeline.from_exported(export, batch_size=4)(str(source)), want)
