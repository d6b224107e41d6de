"""`flaxdoc.bench.pretrain_step`: the FLOP count and the step's options (no step is built)."""

import dataclasses

import pytest

from flaxdoc.bench import pretrain_step as ps
from flaxdoc.bench.attention import Size, forward_gflop


def test_pretrain_flops_add_gcn_and_mlm_head_to_the_encoder():
  s = ps.Sizes()
  n = 1024
  encoder = forward_gflop("etc_rich", n, Size())
  hm = 2 * 768 + 16
  gcn = 12 * n * (4 * 768 * hm + 2 * hm * 768 + 2 * 8 * 16 * hm) / 1e9
  head = (2 * n * 768 * 768 + 2 * n * 768 * s.vocab) / 1e9
  node_input = 2 * n * (768 + 6) * 768 / 1e9
  assert ps.pretrain_forward_gflop(n, s) == pytest.approx(encoder + gcn + head + node_input)
  # Training is forward + backward (2x): 3x the forward, per sequence in the batch.
  assert ps.train_step_tflop(n, 4, s) == pytest.approx(12 * ps.pretrain_forward_gflop(n, s) / 1e3)
  # The 6 * parameters * tokens rule of thumb for the A2 model (221.5M parameters)
  # lands within 10% (attention and the per-edge GCN work are extra).
  assert ps.train_step_tflop(n, 1, s) == pytest.approx(6 * 221.5e6 * n / 1e12, rel=0.1)
  # The MLM head over 231 capped positions instead of all 1,024.
  saved = 2 * (n - 231) * 768 * (768 + s.vocab) / 1e9
  assert ps.pretrain_forward_gflop(n, s, 231) == pytest.approx(ps.pretrain_forward_gflop(n, s)
                                                               - saved)


def test_mfu():
  assert ps.mfu(989.0, 2.0, 989.0) == pytest.approx(0.5)


def test_step_options_from_a_json_spec():
  spec = dict(part="pretrain", length=1024, etc_kernel="pallas", gcn_kernel="pallas_dpre",
              gcn_tiles=[16, 64, 64, 4], etc_tiles=None, pad_to_multiple_of=8.0, dropout=False)
  opts = ps.StepOptions.from_spec(spec)
  # Keys that are not options are ignored; None keeps the default; lists become tuples,
  # so the options stay hashable (a jit static argument, a dict key).
  assert opts == ps.StepOptions(etc_kernel="pallas", gcn_kernel="pallas_dpre",
                                gcn_tiles=(16, 64, 64, 4), pad_to_multiple_of=8, dropout=False)
  assert opts.gcn_tiles == (16, 64, 64, 4) and opts.etc_tiles == ()
  assert isinstance(opts.pad_to_multiple_of, int)
  assert hash(opts) == hash(ps.StepOptions.from_spec(dict(spec)))
  with pytest.raises(dataclasses.FrozenInstanceError):
    opts.gcn_kernel = "xla"
  # The defaults are the trainer's: XLA everywhere, dropout on, capped MLM positions.
  assert ps.StepOptions() == ps.StepOptions.from_spec({})
  assert (ps.StepOptions().etc_kernel, ps.StepOptions().gcn_kernel) == ("xla", "xla")
