"""The Colab notebooks in `launch/colab/`: generated, valid, cleared, and runnable.

Fast checks: the committed `.ipynb` files are exactly what `make_notebooks.py`
writes (so nobody edits one by hand and forgets the generator), they are valid
nbformat 4 with outputs cleared, the first cell is the `SMALL` switch and obeys
`FLAXDOC_NOTEBOOK_SMALL`, every code cell is valid Python, the install cell uses a
local checkout without touching the network (and otherwise clones and pip-installs
the GitHub repository), and the README has an "Open in Colab" badge per notebook.

Slow checks (`-m slow`): each notebook is executed top to bottom with nbclient in
a fresh kernel with `FLAXDOC_NOTEBOOK_SMALL=1` on the CPU, offline (FUNSD comes from
the shared datasets folder when there is one), and what it wrote is inspected: the
checkpoints, metrics, pictures, the 8-device FSDP mesh and `init_from` of the
pre-training notebook, the PyTorch/JAX agreement of the export notebook.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

import flaxdoc  # noqa: F401,E402  (the install cell imports it; the test must not depend on cwd)

ROOT = Path(__file__).resolve().parents[1]
COLAB = ROOT / "launch" / "colab"
NAMES = ("quickstart_tpu", "pretrain_tpu", "export_pytorch")


def _generator():
  spec = importlib.util.spec_from_file_location("make_notebooks", COLAB / "make_notebooks.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


GEN = _generator()


def _read(name: str):
  return nbformat.read(COLAB / f"{name}.ipynb", as_version=4)


def _cell(nb, title: str):
  """The code cell whose `# @title` line is `title`."""
  for cell in nb.cells:
    if cell.cell_type == "code" and cell.source.startswith(f"# @title {title}"):
      return cell
  raise AssertionError(f"no code cell titled {title!r}")


def _datasets_dir() -> Path:
  env = os.environ.get("FLAXDOC_DATASETS")
  return Path(env) if env else Path(__file__).resolve().parents[1] / ".." / "shared" / "datasets"


# ----------------------------------------------------------------------------- static
def test_generator_lists_every_notebook_in_the_folder():
  assert set(GEN.NOTEBOOK_NAMES) == set(NAMES)
  assert sorted(p.stem for p in COLAB.glob("*.ipynb")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_is_what_the_generator_writes(name):
  committed = (COLAB / f"{name}.ipynb").read_text(encoding="utf-8")
  assert committed == GEN.render(name), (
      f"{name}.ipynb differs from launch/colab/make_notebooks.py: edit the generator and run "
      "python launch/colab/make_notebooks.py")


def test_generator_check_mode_reports_a_stale_notebook(tmp_path, capsys):
  assert GEN.main(["--out", str(tmp_path)]) == 0  # writes all three
  assert GEN.main(["--out", str(tmp_path), "--check"]) == 0
  stale = tmp_path / "pretrain_tpu.ipynb"
  stale.write_text(stale.read_text().replace("SMALL = False", "SMALL = True"))
  assert GEN.main(["--out", str(tmp_path), "--check"]) == 1
  assert "pretrain_tpu.ipynb" in capsys.readouterr().err


@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_valid_and_has_no_outputs(name):
  nb = _read(name)
  nbformat.validate(nb)
  assert nb.metadata.kernelspec.name == "python3"
  ids = [cell.id for cell in nb.cells]
  assert len(set(ids)) == len(ids)
  for cell in nb.cells:
    if cell.cell_type == "code":
      assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]
    assert "executionInfo" not in cell.metadata and "outputId" not in cell.metadata
  if name.endswith("_tpu"):
    assert nb.metadata.accelerator == "TPU"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("env, expected", [("1", True), ("0", False), (None, False)])
def test_first_cell_is_the_small_switch(name, env, expected, monkeypatch, capsys):
  first = _read(name).cells[0]
  assert first.cell_type == "code"
  assert re.search(r"^SMALL = (True|False)\b", first.source, re.M)
  if env is None:
    monkeypatch.delenv("FLAXDOC_NOTEBOOK_SMALL", raising=False)
  else:
    monkeypatch.setenv("FLAXDOC_NOTEBOOK_SMALL", env)
  namespace: dict = {}
  exec(compile(first.source, f"{name}[0]", "exec"), namespace)  # pylint: disable=exec-used
  assert namespace["SMALL"] is expected
  assert capsys.readouterr().out == f"SMALL = {expected}\n"


@pytest.mark.parametrize("name", NAMES)
def test_code_cells_are_python(name):
  for i, cell in enumerate(_read(name).cells):
    if cell.cell_type == "code":
      compile(cell.source, f"{name}[{i}]", "exec")


def _run_install_cell(name, monkeypatch, tmp_path, *, checkout: bool, torch: bool = True):
  """Executes the install cell with subprocess.run recorded (never run); `torch=False`:
  as if torch were not installed."""
  commands = []

  def fake_run(cmd, check=False, **kwargs):  # pylint: disable=unused-argument
    commands.append([str(c) for c in cmd])

  import subprocess  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(subprocess, "run", fake_run)
  # Without the checkout on the path, to see the cell put it first.
  monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p or ".").resolve() != ROOT])
  monkeypatch.setenv("PYTHONPATH", "/elsewhere")
  monkeypatch.chdir(tmp_path)
  if checkout:
    monkeypatch.setenv("FLAXDOC_REPO", str(ROOT))
  else:
    # As in a fresh Colab runtime: no checkout anywhere, flaxdoc not importable.
    monkeypatch.delenv("FLAXDOC_REPO", raising=False)
    real_find_spec = importlib.util.find_spec
    missing = {"flaxdoc"} | (set() if torch else {"torch"})
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n in missing else real_find_spec(n, *a))
  namespace = {"os": os}
  source = _cell(_read(name), "Install flaxdoc").source
  exec(compile(source, name, "exec"), namespace)  # pylint: disable=exec-used
  return namespace, commands


def test_install_cell_uses_a_local_checkout_and_runs_nothing(monkeypatch, tmp_path):
  namespace, commands = _run_install_cell("quickstart_tpu", monkeypatch, tmp_path, checkout=True)
  assert commands == []
  assert namespace["REPO"] == ROOT
  assert sys.path[0] == str(ROOT)
  assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/elsewhere"]


@pytest.mark.parametrize("name, spec_suffix, torch",
                         [("quickstart_tpu", "", False), ("export_pytorch", "[torch]", True),
                          ("export_pytorch", "[torch]", False)])
def test_install_cell_clones_and_pip_installs_without_a_checkout(name, spec_suffix, torch,
                                                                  monkeypatch, tmp_path):
  namespace, commands = _run_install_cell(name, monkeypatch, tmp_path, checkout=False,
                                          torch=torch)
  target = tmp_path / "flaxdoc"
  assert namespace["REPO"] == target
  if namespace["on_tpu_vm"]():  # a TPU VM also gets jax[tpu]
    spec_suffix = spec_suffix[:-1] + ",tpu]" if spec_suffix else "[tpu]"
  # Without torch, outside Colab, the export notebook takes the CPU wheel first (PyPI's Linux
  # wheel is the CUDA build); the quickstart needs no torch.
  cpu_torch = ([[sys.executable, "-m", "pip", "install", "-q", "torch", "--index-url",
                 "https://download.pytorch.org/whl/cpu"]]
               if name == "export_pytorch" and not torch else [])
  assert commands == [
      ["git", "clone", "--depth=1", GEN.REPO_URL, str(target)],
      *cpu_torch,
      [sys.executable, "-m", "pip", "install", "-q", "-e", f"{target}{spec_suffix}"],
  ]


def test_readme_has_an_open_in_colab_badge_per_notebook():
  readme = (COLAB / "README.md").read_text(encoding="utf-8")
  for name in NAMES:
    assert GEN.badge(name) in readme, name
    url = f"https://colab.research.google.com/github/flaxdoc/flaxdoc/blob/main/launch/colab/{name}"
    assert f"{GEN.COLAB_URL}/{name}.ipynb" == f"{url}.ipynb"
  linked = set(re.findall(r"launch/colab/(\w+)\.ipynb", readme))
  assert linked == set(NAMES)


# ----------------------------------------------------------------------------- executed
def _execute(name: str, tmp_path: Path, monkeypatch) -> tuple[object, str]:
  """Runs the notebook in a fresh kernel (cwd = tmp_path); returns it and its text output."""
  nbclient = pytest.importorskip("nbclient")
  pytest.importorskip("ipykernel")
  monkeypatch.setenv("FLAXDOC_NOTEBOOK_SMALL", "1")
  monkeypatch.setenv("FLAXDOC_REPO", str(ROOT))
  monkeypatch.setenv("FLAXDOC_NOTEBOOK_OFFLINE", "1")
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  datasets = _datasets_dir()
  if datasets.is_dir():
    monkeypatch.setenv("FLAXDOC_DATASETS", str(datasets.resolve()))
  else:
    monkeypatch.delenv("FLAXDOC_DATASETS", raising=False)
  if name == "pretrain_tpu":
    # 8 CPU devices stand in for the 8 cores of a TPU v2-8 runtime.
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  nb = _read(name)
  client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                   resources={"metadata": {"path": str(tmp_path)}})
  client.execute()  # raises CellExecutionError with the cell's traceback
  text = []
  for cell in nb.cells:
    for out in cell.get("outputs", []):
      if out.output_type == "stream":
        text.append(out.text)
      elif "text/plain" in out.get("data", {}):
        text.append(out.data["text/plain"])
  return nb, "".join(text)


def _metrics(workdir: Path) -> list[dict]:
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()
          if line.strip()]


def _checkpoint_steps(workdir: Path) -> list[int]:
  return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def _check_finetuning_run(workdir: Path, total: int, eval_steps: list[int]):
  rows = _metrics(workdir)
  losses = [r["train/loss"] for r in rows if "train/loss" in r]
  assert losses and all(math.isfinite(x) for x in losses)
  evals = [r for r in rows if "eval/f1" in r]
  assert [r["step"] for r in evals] == eval_steps
  assert all(0.0 <= r["eval/f1"] <= 1.0 for r in evals)
  assert _checkpoint_steps(workdir)[-1] == total
  assert json.loads((workdir / "config.json").read_text())["model"]["width"] == 32  # tiny


def _png_size(path: Path) -> tuple[int, int]:
  from PIL import Image  # pylint: disable=import-outside-toplevel
  with Image.open(path) as image:
    assert image.format == "PNG"
    return image.size


@pytest.mark.slow
def test_quickstart_runs_with_small(tmp_path, monkeypatch):
  # Before _execute, which replaces $FLAXDOC_DATASETS by what it hands the kernel.
  funsd_here = (_datasets_dir() / "funsd" / "training_data" / "annotations").is_dir()
  nb, text = _execute("quickstart_tpu", tmp_path, monkeypatch)
  assert text.startswith("SMALL = True\n")
  assert "using the flaxdoc checkout in" in text
  runs = tmp_path / "runs"
  _check_finetuning_run(runs / "formnet_synthetic", total=8, eval_steps=[4, 8])
  # The gold and predicted pictures of one page: same page, same legend, same size.
  pictures = runs / "pictures"
  [gold] = pictures.glob("*_gold.png")
  [predicted] = pictures.glob("*_predicted.png")
  assert gold.name.removesuffix("_gold.png") == predicted.name.removesuffix("_predicted.png")
  assert _png_size(gold) == _png_size(predicted)
  _png_size(pictures / "synthetic_sample.png")
  shown = [out for cell in nb.cells for out in cell.get("outputs", [])
           if "image/png" in out.get("data", {})]
  assert len(shown) >= 3 + 1  # sample, gold, predicted + at least one loss plot
  if funsd_here:
    _check_finetuning_run(runs / "formnet_funsd", total=8, eval_steps=[4, 8])
    scores = json.loads((runs / "formnet_funsd" / "eval_dev.json").read_text())
    assert f"F1 {scores['f1']:.3f}" in text  # the notebook printed what run_eval saved
    assert "micro avg" in text
  else:
    assert "FUNSD is not available" in text
    assert (runs / "formnet_synthetic" / "eval_dev.json").is_file()


@pytest.mark.slow
def test_pretrain_runs_with_small_on_eight_devices(tmp_path, monkeypatch):
  _, text = _execute("pretrain_tpu", tmp_path, monkeypatch)
  assert "8 cpu device(s)" in text
  assert "mesh {'data': 1, 'fsdp': 8, 'tensor': 1} over 8 devices" in text
  runs = tmp_path / "runs"
  corpus = tmp_path / "data" / "demo_corpus.jsonl"
  assert len(corpus.read_text().splitlines()) == 40
  pre = runs / "pretrain"
  assert _checkpoint_steps(pre)[-1] == 6
  losses = [r["train/loss"] for r in _metrics(pre) if "train/loss" in r]
  # An untrained MLM head predicts close to uniformly: the loss starts near ln(vocab).
  from flaxdoc.data import tokenizers  # pylint: disable=import-outside-toplevel
  vocab = tokenizers.load_tokenizer("default").vocab_size
  assert abs(losses[0] - math.log(vocab)) < 1.0, (losses[0], math.log(vocab))
  # Fine-tuning started from the pre-trained encoder: tensors loaded, only the tagging head new.
  match = re.search(r"init_from \S+ \(step 6\): (\d+) tensors loaded, (\d+) new \(([^)]*)\)", text)
  assert match, "no init_from log line"
  assert int(match.group(1)) > 0
  assert all(name.startswith("tagging_head/") for name in match.group(3).split(", "))
  _check_finetuning_run(runs / "finetune", total=6, eval_steps=[3, 6])


@pytest.mark.slow
def test_export_runs_with_small(tmp_path, monkeypatch):
  _, text = _execute("export_pytorch", tmp_path, monkeypatch)
  out = tmp_path / "runs" / "export"
  config = json.loads((out / "config.json").read_text())
  assert config["tag_names"] and config["tag_names"][0] == "O"
  assert (out / "model.safetensors").stat().st_size > 0
  gap = re.search(r"max \|log p\(PyTorch\) - log p\(JAX\)\| over (\d+) tokens: (\S+)", text)
  assert gap and int(gap.group(1)) > 0 and float(gap.group(2)) < 1e-3
  same = re.search(r"same entities from PyTorch and JAX: (\d+) of (\d+)", text)
  assert same and same.group(1) == same.group(2)
  assert "max |traced - eager| logit difference" in text
