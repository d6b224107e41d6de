"""`python -m flaxdoc.data.ocr --engine rapidocr --out docs.jsonl FILES...`: OCR once, train later.

Reads images (PNG, JPEG, TIFF) and PDFs (text layer where there is one, OCR
where not) with a progress bar and writes them as `flaxdoc.document/1` JSON
Lines (`flaxdoc.data.jsonl`), page images included, to feed `predict`
(`--config.predict.input=docs.jsonl`) or a `jsonl:` dataset. Files that cannot
be read are listed with the reason, and the summary says how many pages were read
from a PDF's text layer and how many by the engine; the exit status is 1 when none
could. Encrypted PDFs are opened with the password in the environment variable
FLAXDOC_PDF_PASSWORD (not an argument: it would show in `ps` and the shell's history).
"""

from __future__ import annotations

import argparse
import sys

from flaxdoc.data.jsonl import write_jsonl
from flaxdoc.data.ocr.engine import DEFAULT_ENGINE, ENGINES
from flaxdoc.data.ocr.reader import DEFAULT_DPI, read_documents


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m flaxdoc.data.ocr", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("files", nargs="+", help="image or PDF files")
  parser.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE)
  parser.add_argument("--out", required=True, help="output .jsonl file")
  parser.add_argument("--dpi", type=float, default=DEFAULT_DPI,
                      help="resolution PDF pages are rendered at for OCR")
  parser.add_argument("--cache_dir", default=None, help="cache OCR results here (JSON)")
  args = parser.parse_args(argv)
  docs, report = read_documents(args.files, engine=args.engine, dpi=args.dpi,
                                cache_dir=args.cache_dir, progress=True)
  print(report.summary())
  if not docs:
    print("no readable file: nothing written", file=sys.stderr)
    return 1
  n = write_jsonl(args.out, docs)
  print(f"wrote {n} documents to {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
