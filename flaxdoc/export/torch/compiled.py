"""`torch.compile` for exported flaxdoc models, the serving path's fastest CPU form.

    model = flaxdoc.export.torch.load_exported(DIR)
    fast = compile_layers(model)          # same outputs, fused kernels after the first call

The exported modules (`flaxdoc.export.torch.layers`) run their fast paths by default
and loop over nothing but layers, so Dynamo traces each forward as one graph; a new
input shape recompiles once (`dynamic=None`: shapes seen twice become symbolic), so a
server that pads documents to a few fixed lengths pays the compile a few times only.
"""

from __future__ import annotations

import torch

from flaxdoc.export.torch import native
from flaxdoc.export.torch.basic import set_fast_paths


def compile_layers(model: torch.nn.Module, *, mode: str | None = None,
                   dynamic: bool | None = None) -> torch.nn.Module:
  """`model` in eval mode with its fast paths on, wrapped by `torch.compile`.

  `mode`: `torch.compile`'s mode (None: the default; "max-autotune-no-cudagraphs" tries
  more kernels). Returns the compiled module; the original is left usable.
  """
  set_fast_paths(model.eval(), True)
  native.available()  # builds the native kernels now: tracing must not run the compiler
  return torch.compile(model, mode=mode, dynamic=dynamic)
