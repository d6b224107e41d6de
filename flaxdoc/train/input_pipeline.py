"""grain input pipelines: documents -> featurised windows -> sharded, batched, resumable.

Training data is a `grain.MapDataset` over the windows computed once from the
un-augmented documents: one seeded shuffle, repeated, cut into global batches
of window indices; each process loads its rows of every global batch (see
`train_dataset`). The iterator's state is a small JSON dict that the checkpoint
stores, so a resumed run continues with exactly the batches an uninterrupted
run would have seen.

Augmentations (LSPE block shuffling, fine-tuning only) and pre-training masks
are drawn per row from a generator seeded by (seed, batch, row): the augmented
document is featurised again and the window's index picks the window (modulo
the new count).
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


def _augmented_window(split: FeaturizedSplit, index: int, rng: np.random.Generator, *,
                      tokenizer, config: FeatureConfig, block_shuffle: float,
                      neighbour_swap: float) -> dict:
  """Block shuffle / neighbour swap of the window's document, then featurise again."""
  doc_idx = int(split.window_doc[index])
  doc = split.documents[doc_idx]
  if block_shuffle and rng.random() < block_shuffle:
    doc = augment.global_block_shuffle(doc, rng)
  elif neighbour_swap and rng.random() < neighbour_swap:
    doc = augment.neighbour_block_swap(doc, rng)
  else:
    return split.windows[index]
  # The window's number inside its document (windows are stored in order).
  k = index - int(np.searchsorted(split.window_doc, doc_idx))
  ws = featurize(doc, tokenizer, config)
  return ws[k % len(ws)]


def _strip(w: dict) -> dict:
  return {k: v for k, v in w.items() if k not in HOST_ONLY_KEYS}


def train_dataset(split: FeaturizedSplit, *, tokenizer, config: FeatureConfig, global_batch: int,
                  seed: int, mode: str = "train", block_shuffle: float = 0.0,
                  neighbour_swap: float = 0.0, mlm_rate: float = 0.15, lop_rate: float = 0.0,
                  mlm_max_predictions: int | None = None,
                  shard: grain.sharding.ShardOptions | None = None) -> grain.IterDataset:
  """An infinite, shuffled dataset of this process's rows of every global batch.

  Every process builds the same sequence of *global* batches of window indices
  (one seeded shuffle of all windows, repeated) and keeps its rows of each
  (`shard`: default one shard per JAX process; the trainer passes
  `sharding.process_batch_shard`, so processes that differ only along the
  tensor axis load the same rows). Random transforms draw from a generator
  seeded by (seed, batch number, row in the global batch), so the global batch
  is the same whatever the number of processes: a run on 2 hosts x 4 devices
  sees exactly the data of a run on 1 host x 8 devices.
  """
  if not split.windows:
    raise ValueError("the training split has no windows (no documents?)")
  if shard is None:
    shard = grain.sharding.ShardByJaxProcess(drop_remainder=False)
  if global_batch % shard.shard_count:
    raise ValueError(f"global batch {global_batch} is not divisible by {shard.shard_count} shards")
  local = global_batch // shard.shard_count
  lo = shard.shard_index * local
  augmenting = mode != "pretrain" and (block_shuffle or neighbour_swap)

  def load(step: int, indices: np.ndarray) -> dict:
    rows = []
    for r in range(lo, lo + local):
      i = int(indices[r])
      if mode == "pretrain":
        rng = np.random.default_rng([seed, step, r])
        w = masking.pretraining_targets(split.windows[i], rng, tokenizer, mlm_rate=mlm_rate,
                                        lop_rate=lop_rate or None,
                                        max_predictions=mlm_max_predictions)
      elif augmenting:
        rng = np.random.default_rng([seed, step, r])
        w = _augmented_window(split, i, rng, tokenizer=tokenizer, config=config,
                              block_shuffle=block_shuffle, neighbour_swap=neighbour_swap)
      else:
        w = split.windows[i]
      rows.append(_strip(w))
    return batch_features(rows)

  ds = grain.MapDataset.range(len(split.windows)).shuffle(seed=seed).repeat(None)
  ds = ds.batch(global_batch, drop_remainder=True)  # [global_batch] window indices
  return ds.map_with_index(load).to_iter_dataset()


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
