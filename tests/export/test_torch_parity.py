"""Every non-FormNet family exported to PyTorch: tag logits match Flax to 1e-4 (float32).

Local configs, random parameters (non-zero biases and learned scalars), synthetic
documents through the featuriser, one padded row. Also: the export directory round
trip (`write_export` -> `load_exported`) and a torch import with JAX blocked.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import export_helpers as H  # noqa: E402

from flaxdoc.export import exporter  # noqa: E402
from flaxdoc.export import weights as weights_lib  # noqa: E402
from flaxdoc.export.torch import build_torch_model, load_exported  # noqa: E402

MAX_LEN = 48
TOL = 1e-4
REPO = Path(__file__).resolve().parents[2]

FAMILIES = [
    ("docpolarbert", "base"),
    ("lagabi", "roberta_base"),
    ("lagabi", "layoutlm_base"),
    ("layoutlm", "base/squircle/lspe"),
    ("layoutlm", "base/cross/lspe_sc"),
    ("layout_linformer", "base"),
    ("layout_cosformer", "base"),
    ("layout_cosformer", "base/squircle"),
    ("layout_cosformer", "base/cross"),
]


@pytest.fixture(scope="module")
def batch():
  return H.synthetic_batch(MAX_LEN, graph=False)


@pytest.mark.parametrize("name,variant", FAMILIES)
def test_logits_match_flax(batch, name, variant):
  # Linformer's projections are sized for max_len (k = 64 locally): build it for 96
  # tokens so the 48-token batch is also padded up to the projection length.
  max_len = 96 if name == "layout_linformer" else MAX_LEN
  model, params, config = H.flax_model(name, variant, batch, max_len=max_len, seed=5)
  expected = np.asarray(jax.jit(model.apply)({"params": params}, batch)["tag_logits"])
  tmodel = build_torch_model(config, weights_lib.export_tensors(params))
  with torch.no_grad():
    got = tmodel(H.torch_batch(batch)).numpy()
  assert np.all(np.isfinite(got))
  np.testing.assert_allclose(got, expected, atol=TOL, rtol=0)


def test_export_directory_round_trip_and_scanned_params(batch, tmp_path):
  model, params, _ = H.flax_model("lagabi", "roberta_base", batch, max_len=MAX_LEN, seed=6)
  # Padded encoder rows (48 -> 50) change no output: the file records the field, and the
  # PyTorch side, which does not pad, loads it and agrees.
  model = model.clone(spec=dataclasses.replace(model.spec, pad_to_multiple_of=5))
  expected = np.asarray(jax.jit(model.apply)({"params": params}, batch)["tag_logits"])
  # A scanned checkpoint (stacked `encoder.layers`) exports to the same file layout.
  flat = weights_lib.flatten_params(params)
  scanned = weights_lib.unflatten_params(weights_lib.stack_layers(flat))
  assert "layers" in scanned["encoder"]
  cfg = exporter.export_config(model, tag_names=["O", "B-x"], tokenizer="default")
  summary = exporter.write_export(tmp_path, scanned, cfg)
  assert summary["tensors"] == len(flat)
  config = json.loads((tmp_path / "config.json").read_text())
  assert config["tag_names"] == ["O", "B-x"] and config["model"]["gaussian"]
  assert config["model"]["pad_to_multiple_of"] == 5
  tmodel = load_exported(tmp_path)
  with torch.no_grad():
    got = tmodel(H.torch_batch(batch)).numpy()
  np.testing.assert_allclose(got, expected, atol=TOL, rtol=0)
  # And back: the file restacks into the Flax tree.
  back = weights_lib.load_params(tmp_path / "model.safetensors")
  for k, v in weights_lib.flatten_params(back).items():
    np.testing.assert_array_equal(v, flat[k])


def test_torch_side_runs_with_jax_blocked(batch, tmp_path):
  model, params, _ = H.flax_model("docpolarbert", "base", batch, max_len=MAX_LEN, seed=7)
  expected = np.asarray(jax.jit(model.apply)({"params": params}, batch)["tag_logits"])
  exporter.write_export(tmp_path, params, exporter.export_config(model))
  np.savez(tmp_path / "batch.npz", **batch)
  np.save(tmp_path / "expected.npy", expected)
  script = f"""
import sys
sys.modules['jax'] = None
sys.modules['flax'] = None
import numpy as np, torch
from flaxdoc.export.torch import load_exported
m = load_exported({str(tmp_path)!r})
b = dict(np.load({str(tmp_path / 'batch.npz')!r}))
with torch.no_grad():
  out = m({{k: torch.as_tensor(v) for k, v in b.items()}}).numpy()
err = float(np.abs(out - np.load({str(tmp_path / 'expected.npy')!r})).max())
assert 'jax' not in sys.modules or sys.modules['jax'] is None
print('MAXERR', err)
"""
  env = dict(os.environ, PYTHONPATH=str(REPO))
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                        cwd=str(tmp_path), timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  err = float(proc.stdout.split("MAXERR")[-1])
  assert err <= TOL
