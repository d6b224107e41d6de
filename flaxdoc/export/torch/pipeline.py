"""Documents in, entities (and key -> value pairs) out: an exported model served in PyTorch.

    from flaxdoc.export.torch.pipeline import DocumentPipeline
    pipe = DocumentPipeline.from_exported("exported/formnet")   # model, tokenizer, labels
    rows = pipe(documents)            # flaxdoc Documents, or paths: "in/*.pdf", "docs.jsonl"
    rows[0]   # {"id": ..., "entities": [{"label", "text", "words", "word_boxes", "box",
              #  "page", "score"}, ...], "pairs": [...] with a linking head}

Each row is the one `predict` mode writes to `predictions.jsonl` for the same document
(`flaxdoc.predictions.prediction_row`, which both use): featurise with the export's
tokenizer and feature config (`config.json`), run the torch model over batches of windows
under `torch.no_grad()`, stitch the windows back to words and decode them with the
constrained Viterbi (`flaxdoc.predictions.document_prediction`). A model with an
entity-linking head is run a second time with the `link_*` arrays of the decoded
entities, and its outputs become pairs by `flaxdoc.train.linking`'s own rule (each value
to its most probable key or to none; keys in any window of the document with the
default `config.linking.scope="document"`).

Paths are read by `flaxdoc.data.sources.read_source`, as `predict` reads
`config.predict.input`: `*.jsonl`; PDFs' text layers; with `ocr=ENGINE`, images and
scanned pages too.

What runs where: the model is PyTorch (with its native CPU kernels, or `compile=True`
for `torch.compile`); featurising, stitching, decoding and pair assembly are numpy.
JAX is imported (by `flaxdoc.decode`, and by `flaxdoc.train.linking` for a linking
head) but computes nothing. This module is not imported by `flaxdoc.export.torch`,
which stays free of JAX.
"""

from __future__ import annotations

import logging
import os
from typing import Iterable, Sequence

import numpy as np
import torch

from flaxdoc.data.document import Document
from flaxdoc.data.features import FeatureConfig, batch_features, featurize
from flaxdoc.export.tokenizer_files import load_export_tokenizer
from flaxdoc.export.torch.load import load_exported
from flaxdoc.export.torch.models import BATCH_KEYS, OPTIONAL_BATCH_KEYS
from flaxdoc.predictions import document_prediction, prediction_row

log = logging.getLogger(__name__)

MODEL_KEYS = BATCH_KEYS + OPTIONAL_BATCH_KEYS
DEFAULT_BATCH_SIZE = 8


def feature_config_of(export_config: dict) -> FeatureConfig:
  """The `FeatureConfig` an export's `config.json` records (its `features`)."""
  fields = export_config.get("features")
  if not fields:
    raise ValueError("the export's config.json has no feature config ('features'): export it "
                     "with `python -m flaxdoc.export`")
  return FeatureConfig(**fields)


def linking_task_of(export_config: dict, labels: Sequence[str]):
  """The run's `flaxdoc.train.linking.LinkingTask` (candidate table and sizes), or None
  for a model without a linking head: the same object `predict` mode links with."""
  if not export_config.get("linking"):
    return None
  train_config = export_config.get("train_config")
  if not train_config:
    raise ValueError("the exported model has a linking head, but its config.json has no "
                     "train_config (the run's config.linking): export it with "
                     "`python -m flaxdoc.export`")
  # pylint: disable=import-outside-toplevel
  import ml_collections
  from flaxdoc.train import linking
  return linking.LinkingTask.from_config(ml_collections.ConfigDict(train_config), labels)


class DocumentPipeline:
  """An exported model with its tokenizer and feature config: documents -> output rows.

  Args:
    model: the torch model (`load_exported`), in eval mode.
    tokenizer: a flaxdoc tokenizer (`flaxdoc.data.tokenizers`).
    feature_config: how documents become windows (the run's).
    linking: the run's `LinkingTask` when the model has a linking head, else None.
    batch_size: windows per model call.
    ocr: an OCR engine (`flaxdoc.data.ocr`, e.g. "tesseract") for image paths and scanned
      PDF pages; None: born-digital PDFs only.
    ocr_dpi: the resolution PDF pages are rendered at for OCR.
  """

  def __init__(self, model: torch.nn.Module, tokenizer, feature_config: FeatureConfig, *,
               linking=None, batch_size: int = DEFAULT_BATCH_SIZE, ocr: str | None = None,
               ocr_dpi: float = 300.0):
    if int(batch_size) < 1:
      raise ValueError(f"batch_size={batch_size!r}: must be >= 1")
    self.model = model
    self.tokenizer = tokenizer
    self.feature_config = feature_config
    self.linking = linking
    self.batch_size = int(batch_size)
    self.ocr = ocr
    self.ocr_dpi = float(ocr_dpi)

  @classmethod
  def from_exported(cls, folder: str | os.PathLike, *, batch_size: int = DEFAULT_BATCH_SIZE,
                    compile: bool = False,  # pylint: disable=redefined-builtin
                    ocr: str | None = None, ocr_dpi: float = 300.0,
                    tokenizer=None) -> "DocumentPipeline":
    """The pipeline of an export folder (`python -m flaxdoc.export --out FOLDER`).

    `compile=True` wraps the model with `flaxdoc.export.torch.compiled.compile_layers`
    (`torch.compile`: a compile per new input shape, faster calls after it).
    `tokenizer`: None, the folder's own; else a `load_tokenizer` spec or a tokenizer
    (an old export whose config.json names files of the training machine).
    """
    model = load_exported(folder)
    config = model.export_config
    fc = feature_config_of(config)
    if tokenizer is None:
      tokenizer = load_export_tokenizer(folder, config)
    elif isinstance(tokenizer, str):
      from flaxdoc.data.tokenizers import load_tokenizer  # pylint: disable=import-outside-toplevel
      tokenizer = load_tokenizer(tokenizer)
    linking = linking_task_of(config, fc.labels)
    if compile:
      # pylint: disable-next=import-outside-toplevel
      from flaxdoc.export.torch.compiled import compile_layers
      model = compile_layers(model)
    return cls(model, tokenizer, fc, linking=linking, batch_size=batch_size, ocr=ocr,
               ocr_dpi=ocr_dpi)

  # ------------------------------------------------------------------ inputs
  def read(self, inputs) -> list[Document]:
    """Documents from a `Document`, a path or glob, or a sequence of either (in order)."""
    if isinstance(inputs, (Document, str, os.PathLike)):
      inputs = [inputs]
    docs: list[Document] = []
    for item in inputs:
      if isinstance(item, Document):
        docs.append(item)
      elif isinstance(item, (str, os.PathLike)):
        from flaxdoc.data import sources  # pylint: disable=import-outside-toplevel
        docs.extend(sources.read_source(os.fspath(item), ocr=self.ocr, ocr_dpi=self.ocr_dpi,
                                        name="DocumentPipeline input", announce=log.info,
                                        otherwise=" (images: DocumentPipeline(ocr=ENGINE))"))
      else:
        raise TypeError(f"DocumentPipeline input: expected a flaxdoc Document or a path, got "
                        f"{type(item).__name__}")
    return docs

  def __call__(self, inputs) -> list[dict]:
    """One row per document of `inputs` (see `read`): `{"id", "entities"[, "pairs"]}`."""
    return self.predict(self.read(inputs))

  # ------------------------------------------------------------------ model
  @staticmethod
  def _tensors(batch: dict, rows=slice(None)) -> dict:
    return {k: torch.as_tensor(np.asarray(v)[rows]) for k, v in batch.items()
            if k in MODEL_KEYS or k.startswith("link_")}

  def _run(self, batch: dict):
    with torch.no_grad():
      return self.model(self._tensors(batch))

  def _window_scores(self, windows: list[dict]) -> list[np.ndarray]:
    """Tag logits `[L, T]` per window, `batch_size` windows per model call."""
    out: list[np.ndarray] = []
    for start in range(0, len(windows), self.batch_size):
      logits = self._run(batch_features(windows[start:start + self.batch_size]))
      out.extend(logits.numpy())
    return out

  def _link_outputs(self, batch: dict) -> dict:
    """`Linker.run` for `flaxdoc.train.linking`: the link outputs of a batch whose trailing
    rows may be padding (no tokens), which are not run."""
    mask = np.asarray(batch["attention_mask"])
    real = np.flatnonzero(mask.any(axis=1))
    with torch.no_grad():
      outputs = self.model.link_outputs(self._tensors(batch, real))
    out = {}
    for k, v in outputs.items():
      v = v.numpy()
      out[k] = np.zeros((len(mask),) + v.shape[1:], v.dtype)
      out[k][real] = v
    return out

  def _link_scores(self, arrays: dict) -> np.ndarray:
    """`Linker.score`: the linking head alone on one document's candidates."""
    t = {k: None if v is None else torch.as_tensor(np.asarray(v))[None]
         for k, v in arrays.items()}
    with torch.no_grad():
      return self.model.linking_head.score(t["value"], t["none"], t["key"], t["value_box"],
                                           t["key_box"], t["mask"])[0].numpy()

  # ------------------------------------------------------------------ documents
  def predict(self, documents: Iterable[Document]) -> list[dict]:
    """The `predictions.jsonl` rows of `documents`, in order."""
    docs = list(documents)
    if not docs:
      return []
    windows, owner = [], []
    for i, doc in enumerate(docs):
      ws = featurize(doc, self.tokenizer, self.feature_config)
      windows.extend(ws)
      owner.extend([i] * len(ws))
    window_doc = np.asarray(owner, np.int64)
    scores = self._window_scores(windows)
    preds = []
    for d, doc in enumerate(docs):
      idx = np.flatnonzero(window_doc == d)
      preds.append(document_prediction(doc, [windows[i] for i in idx], [scores[i] for i in idx],
                                       self.feature_config))
    if self.linking is None:
      return [prediction_row(doc, p.entities) for doc, p in zip(docs, preds)]
    # pylint: disable=import-outside-toplevel
    from flaxdoc.train import linking
    from flaxdoc.train.input_pipeline import FeaturizedSplit
    split = FeaturizedSplit(docs, windows, window_doc)
    pairs = linking.document_pairs(self.linking, docs, split, preds,
                                   linking.Linker(self._link_outputs, self._link_scores),
                                   self.batch_size)
    return [prediction_row(doc, p.entities, doc_pairs)
            for doc, p, doc_pairs in zip(docs, preds, pairs)]
