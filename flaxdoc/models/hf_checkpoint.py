"""Hugging Face RoBERTa / BERT / LayoutLM checkpoint folders -> flaxdoc parameter names.

The reading and the name/layout mapping that both `init_from=hf:DIR`
(`flaxdoc.train.hf_init`) and the user-facing importer (`flaxdoc.export.hf_import`,
which re-exports these names) need. It lives in the models layer because it maps
HF tensors onto flaxdoc model parameters, so training can use it without importing
the interop layer (DESIGN §1: train sits below export).

Sources: a local directory with `config.json` and `model.safetensors` (preferred)
or `pytorch_model.bin` (read with `torch.load(weights_only=True)` only: never a
general unpickle), or an already-loaded state dict `{name: array}`. Nothing is
downloaded.

Layout conversions (torch `Linear.weight` is `[out, in]`):
`query/key/value.weight [E, E]` -> `kernel [E, H, D]` (= `W.T` reshaped),
`attention.output.dense.weight` -> `out.kernel [H, D, E]`, `LayerNorm.weight` ->
`scale`, embeddings `weight` -> `embedding`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Mapping

import numpy as np
from flax import traverse_util
from flax.linen import meta as flax_meta

ARCHITECTURES = ("roberta", "bert", "layoutlm")
_PREFIXES = ("roberta.", "bert.", "layoutlm.")
_EMBEDDING_TABLES = ("word_embeddings", "position_embeddings", "token_type_embeddings",
                     "x_position_embeddings", "y_position_embeddings",
                     "h_position_embeddings", "w_position_embeddings")
SEPARATOR = "."  # flaxdoc tensor names join the parameter path with dots (as export does)


class HFImportError(ValueError):
  """A checkpoint that cannot be read or does not fit the flaxdoc model (names the tensor)."""


@dataclasses.dataclass
class ImportReport:
  """What the import did, tensor by tensor (flaxdoc names for mapped / new, HF for unused)."""
  architecture: str
  mapped: list[str]
  new: list[str]
  unused: list[str]

  def summary(self) -> str:
    def few(names):
      return ", ".join(names[:12]) + (" ..." if len(names) > 12 else "")
    return (f"{self.architecture}: {len(self.mapped)} tensors mapped, {len(self.new)} new "
            f"({few(self.new)}), {len(self.unused)} unused ({few(self.unused)})")


# ----------------------------------------------------------------------------- reading
def read_config(folder: str | os.PathLike) -> dict[str, Any]:
  """The folder's `config.json` as a dict (the one place it is read; errors name the file)."""
  folder = os.fspath(folder)
  if not os.path.isdir(folder):
    raise HFImportError(f"{folder!r} is not a directory (expected a Hugging Face checkpoint "
                        "folder: config.json + model.safetensors or pytorch_model.bin; nothing "
                        "is downloaded)")
  path = os.path.join(folder, "config.json")
  if not os.path.isfile(path):
    raise HFImportError(f"{path} not found (a Hugging Face checkpoint folder holds config.json "
                        "beside its weights)")
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except json.JSONDecodeError as e:
    raise HFImportError(f"{path}: not valid JSON ({e})") from None
  if not isinstance(value, dict):
    raise HFImportError(f"{path}: expected a JSON object")
  return value


def read_weights(folder: str | os.PathLike) -> dict[str, np.ndarray]:
  """The folder's state dict as float32 numpy (`model.safetensors`, else `pytorch_model.bin`)."""
  folder = os.fspath(folder)
  st = os.path.join(folder, "model.safetensors")
  binary = os.path.join(folder, "pytorch_model.bin")
  if os.path.exists(st):
    from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
    state = load_file(st)
  elif os.path.exists(binary):
    import torch  # pylint: disable=import-outside-toplevel
    # weights_only=True: tensors and plain containers only, no arbitrary unpickling.
    loaded = torch.load(binary, map_location="cpu", weights_only=True)
    state = {k: v.detach().to(torch.float32).numpy() for k, v in loaded.items()}
  else:
    raise HFImportError(f"{folder}: neither model.safetensors nor pytorch_model.bin found")
  return {k: np.asarray(v, np.float32) for k, v in state.items()}


def read_checkpoint(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """(HF config dict, state dict as float32 numpy) from a local checkpoint directory."""
  return read_config(path), read_weights(path)


def architecture(hf_config: Mapping[str, Any], folder: str | os.PathLike | None = None) -> str:
  """"roberta" | "bert" | "layoutlm" from the HF `model_type` (XLM-R counts as RoBERTa)."""
  kind = str(hf_config.get("model_type", "")).lower()
  if kind in ("xlm-roberta", "camembert"):
    kind = "roberta"
  if kind not in ARCHITECTURES:
    where = f"{os.path.join(os.fspath(folder), 'config.json')}: " if folder is not None else ""
    raise HFImportError(f"{where}model_type {kind!r} is not supported; flaxdoc takes the "
                        f"encoder layers of {ARCHITECTURES} (and xlm-roberta, camembert)")
  return kind


def required_field(hf_config: Mapping[str, Any], key: str, folder=None):
  """`hf_config[key]`; a missing field names the file."""
  if key not in hf_config:
    where = os.path.join(os.fspath(folder), "config.json") if folder is not None else "config"
    raise HFImportError(f"{where}: field {key!r} is missing")
  return hf_config[key]


def model_config_overrides(hf_config: Mapping[str, Any], folder: str | os.PathLike | None = None
                           ) -> dict[str, Any]:
  """flaxdoc model-config fields that make an encoder the checkpoint's size.

  `folder` (the checkpoint directory) names the file in errors.
  """
  arch = architecture(hf_config, folder)
  where = os.path.join(os.fspath(folder), "config.json") if folder is not None else "config"

  def integer(key, default=None):
    value = (hf_config.get(key, default) if default is not None
             else required_field(hf_config, key, folder))
    try:
      return int(value)
    except (TypeError, ValueError):
      raise HFImportError(f"{where}: field {key!r} must be an integer, got {value!r}") from None

  act = hf_config.get("hidden_act", "gelu")
  if act != "gelu":
    raise HFImportError(f"{where}: field 'hidden_act' is {act!r}; flaxdoc layers use the exact "
                        "(erf) GELU ('gelu'), so this checkpoint's outputs cannot be reproduced")
  kind = hf_config.get("position_embedding_type", "absolute")
  if kind not in (None, "absolute"):
    raise HFImportError(f"{where}: field 'position_embedding_type' is {kind!r}; flaxdoc imports "
                        "absolute learned positions only")
  out = {"width": integer("hidden_size"), "depth": integer("num_hidden_layers"),
         "num_heads": integer("num_attention_heads"),
         "mlp_dim": integer("intermediate_size"),
         "max_position_embeddings": integer("max_position_embeddings"),
         "type_vocab_size": integer("type_vocab_size", 2),
         "layer_norm_epsilon": float(hf_config.get("layer_norm_eps", 1e-12)),
         # RoBERTa numbers positions from padding_idx + 1; BERT and LayoutLM from 0.
         "position_offset": integer("pad_token_id", 1) + 1 if arch == "roberta" else 0}
  return out


# ----------------------------------------------------------------------------- names
def _strip(name: str) -> str:
  for prefix in _PREFIXES:
    if name.startswith(prefix):
      return name[len(prefix):]
  return name


def convert_state_dict(state: Mapping[str, Any], num_heads: int
                       ) -> tuple[dict[str, np.ndarray], list[str]]:
  """HF names/layouts -> flaxdoc flat names/layouts; returns (converted, unused HF names)."""
  out: dict[str, np.ndarray] = {}
  unused: list[str] = []
  layer_re = re.compile(r"encoder\.layer\.(\d+)\.(.+)")
  for raw, value in state.items():
    value = np.asarray(value, np.float32)
    name = _strip(raw)
    m = layer_re.fullmatch(name)
    if name.startswith("embeddings."):
      rest = name[len("embeddings."):]
      table = rest.rsplit(".", 1)[0]
      if table in _EMBEDDING_TABLES and rest.endswith(".weight"):
        out[f"embeddings.{table}.embedding"] = value
      elif rest == "LayerNorm.weight":
        out["embeddings.layer_norm.scale"] = value
      elif rest == "LayerNorm.bias":
        out["embeddings.layer_norm.bias"] = value
      else:
        unused.append(raw)
      continue
    if not m:
      unused.append(raw)
      continue
    layer, rest = f"encoder.layer_{m.group(1)}", m.group(2)
    converted = _convert_layer_tensor(rest, value, num_heads)
    if converted is None:
      unused.append(raw)
    else:
      out[f"{layer}.{converted[0]}"] = converted[1]
  return out, sorted(unused)


def _convert_layer_tensor(rest: str, value: np.ndarray, heads: int):
  simple = {"attention.output.LayerNorm.weight": "attention_norm.scale",
            "attention.output.LayerNorm.bias": "attention_norm.bias",
            "output.LayerNorm.weight": "mlp_norm.scale", "output.LayerNorm.bias": "mlp_norm.bias",
            "intermediate.dense.bias": "mlp_in.bias", "output.dense.bias": "mlp_out.bias",
            "attention.output.dense.bias": "attention.out.bias"}
  if rest in simple:
    return simple[rest], value
  if rest == "intermediate.dense.weight":
    return "mlp_in.kernel", value.T
  if rest == "output.dense.weight":
    return "mlp_out.kernel", value.T
  if rest == "attention.output.dense.weight":
    width = value.shape[0]
    return "attention.out.kernel", value.T.reshape(heads, -1, width)  # [H, D, E]
  m = re.fullmatch(r"attention\.self\.(query|key|value)\.(weight|bias)", rest)
  if m:
    proj, kind = m.groups()
    if kind == "weight":
      return f"attention.{proj}.kernel", value.T.reshape(value.shape[1], heads, -1)  # [E, H, D]
    return f"attention.{proj}.bias", value.reshape(heads, -1)  # [H, D]
  return None


def _hf_names(state: Mapping[str, Any]) -> dict[str, str]:
  """flaxdoc name -> the HF tensor name it came from (for error messages)."""
  out = {}
  for raw in state:
    single = {raw: np.zeros((1, 1), np.float32)}
    try:
      converted, _ = convert_state_dict(single, 1)
    except ValueError:
      continue
    for name in converted:
      out[name] = raw
  return out


def flat_params(params: Any) -> dict[str, np.ndarray]:
  """A (possibly boxed) Flax parameter tree -> `{"a.b.c": numpy array}`, the names above."""
  flat = traverse_util.flatten_dict(flax_meta.unbox(params), sep=SEPARATOR)
  return {name: np.asarray(value) for name, value in sorted(flat.items())}


# ----------------------------------------------------------------------------- merge
def import_state_dict(state: Mapping[str, Any], target_params: Any, *, num_heads: int,
                      architecture_name: str = "state_dict", source: str = "checkpoint"
                      ) -> tuple[dict, ImportReport]:
  """Merges a HF state dict into `target_params` (nested Flax tree); returns (params, report).

  `source` (the folder) names where a mismatching tensor came from in errors.
  """
  converted, unused = convert_state_dict(state, num_heads)
  hf_names = _hf_names(state)
  target = flat_params(target_params)
  mapped, new = [], []
  merged = dict(target)
  for name, value in target.items():
    if name in converted:
      src = converted[name]
      if tuple(src.shape) != tuple(np.shape(value)):
        hint = ("the tokenizer's vocabulary must be the checkpoint's (leave config.data.tokenizer "
                "unset to use the folder's own)" if name.endswith("word_embeddings.embedding")
                else "the config sizes (width, heads, MLP, positions, type vocabulary) must "
                "match the checkpoint's config.json")
        raise HFImportError(f"{source}: tensor {hf_names.get(name, name)!r} (flaxdoc {name!r}) "
                            f"has shape {tuple(src.shape)}, the flaxdoc model expects "
                            f"{tuple(np.shape(value))}: {hint}")
      merged[name] = src
      mapped.append(name)
    else:
      new.append(name)
  # Unused tensors are reported by their checkpoint (HF) names, whatever stopped them.
  unused += sorted(hf_names.get(k, k) for k in converted if k not in target)
  report = ImportReport(architecture_name, sorted(mapped), sorted(new), sorted(unused))
  return traverse_util.unflatten_dict(merged, sep=SEPARATOR), report
