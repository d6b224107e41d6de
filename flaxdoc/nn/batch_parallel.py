"""Runs a per-example kernel on each device's own rows of the batch.

A `pallas_call` has no sharding rule. Under `jit` with the batch split over devices,
XLA's partitioner therefore replicates its operands: every device gathers the whole
batch and runs the kernel on all of it (correct, but N devices do N times the work and
move the batch between them). The fused kernels (`flaxdoc.nn.etc_pallas`,
`flaxdoc.nn.gcn_pallas`) treat every example alone, so `over_batch` runs them under
`jax.shard_map` on the rows each device holds, over the mesh axes the batch is split
on: `BATCH_AXES`, which the trainer's `flaxdoc.train.sharding` splits the batch on too.
The mesh is the one `jax.set_mesh` made current; without one (or with those axes of
size 1) the kernel is called as it is.

Arguments marked replicated (weights) are whole on every device; their gradients are
summed over the batch shards by `shard_map`'s transpose. Other mesh axes (`tensor`)
are not split inside: XLA gathers an operand split over them before the call.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

BATCH_AXES = ("data", "fsdp")


def batch_shards() -> tuple[tuple[str, ...], int]:
  """`(axes, count)`: the current mesh's batch axes with more than one device, and the
  number of batch shards they make (`((), 1)` without a mesh)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return (), 1
  sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
  axes = tuple(a for a in BATCH_AXES if sizes.get(a, 1) > 1)
  return axes, math.prod(sizes[a] for a in axes)


def over_batch(fn: Callable, args: Sequence, batched: Sequence[bool]):
  """`fn(first_row, *args)`, run per batch shard when the current mesh splits the batch.

  Args:
    fn: a function of `(first_row, *args)` whose outputs all have the batch as their
      leading axis. `first_row` (int32 scalar) is the global index of the first row it
      is given (0 when the batch is not split): a kernel that draws random numbers per
      row uses it so that the draws do not depend on how the batch is split.
    args: arrays (or pytrees of arrays); those with `batched[i]` have the batch as their
      leading axis.
    batched: which args are split with the batch (the rest are replicated).
  """
  axes, count = batch_shards()
  batch = next((jax.tree.leaves(a)[0].shape[0] for a, b in zip(args, batched) if b), None)
  if count == 1 or batch is None or batch % count:
    return fn(jnp.zeros((), jnp.int32), *args)  # no split (or none XLA can make evenly)

  def shard(*local):
    first_row = jax.lax.axis_index(axes).astype(jnp.int32) * (batch // count)
    return fn(first_row, *local)

  in_specs = tuple(P(axes) if b else P() for b in batched)
  # check_vma=False: pallas_call does not declare how its outputs vary over mesh axes.
  return jax.shard_map(shard, mesh=jax.sharding.get_abstract_mesh(), in_specs=in_specs,
                       out_specs=P(axes), check_vma=False)(*args)
