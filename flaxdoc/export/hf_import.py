"""Hugging Face RoBERTa / BERT / LayoutLM checkpoints -> flaxdoc parameters.

    from flaxdoc.export import hf_import
    params, report = hf_import.import_checkpoint("roberta-dir/", target_params)
    print(report.summary())   # mapped / new / unused tensors, by name

Sources: a local directory with `config.json` and `model.safetensors` (preferred) or
`pytorch_model.bin` (read with `torch.load(weights_only=True)` only: never a general
unpickle), or an already-loaded state dict `{name: array}`. Nothing is downloaded.

Targets: any flaxdoc dense text encoder built on those checkpoints - DocPolarBERT
(RoBERTa init), LAGaBi on RoBERTa / BERT / LayoutLM, the LayoutLM variants (and the
encoder layers of LayoutLinformer / LayoutCosformer, whose projections stay new).
`target_params` is the freshly initialised flaxdoc tree (e.g. from `model.init` or
`flaxdoc.models.random_parameters`): every tensor found in the checkpoint replaces
the target's, the rest (layout terms, tagging head, ...) keeps its initial value and
is reported as *new*; checkpoint tensors with no flaxdoc counterpart (pooler, MLM
head) are reported as *unused*. A shape mismatch raises `HFImportError` naming both
tensors.

The reading and name mapping live in `flaxdoc.models.hf_checkpoint` (training's
`init_from=hf:DIR` uses them too, and train may not import export); this module
re-exports them, so `hf_import.read_checkpoint`, `convert_state_dict`,
`import_state_dict`, `model_config_overrides`, `architecture`, `ImportReport` and
`HFImportError` keep working. The layout conversions are listed there.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from flaxdoc.models import hf_checkpoint
# Re-exported: the public names of this module before the reading moved down a layer.
from flaxdoc.models.hf_checkpoint import (  # noqa: F401  pylint: disable=unused-import
    ARCHITECTURES, HFImportError, ImportReport, architecture, convert_state_dict,
    import_state_dict, model_config_overrides, read_checkpoint)


def import_checkpoint(source: str | os.PathLike | Mapping[str, Any], target_params: Any, *,
                      num_heads: int | None = None) -> tuple[dict, ImportReport]:
  """A HF checkpoint directory (or state dict) merged into `target_params`.

  Args:
    source: checkpoint directory (`config.json` + weights) or a state dict.
    target_params: the initialised flaxdoc parameter tree (unscanned).
    num_heads: attention heads; read from the checkpoint's config when omitted
      (required for a bare state dict).
  """
  if isinstance(source, Mapping):
    if num_heads is None:
      raise HFImportError("num_heads is required when importing a bare state dict")
    return import_state_dict(source, target_params, num_heads=num_heads)
  hf_config, state = read_checkpoint(source)
  heads = int(num_heads or hf_checkpoint.required_field(hf_config, "num_attention_heads", source))
  return import_state_dict(state, target_params, num_heads=heads,
                           architecture_name=architecture(hf_config, source),
                           source=os.fspath(source))
