"""Pre-training targets: masked language modelling (MLM) and 1D local order prediction (1-LOP).

Both work on featurised windows (`flaxdoc.data.features.featurize`), one window
`[L]` or a batch `[B, L]`, with numpy and an explicit `np.random.Generator`, so
an input pipeline reproduces them exactly from a seed.

Only *real, non-special* tokens can be chosen: `attention_mask == 1` and
`word_ids >= 0` (so `[CLS]`, `[SEP]` and padding never are).

* MLM (BERT): each eligible token is chosen with probability `rate`; a chosen
  token becomes `[MASK]` with probability 0.8, a random non-special token with
  0.1, and stays itself with 0.1. The loss reads `mlm_targets` (the original
  ids) where `mlm_weights` is 1. With `max_predictions` no window holds more
  targets than that (BERT's `max_predictions_per_seq`): the trainer passes the
  number of positions the MLM head scores (`default_max_predictions`).
* 1-LOP (DocPolarBERT, DESIGN §3.4): each eligible token is chosen with
  probability `rate` (0.3); the model replaces its 1D position embedding by a
  learned mask-position vector (`lop_mask`) and predicts the index of its word
  inside its OCR segment, clipped to `0..max_index` (`lop_targets`, 11 classes
  by default).
"""

from __future__ import annotations

import math

import numpy as np


def _eligible(features: dict[str, np.ndarray]) -> np.ndarray:
  """Real, non-special tokens: `[..., L]` bool."""
  for key in ("input_ids", "attention_mask", "word_ids"):
    if key not in features:
      raise ValueError(f"features lack {key!r}; pass windows from flaxdoc.data.features.featurize")
  mask = np.asarray(features["attention_mask"])
  word_ids = np.asarray(features["word_ids"])
  if mask.shape != word_ids.shape or mask.shape != np.shape(features["input_ids"]):
    raise ValueError(f"features have inconsistent shapes: input_ids "
                     f"{np.shape(features['input_ids'])}, attention_mask {mask.shape}, word_ids {word_ids.shape}")
  return (mask > 0) & (word_ids >= 0)


def _check_rate(name: str, value: float):
  if not 0.0 <= value <= 1.0:
    raise ValueError(f"{name} must be in [0, 1], got {value}")


def random_non_special_ids(rng: np.random.Generator, shape, vocab_size: int,
                           special_ids) -> np.ndarray:
  """Uniform ids over `[0, vocab_size)` minus `special_ids`, without building the id list."""
  specials = np.unique(np.asarray(list(special_ids), np.int64))
  specials = specials[(specials >= 0) & (specials < vocab_size)]
  n = vocab_size - len(specials)
  if n <= 0:
    raise ValueError(f"vocabulary of {vocab_size} has no non-special id")
  ids = rng.integers(0, n, size=shape, dtype=np.int64)
  # Shift past each special in increasing order: maps [0, n) onto the allowed ids.
  for s in specials:
    ids += ids >= s
  return ids


def default_max_predictions(length: int, rate: float) -> int:
  """BERT's `max_predictions_per_seq` for windows of `length` at MLM rate `rate`.

  `ceil(1.5 * rate * length)`: the MLM head scores this many positions per window
  instead of all of them (at 15% on 1,024 tokens: 231, 4.4x fewer), and the cap
  almost never binds: the chosen count is Binomial(L, rate), and 1.5x its mean
  is 4.8 standard deviations above it at 512 tokens and 15%.
  """
  _check_rate("rate", rate)
  return min(int(length), max(1, math.ceil(1.5 * rate * length - 1e-9)))


def cap_per_row(chosen: np.ndarray, limit: int, rng: np.random.Generator) -> np.ndarray:
  """Keeps at most `limit` chosen positions per row, a uniform random subset (as BERT does)."""
  rows = chosen.reshape(-1, chosen.shape[-1])
  over = np.flatnonzero(rows.sum(-1) > limit)
  if not over.size:
    return chosen
  rows = rows.copy()
  for r in over:  # rare: only rows above the cap draw again
    idx = np.flatnonzero(rows[r])
    rows[r, rng.choice(idx, idx.size - limit, replace=False)] = False
  return rows.reshape(chosen.shape)


def mask_tokens(features: dict[str, np.ndarray], rng: np.random.Generator, tokenizer, *,
                rate: float = 0.15, mask_prob: float = 0.8,
                random_prob: float = 0.1,
                max_predictions: int | None = None) -> dict[str, np.ndarray]:
  """BERT masking on featurised windows; returns a new dict (the input is not changed).

  Returns the features with `input_ids` replaced and three keys added:
    mlm_targets  int32   the original id where chosen, `pad_id` elsewhere.
    mlm_weights  float32 1.0 where chosen, 0.0 elsewhere.
    mlm_mask     bool    where chosen (the same as `mlm_weights > 0`).

  Args:
    features: one window `[L]` or a batch `[B, L]` from `featurize`.
    rng: the random generator (the only source of randomness).
    tokenizer: gives `mask_id`, `vocab_size` and the special ids to avoid when
      drawing random replacements.
    rate: probability that an eligible token is chosen.
    mask_prob, random_prob: of the chosen, the share replaced by `[MASK]`, and
      by a random token; the rest keep their id.
    max_predictions: at most this many chosen per window (when the draw chose more,
      a uniform random subset of them is kept, as BERT does); None: no cap.
  """
  _check_rate("rate", rate)
  _check_rate("mask_prob", mask_prob)
  _check_rate("random_prob", random_prob)
  if mask_prob + random_prob > 1.0 + 1e-9:
    raise ValueError(f"mask_prob + random_prob must be <= 1, got {mask_prob} + {random_prob}")
  eligible = _eligible(features)
  ids = np.asarray(features["input_ids"])
  chosen = eligible & (rng.random(ids.shape) < rate)
  if max_predictions is not None:
    if isinstance(max_predictions, bool) or int(max_predictions) < 1:
      raise ValueError(f"max_predictions must be a positive integer or None, "
                       f"got {max_predictions!r}")
    chosen = cap_per_row(chosen, int(max_predictions), rng)
  action = rng.random(ids.shape)
  specials = (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id,
              tokenizer.mask_id)
  random_ids = random_non_special_ids(rng, ids.shape, int(tokenizer.vocab_size), specials)
  new_ids = np.where(chosen & (action < mask_prob), tokenizer.mask_id, ids)
  new_ids = np.where(chosen & (action >= mask_prob) & (action < mask_prob + random_prob),
                     random_ids, new_ids)
  out = dict(features)
  out["input_ids"] = new_ids.astype(np.int32)
  out["mlm_targets"] = np.where(chosen, ids, tokenizer.pad_id).astype(np.int32)
  out["mlm_weights"] = chosen.astype(np.float32)
  out["mlm_mask"] = chosen
  return out


def lop_targets(features: dict[str, np.ndarray], rng: np.random.Generator, *, rate: float = 0.3,
                max_index: int = 10) -> dict[str, np.ndarray]:
  """1-LOP targets on featurised windows; returns a new dict with three keys added:

    lop_mask     bool    tokens whose 1D position embedding the model hides.
    lop_targets  int32   `clip(token_in_segment, 0, max_index)` where hidden, 0 elsewhere.
    lop_weights  float32 1.0 where hidden, 0.0 elsewhere.
  """
  _check_rate("rate", rate)
  if max_index < 0:
    raise ValueError(f"max_index must be >= 0, got {max_index}")
  if "token_in_segment" not in features:
    raise ValueError("features lack 'token_in_segment'; pass windows from featurize")
  eligible = _eligible(features)
  tis = np.asarray(features["token_in_segment"])
  if tis.shape != eligible.shape:
    raise ValueError(f"token_in_segment has shape {tis.shape}, input_ids {eligible.shape}")
  eligible &= tis >= 0
  hidden = eligible & (rng.random(eligible.shape) < rate)
  out = dict(features)
  out["lop_mask"] = hidden
  out["lop_targets"] = np.where(hidden, np.clip(tis, 0, max_index), 0).astype(np.int32)
  out["lop_weights"] = hidden.astype(np.float32)
  return out


def pretraining_targets(features: dict[str, np.ndarray], rng: np.random.Generator, tokenizer, *,
                        mlm_rate: float = 0.15, lop_rate: float | None = None,
                        max_index: int = 10,
                        max_predictions: int | None = None) -> dict[str, np.ndarray]:
  """MLM and (when `lop_rate` is set) 1-LOP targets, drawn independently.

  DocPolarBERT uses `mlm_rate=0.3, lop_rate=0.3`; BERT-style models `mlm_rate=0.15`.
  `max_predictions` caps the MLM targets per window (`mask_tokens`).
  """
  out = mask_tokens(features, rng, tokenizer, rate=mlm_rate, max_predictions=max_predictions)
  if lop_rate is not None:
    out = lop_targets(out, rng, rate=lop_rate, max_index=max_index)
  return out
