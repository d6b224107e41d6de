"""What every mode needs from a config: tokenizer, feature config, model, data.

`Experiment.create(config)` reads `config.data` and `config.model` once, so the
train, eval and predict paths build their inputs the same way. It is also the one
place an `init_from=hf:DIR` config is resolved (`hf_init.resolve_config`): callers
use `experiment.config` from then on, so the checkpoint's `config.json` is read and
its sizes applied (and logged) once per run.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os

import jax
import ml_collections
import numpy as np
from flax import linen as nn

from flaxdoc.data import datasets, masking, tokenizers
from flaxdoc.data.document import Document
from flaxdoc.data.features import FeatureConfig, batch_features, featurize
from flaxdoc.train import checkpoint as ckpt_lib
from flaxdoc.train import checkpoint_recovery
from flaxdoc.train import hf_init, linking, remote
from flaxdoc.train.config_error import ConfigError
from flaxdoc.train.input_pipeline import FeaturizedSplit, featurize_split

log = logging.getLogger(__name__)


def dataset_labels(name: str, options=None, reads: dict | None = None) -> tuple[str, ...]:
  """The entity labels of a dataset when `config.data.labels` is empty: the built-in set, or,
  for `jsonl:PATH`, the `label_set`s of its train documents (`reads`: see `load_documents`)."""
  if name == "synthetic":
    from flaxdoc.data.synthetic import LABELS, LABELS_WITH_KEYS  # pylint: disable=import-outside-toplevel
    return tuple(LABELS_WITH_KEYS if (options or {}).get("link_keys") else LABELS)
  if name in datasets.LABELS:
    return datasets.LABELS[name]
  check_dataset(name)
  return jsonl_labels(name, options, reads)


def check_dataset(name: str) -> None:
  """A `ConfigError` naming config.data.dataset for a dataset flaxdoc cannot read."""
  if name != "synthetic" and name not in datasets.LABELS and not name.startswith("jsonl:"):
    raise ConfigError(f"config.data.dataset={name!r}: unknown dataset; expected one of "
                      f"{['synthetic', *sorted(datasets.LABELS), 'jsonl:PATH']}")


# Options a config argument sets for one dataset: `:local` sets the synthetic generator's
# (less data), `:dataset=funsd` FUNSD's OCR switches (off). When the dataset is then switched
# by flag (`--config.data.dataset=jsonl:...`), they mean nothing to its reader and are left
# out, with a log line (FUNSD's only while off: one set on is the user's, and an error).
CONFIG_ARGUMENT_OPTIONS = {"synthetic": ("num_train", "num_dev", "num_test", "link_keys"),
                           "funsd": ("ocr", "ocr_cache_dir")}


def check_ocr_engine(flag: str, engine) -> None:
  """A `ConfigError` naming `flag` for an OCR engine flaxdoc does not have ("" or None: none)."""
  from flaxdoc.data.ocr.engine import ENGINES  # pylint: disable=import-outside-toplevel
  if engine and engine not in ENGINES:
    raise ConfigError(f"{flag}={engine!r}: unknown OCR engine; expected one of {ENGINES}, or '' "
                      "for none")


_DROPS_LOGGED: set[tuple[str, tuple[str, ...]]] = set()


def reader_options(name: str, options=None) -> dict:
  """`config.data.dataset_options` as the dataset's reader takes them: the ones set (the
  config declares every reader's options, unset: None)."""
  options = {k: v for k, v in dict(options or {}).items() if v is not None}
  check_ocr_engine("config.data.dataset_options.ocr", options.get("ocr"))
  dropped = [k for owner, keys in CONFIG_ARGUMENT_OPTIONS.items() if owner != name
             for k in keys if k in options and (owner == "synthetic" or not options[k])]
  if dropped and (name, tuple(dropped)) not in _DROPS_LOGGED:  # once, not once per split read
    _DROPS_LOGGED.add((name, tuple(dropped)))
    log.info("dataset %s: config.data.dataset_options %s are another dataset's: not used",
             name, ", ".join(dropped))
  return {k: v for k, v in options.items() if k not in dropped}


def load_documents(name: str, split: str, data_dir=None, reads: dict | None = None, **options):
  """`datasets.load_dataset` with its options checked first against what the dataset's reader
  takes (`datasets.option_names`): an unknown one is a `ConfigError` naming it. Calls given
  the same `reads` dict read a `jsonl:` file once (`datasets.load_dataset`)."""
  check_dataset(name)
  taken = datasets.option_names(name)
  unknown = [k for k in options if taken is not None and k not in taken]
  if unknown:
    raise ConfigError(f"config.data.dataset_options: the reader of dataset {name!r} takes no "
                      f"option {unknown[0]!r}; its options are {', '.join(taken)}")
  return datasets.load_dataset(name, split, data_dir=data_dir, reads=reads, **options)


def jsonl_labels(name: str, options=None, reads: dict | None = None) -> tuple[str, ...]:
  """The `label_set`s of a `jsonl:` dataset's train documents (all of them, no dev carved)
  merged in the order first seen: the tag ids follow this order, so the file fixes it."""
  options = reader_options(name, options)
  options["dev_fraction"] = 0.0  # every train document, whatever the run carves
  docs, _ = load_documents(name, "train", reads=reads, **options)
  labels = {}
  for doc in docs:
    for label in doc.label_set or ():
      labels.setdefault(label, None)
  if not labels:
    raise ConfigError(
        f"dataset {name!r}: none of its {len(docs)} train documents has a label_set; set "
        "config.data.labels (e.g. --config.data.labels=\"('total', 'date')\") or give the "
        "documents a label_set")
  log.info("%s: labels from the documents' label_set: %s", name, ", ".join(labels))
  return tuple(labels)


def check_data(config: ml_collections.ConfigDict) -> None:
  """`ConfigError`s naming the `config.data` flag for values the data readers would reject
  with a bare ValueError (unaware of flags), before anything is read or compiled."""
  d = config.data
  check_dataset(d.dataset)
  fractions = {"config.data.dev_fraction": d.get("dev_fraction"),
               "config.data.dataset_options.dev_fraction":
                   (d.get("dataset_options") or {}).get("dev_fraction")}
  for flag, value in fractions.items():
    if value is not None and not 0.0 <= _number(flag, value) < 1.0:
      raise ConfigError(f"{flag}={value!r}: must be in [0, 1) (0: no dev split carved)")
  for flag, value in (("train_split", d.get("train_split")), ("eval_split", d.get("eval_split"))):
    if value not in datasets.SPLITS and not (flag == "eval_split" and not value):
      raise ConfigError(f"config.data.{flag}={value!r}: must be one of {datasets.SPLITS}"
                        + (" or '' (no evaluation)" if flag == "eval_split" else ""))
  for key in ("mlm_rate", "lop_rate"):
    value = d.get(key)
    if value is not None and not 0.0 <= _number(f"config.data.{key}", value) <= 1.0:
      raise ConfigError(f"config.data.{key}={value!r}: must be in [0, 1]")


def _load_tokenizer(spec: str):
  """`tokenizers.load_tokenizer` with its ValueErrors (a bad spec, an unreadable vocabulary)
  as `ConfigError`s naming config.data.tokenizer; an `hf:` folder's own errors name it."""
  from flaxdoc.data.hf_tokenizer import HFTokenizerError  # pylint: disable=import-outside-toplevel
  try:
    return tokenizers.load_tokenizer(spec)
  except HFTokenizerError:
    raise
  except ValueError as e:
    raise ConfigError(f"config.data.tokenizer={spec!r}: {e}") from e


def _number(flag: str, value) -> float:
  try:
    return float(value)
  except (TypeError, ValueError):
    raise ConfigError(f"{flag}={value!r}: must be a number") from None


# `config.data.tokenizer` kinds whose argument is a file or folder (`tokenizers.load_tokenizer`).
TOKENIZER_FILE_KINDS = ("hf", "sentencepiece", "wordpiece", "wordpiece-cased", "bpe")


def absolute_paths(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` with a relative `init_from=hf:DIR`, `data.dataset=jsonl:PATH` and
  `data.tokenizer=KIND:PATH` (a vocabulary file or folder) made absolute
  (against the current directory), logged: the run's config.json records them so, and eval,
  predict, export and a resume find them from any directory. A copy; `config` itself when
  nothing is relative. A record written before (relative paths) still works from the
  directory it was written in: its paths are resolved here, as they always were."""
  changes = {}  # flag -> (as given, absolute)
  folder = hf_init.hf_folder(config.get("init_from"))
  if folder is not None and not remote.is_remote(folder) and not os.path.isabs(folder):
    changes["init_from"] = (config.init_from, f"{hf_init.HF_PREFIX}{os.path.abspath(folder)}")
  dataset = config.data.get("dataset") or ""
  spec = dataset[len("jsonl:"):]
  if (dataset.startswith("jsonl:") and spec and not remote.is_remote(spec)
      and not os.path.isabs(spec)):  # the reader opens `spec` as given: relative to here
    changes["data.dataset"] = (dataset, f"jsonl:{os.path.abspath(spec)}")
  tokenizer = config.data.get("tokenizer") or ""
  kind, _, path = tokenizer.partition(":")  # "wordpiece:vocab.txt", "hf:DIR", ...: a file
  if (kind in TOKENIZER_FILE_KINDS and path and not remote.is_remote(path)
      and not os.path.isabs(os.path.expanduser(path))):
    changes["data.tokenizer"] = (tokenizer, f"{kind}:{os.path.abspath(path)}")
  if not changes:
    return config
  out = copy.deepcopy(config)
  out.update_from_flattened_dict({k: new for k, (_, new) in changes.items()})
  if jax.process_index() == 0:
    log.info("relative paths made absolute, as the run's config.json records them: %s",
             ", ".join(f"config.{k}={old} -> {new}" for k, (old, new) in changes.items()))
  return out


def mlm_max_predictions(config: ml_collections.ConfigDict) -> int | None:
  """`config.data.mlm_max_predictions` resolved: the MLM targets per window and the
  positions the MLM head scores (None: every position, no cap)."""
  d = config.data
  value = d.get("mlm_max_predictions")
  if value is None:
    return masking.default_max_predictions(int(d.max_len), float(d.get("mlm_rate", 0.15)))
  try:
    count = None if isinstance(value, bool) else int(value)
  except (TypeError, ValueError):
    count = None
  if count is None or count < 0:
    raise ConfigError(f"config.data.mlm_max_predictions={value!r}: must be None, 0 (no cap) or "
                      "a positive integer")
  return None if count == 0 else min(count, int(d.max_len))


def with_the_runs_record(config: ml_collections.ConfigDict,
                        workdir: str) -> ml_collections.ConfigDict:
  """`config` completed from `WORKDIR/config.json`, the record of the run whose checkpoint
  eval, predict or a resume restores (a copy; `config` itself when nothing is taken):

  * where the command names no `init_from` and the run started from `hf:DIR`: that
    `init_from` (the model gets the checkpoint's sizes and tokenizer again; absolute in
    records written since `absolute_paths`, an older record's relative one is resolved
    against the current directory by `Experiment.create`) and the recipe
    options that shape its optimiser state (`optim.pretrained_lr_scale`,
    `optim.freeze_pretrained_steps`);
  * where the command names no `data.labels` and the record has some (a `jsonl:` run's,
    read from its documents): those, so the tag ids stay the model's;
  * for a run with a linking head (`task=...linking`): the head's `linking.geometry`, `text`,
    `dim` and `pooling`, which fix its parameters' shapes (a checkpoint restores only with them),
    so a run trained under another default (geometry was off before it became the default)
    is evaluated, predicted and resumed as it was trained.

  Callers pass a workdir with a checkpoint. A missing record takes nothing; an unreadable
  one takes nothing with a warning naming it.
  """
  from etils import epath  # pylint: disable=import-outside-toplevel
  path = epath.Path(workdir) / "config.json"
  if not path.exists():
    return config
  try:
    record = json.loads(path.read_text())
    if not isinstance(record, dict):
      raise ValueError(f"a JSON {type(record).__name__}, not an object")
  except (OSError, ValueError) as e:
    log.warning("%s: unreadable (%s): the run's init_from and labels are not taken from it",
                path, e)
    return config
  taken = {}
  init_from = record.get("init_from") or ""
  if not config.get("init_from") and hf_init.hf_folder(init_from) is not None:
    taken["init_from"] = init_from
    for key in ("pretrained_lr_scale", "freeze_pretrained_steps"):
      value = (record.get("optim") or {}).get(key)
      if value is not None and key in config.optim:
        taken[f"optim.{key}"] = value
  labels = (record.get("data") or {}).get("labels") or ()
  if not config.data.get("labels") and labels:
    taken["data.labels"] = tuple(labels)
  head = record.get("linking") or {}
  if "linking" in str(record.get("task") or "") and "linking" in config:
    for key in ("geometry", "text", "dim", "pooling"):
      if key in head and key in config.linking and head[key] != config.linking[key]:
        taken[f"linking.{key}"] = head[key]
  if not taken:
    return config
  out = copy.deepcopy(config)
  out.update_from_flattened_dict(taken)
  if jax.process_index() == 0:
    log.info("from %s (the run's record): %s", path,
             ", ".join(f"{k}={v}" for k, v in taken.items()))
  return out


@dataclasses.dataclass
class Experiment:
  config: ml_collections.ConfigDict
  tokenizer: object
  feature_config: FeatureConfig
  model: nn.Module
  linking: object = None  # a flaxdoc.train.linking.LinkingTask, or None (tagging only)
  restored_step: int | None = None  # the checkpoint step restore_for_inference restored
  _cache: dict = dataclasses.field(default_factory=dict, repr=False)
  # jsonl: files as read (datasets.load_dataset's `reads`): the labels' read of the train
  # file at create serves documents("train") and a carved dev too.
  _reads: dict = dataclasses.field(default_factory=dict, repr=False)

  @classmethod
  def create(cls, config: ml_collections.ConfigDict) -> "Experiment":
    from flaxdoc import models  # pylint: disable=import-outside-toplevel
    # init_from=hf:DIR: the checkpoint's sizes and tokenizer; the only resolve of a run.
    config = hf_init.resolve_config(absolute_paths(config))
    check_data(config)
    d = config.data
    reads = {}
    tokenizer = _load_tokenizer(d.tokenizer)
    if config.mode == "pretrain":
      labels = ()  # MLM needs no label set (user corpora often have none)
    else:
      labels = (tuple(d.labels) if d.get("labels") else
                dataset_labels(d.dataset, d.get("dataset_options"), reads))
      if not d.get("labels") and d.dataset.startswith("jsonl:"):
        # Read from the documents: kept in the run's config.json, so that eval, predict
        # and export use the same tag ids without the training file.
        config = copy.deepcopy(config)
        config.data.labels = labels
        d = config.data
    needs_graph = models.needs_graph(config.model)
    try:  # FeatureConfig's ValueErrors are about its fields, each a config.data flag's value
      fc = FeatureConfig(max_len=int(d.max_len), stride=d.get("stride"),
                         split=d.get("split", "window"), scheme=d.get("scheme", "BIOES"),
                         label_all_subtokens=d.get("label_all_subtokens", False), labels=labels,
                         add_special_tokens=d.get("add_special_tokens", True), graph=needs_graph,
                         graph_max_degree=d.get("graph_max_degree", 8),
                         graph_variant=d.get("graph_variant", "ball_of_sight"))
    except ValueError as e:
      raise ConfigError(f"config.data: {e}") from e
    vocab_size = hf_init.check_vocabulary(config, tokenizer)
    if config.model.get("name") not in models.MODELS:
      raise ConfigError(f"config.model.name={config.model.get('name')!r}: unknown model; "
                        f"expected one of {sorted(models.MODELS)}")
    try:  # build_model's ValueErrors name the config.model field that cannot work
      model = models.build_model(config.model, vocab_size=vocab_size,
                                 num_tags=max(fc.num_tags, 1), max_len=fc.max_len,
                                 pretraining=config.mode == "pretrain",
                                 dtype=config.get("dtype", "float32"))
    except ValueError as e:
      raise ConfigError(str(e)) from e
    if config.mode == "pretrain":
      model = model.clone(mlm_max_predictions=mlm_max_predictions(config))
    # Entity linking (config.task): a linking head on the encoder, link arrays on windows.
    link_task = linking.LinkingTask.from_config(config, labels)
    if link_task is not None:
      model = model.clone(linking=link_task.spec)
    return cls(config, tokenizer, fc, model, link_task, _reads=reads)

  # ------------------------------------------------------------------ data
  def documents(self, split: str) -> list[Document]:
    d = self.config.data
    options = reader_options(d.dataset, d.get("dataset_options"))
    if d.get("dev_fraction") is not None:  # 0: no dev split carved (the papers' protocol)
      options.setdefault("dev_fraction", float(d.dev_fraction))
    docs, report = load_documents(d.dataset, split, d.get("data_dir") or None, self._reads,
                                  **options)
    if jax.process_index() == 0:
      log.info("%s", report.summary())
    limit = d.get(f"max_{split}_docs")
    return docs[:limit] if limit else docs

  def featurized(self, split: str, progress: bool = False) -> FeaturizedSplit:
    """The split's documents featurised once (cached per split)."""
    if split not in self._cache:
      self._cache[split] = featurize_split(self.documents(split), self.tokenizer,
                                           self.feature_config, progress)
      if self.linking is not None:
        stats = self.linking.add_gold(self._cache[split], split)
        if stats:
          log.warning("linking arrays of split %r cut by config.linking sizes: %s", split, stats)
    return self._cache[split]

  def example_batch(self, batch_size: int) -> dict:
    """A batch of the right shapes for `init` (from a tiny synthetic document)."""
    from flaxdoc.data.synthetic import make_document  # pylint: disable=import-outside-toplevel
    doc = make_document(0, 0)
    labels = self.feature_config.labels
    if labels and doc.entities and any(e.label not in labels for e in doc.entities):
      doc = doc.replace(entities=None)
    w = featurize(doc, self.tokenizer, self.feature_config)[0]
    w = {k: v for k, v in w.items() if k not in ("window_index", "window_start", "subtoken_index")}
    if self.linking is not None:
      w.update(self.linking.example_arrays(len(w["input_ids"])))
    if self.config.mode == "pretrain":
      w = masking.pretraining_targets(w, np.random.default_rng(0), self.tokenizer,
                                      mlm_rate=self.config.data.get("mlm_rate", 0.15),
                                      lop_rate=self.config.data.get("lop_rate") or None,
                                      max_predictions=mlm_max_predictions(self.config))
    return batch_features([w] * max(batch_size, 1))

  # ------------------------------------------------------------- pretrained
  def load_pretrained(self, directory: str, params, abstract_params, workdir: str | None = None):
    """Encoder weights from a pre-training run; heads absent there stay freshly initialised.

    `hf:DIR` reads a Hugging Face checkpoint instead (`flaxdoc.train.hf_init`), writing
    `WORKDIR/init_report.json`.
    """
    if hf_init.hf_folder(directory) is not None:
      return hf_init.import_params(self.config, params, workdir)[0]
    import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
    from flax import traverse_util  # pylint: disable=import-outside-toplevel
    path = ckpt_lib.checkpoint_dir(directory)
    # item_handlers (not just names): item_metadata needs the handler to read the tree.
    mngr = ocp.CheckpointManager(path, item_handlers={"state": ocp.PyTreeCheckpointHandler()},
                                 options=ocp.CheckpointManagerOptions(read_only=True))
    if not mngr.all_steps():
      raise FileNotFoundError(f"config.init_from={directory!r}: no checkpoint found in {path}")
    target = traverse_util.flatten_dict(abstract_params)

    def read(step):  # a damaged step fails here and the next older one is tried
      tree = _metadata_tree(mngr.item_metadata(step)["state"])
      source = traverse_util.flatten_dict(tree["params"])
      shared = {k: v for k, v in target.items() if k in source and tuple(source[k]) == v.shape}
      new = sorted("/".join(k) for k in target if k not in shared)
      unused = sorted("/".join(k) for k in source if k not in target)
      log.info("init_from %s (step %d): %d tensors loaded, %d new (%s), %d unused (%s)",
               directory, step, len(shared), len(new), ", ".join(new[:8]), len(unused),
               ", ".join(unused[:8]))
      return ckpt_lib.restore_params_only(directory, traverse_util.unflatten_dict(shared), step)

    try:
      _, loaded = checkpoint_recovery.newest_good(str(mngr.directory), mngr.all_steps(), read)
    finally:
      mngr.close()
    flat = traverse_util.flatten_dict(params)
    flat.update(traverse_util.flatten_dict(loaded))
    return traverse_util.unflatten_dict(flat)


def _metadata_tree(meta):
  """Orbax tree metadata -> nested dict of shapes."""
  tree = getattr(meta, "tree", meta)
  return jax.tree.map(lambda m: tuple(m.shape), tree,
                      is_leaf=lambda m: hasattr(m, "shape") and not isinstance(m, dict))
