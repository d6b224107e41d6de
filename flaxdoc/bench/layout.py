"""Timing of the beta-skeleton word graph (and, after it, of the pairwise layout terms).

Run `python -m flaxdoc.bench.layout [--json] [--sizes 100,1000,10000] [--skip-terms]`.

Graph rows time, on realistic layouts (rows of words with ragged line ends, jittered
baselines, paragraph gaps and columns, about 400 words per page, pages stacked as in
the featuriser: `y + 1000 * page`, LayoutLM units), for both variants:

* `skeleton`: `ball_of_sight_graph` / `beta_skeleton` (the graph before the cap);
* `capped`: `build_word_graph(..., max_degree=8)` (what FormNet uses);
* `tokens`: `token_neighbours` (graph + sub-token expansion + edge features) with
  1 to 3 sub-tokens per word;
* `qhull`: `scipy.spatial.Delaunay` of the box centres alone, for scale: the part of
  `skeleton` no amount of numpy work can remove (and a gauge of the machine's load).

`ms` is the median wall time of one call, `cpu_ms` the median process CPU time (less
sensitive to other processes on a shared machine), `target_ms` the goal for the
skeleton on one core (1,000 words: 10 ms; 10,000 words: 150 ms).

Then the pairwise-term rows of `flaxdoc.bench.layout_terms.pairwise_term_rows()`
(jit-compiled layout biases, dense and ETC-blocked), unless `--skip-terms`.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable, Sequence

import numpy as np
from scipy.spatial import Delaunay

from flaxdoc.bench.common import emit, peak_rss_mb, time_call
from flaxdoc.layout import graph, token_graph

TARGET_MS = {1000: 10.0, 10000: 150.0}
GRAPH_COLUMNS = ("bench", "variant", "stage", "words", "tokens", "edges", "ms", "cpu_ms",
                 "target_ms", "peak_mb")


def realistic_layout(num_words: int, seed: int = 0, words_per_page: int = 400) -> np.ndarray:
  """`float64 [num_words, 4]` word boxes in LayoutLM units, pages stacked vertically.

  Each page holds lines of words: heights 9..14 units, widths 0.6..6 heights, word
  gaps 0.25..0.8 heights with occasional wide gaps (tab stops, columns), ragged line
  ends, occasional indented lines and paragraph gaps, baselines jittered by ~1 unit.
  """
  rng = np.random.default_rng(seed)
  boxes: list[list[float]] = []
  page = 0
  while len(boxes) < num_words:
    start = len(boxes)
    y = rng.uniform(40, 80)
    while y < 960 and len(boxes) < num_words and len(boxes) - start < words_per_page:
      h = rng.uniform(9, 14)
      x = rng.uniform(40, 120) if rng.random() < 0.8 else rng.uniform(300, 600)
      end = rng.uniform(500, 960) if rng.random() < 0.7 else rng.uniform(x + 50, 960)
      while x < end and len(boxes) < num_words:
        w = h * rng.uniform(0.6, 6.0)
        if x + w > 960:
          break
        top = 1000.0 * page + y + rng.normal(0, 0.8)
        boxes.append([x, top, x + w, top + h])
        x += w + h * rng.uniform(0.25, 0.8)
        if rng.random() < 0.05:
          x += rng.uniform(30, 200)
      y += h + rng.uniform(3, 14) + (rng.uniform(10, 60) if rng.random() < 0.15 else 0)
    page += 1
  return np.round(np.asarray(boxes, np.float64), 1).reshape(-1, 4)


def _cpu_ms(fn: Callable[[], object], repeats: int) -> float:
  times = []
  for _ in range(repeats):
    t0 = time.process_time()
    fn()
    times.append(time.process_time() - t0)
  return 1e3 * float(np.median(times))


def graph_rows(sizes: Sequence[int] = (100, 1000, 10000), *, repeats: int = 5,
               seed: int = 0) -> list[dict]:
  """One row per (variant, stage, size); see the module docstring."""
  rows = []
  for n in sizes:
    boxes = realistic_layout(n, seed)
    centres = 0.5 * (boxes[:, :2] + boxes[:, 2:])
    rng = np.random.default_rng(seed)
    word_ids = np.repeat(np.arange(n), rng.integers(1, 4, n))
    if n >= 3:
      qhull = lambda: Delaunay(centres)  # pylint: disable=cell-var-from-loop
      rows.append({"bench": "graph", "variant": "-", "stage": "qhull", "words": n,
                   "edges": None, "ms": 1e3 * time_call(qhull, repeats=repeats, warmup=1),
                   "cpu_ms": _cpu_ms(qhull, repeats), "peak_mb": round(peak_rss_mb(), 1)})
    for variant in graph.VARIANTS:
      skeleton = (lambda: graph.ball_of_sight_graph(boxes)) if variant == "ball_of_sight" \
          else (lambda: graph.beta_skeleton(centres))
      stages = [
          ("skeleton", skeleton, None),
          ("capped", lambda: graph.build_word_graph(boxes, variant=variant, max_degree=8), None),
          ("tokens", lambda: token_graph.token_neighbours(boxes, word_ids, variant=variant),
           len(word_ids)),
      ]
      for stage, fn, tokens in stages:
        out = fn()
        edges = int(out["neighbor_mask"].sum()) if isinstance(out, dict) else len(out)
        rows.append({
            "bench": "graph", "variant": variant, "stage": stage, "words": n, "tokens": tokens,
            "edges": edges,
            "ms": 1e3 * time_call(fn, repeats=repeats, warmup=0),
            "cpu_ms": _cpu_ms(fn, repeats),
            "target_ms": TARGET_MS.get(n) if stage == "skeleton" else None,
            "peak_mb": round(peak_rss_mb(), 1),
        })
  return rows


def term_rows(repeats: int) -> list[dict]:
  """The pairwise-term rows, or one note row when that benchmark is not available."""
  try:
    # Imported lazily, so the graph rows still run without that module.
    from flaxdoc.bench import layout_terms  # pylint: disable=import-outside-toplevel
    pairwise_term_rows = layout_terms.pairwise_term_rows
  except (ImportError, AttributeError) as e:
    return [{"bench": "layout", "note": f"pairwise-term benchmark unavailable ({e})"}]
  return pairwise_term_rows(repeats=repeats)


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m flaxdoc.bench.layout",
                                   description=__doc__.splitlines()[0])
  parser.add_argument("--json", action="store_true", help="one JSON object per measurement")
  parser.add_argument("--sizes", default="100,1000,10000", help="comma-separated word counts")
  parser.add_argument("--repeats", type=int, default=5, help="timed calls per measurement")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--skip-terms", action="store_true",
                      help="only the graph rows (the term rows need jax compilation)")
  args = parser.parse_args(argv)
  try:
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
  except ValueError:
    parser.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
  if not sizes or min(sizes) < 0 or args.repeats < 1:
    parser.error("--sizes must be non-negative word counts and --repeats >= 1")
  rows = graph_rows(sizes, repeats=args.repeats, seed=args.seed)
  emit(rows, as_json=args.json, columns=None if args.json else GRAPH_COLUMNS,
       title="beta-skeleton word graph (median per call)")
  if not args.skip_terms:
    terms = term_rows(args.repeats)
    if not args.json:
      print()
    emit(terms, as_json=args.json, title="pairwise layout terms (seconds per call, median)")


if __name__ == "__main__":
  main()
