"""`eval` and `predict` modes: restore a trained workdir, score a split or tag documents.

`predict` reads documents from a dataset split (`config.predict.input` empty),
a JSON Lines file (`*.jsonl`), or PDFs and images (PNG, JPEG, TIFF): a PDF page's
text layer where it has one, OCR (`config.predict.ocr`, `flaxdoc.data.ocr`)
where not; with `predict.ocr=""` only born-digital PDFs, and writes one JSON object per document with its entities (label,
text, words, boxes, page, score) to `config.predict.output`
(default `WORKDIR/predictions.jsonl`), plus optional PNG pictures per page.

The workdir, `predict.output` and `predict.draw_dir` may be remote (`gs://bucket/run`):
their files are read and written through `etils.epath` (`flaxdoc.train.remote`).
"""

from __future__ import annotations

import functools
import json
import logging
import os

import jax
import ml_collections
import numpy as np
from etils import epath
from jax.experimental import multihost_utils
from flax import linen as nn

from flaxdoc import metrics as metrics_lib, predictions
from flaxdoc.data import sources
from flaxdoc.train import checkpoint as ckpt_lib
from flaxdoc.train import evaluate as eval_lib
from flaxdoc.train import hf_init, linking, optimizer, remote, setup
from flaxdoc.train import sharding as sharding_lib
from flaxdoc.train import state as state_lib
from flaxdoc.train.input_pipeline import featurize_split

log = logging.getLogger(__name__)


def restore_for_inference(config: ml_collections.ConfigDict, workdir: str):
  """(experiment, params, predict_fn) from the latest checkpoint in `workdir`."""
  remote.check_filesystem(workdir, "--workdir")  # gs:// without gcsfs: one line, before Orbax
  # create=False: a mistyped workdir gets the manager's "no finished checkpoint step" error,
  # before any setup work, and no folder is made for it.
  manager = ckpt_lib.make_manager(workdir, async_save=False, create=False)
  try:
    ckpt_lib.finished_steps(manager)
    mesh = sharding_lib.make_mesh(dict(config.mesh.shape))
    rules = sharding_lib.rules_from_config(config.mesh.get("rules"))
    env = setup.Experiment.create(setup.with_the_runs_record(config, workdir))
    config = env.config  # init_from=hf:DIR resolved once, by the experiment
    tx, _ = optimizer.make_optimizer(optimizer.run_optim_config(config),
                                     pretrained=hf_init.pretrained_mask(config))
    init_fn = state_lib.make_init_fn(env.model, tx, env.example_batch(1))
    boxed = jax.eval_shape(init_fn, jax.random.PRNGKey(0))
    shardings = sharding_lib.logical_shardings(boxed, mesh, rules)
    abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            nn.unbox(boxed), shardings)
    state, _, meta = ckpt_lib.restore(manager, abstract)
  finally:
    manager.close()
  env.restored_step = int(meta.get("step", state.step))
  log.info("restored step %d from %s", env.restored_step, workdir)
  predict = jax.jit(state_lib.make_predict_fn(env.model))

  def predict_fn(batch):
    with jax.set_mesh(mesh):
      out = predict(state.params, sharding_lib.replicated_batch_to_global(batch, mesh))
    return np.asarray(multihost_utils.process_allgather(out, tiled=True))

  return env, state.params, predict_fn


def run_eval(config: ml_collections.ConfigDict, workdir: str) -> dict:
  env, params, predict_fn = restore_for_inference(config, workdir)
  split = config.data.get("eval_split", "dev")
  feats = env.featurized(split, progress=True)
  scores, preds = eval_lib.evaluate_split(feats, predict_fn, env.feature_config,
                                          config.eval_batch_size, progress=True)
  report = metrics_lib.format_report(scores)
  if env.linking is not None:  # entity linking: relation scores (flaxdoc.train.linking)
    scores["relations"] = env.linking.evaluate(
        feats, preds, linking.linker_for(config, env.model, params), config.eval_batch_size)
    report += "\nkey -> value relations: " + linking.summary(scores["relations"])
  print(f"\n{config.data.dataset} {split}: {len(feats.documents)} documents\n{report}")
  if _writes_outputs():
    (epath.Path(workdir) / f"eval_{split}.json").write_text(json.dumps(scores, indent=1))
  return scores


def _writes_outputs() -> bool:
  """Process 0 writes the outputs, as the trainer writes config.json: a remote file, and a
  local one on a filesystem SLURM's processes share, would otherwise be written by every
  process at once (each holds the same results)."""
  return jax.process_index() == 0


def _input_documents(config, env):
  source = config.predict.get("input") or ""
  if not source:
    return env.documents(config.data.get("eval_split", "dev"))
  try:  # the reader is shared with the PyTorch serving pipeline (flaxdoc.data.sources)
    return sources.read_source(source, ocr=config.predict.get("ocr"),
                               ocr_dpi=config.predict.get("ocr_dpi", 300.0),
                               name="config.predict.input",
                               otherwise=", or empty for the dataset's eval split")
  except sources.SourceError as e:
    raise setup.ConfigError(str(e)) from None


def run_predict(config: ml_collections.ConfigDict, workdir: str) -> str:
  setup.check_ocr_engine("config.predict.ocr", config.predict.get("ocr"))  # before the restore
  for key in ("output", "draw_dir"):
    remote.check_filesystem(config.predict.get(key), f"config.predict.{key}")
  env, params, predict_fn = restore_for_inference(config, workdir)
  docs = _input_documents(config, env)
  feats = featurize_split(docs, env.tokenizer, env.feature_config, progress=True)
  preds = eval_lib.predict_split(feats, predict_fn, env.feature_config, config.eval_batch_size,
                                 progress=True)
  pairs = [[] for _ in docs]
  if env.linking is not None:  # key -> value pairs (flaxdoc.train.linking)
    pairs = linking.document_pairs(env.linking, docs, feats, preds,
                                   linking.linker_for(config, env.model, params),
                                   config.eval_batch_size)
  out = config.predict.get("output") or os.path.join(workdir, "predictions.jsonl")
  if _writes_outputs():
    out_path = epath.Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with out_path.open("w") as f:  # utf-8, as every epath text file
      for doc, p, doc_pairs in zip(docs, preds, pairs):
        # The row the PyTorch pipeline returns too (flaxdoc.predictions).
        row = predictions.prediction_row(doc, p.entities,
                                         doc_pairs if env.linking is not None else None)
        f.write(json.dumps(row) + "\n")
  pic_dir = config.predict.get("draw_dir") or os.path.join(workdir, "predictions")
  if config.predict.get("draw") and _writes_outputs():
    from flaxdoc import viz  # pylint: disable=import-outside-toplevel
    epath.Path(pic_dir).mkdir(parents=True, exist_ok=True)
    for doc, p, doc_pairs in zip(docs, preds, pairs):
      for page in range(doc.num_pages):
        # With the words written in: a picture of predictions is for reading what was found.
        draw = functools.partial(viz.draw_document, doc, page=page, entities=p.entities,
                                 show_text=True, pairs=[(k, v) for k, v, _ in doc_pairs])
        # Pillow writes local files: a remote folder gets each through a temporary copy.
        remote.write_through_local(os.path.join(pic_dir, f"{_safe(doc.id)}_p{page}.png"), draw)
  if _writes_outputs():
    print(f"wrote predictions for {len(docs)} documents to {out}")
  return out


def _safe(name: str) -> str:
  return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:100]
