"""LayoutLinformer and LayoutCosformer (Douzon et al., ICDAR-W 2023, DESIGN §3.6).

Both are LayoutLM (BERT + learned 2D tables) plus a learned page embedding, with the
self-attention swapped for a linear-cost one; all other weights are LayoutLM's, so a
LayoutLM checkpoint transfers.

* LayoutLinformer: keys and values projected along the sequence from `N` to `k` by
  learned per-layer matrices (`N = max_len = 2048`, `k = 512` in the paper). No 2D
  bias is possible (there is no `[N, N]` score).
* LayoutCosformer: ReLU linear attention with cosFormer's cos re-weighting, `O(N)`:
  "plain" (1D, `cos(pi/2M (i - j))`, `M = max_len`), "squircle" (the product of
  the x and y cosines over per-page box centres) or "cross" (two linear attentions,
  x and y, keeping the larger-magnitude output).

Both run on 2048-token windows in the paper ("long-range models ... sequence length
of 2048"), so their configs use `max_len = 2048`; the learned 1D table has 2048 rows.
`local=True` shrinks the model (and Linformer's `k` to 64).
"""

from __future__ import annotations

import types

import ml_collections

from flaxdoc.models import document_encoder as de
from flaxdoc.models import layoutlm

LINFORMER_NAME = "layout_linformer"
COSFORMER_NAME = "layout_cosformer"
MAX_LEN = 2048
LINFORMER_K = 512
LOCAL_LINFORMER_K = 64

# cosFormer re-weightings by variant suffix ("plain" is cosFormer's own 1D one).
COSFORMER_REWEIGHTS = {"plain": "1d", "squircle": "squircle", "cross": "cross", "none": "none"}


def _long_range_fields(size: str, local: bool) -> dict:
  fields = layoutlm.text_encoder_fields("layoutlm", size, local=local)
  fields.update(page_embedding=True, max_pages=64, max_position_embeddings=MAX_LEN)
  return fields


def _config(name: str, variant: str, local: bool, size: str, **overrides
            ) -> ml_collections.ConfigDict:
  fields = _long_range_fields(size, local)
  fields.update(overrides)
  return de.spec_config(name=name, variant=str(variant), **fields)


def _size(variant: str, family: str) -> tuple[str, str]:
  size, _, option = str(variant).partition("/")
  size = size.strip().lower()
  if size not in layoutlm.SIZES:
    raise ValueError(f"unknown {family} variant {variant!r}: size must be one of "
                     f"{sorted(layoutlm.SIZES)}")
  return size, option.strip().lower()


# --------------------------------------------------------------------------- Linformer
def linformer_config(variant: str = "base", local: bool = False) -> ml_collections.ConfigDict:
  """LayoutLinformer: `variant` "base" (or "large")."""
  size, option = _size(variant, LINFORMER_NAME)
  if option:
    raise ValueError(f"{LINFORMER_NAME} variant {variant!r} takes no option (no 2D bias is "
                     "possible with projected keys)")
  return _config(LINFORMER_NAME, variant, local, size, attention="linformer",
                 linformer_proj_length=LOCAL_LINFORMER_K if local else LINFORMER_K)


def build_linformer(config: ml_collections.ConfigDict, *, vocab_size: int, num_tags: int,
                    max_len: int, pretraining: bool, dtype: str = "float32"):
  """The LayoutLinformer module; its projections are sized for `max_len` tokens."""
  k = int(config.get("linformer_proj_length", LINFORMER_K))
  if k > max_len:
    raise ValueError(f"config.model.linformer_proj_length ({LINFORMER_NAME}): k={k} exceeds "
                     f"max_len={max_len}; a projection cannot add positions")
  return de.build_document_encoder(config, vocab_size=vocab_size, num_tags=num_tags,
                                   max_len=max_len, pretraining=pretraining, dtype=dtype)


# --------------------------------------------------------------------------- cosFormer
def cosformer_config(variant: str = "base", local: bool = False) -> ml_collections.ConfigDict:
  """LayoutCosformer: `variant` "base" (plain 1D), "base/squircle" or "base/cross"."""
  size, option = _size(variant, COSFORMER_NAME)
  option = option or "plain"
  if option not in COSFORMER_REWEIGHTS:
    raise ValueError(f"unknown {COSFORMER_NAME} re-weighting {option!r} in variant "
                     f"{variant!r}; expected one of {sorted(COSFORMER_REWEIGHTS)}")
  return _config(COSFORMER_NAME, variant, local, size, attention="cosformer",
                 cosformer_reweight=COSFORMER_REWEIGHTS[option])


def build_cosformer(config: ml_collections.ConfigDict, *, vocab_size: int, num_tags: int,
                    max_len: int, pretraining: bool, dtype: str = "float32"):
  """The LayoutCosformer module."""
  return de.build_document_encoder(config, vocab_size=vocab_size, num_tags=num_tags,
                                   max_len=max_len, pretraining=pretraining, dtype=dtype)


# Registry entries (`flaxdoc.models.MODELS`): one per family, same interface as the
# per-paper modules (`NAME`, `MAX_LEN`, `model_config`, `build`).
linformer_family = types.SimpleNamespace(NAME=LINFORMER_NAME, MAX_LEN=MAX_LEN,
                                         model_config=linformer_config, build=build_linformer)
cosformer_family = types.SimpleNamespace(NAME=COSFORMER_NAME, MAX_LEN=MAX_LEN,
                                         model_config=cosformer_config, build=build_cosformer)
