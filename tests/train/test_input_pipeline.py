"""The grain training pipeline: deterministic, resumable from its state, shardable."""

import numpy as np
import pytest

from flaxdoc.data import synthetic
from flaxdoc.data.features import FeatureConfig
from flaxdoc.data.tokenizers import default_tokenizer
from flaxdoc.train import input_pipeline


@pytest.fixture(scope="module")
def split():
  docs = synthetic.generate(12, seed=3)
  cfg = FeatureConfig(max_len=64, labels=synthetic.LABELS)
  return input_pipeline.featurize_split(docs, default_tokenizer(), cfg), cfg


def _take(it, n):
  return [next(it) for _ in range(n)]


def test_windows_cover_documents_in_order(split):
  s, _ = split
  assert len(s.windows) == len(s.window_doc) > len(s.documents)  # long docs got several windows
  assert (np.diff(s.window_doc) >= 0).all()
  assert set(s.window_doc.tolist()) == set(range(len(s.documents)))


def test_same_seed_same_batches_and_resume_from_state(split):
  s, cfg = split
  make = lambda seed: iter(input_pipeline.train_dataset(
      s, tokenizer=default_tokenizer(), config=cfg, global_batch=4, seed=seed))
  a, b = make(0), make(0)
  for x, y in zip(_take(a, 5), _take(b, 5)):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
  state = a.get_state()
  want = _take(a, 3)
  c = make(0)
  c.set_state(state)
  for x, y in zip(want, _take(c, 3)):
    np.testing.assert_array_equal(x["input_ids"], y["input_ids"])
  other = _take(make(1), 1)[0]
  assert not np.array_equal(other["input_ids"], _take(make(0), 1)[0]["input_ids"])


def test_batches_have_model_keys_only(split):
  s, cfg = split
  batch = next(iter(input_pipeline.train_dataset(s, tokenizer=default_tokenizer(), config=cfg,
                                                 global_batch=4, seed=0)))
  assert batch["input_ids"].shape == (4, 64)
  assert not set(input_pipeline.HOST_ONLY_KEYS) & set(batch)
  assert (batch["tags"] >= -1).all() and (batch["tags"] < cfg.num_tags).all()


def test_pretraining_and_augmented_batches(split):
  s, cfg = split
  tok = default_tokenizer()
  pre = next(iter(input_pipeline.train_dataset(s, tokenizer=tok, config=cfg, global_batch=4, seed=0,
                                               mode="pretrain", mlm_rate=0.3, lop_rate=0.3)))
  assert {"mlm_targets", "mlm_weights", "lop_targets", "lop_weights"} <= set(pre)
  assert pre["mlm_weights"].sum() > 0
  capped = next(iter(input_pipeline.train_dataset(s, tokenizer=tok, config=cfg, global_batch=4,
                                                  seed=0, mode="pretrain", mlm_rate=0.3,
                                                  mlm_max_predictions=3)))
  assert (capped["mlm_weights"] > 0).sum(1).max() == 3 < (pre["mlm_weights"] > 0).sum(1).max()
  aug = iter(input_pipeline.train_dataset(s, tokenizer=tok, config=cfg, global_batch=4, seed=0,
                                          block_shuffle=1.0))
  plain = iter(input_pipeline.train_dataset(s, tokenizer=tok, config=cfg, global_batch=4, seed=0))
  a, p = _take(aug, 3), _take(plain, 3)
  assert any(not np.array_equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, p))


def test_eval_batches_pad_and_mark_valid(split):
  s, _ = split
  seen = 0
  for batch, valid in input_pipeline.eval_batches(s, 5):
    assert batch["input_ids"].shape[0] == 5
    assert (batch["tags"][~valid] == -1).all()
    seen += int(valid.sum())
  assert seen == len(s.windows)
