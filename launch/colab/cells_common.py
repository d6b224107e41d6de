"""Cells shared by the Colab notebooks, and the helpers that make cells.

Every notebook starts with `small_cell()` (the `SMALL` switch), then an intro,
`install_cell()`, `devices_cell()` and `helpers_cell()` (logging, output folders,
config loading, `formnet_config`, metric plots). The notebook-specific cells are in
`cells_quickstart.py`, `cells_pretrain.py` and `cells_export.py`; `make_notebooks.py`
assembles and writes them.
"""

from __future__ import annotations

import textwrap

import nbformat

REPO_URL = "https://github.com/flaxdoc/flaxdoc"
COLAB_URL = "https://colab.research.google.com/github/flaxdoc/flaxdoc/blob/main/launch/colab"
BADGE = "https://colab.research.google.com/assets/colab-badge.svg"


def md(text: str) -> nbformat.NotebookNode:
  return nbformat.v4.new_markdown_cell(textwrap.dedent(text).strip("\n"))


def code(text: str) -> nbformat.NotebookNode:
  return nbformat.v4.new_code_cell(textwrap.dedent(text).strip("\n"))


def badge(name: str) -> str:
  """The "Open in Colab" badge of notebook `name` (markdown)."""
  return f"[![Open In Colab]({BADGE})]({COLAB_URL}/{name}.ipynb)"


def small_cell() -> nbformat.NotebookNode:
  # Always cell 0: the one switch a user (or the test) flips before running everything.
  return code('''
      # @title The small-config switch { display-mode: "form" }
      # SMALL = True: a tiny model, a few steps and a handful of documents, so that the
      # whole notebook runs top to bottom in minutes, even on a CPU runtime.
      # SMALL = False: the real configuration, meant for a TPU runtime
      # (Runtime > Change runtime type > TPU).
      import os

      SMALL = False  # @param {type:"boolean"}
      if os.environ.get("FLAXDOC_NOTEBOOK_SMALL"):  # tests/test_notebooks.py sets it to 1
        SMALL = os.environ["FLAXDOC_NOTEBOOK_SMALL"] == "1"
      print("SMALL =", SMALL)
      ''')


def install_cell(extra: str = "") -> nbformat.NotebookNode:
  """Clone + `pip install -e` in Colab; a local checkout is used as it is."""
  extras = (f'["{extra}"] + (["tpu"] if on_tpu_vm() else [])' if extra
            else '["tpu"] if on_tpu_vm() else []')
  # Colab has torch; elsewhere PyPI's Linux wheel is the CUDA build (gigabytes), so the CPU
  # wheel comes first from PyTorch's index, as in the README's quick start.
  cpu_torch = ("""
        if not IN_COLAB and importlib.util.find_spec("torch") is None:
          subprocess.run([sys.executable, "-m", "pip", "install", "-q", "torch",
                          "--index-url", "https://download.pytorch.org/whl/cpu"], check=True)"""
               if extra == "torch" else "")
  return code(f'''
      # @title Install flaxdoc
      # In Colab this clones {REPO_URL} and installs it (a minute). Next to a
      # local checkout (Jupyter started inside a clone, or $FLAXDOC_REPO set, as in the
      # tests) that checkout is used and nothing is installed.
      import glob
      import importlib.util
      import subprocess
      import sys
      from pathlib import Path

      REPO_URL = "{REPO_URL}"

      try:
        import google.colab  # noqa: F401  (only importable inside Colab)
        IN_COLAB = True
      except ImportError:
        IN_COLAB = False


      def find_checkout():
        """A flaxdoc source tree (with its configs/ folder) to use as it is, or None."""
        candidates = []
        if os.environ.get("FLAXDOC_REPO"):
          candidates.append(Path(os.environ["FLAXDOC_REPO"]))
        spec = importlib.util.find_spec("flaxdoc")
        if spec is not None and spec.origin:
          candidates.append(Path(spec.origin).resolve().parents[1])
        candidates += [Path.cwd(), *Path.cwd().parents]
        for root in candidates:
          if (root / "flaxdoc" / "__init__.py").is_file() and (root / "configs").is_dir():
            return root.resolve()
        return None


      def on_tpu_vm():
        """A TPU VM runtime (Colab's TPU runtimes are TPU VMs): it needs jax[tpu]."""
        return bool(os.environ.get("TPU_ACCELERATOR_TYPE") or glob.glob("/dev/accel*")
                    or glob.glob("/dev/vfio/[0-9]*"))


      REPO = find_checkout()
      if REPO is None:
        REPO = Path("/content/flaxdoc") if IN_COLAB else Path.cwd() / "flaxdoc"
        if not REPO.exists():
          subprocess.run(["git", "clone", "--depth=1", REPO_URL, str(REPO)], check=True){cpu_torch}
        extras = {extras}
        spec = f"{{REPO}}[{{','.join(extras)}}]" if extras else str(REPO)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", spec], check=True)
        print("installed flaxdoc from", REPO_URL, "into", REPO)
      else:
        print("using the flaxdoc checkout in", REPO)
      # An editable install is only picked up by new processes: put the checkout on the
      # path of this kernel, and on PYTHONPATH for the command-line tools run below.
      if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
      os.environ["PYTHONPATH"] = os.pathsep.join(
          [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
      import flaxdoc

      print("flaxdoc", flaxdoc.__version__)
      ''')


def devices_cell() -> nbformat.NotebookNode:
  return code('''
      # @title Accelerators
      import jax

      DEVICES = jax.devices()
      N_DEVICES = len(DEVICES)
      PLATFORM = DEVICES[0].platform
      print(f"jax {jax.__version__}: {N_DEVICES} {PLATFORM} device(s)")
      for device in DEVICES:
        print("  ", device)
      if PLATFORM == "cpu" and not SMALL:
        print("\\nNo accelerator: pick a TPU runtime (Runtime > Change runtime type > TPU) or "
              "set SMALL = True in the first cell.")
      ''')


def helpers_cell() -> nbformat.NotebookNode:
  """Logging, output folders, config loading and the shared FormNet config."""
  return code('''
      # @title Helpers: output folders, logging, configs
      import json
      import logging

      import ml_collections
      from IPython.display import Image, display

      # flaxdoc's own log lines (mesh, dataset reports, checkpoints) in the cell output.
      _handler = logging.StreamHandler(sys.stdout)
      _handler.setFormatter(logging.Formatter("%(levelname).1s %(name)s: %(message)s"))
      _flaxdoc_log = logging.getLogger("flaxdoc")
      _flaxdoc_log.handlers[:] = [_handler]
      _flaxdoc_log.setLevel(logging.INFO)
      _flaxdoc_log.propagate = False
      for _noisy in ("absl", "orbax", "jax._src", "grain", "tensorflow_datasets"):
        logging.getLogger(_noisy).setLevel(logging.WARNING)

      # Runs (checkpoints, metrics, pictures) and data. /content is lost when the Colab
      # runtime is recycled: see pretrain_tpu.ipynb for runs on Google Drive or GCS.
      BASE = Path("/content") if IN_COLAB else Path.cwd()
      RUNS, DATA = BASE / "runs", BASE / "data"
      RUNS.mkdir(parents=True, exist_ok=True)
      DATA.mkdir(parents=True, exist_ok=True)

      # A tiny FormNet (as in tests/train/tiny.py): it compiles in seconds on a CPU.
      TINY = {"model.width": 32, "model.depth": 1, "model.gcn_layers": 1, "model.mlp_dim": 64,
              "model.num_heads": 2, "model.local_radius": 8, "data.max_len": 48,
              "batch_size": 4, "eval_batch_size": 8, "log_every": 2, "async_checkpoints": False}


      def load_config(path, arg=""):
        """`get_config(arg)` of a config file, as `--config=path:arg` does."""
        spec = importlib.util.spec_from_file_location("flaxdoc_config", REPO / path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.get_config(arg or None)


      def override(config, overrides):
        """Sets dotted fields, as `--config.a.b=value` does; an unknown field is an error."""
        for key, value in overrides.items():
          node = config
          *parents, leaf = key.split(".")
          for name in parents:
            node = node[name]
          if leaf not in node:
            raise KeyError(f"the config has no field {key!r}")
          node[leaf] = value
        return config


      def formnet_config(arg=""):
        """configs/formnet_a2.py[:arg]: tiny when SMALL, bfloat16 on TPUs.

        The global batch is rounded up to a multiple of the number of devices: every
        device of the mesh gets the same number of rows.
        """
        args = (["local"] if SMALL else []) + ([arg] if arg else [])
        config = load_config("configs/formnet_a2.py", ",".join(args))
        if SMALL:
          override(config, TINY)
        elif PLATFORM == "tpu":
          config.dtype = "bfloat16"
        config.batch_size = -(-config.batch_size // N_DEVICES) * N_DEVICES
        config.eval_batch_size = -(-config.eval_batch_size // N_DEVICES) * N_DEVICES
        return config


      def reach_workdir(workdir):
        """Mounts Drive for a /content/drive path. For gs://, signs in (in Colab: credentials
        for TensorStore and gcsfs) and installs gcsfs, through which etils.epath reaches gs://
        (Orbax's metadata, config.json, metrics, eval/predict outputs, the export)."""
        if workdir.startswith("/content/drive"):
          from google.colab import drive
          drive.mount("/content/drive")
        elif workdir.startswith("gs://"):
          if IN_COLAB:
            from google.colab import auth
            auth.authenticate_user()
          if importlib.util.find_spec("gcsfs") is None:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "gcsfs"], check=True)
            importlib.invalidate_caches()


      def read_metrics(workdir):
        """The rows of WORKDIR/metrics.jsonl (local, Drive or gs:// folders)."""
        from etils import epath
        path = epath.Path(str(workdir)) / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] \\
            if path.exists() else []


      def plot_run(workdir, title):
        """Training loss and, when there is one, the dev F1 of a run."""
        import matplotlib.pyplot as plt
        rows = read_metrics(workdir)
        train = [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r]
        evals = [(r["step"], r["eval/f1"]) for r in rows if "eval/f1" in r]
        fig, axes = plt.subplots(1, 2 if evals else 1, figsize=(10 if evals else 5, 3),
                                 squeeze=False)
        axes[0, 0].plot(*zip(*train))
        axes[0, 0].set(xlabel="step", ylabel="training loss")
        if evals:
          axes[0, 1].plot(*zip(*evals), marker="o")
          axes[0, 1].set(xlabel="step", ylabel="dev F1", ylim=(0, 1))
        fig.suptitle(title)
        plt.show()
      ''')
