"""Linen modules that own the parameters of the layout score terms (DESIGN §3.2-§3.6).

Each module is a *score term* in the sense of `flaxdoc.nn.attention`:

    term(q [..., Q, H, D], k [..., K, H, D], q_geom, k_geom) -> [..., H, Q, K]

(additive logits, float32, added to `q.k / sqrt(D)`), and only wraps a pure function
of `flaxdoc.layout` with its parameters. The same instance serves dense attention
(all pairs, geometry leaves `[B, N, ...]`) and ETC (a query block against three key
blocks, leaves `[B, nb, b, ...]` / `[B, nb, 3b, ...]`): nothing here assumes Q == K.

| module | paper | parameters | sharing (DESIGN) |
|---|---|---|---|
| `RichAttentionTerm` | FormNet §3.2 | `w_q w_k v_q v_k [H, D, A]`, `b c theta [H, A]` | per layer |
| `PolarTerm` | DocPolarBERT §3.4 | three tables `[buckets, D]` | all layers and heads |
| `GaussianTerm` | LAGaBi §3.5 | `mu_rho, mu_theta, sigma_rho, sigma_theta [H]` | all layers |
| `FixedBiasTerm` | Douzon et al. §3.6 | none | - |

Per-layer terms are given to `flaxdoc.nn.encoder.Encoder` as factories (each layer
builds its own); shared terms as module instances (the encoder binds each once and
hands its parameters to every layer, also under `nn.scan`). For that, every term
creates its parameters in `setup()`, from its attributes only (never from input
shapes): this is the contract for any new term as well.

Geometry keys the terms read (build them with `layout_geometry`):

* `"centers"` `float [..., N, 2]`: box centres, 0-1000 document units (pages stacked,
  `y_doc = 1000 * page + y`).
* `"boxes"` `float [..., N, 4]`: boxes in the same units.
* `"positions"` `int [..., N]`: 1D position within the document.
* `"valid"` `bool [..., N]`: real tokens.
* `"dist_edges"` `float [..., N, E]`: the distance-bucket edges of each token's
  document (DocPolarBERT per-document quantiles), one copy per token so that they are
  blocked like any other leaf and stay right for packed documents.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

from flaxdoc.layout import gaussian as gaussian_lib
from flaxdoc.layout import polar as polar_lib
from flaxdoc.layout import rich as rich_lib
from flaxdoc.layout import squircle as squircle_lib
from flaxdoc.layout.geometry import box_centers, box_point, stack_pages
from flaxdoc.layout.relative import relative_position_buckets

Array = jax.Array
Dtype = Any

RICH_AXES = ("x", "y", "index")


def _require(geom: Mapping[str, Array] | None, key: str, who: str) -> Array:
  if geom is None or key not in geom:
    have = [] if geom is None else sorted(geom)
    raise ValueError(f"{who} needs geometry {key!r} (per-token array); got keys {have}. "
                     "Build the geometry with flaxdoc.nn.layout_terms.layout_geometry")
  return geom[key]


def layout_geometry(boxes: Array, mask: Array, *, pages: Array | None = None,
                    positions: Array | None = None, document_ids: Array | None = None,
                    distance_buckets: int | None = None, distance_pool: str = "document"
                    ) -> dict[str, Array]:
  """The geometry dict the terms read, from per-token boxes.

  Args:
    boxes: `[B, N, 4]` boxes in LayoutLM units (0-1000 per page axis).
    mask: bool `[B, N]`, True for real tokens.
    pages: int `[B, N]` page of each token; pages are stacked vertically
      (`y + 1000 * page`) so tokens on different pages are far apart. None: one page.
    positions: int `[B, N]` 1D positions (default `0..N-1`; restart them per
      document when packing).
    document_ids: int `[B, N]` packed-document ids, copied to `"document_ids"`.
    distance_buckets: if set, add `"dist_edges"` with `distance_buckets + 1` quantile
      edges per row (`flaxdoc.layout.polar.distance_quantile_edges`). One row must
      be one document for `pool="document"`; for packed rows compute the edges
      per document in the input pipeline instead.
    distance_pool: "document" (paper) or "batch" (released code).

  Returns:
    dict with `"boxes"`, `"centers"`, `"positions"`, `"valid"` (and
    `"document_ids"`, `"dist_edges"` when asked).
  """
  boxes = jnp.asarray(boxes, jnp.float32)
  mask = jnp.asarray(mask, bool)
  if boxes.ndim != 3 or boxes.shape[-1] != 4 or mask.shape != boxes.shape[:2]:
    raise ValueError(f"layout_geometry: expected boxes [B, N, 4] and mask [B, N], got "
                     f"{boxes.shape} and {mask.shape}")
  if pages is not None:
    boxes = stack_pages(boxes, pages)  # [B, N, 4]
  batch, length = mask.shape
  if positions is None:
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
  geom = {
      "boxes": boxes,  # [B, N, 4]
      "centers": box_centers(boxes),  # [B, N, 2]
      "positions": jnp.asarray(positions, jnp.int32),  # [B, N]
      "valid": mask,  # [B, N]
  }
  if document_ids is not None:
    geom["document_ids"] = jnp.asarray(document_ids, jnp.int32)
  if distance_buckets is not None:
    edges = polar_lib.distance_quantile_edges(geom["centers"], mask, distance_buckets,
                                              pool=distance_pool)  # [B, E]
    geom["dist_edges"] = jnp.broadcast_to(edges[:, None, :],
                                          (batch, length, edges.shape[-1]))  # [B, N, E]
  return geom


class RichAttentionTerm(nn.Module):
  """FormNet's Rich Attention (DESIGN §3.2): order and log-distance on x, y (and index).

  Attributes:
    num_heads: `H`.
    head_dim: `D` of the per-head queries and keys.
    axes: a subset of ("x", "y", "index"), in that order; "index" uses
      `geom["positions"]`, "x"/"y" use `geom["centers"]`.
    theta_init: initial `theta` (all heads and axes). The distance term is
      `-theta^2 (d - mu)^2 / 2` with `d <= ln(1001)` on a page, so 0.1 keeps it
      around `-0.25` at worst at initialisation: small next to `q.k / sqrt(D)`.
    weight_stddev: stddev of the normal init of `w_q, w_k, v_q, v_k`.
    param_dtype: parameter dtype. The term is computed in float32.
  """
  num_heads: int
  head_dim: int
  axes: Sequence[str] = ("x", "y")
  theta_init: float = 0.1
  weight_stddev: float = 0.02
  param_dtype: Dtype = jnp.float32

  def setup(self):
    axes = tuple(self.axes)
    if not axes or any(a not in RICH_AXES for a in axes) or len(set(axes)) != len(axes):
      raise ValueError(f"RichAttentionTerm: axes must be distinct names from {RICH_AXES}, "
                       f"got {self.axes!r}")
    num_axes = len(axes)
    vec_init = nn.with_logical_partitioning(nn.initializers.normal(self.weight_stddev),
                                            ("heads", "kv", None))
    scalar_axes = ("heads", None)
    shape_w = (self.num_heads, self.head_dim, num_axes)  # [H, D, A]
    shape_s = (self.num_heads, num_axes)  # [H, A]
    self.w_q = self.param("w_q", vec_init, shape_w, self.param_dtype)
    self.w_k = self.param("w_k", vec_init, shape_w, self.param_dtype)
    self.v_q = self.param("v_q", vec_init, shape_w, self.param_dtype)
    self.v_k = self.param("v_k", vec_init, shape_w, self.param_dtype)
    zeros = nn.with_logical_partitioning(nn.initializers.zeros_init(), scalar_axes)
    self.b = self.param("b", zeros, shape_s, self.param_dtype)
    self.c = self.param("c", zeros, shape_s, self.param_dtype)
    self.theta = self.param(
        "theta", nn.with_logical_partitioning(nn.initializers.constant(self.theta_init),
                                              scalar_axes), shape_s, self.param_dtype)

  def coordinates(self, geom: Mapping[str, Array] | None) -> Array:
    """`[..., N, A]` coordinate of each token on each configured axis (float32)."""
    columns = []
    for axis in self.axes:
      if axis == "index":
        columns.append(jnp.asarray(_require(geom, "positions", "RichAttentionTerm"), jnp.float32))
      else:
        centers = _require(geom, "centers", "RichAttentionTerm")
        columns.append(jnp.asarray(centers[..., "xy".index(axis)], jnp.float32))
    return jnp.stack(columns, axis=-1)  # [..., N, A]

  def scalars(self, q: Array, k: Array) -> tuple[Array, Array, Array, Array, Array]:
    """Per-token pieces: `(order_q, order_k, dist_q, dist_k [..., H, Q|K, A], theta [H, A])`.

    What `__call__` combines pairwise; the fused ETC kernel (`flaxdoc.nn.etc_pallas`)
    takes them as they are.
    """
    f32 = jnp.float32
    a = self.w_q.shape[-1]
    # `q` [..., Q, H, D] and `k` [..., K, H, D] in their own dtype: the products widen them
    # to float32 as they read them (`rich_projection_scalars`), no float32 copy is written.
    # One product per side with the order and distance weights side by side ([H, D, 2A]),
    # the same sums as two: the backward then makes one float32 [..., H, D] gradient of
    # q (and of k) instead of two (at FormNet-A2's pre-training batch, 100 MB a layer
    # less to write and read again; docs/accelerators.md, session 11).
    both_q = rich_lib.rich_projection_scalars(
        q, jnp.concatenate([self.w_q, self.v_q], -1).astype(f32),
        jnp.concatenate([self.b, self.c], -1).astype(f32))  # [..., H, Q, 2A]
    both_k = rich_lib.rich_projection_scalars(
        k, jnp.concatenate([self.w_k, self.v_k], -1).astype(f32))  # [..., H, K, 2A]
    return (both_q[..., :a], both_k[..., :a], both_q[..., a:], both_k[..., a:],
            self.theta.astype(f32))

  def __call__(self, q: Array, k: Array, q_geom: Mapping[str, Array] | None,
               k_geom: Mapping[str, Array] | None) -> Array:
    return rich_lib.rich_attention_logits(
        *self.scalars(q, k), self.coordinates(q_geom),
        self.coordinates(k_geom))  # [..., H, Q, K]


class PolarTerm(nn.Module):
  """DocPolarBERT's relative terms (DESIGN §3.4): `q.(r_1d + r_dist + r_angle) / sqrt(D)`.

  One learned vector per bucket and term (size `D`), shared by all heads; create one
  instance and pass it to the encoder as a *shared* term so all layers share it.

  Attributes:
    head_dim: `D`.
    use_1d, use_distance, use_angle: which of the three terms to include.
    num_1d_buckets, max_1d_distance: T5 bidirectional buckets (32, 128).
    num_distance_buckets: distance buckets; `geom["dist_edges"]` must have
      `num_distance_buckets + 1` edges.
    angle: "released" (14 codes) or "sectors8" (the paper's 8 sectors, 10 codes).
    zero_bucket: an extra distance bucket for pairs at distance 0 (the released
      code; `flaxdoc.layout.polar.distance_buckets`).
    gather_method: "gather" or "onehot" (`flaxdoc.layout.polar.bucketed_dot_logits`).
    param_dtype: table dtype.
  """
  head_dim: int
  use_1d: bool = True
  use_distance: bool = True
  use_angle: bool = True
  num_1d_buckets: int = 32
  max_1d_distance: int = 128
  num_distance_buckets: int = 4
  angle: str = "released"
  zero_bucket: bool = False
  gather_method: str = "gather"
  param_dtype: Dtype = jnp.float32

  def setup(self):
    if self.angle not in ("released", "sectors8"):
      raise ValueError(f"PolarTerm: angle must be 'released' or 'sectors8', got {self.angle!r}")
    init = nn.with_logical_partitioning(nn.initializers.normal(0.02), (None, "kv"))
    if self.use_1d:
      self.table_1d = self.param("table_1d", init, (self.num_1d_buckets, self.head_dim),
                                 self.param_dtype)
    if self.use_distance:
      rows = self.num_distance_buckets + int(self.zero_bucket)
      self.table_distance = self.param("table_distance", init, (rows, self.head_dim),
                                       self.param_dtype)
    if self.use_angle:
      codes = (polar_lib.NUM_ANGLE_CODES if self.angle == "released"
               else polar_lib.NUM_ANGLE_SECTORS8_CODES)
      self.table_angle = self.param("table_angle", init, (codes, self.head_dim),
                                    self.param_dtype)

  def buckets(self, q_geom: Mapping[str, Array], k_geom: Mapping[str, Array]) -> dict[str, Array]:
    """The bucket ids `int32 [..., Q, K]` of each enabled term (useful for inspection)."""
    out = {}
    if self.use_1d or self.use_angle:
      pos_q = _require(q_geom, "positions", "PolarTerm")
      pos_k = _require(k_geom, "positions", "PolarTerm")
    if self.use_1d:
      out["1d"] = relative_position_buckets(pos_q, pos_k, num_buckets=self.num_1d_buckets,
                                            max_distance=self.max_1d_distance)
    if self.use_distance:
      cq = _require(q_geom, "centers", "PolarTerm")
      ck = _require(k_geom, "centers", "PolarTerm")
      edges = _require(q_geom, "dist_edges", "PolarTerm")  # [..., Q, E]
      if edges.shape[-1] != self.num_distance_buckets + 1:
        raise ValueError(f"PolarTerm: dist_edges has {edges.shape[-1]} edges, expected "
                         f"num_distance_buckets + 1 = {self.num_distance_buckets + 1}")
      # Each query uses its own document's edges: give distance_buckets one query per
      # "batch" row (`[..., Q, 1, 2]` against `[..., 1, K, 2]`, edges `[..., Q, E]`).
      bucket = polar_lib.distance_buckets(cq[..., :, None, :], ck[..., None, :, :], edges,
                                          zero_bucket=self.zero_bucket)  # [..., Q, 1, K]
      out["distance"] = bucket[..., 0, :]  # [..., Q, K]
    if self.use_angle:
      valid_q = q_geom.get("valid", jnp.ones(pos_q.shape, bool))
      valid_k = k_geom.get("valid", jnp.ones(pos_k.shape, bool))
      # Positions are unique within a document and cross-document pairs are masked,
      # so equal positions identify the self pair.
      is_self, valid = polar_lib.pair_masks(pos_q, pos_k, valid_q, valid_k)
      bq = _require(q_geom, "boxes", "PolarTerm")
      bk = _require(k_geom, "boxes", "PolarTerm")
      codes_fn = (polar_lib.angle_codes_released if self.angle == "released"
                  else polar_lib.angle_sectors8)
      out["angle"] = codes_fn(bq, bk, is_self, valid)  # [..., Q, K]
    return out

  def __call__(self, q: Array, k: Array, q_geom: Mapping[str, Array] | None,
               k_geom: Mapping[str, Array] | None) -> Array:
    del k  # The relative terms are q . r_bucket only.
    q = q.astype(jnp.float32)  # [..., Q, H, D]
    tables = {"1d": getattr(self, "table_1d", None),
              "distance": getattr(self, "table_distance", None),
              "angle": getattr(self, "table_angle", None)}
    total = None
    for name, bucket in self.buckets(q_geom, k_geom).items():
      logits = polar_lib.bucketed_dot_logits(q, tables[name].astype(jnp.float32), bucket,
                                             method=self.gather_method)  # [..., H, Q, K]
      total = logits if total is None else total + logits
    if total is None:
      raise ValueError("PolarTerm: all three terms are disabled")
    # DocPolarBERT puts the relative dot products inside the 1/sqrt(D) of q.k.
    return total / math.sqrt(self.head_dim)  # [..., H, Q, K]


class GaussianTerm(nn.Module):
  """LAGaBi's Gaussian polar bias `alpha (g - 1)` (DESIGN §3.5).

  Four parameters per head, shared across layers: pass one instance to the encoder
  as a *shared* term. Initialised as `flaxdoc.layout.gaussian.init_gaussian_params`
  (mu ~ U(0, 0.01), sigma ~ U(0, 1)), one parameter array per name.

  Attributes:
    num_heads: `H`.
    corner: the box reference point, "bottom_left" (released, default),
      "top_left" (paper) or "center"; reads `geom["boxes"]` (0-1000 units).
    alpha: bias weight (4).
    angle: "released" (`atan2(dx, dy)`, circular difference) or "paper"
      (`arctan(dy / dx)` in `[-pi/2, pi/2]`, plain difference; `flaxdoc.layout.gaussian`).
    param_dtype: parameter dtype.
  """
  num_heads: int
  corner: str = "bottom_left"
  alpha: float = gaussian_lib.DEFAULT_ALPHA
  angle: str = "released"
  param_dtype: Dtype = jnp.float32

  def setup(self):
    if self.corner not in gaussian_lib.CORNERS:
      raise ValueError(f"GaussianTerm: corner must be one of {gaussian_lib.CORNERS}, got "
                       f"{self.corner!r}")
    params = {}
    for name, (low, high) in gaussian_lib.INIT_RANGES.items():
      init = nn.with_logical_partitioning(gaussian_lib.uniform_initializer(low, high), ("heads",))
      params[name] = self.param(name, init, (self.num_heads,), self.param_dtype)
    self.kernel = params

  def __call__(self, q: Array, k: Array, q_geom: Mapping[str, Array] | None,
               k_geom: Mapping[str, Array] | None) -> Array:
    del q, k
    # The kernel is evaluated on the corners in their own 0-1000 units, with the rho
    # parameters scaled to match, rather than on `box_corner(...)` (0-1 units): under
    # jit, XLA contracts `a * s - b * s` into an FMA, so two equal corners scaled on
    # the query and the key side come out an ulp apart, and a coincident pair (the self
    # pair, sub-tokens of one word) leaves the origin and gets an arbitrary angle
    # (up to `alpha` of bias). Unscaled corners subtract exactly. With `u = 1000`:
    # `rho' = u rho`, `mu' = u mu_rho` and `sigma'^2 + floor^2 = u^2 (sigma^2 + floor^2)`,
    # so the exponent, and hence the result, is the same as in 0-1 units.
    unit = 1000.0
    pts_q = box_point(_require(q_geom, "boxes", "GaussianTerm"), self.corner)  # [..., Q, 2]
    pts_k = box_point(_require(k_geom, "boxes", "GaussianTerm"), self.corner)  # [..., K, 2]
    p = {name: value.astype(jnp.float32) for name, value in self.kernel.items()}
    floor2 = gaussian_lib.SIGMA_FLOOR ** 2
    sigma_rho = jnp.sqrt(unit ** 2 * (jnp.square(p["sigma_rho"]) + floor2) - floor2)  # [H]
    return gaussian_lib.gaussian_polar_bias(
        pts_q, pts_k, unit * p["mu_rho"], p["mu_theta"], sigma_rho, p["sigma_theta"],
        alpha=self.alpha, angle=self.angle)  # [..., H, Q, K]


class FixedBiasTerm(nn.Module):
  """Douzon et al.'s fixed squircle / cross weights as a softmax bias `log(max(w, 1e-5))`.

  Same for every head and layer, no parameters; returns `[..., 1, Q, K]` (broadcast
  over heads).

  Attributes:
    kind: "squircle" or "cross".
    extent: the `M` of `cos(pi/2 * d / M)`, 1000 (one page) by default.
    floor: the weight floor (1e-5).
  """
  kind: str = "squircle"
  extent: float = squircle_lib.DEFAULT_EXTENT
  floor: float = squircle_lib.DEFAULT_FLOOR

  def setup(self):
    if self.kind not in ("squircle", "cross"):
      raise ValueError(f"FixedBiasTerm: kind must be 'squircle' or 'cross', got {self.kind!r}")

  def __call__(self, q: Array, k: Array, q_geom: Mapping[str, Array] | None,
               k_geom: Mapping[str, Array] | None) -> Array:
    del q, k
    cq = _require(q_geom, "centers", "FixedBiasTerm")
    ck = _require(k_geom, "centers", "FixedBiasTerm")
    weight_fn = (squircle_lib.squircle_weight if self.kind == "squircle"
                 else squircle_lib.cross_weight)
    w = weight_fn(cq, ck, self.extent)  # [..., Q, K]
    return squircle_lib.log_weight_bias(w, self.floor)[..., None, :, :]  # [..., 1, Q, K]
