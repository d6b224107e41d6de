"""`config.model.etc_tiles` / `gcn_tiles`: the fused kernels' tiles from the config to the kernels."""

import functools

import jax
import numpy as np
import pytest

from flaxdoc import models
from flaxdoc.models.document_encoder import EncoderSpec
from flaxdoc.nn import etc_pallas, gcn_pallas

LENGTH, VOCAB, TAGS = 24, 64, 3
FUSED = dict(attention="etc", num_globals=1, rich_attention=True, etc_kernel="pallas",
             gcn_layers=1, gcn_kernel="pallas_saved")


@pytest.mark.parametrize("fields, message", [
    (dict(FUSED, etc_kernel="xla", etc_tiles=(32, 64, 4, 32, 32, 4)), "etc_tiles.*etc_kernel='xla'"),
    (dict(FUSED, gcn_kernel="xla", gcn_tiles=(16, 32, 32, 4)), "gcn_tiles.*gcn_kernel='xla'"),
    (dict(FUSED, gcn_tiles=(16, 32, 32)), "gcn_tiles.*4 or 6 powers of two"),
    (dict(FUSED, gcn_tiles=(16, 32, 32, 4, 2)), "gcn_tiles.*4 or 6 powers of two"),
    (dict(FUSED, gcn_tiles=(16, 32, 32, 4, 2, 6)), "gcn_tiles.*fused_nodes, fused_warps"),
    (dict(FUSED, gcn_tiles=(16, 24, 32, 4)), "gcn_tiles.*block_nodes, block_hidden"),
    (dict(FUSED, etc_tiles=(32, 64, 4, 32, 32, 0)), "etc_tiles.*6 powers of two"),
    (dict(FUSED, etc_tiles=(32, 64, True, 32, 32, 4)), "etc_tiles"),
])
def test_bad_tiles_name_the_config_field(fields, message):
  with pytest.raises(ValueError, match=f"config.model.{message}"):
    EncoderSpec(**fields).validate()


def test_tiles_from_a_config_or_an_export():
  # A flag or a JSON export gives lists; the spec keeps tuples (hashable, comparable).
  spec = EncoderSpec.from_config(dict(FUSED, etc_tiles=[16, 16, 4, 16, 16, 4],
                                      gcn_tiles=[8, 16, 16, 4])).validate()
  assert spec.etc_tiles == (16, 16, 4, 16, 16, 4)
  assert spec.tiles("etc_tiles") == etc_pallas.Tiles(16, 16, 4, 16, 16, 4)
  assert spec.tiles("gcn_tiles") == gcn_pallas.Tiles(8, 16, 16, 4)
  # the fused forms' two fields after the four
  fused = EncoderSpec.from_config(dict(FUSED, gcn_kernel="pallas_fused",
                                       gcn_tiles=[16, 64, 64, 4, 4, 8])).validate()
  assert fused.tiles("gcn_tiles") == gcn_pallas.Tiles(16, 64, 64, 4, fused_nodes=4,
                                                      fused_warps=8)
  default = EncoderSpec(**FUSED).validate()
  assert default.tiles("etc_tiles") is None and default.tiles("gcn_tiles") is None


def _recording(monkeypatch, module, name, seen):
  original = getattr(module, name)

  @functools.wraps(original)
  def wrapper(*args, **kwargs):
    seen.append(kwargs.get("tiles"))
    return original(*args, **kwargs)

  monkeypatch.setattr(module, name, wrapper)


@pytest.mark.filterwarnings("ignore:.*interpreter")
def test_configured_tiles_reach_the_kernels_and_change_no_value(monkeypatch):
  # FormNet, tiny, both fused kernels (Pallas' interpreter on this CPU): tiles from the
  # config arrive at both kernels, and the outputs equal those of the default tiles.
  seen = {"etc": [], "gcn": []}
  _recording(monkeypatch, etc_pallas, "long_query_attention", seen["etc"])
  _recording(monkeypatch, gcn_pallas, "message_attention", seen["gcn"])
  config = models.get_model_config("formnet", "A2", local=True)
  config.update(dict(width=32, num_heads=2, mlp_dim=64, depth=1, dropout_rate=0.0,
                     attention_dropout_rate=0.0, local_radius=4, gcn_layers=1, gcn_depth=1,
                     etc_kernel="pallas", gcn_kernel="pallas"))
  batch = models.example_batch(2, LENGTH, vocab_size=VOCAB, num_tags=TAGS, graph=True)
  outputs = {}
  for tiles in ("default", "chosen"):
    if tiles == "chosen":
      config.etc_tiles, config.gcn_tiles = (16, 16, 2, 16, 16, 2), (4, 16, 8, 2)
    model = models.build_model(config, vocab_size=VOCAB, num_tags=TAGS, max_len=LENGTH,
                               pretraining=False, dtype="float32")
    params = models.random_parameters(model, batch)
    # Compiled whole (op by op, every small op and each kernel would compile on its own).
    apply = jax.jit(lambda p, b, model=model: model.apply({"params": p}, b)["tag_logits"])
    outputs[tiles] = np.asarray(apply(params, batch))
  assert seen["etc"][-1] == etc_pallas.Tiles(16, 16, 2, 16, 16, 2)
  assert seen["gcn"][-1] == gcn_pallas.Tiles(4, 16, 8, 2)
  assert seen["etc"][0] is None and seen["gcn"][0] is None  # the defaults' run
  np.testing.assert_allclose(outputs["chosen"], outputs["default"], rtol=1e-5, atol=1e-5)
