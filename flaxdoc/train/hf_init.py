"""`init_from=hf:DIR`: start any flaxdoc model from a local Hugging Face checkpoint.

    python -m flaxdoc.main --config=configs/formnet_a2.py:dataset=funsd \
        --config.init_from=hf:models/all-MiniLM-L6-v2 --workdir=/tmp/x

Three things happen, so that no other flag is needed:

1. `resolve_config` (once, in `flaxdoc.train.setup.Experiment.create`, the entry every
   mode goes through; the run's `config.json` is written from it): the model's sizes
   come from the checkpoint's `config.json` - width, heads, MLP, LayerNorm epsilon,
   and, for models with learned 1D positions, the position table, RoBERTa's position
   offset and the type vocabulary - overriding the variant table. Depth is the
   smaller of the variant's and the checkpoint's ("the checkpoint's depth wins when
   smaller"); FormNet's GCN depth follows it. `data.tokenizer` becomes `hf:DIR`
   unless set. Every change is logged, and the written `WORKDIR/config.json` holds
   `init_from` (made absolute first, `setup.absolute_paths`) and the resolved sizes and
   tokenizer: export reads it, and eval /
   predict / resume take the run's `init_from` from it when the command names none
   (`flaxdoc.train.setup.with_the_runs_record`).
2. `import_params` (after initialisation, not on resume): the checkpoint's tensors
   replace the fresh ones through `flaxdoc.models.hf_checkpoint`, for every family: the
   dense encoders (LAGaBi, DocPolarBERT, LayoutLM and its LSPE / squircle / cross
   variants) take embeddings and layers; Linformer / cosFormer take the shared layer
   tensors, their own projections stay new; FormNet is *lifted* as ETC lifts RoBERTa:
   word embeddings, Q/K/V/out, feed-forward and LayerNorms go into the ETC layers,
   while Rich Attention, the GCN, the global token and the heads are new and the
   absolute position / token type tables are reported unused (FormNet has none).
   The report (mapped / new / unused tensors) is logged and written to
   `WORKDIR/init_report.json`.
3. `pretrained_mask`: which parameters came from the checkpoint, for the recipe
   options `optim.pretrained_lr_scale` and `optim.freeze_pretrained_steps`
   (`flaxdoc.train.optimizer`).

`init_from=DIR` without the prefix keeps meaning a flaxdoc pre-training run.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
from typing import Any, Callable

import jax
import ml_collections
import numpy as np

from flaxdoc.models import hf_checkpoint
from flaxdoc.train.config_error import ConfigError

log = logging.getLogger(__name__)

HF_PREFIX = "hf:"


def hf_folder(init_from: str | None) -> str | None:
  """The checkpoint folder of an `hf:DIR` spec, None for anything else."""
  if init_from and str(init_from).startswith(HF_PREFIX):
    folder = str(init_from)[len(HF_PREFIX):]
    if not folder:
      raise ConfigError("config.init_from='hf:': names no folder; expected hf:DIR")
    return os.path.expanduser(folder)
  return None


@functools.lru_cache(maxsize=8)
def read_hf_config(folder: str) -> dict:
  """The checkpoint's `config.json`, read once per process (errors name the flag and folder)."""
  try:
    return hf_checkpoint.read_config(folder)
  except hf_checkpoint.HFImportError as e:
    raise hf_checkpoint.HFImportError(f"config.init_from=hf:{folder}: {e}") from None


def _uses_learned_positions(model: ml_collections.ConfigDict) -> bool:
  return model.get("position_1d", "learned") == "learned"


def resolve_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` with the checkpoint's sizes and tokenizer (a copy; `config` itself if not `hf:`).

  Idempotent: a resolved config resolves to the same values, with nothing logged.
  """
  folder = hf_folder(config.get("init_from"))
  if folder is None:
    return config
  hf = read_hf_config(folder)
  sizes = hf_checkpoint.model_config_overrides(hf, folder)
  out = copy.deepcopy(config)
  m = out.model
  changes = {}

  def put(node, key, value, prefix):
    if node.get(key) != value:
      changes[f"{prefix}{key}"] = (node.get(key), value)
    node[key] = value

  depth = min(int(m.depth), sizes["depth"])
  put(m, "depth", depth, "model.")
  for key in ("width", "num_heads", "mlp_dim", "layer_norm_epsilon"):
    put(m, key, sizes[key], "model.")
  if _uses_learned_positions(m):
    for key in ("max_position_embeddings", "position_offset"):
      put(m, key, sizes[key], "model.")
  if int(m.get("type_vocab_size", 0) or 0) > 0:
    put(m, "type_vocab_size", sizes["type_vocab_size"], "model.")
  if int(m.get("gcn_layers", 0) or 0) > depth:  # FormNet: one GCN layer per ETC layer at most
    put(m, "gcn_layers", depth, "model.")
  if "gcn_depth" in m and int(m.gcn_depth) > depth:
    put(m, "gcn_depth", depth, "model.")
  if out.data.get("tokenizer") in (None, "", "default"):
    put(out.data, "tokenizer", f"{HF_PREFIX}{folder}", "data.")
  if changes and jax.process_index() == 0:
    log.info("init_from=hf:%s (%s, %d layers): %s", folder, hf.get("model_type"),
             sizes["depth"], ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changes.items()))
  return out


def check_vocabulary(config: ml_collections.ConfigDict, tokenizer) -> int:
  """The token-table size to build: the checkpoint's (errors name folder and field)."""
  folder = hf_folder(config.get("init_from"))
  if folder is None:
    return int(tokenizer.vocab_size)
  hf = read_hf_config(folder)
  rows = int(hf.get("vocab_size", tokenizer.vocab_size))
  if tokenizer.vocab_size > rows:
    raise hf_checkpoint.HFImportError(
        f"{os.path.join(folder, 'config.json')}: field 'vocab_size' is {rows}, but the tokenizer "
        f"({config.data.tokenizer}) has {tokenizer.vocab_size} pieces: its ids would index past "
        "the checkpoint's word_embeddings; use the folder's own tokenizer (leave "
        "config.data.tokenizer unset)")
  # A checkpoint may pad its table past the tokenizer (unused rows are harmless).
  return rows


@functools.lru_cache(maxsize=4)
def _mapped_names(folder: str) -> frozenset:
  # The checkpoint's own head count: the one resolve_config gives the model, so the
  # mask needs no resolved config (eval / predict pass theirs before or after resolving).
  heads = int(hf_checkpoint.required_field(read_hf_config(folder), "num_attention_heads", folder))
  converted, _ = hf_checkpoint.convert_state_dict(hf_checkpoint.read_weights(folder), heads)
  return frozenset(converted)


def _path_name(path) -> str:
  return ".".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path
                  if hasattr(k, "key"))


def pretrained_mask(config: ml_collections.ConfigDict) -> Callable[[Any], Any] | None:
  """`params -> tree of bool` (True: the parameter comes from the checkpoint), or None.

  None when the run does not start from `hf:` or no recipe option needs the mask,
  so the optimiser (and its checkpoints) stay as they were.
  """
  folder = hf_folder(config.get("init_from"))
  o = config.optim
  scale = o.get("pretrained_lr_scale", 1.0)
  freeze = int(o.get("freeze_pretrained_steps", 0) or 0)
  if scale is None:
    scale = 1.0
  if float(scale) == 1.0 and freeze == 0:
    return None
  if folder is None:
    raise ConfigError("config.optim.pretrained_lr_scale / freeze_pretrained_steps need "
                     "config.init_from=hf:DIR (they act on the imported parameters)")
  names = _mapped_names(folder)

  def mask(params):
    return jax.tree_util.tree_map_with_path(lambda p, _: _path_name(p) in names, params)
  return mask


def import_params(config: ml_collections.ConfigDict, params: Any, workdir: str | None = None
                  ) -> tuple[Any, Any]:
  """The checkpoint's tensors merged into `params` (same tree, shardings kept); and the report.

  `config` is the resolved config (`resolve_config`). Writes `WORKDIR/init_report.json`.
  """
  folder = hf_folder(config.init_from)
  hf = read_hf_config(folder)
  merged, report = hf_checkpoint.import_state_dict(
      hf_checkpoint.read_weights(folder), params, num_heads=int(config.model.num_heads),
      architecture_name=hf_checkpoint.architecture(hf, folder), source=folder)
  flat = hf_checkpoint.flat_params(merged)

  def place(path, old):
    new = np.asarray(flat[_path_name(path)], dtype=old.dtype)
    sharding = getattr(old, "sharding", None)
    return jax.device_put(new, sharding) if sharding is not None else new
  out = jax.tree_util.tree_map_with_path(place, params)
  if jax.process_index() == 0:
    log.info("init_from=hf:%s: %s", folder, report.summary())
    if config.model.get("name") == "formnet":
      log.info("FormNet lifted from %s: Rich Attention, GCN, global token and heads are new; "
               "absolute positions and token types are unused (ETC/Rich Attention replace them)",
               hf.get("model_type"))
    if workdir:
      write_report(report, folder, hf, os.path.join(workdir, "init_report.json"))
  return out, report


def write_report(report, folder: str, hf: dict, path: str):
  """`init_report.json`: counts, then every tensor name under mapped / new / unused."""
  from etils import epath  # pylint: disable=import-outside-toplevel
  body = {"init_from": f"{HF_PREFIX}{folder}", "model_type": hf.get("model_type"),
          "architecture": report.architecture,
          "counts": {"mapped": len(report.mapped), "new": len(report.new),
                     "unused": len(report.unused)},
          "mapped": report.mapped, "new": report.new, "unused": report.unused}
  p = epath.Path(path)
  p.parent.mkdir(parents=True, exist_ok=True)
  p.write_text(json.dumps(body, indent=1))
