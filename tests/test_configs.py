"""Every `configs/*.py` file: loads, has the paper's data settings, builds its model.

Models are only traced (`jax.eval_shape`) here; compiling and training them is
`tests/models/test_train_step.py`'s job.
"""

import importlib.util
from pathlib import Path

import pytest

from flaxdoc import models

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"

# file -> (model name, max_len, scheme, recipe learning rate)
EXPECTED = {
    "formnet_a1": ("formnet", 1024, "BIOES", 1e-4),
    "formnet_a2": ("formnet", 1024, "BIOES", 1e-4),
    "formnet_a3": ("formnet", 1024, "BIOES", 1e-4),
    "formnet_etc": ("formnet", 1024, "BIOES", 1e-4),
    "formnet_etc_rich": ("formnet", 1024, "BIOES", 1e-4),
    "formnet_etc_gcn": ("formnet", 1024, "BIOES", 1e-4),
    "docpolarbert_base": ("docpolarbert", 512, "BIO", 5e-5),
    "lagabi_roberta_base": ("lagabi", 512, "BIO", 5e-5),
    "layoutlm_base": ("layoutlm", 512, "BIO", 5e-5),
    "layoutlm_lspe": ("layoutlm", 512, "BIO", 5e-5),
    "layout_linformer": ("layout_linformer", 2048, "BIO", 5e-5),
    "layout_cosformer": ("layout_cosformer", 2048, "BIO", 5e-5),
}


def load(name):
  path = CONFIG_DIR / f"{name}.py"
  spec = importlib.util.spec_from_file_location(f"flaxdoc_configs_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config


def test_every_config_file_is_listed():
  assert sorted(p.stem for p in CONFIG_DIR.glob("*.py")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_defaults(name):
  model_name, max_len, scheme, lr = EXPECTED[name]
  config = load(name)(None)
  assert config.model.name == model_name
  assert config.data.max_len == max_len
  assert config.data.scheme == scheme
  assert config.optim.lr == lr
  assert config.mode == "train"
  assert config.model.pad_to_multiple_of == 1  # off unless asked for
  # The full-size model builds (no tracing: only the config checks run).
  models.build_model(config.model, vocab_size=1000, num_tags=9, max_len=config.data.max_len,
                     pretraining=False, dtype=config.dtype)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_local_config_traces(name):
  config = load(name)("local")
  assert config.data.max_len == 256
  assert config.model.width <= 128 and config.model.depth <= 4 and config.model.num_heads <= 4
  n = models.count_parameters(config.model, vocab_size=1000, max_len=config.data.max_len,
                              num_tags=9)
  assert 0 < n < 2_000_000, n  # seconds on a CPU, not hours


def test_formnet_ablations():
  def switches(config):
    m = config.model
    return m.rich_attention, m.gcn_layers > 0, m.etc_relative_positions

  assert switches(load("formnet_a2")(None)) == (True, True, False)
  assert switches(load("formnet_etc")(None)) == (False, False, True)
  assert switches(load("formnet_etc_rich")(None)) == (True, False, False)
  assert switches(load("formnet_etc_gcn")(None)) == (False, True, True)
  assert switches(load("formnet_a1")("ablation=etc_rich")) == (True, False, False)
  # The ablation files keep their ablation when the size changes.
  small = load("formnet_etc_gcn")("variant=A1")
  assert small.model.width == 512 and switches(small) == (False, True, True)
  assert models.needs_graph(load("formnet_a3")(None).model)
  assert not models.needs_graph(load("formnet_etc_rich")(None).model)
  with pytest.raises(ValueError, match="ablation"):
    load("formnet_a1")("ablation=gcn_only")


def test_formnet_variants():
  for variant, width, heads in (("A1", 512, 8), ("A2", 768, 12), ("A3", 1024, 16)):
    config = load("formnet_a2")(f"variant={variant}")
    assert (config.model.width, config.model.num_heads, config.model.depth) == (width, heads, 12)
    assert config.model.gcn_layers == 12 and config.model.num_globals == 1


def test_options_in_the_arg():
  c = load("layoutlm_base")("bias=squircle,split=page")
  assert c.model.bias == "squircle" and c.data.split == "page"
  lspe = load("layoutlm_lspe")
  assert lspe(None).model.positions == "lspe"
  assert lspe("positions=lspe_sc").model.positions == "lspe_sc"
  assert load("layout_cosformer")("reweight=cross").model.cosformer_reweight == "cross"
  assert load("layout_cosformer")(None).model.cosformer_reweight == "1d"
  with pytest.raises(ValueError, match="reweight"):
    load("layout_cosformer")("reweight=diagonal")
  lagabi = load("lagabi_roberta_base")("variant=layoutlm_base")
  assert lagabi.model.position_2d == "learned" and lagabi.model.gaussian
  pretrain = load("docpolarbert_base")("mode=pretrain")
  assert pretrain.data.mlm_rate == 0.3 and pretrain.data.lop_rate == 0.3


def test_overrides_after_locking():
  """`--config.model.x=...` works on a locked config (main.py locks it) and is honoured."""
  config = load("layoutlm_lspe")("local")
  config.lock()
  config.model.positions = "sine"
  config.model.bias = "cross"
  model = models.build_model(config.model, vocab_size=50, num_tags=3, max_len=64,
                             pretraining=False)
  assert model.spec.position_1d == "sine" and model.spec.fixed_bias == "cross"
  # As `--config.model.pad_to_multiple_of=8` on the command line sets it.
  config = load("formnet_a2")("local")
  config.lock()
  config.model.pad_to_multiple_of = 8
  model = models.build_model(config.model, vocab_size=50, num_tags=3, max_len=64,
                             pretraining=False)
  assert model.spec.pad_to_multiple_of == 8
