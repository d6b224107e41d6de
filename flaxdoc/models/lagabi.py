"""LAGaBi (Zhu et al., Findings of EMNLP 2023): Gaussian layout biases on any encoder.

DESIGN §3.5.

Each head has a 2D Gaussian kernel over the polar coordinates (`rho`, `theta`) of the
key's box corner seen from the query's (bottom-left corner by default, 0-1 units),
with four parameters `(mu_rho, mu_theta, sigma_rho, sigma_theta)` shared by all
layers; the attention score becomes `q.k / sqrt(d) + alpha (g - 1)`, `alpha = 4`.
That is 4 x 12 = 48 extra parameters on a base encoder - exactly, which the tests
check against the same encoder built with `gaussian=False`.

Variants name the encoder it is grafted on (all base-sized):

| variant | encoder | 2D embedding | paper |
|---|---|---|---|
| `roberta_base` | RoBERTa | none | "RoBERTa + LAGaBi, no layout pre-training" |
| `bert_base` | BERT | none | |
| `layoutlm_base` | LayoutLM | learned x, y, h, w tables | |

Options: `gaussian_corner` ("bottom_left" released / "top_left" paper / "center"),
`gaussian_alpha`.
"""

from __future__ import annotations

import ml_collections

from flaxdoc.models import document_encoder as de
from flaxdoc.models import layoutlm

NAME = "lagabi"
VARIANTS = {"roberta_base": "roberta", "bert_base": "bert", "layoutlm_base": "layoutlm"}
PAPER_EXTRA_PARAMETERS = 48  # 4 per head, 12 heads
MAX_LEN = 512


def model_config(variant: str = "roberta_base", local: bool = False
                 ) -> ml_collections.ConfigDict:
  """LAGaBi on the encoder named by `variant` (see the module docstring)."""
  if variant not in VARIANTS:
    raise ValueError(f"unknown LAGaBi variant {variant!r}; expected one of {sorted(VARIANTS)}")
  fields = layoutlm.text_encoder_fields(VARIANTS[variant], "base", local=local)
  return de.spec_config(name=NAME, variant=variant, gaussian=True,
                        gaussian_corner="bottom_left", gaussian_alpha=4.0, **fields)


def build(config: ml_collections.ConfigDict, *, vocab_size: int, num_tags: int, max_len: int,
          pretraining: bool, dtype: str = "float32"):
  """The LAGaBi module (a `DocumentEncoder` with a shared `GaussianTerm`)."""
  return de.build_document_encoder(config, vocab_size=vocab_size, num_tags=num_tags,
                                   max_len=max_len, pretraining=pretraining, dtype=dtype)
