"""An unlabelled pre-training corpus a user can make: synthetic forms + receipt words, JSON Lines.

    python -m flaxdoc.data.corpus --out corpus.jsonl --synthetic 2000 \
        --cord ../shared/datasets/cord --sroie ../shared/datasets/sroie
    python -m flaxdoc.main --config=configs/formnet_a2.py:local,mode=pretrain \
        --config.data.dataset=jsonl:corpus.jsonl --workdir=/tmp/pre

MLM pre-training needs words, boxes and pages only, so every document is written
without entities or relations (`flaxdoc.document/1` lines, readable by
`load_dataset("jsonl:corpus.jsonl", ...)`). Sources:

* `--synthetic N`: the first `N` documents of flaxdoc's synthetic generator (seed
  `--seed`, which must differ from the fine-tuning seed if both are synthetic);
* `--cord DIR`, `--sroie DIR`: the *official training* receipts of CORD / SROIE
  (their dev / test splits are never read, so nothing evaluated later leaks in);
* `--jsonl FILE`: any other flaxdoc JSON Lines file (its labels are dropped).

Document ids are prefixed with their source (`cord/`, `sroie/`, ...) so they stay
unique. Unreadable documents are reported by the dataset readers and skipped.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Iterable, Iterator, Sequence

from flaxdoc.data import datasets
from flaxdoc.data.document import Document
from flaxdoc.data.jsonl import read_jsonl, write_jsonl

log = logging.getLogger(__name__)


def unlabelled(doc: Document, prefix: str) -> Document:
  """`doc` without entities / relations, its id prefixed by its source."""
  return doc.replace(id=f"{prefix}/{doc.id}", entities=None, relations=())


def synthetic_documents(count: int, seed: int = 1) -> Iterator[Document]:
  from flaxdoc.data.synthetic import make_document  # pylint: disable=import-outside-toplevel
  for i in range(int(count)):
    yield unlabelled(make_document(seed, i), "synthetic")


def dataset_train_documents(name: str, data_dir: str) -> list[Document]:
  """The whole official train split of a dataset (no dev carved), unlabelled."""
  docs, report = datasets.load_dataset(name, "train", data_dir=data_dir, dev_fraction=0.0,
                                       on_error="skip")
  log.info("%s", report.summary())
  return [unlabelled(d, name) for d in docs]


def build_corpus(*, synthetic: int = 0, seed: int = 1, cord: str | None = None,
                 sroie: str | None = None, jsonl: Sequence[str] = ()) -> Iterable[Document]:
  """The corpus documents, source by source (synthetic ones generated lazily)."""
  if synthetic:
    yield from synthetic_documents(synthetic, seed)
  for name, folder in (("cord", cord), ("sroie", sroie)):
    if folder:
      yield from dataset_train_documents(name, folder)
  for path in jsonl:
    docs, _ = read_jsonl(path)
    yield from (unlabelled(d, "jsonl") for d in docs)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m flaxdoc.data.corpus",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", required=True, help="the JSON Lines file to write")
  parser.add_argument("--synthetic", type=int, default=0, help="synthetic documents to add")
  parser.add_argument("--seed", type=int, default=1, help="synthetic generator seed")
  parser.add_argument("--cord", help="CORD folder (its official train split is read)")
  parser.add_argument("--sroie", help="SROIE folder (its official train split is read)")
  parser.add_argument("--jsonl", nargs="*", default=(), help="more flaxdoc JSON Lines files")
  args = parser.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(message)s")
  if not (args.synthetic or args.cord or args.sroie or args.jsonl):
    parser.error("give at least one source: --synthetic N, --cord DIR, --sroie DIR or --jsonl")
  try:
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel
  except ImportError:  # pragma: no cover - tqdm is a dependency
    def tqdm(x, **_):
      return x
  docs = build_corpus(synthetic=args.synthetic, seed=args.seed, cord=args.cord,
                      sroie=args.sroie, jsonl=args.jsonl)
  try:
    n = write_jsonl(args.out, tqdm(docs, desc="corpus", unit="doc"))
  except (datasets.DatasetNotFoundError, ValueError) as e:
    print(f"flaxdoc.data.corpus: {e}", file=sys.stderr)
    return 2
  print(f"wrote {n} documents to {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
