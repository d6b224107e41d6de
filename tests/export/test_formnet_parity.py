"""FormNet (ETC + Rich Attention + GCN) exported to PyTorch: logits match Flax, and torch.export.

Documents are synthetic ones through the featuriser; the window (64 tokens) is longer
than one ETC block of the local config (radius 16, block 17), and the second row is
mostly padding.
"""

import sys
from pathlib import Path

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import export_helpers as H  # noqa: E402

from flaxdoc.export import weights as weights_lib  # noqa: E402
from flaxdoc.export.torch import build_torch_model  # noqa: E402

MAX_LEN = 64
TOL = 1e-4


@pytest.fixture(scope="module")
def formnet():
  batch = H.synthetic_batch(MAX_LEN, graph=True)
  model, params, config = H.flax_model("formnet", "A1", batch, max_len=MAX_LEN, seed=3)
  # Compiled whole: op by op, every small op of the model would compile on its own.
  apply = jax.jit(lambda p, b: model.apply({"params": p}, b)["tag_logits"])
  expected = np.asarray(apply(params, batch))
  tmodel = build_torch_model(config, weights_lib.export_tensors(params))
  return batch, expected, tmodel, config


def test_window_spans_several_etc_blocks_and_has_padding(formnet):
  batch, _, _, config = formnet
  block = config["model"]["local_radius"] + 1
  assert batch["attention_mask"][0].sum() > 2 * block
  assert batch["attention_mask"][1].sum() < MAX_LEN
  assert config["model"]["gcn_layers"] > 0 and config["model"]["rich_attention"]


def test_formnet_logits_match_flax(formnet):
  batch, expected, tmodel, _ = formnet
  with torch.no_grad():
    got = tmodel(H.torch_batch(batch)).numpy()
  assert got.shape == expected.shape
  assert np.all(np.isfinite(got))
  np.testing.assert_allclose(got, expected, atol=TOL, rtol=0)


def test_padding_does_not_change_real_tokens(formnet):
  # The short row alone (no batch neighbour) gives the same logits on its real tokens.
  batch, _, tmodel, _ = formnet
  real = int(batch["attention_mask"][1].sum())
  one = {k: v[1:2] for k, v in batch.items()}
  with torch.no_grad():
    full = tmodel(H.torch_batch(batch)).numpy()[1, :real]
    alone = tmodel(H.torch_batch(one)).numpy()[0, :real]
  np.testing.assert_allclose(alone, full, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_etc_ablation_with_relative_ids_matches_flax():
  batch = H.synthetic_batch(MAX_LEN, graph=False)
  model, params, config = H.flax_model("formnet", "A1/etc", batch, max_len=MAX_LEN, seed=4)
  assert config["model"]["etc_relative_positions"]
  expected = np.asarray(model.apply({"params": params}, batch)["tag_logits"])
  tmodel = build_torch_model(config, weights_lib.export_tensors(params))
  with torch.no_grad():
    got = tmodel(H.torch_batch(batch)).numpy()
  np.testing.assert_allclose(got, expected, atol=TOL, rtol=0)


def test_torch_export_runs_with_the_same_outputs(formnet):
  batch, expected, tmodel, _ = formnet
  inputs = {k: v for k, v in H.torch_batch(batch).items()
            if k in ("input_ids", "attention_mask", "positions", "page_ids", "boxes",
                     "neighbor_ids", "neighbor_features", "neighbor_mask")}
  exported = torch.export.export(tmodel, (inputs,))
  with torch.no_grad():
    got = exported.module()(inputs).numpy()
  np.testing.assert_allclose(got, expected, atol=TOL, rtol=0)


def test_missing_or_misshaped_tensor_is_named(formnet):
  _, _, tmodel, config = formnet
  tensors = {k: v.detach().numpy() for k, v in tmodel.state_dict().items()}
  tensors.pop("tagging_head.output.bias")
  with pytest.raises(weights_lib.WeightsError, match="tagging_head.output.bias"):
    build_torch_model(config, tensors)
