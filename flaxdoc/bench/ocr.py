"""OCR engines against FUNSD's gold words: word recall, precision, box IoU and time per page.

    python -m flaxdoc.bench.ocr [--engines rapidocr,tesseract] [--limit 30] [--json]
                                [--data_dir ../shared/datasets] [--split train]
                                [--forms dev] [--cache_dir DIR]

For each FUNSD form (the first `--limit` of the split, sorted by id, all when 0;
with `--forms dev` the 20 training forms `load_dataset("funsd", "dev")` carves)
every engine reads the PNG (`flaxdoc.data.ocr.read_document`, no cache) and its
words are matched to the gold words (`flaxdoc.data.ocr.matching`: same
normalised text, box IoU >= 0.5, one to one). Per engine: recall = matched /
gold words, precision = matched / OCR words (both summed over the forms), mean
IoU of the matched boxes, and wall seconds per page (reading and OCR; the
engine's models are loaded once, before timing). Gold words with empty text (FUNSD's
check marks) are not counted, as the FUNSD reader skips them.

Note the load: timings on a shared machine are slower than on a quiet one.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from typing import Iterable, Sequence

from flaxdoc.bench.common import emit
from flaxdoc.bench.data import DATASETS_HELP, default_datasets_dir
from flaxdoc.data.document import Document
from flaxdoc.data.ocr import DEFAULT_DPI, ENGINES, OcrUnavailableError, get_engine, read_document
from flaxdoc.data.ocr import cache as cache_lib
from flaxdoc.data.ocr.matching import WordScores, word_scores
from flaxdoc.data.report import LoadReport

COLUMNS = ("bench", "engine", "pages", "gold_words", "ocr_words", "recall", "precision",
           "mean_iou", "s_per_page", "note")


def bench_engine(engine: str, pairs: Sequence[tuple[pathlib.Path, Document]], *,
                 progress: bool = True, cache_dir=None) -> dict:
  """One row: `engine` on `(image file, gold document)` pairs."""
  try:
    get_engine(engine)
  except OcrUnavailableError as e:
    return {"bench": "ocr", "engine": engine, "note": f"not installed: {e}"}
  total = WordScores()
  seconds = 0.0
  pages = 0
  for path, gold in _progress(pairs, progress, engine):
    t0 = time.perf_counter()
    read = LoadReport(str(path))  # where the page's words came from, for the cache
    doc = read_document(path, engine=engine, doc_id=gold.id, report=read)
    seconds += time.perf_counter() - t0
    if cache_dir is not None:
      cache_lib.store(cache_dir, path, engine, DEFAULT_DPI, doc, read.page_sources[gold.id])
    pages += doc.num_pages
    total += word_scores(gold, doc)
  return {"bench": "ocr", "engine": engine, "pages": pages, "gold_words": total.gold,
          "ocr_words": total.ocr, "recall": round(total.recall, 4),
          "precision": round(total.precision, 4), "mean_iou": round(total.mean_iou, 4),
          "s_per_page": round(seconds / max(pages, 1), 3), "note": ""}


def _progress(items, enabled: bool, engine: str) -> Iterable:
  if not enabled:
    return items
  try:
    from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
  except ImportError:
    return items
  return tqdm(items, desc=f"OCR bench ({engine})", unit="page", file=sys.stderr)


def funsd_pairs(funsd_dir: pathlib.Path, split: str, limit: int, forms: str = "first"
                ) -> list[tuple[pathlib.Path, Document]]:
  """(PNG, gold document) of the first `limit` forms of a FUNSD split (all when 0), or of
  the carved dev forms (`forms="dev"`, from the train split)."""
  from flaxdoc.data.datasets import DEV_SIZES, carve_dev  # pylint: disable=import-outside-toplevel
  from flaxdoc.data.funsd import SPLIT_DIRS, list_funsd_ids, load_funsd  # pylint: disable=import-outside-toplevel
  ids = list_funsd_ids(funsd_dir, split)
  if forms == "dev":
    ids = carve_dev(ids, DEV_SIZES["funsd"])[0]
  ids = ids[:limit] if limit > 0 else ids
  docs, _ = load_funsd(funsd_dir, split, ids=ids)
  out = []
  for doc in docs:
    image = pathlib.Path(doc.page_images[0].path) if doc.page_images else \
        funsd_dir / SPLIT_DIRS[split] / "images" / f"{doc.id}.png"
    out.append((image, doc))
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m flaxdoc.bench.ocr",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--json", action="store_true", help="one JSON object per engine")
  parser.add_argument("--data_dir", default=None,
                      help=DATASETS_HELP)
  parser.add_argument("--split", default="train", choices=("train", "test"))
  parser.add_argument("--limit", type=int, default=0, help="first N forms only (0: all)")
  parser.add_argument("--forms", default="first", choices=("first", "dev"),
                      help="first: forms in id order; dev: the carved dev forms (train split)")
  parser.add_argument("--engines", default=",".join(ENGINES))
  parser.add_argument("--cache_dir", default=None, help="also write OCR results to this cache")
  args = parser.parse_args(argv)
  if args.forms == "dev" and args.split != "train":
    parser.error("--forms dev carves from the train split")
  root = pathlib.Path(args.data_dir) if args.data_dir else default_datasets_dir()
  funsd_dir = root / "funsd"
  if not funsd_dir.is_dir():
    print(f"FUNSD not found under {root} (set --data_dir or $FLAXDOC_DATA_DIR)", file=sys.stderr)
    return 1
  pairs = funsd_pairs(funsd_dir, args.split, args.limit, args.forms)
  rows = [bench_engine(e.strip(), pairs, cache_dir=args.cache_dir)
          for e in args.engines.split(",") if e.strip()]
  which = "carved dev" if args.forms == "dev" else args.split
  emit(rows, as_json=args.json, columns=COLUMNS,
       title=f"OCR vs FUNSD {which} gold words ({len(pairs)} forms)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
