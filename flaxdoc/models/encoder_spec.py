"""`EncoderSpec`: a document encoder's model config, frozen and validated.

Every field of `config.model` that defines the network (sizes, embeddings, attention
and its kernels, layout terms, Super-Tokens, heads, remat) is a field here;
`EncoderSpec.from_config` reads a config and `validate` raises a `ValueError` that names
the field when a combination cannot work. `flaxdoc.models.document_encoder.DocumentEncoder`
is built from one; `spec_config` goes the other way (a full `ConfigDict`, the per-paper
files' starting point).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import ml_collections

from flaxdoc.nn import etc_pallas, gcn_pallas
from flaxdoc.nn.cosformer import REWEIGHT_KINDS
from flaxdoc.nn.embeddings import POSITION_1D_KINDS, POSITION_2D_KINDS
from flaxdoc.nn.gcn import FUSED_KERNELS as GCN_FUSED_KERNELS
from flaxdoc.nn.gcn import KERNELS as GCN_KERNELS
from flaxdoc.nn.gcn import MESSAGE_HIDDEN
from flaxdoc.nn.layout_terms import RICH_AXES

ATTENTION_KINDS = ("dense", "etc", "linformer", "cosformer")
# The string fields of `EncoderSpec` and their allowed values.
CHOICES = {
    "attention": ATTENTION_KINDS,
    "position_1d": POSITION_1D_KINDS,
    "position_2d": POSITION_2D_KINDS,
    "cosformer_reweight": REWEIGHT_KINDS,
    "polar_angle": ("released", "sectors8"),
    "polar_distance_pool": ("document", "batch"),
    "gaussian_corner": ("bottom_left", "top_left", "center"),
    "fixed_bias": ("none", "squircle", "cross"),
    "gcn_message_hidden": MESSAGE_HIDDEN,
    "gaussian_angle": ("released", "paper"),
    "cosformer_length": ("max", "document"),
    "etc_kernel": ("xla", "pallas"),
    "gcn_kernel": GCN_KERNELS,
}


@dataclasses.dataclass(frozen=True)
class EncoderSpec:
  """Everything that defines a flaxdoc document encoder (one model config, frozen).

  Sizes: `width`, `depth` (transformer layers), `num_heads`, `mlp_dim`.
  Regularisation: `dropout_rate` (hidden states, heads), `attention_dropout_rate`.

  Embeddings: `position_1d` and `position_2d` ("learned" | "sine" | "lspe" |
  "lspe_skip" | "none"; see `flaxdoc.nn.embeddings`), `box_size` (LayoutLM's height / width tables),
  `max_position_embeddings` (learned 1D table size), `position_offset` (added to
  `batch["positions"]`; RoBERTa's 2), `type_vocab_size`, `page_embedding`, `max_pages`.

  Attention: `attention` ("dense" | "etc" | "linformer" | "cosformer"),
  `local_radius` and `num_globals` (ETC; globals also allowed with "dense", where
  they see everything and layout terms skip them), `etc_relative_positions` (ETC's
  own relative ids), `etc_kernel` ("xla" | "pallas": ETC's long queries in one fused
  kernel, `flaxdoc.nn.etc_pallas`), `etc_tiles` (the fused kernel's tile sizes and warps,
  `etc_pallas.Tiles`' six fields in order; `()`: its defaults), `linformer_proj_length`
  (`k`), `cosformer_reweight` ("none" | "1d" | "squircle" | "cross").

  Layout terms: `rich_attention` on `rich_axes` (per layer); `polar` (DocPolarBERT,
  shared) with `polar_angle`, `polar_distance_pool`, `polar_distance_buckets`,
  `polar_1d_buckets`, `polar_1d_max_distance`, `polar_1d` (the 1D term on/off),
  `polar_zero_bucket`; `gaussian` (LAGaBi, shared) with `gaussian_corner`, `gaussian_alpha`,
  `gaussian_angle` ("released" | "paper"); `cosformer_length` ("max" | "document");
  `fixed_bias` ("none" | "squircle" | "cross").

  Super-Tokens: `gcn_layers` (0 = off), `gcn_message_hidden` ("width" | "input"),
  `gcn_kernel` ("xla" | "pallas" | "pallas_saved" | "pallas_dpre" | "pallas_fused" |
  "pallas_fused_forward": each layer's per-edge part in fused kernels,
  `flaxdoc.nn.gcn_pallas`, recomputing or saving each edge's GELU for the backward,
  recomputing it but passing `d pre` within the backward, or that with the forward (and
  the backward's node side) in one kernel that evaluates each edge element once; no
  effect without GCN layers), `gcn_tiles` (`gcn_pallas.Tiles`' first four fields in order,
  or all six with the fused kernels' `fused_nodes`, `fused_warps`; `()`: the defaults).
  Tiles are per chip: `flaxdoc.bench.etc_kernel` and `flaxdoc.bench.gcn_kernel --sweep`
  time the candidates on one layer.
  Heads: `tagging_hidden`, `local_order_head`.
  Implementation: `scan_layers`, `remat`, `remat_policy`, `pad_to_multiple_of`.

  `pad_to_multiple_of` (1 = off): the encoder's rows (the `G` globals and the `L` tokens)
  are padded with masked rows to a multiple of this before the encoder layers, and cropped
  after them, so every layer's matrix products see a row count that GPU GEMM libraries
  tile well (Hugging Face tokenizers' `pad_to_multiple_of`, one level further in). Masked
  rows are never attended to by any attention kind, so real tokens' outputs and the
  gradients are unchanged up to rounding (with dropout, the masks are other draws of the
  same rate: they are hashed from a row's place in the padded array). 8 is the value to
  try on GPUs: in FormNet-A2 pre-training (1 global + 1,024 tokens, batch 16) the
  attention projections' weight-gradient products ran at 287 TFLOP/s alone over 16 x
  1,025 rows and at 602 over 16 x 1,032 on an H200 (docs/accelerators.md, session 7's
  `flaxdoc.bench.gemm_floor`). With Linformer attention `max_len` must be a multiple of
  it (its projections are sized for `max_len` rows).
  """
  width: int = 768
  depth: int = 12
  num_heads: int = 12
  mlp_dim: int = 3072
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  layer_norm_epsilon: float = 1e-12
  initializer_range: float = 0.02
  # embeddings
  position_1d: str = "learned"
  position_2d: str = "learned"
  box_size: bool = True
  max_position_embeddings: int = 512
  position_offset: int = 0
  type_vocab_size: int = 2
  page_embedding: bool = False
  max_pages: int = 64
  # attention
  attention: str = "dense"
  local_radius: int = 84
  num_globals: int = 0
  etc_relative_positions: bool = False
  etc_kernel: str = "xla"  # "pallas": the fused long-query kernel (flaxdoc.nn.etc_pallas)
  etc_tiles: tuple[int, ...] = ()  # etc_pallas.Tiles fields in order; (): the defaults
  linformer_proj_length: int = 512
  cosformer_reweight: str = "1d"
  cosformer_length: str = "max"  # 1D M: "max" (max_len) | "document" (released code)
  # layout terms
  rich_attention: bool = False
  rich_axes: tuple[str, ...] = ("x", "y")
  polar: bool = False
  polar_angle: str = "released"
  polar_distance_pool: str = "document"
  polar_distance_buckets: int = 4
  polar_1d_buckets: int = 32
  polar_1d_max_distance: int = 128
  polar_1d: bool = True  # the 1D relative term (released code; the paper has none)
  polar_zero_bucket: bool = False  # a distance bucket of its own for distance 0 (released)
  gaussian: bool = False
  gaussian_corner: str = "bottom_left"
  gaussian_alpha: float = 4.0
  gaussian_angle: str = "released"  # "released" atan2(dx, dy) | "paper" arctan(dy / dx)
  fixed_bias: str = "none"
  # super-tokens and heads
  gcn_layers: int = 0
  gcn_message_hidden: str = "width"
  gcn_kernel: str = "xla"  # "pallas", "pallas_dpre", ...: fused (nn.gcn_pallas.FORMS)
  gcn_tiles: tuple[int, ...] = ()  # gcn_pallas.Tiles fields in order (4 or 6); (): defaults
  tagging_hidden: bool = False
  local_order_head: bool = False
  # implementation
  scan_layers: bool = False
  remat: bool = False
  remat_policy: str = "none"
  pad_to_multiple_of: int = 1  # encoder rows padded (masked) to a multiple; 1: off

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict | Mapping[str, Any]) -> "EncoderSpec":
    """The spec from a model config; fields the spec does not know (name, variant) are ignored."""
    values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in values.items() if k in names}
    if "rich_axes" in kwargs:
      axes = kwargs["rich_axes"]
      kwargs["rich_axes"] = (axes,) if isinstance(axes, str) else tuple(axes)
    for field in ("etc_tiles", "gcn_tiles"):  # a JSON export or a flag gives a list
      if field in kwargs:
        kwargs[field] = tuple(kwargs[field] or ())
    return cls(**kwargs)

  @property
  def head_dim(self) -> int:
    return self.width // self.num_heads

  def tiles(self, field: str, name: str = "model"):
    """`etc_tiles` / `gcn_tiles` as the kernel's `Tiles` (None for `()`, the defaults);
    a `ValueError` naming the config field when they cannot be tiles. (A GPU also wants
    the blocks >= 16; the kernels say so, naming the tile, when they are traced.)"""
    values = tuple(getattr(self, field))
    if not values:
      return None
    cls = etc_pallas.Tiles if field == "etc_tiles" else gcn_pallas.Tiles
    names = [f.name for f in dataclasses.fields(cls)]
    # The GCN's last two fields size the fused forms' kernels (`fused_nodes`,
    # `fused_warps`): four values keep their defaults, as configs written before them do.
    counts = (4, len(names)) if field == "gcn_tiles" else (len(names),)
    if (len(values) not in counts or any(isinstance(v, bool) or not isinstance(v, int)
                                         for v in values)
        or any(v < 1 or v & (v - 1) for v in values)):
      raise ValueError(f"config.model.{field} ({name}): {values} must be "
                       f"{' or '.join(map(str, counts))} powers of two ({', '.join(names)}), "
                       "or () for the kernel's defaults")
    return cls(*values)

  @property
  def uses_layout_terms(self) -> bool:
    return self.rich_attention or self.polar or self.gaussian or self.fixed_bias != "none"

  def validate(self, *, max_len: int | None = None, name: str = "model") -> "EncoderSpec":
    """Raises `ValueError` naming the config field when the combination cannot work."""
    def bad(field: str, msg: str):
      raise ValueError(f"config.model.{field} ({name}): {msg}")

    for field, choices in CHOICES.items():
      if getattr(self, field) not in choices:
        bad(field, f"{getattr(self, field)!r} is not one of {choices}")
    for field in ("width", "depth", "num_heads", "mlp_dim"):
      if int(getattr(self, field)) < 1:
        bad(field, f"must be >= 1, got {getattr(self, field)}")
    pad = self.pad_to_multiple_of
    if isinstance(pad, bool) or not isinstance(pad, int) or pad < 1:
      bad("pad_to_multiple_of", f"must be an integer >= 1 (1: no padding), got {pad!r}")
    for field in ("num_globals", "gcn_layers", "type_vocab_size", "position_offset"):
      if int(getattr(self, field)) < 0:
        bad(field, f"must be >= 0, got {getattr(self, field)}")
    for field in ("dropout_rate", "attention_dropout_rate"):
      if not 0.0 <= float(getattr(self, field)) < 1.0:
        bad(field, f"must be in [0, 1), got {getattr(self, field)}")
    if self.width % self.num_heads:
      bad("num_heads", f"width {self.width} is not divisible by num_heads={self.num_heads}")
    if self.attention == "etc":
      if self.local_radius < 0:
        bad("local_radius", f"must be >= 0, got {self.local_radius}")
      if self.num_globals < 1:
        bad("num_globals", "ETC attention needs at least one global token")
    elif self.etc_relative_positions:
      bad("etc_relative_positions", f"ETC relative ids need attention='etc', not "
          f"{self.attention!r}")
    if self.etc_kernel == "pallas":
      if self.attention != "etc":
        bad("etc_kernel", f"the fused kernel is ETC's, not {self.attention!r} attention's")
      if self.etc_relative_positions:
        bad("etc_kernel", "the fused kernel has no ETC relative ids "
            "(etc_relative_positions=True); use etc_kernel='xla'")
      if self.polar or self.gaussian or self.fixed_bias != "none":
        bad("etc_kernel", "the fused kernel takes Rich Attention as its only layout term "
            "(polar, gaussian and fixed_bias need etc_kernel='xla')")
    for field, kernel, fused in (("etc_tiles", "etc_kernel", ("pallas",)),
                                 ("gcn_tiles", "gcn_kernel", GCN_FUSED_KERNELS)):
      if getattr(self, field) and getattr(self, kernel) not in fused:
        bad(field, f"tiles are for the fused kernels ({kernel} in {fused}), not "
            f"{kernel}={getattr(self, kernel)!r}")
      self.tiles(field, name)
    if self.attention in ("linformer", "cosformer"):
      if self.uses_layout_terms:
        bad("attention", f"{self.attention} attention never forms [N, N] scores, so pairwise "
            "layout terms (rich_attention, polar, gaussian, fixed_bias) cannot be used; "
            "use cosformer_reweight='squircle'/'cross' for 2D locality")
      if self.num_globals:
        bad("num_globals", f"global tokens are an ETC / dense feature, not {self.attention}")
    if self.attention == "linformer" and self.linformer_proj_length < 1:
      bad("linformer_proj_length", f"must be >= 1, got {self.linformer_proj_length}")
    if self.rich_attention:
      axes = tuple(self.rich_axes)
      if not axes or any(a not in RICH_AXES for a in axes) or len(set(axes)) != len(axes):
        bad("rich_axes", f"must be distinct names from {RICH_AXES}, got {axes}")
    if self.polar_distance_buckets < 1:
      bad("polar_distance_buckets", f"must be >= 1, got {self.polar_distance_buckets}")
    if self.page_embedding and self.max_pages < 1:
      bad("max_pages", f"must be >= 1 with page_embedding, got {self.max_pages}")
    if max_len is not None:
      if max_len < 1:
        raise ValueError(f"{name}: max_len must be >= 1, got {max_len}")
      if (self.position_1d == "learned"
          and max_len + self.position_offset > self.max_position_embeddings):
        bad("max_position_embeddings", f"{self.max_position_embeddings} learned positions "
            f"cannot hold max_len={max_len} (+ position_offset {self.position_offset}); raise "
            "it or shorten config.data.max_len")
      if self.attention == "linformer" and max_len % self.pad_to_multiple_of:
        # Rounded up, a full-length batch would have more rows than the projections' N.
        bad("pad_to_multiple_of", f"Linformer's projections are sized for max_len={max_len} "
            f"rows, which is not a multiple of {self.pad_to_multiple_of}")
    return self


def spec_config(spec: EncoderSpec | None = None, **overrides) -> ml_collections.ConfigDict:
  """A model ConfigDict with every `EncoderSpec` field (defaults or `spec`'s), then overrides."""
  base = dataclasses.asdict(spec or EncoderSpec())
  unknown = set(overrides) - set(base) - {"name", "variant"}
  if unknown:
    raise ValueError(f"unknown model config fields {sorted(unknown)}")
  base.update(overrides)
  return ml_collections.ConfigDict(base)
