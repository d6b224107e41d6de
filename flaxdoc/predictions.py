"""A document's predictions from its windows' scores, and its `predictions.jsonl` row.

    pred = document_prediction(doc, windows, window_scores, feature_config)
    row = prediction_row(doc, pred.entities, pairs)   # {"id", "entities": [...], "pairs": [...]}

Window scores `[L, T]` (logits or log-probabilities) are stitched back to one row per
word (`features.stitch`) and decoded with the constrained Viterbi
(`decode.decode_document`). `predict` mode (`flaxdoc.train.inference`, JAX) and the
PyTorch serving pipeline (`flaxdoc.export.torch.pipeline`) both build their output
rows here, so that the two cannot drift apart. No JAX computation runs here (numpy).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from flaxdoc import decode
from flaxdoc.data.features import FeatureConfig, stitch


@dataclasses.dataclass
class DocumentPrediction:
  doc_id: str
  entities: list[decode.PredictedEntity]
  word_tags: list[str]


def document_prediction(doc, windows: Sequence[dict], window_scores: Sequence[np.ndarray],
                        config: FeatureConfig) -> DocumentPrediction:
  """Entities and word tags of `doc` from its windows and their `[L, T]` scores."""
  word_scores = stitch(doc, windows, window_scores)
  entities = decode.decode_document(doc, word_scores, config.tag_names, config.scheme)
  # The model's labels, not the document's label_set (an input's own set may lack some).
  word_tags = decode.word_tags_from_entities(doc, entities, config.scheme, config.labels)
  return DocumentPrediction(doc.id, entities, word_tags)


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


def prediction_row(doc, entities, pairs=None) -> dict:
  """`{"id", "entities"}`, plus `"pairs"` when `pairs` is given (a model with a linking
  head): per pair `(key entity, value entity, probability)`."""
  row = {"id": doc.id, "entities": [entity_json(e, doc) for e in entities]}
  if pairs is not None:
    row["pairs"] = [{"key": entity_json(k, doc), "value": entity_json(v, doc), "score": float(s)}
                    for k, v, s in pairs]
  return row
