"""Hugging Face RoBERTa / BERT / LayoutLM -> flaxdoc: same hidden states with layout terms off.

Tiny random-init transformers models saved offline with `save_pretrained`; the
flaxdoc encoder (LAGaBi with `gaussian_alpha = 0`, i.e. a zero layout bias, and the
plain LayoutLM variant) is compared on the encoder output, read with
`capture_intermediates` (no model change needed).
"""

import sys
from pathlib import Path

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from flaxdoc import models  # noqa: E402
from flaxdoc.export import hf_import  # noqa: E402

SIZE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            vocab_size=99, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
LENGTH = 24
TOL = 1e-5


def _save(tmp_path, arch, use_safetensors=True):
  torch.manual_seed(0)
  if arch == "roberta":
    hf = transformers.RobertaModel(transformers.RobertaConfig(max_position_embeddings=40, **SIZE))
  elif arch == "bert":
    hf = transformers.BertModel(transformers.BertConfig(max_position_embeddings=32, **SIZE))
  else:
    hf = transformers.LayoutLMModel(transformers.LayoutLMConfig(max_position_embeddings=32,
                                                                **SIZE))
  hf.eval()
  hf.save_pretrained(tmp_path, safe_serialization=use_safetensors)
  return hf


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, SIZE["vocab_size"], (2, LENGTH)).astype(np.int32)
  x0 = rng.integers(0, 900, (2, LENGTH))
  y0 = rng.integers(0, 950, (2, LENGTH))
  boxes = np.stack([x0, y0, x0 + rng.integers(1, 90, (2, LENGTH)),
                    y0 + rng.integers(1, 40, (2, LENGTH))], -1).astype(np.int32)
  return ids, boxes


def _flaxdoc(name, variant, hf_config, ids, boxes):
  config = models.get_model_config(name, variant, local=True)
  for k, v in hf_import.model_config_overrides(hf_config).items():
    config[k] = v
  if config.get("gaussian"):
    config.gaussian_alpha = 0.0  # zero layout term: a plain text encoder
  model = models.build_model(config, vocab_size=SIZE["vocab_size"], num_tags=3, max_len=LENGTH,
                             pretraining=False)
  batch = {"input_ids": ids, "attention_mask": np.ones_like(ids), "boxes": boxes,
           "positions": np.broadcast_to(np.arange(LENGTH), ids.shape).astype(np.int32),
           "page_ids": np.zeros_like(ids)}
  params = models.random_parameters(model, batch, seed=1)
  return model, batch, params


def _hidden(model, params, batch):
  _, state = model.apply({"params": params}, batch,
                         capture_intermediates=lambda mdl, method: mdl.name == "encoder")
  return np.asarray(state["intermediates"]["encoder"]["__call__"][0])


@pytest.mark.parametrize("arch,name,variant,safetensors", [
    ("roberta", "lagabi", "roberta_base", True),
    ("bert", "lagabi", "bert_base", False),
    ("layoutlm", "lagabi", "layoutlm_base", True),
    ("layoutlm", "layoutlm", "base", True),
])
def test_hidden_states_match_transformers(tmp_path, arch, name, variant, safetensors):
  hf = _save(tmp_path, arch, safetensors)
  hf_config, _ = hf_import.read_checkpoint(tmp_path)
  ids, boxes = _inputs()
  model, batch, params = _flaxdoc(name, variant, hf_config, ids, boxes)
  params, report = hf_import.import_checkpoint(tmp_path, params)
  assert report.architecture == arch
  assert not any(n.startswith("encoder.layer_") and ".shared_term" not in n for n in report.new)
  assert all(n.startswith(("tagging_head", "encoder.shared_term")) for n in report.new), report.new
  assert all("pooler" in n for n in report.unused), report.unused
  kwargs = {"bbox": torch.as_tensor(boxes, dtype=torch.long)} if arch == "layoutlm" else {}
  with torch.no_grad():
    expected = hf(input_ids=torch.as_tensor(ids, dtype=torch.long), **kwargs).last_hidden_state
  got = _hidden(model, params, batch)
  np.testing.assert_allclose(got, expected.numpy(), atol=TOL, rtol=0)


def test_state_dict_source_and_shape_mismatch(tmp_path):
  hf = _save(tmp_path, "bert")
  ids, boxes = _inputs()
  hf_config, _ = hf_import.read_checkpoint(tmp_path)
  model, batch, params = _flaxdoc("lagabi", "bert_base", hf_config, ids, boxes)
  state = {k: v.numpy() for k, v in hf.state_dict().items()}
  merged, report = hf_import.import_checkpoint(state, params, num_heads=4)
  assert len(report.mapped) > 0
  state["embeddings.word_embeddings.weight"] = np.zeros((7, 64), np.float32)
  with pytest.raises(hf_import.HFImportError, match="word_embeddings"):
    hf_import.import_checkpoint(state, params, num_heads=4)


def test_missing_checkpoint_is_a_clear_error(tmp_path):
  with pytest.raises(hf_import.HFImportError, match="config.json"):
    hf_import.read_checkpoint(tmp_path)
