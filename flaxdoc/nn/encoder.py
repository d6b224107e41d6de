"""Post-LayerNorm transformer encoder layer and stack (BERT / ETC style).

    x = LN(x + Dropout(Attention(x)))
    x = LN(x + Dropout(W2 gelu(W1 x + b1) + b2))

The attention is pluggable. Every flaxdoc attention module implements the *shared
self-attention signature*

    attention(x [B, N, E], mask bool [B, N], terms=(), geom=None,
              deterministic=True) -> [B, N, E]

* `flaxdoc.nn.attention.DenseSelfAttention` (softmax over all pairs),
* `flaxdoc.nn.etc_attention.EtcAttention` (global-local; `x` holds the `G` global
  tokens first, see `with_global_tokens`),
* `flaxdoc.nn.linformer.LinformerAttention`, `flaxdoc.nn.cosformer` (no pairwise
  terms).

`mask` is True for real tokens; `terms` are layout score terms
(`flaxdoc.nn.layout_terms`); `geom` is a dict of per-token arrays `[B, N, ...]`
(`"centers"`, `"boxes"`, `"positions"`, `"valid"`, `"document_ids"`, ...).
The layer receives an *attention factory* (e.g.
`functools.partial(EtcAttention, num_heads=12, local_radius=84)`) and calls it with
`name="attention"`, so one encoder definition serves every paper.

Layout terms come in two kinds:

* per-layer terms (FormNet's Rich Attention has its own parameters in each layer):
  `layer_terms`, a sequence of factories, each called as `factory(name="term_i")`
  inside every layer;
* shared terms (DocPolarBERT's tables, LAGaBi's Gaussians are shared by all layers):
  `shared_terms`, a sequence of term *instances* (unbound templates) whose
  parameters are created once by the `Encoder` (under `shared_term_i`) and handed to
  each layer, so sharing survives `nn.scan`. A shared term must create its
  parameters in `setup()` from its attributes (see `flaxdoc.nn.layout_terms`).

`Encoder` options: `scan_layers` (`nn.scan` over layers, parameters stacked on a
leading `layers` axis: one compiled layer instead of `L`), and `remat`
(`nn.remat` with a `remat_policy`, a name from `jax.checkpoint_policies` such as
"nothing_saveable" or "dots_saveable", or a policy callable). Activations are
constrained to the logical axes `("activation_batch", "activation_length",
"activation_embed")` at every layer boundary, so a trainer can shard them with rules
from its config.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

from flaxdoc.nn.attention import default_kernel_init
from flaxdoc.nn.dropout import Dropout
from flaxdoc.nn.gelu import bias_erf_gelu

Array = jax.Array
Dtype = Any
ModuleFactory = Callable[..., nn.Module]

ACTIVATION_AXES = ("activation_batch", "activation_length", "activation_embed")


def constrain_activations(x: Array) -> Array:
  """Logical sharding constraint `[batch, length, embed]` (no-op without axis rules)."""
  return nn.with_logical_constraint(x, ACTIVATION_AXES)


def remat_policy_from_name(policy: str | Callable | None) -> Callable | None:
  """`None`/"none" (save nothing extra), a `jax.checkpoint_policies` name, or a callable."""
  if policy is None or callable(policy):
    return policy
  if policy == "none":
    return None
  found = getattr(jax.checkpoint_policies, policy, None)
  if found is None:
    names = [n for n in dir(jax.checkpoint_policies) if not n.startswith("_")]
    raise ValueError(f"unknown remat policy {policy!r}; expected one of {names} or 'none'")
  return found


def _run_setup(module: nn.Module, seen: set[int]) -> None:
  """Runs `setup()` of a bound module and of the submodules it defines, recursively.

  Setup is otherwise lazy; a wrapper term (e.g. one sharing its scope with an inner
  term made in its `setup`) only gets its inner parameters once the inner module's
  own setup has run.
  """
  if id(module) in seen or module.scope is None:
    return
  seen.add(id(module))
  module._try_setup()  # pylint: disable=protected-access  (setup() makes the params)
  for attr, value in vars(module).items():
    if attr == "parent" or attr.startswith("_"):
      continue
    for leaf in jax.tree_util.tree_leaves(value, is_leaf=lambda v: isinstance(v, nn.Module)):
      if isinstance(leaf, nn.Module):
        _run_setup(leaf, seen)


def _bind_shared_term(parent: nn.Module, template: nn.Module, name: str) -> nn.Module:
  """Binds a copy of `template` under `parent` and creates its parameters now.

  Running `setup()` here, outside any lifted transform, puts the parameters in the
  parent's scope exactly once; layers then receive them as plain arrays.
  """
  bound = template.clone(parent=parent, name=name)
  _run_setup(bound, set())
  return bound


class _SharedTermApplication:
  """A shared term template applied functionally with given parameters.

  Plain callable (not a module) with the score-term signature, so it can be used
  inside scanned / rematerialised layers without touching the outer scope.
  """

  def __init__(self, template: nn.Module, params: Any):
    self.template = template
    self.params = params

  def __call__(self, q, k, q_geom, k_geom):
    return self.template.apply({"params": self.params}, q, k, q_geom, k_geom)


class EncoderLayer(nn.Module):
  """One post-LN transformer layer with a pluggable attention.

  Attributes:
    attention: factory of the attention module (shared self-attention signature),
      called as `attention(name="attention")`.
    mlp_dim: hidden width of the feed-forward block.
    dropout_rate: dropout on the attention output and the feed-forward output
      (attention-weight dropout is the attention module's own `dropout_rate`).
    layer_norm_epsilon: LayerNorm epsilon (BERT: 1e-12).
    layer_terms: per-layer term factories, called as `factory(name=f"term_{i}")`.
    shared_terms: shared term templates; their parameters come in `shared_params`
      (from `Encoder`), or, when `shared_params` is None, are owned by this layer.
    returns_carry: return `(x, None)` (the `nn.scan` body convention).
    dtype, param_dtype, kernel_init: compute / parameter dtype, kernel initializer.
  """
  attention: ModuleFactory
  mlp_dim: int
  dropout_rate: float = 0.1
  layer_norm_epsilon: float = 1e-12
  layer_terms: Sequence[ModuleFactory] = ()
  shared_terms: Sequence[nn.Module] = ()
  returns_carry: bool = False
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  kernel_init: Callable[..., Array] = default_kernel_init()

  def _layer_norm(self, name: str) -> nn.Module:
    return nn.LayerNorm(
        epsilon=self.layer_norm_epsilon, dtype=self.dtype, param_dtype=self.param_dtype,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)),
        name=name)

  def _dense(self, features: int, axes: tuple[str, str], name: str) -> nn.Module:
    return nn.Dense(
        features, dtype=self.dtype, param_dtype=self.param_dtype,
        kernel_init=nn.with_logical_partitioning(self.kernel_init, axes),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (axes[1],)),
        name=name)

  @nn.compact
  def __call__(self, x: Array, mask: Array, geom: Mapping[str, Array] | None = None,
               shared_params: Sequence[Any] | None = None, deterministic: bool = True):
    """Applies the layer.

    Args:
      x: `[B, N, E]` token states.
      mask: bool `[B, N]`, True for real tokens.
      geom: per-token geometry, leaves `[B, N, ...]`, passed to the attention.
      shared_params: one parameter tree per shared term (from `Encoder`), or None
        to let this layer own the shared terms' parameters.
      deterministic: disables dropout.

    Returns:
      `[B, N, E]`, or `([B, N, E], None)` when `returns_carry`.
    """
    x = constrain_activations(x)
    terms = [factory(name=f"term_{i}") for i, factory in enumerate(self.layer_terms)]
    if self.shared_terms:
      if shared_params is None:
        terms += [_bind_shared_term(self, t, f"shared_term_{i}")
                  for i, t in enumerate(self.shared_terms)]
      else:
        if len(shared_params) != len(self.shared_terms):
          raise ValueError(f"EncoderLayer: {len(self.shared_terms)} shared terms but "
                           f"{len(shared_params)} parameter trees")
        terms += [_SharedTermApplication(t, p) for t, p in zip(self.shared_terms, shared_params)]

    y = self.attention(name="attention")(x, mask, terms=tuple(terms), geom=geom,
                                         deterministic=deterministic)  # [B, N, E]
    y = Dropout(self.dropout_rate)(y, deterministic=deterministic)
    x = self._layer_norm("attention_norm")(x + y)  # [B, N, E]

    width = x.shape[-1]
    h = DenseGelu(self.mlp_dim, dtype=self.dtype, param_dtype=self.param_dtype,
                  kernel_init=nn.with_logical_partitioning(self.kernel_init, ("embed", "mlp")),
                  bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("mlp",)),
                  name="mlp_in")(x)  # [B, N, M]: BERT's erf GELU of the first dense layer
    h = nn.with_logical_constraint(h, ("activation_batch", "activation_length", "activation_mlp"))
    h = self._dense(width, ("mlp", "embed"), "mlp_out")(h)  # [B, N, E]
    h = Dropout(self.dropout_rate)(h, deterministic=deterministic)
    x = self._layer_norm("mlp_norm")(x + h)  # [B, N, E]
    x = constrain_activations(x)
    return (x, None) if self.returns_carry else x


class DenseGelu(nn.Module):
  """`bias_erf_gelu(x @ kernel, bias)`: `nn.Dense`'s parameters (names, shapes, initialisers,
  dtype promotion) followed by the GELU, with the bias added inside the checkpointed GELU."""
  features: int
  dtype: Any = None
  param_dtype: Any = jnp.float32
  kernel_init: Callable[..., Array] = nn.initializers.lecun_normal()
  bias_init: Callable[..., Array] = nn.initializers.zeros_init()

  @nn.compact
  def __call__(self, x: Array) -> Array:
    kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features),
                        self.param_dtype)  # [E, M]
    bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype)  # [M]
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=self.dtype)
    y = jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))  # [..., M]
    return bias_erf_gelu(y, bias)


class Encoder(nn.Module):
  """A stack of `EncoderLayer`s, optionally scanned and/or rematerialised.

  Attributes:
    num_layers: `L`.
    attention: attention factory (see `EncoderLayer`).
    mlp_dim, dropout_rate, layer_norm_epsilon: as `EncoderLayer`.
    layer_terms: per-layer term factories (each layer builds its own).
    shared_terms: shared term templates (parameters created once, here).
    scan_layers: `nn.scan` over layers; parameters get a leading `layers` axis
      (`params["layers"][...]` with shape `[L, ...]`) instead of `layer_{i}`.
    remat: rematerialise each layer in the backward pass.
    remat_policy: see `remat_policy_from_name`.
    dtype, param_dtype, kernel_init: as `EncoderLayer`.
  """
  num_layers: int
  attention: ModuleFactory
  mlp_dim: int
  dropout_rate: float = 0.1
  layer_norm_epsilon: float = 1e-12
  layer_terms: Sequence[ModuleFactory] = ()
  shared_terms: Sequence[nn.Module] = ()
  scan_layers: bool = False
  remat: bool = False
  remat_policy: str | Callable | None = None
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  kernel_init: Callable[..., Array] = default_kernel_init()

  @nn.compact
  def __call__(self, x: Array, mask: Array, geom: Mapping[str, Array] | None = None,
               deterministic: bool = True) -> Array:
    """Encodes `x [B, N, E]` with `mask bool [B, N]` and geometry leaves `[B, N, ...]`."""
    if x.ndim != 3 or tuple(jnp.shape(mask)) != tuple(x.shape[:2]):
      raise ValueError(f"Encoder: expected x [B, N, E] and mask [B, N], got {x.shape} and "
                       f"{jnp.shape(mask)}")
    if self.num_layers < 1:
      raise ValueError(f"Encoder: num_layers must be >= 1, got {self.num_layers}")
    mask = jnp.asarray(mask, bool)
    geom = None if geom is None else dict(geom)

    holders = [_bind_shared_term(self, t, f"shared_term_{i}")
               for i, t in enumerate(self.shared_terms)]
    shared_params = tuple(h.variables.get("params", {}) for h in holders)
    templates = tuple(t.clone(parent=None) for t in self.shared_terms)

    layer_cls = EncoderLayer
    if self.remat:
      # Arguments counted with `self` at 0: (x, mask, geom, shared_params,
      # deterministic); `deterministic` is a Python bool and must stay static.
      layer_cls = nn.remat(layer_cls, policy=remat_policy_from_name(self.remat_policy),
                           prevent_cse=not self.scan_layers, static_argnums=(5,))
    kwargs = dict(attention=self.attention, mlp_dim=self.mlp_dim,
                  dropout_rate=self.dropout_rate, layer_norm_epsilon=self.layer_norm_epsilon,
                  layer_terms=tuple(self.layer_terms), shared_terms=templates,
                  dtype=self.dtype, param_dtype=self.param_dtype, kernel_init=self.kernel_init)
    if self.scan_layers:
      stack = nn.scan(layer_cls, variable_axes={"params": 0},
                      split_rngs={"params": True, "dropout": True},
                      in_axes=(nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast),
                      length=self.num_layers, metadata_params={nn.PARTITION_NAME: "layers"})
      x, _ = stack(returns_carry=True, name="layers", **kwargs)(x, mask, geom, shared_params,
                                                                deterministic)
    else:
      for i in range(self.num_layers):
        x = layer_cls(name=f"layer_{i}", **kwargs)(x, mask, geom, shared_params, deterministic)
    return x
