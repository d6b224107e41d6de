"""LayoutLM (Xu et al., 2020) and its layout variants: 2D relative biases and LSPE positions.

The base model is BERT plus learned 2D tables (x0 and x1 share the x table, y0 and y1
the y table, plus height and width), dense self-attention and a token tagging head.
Two model fields select the variants of the papers built on it:

* `bias` - Douzon et al.'s fixed 2D relative attention (DESIGN §3.6): "none",
  "squircle" (`cos(pi/2 dx/1000) cos(pi/2 dy/1000)`) or "cross"
  (`max` of the two cosines), added as `log(max(w, 1e-5))` to the softmax logits,
  the same for every head and layer (no parameters). For long documents combine it
  with the data config's `split="page"` ("LayoutLM SplitPage").
* `positions` - the positional encodings compared by the LSPE paper (DESIGN §3.7):
  "learnvec" (LayoutLM's learned tables), "sine" (fixed sinusoids for the 1D index
  and for x0, y0, x1, y1), "lspe" (`W2 gelu(W1 PE_sine(p) + b1) + b2`, one network
  for the 1D index and one each for x and y) and "lspe_sc" (LSPE plus the sine skip
  connection). The LSPE augmentations (block shuffling, neighbour swapping) are
  data options (`config.data.block_shuffle`, `config.data.neighbour_swap`).

`build` resolves `bias` and `positions` into the encoder fields, so
`--config.model.positions=lspe_sc` works after the config is made.

This file also holds the BERT-family presets (`SIZES`, `TEXT_ENCODERS`) that
DocPolarBERT (RoBERTa), LAGaBi (RoBERTa / BERT / LayoutLM) and the long-range models
start from.
"""

from __future__ import annotations

import ml_collections

from flaxdoc.models import document_encoder as de

# Sizes of the text encoders the papers start from (their Hugging Face configs).
SIZES = {
    "base": dict(width=768, depth=12, num_heads=12, mlp_dim=3072),
    "large": dict(width=1024, depth=24, num_heads=16, mlp_dim=4096),
}
# CPU-sized stand-in used by `local=True` configs.
LOCAL_SIZE = dict(width=128, depth=2, num_heads=4, mlp_dim=512)

# Embedding / normalisation conventions of each pre-trained text encoder.
TEXT_ENCODERS = {
    # RoBERTa: 514 learned positions, ids start at padding_idx + 1 = 2; one token type.
    "roberta": dict(position_1d="learned", position_2d="none", box_size=False,
                    max_position_embeddings=514, position_offset=2, type_vocab_size=1,
                    layer_norm_epsilon=1e-5),
    "bert": dict(position_1d="learned", position_2d="none", box_size=False,
                 max_position_embeddings=512, position_offset=0, type_vocab_size=2,
                 layer_norm_epsilon=1e-12),
    # LayoutLM = BERT + 2D tables for x, y, height and width (1024 entries each).
    "layoutlm": dict(position_1d="learned", position_2d="learned", box_size=True,
                     max_position_embeddings=512, position_offset=0, type_vocab_size=2,
                     layer_norm_epsilon=1e-12),
}
# Their vocabularies (for parameter counts against the papers).
TEXT_ENCODER_VOCAB = {"roberta": 50_265, "bert": 30_522, "layoutlm": 30_522}


def text_encoder_fields(encoder: str, size: str = "base", local: bool = False) -> dict:
  """Spec fields of a BERT-family text encoder of the given size (`local`: CPU-sized)."""
  if encoder not in TEXT_ENCODERS:
    raise ValueError(f"unknown text encoder {encoder!r}; expected one of {sorted(TEXT_ENCODERS)}")
  if size not in SIZES:
    raise ValueError(f"unknown size {size!r}; expected one of {sorted(SIZES)}")
  fields = dict(TEXT_ENCODERS[encoder])
  fields.update(LOCAL_SIZE if local else SIZES[size])
  fields.update(attention="dense", dropout_rate=0.1, attention_dropout_rate=0.1)
  return fields


NAME = "layoutlm"
VARIANTS = tuple(SIZES)  # "base", "large"
MAX_LEN = 512
PAPER_VOCAB_SIZE = TEXT_ENCODER_VOCAB["layoutlm"]

BIASES = ("none", "squircle", "cross")
# positions -> (position_1d, position_2d, box_size)
POSITIONS = {
    "learnvec": ("learned", "learned", True),
    "sine": ("sine", "sine", False),
    "lspe": ("lspe", "lspe", False),
    "lspe_sc": ("lspe_skip", "lspe_skip", False),
}


def decode_variant(variant: str) -> tuple[str, dict]:
  """`"base"` or `"base/squircle"`, `"base/lspe_sc"`, `"base/cross/lspe"` -> (size, fields)."""
  size, *options = [p.strip().lower() for p in str(variant).split("/")]
  if size not in SIZES:
    raise ValueError(f"unknown LayoutLM variant {variant!r}: size must be one of "
                     f"{sorted(SIZES)} (optionally '/<bias>' and/or '/<positions>')")
  fields = {}
  for option in options:
    if option in BIASES:
      fields["bias"] = option
    elif option in POSITIONS:
      fields["positions"] = option
    else:
      raise ValueError(f"unknown LayoutLM option {option!r} in variant {variant!r}; expected a "
                       f"bias {BIASES} or positions {sorted(POSITIONS)}")
  return size, fields


def resolve(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Copy of `config` with `bias` / `positions` written into the encoder fields."""
  config = ml_collections.ConfigDict(config.to_dict())
  bias = config.get("bias", "none")
  if bias not in BIASES:
    raise ValueError(f"config.model.bias ({NAME}): {bias!r} is not one of {BIASES}")
  positions = config.get("positions", "learnvec")
  if positions not in POSITIONS:
    raise ValueError(f"config.model.positions ({NAME}): {positions!r} is not one of "
                     f"{sorted(POSITIONS)}")
  config.fixed_bias = bias
  config.position_1d, config.position_2d, config.box_size = POSITIONS[positions]
  return config


def model_config(variant: str = "base", local: bool = False) -> ml_collections.ConfigDict:
  """LayoutLM's config: `variant` "base" or "large", optionally "/<bias>" and "/<positions>"."""
  size, options = decode_variant(variant)
  fields = text_encoder_fields("layoutlm", size, local=local)
  c = de.spec_config(name=NAME, variant=str(variant), **fields)
  c.bias = options.get("bias", "none")
  c.positions = options.get("positions", "learnvec")
  return resolve(c)


def build(config: ml_collections.ConfigDict, *, vocab_size: int, num_tags: int, max_len: int,
          pretraining: bool, dtype: str = "float32"):
  """The LayoutLM module (a dense `DocumentEncoder`), after resolving `bias` and `positions`."""
  return de.build_document_encoder(resolve(config), vocab_size=vocab_size, num_tags=num_tags,
                                   max_len=max_len, pretraining=pretraining, dtype=dtype)
