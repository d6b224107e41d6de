"""Evaluation and prediction over featurised splits: windows -> words -> entities -> F1.

The model's token log-probabilities are stitched back to one row per word
(`features.stitch`), decoded with the constrained Viterbi (`decode.decode_document`),
both through `flaxdoc.predictions`, and scored against the gold entities with seqeval
(strict, matching scheme), over words (DESIGN §3.8).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from flaxdoc import metrics as metrics_lib, tags as tags_lib
from flaxdoc.data.features import FeatureConfig
# The per-document part and the JSON rows are shared with the PyTorch serving pipeline;
# re-exported here, where eval and predict have always found them.
from flaxdoc.predictions import DocumentPrediction, document_prediction, entity_json
from flaxdoc.train.input_pipeline import FeaturizedSplit, eval_batches

__all__ = ["DocumentPrediction", "PredictFn", "entity_json", "evaluate_split", "predict_split",
           "score_predictions"]

# predict_fn(batch) -> numpy log-probabilities [B, L, T] (all rows, padding included).
PredictFn = Callable[[dict], np.ndarray]


def predict_split(split: FeaturizedSplit, predict_fn: PredictFn, config: FeatureConfig,
                  batch_size: int, progress: bool = False) -> list[DocumentPrediction]:
  """Runs the model over every window and decodes one prediction per document."""
  per_window: list[np.ndarray] = []
  batches = eval_batches(split, batch_size)
  if progress:
    from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
    batches = tqdm(batches, total=-(-len(split.windows) // batch_size), desc="predict",
                   unit="batch", mininterval=1.0)
  for batch, valid in batches:
    logp = np.asarray(predict_fn(batch))  # [B, L, T]
    per_window.extend(logp[valid])
  out = []
  for d, doc in enumerate(split.documents):
    idx = np.flatnonzero(split.window_doc == d)
    out.append(document_prediction(doc, [split.windows[i] for i in idx],
                                   [per_window[i] for i in idx], config))
  return out


def score_predictions(split: FeaturizedSplit, predictions: list[DocumentPrediction],
                      config: FeatureConfig) -> dict:
  """seqeval entity scores of predictions against the split's gold entities."""
  m = metrics_lib.EntityMetrics(config.scheme)
  for doc, pred in zip(split.documents, predictions):
    gold = tags_lib.entities_to_tags(len(doc), doc.entities or (), config.scheme)
    m.add(gold, pred.word_tags)
  return m.compute()


def evaluate_split(split: FeaturizedSplit, predict_fn: PredictFn, config: FeatureConfig,
                   batch_size: int, progress: bool = False) -> tuple[dict, list[DocumentPrediction]]:
  preds = predict_split(split, predict_fn, config, batch_size, progress)
  return score_predictions(split, preds, config), preds
