"""Exported models with a linking head: torch link logits equal Flax's (float32, 1e-4)."""

import sys
from pathlib import Path

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import export_helpers as H  # noqa: E402

from flaxdoc import models  # noqa: E402
from flaxdoc.data.features import FeatureConfig, batch_features, featurize  # noqa: E402
from flaxdoc.data.linking import LinkShapes, add_link_arrays, oriented_relations, parse_pairs  # noqa: E402
from flaxdoc.data.synthetic import LABELS_WITH_KEYS, SyntheticConfig, make_document  # noqa: E402
from flaxdoc.export import exporter  # noqa: E402
from flaxdoc.export import weights as weights_lib  # noqa: E402
from flaxdoc.export.torch import build_torch_model  # noqa: E402
from flaxdoc.export.torch import linking as torch_linking  # noqa: E402
from flaxdoc.models.document_encoder import linking_head  # noqa: E402
from flaxdoc.nn import linking as flax_linking  # noqa: E402
from flaxdoc.nn.linking import LinkingSpec  # noqa: E402

MAX_LEN = 64


def _batch(graph: bool) -> dict:
  fc = FeatureConfig(max_len=MAX_LEN, scheme="BIOES", labels=LABELS_WITH_KEYS, graph=graph)
  docs = [make_document(0, i, SyntheticConfig(link_keys=True)) for i in range(2)]
  windows = [featurize(d, H.ChunkTokenizer(), fc)[0] for d in docs]
  allowed = parse_pairs("key:*", LABELS_WITH_KEYS)
  index = {l: i for i, l in enumerate(LABELS_WITH_KEYS)}
  add_link_arrays(docs, windows, np.arange(2), [d.entities for d in docs],
                  [oriented_relations(d, allowed, index) for d in docs], allowed,
                  LABELS_WITH_KEYS, LinkShapes(24, 12, 6))
  batch = batch_features([{k: v for k, v in w.items() if k not in H.KEEP} for w in windows])
  assert batch["link_candidate_mask"].any(axis=-1).sum() >= 4
  return batch


@pytest.mark.parametrize("name,variant,pooling,geometry,text", [
    ("layoutlm", "base", "mean", True, True),
    ("formnet", "A2", "first", False, True),
    ("layoutlm", "base", "first", True, False),
])
def test_link_logits_match_flax(name, variant, pooling, geometry, text):
  batch = _batch(graph=name == "formnet")
  config = models.get_model_config(name, variant, local=True)
  model = models.build_model(config, vocab_size=H.VOCAB, num_tags=4 * len(LABELS_WITH_KEYS) + 1,
                             max_len=MAX_LEN, pretraining=False)
  model = model.clone(linking=LinkingSpec(num_labels=len(LABELS_WITH_KEYS), dim=16,
                                          pooling=pooling, geometry=geometry, text=text,
                                          text_dropout=0.3 if text else 0.0))
  params = models.random_parameters(model, batch, seed=3)
  assert "linking_head" in params
  out = jax.jit(model.apply)({"params": params}, batch)
  cfg = exporter.export_config(model)
  assert (cfg["linking"]["pooling"], cfg["linking"]["text"]) == (pooling, text)
  tmodel = build_torch_model(cfg, weights_lib.export_tensors(params))
  with torch.no_grad():
    tags, links = tmodel(H.torch_batch(batch))
    tags_only = tmodel(H.torch_batch({k: v for k, v in batch.items()
                                      if not k.startswith("link_")}))
  np.testing.assert_allclose(tags.numpy(), np.asarray(out["tag_logits"]), atol=1e-4, rtol=0)
  np.testing.assert_allclose(tags_only.numpy(), tags.numpy(), atol=0, rtol=0)
  want = np.asarray(out["link_logits"])
  real = batch["link_candidate_mask"]
  np.testing.assert_allclose(links.numpy()[..., :-1][real], want[..., :-1][real], atol=1e-4,
                             rtol=0)
  np.testing.assert_allclose(links.numpy()[..., -1], want[..., -1], atol=1e-4, rtol=0)
  assert (links.numpy()[..., :-1][~real] == -1e9).all()

  # The halves for linking across windows: the entity encodings, and the head's score alone.
  with torch.no_grad():
    touts = tmodel.link_outputs(H.torch_batch(batch))
  assert ("link_key_vectors" in out) == text and ("link_key_vectors" in touts) == text
  for k in ("link_value_vectors", "link_none") + (("link_key_vectors",) if text else ()):
    np.testing.assert_allclose(touts[k].numpy(), np.asarray(out[k]), atol=1e-4, rtol=0)
  np.testing.assert_array_equal(touts["link_logits"].numpy(), links.numpy())
  rng = np.random.default_rng(7)
  v, c = 5, 7
  lo = rng.uniform(0, 900, size=(1, v, c + 1, 2)).astype(np.float32)
  boxes = np.concatenate([lo, lo + rng.uniform(5, 100, size=lo.shape).astype(np.float32)], -1)
  arrays = {"value": rng.normal(size=(1, v, 16)), "none": rng.normal(size=(1, v)),
            "key": rng.normal(size=(1, v, c, 16)) if text else None,
            "value_box": boxes[:, :, 0], "key_box": boxes[:, :, 1:],
            "mask": rng.uniform(size=(1, v, c)) < 0.7}
  arrays = {k: None if a is None else np.asarray(a, np.float32 if a.dtype != bool else bool)
            for k, a in arrays.items()}
  want = linking_head(model).apply({"params": params["linking_head"]}, *arrays.values(),
                                   method="score")
  with torch.no_grad():
    got = tmodel.linking_head.score(*(None if a is None else torch.from_numpy(a)
                                      for a in arrays.values()))
  np.testing.assert_allclose(got.numpy(), np.asarray(want), atol=1e-4, rtol=0)


def test_geometry_inputs_match_flax():
  rng = np.random.default_rng(0)
  lo = rng.uniform(0, 1900, size=(2, 7, 2))
  boxes = np.concatenate([lo, lo + rng.uniform(0, 80, size=(2, 7, 2))], -1).astype(np.float32)
  boxes[:, -1] = 0.0  # a padding entity
  boxes[:, 1] = boxes[:, 2]  # two entities with one box
  value_idx = rng.integers(0, 7, size=(2, 3)).astype(np.int32)
  cand = rng.integers(0, 7, size=(2, 3, 5)).astype(np.int32)
  want = np.asarray(flax_linking.geometry_inputs(boxes, value_idx, cand))
  got = torch_linking.geometry_inputs(torch.from_numpy(boxes), torch.from_numpy(value_idx),
                                      torch.from_numpy(cand)).numpy()
  assert got.shape == want.shape == (2, 3, 5, flax_linking.NUM_GEOMETRY_INPUTS)
  assert torch_linking.NUM_GEOMETRY_INPUTS == flax_linking.NUM_GEOMETRY_INPUTS
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
