"""The fused kernels' default backend choice, and the override for compiling for a GPU elsewhere."""

from __future__ import annotations

import warnings

import pytest

from flaxdoc.nn import pallas_backend


def test_off_a_gpu_the_default_is_the_interpreter_with_a_warning_unless_lowering_for_a_gpu():
  with pytest.warns(UserWarning, match=r"flaxdoc.nn.x: no GPU .* the kernels run in Pallas' "
                                       r"interpreter.*use k='xla' here"):
    assert pallas_backend.default_interpret("x", "the kernels run", "k='xla'")
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    with pallas_backend.lowering_for_gpu():
      assert not pallas_backend.default_interpret("x", "the kernels run", "k='xla'")
      with pallas_backend.lowering_for_gpu():  # nested: the outer one still holds after
        pass
      assert not pallas_backend.default_interpret("x", "the kernels run", "k='xla'")
  with pytest.warns(UserWarning):  # restored on the way out
    assert pallas_backend.default_interpret("x", "the kernels run", "k='xla'")
