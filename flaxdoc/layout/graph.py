"""The beta-skeleton word graph of FormNet's Super-Tokens (DESIGN §3.3, FormNet §3.3, App. A).

FormNet links every word to its spatial neighbours with a beta-skeleton (beta = 1);
a graph network passes messages along those links before the transformer reads the
(possibly badly serialised) token sequence.

Definitions (`tests/layout/test_graph.py` checks both against brute-force references):

* `beta_skeleton(points)`, the Gabriel graph: `(p, q)` is an edge iff no other point
  lies in the closed disk with diameter `pq`. A point coinciding with `p` or `q` is
  not "other", so duplicates are linked to each other and share their location's edges.
* `ball_of_sight_graph(boxes)`, the box-aware variant: touching or overlapping boxes
  are always linked. For disjoint boxes A, B let `ab` be their shortest connecting
  segment (`a` in A, `b` in B; when their x (or y) extents overlap, the one through
  the middle of the overlap). A and B are linked iff the closed disk with diameter
  `ab` meets no third box except at `a` or `b` (a box on A's baseline touching the
  disk only at `a` does not hide B). For zero-size boxes this is the Gabriel graph.

Both graphs are connected: for any split of the items into two groups, take a closest
pair (A, B) across it, at gap `g`. A third box C meeting the disk at `c` other than
`a`, `b` has `|c - a| < g` and `|c - b| < g` (Thales), so C would be closer than `g`
to whichever of A, B is in the other group: every closest cross pair is an edge.

Construction:

* Points: the Gabriel graph is a subgraph of every Delaunay triangulation, so the
  candidates are the edges of a `scipy.spatial.Delaunay` triangulation of the
  distinct points (`O(n log n)`), each then checked exactly: the result is exact.
  Fewer than three distinct points, or all on one line (Qhull refuses those), get the
  chain of consecutive points along the line, which is their Gabriel graph.
* Boxes: no small point set's Delaunay triangulation provably contains every
  ball-of-sight edge (a long box hides the sample points behind it), so the default
  is a documented approximation. Candidates are the Delaunay edges over box centres
  plus every pair less than two median box heights apart (this includes all touching
  pairs, and neighbours on one text line, which centres alone often miss because the
  lines above and below are closer); each is checked exactly. Every returned edge is
  therefore a true edge; what can be missed are longer links whose disk a third box
  nearly touches: on the 149 FUNSD training forms (0..1000 boxes) 2.1% of the edges,
  a median 4 box heights long, the nearest third box a median 7% of the radius away
  from the disk. Connectivity
  is restored exactly should a miss split the graph (the closest pair between two
  components is always an edge, above). `exact=True` checks all pairs instead
  (quadratic; fine for a few hundred words).
* Exact checks are vectorised: boxes are hashed into a uniform grid, and each
  candidate is tested only against the boxes in the grid cells under its disk.

`build_word_graph` caps the degree (FormNet keeps at most 8 neighbours)
symmetrically: edges are taken first from a minimum spanning tree (by box distance),
then by box distance, and kept only if both endpoints still have a free slot. No node
exceeds `max_degree`, the result is undirected, nodes keep their nearest neighbours
first, and the cap never disconnects the graph unless a node needs more than
`max_degree` spanning-tree edges.

`flaxdoc.layout.token_graph.token_neighbours` expands the word graph to padded
per-sub-token arrays.

Coordinates may be in any units (pixels, 0..1000, page-stacked); the graph is
invariant to translation and uniform scaling. Only numpy and scipy are imported.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import sparse
from scipy.sparse import csgraph
from scipy.spatial import Delaunay, QhullError

from flaxdoc.layout.edge_features import (EDGE_FEATURE_NAMES, NODE_FEATURE_NAMES,
                                          NUM_EDGE_FEATURES, edge_features, node_features)

__all__ = [
    "VARIANTS", "DEFAULT_MAX_DEGREE", "EDGE_FEATURE_NAMES", "NODE_FEATURE_NAMES",
    "NUM_EDGE_FEATURES", "beta_skeleton", "ball_of_sight_graph", "build_word_graph",
    "cap_degree", "box_gaps", "validate_boxes", "edge_features",
    "node_features",
]

VARIANTS = ("ball_of_sight", "points")
DEFAULT_MAX_DEGREE = 8

# Pairs of boxes closer than this many median box heights are always candidates.
_NEAR_GAP_HEIGHTS = 2.0
# Grid queries covering more cells than this (or than a quarter of the boxes) are
# answered by brute force instead: for such large disks scanning every box is cheaper.
_MAX_QUERY_CELLS = 1024
# Candidate pairs checked at once (bounds the memory of the vectorised checks).
_CHUNK = 1 << 16

_EMPTY_EDGES = np.zeros((0, 2), np.int32)


# ----------------------------------------------------------------------------- validation
def validate_boxes(boxes, name: str = "boxes") -> np.ndarray:
  """`float64 [N, 4]`, finite, `x0 <= x1`, `y0 <= y1`, or a ValueError naming `name` and the row."""
  try:
    arr = np.asarray(boxes, dtype=np.float64)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{name}: cannot be read as numbers ({e})") from None
  if arr.size == 0 and arr.ndim in (1, 2) and arr.shape[-1] in (0, 4):
    return arr.reshape(0, 4)
  if arr.ndim != 2 or arr.shape[1] != 4:
    raise ValueError(f"{name} must have shape [N, 4], got {list(arr.shape)}")
  bad = ~np.isfinite(arr).all(axis=1)
  if bad.any():
    i = int(np.argmax(bad))
    raise ValueError(f"{name}: row {i} is not finite: {arr[i].tolist()}")
  inverted = (arr[:, 0] > arr[:, 2]) | (arr[:, 1] > arr[:, 3])
  if inverted.any():
    i = int(np.argmax(inverted))
    raise ValueError(f"{name}: row {i} is inverted {arr[i].tolist()} (need x0 <= x1, y0 <= y1)")
  return arr


def _as_points(points) -> np.ndarray:
  try:
    arr = np.asarray(points, dtype=np.float64)
  except (TypeError, ValueError) as e:
    raise ValueError(f"points: cannot be read as numbers ({e})") from None
  if arr.size == 0 and arr.ndim in (1, 2) and arr.shape[-1] in (0, 2):
    return arr.reshape(0, 2)
  if arr.ndim != 2 or arr.shape[1] != 2:
    raise ValueError(f"points must have shape [N, 2], got {list(arr.shape)}")
  bad = ~np.isfinite(arr).all(axis=1)
  if bad.any():
    i = int(np.argmax(bad))
    raise ValueError(f"points: row {i} is not finite: {arr[i].tolist()}")
  return arr


def _normalized(boxes: np.ndarray) -> np.ndarray:
  """Translates to the origin and scales by a power of two to about [0, 1].

  The scaling is exact in floating point, so it changes no comparison; it keeps
  squared distances of huge coordinates (1e200) from overflowing and gives Qhull
  well-conditioned input. The translation is exact whenever the coordinates are
  integers below 2**53 (or any floats of similar magnitude).
  """
  lo = boxes[:, :2].min(axis=0)
  out = boxes - np.concatenate([lo, lo])
  if not np.isfinite(out).all():
    raise ValueError("boxes: coordinates too large (their differences overflow float64)")
  extent = float(out[:, 2:].max()) if len(out) else 0.0
  if extent > 0:
    out *= 2.0 ** -math.frexp(extent)[1]
  return out


# ----------------------------------------------------------------------------- helpers
def _expand(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """For `counts[i]` items per row: the row of every item and its rank inside the row."""
  counts = np.asarray(counts, np.int64)
  total = int(counts.sum())
  rows = np.repeat(np.arange(len(counts)), counts)
  starts = np.cumsum(counts) - counts
  rank = np.arange(total, dtype=np.int64) - np.repeat(starts, counts)
  return rows, rank


def _unique_pairs(i: np.ndarray, j: np.ndarray, n: int) -> np.ndarray:
  """Sorted unique undirected pairs (i < j), self pairs dropped, as `int64 [E, 2]`."""
  lo = np.minimum(i, j).astype(np.int64)
  hi = np.maximum(i, j).astype(np.int64)
  keep = lo != hi
  keys = np.sort(lo[keep] * n + hi[keep])
  # Sort + neighbour test: several times faster than np.unique's hashing here.
  keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])] if len(keys) else keys
  return np.stack([keys // n, keys % n], axis=1)


def _sight_segments(bi: np.ndarray, bj: np.ndarray):
  """The shortest segments `a -> b` between boxes `bi` and `bj` (`[E, 4]` each).

  Per axis: if the two intervals overlap, both ends sit at the middle of the
  overlap; otherwise at the facing sides. Returns `a [E, 2]`, `b [E, 2]`, and
  `touching [E]` (the boxes overlap on both axes: they touch or intersect).
  """
  lo = np.maximum(bi[:, :2], bj[:, :2])  # [E, 2]
  hi = np.minimum(bi[:, 2:], bj[:, 2:])
  overlap = lo <= hi
  mid = 0.5 * (lo + hi)
  before = bi[:, 2:] < bj[:, :2]  # box i lies entirely before box j on that axis
  a = np.where(overlap, mid, np.where(before, bi[:, 2:], bi[:, :2]))
  b = np.where(overlap, mid, np.where(before, bj[:, :2], bj[:, 2:]))
  return a, b, overlap.all(axis=1)


def box_gaps(bi, bj) -> np.ndarray:
  """Euclidean distance between boxes (0 when they touch or overlap), `[E, 4]` each -> `[E]`."""
  bi = np.asarray(bi, np.float64)
  bj = np.asarray(bj, np.float64)
  gap = np.maximum(0.0, np.maximum(bj[..., :2] - bi[..., 2:], bi[..., :2] - bj[..., 2:]))
  return np.hypot(gap[..., 0], gap[..., 1])


# ----------------------------------------------------------------------------- grid index
class _CellIndex:
  """Boxes hashed into a uniform grid: which boxes may meet a query rectangle.

  Every box is entered in each cell it covers (cell keys sorted, so a cell's boxes
  are one slice). A query returns the boxes sharing a cell with the query rectangle,
  a superset of the boxes meeting it; the caller tests those exactly.
  """

  def __init__(self, boxes: np.ndarray):
    n = len(boxes)
    self.origin = boxes[:, :2].min(axis=0)
    extent = np.maximum(boxes[:, 2:].max(axis=0) - self.origin, 0.0)  # [2]
    # About one cell per box over the layout's bounding box, but no smaller than
    # half a typical box (so a box covers few cells).
    area = float(extent[0] * extent[1])
    cell = math.sqrt(area / n) if area > 0 else float(extent.max()) / max(n, 1)
    sizes = boxes[:, 2:] - boxes[:, :2]
    cell = max(cell, 0.5 * float(np.median(sizes.max(axis=1))), float(extent.max()) * 2.0 ** -20)
    if not cell > 0:
      cell = 1.0
    while True:
      c0 = np.floor((boxes[:, :2] - self.origin) / cell).astype(np.int64)
      c1 = np.floor((boxes[:, 2:] - self.origin) / cell).astype(np.int64)
      span = c1 - c0 + 1
      counts = span[:, 0] * span[:, 1]
      if counts.sum() <= 16 * n + 1024:
        break
      cell *= 2.0  # a few huge boxes: coarser cells keep the index linear in size
    self.cell = cell
    self.max_query_cells = min(_MAX_QUERY_CELLS, max(16, n // 4))
    self.shape = c1.max(axis=0) + 1  # (nx, ny)
    owner, rank = _expand(counts)
    cx = c0[owner, 0] + rank % span[owner, 0]
    cy = c0[owner, 1] + rank // span[owner, 0]
    keys = cy * self.shape[0] + cx
    order = np.argsort(keys, kind="stable")
    self.keys = keys[order]
    self.ids = owner[order]
    # Where each cell's slice starts, as a dense table when the grid is small
    # enough (it usually has about one cell per box); else binary search.
    num_cells = int(self.shape[0]) * int(self.shape[1])
    self.cell_start = None
    if num_cells <= 64 * n + 4096:
      self.cell_start = np.searchsorted(self.keys, np.arange(num_cells + 1))

  def query(self, qx0, qy0, qx1, qy1):
    """Boxes sharing a cell with each query rectangle (coordinate columns `[Q]`).

    Returns `(q, ids, wide)`: parallel arrays of query index and box index (with
    repeats when a box shares several cells with a query), and the indices of
    queries covering more than `max_query_cells` cells, which are not answered.
    """
    nx, ny = int(self.shape[0]), int(self.shape[1])
    inv = 1.0 / self.cell
    cx0 = np.maximum(np.floor((qx0 - self.origin[0]) * inv), 0)
    cy0 = np.maximum(np.floor((qy0 - self.origin[1]) * inv), 0)
    cx1 = np.minimum(np.floor((qx1 - self.origin[0]) * inv), nx - 1)
    cy1 = np.minimum(np.floor((qy1 - self.origin[1]) * inv), ny - 1)
    sx = np.maximum(cx1 - cx0 + 1, 0)  # 0: the query misses the grid
    sy = np.maximum(cy1 - cy0 + 1, 0)
    cells = sx * sy
    wide = np.flatnonzero(cells > self.max_query_cells)
    cells[wide] = 0
    q, rank = _expand(cells.astype(np.int64))
    sxq = sx[q].astype(np.int64)
    keys = (cy0[q].astype(np.int64) + rank // sxq) * nx + cx0[q].astype(np.int64) + rank % sxq
    if self.cell_start is not None:
      start = self.cell_start[keys]
      stop = self.cell_start[keys + 1]
    else:
      start = np.searchsorted(self.keys, keys, side="left")
      stop = np.searchsorted(self.keys, keys, side="right")
    row, rank2 = _expand(stop - start)
    return q[row], self.ids[start[row] + rank2], wide


# ----------------------------------------------------------------------------- exact check
def _blocked(cols, i, j, seg, q, c) -> np.ndarray:
  """For (candidate q, box c) pairs: does box c hide the sight segment of candidate q?

  `c` blocks iff it meets the closed disk with diameter `ab` at a point other than
  `a` or `b`. Its closest point `p` to the centre `m` decides: `(p - a).(p - b)` is
  `|p - m|^2 - r^2`, negative inside the disk, zero on the circle (where the disk
  meets the box in `p` alone, which only blocks when `p` is not an endpoint).
  Works on separate coordinate columns: numpy reduces `[P, 2]` arrays slowly.
  """
  x0, y0, x1, y1 = cols
  ax, ay, bx, by, mx, my = (v[q] for v in seg)
  px = np.minimum(np.maximum(mx, x0[c]), x1[c])  # closest point of box c to m
  py = np.minimum(np.maximum(my, y0[c]), y1[c])
  dot = (px - ax) * (px - bx) + (py - ay) * (py - by)
  hit = dot < 0
  tie = dot == 0
  if tie.any():
    at_end = ((px == ax) & (py == ay)) | ((px == bx) & (py == by))
    hit |= tie & ~at_end
  return hit & (c != i[q]) & (c != j[q])


def _check_pairs(boxes: np.ndarray, index: _CellIndex, pairs: np.ndarray) -> np.ndarray:
  """`bool [E]`: which candidate pairs are ball-of-sight edges (exact)."""
  cols = tuple(np.ascontiguousarray(boxes[:, k]) for k in range(4))
  n = len(boxes)
  keep = np.zeros(len(pairs), bool)
  for s in range(0, len(pairs), _CHUNK):
    i = pairs[s:s + _CHUNK, 0]
    j = pairs[s:s + _CHUNK, 1]
    a, b, touching = _sight_segments(boxes[i], boxes[j])
    ax, ay, bx, by = a[:, 0], a[:, 1], b[:, 0], b[:, 1]
    mx, my = 0.5 * (ax + bx), 0.5 * (ay + by)  # disk centre
    # Slightly enlarged radius for the grid lookup: a box the exact test counts as
    # inside the disk is never lost to rounding.
    r = 0.5 * np.hypot(bx - ax, by - ay) * (1.0 + 1e-9) + 1e-12
    seg = (ax, ay, bx, by, mx, my)
    q, c, wide = index.query(mx - r, my - r, mx + r, my + r)
    blocked = np.zeros(len(i), bool)
    blocked[q[_blocked(cols, i, j, seg, q, c)]] = True
    # Queries too large for the grid (far-apart boxes): test against every box.
    per = max(1, _CHUNK // max(n, 1))
    for t in range(0, len(wide), per):
      qw = np.repeat(wide[t:t + per], n)
      cw = np.tile(np.arange(n), len(wide[t:t + per]))
      blocked[qw[_blocked(cols, i, j, seg, qw, cw)]] = True
    keep[s:s + _CHUNK] = touching | ~blocked
  return keep


# ----------------------------------------------------------------------------- candidates
def _triangulation_edges(pts: np.ndarray) -> np.ndarray:
  """Edges `[M, 2]` of a Delaunay triangulation of distinct points `[U, 2]`.

  Collinear input (which Qhull rejects) gets the chain of consecutive points along
  the line instead; points Qhull sets aside as numerically coincident are linked to
  the vertices of the triangle holding them.
  """
  u = len(pts)
  if u < 2:
    return np.zeros((0, 2), np.int64)
  if u >= 3:
    try:
      tri = Delaunay(pts)
    except QhullError:
      tri = None
    if tri is not None:
      s = tri.simplices.astype(np.int64)
      parts = [s[:, [0, 1]], s[:, [1, 2]], s[:, [2, 0]]]
      if len(tri.coplanar):
        cop = tri.coplanar.astype(np.int64)  # (point, simplex, nearest vertex)
        for k in range(3):
          parts.append(np.stack([cop[:, 0], s[cop[:, 1], k]], axis=1))
      return np.concatenate(parts)
  # Collinear: order along the line through the two lexicographic extremes.
  direction = pts[-1] - pts[0]  # pts are sorted lexicographically by the caller
  order = np.argsort((pts - pts[0]) @ direction, kind="stable")
  return np.stack([order[:-1], order[1:]], axis=1)


def _delaunay_pairs(points: np.ndarray) -> np.ndarray:
  """Pairs `[M, 2]` (unsorted, with repeats) of a Delaunay triangulation of `points [N, 2]`.

  Identical points are merged before the triangulation (Qhull needs distinct
  points); an edge at a merged location stands for all of its points, and the
  points of one location are paired with each other.
  """
  n = len(points)
  order = np.lexsort((points[:, 1], points[:, 0]))
  s = points[order]
  new = np.ones(n, bool)
  new[1:] = (s[1:] != s[:-1]).any(axis=1)
  uid = np.cumsum(new) - 1  # location id of each sorted point
  edges = _triangulation_edges(s[new])
  if new.all():
    return order[edges]
  counts = np.bincount(uid)
  first = np.cumsum(counts) - counts
  eu, ev = edges[:, 0], edges[:, 1]
  e, r = _expand(counts[eu] * counts[ev])
  cv = counts[ev[e]]
  pairs = [np.stack([order[first[eu[e]] + r // cv], order[first[ev[e]] + r % cv]], axis=1)]
  # Coincident points: all pairs inside each location.
  loc = np.flatnonzero(counts > 1)
  g, r = _expand(counts[loc] ** 2)
  c = counts[loc[g]]
  pairs.append(np.stack([order[first[loc[g]] + r // c], order[first[loc[g]] + r % c]], axis=1))
  return np.concatenate(pairs)


def _near_pairs(boxes: np.ndarray, index: _CellIndex, max_gap: float) -> np.ndarray:
  """Pairs `[M, 2]` (with repeats) of boxes at distance <= max_gap (touching ones included)."""
  q, c, wide = index.query(boxes[:, 0] - max_gap, boxes[:, 1] - max_gap,
                           boxes[:, 2] + max_gap, boxes[:, 3] + max_gap)
  if len(wide):  # a huge box: compare it with everything
    n = len(boxes)
    q = np.concatenate([q, np.repeat(wide, n)])
    c = np.concatenate([c, np.tile(np.arange(n), len(wide))])
  keep = (q < c)
  q, c = q[keep], c[keep]
  keep = box_gaps(boxes[q], boxes[c]) <= max_gap
  return np.stack([q[keep], c[keep]], axis=1)


def _connect_components(boxes: np.ndarray, edges: np.ndarray) -> np.ndarray:
  """Adds the closest pair between components until the graph is connected.

  Each added pair is a ball-of-sight edge (see the module docstring), so this only
  ever restores edges the candidate step missed. Cost `O(|S| n)` per split.
  """
  n = len(boxes)
  extra = []
  while True:
    all_edges = np.concatenate([edges] + extra) if extra else edges
    graph = sparse.coo_matrix((np.ones(len(all_edges)), (all_edges[:, 0], all_edges[:, 1])),
                              shape=(n, n))
    num, labels = csgraph.connected_components(graph, directed=False)
    if num <= 1:
      break
    sizes = np.bincount(labels)
    small = np.flatnonzero(labels == np.argmin(sizes))
    other = np.flatnonzero(labels != labels[small[0]])
    best = (np.inf, np.inf, -1, -1)
    per = max(1, _CHUNK // len(other))
    for s in range(0, len(small), per):
      si = small[s:s + per]
      gaps = box_gaps(boxes[si][:, None], boxes[other][None])  # [S, O]
      centre_i = 0.5 * (boxes[si, :2] + boxes[si, 2:])
      centre_o = 0.5 * (boxes[other, :2] + boxes[other, 2:])
      dist = np.hypot(*(centre_i[:, None] - centre_o[None]).transpose(2, 0, 1))
      k = np.lexsort((dist.ravel(), gaps.ravel()))[0]
      cand = (gaps.ravel()[k], dist.ravel()[k], si[k // len(other)], other[k % len(other)])
      best = min(best, cand)
    extra.append(np.array([[min(best[2], best[3]), max(best[2], best[3])]], np.int64))
  if not extra:
    return edges
  return _unique_pairs(*np.concatenate([edges] + extra).T, n)


def _skeleton(boxes: np.ndarray, *, points_only: bool, exact: bool) -> np.ndarray:
  n = len(boxes)
  if n < 2:
    return _EMPTY_EDGES.copy()
  boxes = _normalized(boxes)
  index = _CellIndex(boxes)
  centres = 0.5 * (boxes[:, :2] + boxes[:, 2:])
  if exact:
    # Every pair, a block of rows at a time (memory stays O(_CHUNK + n)).
    kept, rows = [], max(1, _CHUNK // n)
    for start in range(0, n, rows):
      i = np.repeat(np.arange(start, min(start + rows, n)), n)
      j = np.tile(np.arange(n), min(rows, n - start))
      pairs = np.stack([i[i < j], j[i < j]], axis=1)
      kept.append(pairs[_check_pairs(boxes, index, pairs)])
    return np.concatenate(kept).astype(np.int32)
  if points_only:
    cands = _delaunay_pairs(centres)
  else:
    height = float(np.median((boxes[:, 2:] - boxes[:, :2]).min(axis=1)))
    cands = np.concatenate([_delaunay_pairs(centres),
                            _near_pairs(boxes, index, _NEAR_GAP_HEIGHTS * height)])
  cands = _unique_pairs(cands[:, 0], cands[:, 1], n)
  edges = cands[_check_pairs(boxes, index, cands)]
  if not points_only:
    edges = _connect_components(boxes, edges)
  return edges.astype(np.int32)


# ----------------------------------------------------------------------------- public API
def beta_skeleton(points) -> np.ndarray:
  """The beta-skeleton (beta = 1, i.e. the Gabriel graph) of 2D points.

  Args:
    points: `[N, 2]` finite coordinates (any units).

  Returns:
    `int32 [E, 2]` undirected edges `(i, j)` with `i < j`, sorted, unique:
    `(i, j)` is an edge iff no point at a location other than those of `i` and `j`
    lies in the closed disk with diameter `ij`. Coincident points are linked.
  """
  pts = _as_points(points)
  return _skeleton(np.concatenate([pts, pts], axis=1), points_only=True, exact=False)


def ball_of_sight_graph(boxes, *, exact: bool = False) -> np.ndarray:
  """The box-aware beta-skeleton ("ball-of-sight" graph) of boxes.

  Args:
    boxes: `[N, 4]` finite `[x0, y0, x1, y1]` with `x0 <= x1`, `y0 <= y1`.
    exact: check every pair (quadratic) instead of the near-linear candidate set.

  Returns:
    `int32 [E, 2]` undirected edges `(i, j)`, `i < j`, sorted, unique. See the
    module docstring for the definition and for what `exact=False` may miss.
  """
  return _skeleton(validate_boxes(boxes), points_only=False, exact=exact)


def _edge_order(boxes: np.ndarray, edges: np.ndarray) -> np.ndarray:
  """Edge indices sorted by box gap, then centre distance, then index (deterministic)."""
  bi, bj = boxes[edges[:, 0]], boxes[edges[:, 1]]
  gap = box_gaps(bi, bj)
  d = 0.5 * ((bj[:, :2] + bj[:, 2:]) - (bi[:, :2] + bi[:, 2:]))
  dist = np.hypot(d[:, 0], d[:, 1])
  return np.lexsort((edges[:, 1], edges[:, 0], dist, gap))


def cap_degree(boxes, edges, max_degree: int = DEFAULT_MAX_DEGREE) -> np.ndarray:
  """Keeps at most `max_degree` neighbours per node, the nearest by box distance.

  Edges are taken in order -- first those of a minimum spanning tree of the graph
  (weighted by box distance), then all others by box distance -- and one is kept iff
  both endpoints still have fewer than `max_degree` kept edges. Symmetric by
  construction; see the module docstring.

  Args:
    boxes: `[N, 4]` boxes (distances are measured between them).
    edges: `[E, 2]` undirected edges (either orientation; repeats are merged).
    max_degree: the cap (>= 0).

  Returns:
    `int32 [E', 2]`, a sorted subset of `edges`.
  """
  if isinstance(max_degree, bool) or not isinstance(max_degree, (int, np.integer)) \
      or max_degree < 0:
    raise ValueError(f"max_degree must be a non-negative integer, got {max_degree!r}")
  boxes = validate_boxes(boxes)
  edges = np.asarray(edges).reshape(-1, 2)
  n = len(boxes)
  if not len(edges):
    return _EMPTY_EDGES.copy()
  if not np.issubdtype(edges.dtype, np.integer) or edges.min() < 0 or edges.max() >= n:
    raise ValueError(f"edges must be integer node pairs in [0, {n})")
  edges = _unique_pairs(edges[:, 0], edges[:, 1], n)  # canonical: i < j, unique, sorted
  degree = np.bincount(edges.ravel(), minlength=n)
  over = degree > max_degree
  if not over.any():
    return edges.astype(np.int32)
  order = _edge_order(boxes, edges)
  rank = np.empty(len(edges), np.int64)
  rank[order] = np.arange(len(edges))
  # Spanning tree over ranks (1-based: scipy drops zero weights).
  weights = sparse.coo_matrix((rank + 1.0, (edges[:, 0], edges[:, 1])), shape=(n, n)).tocsr()
  tree = csgraph.minimum_spanning_tree(weights).tocoo()
  in_tree = np.zeros(len(edges), bool)
  in_tree[order[np.rint(tree.data).astype(np.int64) - 1]] = True
  # Edges between nodes within the cap are always kept (both endpoints can never
  # run out of slots); only the others need the sequential greedy pass.
  free = ~over[edges[:, 0]] & ~over[edges[:, 1]]
  kept = free.copy()
  count = np.bincount(edges[free].ravel(), minlength=n)
  contested = np.flatnonzero(~free)
  contested = contested[np.lexsort((rank[contested], ~in_tree[contested]))]
  for e, u, v in zip(contested.tolist(), edges[contested, 0].tolist(),
                     edges[contested, 1].tolist()):
    if count[u] < max_degree and count[v] < max_degree:
      kept[e] = True
      count[u] += 1
      count[v] += 1
  return edges[kept].astype(np.int32)


def build_word_graph(boxes, *, variant: str = "ball_of_sight",
                     max_degree: int | None = DEFAULT_MAX_DEGREE) -> np.ndarray:
  """The word graph FormNet's GCN runs on.

  Args:
    boxes: `[N, 4]` word boxes (page-stacked for multi-page documents).
    variant: "ball_of_sight" (box-aware) or "points" (Gabriel graph of box centres).
    max_degree: neighbours kept per word (`cap_degree`); None: no cap.

  Returns:
    `int32 [E, 2]` undirected edges `(i, j)`, `i < j`, sorted, unique.
  """
  boxes = validate_boxes(boxes)
  if variant == "ball_of_sight":
    edges = ball_of_sight_graph(boxes)
  elif variant == "points":
    edges = beta_skeleton(0.5 * (boxes[:, :2] + boxes[:, 2:]))
  else:
    raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
  if max_degree is None:
    return edges
  return cap_degree(boxes, edges, max_degree)
