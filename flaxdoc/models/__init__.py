"""Every paper's model as a configuration of one document encoder (DESIGN §1, §3, §4).

    config = get_model_config("formnet", "A2")            # ml_collections, `name` included
    model = build_model(config, vocab_size=119_547, num_tags=13, max_len=1024,
                        pretraining=False, dtype="bfloat16")
    outputs = model.apply(variables, batch)                # {"tag_logits": [B, L, T], ...}

| name | variants | file | paper |
|---|---|---|---|
| `formnet` | A1, A2, A3 (+ `/etc`, `/etc_rich`, `/etc_gcn` ablations) | `formnet.py` | Lee et al. 2022 |
| `docpolarbert` | base | `docpolarbert.py` | Uthayasooriyar et al. 2025 |
| `lagabi` | roberta_base, bert_base, layoutlm_base | `lagabi.py` | Zhu et al. 2023 |
| `layoutlm` | base, large (+ `bias`, `positions` fields) | `layoutlm.py` | Xu et al. 2020; Douzon et al. 2023; LSPE |
| `layout_linformer` | base | `long_range.py` | Douzon et al. 2023 |
| `layout_cosformer` | base, base/squircle, base/cross | `long_range.py` | Douzon et al. 2023 |

A model is built from its config by name: `MODELS[name].build(config, ...)`. Every
family builds a `flaxdoc.models.document_encoder.DocumentEncoder`, whose
`__call__(batch, deterministic=True)` takes the featuriser's batch and returns
`"tag_logits"` (and `"mlm_logits"`, `"lop_logits"` when pre-training).
"""

from __future__ import annotations

from typing import Any

import ml_collections
from flax import linen as nn

from flaxdoc.models import docpolarbert, formnet, lagabi, layoutlm, long_range
from flaxdoc.models.document_encoder import (DocumentEncoder, EncoderSpec, abstract_parameters,
                                             count_tree, example_batch)

# name -> family module with `model_config(variant, local)` and `build(config, ...)`.
MODELS: dict[str, Any] = {
    formnet.NAME: formnet,
    docpolarbert.NAME: docpolarbert,
    lagabi.NAME: lagabi,
    layoutlm.NAME: layoutlm,
    long_range.LINFORMER_NAME: long_range.linformer_family,
    long_range.COSFORMER_NAME: long_range.cosformer_family,
}


def _family(name: str):
  if name not in MODELS:
    raise ValueError(f"unknown model {name!r}; expected one of {sorted(MODELS)}")
  return MODELS[name]


def get_model_config(name: str, variant: str, local: bool = False) -> ml_collections.ConfigDict:
  """The model config of family `name`, size `variant` (`local=True`: CPU-sized)."""
  config = _family(name).model_config(variant, local=local)
  config.name = name
  return config


def build_model(model_config: ml_collections.ConfigDict, *, vocab_size: int, num_tags: int,
                max_len: int, pretraining: bool, dtype: str = "float32") -> nn.Module:
  """The Linen module for `model_config` (looked up by `model_config.name`).

  Args:
    model_config: from `get_model_config` (possibly overridden field by field).
    vocab_size: the tokenizer's vocabulary (token table rows, MLM outputs).
    num_tags: tag vocabulary size.
    max_len: the featuriser's window length.
    pretraining: add the MLM (and, for DocPolarBERT, 1-LOP) heads.
    dtype: compute dtype, "float32" or "bfloat16" (parameters stay float32).

  Raises:
    ValueError: unknown name, or a config field that cannot work (the message names it).
  """
  name = model_config.get("name")
  if not name:
    raise ValueError("model config has no 'name'; build it with flaxdoc.models.get_model_config")
  return _family(name).build(model_config, vocab_size=vocab_size, num_tags=num_tags,
                             max_len=max_len, pretraining=pretraining, dtype=dtype)


def needs_graph(model_config: ml_collections.ConfigDict) -> bool:
  """True when the model reads the featuriser's neighbour arrays (FormNet with GCN layers)."""
  return int(model_config.get("gcn_layers", 0) or 0) > 0


def count_parameters(model_config: ml_collections.ConfigDict, *, vocab_size: int,
                     max_len: int | None = None, num_tags: int = 2,
                     pretraining: bool = False) -> int:
  """Number of parameters of the built model, from `jax.eval_shape` (nothing allocated).

  `max_len` defaults to the family's (FormNet 1024, Linformer 2048, others 512); it
  matters only for Linformer's projections. Short example sequences are used for
  the shapes, so this is cheap even for the largest variants.
  """
  name = model_config.get("name")
  if max_len is None:
    max_len = int(getattr(_family(name), "MAX_LEN", 512))
  # Scanned layers have the same parameters, stacked: tracing one layer is much faster.
  model_config = ml_collections.ConfigDict(model_config.to_dict())
  model_config.scan_layers = True
  model = build_model(model_config, vocab_size=vocab_size, num_tags=num_tags, max_len=max_len,
                      pretraining=pretraining, dtype="float32")
  # Linformer's projections are sized by max_len, whatever the input length.
  length = min(max_len, 64)
  batch = example_batch(1, length, vocab_size=min(vocab_size, 100), graph=needs_graph(model_config),
                        pretraining=pretraining)
  return count_tree(abstract_parameters(model, batch))


__all__ = ["MODELS", "get_model_config", "build_model", "needs_graph", "count_parameters",
           "DocumentEncoder", "EncoderSpec", "example_batch", "abstract_parameters", "count_tree"]
