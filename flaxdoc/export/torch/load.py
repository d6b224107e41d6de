"""Loading an exported flaxdoc model (`config.json` + `model.safetensors`) into PyTorch.

    from flaxdoc.export.torch import load_exported
    model = load_exported("out/")            # torch.nn.Module in eval mode
    logits = model({k: torch.as_tensor(v) for k, v in batch.items()})   # [B, L, T]

No JAX is imported here or by the modules it builds.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np
import torch

from flaxdoc.export import weights as weights_lib
from flaxdoc.export.torch.models import TorchDocumentEncoder

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def build_torch_model(export_config: Mapping[str, Any],
                      tensors: Mapping[str, np.ndarray]) -> TorchDocumentEncoder:
  """The torch model for an export config (`config.json` contents) with `tensors` loaded.

  Raises:
    weights_lib.WeightsError: names missing / unexpected / wrong-shaped tensors.
  """
  spec = dict(export_config["model"])
  width = int(spec["width"])
  edge_features = 16
  key = "super_tokens.layer_0.message_in_kernel"
  if key in tensors:
    edge_features = int(np.shape(tensors[key])[0]) - 2 * width
  model = TorchDocumentEncoder(spec, vocab_size=int(export_config["vocab_size"]),
                               num_tags=int(export_config["num_tags"]),
                               max_len=int(export_config["max_len"]),
                               edge_features=edge_features,
                               linking=export_config.get("linking"))
  load_tensors_into(model, tensors)
  return model.eval()


def load_tensors_into(model: torch.nn.Module, tensors: Mapping[str, np.ndarray]) -> None:
  """`load_state_dict` with a `WeightsError` listing every mismatch by name."""
  # LongPairsOnly re-homes its keys while loading; compare on the Flax names.
  expected = {k.replace(".term.", ".", 1) if ".term." in k else k: tuple(v.shape)
              for k, v in model.state_dict().items()}
  missing, unexpected, wrong = weights_lib.match_shapes(expected, tensors)
  if missing or unexpected or wrong:
    raise weights_lib.WeightsError(
        f"exported tensors do not match the torch model: missing {missing[:10]}, "
        f"unexpected {unexpected[:10]}, wrong shapes {wrong[:10]}")
  state = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in tensors.items()}
  model.load_state_dict(state, strict=True)


def read_export_config(out_dir: str | os.PathLike) -> dict[str, Any]:
  path = os.path.join(os.fspath(out_dir), CONFIG_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: export with `python -m flaxdoc.export`")
  with open(path, encoding="utf-8") as f:
    config = json.load(f)
  for field in ("model", "vocab_size", "num_tags", "max_len"):
    if field not in config:
      raise ValueError(f"{path}: field {field!r} is missing")
  return config


def load_exported(out_dir: str | os.PathLike) -> TorchDocumentEncoder:
  """The exported model in `out_dir` as a torch module (eval mode, float32).

  The module's `export_config` attribute holds `config.json` (tag names, feature
  config, tokenizer spec) for pre- and post-processing. The tokenizer spec is relative
  to `out_dir` (format version 2): `flaxdoc.export.tokenizer_files.load_export_tokenizer`
  loads it, and `flaxdoc.export.torch.pipeline.DocumentPipeline` does all of it.
  """
  config = read_export_config(out_dir)
  tensors = weights_lib.load_tensors(os.path.join(os.fspath(out_dir), WEIGHTS_FILE))
  model = build_torch_model(config, tensors)
  model.export_config = config
  return model
