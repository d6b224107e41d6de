"""Defaults shared by every `configs/*.py` file, and the `get_config(arg)` argument parser.

A config file is a few lines (big_vision style):

    def get_config(arg=None):
      return default_config.make(arg, model="formnet", variant="A2", recipe="formnet")

`arg` (the part after `:` in `--config=configs/x.py:arg`) is a comma-separated list
of `key=value` pairs or bare flags, for example:

* `local` — shrink everything (model, data, steps) to run in minutes on a CPU;
* `variant=A1` — another row of the model's variants table;
* `dataset=funsd` — another dataset (labels follow it);
* `mode=pretrain` — pre-training (MLM; + 1-LOP for DocPolarBERT);
* `task=tagging+linking` — also link keys to values (`flaxdoc.train.linking`).

Anything else is overridable with `--config.some.field=value`.
"""

from __future__ import annotations

import ml_collections

# The papers' optimisation recipes (DESIGN §4, FormNet §4.1, DocPolarBERT, LAGaBi, LSPE).
RECIPES = {
    # FormNet fine-tuning: Adam, lr 1e-4, batch 8, no warm-up. Pre-training: lr 2e-4,
    # warm-up 1%, batch 512.
    "formnet": dict(finetune=dict(name="adam", lr=1e-4, warmup_steps=0, schedule="constant",
                                  batch_size=8),
                    pretrain=dict(name="adamw", lr=2e-4, warmup_fraction=0.01,
                                  schedule="linear", batch_size=512)),
    # RoBERTa/BERT-style encoders (DocPolarBERT, LAGaBi, LayoutLM variants).
    "bert": dict(finetune=dict(name="adamw", lr=5e-5, warmup_fraction=0.1, schedule="linear",
                               batch_size=16),
                 pretrain=dict(name="adamw", lr=1e-4, warmup_fraction=0.01, schedule="linear",
                               batch_size=256)),
}


# Every option a dataset reader takes (`flaxdoc.data.datasets.option_names`; the synthetic
# generator's too), declared unset (None) in `config.data.dataset_options`, so that each can
# be set on the command line (ml_collections' flags override only fields that exist, e.g.
# `--config.data.dataset_options.box_policy=clip`). Unset ones are not passed to the reader;
# one the dataset's reader does not take is a ConfigError naming it (`setup.load_documents`).
DATASET_OPTIONS = {
    "dev_fraction": float, "seed": int,  # the dev carve (all datasets)
    "box_policy": str, "on_error": str,  # FUNSD, CORD, SROIE, jsonl
    "use_images": bool, "other_as_entity": bool, "ocr": str, "ocr_cache_dir": str,  # FUNSD
    "min_similarity": float, "max_window_lines": int,  # SROIE
    "text_policy": str,  # jsonl
    "num_train": int, "num_dev": int, "num_test": int, "link_keys": bool,  # synthetic
    "min_pages": int, "max_pages": int, "target_words": int, "min_items": int,
    "max_items": int, "value_below": float, "shuffle_columns": float,
    "interleave_columns": float, "shuffle_blocks": float, "ocr_noise": float,
}


def dataset_options(**values) -> ml_collections.ConfigDict:
  """`config.data.dataset_options`: every reader option declared, `values` set."""
  unknown = sorted(set(values) - set(DATASET_OPTIONS))
  if unknown:
    raise ValueError(f"dataset_options: no reader takes {unknown}")
  return ml_collections.ConfigDict(
      {k: values[k] if k in values else ml_collections.config_dict.placeholder(t)
       for k, t in DATASET_OPTIONS.items()})


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """`"local,variant=A1"` -> ConfigDict(local=True, variant="A1", ...defaults)."""
  out = dict(defaults)
  for item in (arg or "").split(","):
    item = item.strip()
    if not item:
      continue
    if "=" in item:
      k, v = item.split("=", 1)
      out[k.strip()] = _parse_value(v.strip())
    else:
      out[item] = True
  return ml_collections.ConfigDict(out)


def _parse_value(v: str):
  if v.lower() in ("true", "false"):
    return v.lower() == "true"
  for cast in (int, float):
    try:
      return cast(v)
    except ValueError:
      pass
  return v


def make(arg: str | None, *, model: str, variant: str, recipe: str = "bert",
         max_len: int = 512, scheme: str = "BIO", **data_overrides) -> ml_collections.ConfigDict:
  """The full config for one model family (see the module docstring for `arg`)."""
  from flaxdoc import models  # pylint: disable=import-outside-toplevel
  a = parse_arg(arg, local=False, variant=variant, dataset="synthetic", mode="train",
                task="tagging")
  c = ml_collections.ConfigDict()
  c.mode = a.mode
  c.task = a.task  # "tagging" | "linking" | "tagging+linking" (flaxdoc.train.linking)
  c.seed = 0
  c.dtype = "float32"  # compute dtype; "bfloat16" for TPUs / recent GPUs.

  c.model = models.get_model_config(model, a.variant, local=a.local)

  d = c.data = ml_collections.ConfigDict()
  d.dataset = a.dataset
  d.data_dir = ""
  d.dataset_options = dataset_options()
  d.labels = ()  # empty: the dataset's built-in label set
  d.train_split = "train"
  d.eval_split = "dev"
  d.tokenizer = "default"
  d.max_len = max_len
  d.stride = ml_collections.FieldReference(None, field_type=int)
  d.split = "window"
  d.scheme = scheme
  d.label_all_subtokens = False
  d.graph_max_degree = 8
  d.graph_variant = "ball_of_sight"
  d.block_shuffle = 0.0  # LSPE augmentations (fine-tuning only)
  d.neighbour_swap = 0.0
  d.mlm_rate = 0.15
  # Pre-training: MLM targets per window, and the positions the MLM head scores (BERT's
  # max_predictions_per_seq). None: masking.default_max_predictions(max_len, mlm_rate),
  # 1.5x the expected count; 0: no cap, the head scores every position.
  d.mlm_max_predictions = ml_collections.FieldReference(None, field_type=int)
  d.lop_rate = 0.0
  # Fraction of the official train split carved off as dev (None: the dataset's default
  # size; 0: none, train on all of it and evaluate on `test` or nothing, as the papers do).
  d.dev_fraction = ml_collections.FieldReference(None, field_type=float)
  d.max_train_docs = ml_collections.FieldReference(None, field_type=int)
  d.max_dev_docs = ml_collections.FieldReference(None, field_type=int)
  for k, v in data_overrides.items():
    d[k] = v

  stage = "pretrain" if a.mode == "pretrain" else "finetune"
  r = dict(RECIPES[recipe][stage])
  c.batch_size = r.pop("batch_size")
  c.eval_batch_size = 16
  o = c.optim = ml_collections.ConfigDict()
  o.name = r.pop("name")
  o.lr = r.pop("lr")
  o.schedule = r.pop("schedule")
  o.warmup_steps = r.pop("warmup_steps", 0)
  o.warmup_fraction = r.pop("warmup_fraction", 0.0)
  o.end_lr_fraction = 0.0
  o.b1, o.b2, o.eps = 0.9, 0.999, 1e-8
  o.weight_decay = 0.01
  o.clip_norm = 1.0
  o.grad_accum_steps = 1
  # Starting from pre-trained weights (init_from=hf:DIR): lr multiplier for the imported
  # parameters, and steps during which they stay frozen while the new parts warm up.
  o.pretrained_lr_scale = 1.0
  o.freeze_pretrained_steps = 0

  c.total_steps = 100_000 if a.mode == "pretrain" else 10_000
  c.log_every = 50
  c.eval_every = 1000
  c.checkpoint_every = 1000
  c.keep_checkpoints = 2
  c.async_checkpoints = True
  c.lop_weight = 0.5
  c.init_from = ""  # a pre-training workdir, or hf:DIR (a Hugging Face checkpoint folder)

  c.mesh = ml_collections.ConfigDict()
  c.mesh.shape = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1})
  c.mesh.rules = None  # None: flaxdoc.train.sharding.DEFAULT_RULES

  c.predict = ml_collections.ConfigDict()
  c.predict.input = ""  # "" (the eval split), a .jsonl file, or PDF path(s)/glob
  c.predict.output = ""  # default WORKDIR/predictions.jsonl
  c.predict.draw = False  # PNG per page with entity boxes coloured by label
  c.predict.draw_dir = ""
  # Images and scanned PDF pages: OCR engine ("rapidocr", "tesseract"; "" = born-digital
  # PDFs only) and the dpi PDF pages are rendered at for it (flaxdoc.data.ocr).
  c.predict.ocr = "rapidocr"
  c.predict.ocr_dpi = 300.0

  if a.local:
    # Minutes on a 2-core CPU: small data, short windows, frequent logging.
    d.max_len = 256
    d.dataset_options = dataset_options(
        **({"num_train": 2000, "num_dev": 60} if a.dataset == "synthetic" else {}))
    c.batch_size = 8
    c.eval_batch_size = 16
    o.lr = max(o.lr, 1e-3)
    o.schedule = "linear"
    o.warmup_steps = 20
    o.warmup_fraction = 0.0
    c.total_steps = 600
    c.log_every = 10
    c.eval_every = 200
    c.checkpoint_every = 200

  # Entity linking (used when c.task has "linking"): flaxdoc.train.linking.
  lk = c.linking = ml_collections.ConfigDict()
  lk.weight = 1.0  # link loss weight in the joint loss
  lk.pooling = "first"  # entity vector: "first" token or "mean" of its tokens
  lk.pairs = ""  # "key_label:value_label,..."; "": the dataset's (funsd question:answer)
  lk.dim = 128  # width of the key / value projections
  lk.geometry = True  # add a learned score of the pair's relative box geometry (README)
  lk.text = True  # the biaffine score of the two entities' states (False: geometry only)
  lk.text_dropout = 0.0  # training: share of values scored without the text term (README)
  lk.max_entities = 96  # per window (padding sizes)
  lk.max_values = 64
  lk.max_candidates = 32  # nearest candidate keys kept per value
  # Inference: a value's candidates from the whole "document" (keys in other windows too)
  # or only from its "window" (as in training). README, Key-value pairs.
  lk.scope = "document"
  if "linking" in str(a.task) and a.dataset == "synthetic":
    # The synthetic generator writes its key -> value relations only when asked.
    d.dataset_options.link_keys = True
  if a.dataset == "funsd":
    # Re-read the forms with OCR words ("rapidocr", "tesseract"; "" = gold words), gold
    # labels mapped to them, OCR results cached in ocr_cache_dir (flaxdoc.data.ocr).
    d.dataset_options.ocr = ""
    d.dataset_options.ocr_cache_dir = ""
    # 129 training forms: the text score fits them; dropping it for half the values in
    # training lifted dev relation F1 from scratch and from MiniLM (README, Key-value pairs).
    lk.text_dropout = 0.5
  return c
