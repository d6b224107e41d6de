"""grain input pipelines: documents -> featurised windows -> sharded, batched, resumable.

Training data is a `grain.MapDataset` over *window slots* `(document, window)`
computed once from the un-augmented documents. Each process takes its own shard
of the slots (`ShardByJaxProcess`), shuffles them with the run's seed, repeats,
and batches its share of the global batch. The iterator's state is a small
JSON dict that the checkpoint stores, so a resumed run continues with exactly
the batches an uninterrupted run would have seen.

Augmentations (LSPE block shuffling, fine-tuning only) are a seeded per-example
transform: the augmented document is featurised again and the slot's window
index picks the window (modulo the new count).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Iterator, Sequence

import grain
import jax
import numpy as np

from flaxdoc.data import augment, masking
from flaxdoc.data.document import Document
from flaxdoc.data.features import FeatureConfig, batch_features, featurize

log = logging.getLogger(__name__)

# Keys the model never reads; dropped before batches go to devices.
HOST_ONLY_KEYS = ("window_index", "window_start", "subtoken_index")


@dataclasses.dataclass
class FeaturizedSplit:
  """A split's documents and their windows (document index per window)."""
  documents: list[Document]
  windows: list[dict[str, np.ndarray]]
  window_doc: np.ndarray  # int [num_windows]

  @property
  def num_tokens(self) -> int:
    return int(sum(int(w["attention_mask"].sum()) for w in self.windows))


def featurize_split(docs: Sequence[Document], tokenizer, config: FeatureConfig,
                    progress: bool = False) -> FeaturizedSplit:
  """Featurises every document (with a progress bar when asked)."""
  windows, owner = [], []
  it = docs
  if progress and jax.process_index() == 0:
    from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
    it = tqdm(docs, desc="featurise", unit="doc", mininterval=1.0)
  for i, d in enumerate(it):
    ws = featurize(d, tokenizer, config)
    windows.extend(ws)
    owner.extend([i] * len(ws))
  return FeaturizedSplit(list(docs), windows, np.asarray(owner, np.int64))


@dataclasses.dataclass(frozen=True)
class _Augment(grain.transforms.RandomMap):
  """Block shuffle / neighbour swap of the slot's document, then featurise."""
  split: FeaturizedSplit
  tokenizer: object
  config: FeatureConfig
  block_shuffle: float
  neighbour_swap: float

  def random_map(self, index, rng: np.random.Generator):
    index = int(index)
    doc_idx = int(self.split.window_doc[index])
    doc = self.split.documents[doc_idx]
    changed = False
    if self.block_shuffle and rng.random() < self.block_shuffle:
      doc, changed = augment.global_block_shuffle(doc, rng), True
    elif self.neighbour_swap and rng.random() < self.neighbour_swap:
      doc, changed = augment.neighbour_block_swap(doc, rng), True
    if not changed:
      return _strip(self.split.windows[index])
    # The slot's window number inside its document (windows are stored in order).
    k = index - int(np.searchsorted(self.split.window_doc, doc_idx))
    ws = featurize(doc, self.tokenizer, self.config)
    return _strip(ws[k % len(ws)])


@dataclasses.dataclass(frozen=True)
class _Pretrain(grain.transforms.RandomMap):
  """MLM (+ 1-LOP) targets drawn per example."""
  tokenizer: object
  mlm_rate: float
  lop_rate: float

  def random_map(self, features, rng: np.random.Generator):
    return _strip(masking.pretraining_targets(features, rng, self.tokenizer, mlm_rate=self.mlm_rate,
                                              lop_rate=self.lop_rate or None))


def _strip(w: dict) -> dict:
  return {k: v for k, v in w.items() if k not in HOST_ONLY_KEYS}


def train_dataset(split: FeaturizedSplit, *, tokenizer, config: FeatureConfig, global_batch: int,
                  seed: int, mode: str = "train", block_shuffle: float = 0.0,
                  neighbour_swap: float = 0.0, mlm_rate: float = 0.15, lop_rate: float = 0.0,
                  shard: grain.sharding.ShardOptions | None = None) -> grain.IterDataset:
  """An infinite, shuffled, batched dataset of this process's shard of training windows.

  `shard` says which share of every global batch this process loads (default:
  one shard per JAX process; the trainer passes `sharding.process_batch_shard`
  so processes that differ only along the tensor axis load the same rows).
  """
  if not split.windows:
    raise ValueError("the training split has no windows (no documents?)")
  if shard is None:
    shard = grain.sharding.ShardByJaxProcess(drop_remainder=False)
  if global_batch % shard.shard_count:
    raise ValueError(f"global batch {global_batch} is not divisible by {shard.shard_count} shards")
  local_batch = global_batch // shard.shard_count
  # Window indices: documents' windows are stored in order, so index i is the
  # slot (window_doc[i], i - first window of that document).
  ds = grain.MapDataset.range(len(split.windows))
  if shard.shard_count > 1:
    ds = ds[shard.shard_index::shard.shard_count]
  ds = ds.shuffle(seed=seed).repeat(None)
  if mode == "pretrain":
    ds = ds.map(lambda i: split.windows[int(i)])
    ds = ds.random_map(_Pretrain(tokenizer, mlm_rate, lop_rate), seed=seed + 1)
  elif block_shuffle or neighbour_swap:
    ds = ds.random_map(_Augment(split, tokenizer, config, block_shuffle, neighbour_swap),
                       seed=seed + 1)
  else:
    ds = ds.map(lambda i: _strip(split.windows[int(i)]))
  ds = ds.batch(local_batch, drop_remainder=True, batch_fn=batch_features)
  return ds.to_iter_dataset()


def eval_batches(split: FeaturizedSplit, batch_size: int) -> Iterator[tuple[dict, np.ndarray]]:
  """Every window once, in order, padded to full batches.

  Yields `(batch, valid)` where `valid` marks real (not padding) rows. Every
  process sees all windows (evaluation sets are small); metrics are computed
  on process 0 from the globally gathered logits.
  """
  n = len(split.windows)
  for start in range(0, n, batch_size):
    chunk = [_strip(w) for w in split.windows[start:start + batch_size]]
    valid = np.zeros(batch_size, bool)
    valid[:len(chunk)] = True
    while len(chunk) < batch_size:
      pad = {k: np.zeros_like(v) for k, v in chunk[0].items()}
      pad["tags"] = np.full_like(chunk[0]["tags"], -1)
      chunk.append(pad)
    yield batch_features(chunk), valid
