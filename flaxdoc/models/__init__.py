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

from typing import Any, Mapping

import jax
import ml_collections
import numpy as np
from flax import linen as nn

from flaxdoc.layout.edge_features import NUM_EDGE_FEATURES
from flaxdoc.models import docpolarbert, formnet, lagabi, layoutlm, long_range
from flaxdoc.models.document_encoder import DocumentEncoder, EncoderSpec

# Edge features per neighbour of the featuriser's beta-skeleton graph (DESIGN §3.3);
# only used to build example batches (the GCN reads the width from the batch).
DEFAULT_EDGE_FEATURES = NUM_EDGE_FEATURES

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
  batch = example_batch(1, length, vocab_size=min(vocab_size, 100),
                        graph=needs_graph(model_config), pretraining=pretraining)
  return count_tree(abstract_parameters(model, batch))


def example_batch(batch_size: int, length: int, *, vocab_size: int = 100, num_tags: int = 5,
                  graph: bool = False, max_degree: int = 8,
                  edge_features: int = DEFAULT_EDGE_FEATURES, pretraining: bool = False,
                  num_pages: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
  """A random batch with the featuriser's keys and dtypes (for init, tests, benchmarks).

  Boxes are random word boxes (0..1000 per page), tokens spread over `num_pages`
  pages in order, the last quarter of the second row (if any) is padding.
  """
  rng = np.random.default_rng(seed)
  b, n = batch_size, length
  x0 = rng.integers(0, 900, (b, n))
  y0 = rng.integers(0, 980, (b, n))
  boxes = np.stack([x0, y0, x0 + rng.integers(5, 100, (b, n)), y0 + rng.integers(5, 20, (b, n))],
                   axis=-1).astype(np.int32)  # [B, N, 4]
  mask = np.ones((b, n), np.int32)
  if b > 1 and n > 3:
    mask[1, n - n // 4:] = 0
  pages = np.minimum(np.arange(n) * num_pages // max(n, 1), num_pages - 1)
  out = {
      "input_ids": rng.integers(5, vocab_size, (b, n)).astype(np.int32),
      "boxes": boxes,
      "page_ids": np.broadcast_to(pages, (b, n)).astype(np.int32).copy(),
      "segment_ids": np.broadcast_to(np.arange(n) // 4, (b, n)).astype(np.int32).copy(),
      "positions": np.broadcast_to(np.arange(n), (b, n)).astype(np.int32).copy(),
      "attention_mask": mask,
      "tags": np.where(mask > 0, rng.integers(0, num_tags, (b, n)), -1).astype(np.int32),
      "token_in_segment": np.broadcast_to(np.arange(n) % 4, (b, n)).astype(np.int32).copy(),
      "word_ids": np.where(mask > 0, np.arange(n), -1).astype(np.int32),
  }
  if graph:
    k = max_degree
    nb = rng.integers(0, n, (b, n, k)).astype(np.int32)
    nb_mask = (rng.random((b, n, k)) < 0.7) & (mask[:, :, None] > 0)
    out["neighbor_ids"] = np.where(nb_mask, nb, 0).astype(np.int32)
    out["neighbor_features"] = np.where(nb_mask[..., None],
                                        rng.normal(size=(b, n, k, edge_features)),
                                        0.0).astype(np.float32)
    out["neighbor_mask"] = nb_mask
  if pretraining:
    chosen = (rng.random((b, n)) < 0.3) & (mask > 0)
    out["mlm_targets"] = np.where(chosen, out["input_ids"], 0).astype(np.int32)
    out["mlm_weights"] = chosen.astype(np.float32)
    out["mlm_mask"] = chosen
    hidden = (rng.random((b, n)) < 0.3) & (mask > 0)
    out["lop_mask"] = hidden
    out["lop_targets"] = np.where(hidden, np.minimum(out["token_in_segment"], 10),
                                  0).astype(np.int32)
    out["lop_weights"] = hidden.astype(np.float32)
  return out


def abstract_parameters(model: nn.Module, batch: Mapping[str, Any]) -> Any:
  """The parameter tree as `ShapeDtypeStruct`s (`jax.eval_shape`: nothing is allocated)."""
  batch = {k: jax.ShapeDtypeStruct(np.shape(v), np.asarray(v).dtype) for k, v in batch.items()}
  variables = jax.eval_shape(
      lambda rng, b: model.init({"params": rng, "dropout": rng}, b, deterministic=True),
      jax.random.key(0), batch)
  return nn.unbox(variables["params"])


def count_tree(params: Any) -> int:
  return int(sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params)))


def random_parameters(model: nn.Module, batch: Mapping[str, Any], *, seed: int = 0,
                      stddev: float = 0.02) -> Any:
  """Parameters drawn with numpy instead of `model.init` (no PRNG graph to compile).

  Every leaf is `N(0, stddev^2)` except LayerNorm scales (`1 + N(0, stddev^2)`), so
  biases and learned scalars are non-zero too: good for numerical tests, and for
  benchmarks where compiling a 12-layer `init` would cost more than the measurement.
  Returns a plain (unboxed) parameter tree of float32 numpy arrays.
  """
  abstract = abstract_parameters(model, batch)
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    values = rng.normal(0.0, stddev, leaf.shape).astype(np.float32)
    if getattr(path[-1], "key", None) == "scale":
      values += 1.0
    return values

  return jax.tree_util.tree_map_with_path(draw, abstract)


__all__ = ["MODELS", "get_model_config", "build_model", "needs_graph", "count_parameters",
           "DocumentEncoder", "EncoderSpec", "example_batch", "abstract_parameters", "count_tree",
           "random_parameters", "DEFAULT_EDGE_FEATURES"]
