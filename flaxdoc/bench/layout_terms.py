"""Timing of every pairwise layout term, dense and ETC-blocked.

Run `python -m flaxdoc.bench.layout_terms [--json]`.

Each term is timed as one layer would pay for it: from per-token queries /
keys `[..., N, H, D]` and per-token geometry to the `[..., H, Q, K]` logits it
adds to `q.k` (jit-compiled, `block_until_ready`, median of `repeats`).

* dense: all `N x N` pairs (512 tokens, 12 heads, head dim 64 by default);
* blocked: ETC local attention, `N / b` query blocks of `b` tokens against their
  `3b` neighbouring keys (8,192 tokens, b = 128: 64 blocks of 128 x 384).

Rows look like `{"bench": "layout", "term": "rich", "layout": "dense",
"tokens": 512, "seconds": ..., "peak_mb": ...}`; `pairs` is the number of
(query, key) pairs per head, `temp_mb` the compiled program's scratch memory
(where the backend reports it), `peak_mb` the process's peak RSS so far. The CLI
`python -m flaxdoc.bench.layout` (beta-skeleton graph benchmark) calls
`pairwise_term_rows` too.

Polar distance edges are per-document preprocessing, not part of a layer, so
they are computed once outside the timed function (for the blocked layout from
the first `EDGE_SAMPLE_TOKENS` tokens: all 8,192^2 pairs would be a 67M-element
sort that no layer pays).
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from flaxdoc.bench.common import emit, peak_rss_mb, time_call
from flaxdoc.layout import gaussian, geometry, polar, relative, rich, squircle

TERMS = ("qk", "rich", "polar", "gaussian", "squircle", "cross", "layoutlmv2_2d")
LAYOUTS = ("dense", "blocked")
EDGE_SAMPLE_TOKENS = 1024


def _synthetic_document(rng: np.random.Generator, batch: int, tokens: int) -> dict:
  """Reading-order boxes on stacked pages: ~600 words per page, lines of ~12 words."""
  per_page, per_line = 600, 12
  idx = np.arange(tokens)
  page = idx // per_page
  line = (idx % per_page) // per_line
  col = idx % per_line
  x0 = 40.0 + col * 78.0 + rng.uniform(0, 10, (batch, tokens))
  y0 = 30.0 + line * 19.0 + rng.uniform(0, 3, (batch, tokens))
  boxes = np.stack([x0, y0, x0 + rng.uniform(20, 70, (batch, tokens)), y0 + 12.0], axis=-1)
  boxes = np.asarray(geometry.stack_pages(np.minimum(boxes, 1000.0).astype(np.float32),
                                          np.broadcast_to(page, (batch, tokens))))
  return {"boxes": boxes, "positions": np.broadcast_to(idx, (batch, tokens)).astype(np.int32)}


def _term_functions(heads: int, head_dim: int, key: jax.Array) -> dict[str, Callable]:
  """`name -> f(q, k, boxes_q, boxes_k, pos_q, pos_k, edges) -> [..., H, Q, K]`."""
  keys = jax.random.split(key, 8)
  axes = 2
  w_order = jax.random.normal(keys[0], (heads, head_dim, axes)) * 0.02
  w_dist = jax.random.normal(keys[1], (heads, head_dim, axes)) * 0.02
  b_axes = jnp.zeros((heads, axes))
  theta = jnp.ones((heads, axes))
  tables = {name: jax.random.normal(k, (n, head_dim)) * 0.02
            for name, k, n in (("1d", keys[2], 32), ("dist", keys[3], 4),
                               ("angle", keys[4], polar.NUM_ANGLE_CODES))}
  gauss = gaussian.init_gaussian_params(keys[5], heads)
  bias_x = jax.random.normal(keys[6], (heads, 64)) * 0.02
  bias_y = jax.random.normal(keys[7], (heads, 64)) * 0.02
  scale = 1.0 / math.sqrt(head_dim)

  def qk(q, k, bq, bk, pq, pk, edges):
    del bq, bk, pq, pk, edges
    return jnp.einsum("...qhd,...khd->...hqk", q, k) * scale  # [..., H, Q, K]

  def rich_term(q, k, bq, bk, pq, pk, edges):
    del pq, pk, edges
    cq, ck = geometry.box_centers(bq), geometry.box_centers(bk)  # [..., Q, 2], [..., K, 2]
    return rich.rich_attention_logits(
        rich.rich_projection_scalars(q, w_order, b_axes), rich.rich_projection_scalars(k, w_order),
        rich.rich_projection_scalars(q, w_dist, b_axes), rich.rich_projection_scalars(k, w_dist),
        theta, cq, ck)  # [..., H, Q, K]

  def polar_term(q, k, bq, bk, pq, pk, edges):
    del k
    cq, ck = geometry.box_centers(bq), geometry.box_centers(bk)
    is_self, valid = polar.pair_masks(pq, pk, pq >= 0, pk >= 0)  # [..., Q, K]
    dist = polar.distance_buckets(cq, ck, edges)  # [..., Q, K]
    angle = polar.angle_codes_released(bq, bk, is_self, valid)  # [..., Q, K]
    rel1d = relative.relative_position_buckets(pq, pk)  # [..., Q, K]
    return (polar.bucketed_dot_logits(q, tables["1d"], rel1d)
            + polar.bucketed_dot_logits(q, tables["dist"], dist)
            + polar.bucketed_dot_logits(q, tables["angle"], angle)) * scale  # [..., H, Q, K]

  def gaussian_term(q, k, bq, bk, pq, pk, edges):
    del q, k, pq, pk, edges
    return gaussian.gaussian_polar_bias(gaussian.box_corner(bq), gaussian.box_corner(bk),
                                        **gauss)  # [..., H, Q, K]

  def squircle_term(q, k, bq, bk, pq, pk, edges):
    del q, k, pq, pk, edges
    w = squircle.squircle_weight(geometry.box_centers(bq), geometry.box_centers(bk))
    return squircle.log_weight_bias(w)[..., None, :, :]  # [..., 1, Q, K]

  def cross_term(q, k, bq, bk, pq, pk, edges):
    del q, k, pq, pk, edges
    w = squircle.cross_weight(geometry.box_centers(bq), geometry.box_centers(bk))
    return squircle.log_weight_bias(w)[..., None, :, :]  # [..., 1, Q, K]

  def layoutlmv2_term(q, k, bq, bk, pq, pk, edges):
    del q, k, pq, pk, edges
    bx, by = relative.layoutlmv2_2d_buckets(bq, bk)  # [..., Q, K] each
    return (jnp.moveaxis(bias_x[:, bx], 0, -3)
            + jnp.moveaxis(bias_y[:, by], 0, -3))  # [..., H, Q, K]

  return {"qk": qk, "rich": rich_term, "polar": polar_term, "gaussian": gaussian_term,
          "squircle": squircle_term, "cross": cross_term, "layoutlmv2_2d": layoutlmv2_term}


def _inputs(layout: str, tokens: int, block: int, batch: int, heads: int, head_dim: int,
            seed: int) -> tuple:
  rng = np.random.default_rng(seed)
  doc = _synthetic_document(rng, batch, tokens)
  q = rng.normal(size=(batch, tokens, heads, head_dim)).astype(np.float32)
  k = rng.normal(size=(batch, tokens, heads, head_dim)).astype(np.float32)
  boxes, pos = doc["boxes"], doc["positions"]
  sample = min(tokens, EDGE_SAMPLE_TOKENS)
  edges = polar.distance_quantile_edges(geometry.box_centers(boxes[:, :sample]),
                                        np.ones((batch, sample), bool))  # [B, E]
  if layout == "dense":
    return q, k, boxes, boxes, pos, pos, edges
  q_idx, k_idx = geometry.etc_block_indices(tokens, block)
  qb = geometry.etc_query_blocks(q, block)  # [B, nb, b, H, D]
  kb = geometry.etc_key_blocks(k, block)  # [B, nb, 3b, H, D]
  bq = geometry.etc_query_blocks(boxes, block)  # [B, nb, b, 4]
  bk = geometry.etc_key_blocks(boxes, block)  # [B, nb, 3b, 4]
  pq = jnp.broadcast_to(q_idx, (batch,) + q_idx.shape)  # [B, nb, b]; -1 = padding
  pk = jnp.broadcast_to(k_idx, (batch,) + k_idx.shape)  # [B, nb, 3b]
  return qb, kb, bq, bk, pq, pk, edges[:, None, :]


def _temp_mb(compiled) -> float | None:
  try:
    stats = compiled.memory_analysis()
    return None if stats is None else stats.temp_size_in_bytes / 2**20
  except Exception:  # pylint: disable=broad-except  # not every backend reports it
    return None


def pairwise_term_rows(*, terms: Sequence[str] = TERMS, layouts: Sequence[str] = LAYOUTS,
                       dense_tokens: int = 512, blocked_tokens: int = 8192, block: int = 128,
                       heads: int = 12, head_dim: int = 64, batch: int = 1, repeats: int = 5,
                       seed: int = 0) -> list[dict]:
  """Times each pairwise term in each layout; one row per (term, layout).

  Args:
    terms: a subset of `TERMS` ("qk" is plain scaled `q.k`, for scale).
    layouts: a subset of `LAYOUTS`.
    dense_tokens: sequence length of the dense layout (all pairs).
    blocked_tokens: sequence length of the ETC-blocked layout.
    block: ETC block length `b` (queries per block; keys per block `3b`).
    heads, head_dim, batch: attention shape.
    repeats: timed calls per measurement (median reported, after one warm-up).
    seed: input randomness.

  Returns:
    Rows with keys bench, term, layout, tokens, pairs, heads, block, seconds,
    compile_seconds, temp_mb, out_mb, peak_mb, device.
  """
  unknown = set(terms) - set(TERMS)
  if unknown:
    raise ValueError(f"unknown terms {sorted(unknown)}; expected some of {TERMS}")
  unknown = set(layouts) - set(LAYOUTS)
  if unknown:
    raise ValueError(f"unknown layouts {sorted(unknown)}; expected some of {LAYOUTS}")
  fns = _term_functions(heads, head_dim, jax.random.PRNGKey(seed))
  device = jax.devices()[0].device_kind
  rows = []
  for layout in layouts:
    tokens = dense_tokens if layout == "dense" else blocked_tokens
    args = _inputs(layout, tokens, block, batch, heads, head_dim, seed)
    args = jax.device_put(args)
    pairs = tokens * tokens if layout == "dense" else (
        geometry.etc_num_blocks(tokens, block) * block * 3 * block)
    for name in terms:
      t0 = time.perf_counter()
      compiled = jax.jit(fns[name]).lower(*args).compile()
      compile_seconds = time.perf_counter() - t0
      out = compiled(*args)
      jax.block_until_ready(out)
      run = lambda c=compiled: jax.block_until_ready(c(*args))  # pylint: disable=cell-var-from-loop
      seconds = time_call(run, repeats=repeats)
      rows.append({
          "bench": "layout", "term": name, "layout": layout, "tokens": tokens,
          "pairs": int(pairs), "heads": heads, "block": block if layout == "blocked" else None,
          "seconds": seconds, "compile_seconds": compile_seconds,
          "temp_mb": _temp_mb(compiled), "out_mb": out.size * out.dtype.itemsize / 2**20,
          "peak_mb": peak_rss_mb(), "device": device,
      })
      del out
  return rows


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--json", action="store_true", help="one JSON object per row")
  parser.add_argument("--terms", default=",".join(TERMS))
  parser.add_argument("--layouts", default=",".join(LAYOUTS))
  parser.add_argument("--dense-tokens", type=int, default=512)
  parser.add_argument("--blocked-tokens", type=int, default=8192)
  parser.add_argument("--block", type=int, default=128)
  parser.add_argument("--heads", type=int, default=12)
  parser.add_argument("--head-dim", type=int, default=64)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args(argv)
  rows = pairwise_term_rows(terms=[t for t in args.terms.split(",") if t],
                            layouts=[l for l in args.layouts.split(",") if l],
                            dense_tokens=args.dense_tokens, blocked_tokens=args.blocked_tokens,
                            block=args.block, heads=args.heads, head_dim=args.head_dim,
                            batch=args.batch, repeats=args.repeats)
  emit(rows, as_json=args.json, title="pairwise layout terms (seconds per call, median)")


if __name__ == "__main__":
  main()
