"""Entity linking head: which key entity (if any) each value entity belongs to.

On top of any encoder's token states `[B, L, H]` (dense, ETC, Linformer, cosFormer,
with or without GCN), for the entities of a window (gold spans when training,
Viterbi-decoded spans when predicting; `flaxdoc.data.linking` builds the arrays):

* entity representation `r_e = pool(tokens of e) + label_embedding[label_e]`, where
  pool is the entity's first token or the mean of its tokens (`pooling`);
* separate feed-forward maps for the two roles (LayoutXLM's RE head):
  key `h_k = FFN_key(r_k)`, value `t_v = FFN_value(r_v)`, both `dim` wide;
* a biaffine score for each *candidate* pair only (the key labels a value's label
  may link from, `config.linking.pairs`):
  `s(k, v) = t_v^T W h_k + u . h_k + g(box_k, box_v)`,
  where `g` (`geometry`, on by default) is a small MLP over the pair's relative geometry
  (`pair_geometry`: log-scaled signed offsets and gaps, the boxes' distance, line and
  column overlap, left-of / above indicators) and the candidate's distance rank among
  the value's candidates: a question's answer is nearly always right of or below it,
  and the pair's geometry says so directly;
* a learned "no key" score `s_none(v) = z . t_v + c` for values without a key.

The text (biaffine) term can be left out (`text=False`: the geometry score and "no key"
only), or dropped in training for a random `text_dropout` share of the values, whose
candidates are then told apart by geometry alone. Why: on small data (FUNSD's 129
training forms) the text term fits the training pairs and adds noise on new forms
(README, Key-value pairs, measured); dropping it per value makes the geometry score
carry each decision on its own, while the text term still learns where it helps.

Candidates are given as index arrays (`candidates [B, V, C]` entity indices per value
slot), gathered, and scored: cost `O(V * C * dim)`, linear in the candidate pairs,
never a `[tokens, tokens]` (nor an `[entities, entities]`) tensor. The output is
`[B, V, C + 1]` logits, the last column "no key"; masked candidates are `-1e9`, so a
softmax over the last axis is the distribution of a value over its keys and none
(the training loss is its cross-entropy, `flaxdoc.train.linking`).

The head has two halves: `encode` (a window's entity vectors and "no key" scores) and
`score` (candidate pairs from their vectors and boxes). `__call__` runs both on a
window's own candidates; inference may run `score` alone on a whole document's
candidates, with each entity's vectors from the window that encoded it best
(`config.linking.scope="document"`), so keys and values of different windows link.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
from flax import linen as nn

from flaxdoc.nn.dropout import Dropout, keep_mask, seed_from_key
from flaxdoc.nn.gelu import erf_gelu

Array = jax.Array
Dtype = Any

POOLINGS = ("first", "mean")
NEG_INF = -1e9
# Geometry features of a (key, value) pair (`pair_geometry`), and the head's geometry input:
# those plus the candidate's rank among its value's candidates.
NUM_PAIR_FEATURES = 11
NUM_GEOMETRY_INPUTS = NUM_PAIR_FEATURES + 1
# `LinkingHead.encode`'s entries as the model's outputs: `[B, E, D]`, `[B, E, D]`, `[B, E]`.
ENCODING_OUTPUTS = {"value": "link_value_vectors", "key": "link_key_vectors",
                    "none": "link_none"}


def _signed_log(x: Array) -> Array:
  return jnp.sign(x) * jnp.log1p(jnp.abs(x))


def pair_geometry(key_boxes: Array, value_boxes: Array) -> Array:
  """Relative geometry of pairs: `key_boxes [..., 4]`, `value_boxes [..., 4]` -> `[..., 11]`.

  Boxes are `[x0, y0, x1, y1]` in document units (0..1000 per page axis, pages stacked
  vertically). Every feature depends on the two boxes' differences only (translation
  invariant) and is O(1) for the offsets of a form: signed offsets are log-scaled,
  `sign(d) log(1 + |d|)` (a 10-unit gap is 2.4, a page 6.9):

  * 0, 1: centre offset (value - key) in x, y;
  * 2, 3: gap from the key's right edge to the value's left edge, from the key's bottom
    edge to the value's top edge (> 0: the value starts right of / below the key);
  * 4, 5: offset of the left edges, of the top edges (alignment in a column / a line);
  * 6: `log(1 + distance)` between the boxes (0 when they touch or overlap);
  * 7, 8: overlap of the y ranges (same line) and of the x ranges (same column), as a
    fraction of the shorter one, in [0, 1];
  * 9, 10: the key ends left of the value starts (gap 2 >= 0), the key ends above it
    (gap 3 >= 0), as 0 / 1.
  """
  kx0, ky0, kx1, ky1 = (key_boxes[..., i] for i in range(4))
  vx0, vy0, vx1, vy1 = (value_boxes[..., i] for i in range(4))
  gap_x, gap_y = vx0 - kx1, vy0 - ky1
  apart_x = jnp.maximum(jnp.maximum(gap_x, kx0 - vx1), 0.0)
  apart_y = jnp.maximum(jnp.maximum(gap_y, ky0 - vy1), 0.0)

  def overlap(a0, a1, b0, b1):
    shorter = jnp.maximum(jnp.minimum(a1 - a0, b1 - b0), 1.0)
    return jnp.clip((jnp.minimum(a1, b1) - jnp.maximum(a0, b0)) / shorter, 0.0, 1.0)
  return jnp.stack([
      _signed_log(0.5 * ((vx0 - kx0) + (vx1 - kx1))),
      _signed_log(0.5 * ((vy0 - ky0) + (vy1 - ky1))),
      _signed_log(gap_x), _signed_log(gap_y),
      _signed_log(vx0 - kx0), _signed_log(vy0 - ky0),
      jnp.log1p(jnp.hypot(apart_x, apart_y)),
      overlap(ky0, ky1, vy0, vy1), overlap(kx0, kx1, vx0, vx1),
      (gap_x >= 0).astype(key_boxes.dtype), (gap_y >= 0).astype(key_boxes.dtype),
  ], axis=-1)


def candidate_geometry(key_boxes: Array, value_boxes: Array) -> Array:
  """The geometry score's input `[B, V, C, 12]` for each candidate pair.

  `pair_geometry(key box, value box)` and `log(1 + rank)`, the rank of the candidate among
  its value's candidates (their order, nearest first: `flaxdoc.data.linking`), from the
  candidates' boxes `key_boxes [B, V, C, 4]` and the values' `value_boxes [B, V, 4]`.
  """
  b, v, c = key_boxes.shape[:3]
  feats = pair_geometry(key_boxes, value_boxes[:, :, None, :])  # [B, V, C, 11]
  rank = jnp.broadcast_to(jnp.log1p(jnp.arange(c, dtype=feats.dtype))[:, None], (b, v, c, 1))
  return jnp.concatenate([feats, rank], axis=-1)


def _gather(x: Array, index: Array) -> Array:
  """`x [B, E, ...]`, `index [B, ...]` -> `[B, ..., ...]`: rows of `x` by entity index."""
  b = index.shape[0]
  flat = index.reshape(b, -1)
  out = jnp.take_along_axis(x, flat.reshape(flat.shape + (1,) * (x.ndim - 2)), axis=1)
  return out.reshape(index.shape + x.shape[2:])


def geometry_inputs(boxes: Array, value_idx: Array, candidates: Array) -> Array:
  """`candidate_geometry` of a window's candidates: `boxes [B, E, 4]`, `value_idx [B, V]`
  and `candidates [B, V, C]` (entity indices) -> `[B, V, C, 12]`."""
  return candidate_geometry(_gather(boxes, candidates), _gather(boxes, value_idx))


def pool_entities(hidden: Array, first: Array, token_entity: Array, num_entities: int,
                  pooling: str) -> Array:
  """Entity vectors `[B, E, H]` from token states `hidden [B, L, H]`.

  Args:
    first: `[B, E]` window position of each entity's first token (pad: any valid index).
    token_entity: `[B, L]` entity index of each token, -1 for tokens outside entities.
    num_entities: `E`.
    pooling: "first" (the first token's state) or "mean" (of the entity's tokens).
  """
  if pooling == "first":
    return jnp.take_along_axis(hidden, first[..., None].astype(jnp.int32), axis=1)
  if pooling != "mean":
    raise ValueError(f"linking pooling must be one of {POOLINGS}, got {pooling!r}")
  b, l, h = hidden.shape
  # One segment sum over the flattened batch: entity e of row i is segment i * E + e;
  # tokens of no entity go to an extra segment that is dropped. Cost O(B * L * H).
  ids = jnp.where(token_entity >= 0, token_entity + jnp.arange(b)[:, None] * num_entities,
                  b * num_entities).reshape(-1)
  sums = jax.ops.segment_sum(hidden.reshape(b * l, h).astype(jnp.float32), ids,
                             num_segments=b * num_entities + 1)[:-1]
  counts = jax.ops.segment_sum(jnp.ones((b * l,), jnp.float32), ids,
                               num_segments=b * num_entities + 1)[:-1]
  means = sums / jnp.maximum(counts, 1.0)[:, None]
  return means.reshape(b, num_entities, h).astype(hidden.dtype)


@dataclasses.dataclass(frozen=True)
class LinkingSpec:
  """What `DocumentEncoder(linking=...)` builds its `LinkingHead` from (hashable)."""
  num_labels: int
  dim: int = 128
  pooling: str = "first"
  geometry: bool = True
  text: bool = True
  text_dropout: float = 0.0

  def __post_init__(self):
    if self.pooling not in POOLINGS:
      raise ValueError(f"config.linking.pooling must be one of {POOLINGS}, got {self.pooling!r}")
    if self.num_labels < 1 or self.dim < 1:
      raise ValueError(f"linking needs num_labels >= 1 and dim >= 1, got {self}")
    if not (self.text or self.geometry):
      raise ValueError("config.linking: text=False needs geometry=True (a pair needs a score)")
    if not 0.0 <= self.text_dropout < 1.0:
      raise ValueError("config.linking.text_dropout must be in [0, 1) (text=False leaves the "
                       f"text score out), got {self.text_dropout}")


class _RoleFFN(nn.Module):
  """Dense -> GELU -> dropout -> dense: one role's (key or value) projection."""
  dim: int
  dropout_rate: float
  initializer_range: float
  dtype: Dtype
  param_dtype: Dtype

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    init = nn.with_logical_partitioning(nn.initializers.normal(self.initializer_range),
                                        ("embed", None))
    x = nn.Dense(self.dim, dtype=self.dtype, param_dtype=self.param_dtype, kernel_init=init,
                 name="dense_in")(x)
    x = erf_gelu(x)
    x = Dropout(self.dropout_rate)(x, deterministic=deterministic)
    init2 = nn.with_logical_partitioning(nn.initializers.normal(self.initializer_range),
                                         (None, None))
    return nn.Dense(self.dim, dtype=self.dtype, param_dtype=self.param_dtype, kernel_init=init2,
                    name="dense_out")(x)


class LinkingHead(nn.Module):
  """Biaffine key -> value scorer over candidate pairs (see the module docstring).

  Two halves, so that candidates need not share a window (`config.linking.scope`):
  `encode` (a window's token states -> each entity's value / key vectors and "no key"
  score) and `score` (encodings and boxes of candidate pairs -> logits). `__call__` is
  both over the window's own candidates.

  Attributes:
    num_labels: entity labels (rows of the label embedding).
    dim: width of the key / value projections.
    pooling: "first" or "mean".
    geometry: add the pair-geometry score `g(box_k, box_v)`.
    text: the biaffine (text) score; False: geometry and "no key" only (no key FFN,
      bilinear or key bias parameters).
    text_dropout: in training, the share of values whose text score is left out (their
      whole row of candidates, so those decisions rest on geometry alone).
    geometry_hidden: width of the geometry MLP.
  """
  num_labels: int
  dim: int = 128
  pooling: str = "first"
  geometry: bool = True
  text: bool = True
  text_dropout: float = 0.0
  geometry_hidden: int = 32
  dropout_rate: float = 0.1
  initializer_range: float = 0.02
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def setup(self):
    init = nn.initializers.normal(self.initializer_range)
    kw = dict(dim=self.dim, dropout_rate=self.dropout_rate,
              initializer_range=self.initializer_range, dtype=self.dtype,
              param_dtype=self.param_dtype)
    self.value_ffn = _RoleFFN(**kw)
    if self.text:
      self.key_ffn = _RoleFFN(**kw)
      self.bilinear = self.param("bilinear", nn.with_logical_partitioning(init, (None, None)),
                                 (self.dim, self.dim), self.param_dtype)  # [D, D]
      self.key_bias = self.param("key_bias", nn.with_logical_partitioning(init, (None,)),
                                 (self.dim,), self.param_dtype)  # [D]
    if self.geometry:
      lecun = nn.with_logical_partitioning(nn.initializers.lecun_normal(), (None, None))
      self.geometry_in = nn.Dense(self.geometry_hidden, param_dtype=self.param_dtype,
                                  kernel_init=lecun)
      self.geometry_out = nn.Dense(1, param_dtype=self.param_dtype, kernel_init=lecun)
    self.no_key = nn.Dense(1, dtype=self.dtype, param_dtype=self.param_dtype,
                           kernel_init=nn.with_logical_partitioning(init, (None, None)))

  @nn.compact
  def encode(self, hidden: Array, link: Mapping[str, Array], deterministic: bool = True
             ) -> dict[str, Array]:
    """A window's entity encodings from `hidden [B, L, H]` and its `link_*` arrays.

    Returns `{"value": [B, E, D], "key": [B, E, D] (text only), "none": float32 [B, E]}`:
    each entity as a value (`t_v`), as a key (`h_k`), and its "no key" score.
    """
    first = jnp.asarray(link["link_first"], jnp.int32)
    num_entities = first.shape[1]
    pooled = pool_entities(hidden, first, jnp.asarray(link["link_token_entity"], jnp.int32),
                           num_entities, self.pooling)  # [B, E, H]
    labels = jnp.clip(jnp.asarray(link["link_label"], jnp.int32), 0, self.num_labels - 1)
    init = nn.initializers.normal(self.initializer_range)
    label_table = self.param("label_embedding",
                             nn.with_logical_partitioning(init, (None, "embed")),
                             (self.num_labels, hidden.shape[-1]),
                             self.param_dtype)  # [num_labels, H]
    reps = pooled + jnp.asarray(label_table, self.dtype)[labels]  # [B, E, H]
    reps = Dropout(self.dropout_rate)(reps, deterministic=deterministic)
    out = {"value": self.value_ffn(reps, deterministic)}  # [B, E, D]
    if self.text:
      out["key"] = self.key_ffn(reps, deterministic)  # [B, E, D]
    out["none"] = self.no_key(out["value"])[..., 0].astype(jnp.float32)  # [B, E]
    return out

  def score(self, value: Array, none: Array, key: Array | None, value_box: Array,
            key_box: Array, mask: Array, deterministic: bool = True) -> Array:
    """Logits `float32 [B, V, C + 1]` of candidate pairs from their encodings.

    Args:
      value: `[B, V, D]` the values' vectors; none: `[B, V]` their "no key" scores.
      key: `[B, V, C, D]` each value's candidates' key vectors (None when `text=False`).
      value_box: `[B, V, 4]`; key_box: `[B, V, C, 4]` (document units, `link_box`).
      mask: bool `[B, V, C]`, real candidates (others get -1e9).
    """
    b, v, c = mask.shape
    scores = jnp.zeros((b, v, c), jnp.float32)
    if self.text:
      tw = jnp.einsum("bvd,de->bve", value, jnp.asarray(self.bilinear, self.dtype))  # [B, V, D]
      text = (jnp.einsum("bve,bvce->bvc", tw, key) +
              jnp.einsum("bvce,e->bvc", key, jnp.asarray(self.key_bias, self.dtype)))
      text = text.astype(jnp.float32)  # [B, V, C]
      if self.text_dropout > 0.0 and not deterministic:
        # Whole rows, not rescaled: a kept row is scored as at inference, a dropped one
        # by geometry (and "no key") alone.
        keep = keep_mask(seed_from_key(self.make_rng("dropout")), (b, v), self.text_dropout)
        text = jnp.where(keep[..., None], text, 0.0)
      scores = scores + text
    if self.geometry:
      feats = candidate_geometry(jnp.asarray(key_box, jnp.float32),
                                 jnp.asarray(value_box, jnp.float32))  # [B, V, C, 12]
      g = self.geometry_out(erf_gelu(self.geometry_in(feats)))  # [B, V, C, 1]
      scores = scores + g[..., 0]
    scores = jnp.where(jnp.asarray(mask, bool), scores, NEG_INF)
    return jnp.concatenate([scores, jnp.asarray(none, jnp.float32)[..., None]], axis=-1)

  def window_scores(self, encoded: Mapping[str, Array], link: Mapping[str, Array],
                    deterministic: bool = True) -> Array:
    """`score` over the window's own candidates (`link_value`, `link_candidates`)."""
    value_idx = jnp.asarray(link["link_value"], jnp.int32)  # [B, V]
    cand = jnp.asarray(link["link_candidates"], jnp.int32)  # [B, V, C]
    boxes = jnp.asarray(link["link_box"], jnp.float32)  # [B, E, 4]
    return self.score(_gather(encoded["value"], value_idx), _gather(encoded["none"], value_idx),
                      _gather(encoded["key"], cand) if self.text else None,
                      _gather(boxes, value_idx), _gather(boxes, cand),
                      link["link_candidate_mask"], deterministic)

  def __call__(self, hidden: Array, link: Mapping[str, Array], deterministic: bool = True
               ) -> Array:
    """`hidden [B, L, H]` + the `link_*` arrays -> logits `float32 [B, V, C + 1]`.

    `link` keys (from `flaxdoc.data.linking`): `link_first [B, E]`,
    `link_token_entity [B, L]`, `link_label [B, E]`, `link_box [B, E, 4]`,
    `link_value [B, V]`, `link_candidates [B, V, C]`, `link_candidate_mask [B, V, C]`.
    """
    return self.window_scores(self.encode(hidden, link, deterministic), link, deterministic)
