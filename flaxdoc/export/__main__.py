"""CLI: `python -m flaxdoc.export --workdir DIR --out OUT [--config configs/x.py[:arg]]`.

Writes `OUT/model.safetensors`, `OUT/config.json` and the tokenizer's files
(`OUT/tokenizer/`) from the latest checkpoint of a training run; load them in PyTorch
with `flaxdoc.export.torch.load_exported(OUT)`, or serve documents with
`flaxdoc.export.torch.pipeline.DocumentPipeline.from_exported(OUT)`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m flaxdoc.export", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True, help="training run directory (checkpoints/)")
  parser.add_argument("--out", required=True, help="output directory")
  parser.add_argument("--config", default=None,
                      help="training config FILE[:ARG]; default WORKDIR/config.json")
  parser.add_argument("--json", action="store_true", help="print the summary as JSON")
  args = parser.parse_args(argv)
  from flaxdoc.export.exporter import export_workdir  # pylint: disable=import-outside-toplevel
  from flaxdoc.train.checkpoint_recovery import CheckpointError  # pylint: disable=import-outside-toplevel
  try:
    summary = export_workdir(args.workdir, args.out, args.config)
  except (FileNotFoundError, ValueError, CheckpointError) as err:  # damaged / mismatching: one line
    print(f"flaxdoc.export: {err}", file=sys.stderr)
    return 2
  if args.json:
    print(json.dumps(summary))
  else:
    print(f"exported step {summary['step']}: {summary['tensors']} tensors "
          f"({summary['parameters']:,} parameters) to {summary['out']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
