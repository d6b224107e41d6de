"""Export a trained flaxdoc model: `model.safetensors` + `config.json` (DESIGN §1, interop).

    python -m flaxdoc.export --workdir runs/formnet --out exported/
    python -m flaxdoc.export --workdir runs/formnet --out exported/ --config configs/formnet_a1.py:local

`config.json` holds everything the PyTorch side needs to rebuild the model and its
inputs: the model spec (all `EncoderSpec` fields), `vocab_size`, `num_tags`,
`max_len`, the feature config (scheme, labels, graph options), the tag names in id
order, the tokenizer spec, the training config (when known) and the format version.
The tokenizer's files are copied into `OUT/tokenizer/` and the spec recorded relative to
`OUT` (format version 2; `flaxdoc.export.tokenizer_files`): the folder serves on another
machine as it is, e.g. with `flaxdoc.export.torch.pipeline.DocumentPipeline`.
The trainer writes `WORKDIR/config.json` once a run's state is set up (after a resume's
restore); `--config` overrides it.

`--workdir` and `--out` may be remote (`gs://bucket/run`, with gcsfs installed): their
files go through `etils.epath` (`flaxdoc.train.remote`), the checkpoint through Orbax.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

from flaxdoc.export import tokenizer_files
from flaxdoc.export import weights as weights_lib
from flaxdoc.train import remote

FORMAT = "flaxdoc-export"
# 2: the tokenizer's files are in the folder, its spec relative to it (1: absolute paths).
FORMAT_VERSION = 2


def export_config(model, *, feature_config=None, tag_names=(), tokenizer: str | None = None,
                  train_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """The `config.json` contents for a built Flax `DocumentEncoder`."""
  fc = None
  if feature_config is not None:
    fc = {k: (list(v) if isinstance(v, tuple) else v)
          for k, v in dataclasses.asdict(feature_config).items()}
  spec = dataclasses.asdict(model.spec)
  spec["rich_axes"] = list(spec["rich_axes"])
  spec["scan_layers"] = False  # the file is always unscanned (`weights.unstack_layers`)
  return {"format": FORMAT, "format_version": FORMAT_VERSION, "model": spec,
          "vocab_size": int(model.vocab_size), "num_tags": int(model.num_tags),
          "max_len": int(model.max_len), "features": fc, "tag_names": list(tag_names),
          "tokenizer": tokenizer, "train_config": dict(train_config) if train_config else None,
          # The entity-linking head's spec (flaxdoc.nn.linking.LinkingSpec), when it has one.
          "linking": (dataclasses.asdict(model.linking)
                      if getattr(model, "linking", None) is not None else None)}


def write_export(out_dir: str | os.PathLike, params: Any, config: Mapping[str, Any]
                 ) -> dict[str, Any]:
  """Writes `model.safetensors` and `config.json` into `out_dir`; returns a small summary."""
  from etils import epath  # pylint: disable=import-outside-toplevel
  out_dir = os.fspath(out_dir)
  epath.Path(out_dir).mkdir(parents=True, exist_ok=True)
  # safetensors writes a local file: a remote folder gets it through a temporary copy.
  tensors = remote.write_through_local(
      os.path.join(out_dir, "model.safetensors"),
      lambda path: weights_lib.save_params(params, path, metadata={"format": FORMAT}))
  (epath.Path(out_dir) / "config.json").write_text(
      json.dumps(config, indent=1, sort_keys=True, default=str))
  return {"tensors": len(tensors), "parameters": int(sum(v.size for v in tensors.values())),
          "out": out_dir}


def load_train_config(workdir: str, config_arg: str | None):
  """The training config: `--config FILE[:ARG]` if given, else `WORKDIR/config.json`."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  if config_arg:
    path, _, arg = config_arg.partition(":")
    import importlib.util  # pylint: disable=import-outside-toplevel
    spec = importlib.util.spec_from_file_location("flaxdoc_export_config", path)
    if spec is None or spec.loader is None:
      raise FileNotFoundError(f"--config {config_arg!r}: cannot load {path!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()
  from etils import epath  # pylint: disable=import-outside-toplevel
  path = epath.Path(workdir) / "config.json"  # gs:// too: the trainer writes it through epath
  if not path.exists():
    raise FileNotFoundError(f"{path} not found: pass --config configs/<name>.py[:arg] (the "
                            "config the run was trained with)")
  return ml_collections.ConfigDict(json.loads(path.read_text()))


def export_workdir(workdir: str, out_dir: str, config_arg: str | None = None) -> dict[str, Any]:
  """Restores the latest checkpoint of `workdir` and exports it (needs JAX; torch not needed)."""
  # pylint: disable=import-outside-toplevel
  from flaxdoc.tags import tag_names as make_tag_names
  from flaxdoc.train.inference import restore_for_inference
  # gs:// without gcsfs: one line (the CLI prints ConfigErrors so), before any reading.
  remote.check_filesystem(workdir, "--workdir")
  remote.check_filesystem(out_dir, "--out")
  config = load_train_config(workdir, config_arg)
  # A missing tokenizer file: one line naming it, before the restore's minutes of work.
  tokenizer_files.tokenizer_files(str(config.data.get("tokenizer") or "default"))
  env, params, _ = restore_for_inference(config, workdir)
  config = env.config  # resolved (init_from=hf:DIR sizes and tokenizer) by the experiment
  fc = env.feature_config
  names = make_tag_names(fc.labels, fc.scheme) if fc.labels else []
  # Self-contained: the tokenizer's files go into the folder (a spec relative to it).
  tokenizer = tokenizer_files.copy_tokenizer(str(config.data.tokenizer), out_dir)
  cfg = export_config(env.model, feature_config=fc, tag_names=names,
                      tokenizer=tokenizer, train_config=config.to_dict())
  # Which step: the newest one that restored (a damaged newer one is skipped, with a warning).
  cfg["checkpoint_step"] = env.restored_step
  return dict(write_export(out_dir, params, cfg), step=env.restored_step)
