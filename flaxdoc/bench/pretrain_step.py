"""The FormNet-A2 pre-training step the accelerator benchmarks build, and its FLOP count.

One place for what `bench.accelerator` times, `bench.gemm_floor` takes apart product by
product and `bench.hlo_traffic` compiles deviceless, so that the three see the same step:

* `Sizes` / `LOCAL`: FormNet-A2's sizes (12 x 768 encoder, 12 GCN layers, the
  BERT-multilingual vocabulary) and the shrunk model the CPU tests run.
* `StepOptions`: the step's switches (ablation, dropout, the kernels and their tiles,
  the GCN backward's precision, which positions the MLM head scores, row padding), one
  frozen value instead of a long list of parameters; `StepOptions.from_spec` reads it
  from a benchmark row's spec.
* `pretrain_step(...)`: forward, backward and AdamW as the trainer runs them, not yet
  jitted, with its parameters, optimiser state and a random batch.
* Model FLOPs (2 per multiply-add, matrix products only): the encoder forward from
  `flaxdoc.bench.attention.forward_gflop("etc_rich")`, plus the GCN (per node and layer:
  the message MLP's node parts `2 * 2E * Hm`, its second layer `2 * Hm * E`, the edge
  part `2 * K * F * Hm`, with `Hm = 2E + F`), the super-token input projection and the
  MLM head (`2 P E^2 + 2 P E V` over the `P` positions it scores); a training step is 3x
  the forward (backward = 2x).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

from flaxdoc.bench.attention import Size, forward_gflop

MULTILINGUAL_VOCAB = 119_547
MLM_RATE = 0.15


@dataclasses.dataclass(frozen=True)
class Sizes(Size):
  """The encoder's sizes (`flaxdoc.bench.attention.Size`) plus FormNet's GCN and vocabulary."""
  gcn_layers: int = 12
  max_degree: int = 8
  edge_features: int = 16
  vocab: int = MULTILINGUAL_VOCAB


LOCAL = Sizes(layers=2, width=128, heads=4, mlp=512, local_radius=16, gcn_layers=2, vocab=1000)


@dataclasses.dataclass(frozen=True)
class StepOptions:
  """How the step is built; the defaults are the trainer's (XLA kernels everywhere).

  ablation: "full" (GCN + ETC + Rich Attention), "etc_rich" (no GCN) or "etc" (no GCN,
    no Rich Attention).
  dropout: the model's dropout on (the trainer's) or off.
  gcn_backward: the XLA GCN's neighbour-gather gradient, "scatter_f32" or "scatter"
    (`flaxdoc.nn.gcn.NEIGHBOR_GRADIENT`; the Pallas forms have their own).
  mlm_positions: "capped" (the MLM head scores only the targets, at most
    `masking.default_max_predictions` a sequence, as the trainer does) or "all".
  etc_kernel, gcn_kernel, etc_tiles, gcn_tiles: `config.model`'s fields of these names.
  pad_to_multiple_of: the encoder's rows padded to a multiple (`EncoderSpec`; 1: off).
  """
  ablation: str = "full"
  dropout: bool = True
  gcn_backward: str = "scatter_f32"
  mlm_positions: str = "capped"
  etc_kernel: str = "xla"
  gcn_kernel: str = "xla"
  etc_tiles: tuple = ()
  gcn_tiles: tuple = ()
  pad_to_multiple_of: int = 1

  def __post_init__(self):
    # Tiles arrive as lists from JSON specs and argparse; tuples keep the value hashable.
    object.__setattr__(self, "etc_tiles", tuple(self.etc_tiles or ()))
    object.__setattr__(self, "gcn_tiles", tuple(self.gcn_tiles or ()))
    object.__setattr__(self, "pad_to_multiple_of", int(self.pad_to_multiple_of))

  @classmethod
  def from_spec(cls, spec: dict) -> StepOptions:
    """The options a benchmark spec (a JSON dict) names; other keys are ignored."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in spec.items() if k in names and v is not None})


# --------------------------------------------------------------------------- FLOPs
def pretrain_forward_gflop(length: int, s: Sizes, mlm_positions: int | None = None) -> float:
  """Matrix-multiply GFLOP of one FormNet pre-training forward pass (one sequence).

  `mlm_positions`: how many positions the MLM head scores (None: all `length`).
  """
  n, e = float(length), float(s.width)
  p = n if mlm_positions is None else float(mlm_positions)
  mlm_head = 2 * p * e * e + 2 * p * e * s.vocab
  return forward_gflop("etc_rich", length, s) + gcn_gflop(length, s) + mlm_head / 1e9


def gcn_gflop(length: int, s: Sizes) -> float:
  """Matrix-multiply GFLOP of the Super-Token encoder (input projection + GCN layers)."""
  n, e, f, k = float(length), float(s.width), float(s.edge_features), float(s.max_degree)
  hm = 2 * e + f
  gcn = s.gcn_layers * n * (2 * 2 * e * hm + 2 * hm * e + 2 * k * f * hm)
  node_input = 2 * n * (e + 6) * e
  return (gcn + node_input) / 1e9


def train_step_tflop(length: int, batch: int, s: Sizes, mlm_positions: int | None = None) -> float:
  """Forward + backward (2x forward) matmul TFLOP of one step over `batch` sequences."""
  return 3 * batch * pretrain_forward_gflop(length, s, mlm_positions) / 1e3


def mfu(tflop: float, seconds: float, peak_tflops: float) -> float:
  """Model FLOPs utilisation: achieved TFLOP/s over the chip's peak."""
  return tflop / seconds / peak_tflops


# --------------------------------------------------------------------------- the step
def formnet_model(s: Sizes, length: int, dtype: str, param_dtype: str, local: bool,
                  opts: StepOptions = StepOptions()):
  """FormNet-A2 (or its `--local` shrink) for pre-training, as `opts` configures it."""
  from flaxdoc.models import document_encoder as de  # pylint: disable=import-outside-toplevel
  from flaxdoc.models import formnet  # pylint: disable=import-outside-toplevel
  config = formnet.model_config(f"A2/{opts.ablation}", local=local)
  config.etc_kernel = opts.etc_kernel
  config.gcn_kernel = opts.gcn_kernel
  config.etc_tiles = opts.etc_tiles
  config.gcn_tiles = opts.gcn_tiles
  config.pad_to_multiple_of = opts.pad_to_multiple_of
  model = formnet.build(config, vocab_size=s.vocab, num_tags=1, max_len=length, pretraining=True,
                        dtype=dtype)
  if param_dtype != "float32":
    model = model.clone(param_dtype=de._dtype(param_dtype))  # pylint: disable=protected-access
  return model


def pretrain_batch(batch: int, length: int, s: Sizes, mlm_rate: float = MLM_RATE,
                   max_predictions: int | None = None) -> dict:
  """A full (unpadded) random pre-training batch with the graph and MLM targets.

  Each token is an MLM target with probability `mlm_rate` (BERT's 15%), at most
  `max_predictions` per sequence, as `flaxdoc.data.masking.mask_tokens` draws them.
  """
  import numpy as np  # pylint: disable=import-outside-toplevel
  from flaxdoc import models  # pylint: disable=import-outside-toplevel
  from flaxdoc.data import masking  # pylint: disable=import-outside-toplevel
  b = models.example_batch(batch, length, vocab_size=s.vocab, graph=True, pretraining=True,
                           max_degree=s.max_degree, edge_features=s.edge_features)
  b["attention_mask"] = np.ones_like(b["attention_mask"])
  rng = np.random.default_rng(1)
  chosen = rng.random((batch, length)) < mlm_rate
  if max_predictions is not None:
    chosen = masking.cap_per_row(chosen, max_predictions, rng)
  b["mlm_targets"] = np.where(chosen, b["input_ids"], 0).astype(np.int32)
  b["mlm_weights"] = chosen.astype(np.float32)
  b["mlm_mask"] = chosen
  for k in ("lop_mask", "lop_targets", "lop_weights", "tags", "word_ids"):
    b.pop(k, None)
  return b


class PretrainStep(NamedTuple):
  """What `pretrain_step` returns; unpacks as `step, (params, opt_state, data), ...`."""
  step: Callable  # (params, opt_state, data, rng) -> (params, opt_state, loss)
  state: tuple  # (params, opt_state, data), on the default device
  tx: Any  # the optax AdamW transformation
  head_positions: int | None  # positions the MLM head scores a sequence (None: all)
  sizes: Sizes  # the sizes the FLOP count should use (no GCN layers without a GCN)


def pretrain_step(length: int, batch: int, dtype: str, param_dtype: str, s: Sizes, local: bool,
                  opts: StepOptions = StepOptions()) -> PretrainStep:
  """The step not yet jitted: forward, backward and AdamW, as the trainer runs it."""
  import jax  # pylint: disable=import-outside-toplevel
  from flaxdoc.nn import gcn  # pylint: disable=import-outside-toplevel
  gcn.NEIGHBOR_GRADIENT = opts.gcn_backward
  import optax  # pylint: disable=import-outside-toplevel
  from flaxdoc import models  # pylint: disable=import-outside-toplevel
  from flaxdoc.data import masking  # pylint: disable=import-outside-toplevel
  from flaxdoc.train import objectives  # pylint: disable=import-outside-toplevel
  model = formnet_model(s, length, dtype, param_dtype, local, opts)
  if opts.ablation != "full":
    s = dataclasses.replace(s, gcn_layers=0)
  # "all": the MLM head scores every position; "capped": only the targets, at most
  # masking.default_max_predictions per sequence (what the trainer does).
  head_positions = (None if opts.mlm_positions == "all"
                    else masking.default_max_predictions(length, MLM_RATE))
  model = model.clone(mlm_max_predictions=head_positions)
  host = pretrain_batch(batch, length, s, max_predictions=head_positions)
  params = models.random_parameters(model, {k: v[:1] for k, v in host.items()})
  if param_dtype != "float32":
    params = jax.tree.map(lambda x: x.astype(param_dtype), params)
  params = jax.device_put(params)
  tx = optax.adamw(1e-4, weight_decay=0.01)
  opt_state = jax.jit(tx.init)(params)
  data = jax.device_put(host)

  def loss_fn(p, b, rng):
    out = model.apply({"params": p}, b, deterministic=not opts.dropout, rngs={"dropout": rng})
    return objectives.pretraining_loss(out, b)

  def step(p, o, b, rng):
    (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, b, rng)
    updates, o = tx.update(grads, o, p)
    return optax.apply_updates(p, updates), o, loss

  return PretrainStep(step, (params, opt_state, data), tx, head_positions, s)
