"""DocPolarBERT (Uthayasooriyar et al., 2025): relative polar attention, no absolute 2D.

DESIGN §3.4.

A RoBERTa-base encoder (learned 1D absolute positions, 514 entries, offset 2) whose
self-attention adds three relative terms, each a learned vector per bucket shared by
all layers and heads, inside the `1/sqrt(d)`:

    score_ij = (q_i.k_j + q_i.r_1d[b1(i,j)] + q_i.r_dist[bd(i,j)] + q_i.r_angle[ba(i,j)]) / sqrt(d)

* 1D: T5 bidirectional buckets of the position offset (32 buckets, max distance 128);
* distance: Euclidean distance between box centres (pages stacked), bucketed by the
  quantiles (0, .25, .5, .75, 1) of the document's own pairwise distances
  (`polar_distance_pool="batch"`: the released code's batch-pooled quantiles);
* angle: the released 14 codes (`polar_angle="sectors8"`: the paper's 8 sectors).

There is no absolute 2D embedding (`position_2d="learned"` is the paper's ablation
that adds LayoutLM's). Pre-training: MLM with 30% masking plus 1-LOP (weight 0.5):
for the tokens in `batch["lop_mask"]` the 1D position embedding is replaced by a
learned mask-position vector and `"lop_logits" [B, L, 11]` predict the token's index
inside its OCR segment, clipped to 0..10.

Parameters: RoBERTa-base (vocabulary 50,265) without its pooler plus three small
tables (32 + 4 + 14 vectors of 64): about 124M (paper: 125M).
"""

from __future__ import annotations

import ml_collections

from flaxdoc.models import document_encoder as de
from flaxdoc.models import layoutlm

NAME = "docpolarbert"
VARIANTS = ("base",)
PAPER_PARAMETERS = {"base": 125e6}
PAPER_VOCAB_SIZE = layoutlm.TEXT_ENCODER_VOCAB["roberta"]
MAX_LEN = 512
# Pre-training rates of the paper (MLM 30%, 1-LOP on 30% of tokens, loss weight 0.5).
MLM_RATE = 0.3
LOP_RATE = 0.3


def model_config(variant: str = "base", local: bool = False) -> ml_collections.ConfigDict:
  """DocPolarBERT's model config ("base": RoBERTa-base sizes)."""
  if variant not in VARIANTS:
    raise ValueError(f"unknown DocPolarBERT variant {variant!r}; expected one of {VARIANTS}")
  fields = layoutlm.text_encoder_fields("roberta", "base", local=local)
  return de.spec_config(name=NAME, variant=variant, polar=True, polar_angle="released",
                        polar_distance_pool="document", polar_distance_buckets=4,
                        polar_1d_buckets=32, polar_1d_max_distance=128,
                        local_order_head=True, **fields)


def build(config: ml_collections.ConfigDict, *, vocab_size: int, num_tags: int, max_len: int,
          pretraining: bool, dtype: str = "float32"):
  """The DocPolarBERT module (a `DocumentEncoder` with a shared `PolarTerm`)."""
  if not config.get("polar", False):
    raise ValueError("config.model.polar (docpolarbert): must be True, the polar terms are the "
                     "model; use the 'layoutlm' or 'lagabi' families for other encoders")
  return de.build_document_encoder(config, vocab_size=vocab_size, num_tags=num_tags,
                                   max_len=max_len, pretraining=pretraining, dtype=dtype)
