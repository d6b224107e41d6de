r"""Writes the Colab notebooks of this folder from their cell sources.

    python launch/colab/make_notebooks.py           # (re)write the three .ipynb files
    python launch/colab/make_notebooks.py --check   # exit 1 if a committed notebook differs

The notebooks are generated so that they stay reviewable (a diff of the cell
modules reads like code) and consistent (the install, device and config cells are
shared). The cells live in `cells_common.py` (shared) and `cells_quickstart.py`,
`cells_pretrain.py`, `cells_export.py`. Edit those, not the `.ipynb` files, then run
this script; `tests/test_notebooks.py` fails when the committed notebooks and the
generator disagree.

Every notebook:

* starts with the `SMALL` switch (`True`: a tiny model, a few steps and a handful of
  documents, so the notebook runs top to bottom on a CPU runtime in minutes;
  `FLAXDOC_NOTEBOOK_SMALL=1` in the environment sets it, as the tests do);
* installs flaxdoc from GitHub in Colab, or uses a local checkout when one is found
  (`FLAXDOC_REPO`, the kernel's working directory or an importable `flaxdoc`);
* is committed with its outputs cleared, with deterministic cell ids.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
# The cell modules sit next to this script (also when a test loads it by path).
if str(HERE) not in sys.path:
  sys.path.insert(0, str(HERE))

# pylint: disable=wrong-import-position
import cells_export  # noqa: E402
import cells_pretrain  # noqa: E402
import cells_quickstart  # noqa: E402
from cells_common import BADGE, COLAB_URL, REPO_URL, badge  # noqa: E402,F401

NOTEBOOK_NAMES = ("quickstart_tpu", "pretrain_tpu", "export_pytorch")
NOTEBOOKS = {"quickstart_tpu": cells_quickstart.quickstart,
             "pretrain_tpu": cells_pretrain.pretrain,
             "export_pytorch": cells_export.export_pytorch}
# Colab opens TPU notebooks on a TPU runtime ("V28": TPU v2-8, 8 cores).
ACCELERATOR = {"quickstart_tpu": "TPU", "pretrain_tpu": "TPU", "export_pytorch": None}


def build(name: str) -> nbformat.NotebookNode:
  """The notebook `name` (one of NOTEBOOK_NAMES), outputs cleared, cell ids stable."""
  nb = nbformat.v4.new_notebook()
  nb.cells = NOTEBOOKS[name]()
  for i, cell in enumerate(nb.cells):
    cell["id"] = f"{name}-{i:02d}"  # stable ids: regenerating gives byte-identical files
  nb.metadata = {
      "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
      "language_info": {"name": "python"},
      "colab": {"provenance": [], "toc_visible": True},
  }
  if ACCELERATOR[name] == "TPU":
    nb.metadata["accelerator"] = "TPU"
    nb.metadata["colab"]["gpuType"] = "V28"
  nbformat.validate(nb)
  return nb


def render(name: str) -> str:
  """The exact text of `<name>.ipynb`."""
  return nbformat.writes(build(name), version=4) + "\n"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--check", action="store_true",
                      help="compare with the files on disk instead of writing them")
  parser.add_argument("--out", type=Path, default=HERE, help="folder to write into")
  args = parser.parse_args(argv)
  stale = []
  for name in NOTEBOOK_NAMES:
    path = args.out / f"{name}.ipynb"
    text = render(name)
    if args.check:
      if not path.is_file() or path.read_text(encoding="utf-8") != text:
        stale.append(path)
    else:
      path.write_text(text, encoding="utf-8")
      print(f"wrote {path}")
  if stale:
    print("out of date (run python launch/colab/make_notebooks.py): "
          + ", ".join(str(p) for p in stale), file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
