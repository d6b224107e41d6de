"""Device mesh, logical axis rules and shardings (what used to be called pjit).

The model annotates parameters and activations with *logical* axis names
(`embed`, `heads`, `mlp`, `vocab`, `activation_batch`, ...). The config maps
them to *mesh* axes (`data`, `fsdp`, `tensor`) with a list of rules, so data
parallel, FSDP and tensor parallel are configuration, not code:

    config.mesh.shape = {"data": -1, "fsdp": 1, "tensor": 1}
    config.mesh.rules = [("activation_batch", ("data", "fsdp")), ("embed", "fsdp"), ...]
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import numpy as np
from flax import linen as nn
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

# The batch axes ("data", "fsdp") are defined once, where the fused kernels split their
# work by them (they run per batch shard); the trainer splits the batch the same way.
from flaxdoc.nn.batch_parallel import BATCH_AXES
from flaxdoc.train.config_error import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")

# Sensible defaults: batch over data+fsdp; parameters' widest dims over fsdp;
# heads and mlp over tensor. Unlisted logical names are replicated.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("activation_batch", BATCH_AXES),
    ("activation_length", None),
    ("activation_embed", "tensor"),
    ("activation_heads", "tensor"),
    ("activation_mlp", "tensor"),
    ("activation_vocab", "tensor"),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("layers", None),
)


def mesh_shape(shape: dict[str, int], num_devices: int | None = None) -> tuple[int, ...]:
  """Resolves one `-1` entry so the product equals the device count (`shape` is what
  `config.mesh.shape` sets: a `ConfigError` naming it when it cannot fit)."""
  num_devices = num_devices or jax.device_count()
  dims = [int(shape.get(a, 1)) for a in MESH_AXES]
  if dims.count(-1) > 1:
    raise ConfigError(f"config.mesh.shape={shape}: at most one axis may be -1")
  known = math.prod(d for d in dims if d != -1)
  if -1 in dims:
    if num_devices % known:
      raise ConfigError(f"config.mesh.shape={shape}: does not divide {num_devices} devices")
    dims[dims.index(-1)] = num_devices // known
  if math.prod(dims) != num_devices:
    raise ConfigError(f"config.mesh.shape={shape}: mesh {dict(zip(MESH_AXES, dims))} uses "
                      f"{math.prod(dims)} devices, but {num_devices} are available")
  return tuple(dims)


def make_mesh(shape: dict[str, int] | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A `(data, fsdp, tensor)` mesh with Auto axis types (the modern pjit setting)."""
  devices = list(devices) if devices is not None else jax.devices()
  dims = mesh_shape(shape or {"data": -1}, len(devices))
  return jax.make_mesh(dims, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                       devices=devices)


def rules_from_config(rules) -> tuple[tuple[str, Any], ...]:
  if rules is None:
    return DEFAULT_RULES
  out = []
  for name, axes in rules:
    if isinstance(axes, list):
      axes = tuple(axes)
    out.append((str(name), axes))
  return tuple(out)


def logical_shardings(abstract_tree, mesh: Mesh, rules) -> Any:
  """NamedShardings for a tree of (possibly `nn.Partitioned`) abstract arrays."""
  specs = nn.get_partition_spec(abstract_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules_from_config(rules))


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
  """Leading (batch) dim over data and fsdp, the rest replicated."""
  return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def process_batch_shard(mesh: Mesh, global_batch_size: int) -> tuple[int, int]:
  """(shard_index, shard_count): which rows of the global batch this process loads.

  Rows are split over the (data, fsdp) axes only; processes whose devices differ
  only along `tensor` hold the *same* rows and must load the same data. So the
  shard is derived from the rows this process's devices own, not from the
  process index (with pure data parallelism the two coincide).
  """
  index_map = batch_sharding(mesh, 1).devices_indices_map((global_batch_size,))
  rows = set()
  for device, (sl,) in index_map.items():
    if device.process_index == jax.process_index():
      rows.update(range(*sl.indices(global_batch_size)))
  lo, hi = min(rows), max(rows) + 1
  if len(rows) != hi - lo:
    raise ValueError(f"this process's batch rows are not contiguous ({sorted(rows)[:8]}...); "
                     "use a mesh whose (data, fsdp) axes follow the process layout")
  size = hi - lo
  if global_batch_size % size or lo % size:
    raise ValueError(f"batch rows [{lo}, {hi}) do not tile a global batch of {global_batch_size}")
  return lo // size, global_batch_size // size


def global_batch(local: dict[str, np.ndarray], mesh: Mesh, global_batch_size: int | None = None
                 ) -> dict[str, jax.Array]:
  """Process-local numpy batch -> global jax arrays sharded over (data, fsdp).

  Each process passes the rows of its shard (`process_batch_shard`);
  `jax.make_array_from_process_local_data` assembles one global array of
  `global_batch_size` rows (single-process: just a device_put).
  """
  out = {}
  for k, v in local.items():
    v = np.asarray(v)
    shape = None
    if global_batch_size is not None:
      shape = (global_batch_size, *v.shape[1:])
    out[k] = jax.make_array_from_process_local_data(batch_sharding(mesh, max(v.ndim, 1)), v, shape)
  return out


def replicated_batch_to_global(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """A batch every process holds in full (evaluation) -> global arrays.

  Each process contributes only the rows its devices own, so the global array
  has the batch's own size whatever the process count.
  """
  size = len(next(iter(batch.values())))
  index, count = process_batch_shard(mesh, size)
  rows = slice(index * size // count, (index + 1) * size // count)
  return global_batch({k: np.asarray(v)[rows] for k, v in batch.items()}, mesh, size)
