r"""flaxdoc's entry point: train, pre-train, evaluate and predict from one config.

    python -m flaxdoc.main --config=configs/formnet_a2.py --workdir=/tmp/formnet
    python -m flaxdoc.main --config=configs/formnet_a2.py:local --workdir=/tmp/x \
        --config.data.dataset=funsd --config.data.data_dir=/data/funsd
    python -m flaxdoc.main --config=configs/formnet_a2.py --workdir=/tmp/x --config.mode=eval
    python -m flaxdoc.main --config=configs/formnet_a2.py --workdir=/tmp/x --config.mode=predict \
        --config.predict.input=my_docs.jsonl

Multi-host: when launched as several processes (TPU pods, SLURM), JAX's
distributed runtime is initialised first (`--multihost`, or automatically where
the cluster environment is detected); each process then reads its own shard of
the data.
"""

import logging
import os
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (path[:arg]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and outputs.")
_MULTIHOST = flags.DEFINE_bool(
    "multihost", None, "Call jax.distributed.initialize() before anything else. Default: when "
    "JAX_COORDINATOR_ADDRESS is set, SLURM_NTASKS>1, or TPU_PROCESS_ADDRESSES / "
    "TPU_WORKER_HOSTNAMES name several hosts.")
_TRACEBACK = flags.DEFINE_bool(
    "traceback", False, "Show the full traceback of errors in what the run was given (damaged "
    "or mismatching checkpoints, malformed documents, a missing dataset, a setting that cannot "
    "work, an unreadable Hugging Face folder, a missing OCR engine), which otherwise print one "
    "line and exit with status 1.")
flags.mark_flags_as_required(["config", "workdir"])


def wants_distributed(multihost: bool | None, environ=os.environ) -> bool:
  """Whether to call jax.distributed.initialize(): `--multihost` if given, else whether
  the environment is that of one process among several."""
  if multihost is not None:
    return multihost
  if environ.get("JAX_COORDINATOR_ADDRESS"):
    return True
  if int(environ.get("SLURM_NTASKS", "1")) > 1:
    return True
  # Several hosts of a TPU slice: GKE sets TPU_WORKER_HOSTNAMES, and TPU_PROCESS_ADDRESSES
  # is the list JAX's own TPU cluster detection reads first.
  return any(environ.get(name, "").count(",")
             for name in ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES"))


def input_errors() -> tuple[type[Exception], ...]:
  """Errors about what the run was given (files, folders, settings), not about flaxdoc: their
  messages name the file, document and field, so the command prints one line for them."""
  # pylint: disable=import-outside-toplevel
  from flaxdoc.data.document import DocumentError
  from flaxdoc.data.hf_tokenizer import HFTokenizerError
  from flaxdoc.data.ocr.words import OcrUnavailableError
  from flaxdoc.data.public_datasets import DatasetNotFoundError
  from flaxdoc.models.hf_checkpoint import HFImportError
  from flaxdoc.train.checkpoint_recovery import CheckpointError
  from flaxdoc.train.setup import ConfigError
  return (CheckpointError, ConfigError, DocumentError, DatasetNotFoundError, HFImportError,
          HFTokenizerError, OcrUnavailableError)


def main(argv):
  errors = input_errors()
  try:
    _main(argv)
  except errors as e:
    if _TRACEBACK.value:
      raise
    print(f"flaxdoc: error: {e}", file=sys.stderr)
    sys.exit(1)


def _main(argv):
  del argv
  import jax  # pylint: disable=import-outside-toplevel
  if wants_distributed(_MULTIHOST.value):
    # JAX reads the coordinator address from the environment itself, but not the
    # process count / id: pass them when a launcher (launch/slurm) exported them.
    kwargs = {}
    if os.environ.get("JAX_NUM_PROCESSES"):
      kwargs["num_processes"] = int(os.environ["JAX_NUM_PROCESSES"])
    if os.environ.get("JAX_PROCESS_ID"):
      kwargs["process_id"] = int(os.environ["JAX_PROCESS_ID"])
    jax.distributed.initialize(**kwargs)
  logging.getLogger().setLevel(logging.INFO)
  for noisy in ("absl", "jax._src", "orbax", "grain", "tensorflow_datasets"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  config = _CONFIG.value
  workdir = _WORKDIR.value
  logging.info("flaxdoc %s: %d process(es), %d device(s) [%s]", config.mode, jax.process_count(),
               jax.device_count(), jax.devices()[0].platform)
  if config.mode in ("train", "pretrain"):
    from flaxdoc.train import trainer  # pylint: disable=import-outside-toplevel
    result = trainer.train_and_evaluate(config, workdir)
    logging.info("done: %s", result)
  elif config.mode == "eval":
    from flaxdoc.train import inference  # pylint: disable=import-outside-toplevel
    inference.run_eval(config, workdir)
  elif config.mode == "predict":
    from flaxdoc.train import inference  # pylint: disable=import-outside-toplevel
    inference.run_predict(config, workdir)
  else:
    raise app.UsageError(f"config.mode must be train, pretrain, eval or predict, not {config.mode!r}")


if __name__ == "__main__":
  app.run(main)
