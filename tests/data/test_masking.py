"""MLM (80/10/10) and 1-LOP targets: rates, what may be chosen, targets, determinism."""

import numpy as np
import pytest

from flaxdoc.data.document import Document
from flaxdoc.data.features import FeatureConfig, batch_features, featurize
from flaxdoc.data.masking import (default_max_predictions, lop_targets, mask_tokens,
                                  pretraining_targets, random_non_special_ids)


class OddTokenizer:
  """Test tokenizer whose specials sit at scattered ids (as in real vocabularies)."""
  name = "odd"
  vocab_size = 600
  pad_id, unk_id, cls_id, sep_id, mask_id = 7, 3, 500, 599, 12

  def encode_word(self, word):
    # Sub-tokens: one per 3 characters, ids avoiding the specials.
    return [13 + (sum(map(ord, word[i:i + 3])) * 7919) % 480 for i in range(0, len(word), 3)]

  def id_to_piece(self, i):
    return str(i)


TOK = OddTokenizer()
SPECIALS = {TOK.pad_id, TOK.unk_id, TOK.cls_id, TOK.sep_id, TOK.mask_id}


@pytest.fixture(scope="module")
def batch():
  """About 19k real tokens in windows of 64, with padding and segments."""
  rng = np.random.default_rng(0)
  wins = []
  for d in range(60):
    n = int(rng.integers(50, 300))
    words = ["".join(rng.choice(list("abcdefgh"), rng.integers(1, 8))) for _ in range(n)]
    boxes = np.tile([[0, 0, 10, 10]], (n, 1))
    segments = np.cumsum(rng.random(n) < 0.15)  # long segments: indices beyond 10 occur
    doc = Document.create(f"d{d}", words, boxes, segments=segments)
    wins += featurize(doc, TOK, FeatureConfig(max_len=64, stride=8))
  b = batch_features(wins)
  assert ((b["word_ids"] >= 0).sum()) > 15000
  return b


def test_mlm_rates_and_eligibility(batch):
  out = mask_tokens(batch, np.random.default_rng(1), TOK, rate=0.15)
  eligible = (batch["attention_mask"] == 1) & (batch["word_ids"] >= 0)
  chosen = out["mlm_weights"] > 0
  n = eligible.sum()
  # Only real, non-special tokens are chosen or changed.
  assert not chosen[~eligible].any()
  np.testing.assert_array_equal(out["input_ids"][~eligible], batch["input_ids"][~eligible])
  assert np.array_equal(out["mlm_mask"], chosen)
  # Rate ~ 0.15 (binomial standard deviation ~0.0025 here; 5 sigma).
  rate = chosen.sum() / n
  assert abs(rate - 0.15) < 5 * np.sqrt(0.15 * 0.85 / n)
  # Of the chosen: 80% [MASK], 10% random, 10% unchanged.
  new, old = out["input_ids"][chosen], batch["input_ids"][chosen]
  m = chosen.sum()
  tol = lambda p: 5 * np.sqrt(p * (1 - p) / m)  # noqa: E731
  frac_mask = np.mean(new == TOK.mask_id)
  frac_same = np.mean(new == old)
  frac_random = np.mean((new != TOK.mask_id) & (new != old))
  assert abs(frac_mask - 0.8) < tol(0.8)
  assert abs(frac_same - 0.1) < tol(0.1) + 0.01  # a random draw can equal the original
  assert abs(frac_random - 0.1) < tol(0.1)
  # Random replacements are never specials; targets are the original ids.
  assert not set(new[(new != TOK.mask_id) & (new != old)].tolist()) & SPECIALS
  np.testing.assert_array_equal(out["mlm_targets"][chosen], old)
  assert (out["mlm_targets"][~chosen] == TOK.pad_id).all()
  assert out["input_ids"].dtype == np.int32 and out["mlm_weights"].dtype == np.float32
  assert out["input_ids"].max() < TOK.vocab_size and out["input_ids"].min() >= 0


def test_mlm_other_rates_and_input_untouched(batch):
  before = {k: v.copy() for k, v in batch.items()}
  out = mask_tokens(batch, np.random.default_rng(2), TOK, rate=0.3, mask_prob=1.0,
                    random_prob=0.0)
  for k in before:
    np.testing.assert_array_equal(batch[k], before[k])  # no in-place change
  chosen = out["mlm_weights"] > 0
  eligible = (batch["attention_mask"] == 1) & (batch["word_ids"] >= 0)
  assert abs(chosen.sum() / eligible.sum() - 0.3) < 0.02
  assert (out["input_ids"][chosen] == TOK.mask_id).all()
  none = mask_tokens(batch, np.random.default_rng(2), TOK, rate=0.0)
  assert none["mlm_weights"].sum() == 0
  np.testing.assert_array_equal(none["input_ids"], batch["input_ids"])


def test_mlm_deterministic_and_single_window(batch):
  a = mask_tokens(batch, np.random.default_rng(5), TOK)
  b = mask_tokens(batch, np.random.default_rng(5), TOK)
  c = mask_tokens(batch, np.random.default_rng(6), TOK)
  for k in ("input_ids", "mlm_targets", "mlm_weights"):
    np.testing.assert_array_equal(a[k], b[k])
  assert not np.array_equal(a["mlm_weights"], c["mlm_weights"])
  window = {k: v[0] for k, v in batch.items()}
  out = mask_tokens(window, np.random.default_rng(0), TOK, rate=0.5)
  assert out["input_ids"].shape == window["input_ids"].shape


def test_random_non_special_ids_uniform_over_allowed():
  rng = np.random.default_rng(0)
  specials = [0, 3, 4, 9]
  ids = random_non_special_ids(rng, (60000,), 10, specials)
  counts = np.bincount(ids, minlength=10)
  assert counts[specials].sum() == 0
  allowed = counts[[1, 2, 5, 6, 7, 8]]
  expected = 60000 / 6
  assert (np.abs(allowed - expected) < 5 * np.sqrt(expected)).all()
  with pytest.raises(ValueError):
    random_non_special_ids(rng, (3,), 2, [0, 1])


def test_bad_arguments(batch):
  with pytest.raises(ValueError, match="rate"):
    mask_tokens(batch, np.random.default_rng(0), TOK, rate=1.5)
  with pytest.raises(ValueError, match="mask_prob"):
    mask_tokens(batch, np.random.default_rng(0), TOK, mask_prob=0.8, random_prob=0.3)
  with pytest.raises(ValueError, match="lack"):
    mask_tokens({"input_ids": batch["input_ids"]}, np.random.default_rng(0), TOK)
  with pytest.raises(ValueError, match="token_in_segment"):
    lop_targets({k: v for k, v in batch.items() if k != "token_in_segment"},
                np.random.default_rng(0))


def test_lop_rates_targets_and_eligibility(batch):
  out = lop_targets(batch, np.random.default_rng(3), rate=0.3, max_index=10)
  eligible = (batch["attention_mask"] == 1) & (batch["word_ids"] >= 0)
  hidden = out["lop_mask"]
  assert not hidden[~eligible].any()
  n = eligible.sum()
  assert abs(hidden.sum() / n - 0.3) < 5 * np.sqrt(0.21 / n)
  np.testing.assert_array_equal(out["lop_weights"], hidden.astype(np.float32))
  # Brute force: index of the word in its segment, clipped to 0..10.
  tis = batch["token_in_segment"]
  for b, i in zip(*np.nonzero(hidden)):
    assert out["lop_targets"][b, i] == min(tis[b, i], 10)
  assert (out["lop_targets"][~hidden] == 0).all()
  assert out["lop_targets"].max() == 10  # long segments do get clipped
  # The input ids are not touched by 1-LOP.
  np.testing.assert_array_equal(out["input_ids"], batch["input_ids"])
  again = lop_targets(batch, np.random.default_rng(3), rate=0.3)
  np.testing.assert_array_equal(again["lop_mask"], hidden)


def test_pretraining_targets_combines_both(batch):
  out = pretraining_targets(batch, np.random.default_rng(0), TOK, mlm_rate=0.3, lop_rate=0.3,
                            max_index=4)
  for k in ("mlm_targets", "mlm_weights", "lop_mask", "lop_targets", "lop_weights"):
    assert out[k].shape == batch["input_ids"].shape
  assert out["lop_targets"].max() == 4
  # Independent draws: the two selections are not the same set.
  assert not np.array_equal(out["mlm_mask"], out["lop_mask"])
  only_mlm = pretraining_targets(batch, np.random.default_rng(0), TOK)
  assert "lop_mask" not in only_mlm


def test_default_max_predictions_is_one_and_a_half_times_the_expected_count():
  assert default_max_predictions(1024, 0.15) == 231  # ceil(230.4)
  assert default_max_predictions(512, 0.15) == 116  # ceil(115.2)
  assert default_max_predictions(512, 0.3) == 231  # ceil(230.4): DocPolarBERT's rate
  assert default_max_predictions(128, 0.8) == 128  # never more than the window
  assert default_max_predictions(10, 0.01) == 1  # at least one
  with pytest.raises(ValueError, match="rate"):
    default_max_predictions(512, 1.5)


def test_mlm_cap_keeps_a_random_subset_of_the_same_draw(batch):
  free = mask_tokens(batch, np.random.default_rng(4), TOK, rate=0.5)
  capped = mask_tokens(batch, np.random.default_rng(4), TOK, rate=0.5, max_predictions=20)
  chosen_free, chosen = free["mlm_mask"], capped["mlm_mask"]
  counts = chosen_free.sum(-1)
  assert (counts > 20).any() and (counts < 20).any()  # the cap binds on some rows only
  # No row above the cap; rows the cap binds keep exactly 20 of their own chosen positions.
  np.testing.assert_array_equal(chosen.sum(-1), np.minimum(counts, 20))
  assert not (chosen & ~chosen_free).any()
  # Rows under the cap are untouched, targets and inputs included.
  under = counts <= 20
  for key in ("mlm_mask", "mlm_targets", "mlm_weights"):
    np.testing.assert_array_equal(capped[key][under], free[key][under])
  # Targets follow the kept positions; dropped ones are plain untargeted tokens.
  assert (capped["mlm_targets"][~chosen] == TOK.pad_id).all()
  np.testing.assert_array_equal(capped["mlm_targets"][chosen], batch["input_ids"][chosen])
  again = mask_tokens(batch, np.random.default_rng(4), TOK, rate=0.5, max_predictions=20)
  np.testing.assert_array_equal(again["mlm_mask"], chosen)  # deterministic from the seed
  with pytest.raises(ValueError, match="max_predictions"):
    mask_tokens(batch, np.random.default_rng(4), TOK, max_predictions=0)


def test_pretraining_targets_pass_the_cap(batch):
  out = pretraining_targets(batch, np.random.default_rng(2), TOK, mlm_rate=0.4, lop_rate=0.3,
                            max_predictions=10)
  assert out["mlm_mask"].sum(-1).max() == 10
