"""Evaluation and prediction over featurised splits: windows -> words -> entities -> F1.

The model's token log-probabilities are stitched back to one row per word
(`features.stitch`), decoded with the constrained Viterbi (`decode.decode_document`)
and scored against the gold entities with seqeval (strict, matching scheme),
over words (DESIGN §3.8).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from flaxdoc import decode, metrics as metrics_lib, tags as tags_lib
from flaxdoc.data.features import FeatureConfig, stitch
from flaxdoc.train.input_pipeline import FeaturizedSplit, eval_batches

# predict_fn(batch) -> numpy log-probabilities [B, L, T] (all rows, padding included).
PredictFn = Callable[[dict], np.ndarray]


@dataclasses.dataclass
class DocumentPrediction:
  doc_id: str
  entities: list[decode.PredictedEntity]
  word_tags: list[str]


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
  tag_names = config.tag_names
  out = []
  for d, doc in enumerate(split.documents):
    idx = np.flatnonzero(split.window_doc == d)
    word_scores = stitch(doc, [split.windows[i] for i in idx], [per_window[i] for i in idx])
    entities = decode.decode_document(doc, word_scores, tag_names, config.scheme)
    # The model's labels, not the document's label_set (an input's own set may lack some).
    word_tags = decode.word_tags_from_entities(doc, entities, config.scheme, config.labels)
    out.append(DocumentPrediction(doc.id, entities, word_tags))
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


def entity_json(entity: decode.PredictedEntity, doc) -> dict:
  """A predicted entity as JSON: label, text, words, per-word boxes, union box, page, score."""
  return {
      "label": entity.label,
      "text": entity.text,
      "words": list(entity.words),
      "word_boxes": [[float(v) for v in doc.boxes[i]] for i in entity.words],
      "box": [float(v) for v in entity.box],
      "page": int(entity.page),
      "score": None if entity.score is None else float(entity.score),
  }
