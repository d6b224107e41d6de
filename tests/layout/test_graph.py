"""Tests for the beta-skeleton word graph, its degree cap, edge features and token expansion.

The graph constructions are checked against plain O(n^3) references written here
from the definitions (DESIGN §3.3), on random and deliberately degenerate inputs.
"""

import itertools
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from flaxdoc.layout import graph, token_graph
from flaxdoc.layout.edge_features import EDGE_FEATURE_NAMES, edge_features, node_features


# ----------------------------------------------------------------------------- references
def brute_gabriel(points) -> set:
  """Edge (i, j) iff no point at another location lies in the closed disk with diameter ij."""
  pts = [tuple(map(float, p)) for p in np.asarray(points)]
  edges = set()
  for i, j in itertools.combinations(range(len(pts)), 2):
    (px, py), (qx, qy) = pts[i], pts[j]
    ok = True
    for k, (rx, ry) in enumerate(pts):
      if k in (i, j) or (rx, ry) in (pts[i], pts[j]):
        continue
      if (rx - px) * (rx - qx) + (ry - py) * (ry - qy) <= 0:
        ok = False
        break
    if ok:
      edges.add((i, j))
  return edges


def closest_points(a_box, b_box):
  """The shortest segment between two boxes, through the middle of any overlap (per axis)."""
  a, b = [0.0, 0.0], [0.0, 0.0]
  for ax in range(2):
    a_lo, a_hi, b_lo, b_hi = a_box[ax], a_box[ax + 2], b_box[ax], b_box[ax + 2]
    if max(a_lo, b_lo) <= min(a_hi, b_hi):
      a[ax] = b[ax] = (max(a_lo, b_lo) + min(a_hi, b_hi)) / 2
    elif a_hi < b_lo:
      a[ax], b[ax] = a_hi, b_lo
    else:
      a[ax], b[ax] = a_lo, b_hi
  return a, b


def brute_ball_of_sight(boxes) -> set:
  """Touching boxes are joined; else the disk on the shortest segment must meet no third box
  (touching it only at the segment's ends does not count)."""
  bx = [tuple(map(float, b)) for b in np.asarray(boxes)]
  edges = set()
  for i, j in itertools.combinations(range(len(bx)), 2):
    A, B = bx[i], bx[j]
    if A[0] <= B[2] and B[0] <= A[2] and A[1] <= B[3] and B[1] <= A[3]:
      edges.add((i, j))
      continue
    a, b = closest_points(A, B)
    m = ((a[0] + b[0]) / 2, (a[1] + b[1]) / 2)
    r2 = ((b[0] - a[0]) ** 2 + (b[1] - a[1]) ** 2) / 4
    ok = True
    for k, C in enumerate(bx):
      if k in (i, j):
        continue
      p = (min(max(m[0], C[0]), C[2]), min(max(m[1], C[1]), C[3]))  # closest point of C to m
      d2 = (p[0] - m[0]) ** 2 + (p[1] - m[1]) ** 2
      if d2 < r2 or (d2 == r2 and list(p) != a and list(p) != b):
        ok = False
        break
    if ok:
      edges.add((i, j))
  return edges


def as_set(edges) -> set:
  return set(map(tuple, np.asarray(edges).tolist()))


def check_edge_array(edges, n):
  edges = np.asarray(edges)
  assert edges.dtype == np.int32 and edges.ndim == 2 and edges.shape[1] == 2
  if len(edges):
    assert (edges[:, 0] < edges[:, 1]).all() and edges.min() >= 0 and edges.max() < n
    keys = edges[:, 0].astype(np.int64) * n + edges[:, 1]
    assert (np.diff(keys) > 0).all(), "edges must be sorted and unique"


def is_connected(n, edges) -> bool:
  if n <= 1:
    return True
  edges = np.asarray(edges).reshape(-1, 2)
  g = coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
  return connected_components(g, directed=False)[0] == 1


def rows_of_words(n, seed, page_height=1000.0):
  """A realistic layout: lines of words (jittered baselines, ragged ends), pages stacked."""
  rng = np.random.default_rng(seed)
  boxes, page = [], 0
  while len(boxes) < n:
    y = rng.uniform(40, 80)
    while y < page_height - 40 and len(boxes) < n:
      h = rng.uniform(9, 14)
      x = rng.uniform(40, 120) if rng.random() < 0.8 else rng.uniform(300, 600)
      end = rng.uniform(500, 960)
      while x < end and len(boxes) < n:
        w = h * rng.uniform(0.6, 6.0)
        if x + w > 960:
          break
        top = page * page_height + y + rng.normal(0, 0.8)
        boxes.append([x, top, x + w, top + h])
        x += w + h * rng.uniform(0.25, 0.8) + (rng.uniform(30, 200) if rng.random() < 0.05 else 0)
      y += h + rng.uniform(3, 14) + (rng.uniform(10, 60) if rng.random() < 0.15 else 0)
    page += 1
  return np.round(np.array(boxes[:n]), 1)


def datasets_dir() -> Path:
  env = os.environ.get("FLAXDOC_DATASETS")
  return Path(env) if env else Path(__file__).resolve().parents[2].parent / "shared" / "datasets"


def funsd_forms(limit):
  """Word boxes of the first `limit` FUNSD training forms (read straight from the JSON)."""
  folder = datasets_dir() / "funsd" / "training_data" / "annotations"
  if not folder.is_dir():
    pytest.skip(f"FUNSD not found at {folder} (set FLAXDOC_DATASETS)")
  forms = []
  for path in sorted(folder.glob("*.json"))[:limit]:
    form = json.loads(path.read_text())["form"]
    boxes = [w["box"] for e in form for w in e["words"] if w["text"].strip()]
    forms.append((path.stem, np.array(boxes, np.float64).reshape(-1, 4)))
  return forms


# ----------------------------------------------------------------------------- point sets
def _point_sets():
  rng = np.random.default_rng(0)
  grid = np.array([(x, y) for x in range(6) for y in range(6)], float)
  t = np.arange(12, dtype=float)
  sets = {
      "uniform": rng.uniform(0, 100, (40, 2)),
      "uniform2": rng.uniform(-1, 1, (35, 2)),
      "clusters": np.concatenate([rng.normal(c, 0.5, (10, 2)) for c in [(0, 0), (10, 0), (5, 8)]]),
      "grid": grid,  # cocircular quadruples everywhere
      "grid_jitter": grid + rng.uniform(-1e-9, 1e-9, grid.shape),
      "grid_with_duplicates": np.concatenate([grid, grid[::5]]),
      "duplicates": rng.integers(0, 5, (30, 2)).astype(float),
      "collinear_x": np.stack([rng.permutation(t), np.zeros(12)], 1),
      "collinear_y": np.stack([np.full(12, 3.0), rng.permutation(t)], 1),
      "collinear_diag": np.stack([t, 2 * t + 1], 1)[rng.permutation(12)],
      "collinear_with_duplicates": np.stack([np.r_[t, t[:3]], np.r_[t, t[:3]]], 1),
      "huge_offset": grid * 7 + 1e9,
      # Powers of two keep the integer ties exact; random floats have no ties to break.
      "huge_scale": rng.integers(0, 50, (30, 2)) * 2.0 ** 400,
      "tiny_scale": rng.integers(0, 50, (30, 2)) * 2.0 ** -400,
      "huge_random": rng.uniform(0, 1, (30, 2)) * 1e150,
      "circle": np.stack([np.cos(t / 12 * 2 * np.pi), np.sin(t / 12 * 2 * np.pi)], 1) * 10,
  }
  return sets


POINT_SETS = _point_sets()


@pytest.mark.parametrize("name", sorted(POINT_SETS))
def test_beta_skeleton_matches_brute_force(name):
  pts = POINT_SETS[name]
  edges = graph.beta_skeleton(pts)
  check_edge_array(edges, len(pts))
  assert as_set(edges) == brute_gabriel(pts)
  assert is_connected(len(pts), edges)


@pytest.mark.parametrize("points, expected", [
    (np.zeros((0, 2)), set()),
    ([[3.0, 4.0]], set()),
    ([[0, 0], [5, 5]], {(0, 1)}),
    ([[1, 1], [1, 1]], {(0, 1)}),
    ([[1, 1]] * 4, {(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)}),
    ([[0, 0], [1, 0], [2, 0]], {(0, 1), (1, 2)}),
    # (1, 1) lies on the circle with diameter (0, 0)-(2, 0): the closed disk holds it.
    ([[0, 0], [2, 0], [1, 1]], {(0, 2), (1, 2)}),
    # Slightly higher, outside that circle: the long side comes back.
    ([[0, 0], [2, 0], [1, 1.001]], {(0, 1), (0, 2), (1, 2)}),
    # Duplicates share their location's edges and are linked to each other.
    ([[0, 0], [0, 0], [3, 0]], {(0, 1), (0, 2), (1, 2)}),
])
def test_beta_skeleton_small_inputs(points, expected):
  pts = np.asarray(points, float).reshape(-1, 2)
  edges = graph.beta_skeleton(pts)
  check_edge_array(edges, len(pts))
  assert as_set(edges) == expected
  assert brute_gabriel(pts) == expected


def test_beta_skeleton_permutation_and_similarity_invariance():
  rng = np.random.default_rng(1)
  pts = rng.integers(0, 40, (50, 2)).astype(float)
  base = as_set(graph.beta_skeleton(pts))
  perm = rng.permutation(len(pts))  # new index k holds old point perm[k]
  edges = graph.beta_skeleton(pts[perm])
  permuted = {tuple(sorted((int(perm[i]), int(perm[j])))) for i, j in edges}
  assert permuted == base
  assert as_set(graph.beta_skeleton(pts * 4.0 - 123.0)) == base  # exact in floating point
  assert as_set(graph.beta_skeleton(pts[:, ::-1])) == base  # mirror


# ----------------------------------------------------------------------------- box sets
def _box_sets():
  rng = np.random.default_rng(2)

  def random_int_boxes(n, size, span, seed):
    r = np.random.default_rng(seed)
    lo = r.integers(0, span, (n, 2))
    wh = r.integers(0, size, (n, 2))
    return np.concatenate([lo, lo + wh], 1).astype(float)

  line = np.array([[10 * i, 0, 10 * i + 6, 4] for i in range(8)], float)
  return {
      "random_int": random_int_boxes(30, 8, 40, 0),  # many touching / overlapping / tangent
      "random_int_sparse": random_int_boxes(30, 5, 80, 1),
      "random_float": np.concatenate([p := rng.uniform(0, 100, (30, 2)),
                                      p + rng.uniform(0, 12, (30, 2))], 1),
      "rows": rows_of_words(45, 3),
      "points_as_boxes": np.repeat(rng.integers(0, 20, (30, 2)).astype(float), 2, axis=0).reshape(
          30, 4)[:, [0, 1, 0, 1]],
      "identical": np.array([[0, 0, 5, 5]] * 3 + [[10, 0, 15, 5], [10, 0, 15, 5], [0, 10, 5, 15]],
                            float),
      "collinear_line": line,
      "collinear_degenerate": np.array([[i * 3, 0, i * 3 + 2, 0] for i in range(6)], float),
      "same_baseline_tangent": np.array([[0, 0, 10, 5], [10, 0, 20, 5], [3, 9, 17, 12],
                                         [22, 0, 30, 5]], float),
      "huge_offset": random_int_boxes(25, 8, 40, 3) + 1e9,
      "nested": np.array([[0, 0, 100, 100], [10, 10, 20, 20], [40, 40, 50, 50], [120, 0, 130, 10],
                          [0, 120, 10, 130]], float),
  }


BOX_SETS = _box_sets()


@pytest.mark.parametrize("name", sorted(BOX_SETS))
def test_ball_of_sight_exact_matches_brute_force(name):
  boxes = BOX_SETS[name]
  ref = brute_ball_of_sight(boxes)
  exact = graph.ball_of_sight_graph(boxes, exact=True)
  check_edge_array(exact, len(boxes))
  assert as_set(exact) == ref
  assert is_connected(len(boxes), exact)
  fast = graph.ball_of_sight_graph(boxes)
  check_edge_array(fast, len(boxes))
  assert as_set(fast) <= ref, "the fast construction returned a pair that is not an edge"
  assert is_connected(len(boxes), fast)


def test_zero_size_boxes_give_the_gabriel_graph():
  pts = POINT_SETS["duplicates"]
  boxes = np.concatenate([pts, pts], 1)
  assert as_set(graph.ball_of_sight_graph(boxes)) == as_set(graph.beta_skeleton(pts))
  assert as_set(graph.ball_of_sight_graph(boxes, exact=True)) == brute_gabriel(pts)


def test_ball_of_sight_endpoint_rule():
  # A = [0, 10] x [0, 5]; B below, x-overlap [8, 10], so the sight segment runs from
  # a = (9, 5) to b = (9, 8). C overlaps A on the same baseline (bottom y = 5) and
  # touches the disk only at a: it does not hide B from A.
  boxes = np.array([[0, 0, 10, 5], [9, 0, 20, 5], [8, 8, 12, 12]], float)
  assert brute_ball_of_sight(boxes) == {(0, 1), (0, 2), (1, 2)}
  assert as_set(graph.ball_of_sight_graph(boxes)) == {(0, 1), (0, 2), (1, 2)}
  # Hanging 1 unit lower, C enters the disk and hides B from A.
  boxes[1, 3] = 6
  assert brute_ball_of_sight(boxes) == {(0, 1), (1, 2)}
  assert as_set(graph.ball_of_sight_graph(boxes)) == {(0, 1), (1, 2)}
  # A box in the gap between two words of a line hides them from each other.
  boxes = np.array([[0, 0, 10, 5], [20, 0, 30, 5], [12, 1, 18, 4]], float)
  assert as_set(graph.ball_of_sight_graph(boxes)) == {(0, 2), (1, 2)}
  # Diagonal neighbours: the corner-to-corner disk is tangent to the other two boxes of
  # a 2 x 2 grid at points that are not its ends, so there are no diagonal edges.
  grid = np.array([[0, 0, 4, 2], [6, 0, 10, 2], [0, 4, 4, 6], [6, 4, 10, 6]], float)
  assert as_set(graph.ball_of_sight_graph(grid)) == {(0, 1), (0, 2), (1, 3), (2, 3)}


def test_fast_construction_recall_on_realistic_layouts():
  found = total = 0
  for seed in range(3):
    boxes = rows_of_words(150, seed + 10)
    exact = as_set(graph.ball_of_sight_graph(boxes, exact=True))
    fast = as_set(graph.ball_of_sight_graph(boxes))
    assert fast <= exact
    found += len(fast)
    total += len(exact)
  assert found / total > 0.97, f"recall {found / total:.4f}"


@pytest.mark.parametrize("seed", range(4))
def test_graphs_connected_on_random_layouts(seed):
  rng = np.random.default_rng(seed)
  lo = rng.uniform(0, 1000, (300, 2))
  scattered = np.concatenate([lo, lo + rng.uniform(0, 60, (300, 2)) * [1, 0.3]], 1)
  assert is_connected(300, graph.ball_of_sight_graph(scattered))
  assert is_connected(300, graph.beta_skeleton(lo))
  assert is_connected(400, graph.ball_of_sight_graph(rows_of_words(400, seed)))


def test_funsd_graphs_connected_and_close_to_exact():
  forms = funsd_forms(6)
  found = total = 0
  for stem, boxes in forms:
    fast = graph.ball_of_sight_graph(boxes)
    check_edge_array(fast, len(boxes))
    assert is_connected(len(boxes), fast), stem
    assert is_connected(len(boxes), graph.build_word_graph(boxes, variant="points",
                                                           max_degree=None)), stem
    capped = graph.build_word_graph(boxes)
    assert np.bincount(capped.ravel(), minlength=len(boxes)).max() <= 8
    assert is_connected(len(boxes), capped), stem
  for stem, boxes in forms[:2]:  # the quadratic exact construction on two forms
    exact = as_set(graph.ball_of_sight_graph(boxes, exact=True))
    fast = as_set(graph.ball_of_sight_graph(boxes))
    assert fast <= exact, stem
    found += len(fast)
    total += len(exact)
  assert found / total > 0.95, f"recall {found / total:.4f}"


# ----------------------------------------------------------------------------- degree cap
def reference_cap(boxes, edges, max_degree):
  """Kruskal spanning tree by (gap, centre distance, i, j), then greedy by the same order."""
  def key(e):
    i, j = e
    a, b = boxes[i], boxes[j]
    gx = max(0.0, b[0] - a[2], a[0] - b[2])
    gy = max(0.0, b[1] - a[3], a[1] - b[3])
    cx = (b[0] + b[2] - a[0] - a[2]) / 2
    cy = (b[1] + b[3] - a[1] - a[3]) / 2
    return (math.hypot(gx, gy), math.hypot(cx, cy), i, j)

  order = sorted(map(tuple, edges), key=key)
  parent = list(range(len(boxes)))

  def find(x):
    while parent[x] != x:
      parent[x] = parent[parent[x]]
      x = parent[x]
    return x

  tree = set()
  for i, j in order:
    ri, rj = find(i), find(j)
    if ri != rj:
      parent[ri] = rj
      tree.add((i, j))
  count = [0] * len(boxes)
  kept = set()
  for e in [e for e in order if e in tree] + [e for e in order if e not in tree]:
    i, j = e
    if count[i] < max_degree and count[j] < max_degree:
      kept.add(e)
      count[i] += 1
      count[j] += 1
  return kept


@pytest.mark.parametrize("max_degree", [1, 2, 3, 8])
def test_cap_degree_matches_reference(max_degree):
  rng = np.random.default_rng(max_degree)
  lo = rng.uniform(0, 100, (80, 2))
  boxes = np.concatenate([lo, lo + rng.uniform(0, 15, (80, 2))], 1)
  # A dense graph so the cap matters: all pairs closer than 30.
  edges = np.array([(i, j) for i, j in itertools.combinations(range(80), 2)
                    if graph.box_gaps(boxes[i], boxes[j]) < 30], np.int32)
  capped = graph.cap_degree(boxes, edges, max_degree)
  check_edge_array(capped, len(boxes))
  assert as_set(capped) == reference_cap(boxes, edges, max_degree)
  assert np.bincount(capped.ravel(), minlength=80).max() <= max_degree
  assert as_set(capped) <= as_set(edges)


def test_cap_keeps_the_nearest_neighbours_of_a_hub():
  # One word in the middle, twelve words around it at distinct distances.
  angles = np.arange(12) * 2 * np.pi / 12
  dist = 20.0 + 3.0 * np.arange(12)
  centres = np.stack([dist * np.cos(angles), dist * np.sin(angles)], 1)
  boxes = np.concatenate([[[-2, -2, 2, 2]], np.concatenate([centres - 1, centres + 1], 1)])
  star = np.array([(0, k) for k in range(1, 13)], np.int32)
  capped = graph.cap_degree(boxes, star, 8)
  assert as_set(capped) == {(0, k) for k in range(1, 9)}  # the 8 nearest


def test_cap_keeps_graphs_connected_and_is_noop_below_the_cap():
  boxes = rows_of_words(300, 7)
  full = graph.build_word_graph(boxes, max_degree=None)
  capped = graph.build_word_graph(boxes, max_degree=4)
  assert is_connected(len(boxes), capped)
  assert np.bincount(capped.ravel(), minlength=len(boxes)).max() <= 4
  degree = np.bincount(full.ravel(), minlength=len(boxes))
  assert as_set(graph.cap_degree(boxes, full, int(degree.max()))) == as_set(full)
  # An edge between two nodes already within the cap is never dropped.
  safe = {(i, j) for i, j in as_set(full) if degree[i] <= 4 and degree[j] <= 4}
  assert safe <= as_set(capped)


def test_build_word_graph_variants_and_errors():
  boxes = rows_of_words(60, 4)
  pts = 0.5 * (boxes[:, :2] + boxes[:, 2:])
  assert as_set(graph.build_word_graph(boxes, variant="points", max_degree=None)) == \
      as_set(graph.beta_skeleton(pts))
  assert as_set(graph.build_word_graph(boxes, max_degree=None)) == \
      as_set(graph.ball_of_sight_graph(boxes))
  with pytest.raises(ValueError, match="variant"):
    graph.build_word_graph(boxes, variant="knn")
  with pytest.raises(ValueError, match="max_degree"):
    graph.build_word_graph(boxes, max_degree=-1)


@pytest.mark.parametrize("bad, match", [
    ([[0, 0, 1]], r"shape \[N, 4\]"),
    ([[0, 0, np.nan, 1]], "row 0 is not finite"),
    ([[0, 0, 1, 1], [5, 0, 1, 1]], "row 1 is inverted"),
    ([["a", 0, 1, 1]], "cannot be read"),
])
def test_bad_boxes_raise(bad, match):
  with pytest.raises(ValueError, match=match):
    graph.ball_of_sight_graph(bad)
  with pytest.raises(ValueError, match=match):
    token_graph.token_neighbours(bad, [0])


def test_bad_points_raise():
  with pytest.raises(ValueError, match=r"shape \[N, 2\]"):
    graph.beta_skeleton([[1, 2, 3]])
  with pytest.raises(ValueError, match="not finite"):
    graph.beta_skeleton([[1, 2], [np.inf, 0]])


# ----------------------------------------------------------------------------- features
def test_edge_features_hand_built():
  k = np.array([0, 0, 10, 10], float)
  l = np.array([20, 5, 40, 15], float)
  f = edge_features(k, l)
  assert f.shape == (len(EDGE_FEATURE_NAMES),) and f.dtype == np.float32
  s = math.log(1001)

  def slog(d):
    return math.copysign(math.log(1 + abs(d)), d) / s

  expected = {
      "d_center_x": slog(25), "d_center_y": slog(5),     # centres (5, 5) -> (30, 10)
      "d_top_left_x": slog(20), "d_top_left_y": slog(5),
      "d_bottom_right_x": slog(30), "d_bottom_right_y": slog(5),
      "gap_x": math.log(11) / s,                          # 20 - 10
      "gap_y": 0.0,                                       # y extents overlap (5..10)
      "aspect_k": 0.0,                                    # 10 x 10
      "aspect_l": math.log(11 / 21) / s,                  # h 10, w 20
      "aspect_union": math.log(16 / 41) / s,              # union [0, 0, 40, 15]
      "subtoken_step": 0.0,
  }
  for name, value in expected.items():
    assert f[EDGE_FEATURE_NAMES.index(name)] == pytest.approx(value, abs=1e-6), name
  # Reversed edge: deltas flip sign, gaps stay, k/l aspects swap.
  r = edge_features(l, k)
  for name in ("d_center_x", "d_center_y", "d_top_left_x", "d_bottom_right_y"):
    i = EDGE_FEATURE_NAMES.index(name)
    assert r[i] == pytest.approx(-f[i], abs=1e-7)
  assert r[EDGE_FEATURE_NAMES.index("aspect_k")] == pytest.approx(expected["aspect_l"], abs=1e-6)
  # Vertical gap only.
  g = edge_features([0, 0, 10, 10], [2, 30, 8, 40])
  assert g[EDGE_FEATURE_NAMES.index("gap_x")] == 0.0
  assert g[EDGE_FEATURE_NAMES.index("gap_y")] == pytest.approx(math.log(21) / s, abs=1e-6)


def test_edge_features_bounded_and_finite_for_degenerate_boxes():
  rng = np.random.default_rng(0)
  lo = rng.uniform(0, 1000, (500, 2))
  boxes = np.concatenate([lo, np.minimum(lo + rng.uniform(0, 300, (500, 2)), 1000)], 1)
  f = edge_features(boxes[:250], boxes[250:])
  assert f.shape == (250, len(EDGE_FEATURE_NAMES))
  assert np.isfinite(f).all() and np.abs(f).max() <= 1.0 + 1e-6
  same = edge_features([[5, 5, 5, 5]], [[5, 5, 5, 5]])  # identical zero-size boxes
  assert np.isfinite(same).all() and not same.any()
  with pytest.raises(ValueError, match="NaN"):
    edge_features([0, 0, 1, np.nan], [0, 0, 1, 1])


def test_node_features():
  f = node_features([[100, 200, 300, 250], [0, 0, 1000, 1000]])
  np.testing.assert_allclose(f, [[0.1, 0.2, 0.3, 0.25, 0.2, 0.05], [0, 0, 1, 1, 1, 1]], atol=1e-7)
  assert f.dtype == np.float32


# ----------------------------------------------------------------------------- tokens
def test_token_neighbours_hand_built():
  # Three words on a line: w0 -- w1 -- w2 (w1 hides w0 and w2 from each other).
  word_boxes = np.array([[0, 0, 10, 10], [14, 0, 20, 10], [30, 0, 50, 10]], float)
  # [CLS] w0a w0b w1 w2a w2b w2c [SEP] [PAD]
  word_ids = np.array([-1, 0, 0, 1, 2, 2, 2, -1, -1])
  out = token_graph.token_neighbours(word_boxes, word_ids, max_degree=3)
  ids, feats, mask = out["neighbor_ids"], out["neighbor_features"], out["neighbor_mask"]
  assert ids.shape == (9, 5) and ids.dtype == np.int32
  assert feats.shape == (9, 5, len(EDGE_FEATURE_NAMES)) and feats.dtype == np.float32
  assert mask.shape == (9, 5) and mask.dtype == bool
  # Slots: 3 graph neighbours (nearest first), previous sub-token, next sub-token.
  expect_ids = [
      [0, 0, 0, 0, 0],   # [CLS]
      [3, 0, 0, 0, 2],   # w0a -> w1 ; next w0b
      [3, 0, 0, 1, 0],   # w0b -> w1 ; previous w0a
      [1, 4, 0, 0, 0],   # w1 -> w0 (gap 4) then w2 (gap 10)
      [3, 0, 0, 0, 5],   # w2a -> w1 ; next w2b
      [3, 0, 0, 4, 6],   # w2b -> w1 ; previous w2a, next w2c
      [3, 0, 0, 5, 0],   # w2c -> w1 ; previous w2b
      [0, 0, 0, 0, 0],   # [SEP]
      [0, 0, 0, 0, 0],   # [PAD]
  ]
  expect_mask = [[i != 0 or (r == 3 and s == 0) for s, i in enumerate(row)]
                 for r, row in enumerate(expect_ids)]
  np.testing.assert_array_equal(ids, expect_ids)
  np.testing.assert_array_equal(mask, expect_mask)
  assert not feats[~mask].any() and not ids[~mask].any()
  # Features of w1 -> w2 (slot 1 of token 3) are those of the word boxes.
  np.testing.assert_allclose(feats[3, 1], edge_features(word_boxes[1], word_boxes[2]))
  step = EDGE_FEATURE_NAMES.index("subtoken_step")
  assert feats[5, 3, step] == -1 and feats[5, 4, step] == 1 and feats[3, 0, step] == 0
  # Sub-token links carry zero deltas and gaps (shared box).
  assert not feats[5, 4, :8].any()


def test_token_neighbours_without_subtoken_links_and_truncation():
  word_boxes = np.array([[0, 0, 10, 10], [14, 0, 20, 10], [30, 0, 50, 10]], float)
  out = token_graph.token_neighbours(word_boxes, [0, 0, 1], max_degree=2,
                                     include_subtoken_links=False)
  assert out["neighbor_ids"].shape == (3, 2)
  # Word 2 has no token: the graph is built over words 0 and 1 only.
  np.testing.assert_array_equal(out["neighbor_ids"], [[2, 0], [2, 0], [0, 0]])
  np.testing.assert_array_equal(out["neighbor_mask"], [[1, 0], [1, 0], [1, 0]])


def test_token_neighbours_degree_and_consistency_on_a_page():
  boxes = rows_of_words(120, 5)
  rng = np.random.default_rng(0)
  word_ids = np.concatenate([[-1], np.repeat(np.arange(120), rng.integers(1, 4, 120)), [-1]])
  out = token_graph.token_neighbours(boxes, word_ids, max_degree=8)
  ids, mask = out["neighbor_ids"], out["neighbor_mask"]
  assert ids.shape[1] == 10 and np.isfinite(out["neighbor_features"]).all()
  first = {w: int(np.flatnonzero(word_ids == w)[0]) for w in range(120)}
  words = as_set(graph.build_word_graph(boxes, max_degree=8))
  for t, w in enumerate(word_ids):
    linked = ids[t, :8][mask[t, :8]]
    if w < 0:
      assert not mask[t].any()
      continue
    # Graph slots point at first sub-tokens of exactly the word's graph neighbours.
    expected = {b if a == w else a for a, b in words if w in (a, b)}
    assert {int(word_ids[x]) for x in linked} == expected
    assert all(first[int(word_ids[x])] == x for x in linked)
    # Nearest first.
    gaps = graph.box_gaps(np.repeat(boxes[[w]], len(linked), 0), boxes[word_ids[linked]])
    assert (np.diff(gaps) >= 0).all()


def test_token_neighbours_identical_boxes_no_nan():
  word_boxes = np.array([[5, 5, 5, 5]] * 4 + [[5, 5, 9, 9]] * 3, float)
  out = token_graph.token_neighbours(word_boxes, [0, 1, 1, 2, 3, 4, 5, 6, -1], max_degree=8)
  assert np.isfinite(out["neighbor_features"]).all()
  assert out["neighbor_mask"].any()


def test_token_neighbours_bad_ids():
  boxes = [[0, 0, 1, 1], [2, 0, 3, 1]]
  with pytest.raises(ValueError, match=r"\[-1, 2\)"):
    token_graph.token_neighbours(boxes, [0, 2])
  with pytest.raises(ValueError, match=r"\[-1, 2\)"):
    token_graph.token_neighbours(boxes, [-2, 0])
  with pytest.raises(ValueError, match="integers"):
    token_graph.token_neighbours(boxes, [0.5, 1])
  with pytest.raises(ValueError, match=r"shape \[L\]"):
    token_graph.token_neighbours(boxes, [[0, 1]])
  with pytest.raises(ValueError, match="max_degree"):
    token_graph.token_neighbours(boxes, [0, 1], max_degree=-3)
  empty = token_graph.token_neighbours(np.zeros((0, 4)), [], max_degree=2)
  assert empty["neighbor_ids"].shape == (0, 4)
  none = token_graph.token_neighbours(boxes, [-1, -1])
  assert not none["neighbor_mask"].any()


# ----------------------------------------------------------------------------- benchmark
def test_layout_benchmark_smoke(capsys):
  from flaxdoc.bench import layout as bench  # pylint: disable=import-outside-toplevel
  boxes = bench.realistic_layout(900, seed=1)
  assert boxes.shape == (900, 4) and (boxes[:, 2:] >= boxes[:, :2]).all()
  assert boxes[:, 3].max() > 1000  # more than one page, stacked
  bench.main(["--json", "--sizes", "40", "--repeats", "1", "--skip-terms"])
  lines = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
  assert {(r["variant"], r["stage"]) for r in lines} == {("-", "qhull")} | {
      (v, s) for v in graph.VARIANTS for s in ("skeleton", "capped", "tokens")}
  assert all(r["words"] == 40 and r["ms"] > 0 for r in lines)
  assert all(r["edges"] > 0 for r in lines if r["stage"] != "qhull")
