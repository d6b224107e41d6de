"""Shared fixtures for the export tests: synthetic documents through the featuriser."""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np

from flaxdoc import models
from flaxdoc.data.features import FeatureConfig, batch_features, featurize
from flaxdoc.data.synthetic.generator import LABELS, make_document

VOCAB = 64
KEEP = ("window_index", "window_start", "subtoken_index")


class ChunkTokenizer:
  """Deterministic offline tokenizer: words cut into 3-character chunks."""
  name = "chunk"
  vocab_size = VOCAB
  pad_id, unk_id, cls_id, sep_id, mask_id = 0, 1, 2, 3, 4

  def encode_word(self, word):
    return [5 + zlib.crc32(word[i:i + 3].encode()) % (VOCAB - 5) for i in range(0, len(word), 3)]

  def id_to_piece(self, i):
    return f"<{i}>"


def feature_config(max_len: int, graph: bool) -> FeatureConfig:
  return FeatureConfig(max_len=max_len, scheme="BIOES", labels=tuple(LABELS), graph=graph)


def synthetic_batch(max_len: int, graph: bool, num_docs: int = 2, seed: int = 0) -> dict:
  """First windows of `num_docs` synthetic documents, featurised and batched (with padding)."""
  tok = ChunkTokenizer()
  config = feature_config(max_len, graph)
  windows = []
  for i in range(num_docs):
    w = featurize(make_document(seed, i), tok, config)[0]
    windows.append({k: v for k, v in w.items() if k not in KEEP})
  # Cut the second document short so the batch holds padding.
  if num_docs > 1:
    short = windows[1]
    cut = max_len // 3
    short["attention_mask"] = short["attention_mask"].copy()
    short["attention_mask"][cut:] = 0
    if "neighbor_mask" in short:
      short["neighbor_mask"] = short["neighbor_mask"].copy()
      short["neighbor_mask"][cut:] = False
  return batch_features(windows)


def flax_model(name: str, variant: str, batch: dict, *, max_len: int, seed: int = 0):
  """(module, params, spec dict, export config) for a local config with random parameters."""
  config = models.get_model_config(name, variant, local=True)
  num_tags = feature_config(max_len, False).num_tags
  model = models.build_model(config, vocab_size=VOCAB, num_tags=num_tags, max_len=max_len,
                             pretraining=False)
  params = models.random_parameters(model, batch, seed=seed)
  export_config = {"model": dataclasses.asdict(model.spec), "vocab_size": VOCAB,
                   "num_tags": num_tags, "max_len": max_len}
  return model, params, export_config


def torch_batch(batch: dict) -> dict:
  import torch  # pylint: disable=import-outside-toplevel
  return {k: torch.as_tensor(np.asarray(v)) for k, v in batch.items()}
