"""Where the fused Pallas kernels run by default: Triton on a GPU, Pallas' interpreter elsewhere.

`etc_pallas.long_query_attention` and `gcn_pallas.message_attention` take `interpret=None`
to mean this default. `lowering_for_gpu()` makes it the Triton form on any backend, for
work that compiles for a GPU from a machine without one (`bench.hlo_traffic`'s
deviceless H100 compile); running such a lowering on the CPU fails, as it should.
"""

from __future__ import annotations

import contextlib
import warnings

import jax

_FOR_GPU = [False]


@contextlib.contextmanager
def lowering_for_gpu():
  """Within: the kernels' default is their Triton form, whatever the default backend."""
  before = _FOR_GPU[0]
  _FOR_GPU[0] = True
  try:
    yield
  finally:
    _FOR_GPU[0] = before


def default_interpret(owner: str, kernels: str, fallback: str, stacklevel: int = 2) -> bool:
  """Whether `interpret=None` means the interpreter here; warns when it does (it is slow).

  owner: the module, for the message; kernels: what runs ("the fused ETC kernel runs");
  fallback: the option to use instead (`"etc_kernel='xla'"`); stacklevel: as
  `warnings.warn`'s, counted from the caller of this function.
  """
  if _FOR_GPU[0]:
    return False
  backend = jax.default_backend()
  if backend == "gpu":
    return False
  warnings.warn(f"flaxdoc.nn.{owner}: no GPU (backend {backend!r}), so {kernels} in Pallas' "
                f"interpreter, which is slow; use {fallback} here", stacklevel=stacklevel + 1)
  return True
