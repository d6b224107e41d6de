"""FormNet Super-Tokens: a graph network over the beta-skeleton graph (DESIGN §3.3).

Before serialisation errors can hurt, FormNet lets every token gather context from
its spatial neighbours. One `GCNLayer`:

    m_kl = MLP([h_k; h_l; e_kl])                    (two layers, output width = model width)
    a_kl = softmax over valid l in N(k) of (w . m_kl)   (one attention head)
    h_k <- LayerNorm(h_k + sum_l a_kl m_kl)

A node without a valid neighbour keeps `LayerNorm(h_k)` (its weights are all zero,
never the NaN of a softmax over nothing).

The graph comes padded to `K` neighbours per node (FormNet keeps at most 8), as
produced by `flaxdoc.layout.token_graph.token_neighbours`:

* `neighbor_ids int32 [B, L, K]`: index of each neighbour in the same row;
* `neighbor_features float32 [B, L, K, F]`: the edge features `e_kl`;
* `neighbor_mask bool [B, L, K]`: which slots are real edges.

Masked slots have no effect whatever their ids or features hold (they are zeroed
before use), so padding slots may carry any value, including -1 or NaN.

The message MLP's hidden width is `hidden_features`: the model width `E` by default
(DESIGN §3.3 read literally), or, as FormNet's configs use, the width of its input
`2E + F` ("input"). The paper does not print the GCN's sizes; its Table 1 / Table 3
counts do: with the input-wide hidden layer FormNet A2 / A3 come to 221M / 351M
against the paper's 217M / 345M (+1.7%), A1 to 119M against 131M; with an `E`-wide
hidden layer A1 would be 109M (17% under).

Cost: both MLP layers are linear where it matters, so neither runs per edge. The
first is linear in the concatenation: its node parts are applied once per node
and gathered. The second commutes with the attention-weighted sum (and the
attention score of a message is a dot product with it), so it is applied to the
pooled hidden vector once per node. Per edge there remain the edge-feature part
of the first layer, the GELU and two `H`-vector products: `O(L * (E * H + K * F * H))`
instead of `O(L * K * (F + E) * H)`.

`kernel="pallas"` computes the per-edge part (gather, edge part, GELU, score, softmax,
pooled sum) and its gradient in fused Pallas kernels that never write a `[B, L, K, H]`
array (`flaxdoc.nn.gcn_pallas`; GPUs, or Pallas' interpreter elsewhere);
`kernel="pallas_saved"` the same, keeping each edge's GELU output and slope for the
backward instead of recomputing them (more memory, four fewer GELU passes);
`kernel="pallas_dpre"` recomputing, but passing each edge's `d pre` from the backward's
source side to its target side (one GELU pass fewer, one array within the backward);
`kernel="pallas_fused"` that, with the forward and the backward's node side each in one
kernel that evaluates each edge's GELU once (two passes a step; `"pallas_fused_forward"`:
the forward only; untimed on a GPU so far). Same parameters, so checkpoints do not depend
on it.

`SuperTokenEncoder` builds the node input (token embedding concatenated with the six
spatial features x0, y0, x1, y1, width, height in 0..1 units, projected to the
width) and stacks `num_layers` GCN layers (FormNet: 12); its output is the input of
the ETC encoder.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from flaxdoc.nn import gcn_pallas
from flaxdoc.nn.dropout import Dropout
from flaxdoc.nn.gelu import erf_gelu

Array = jax.Array
Dtype = Any


def _partitioned(init, axes):
  return nn.with_logical_partitioning(init, axes)


def node_spatial_features(boxes: Array) -> Array:
  """`[..., 4]` boxes in 0..1000 units -> `[..., 6]` (x0, y0, x1, y1, width, height) / 1000."""
  boxes = jnp.asarray(boxes, jnp.float32)
  width = boxes[..., 2] - boxes[..., 0]
  height = boxes[..., 3] - boxes[..., 1]
  return jnp.concatenate([boxes, width[..., None], height[..., None]], axis=-1) / 1000.0


MESSAGE_HIDDEN = ("width", "input")


def message_hidden_width(message_hidden: str, width: int, edge_features: int) -> int:
  """The message MLP's hidden width: `E` for "width", `2E + F` for "input"."""
  if message_hidden == "width":
    return width
  if message_hidden == "input":
    return 2 * width + edge_features
  raise ValueError(f"message_hidden must be one of {MESSAGE_HIDDEN}, got {message_hidden!r}")


def check_graph(h: Array, neighbor_ids: Array, neighbor_features: Array, neighbor_mask: Array,
                node_mask: Array | None = None, *, owner: str = "GCNLayer") -> None:
  """Validates shapes (always) and neighbour ids (when concrete). Raises `ValueError`."""
  if h.ndim != 3:
    raise ValueError(f"{owner}: node states must be [batch, nodes, features], got shape "
                     f"{tuple(h.shape)}")
  batch, nodes = h.shape[:2]
  if neighbor_ids.ndim != 3 or tuple(neighbor_ids.shape[:2]) != (batch, nodes):
    raise ValueError(f"{owner}: field 'neighbor_ids' has shape {tuple(neighbor_ids.shape)}, "
                     f"expected [{batch}, {nodes}, K]")
  k = neighbor_ids.shape[2]
  if tuple(neighbor_mask.shape) != (batch, nodes, k):
    raise ValueError(f"{owner}: field 'neighbor_mask' has shape {tuple(neighbor_mask.shape)}, "
                     f"expected {(batch, nodes, k)}")
  if neighbor_features.ndim != 4 or tuple(neighbor_features.shape[:3]) != (batch, nodes, k):
    raise ValueError(f"{owner}: field 'neighbor_features' has shape "
                     f"{tuple(neighbor_features.shape)}, expected [{batch}, {nodes}, {k}, F]")
  if node_mask is not None and tuple(node_mask.shape) != (batch, nodes):
    raise ValueError(f"{owner}: field 'node_mask' has shape {tuple(node_mask.shape)}, "
                     f"expected {(batch, nodes)}")
  if not any(isinstance(a, jax.core.Tracer) for a in (neighbor_ids, neighbor_mask)):
    ids = np.asarray(neighbor_ids)
    valid = np.asarray(neighbor_mask, bool)
    if valid.any():
      real = ids[valid]
      if real.min() < 0 or real.max() >= nodes:
        raise ValueError(f"{owner}: field 'neighbor_ids' has valid entries outside "
                         f"[0, {nodes}): range [{real.min()}, {real.max()}]")


# The form of the neighbour gather's gradient (read at trace time; `bench.accelerator
# --gcn_backward` sets it). JAX transposes a gather into a scatter-add; on an H200 a
# bfloat16 scatter-add of the `[B, L*K, H]` message gradient took 26% of a FormNet-A2
# pre-training step (56 ms of 217: bfloat16 atomics are compare-and-swap loops), the
# same scatter in float32 (native atomics) 5% (8.6 ms), and the step fell to 171 ms.
# "scatter_f32" (default): gather float32 rows, so the scatter-add accumulates in
# float32 (also the more accurate sum); "scatter": gather in the compute dtype.
NEIGHBOR_GRADIENT = "scatter_f32"
NEIGHBOR_GRADIENTS = ("scatter_f32", "scatter")
# How a layer computes its per-edge part: as XLA arrays, or fused in one of
# `flaxdoc.nn.gcn_pallas.FORMS`.
FUSED_KERNELS = tuple(gcn_pallas.FORMS)
KERNELS = ("xla",) + FUSED_KERNELS


def gather_neighbors(x: Array, ids: Array) -> Array:
  """`x [B, L, H]`, `ids int32 [B, L, K]` (in range) -> `out [B, L, K, H]`, `x[b, ids[b, l, k]]`.

  The result has `x`'s dtype; `NEIGHBOR_GRADIENT` decides only the precision of the
  gradient's scatter-add.
  """
  if NEIGHBOR_GRADIENT not in NEIGHBOR_GRADIENTS:
    raise ValueError(f"NEIGHBOR_GRADIENT must be one of {NEIGHBOR_GRADIENTS}, "
                     f"got {NEIGHBOR_GRADIENT!r}")
  rows = x.astype(jnp.float32) if NEIGHBOR_GRADIENT == "scatter_f32" else x
  batch, nodes, k = ids.shape
  out = jnp.take_along_axis(rows, ids.reshape(batch, nodes * k, 1), axis=1)
  return out.reshape(batch, nodes, k, x.shape[-1]).astype(x.dtype)


class _DenseParams(nn.Module):
  """The kernel `[in, out]` and bias `[out]` of a Dense layer, for use outside `__call__`.

  Same parameter names, shapes, initialisers and logical axes as `nn.Dense`, so a
  checkpoint does not change with how the layer is applied.
  """
  in_features: int
  features: int
  axes: tuple
  std: float
  param_dtype: Dtype = jnp.float32
  use_bias: bool = True

  @nn.compact
  def __call__(self) -> tuple[Array, Array | None]:
    kernel = self.param("kernel", _partitioned(nn.initializers.normal(self.std), self.axes),
                        (self.in_features, self.features), self.param_dtype)
    bias = None
    if self.use_bias:
      bias = self.param("bias", _partitioned(nn.initializers.zeros, (self.axes[-1],)),
                        (self.features,), self.param_dtype)
    return kernel, bias


class GCNLayer(nn.Module):
  """One attention-weighted graph convolution with a residual and post-LayerNorm.

  Attributes:
    hidden_features: width of the message MLP's hidden layer (None: the node width).
    dropout_rate: dropout on the pooled hidden vector `sum_l a_kl x_kl` during training.
    layer_norm_epsilon: epsilon of the output LayerNorm.
    kernel: "xla" (default), "pallas", "pallas_saved", "pallas_dpre", "pallas_fused" or
      "pallas_fused_forward": the per-edge part in the fused kernels of
      `flaxdoc.nn.gcn_pallas` (GPU; the Pallas interpreter elsewhere, slow).
      The edge features get no gradient there (they are data), and the score's constant
      `b2 . w`, which a softmax does not see, is left out. "pallas" keeps nothing per
      edge for the backward and evaluates each edge's GELU five times a step;
      "pallas_saved" keeps its output and slope (two `[B, L*K, H]` arrays a layer, at
      the kernels' padded sizes) and evaluates it once; "pallas_dpre" keeps nothing from
      the forward but writes each edge's `d pre` within the backward for the target side
      (one such array, only during the layer's backward): four evaluations, and on an
      H100 faster than "pallas" (docs/accelerators.md, session 12), itself faster than
      "pallas_saved" (session 9); "pallas_fused" is "pallas_dpre" with the forward, and
      the backward's node side, each in one kernel that keeps each program's `x` in
      registers while its softmax (or the softmax's backward) completes: two evaluations
      ("pallas_fused_forward", the forward only: three; counted with `bench.kernel_sass`
      in session 16, not yet timed).
    pallas_tiles: the kernels' `gcn_pallas.Tiles` (None: their defaults).
  """
  hidden_features: int | None = None
  dropout_rate: float = 0.0
  layer_norm_epsilon: float = 1e-6
  initializer_range: float = 0.02
  kernel: str = "xla"
  pallas_tiles: gcn_pallas.Tiles | None = None
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, h: Array, neighbor_ids: Array, neighbor_features: Array,
               neighbor_mask: Array, node_mask: Array | None = None,
               deterministic: bool = True) -> Array:
    """Updates node states.

    Args:
      h: `[B, L, E]` node states.
      neighbor_ids: `int32 [B, L, K]` neighbour indices into the `L` axis.
      neighbor_features: `[B, L, K, F]` edge features `e_kl`.
      neighbor_mask: `bool [B, L, K]` real edges.
      node_mask: optional `bool [B, L]` real nodes; edges to padded nodes are ignored.
      deterministic: disables dropout when True.

    Returns:
      `[B, L, E]` new node states.
    """
    neighbor_ids = jnp.asarray(neighbor_ids)
    neighbor_mask = jnp.asarray(neighbor_mask, bool)
    neighbor_features = jnp.asarray(neighbor_features)
    check_graph(h, neighbor_ids, neighbor_features, neighbor_mask, node_mask)
    if self.kernel not in KERNELS:
      raise ValueError(f"GCNLayer: kernel must be one of {KERNELS}, got {self.kernel!r}")
    batch, nodes, width = h.shape
    k = neighbor_ids.shape[2]
    feat_dim = neighbor_features.shape[3]
    hidden_dim = int(self.hidden_features or width)
    std = self.initializer_range

    # Neutralise padding slots so that nothing they hold can reach the output.
    ids = jnp.where(neighbor_mask, neighbor_ids, 0).astype(jnp.int32)  # [B, L, K]
    ids = jnp.clip(ids, 0, nodes - 1)
    if node_mask is not None:
      node_mask = jnp.asarray(node_mask, bool)
      neighbor_mask = neighbor_mask & jnp.take_along_axis(
          node_mask, ids.reshape(batch, nodes * k), axis=1).reshape(batch, nodes, k)
    edges = jnp.where(neighbor_mask[..., None], neighbor_features, 0)  # [B, L, K, F]

    # First MLP layer on [h_k; h_l; e_kl]: one kernel [2E + F, H], split by rows so
    # the node parts are computed per node and gathered, not per edge.
    kernel1 = self.param("message_in_kernel",
                         _partitioned(nn.initializers.normal(std), (None, "mlp")),
                         (2 * width + feat_dim, hidden_dim), self.param_dtype)
    bias1 = self.param("message_in_bias", _partitioned(nn.initializers.zeros, ("mlp",)),
                       (hidden_dim,), self.param_dtype)
    h_c, edges, kernel1, bias1 = nn.dtypes.promote_dtype(h, edges, kernel1, bias1,
                                                         dtype=self.dtype)

    # The second layer is linear, so it commutes with the attention-weighted sum:
    #   score_kl = w . (W2 x_kl + b2) = x_kl . (W2 w) + b2 . w
    #   sum_l a_kl m_kl = W2 (sum_l a_kl x_kl) + b2 sum_l a_kl
    # The messages m_kl [B, L, K, E] are never built: per edge only an H-vector dot,
    # W2 runs once per node (K times less work than once per edge).
    kernel2, bias2 = _DenseParams(hidden_dim, width, ("mlp", "embed"), std, self.param_dtype,
                                  name="message_out")()
    w_att, _ = _DenseParams(width, 1, ("embed", None), std, self.param_dtype, use_bias=False,
                            name="attention")()
    kernel2, bias2, w_att = nn.dtypes.promote_dtype(kernel2, bias2, w_att, dtype=self.dtype)
    score_vec = kernel2 @ w_att[:, 0]  # [H]
    if self.kernel != "xla":
      # The node parts h_c @ kernel1[:width] and h_c @ kernel1[width:2 width] are computed
      # inside, as one product `[S | N]` at the kernels' padded sizes.
      pooled, weights = gcn_pallas.message_attention(
          h_c, kernel1[:width], kernel1[width:2 * width], edges, ids, neighbor_mask,
          kernel1[2 * width:], bias1, score_vec, tiles=self.pallas_tiles,
          **gcn_pallas.form_options(self.kernel))
      weights = weights.astype(self.dtype)  # [B, L, K]
    else:
      from_self = h_c @ kernel1[:width]  # [B, L, H]
      from_nb = h_c @ kernel1[width:2 * width]  # [B, L, H]
      pooled, weights = self._attention_pool(from_self, from_nb, edges, ids, neighbor_mask,
                                             kernel1[2 * width:], bias1, score_vec,
                                             bias2 @ w_att[:, 0])
    # Dropout on the pooled hidden vector (per node: K times fewer mask hashes than per edge).
    pooled = Dropout(self.dropout_rate)(pooled, deterministic=deterministic)
    aggregated = pooled @ kernel2 + weights.sum(-1, keepdims=True) * bias2  # [B, L, E]
    out = h.astype(self.dtype) + aggregated
    return nn.LayerNorm(epsilon=self.layer_norm_epsilon, dtype=self.dtype,
                        param_dtype=self.param_dtype,
                        scale_init=_partitioned(nn.initializers.ones, ("embed",)),
                        bias_init=_partitioned(nn.initializers.zeros, ("embed",)),
                        name="layer_norm")(out)

  def _attention_pool(self, from_self, from_nb, edges, ids, neighbor_mask, edge_kernel, bias1,
                      score_vec, score_bias):
    """The per-edge part as XLA arrays: `(pooled [B, L, H], weights [B, L, K])`."""
    from_nb = gather_neighbors(from_nb, ids)  # [B, L, K, H]
    from_edge = edges @ edge_kernel  # [B, L, K, H]
    pre = from_self[:, :, None, :] + from_nb + from_edge + bias1  # [B, L, K, H]
    hidden = erf_gelu(pre)  # [B, L, K, H]
    scores = hidden @ score_vec + score_bias  # [B, L, K]

    # One-head attention over the valid neighbours (softmax in float32).
    scores = jnp.where(neighbor_mask, scores.astype(jnp.float32), jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1)
    # A node with no valid neighbour gets all-zero weights (softmax gave 1/K each).
    weights = jnp.where(neighbor_mask, weights, 0.0).astype(self.dtype)  # [B, L, K]
    return jnp.einsum("blk,blkh->blh", weights, hidden), weights  # [B, L, H], [B, L, K]


class SuperTokenEncoder(nn.Module):
  """FormNet's Super-Token encoder: node input projection, then `num_layers` GCN layers.

  Attributes:
    features: model width `E` (node states and messages).
    num_layers: GCN layers (FormNet: 12).
    message_hidden: hidden width of the message MLPs: "width" (`E`) or "input"
      (`2E + F`, FormNet's configs; see the module docstring).
    dropout_rate: dropout of each layer (on its pooled hidden vectors).
    kernel: "xla" or one of `gcn_pallas.FORMS` (see `GCNLayer`).
    pallas_tiles: the fused kernels' `gcn_pallas.Tiles` (None: their defaults).
  """
  features: int
  num_layers: int = 12
  message_hidden: str = "width"
  dropout_rate: float = 0.0
  layer_norm_epsilon: float = 1e-6
  initializer_range: float = 0.02
  kernel: str = "xla"
  pallas_tiles: gcn_pallas.Tiles | None = None
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, token_embeddings: Array, boxes: Array, neighbor_ids: Array,
               neighbor_features: Array, neighbor_mask: Array, node_mask: Array | None = None,
               deterministic: bool = True) -> Array:
    """Computes Super-Tokens.

    Args:
      token_embeddings: `[B, L, D]` token (word-piece) embeddings.
      boxes: `[B, L, 4]` token boxes `[x0, y0, x1, y1]` in LayoutLM 0..1000 units.
      neighbor_ids, neighbor_features, neighbor_mask, node_mask: the padded graph
        (see `GCNLayer`).
      deterministic: disables dropout when True.

    Returns:
      `[B, L, features]` Super-Tokens.
    """
    token_embeddings = jnp.asarray(token_embeddings)
    boxes = jnp.asarray(boxes)
    if token_embeddings.ndim != 3:
      raise ValueError(f"SuperTokenEncoder: field 'token_embeddings' must be [batch, nodes, "
                       f"features], got shape {tuple(token_embeddings.shape)}")
    if tuple(boxes.shape) != tuple(token_embeddings.shape[:2]) + (4,):
      raise ValueError(f"SuperTokenEncoder: field 'boxes' has shape {tuple(boxes.shape)}, "
                       f"expected {tuple(token_embeddings.shape[:2]) + (4,)}")
    spatial = node_spatial_features(boxes)  # [B, L, 6]
    nodes = jnp.concatenate([token_embeddings.astype(jnp.float32), spatial], axis=-1)
    h = nn.Dense(self.features, dtype=self.dtype, param_dtype=self.param_dtype,
                 kernel_init=_partitioned(nn.initializers.normal(self.initializer_range),
                                          (None, "embed")),
                 bias_init=_partitioned(nn.initializers.zeros, ("embed",)),
                 name="node_input")(nodes)  # [B, L, E]
    hidden = message_hidden_width(self.message_hidden, self.features,
                                  jnp.shape(neighbor_features)[-1])
    for i in range(self.num_layers):
      h = GCNLayer(hidden_features=hidden, dropout_rate=self.dropout_rate,
                   layer_norm_epsilon=self.layer_norm_epsilon,
                   initializer_range=self.initializer_range, kernel=self.kernel,
                   pallas_tiles=self.pallas_tiles, dtype=self.dtype,
                   param_dtype=self.param_dtype, name=f"layer_{i}")(
                       h, neighbor_ids, neighbor_features, neighbor_mask, node_mask,
                       deterministic=deterministic)
    return h
