"""The paper-vs-released switches, each against a small numpy reference.

* `model.polar_1d` (DocPolarBERT's 1D relative term; the paper has none);
* `model.polar_zero_bucket` (a distance bucket of its own for distance 0);
* `model.gaussian_angle="paper"` (LAGaBi's `arctan(dy / dx)`, plain difference);
* `model.cosformer_length="document"` (cosFormer's 1D `M` = the row's token count).
Defaults are checked to be unchanged.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxdoc import models
from flaxdoc.layout import gaussian as gaussian_lib
from flaxdoc.layout import polar as polar_lib
from flaxdoc.models.document_encoder import EncoderSpec
from flaxdoc.nn.cosformer import CosformerAttention


def test_defaults_are_unchanged():
  s = EncoderSpec()
  assert (s.polar_1d, s.polar_zero_bucket, s.gaussian_angle, s.cosformer_length) == (
      True, False, "released", "max")
  with pytest.raises(ValueError, match="gaussian_angle"):
    EncoderSpec(gaussian_angle="degrees").validate()
  with pytest.raises(ValueError, match="cosformer_length"):
    EncoderSpec(cosformer_length="page").validate()


# ----------------------------------------------------------------------------- DocPolarBERT
def _docpolar(batch, **fields):
  config = models.get_model_config("docpolarbert", "base", local=True)
  for k, v in fields.items():
    config[k] = v
  return models.build_model(config, vocab_size=100, num_tags=3, max_len=batch["input_ids"].shape[1],
                            pretraining=False)


def _find(tree, name):
  """The paths of every leaf called `name` in a nested dict."""
  out = []
  for k, v in tree.items():
    if k == name:
      out.append((k,))
    elif isinstance(v, dict):
      out += [(k,) + p for p in _find(v, name)]
  return out


def test_polar_1d_off_equals_the_full_term_with_a_zero_1d_table():
  batch = models.example_batch(2, 24, vocab_size=100)
  full = _docpolar(batch)
  params = models.random_parameters(full, batch, seed=3)
  (path,) = _find(params, "table_1d")
  no_1d = _docpolar(batch, polar_1d=False)
  params_no_1d = models.random_parameters(no_1d, batch)
  assert not _find(params_no_1d, "table_1d")  # the 1D table is gone, not just unused
  without = jax.tree.map(np.copy, params)
  _get(without, path[:-1]).pop(path[-1])
  zeroed = jax.tree.map(np.copy, params)
  _get(zeroed, path[:-1])[path[-1]] = np.zeros_like(_get(params, path))  # r_1d = 0
  # Compiled whole, not op by op (where every small op compiles on its own).
  logits = [jax.jit(lambda p, b, m=m: m.apply({"params": p}, b)["tag_logits"])
            for m in (no_1d, full)]
  got = logits[0](without, batch)
  want = logits[1](zeroed, batch)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
  # ... and the 1D term does change the output when on.
  big = jax.tree.map(np.copy, params)
  _get(big, path[:-1])[path[-1]] = 100.0 * _get(params, path)
  assert not np.allclose(np.asarray(logits[1](big, batch)), np.asarray(want), atol=1e-3)


def _get(tree, path):
  for k in path:
    tree = tree[k]
  return tree


def test_zero_bucket_matches_a_numpy_loop():
  rng = np.random.default_rng(0)
  centers = rng.integers(0, 50, (10, 2)).astype(np.float32)
  centers[3] = centers[7]  # two tokens of one word: distance 0 off the diagonal
  edges = np.asarray([0.0, 10.0, 20.0, 35.0, 70.0], np.float32)
  got = {z: np.asarray(polar_lib.distance_buckets(centers, centers, edges, zero_bucket=z))
         for z in (False, True)}
  for i in range(10):
    for j in range(10):
      rho = math.dist(centers[i], centers[j])
      quantile = sum(rho >= e for e in edges[1:-1])
      assert got[False][i, j] == quantile
      assert got[True][i, j] == (0 if rho == 0 else quantile + 1)
  assert got[True][3, 7] == 0 and got[True].max() == 4


def test_zero_bucket_adds_one_distance_row():
  batch = models.example_batch(1, 16, vocab_size=100)
  rows = {}
  for z in (False, True):
    params = models.random_parameters(_docpolar(batch, polar_zero_bucket=z), batch)
    (path,) = _find(params, "table_distance")
    rows[z] = np.shape(_get(params, path))[0]
  assert rows[True] == rows[False] + 1


# ----------------------------------------------------------------------------- LAGaBi
def test_gaussian_paper_angle_matches_a_numpy_loop():
  rng = np.random.default_rng(1)
  pts = rng.uniform(0, 1, (7, 2)).astype(np.float32)
  pts[2, 0] = pts[5, 0]  # a vertical pair: dx = 0
  pts[4] = pts[6]  # coinciding points
  heads = 3
  mu_rho, mu_theta = rng.uniform(0, .3, heads), rng.uniform(-1, 1, heads)
  sigma_rho, sigma_theta = rng.uniform(.2, 1, heads), rng.uniform(.2, 1, heads)
  got = np.asarray(gaussian_lib.gaussian_polar_bias(pts, pts, mu_rho, mu_theta, sigma_rho,
                                                    sigma_theta, alpha=4.0, angle="paper"))
  floor2 = gaussian_lib.SIGMA_FLOOR ** 2
  for h in range(heads):
    for i in range(7):
      for j in range(7):
        dx, dy = float(pts[j, 0] - pts[i, 0]), float(pts[j, 1] - pts[i, 1])
        if dx == 0 and dy == 0:
          theta = 0.0
        elif dx == 0:
          theta = math.copysign(math.pi / 2, dy)
        else:
          theta = math.atan(dy / dx)
        assert -math.pi / 2 <= theta <= math.pi / 2
        e = ((math.hypot(dx, dy) - mu_rho[h]) ** 2 / (2 * (sigma_rho[h] ** 2 + floor2))
             + (theta - mu_theta[h]) ** 2 / (2 * (sigma_theta[h] ** 2 + floor2)))
        assert got[h, i, j] == pytest.approx(4.0 * (math.exp(-e) - 1.0), abs=1e-5)
  released = np.asarray(gaussian_lib.gaussian_polar_bias(pts, pts, mu_rho, mu_theta, sigma_rho,
                                                         sigma_theta, alpha=4.0))
  assert not np.allclose(got, released)


def test_gaussian_angle_switch_reaches_the_term():
  from flaxdoc.nn.layout_terms import GaussianTerm  # pylint: disable=import-outside-toplevel
  config = models.get_model_config("lagabi", "roberta_base", local=True)
  config.gaussian_angle = "paper"
  model = models.build_model(config, vocab_size=100, num_tags=3, max_len=16, pretraining=False)
  _, shared = model._terms()  # pylint: disable=protected-access
  assert [t.angle for t in shared] == ["paper"]
  # The term evaluates the paper angle on its corner points.
  boxes = np.asarray([[[0, 0, 10, 10], [0, 500, 10, 510], [300, 200, 320, 210]]], np.int32)
  term = GaussianTerm(num_heads=2, corner="top_left", angle="paper")
  geom = {"boxes": boxes}
  params = term.init(jax.random.key(0), None, None, geom, geom)
  got = np.asarray(term.apply(params, None, None, geom, geom))[0]
  p = {k: np.asarray(v.unbox() if hasattr(v, "unbox") else v)
       for k, v in params["params"].items()}
  pts = boxes[0, :, :2].astype(np.float32) / 1000.0
  want = np.asarray(gaussian_lib.gaussian_polar_bias(pts, pts, p["mu_rho"], p["mu_theta"],
                                                     p["sigma_rho"], p["sigma_theta"],
                                                     angle="paper"))
  np.testing.assert_allclose(got, want, atol=1e-4)


# ----------------------------------------------------------------------------- cosFormer
def _cosformer_reference(params, x, mask, m_of_row):
  """Brute force: `out_i = sum_j s_ij v_j / max(sum_j s_ij, 1e-4)`,

  `s_ij = relu(q_i).relu(k_j) cos(pi/2M (i-j))`.
  """
  p = jax.tree.map(np.asarray, params)
  q = np.einsum("bne,ehd->bnhd", x, p["query"]["kernel"]) + p["query"]["bias"]
  k = np.einsum("bne,ehd->bnhd", x, p["key"]["kernel"]) + p["key"]["bias"]
  v = np.einsum("bne,ehd->bnhd", x, p["value"]["kernel"]) + p["value"]["bias"]
  q, k = np.maximum(q, 0), np.maximum(k, 0)
  b_, n, h, d = q.shape
  ctx = np.zeros_like(v)
  for b in range(b_):
    m = m_of_row[b]
    for i in range(n):
      for hh in range(h):
        num, den = np.zeros(d), 0.0
        for j in range(n):
          if not mask[b, j]:
            continue
          s = float(q[b, i, hh] @ k[b, j, hh]) * math.cos(math.pi / (2 * m) * (i - j))
          num += s * v[b, j, hh]
          den += s
        ctx[b, i, hh] = num / max(den, 1e-4)
  return np.einsum("bnhd,hde->bne", ctx, p["out"]["kernel"]) + p["out"]["bias"]


@pytest.mark.parametrize("length", ["max", "document"])
def test_cosformer_length_matches_a_numpy_loop(length):
  rng = np.random.default_rng(2)
  n, max_len = 10, 16
  x = rng.normal(size=(2, n, 8)).astype(np.float32)
  mask = np.ones((2, n), bool)
  mask[1, 6:] = False
  layer = CosformerAttention(num_heads=2, reweight="1d", max_length=max_len, length=length)
  geom = {"positions": np.broadcast_to(np.arange(n), (2, n)).astype(np.int32)}
  params = layer.init(jax.random.key(0), jnp.asarray(x), jnp.asarray(mask), geom=geom)["params"]
  params = jax.tree.map(lambda a: a + 0.05 * rng.normal(size=a.shape).astype(np.float32),
                        nn_unbox(params))
  got = np.asarray(layer.apply({"params": params}, jnp.asarray(x), jnp.asarray(mask), geom=geom))
  m_of_row = [max_len, max_len] if length == "max" else [int(r.sum()) for r in mask]
  want = _cosformer_reference(params, x, mask, m_of_row)
  np.testing.assert_allclose(got[mask], want[mask], atol=1e-4, rtol=1e-4)


def nn_unbox(tree):
  from flax import linen as nn  # pylint: disable=import-outside-toplevel
  return nn.unbox(tree)


# ----------------------------------------------------------------------------- torch export
@pytest.mark.parametrize("name,variant,fields", [
    ("docpolarbert", "base", {"polar_1d": False, "polar_zero_bucket": True}),
    ("lagabi", "roberta_base", {"gaussian_angle": "paper", "gaussian_corner": "top_left"}),
    ("layout_cosformer", "base", {"cosformer_length": "document"}),
])
def test_torch_export_follows_the_switches(name, variant, fields):
  torch = pytest.importorskip("torch")
  import dataclasses  # pylint: disable=import-outside-toplevel
  from flaxdoc.export import weights as weights_lib  # pylint: disable=import-outside-toplevel
  from flaxdoc.export.torch import build_torch_model  # pylint: disable=import-outside-toplevel
  length = 32
  config = models.get_model_config(name, variant, local=True)
  for k, v in fields.items():
    config[k] = v
  model = models.build_model(config, vocab_size=100, num_tags=3, max_len=length,
                             pretraining=False)
  batch = models.example_batch(2, length, vocab_size=100)
  params = models.random_parameters(model, batch, seed=4, stddev=0.2)
  want = np.asarray(jax.jit(model.apply)({"params": params}, batch)["tag_logits"])
  spec = {"model": dataclasses.asdict(model.spec), "vocab_size": 100, "num_tags": 3,
          "max_len": length}
  spec["model"]["rich_axes"] = list(spec["model"]["rich_axes"])
  tmodel = build_torch_model(spec, weights_lib.export_tensors(params))
  with torch.no_grad():
    got = tmodel({k: torch.as_tensor(np.asarray(v)) for k, v in batch.items()}).numpy()
  mask = batch["attention_mask"] > 0
  np.testing.assert_allclose(got[mask], want[mask], atol=1e-4, rtol=0)
