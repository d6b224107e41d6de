"""`python -m flaxdoc.data.synthetic`: statistics (and previews) of the synthetic dataset.

    python -m flaxdoc.data.synthetic --num 1000 --seed 0
    python -m flaxdoc.data.synthetic --num 3 --show 1 --kinds invoice
    python -m flaxdoc.data.synthetic --num 5 --target-words 16000
    python -m flaxdoc.data.synthetic --num 2 --pdf /tmp/pdfs   # PDFs to try `predict` on
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from flaxdoc.data.document import Document
from flaxdoc.data.synthetic.generator import LABELS, SyntheticConfig, make_document
from flaxdoc.data.synthetic.kinds import KINDS


def render_page(doc: Document, page: int = 0, columns: int = 110) -> str:
  """A page as plain text: words at their box positions on a character grid.

  Labelled words are marked with the first letters of their label in a legend
  line under the page; good enough to eyeball layouts in a terminal.
  """
  sel = np.flatnonzero(doc.pages == page)
  width, height = doc.page_sizes[page]
  if not len(sel):
    return "(empty page)"
  # One grid cell per typical character and per typical line.
  lengths = np.array([len(doc.words[i]) for i in sel])
  char_w = float(np.median((doc.boxes[sel, 2] - doc.boxes[sel, 0]) / lengths))
  char_w = max(char_w, width / columns)
  line_h = 1.4 * float(np.median(doc.boxes[sel, 3] - doc.boxes[sel, 1]))
  rows, cols = int(height / line_h) + 1, int(width / char_w) + 1
  grid = [[" "] * (cols + 40) for _ in range(rows + 1)]
  row_end = [0] * (rows + 1)  # first free column of each row: words never overwrite
  for i in sorted(sel, key=lambda i: doc.boxes[i, 0]):
    x0, y0, _, y1 = doc.boxes[i]
    r = min(rows, int(((y0 + y1) / 2) / line_h))
    c = max(int(round(x0 / char_w)), row_end[r])
    for k, ch in enumerate(doc.words[i]):
      if c + k >= len(grid[r]):
        grid[r].append(" ")
      grid[r][c + k] = ch
    row_end[r] = c + len(doc.words[i]) + 1
  lines = ["".join(row).rstrip() for row in grid]
  while lines and not lines[-1]:
    lines.pop()
  return "\n".join(lines)


def _entity_summary(doc: Document) -> str:
  out = []
  for e in doc.entities or ():
    out.append(f"  {e.label:16s} {doc.entity_text(e)}")
  return "\n".join(out)


def _write_pdfs(parser: argparse.ArgumentParser, args: argparse.Namespace,
                config: SyntheticConfig) -> int:
  """`--pdf DIR`: one PDF per document, each path printed as soon as it is written."""
  # pylint: disable-next=import-outside-toplevel
  from flaxdoc.data.synthetic.render_pdf import pdf_file_name, write_pdf
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError:  # say so before anything is generated or written
    parser.error("--pdf needs matplotlib: pip install matplotlib")
  out = Path(args.pdf)
  try:
    out.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    parser.error(f"--pdf {args.pdf}: cannot create the folder ({e.strerror or e})")
  for k in range(args.num):
    doc = make_document(args.seed, args.start + k, config)
    # Synthetic ids ("synthetic-SEED-INDEX") are unique and safe as file names.
    print(write_pdf(doc, out / pdf_file_name(doc.id)), flush=True)
  return 0


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m flaxdoc.data.synthetic", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--num", type=int, default=1000, help="documents to generate")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--start", type=int, default=0, help="first document index")
  p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated subset of {KINDS}")
  p.add_argument("--min-pages", type=int, default=1)
  p.add_argument("--max-pages", type=int, default=1)
  p.add_argument("--target-words", type=int, default=0)
  p.add_argument("--max-items", type=int, default=SyntheticConfig.max_items)
  p.add_argument("--interleave-columns", type=float, default=SyntheticConfig.interleave_columns)
  p.add_argument("--shuffle-blocks", type=float, default=SyntheticConfig.shuffle_blocks)
  p.add_argument("--ocr-noise", type=float, default=0.0)
  p.add_argument("--show", type=int, default=0,
                 help="print the first page and the entities of this many documents")
  p.add_argument("--json", action="store_true", help="print the statistics as one JSON object")
  p.add_argument("--pdf", metavar="DIR",
                 help="instead of statistics, write the documents as PDFs with a text layer "
                 "(DIR/<id>.pdf, needs matplotlib; about half a second each) and print their paths")
  args = p.parse_args(argv)
  if args.num < 0 or args.start < 0:
    p.error(f"--num and --start must be >= 0, got {args.num} and {args.start}")
  try:
    config = SyntheticConfig(
        kinds=tuple(k.strip() for k in args.kinds.split(",") if k.strip()),
        min_pages=args.min_pages, max_pages=max(args.max_pages, args.min_pages),
        target_words=args.target_words, max_items=args.max_items,
        interleave_columns=args.interleave_columns, shuffle_blocks=args.shuffle_blocks,
        ocr_noise=args.ocr_noise)
  except ValueError as e:
    p.error(str(e))
  if args.pdf:
    return _write_pdfs(p, args, config)

  t0, cpu0 = time.perf_counter(), time.process_time()
  words, pages, segments, ents = [], [], [], []
  label_counts: collections.Counter = collections.Counter()
  docs_with: collections.Counter = collections.Counter()
  shown = []
  for k in range(args.num):
    doc = make_document(args.seed, args.start + k, config)
    words.append(len(doc))
    pages.append(doc.num_pages)
    segments.append(len(set(doc.segments.tolist())))
    ents.append(len(doc.entities))
    labels = [e.label for e in doc.entities]
    label_counts.update(labels)
    docs_with.update(set(labels))
    if k < args.show:
      shown.append(doc)
  seconds = time.perf_counter() - t0
  cpu_seconds = time.process_time() - cpu0
  n = max(args.num, 1)

  stats = {
      "docs": args.num, "seed": args.seed, "seconds": round(seconds, 3),
      "docs_per_s": round(args.num / seconds, 1) if seconds else None,
      # CPU time of this process: the speed on one free core, even on a busy machine.
      "docs_per_cpu_s": round(args.num / cpu_seconds, 1) if cpu_seconds else None,
      "words_per_doc": {"mean": round(float(np.mean(words)), 1) if words else 0,
                        "min": min(words, default=0), "max": max(words, default=0)},
      "pages_per_doc": {"mean": round(float(np.mean(pages)), 2) if pages else 0,
                        "max": max(pages, default=0)},
      "segments_per_doc": round(float(np.mean(segments)), 1) if segments else 0,
      "entities_per_doc": round(float(np.mean(ents)), 1) if ents else 0,
      "entities": {l: label_counts[l] for l in LABELS},
      "docs_with_label": {l: docs_with[l] for l in LABELS},
      "config": dataclasses.asdict(config),
  }
  if args.json:
    print(json.dumps(stats))
    return 0

  for doc in shown:
    print(f"==== {doc.id}: {len(doc)} words, {doc.num_pages} page(s), "
          f"page size {doc.page_sizes[0].astype(int).tolist()}")
    print(render_page(doc, 0))
    print("---- entities (in reading order)")
    print(_entity_summary(doc))
    print("---- reading order (first 60 words)")
    print(" ".join(doc.words[:60]))
    print()
  print(f"synthetic dataset, seed {args.seed}, documents {args.start}..{args.start + args.num - 1}")
  print(f"  config: {config}")
  print(f"  documents      {args.num}   ({stats['docs_per_s']} docs/s wall, {seconds:.2f} s; "
        f"{stats['docs_per_cpu_s']} docs per CPU second)")
  w = stats["words_per_doc"]
  print(f"  words / doc    mean {w['mean']}, min {w['min']}, max {w['max']}")
  pg = stats["pages_per_doc"]
  print(f"  pages / doc    mean {pg['mean']}, max {pg['max']}")
  print(f"  segments / doc {stats['segments_per_doc']}")
  print(f"  entities / doc {stats['entities_per_doc']}")
  print()
  print(f"  {'label':16s} {'entities':>9s} {'per doc':>8s} {'% of docs':>10s}")
  for label in LABELS:
    print(f"  {label:16s} {label_counts[label]:9d} {label_counts[label] / n:8.2f} "
          f"{100 * docs_with[label] / n:9.1f}%")
  return 0


if __name__ == "__main__":
  try:
    sys.exit(main())
  except BrokenPipeError:  # output piped into `head`: stop quietly
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(1)
