r"""A nearest-key geometric baseline for key -> value linking, for context.

    python -m flaxdoc.bench.linking_baseline --dataset funsd --data_dir ../shared/datasets/funsd
    python -m flaxdoc.bench.linking_baseline --dataset synthetic --num_dev 60

With the gold entities, each value entity is linked to the nearest candidate key
(a label the `config.linking.pairs` table allows) that lies to its left on the same
line or above it; a value with no such key gets none. Scored with
`metrics.RelationMetrics` against the gold relations. It needs no training: what
a learned linker must beat to be worth its cost. (Forms put an answer right of or
below its question; tables put a cell below its header, often not the *nearest*
one: the baseline shows how far geometry alone goes.) It also counts the gold pairs a
learned linker can reach with the gold entities when it links across windows
(`config.linking.scope="document"`): those whose key is among the value's
`--max_candidates` nearest allowed keys.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from flaxdoc import metrics as metrics_lib
from flaxdoc.data import datasets
from flaxdoc.data import linking as data_linking


def nearest_key_pairs(doc, allowed: np.ndarray, label_index: dict[str, int]
                      ) -> list[tuple[int, int]]:
  """`(key, value)` entity pairs: each value -> the nearest allowed key left of / above it."""
  ents = doc.entities or ()
  if not ents:
    return []
  boxes = data_linking.entity_boxes(doc, ents)  # [E, 4], pages stacked
  labels = [label_index.get(e.label, -1) for e in ents]
  pairs = []
  for v, lv in enumerate(labels):
    if lv < 0 or not allowed[:, lv].any():
      continue
    vx0, vy0, vx1, vy1 = boxes[v]
    best, best_d = None, np.inf
    for k, lk in enumerate(labels):
      if k == v or lk < 0 or not allowed[lk, lv]:
        continue
      kx0, ky0, kx1, ky1 = boxes[k]
      same_line = min(ky1, vy1) - max(ky0, vy0) > 0.3 * min(ky1 - ky0, vy1 - vy0)
      left = same_line and kx1 <= vx0 + 5
      above = ky1 <= vy0 + 5 and min(kx1, vx1) - max(kx0, vx0) > -20
      if not (left or above):
        continue
      dx = max(0.0, vx0 - kx1, kx0 - vx1)
      dy = max(0.0, vy0 - ky1)
      d = float(np.hypot(dx, dy))
      if d < best_d:
        best, best_d = k, d
    if best is not None:
      pairs.append((best, v))
  return pairs


def reachable_pairs(docs, pairs_spec: str, labels, max_candidates: int) -> tuple[int, int]:
  """`(reachable, gold)`: gold pairs whose key is among the value's `max_candidates` nearest
  allowed keys of the whole document (`document_candidates`): the recall a linker with
  `config.linking.scope="document"` can reach with the gold entities."""
  allowed = data_linking.parse_pairs(pairs_spec, labels)
  index = {l: i for i, l in enumerate(labels)}
  hit = total = 0
  for doc in docs:
    ents = doc.entities or ()
    gold = data_linking.oriented_relations(doc, allowed, index)
    total += len(gold)
    if not gold:
      continue
    values, cands, mask = data_linking.document_candidates(
        np.asarray([index.get(e.label, -1) for e in ents]),
        data_linking.entity_boxes(doc, ents), allowed, max_candidates)
    held = {(int(k), int(v)) for v, row, m in zip(values, cands, mask) for k in row[m]}
    hit += sum(pair in held for pair in gold)
  return hit, total


def evaluate(docs, pairs_spec: str, labels) -> dict:
  allowed = data_linking.parse_pairs(pairs_spec, labels)
  index = {l: i for i, l in enumerate(labels)}
  m = metrics_lib.RelationMetrics()
  for doc in docs:
    ents = doc.entities or ()
    gold = data_linking.oriented_relations(doc, allowed, index)
    pred = nearest_key_pairs(doc, allowed, index)
    m.add([(ents[k].words, ents[v].words) for k, v in gold],
          [(ents[k].words, ents[v].words) for k, v in pred])
  return m.compute()


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--dataset", default="synthetic", help="synthetic, funsd, or jsonl:PATH")
  p.add_argument("--data_dir", default=None)
  p.add_argument("--split", default="dev")
  p.add_argument("--pairs", default="", help="key_label:value_label,... (default: the dataset's)")
  p.add_argument("--num_dev", type=int, default=60, help="synthetic dev documents")
  p.add_argument("--max_candidates", type=int, default=32,
                 help="config.linking.max_candidates, for the reachable pairs")
  p.add_argument("--json", action="store_true")
  args = p.parse_args(argv)
  options = {}
  if args.dataset == "synthetic":
    options = {"link_keys": True, "num_dev": args.num_dev, "num_train": 0}
  docs, _ = datasets.load_dataset(args.dataset, args.split, args.data_dir, **options)
  pairs = args.pairs or data_linking.DEFAULT_PAIRS.get(args.dataset)
  if not pairs:
    p.error(f"--pairs is needed for dataset {args.dataset!r}")
  labels = sorted({e.label for d in docs for e in d.entities or ()})
  scores = evaluate(docs, pairs, labels)
  scores["reachable"], _ = reachable_pairs(docs, pairs, labels, args.max_candidates)
  if args.json:
    print(json.dumps({"dataset": args.dataset, "split": args.split, "documents": len(docs),
                      **scores}))
  else:
    print(f"nearest-key baseline, {args.dataset} {args.split} ({len(docs)} documents, gold "
          f"entities): relation F1 {scores['f1']:.3f} (P {scores['precision']:.3f}, "
          f"R {scores['recall']:.3f}; {scores['num_gold']} gold pairs)")
    print(f"reachable with document-scope candidates ({args.max_candidates} nearest keys): "
          f"{scores['reachable']} of {scores['num_gold']} gold pairs (recall <= "
          f"{scores['reachable'] / max(scores['num_gold'], 1):.3f})")
  return scores


if __name__ == "__main__":
  main()
