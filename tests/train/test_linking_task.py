"""The linking task: one train step per task, the eval / predict plumbing, clear errors."""

import json
import os
import sys

import jax
import numpy as np
import pytest

from flaxdoc import decode
from flaxdoc.data.synthetic import SyntheticConfig, make_document
from flaxdoc import models as models_lib
from flaxdoc.train import linking, optimizer, setup, sharding as sharding_lib, state as state_lib
from flaxdoc.train.input_pipeline import eval_batches

sys.path.insert(0, os.path.dirname(__file__))
from tiny import load_config, tiny_config  # pylint: disable=import-error,wrong-import-position


def _config(task, link_keys=True, **overrides):
  config = tiny_config(arg=f"local,task={task}", **overrides)
  config.data.dataset_options = {"num_train": 6, "num_dev": 3, "link_keys": link_keys}
  return config


def test_config_task_and_linking_defaults():
  config = load_config(arg="local,task=tagging+linking")
  assert config.task == "tagging+linking" and config.data.dataset_options.link_keys
  assert config.linking.pooling == "first" and config.linking.weight == 1.0
  assert config.linking.geometry  # the pair-geometry score is on by default (README)
  assert config.linking.text and config.linking.text_dropout == 0.0
  assert config.linking.scope == "document"  # inference links across windows (README)
  config.linking.scope = "page"
  with pytest.raises(setup.ConfigError, match=r"config.linking.scope='page': must be one of"):
    linking.LinkingTask.from_config(config, ("key", "value"))
  # FUNSD's 129 training forms: half the values train without the text score (README).
  funsd = load_config(arg="local,task=tagging+linking,dataset=funsd")
  spec = linking.LinkingTask.from_config(funsd, ("question", "answer", "header", "other")).spec
  assert (spec.text, spec.text_dropout) == (True, 0.5)
  funsd.linking.text, funsd.linking.geometry = False, False
  with pytest.raises(setup.ConfigError, match=r"text=False needs geometry=True"):
    linking.LinkingTask.from_config(funsd, ("question", "answer"))
  assert tiny_config().task == "tagging"
  with pytest.raises(setup.ConfigError, match=r"config.task='kv': must be one of"):
    linking.task_of(tiny_config(arg="local,task=kv"))


# The default run keeps the combined task; the single tasks are the slow set's (each
# step compiles a whole model; tagging's step is also test_train_step's).
@pytest.mark.parametrize("task", [pytest.param("tagging", marks=pytest.mark.slow),
                                  pytest.param("linking", marks=pytest.mark.slow),
                                  "tagging+linking"])
def test_one_train_step(task):
  # No warm-up: the first step must move the parameters.
  config = _config(task, link_keys=task != "tagging",
                   **{"data.max_len": 128, "optim.warmup_steps": 0})
  env = setup.Experiment.create(config)
  assert (env.linking is None) == (task == "tagging")
  split = env.featurized("train")
  batch, _ = next(eval_batches(split, 4))
  oc = config.optim.to_dict()
  oc["total_steps"] = 10
  import ml_collections  # pylint: disable=import-outside-toplevel
  tx, _ = optimizer.make_optimizer(ml_collections.ConfigDict(oc))
  init = state_lib.make_init_fn(env.model, tx, env.example_batch(1))
  state = jax.jit(lambda r: jax.tree.map(lambda x: getattr(x, "value", x), init(r),
                                         is_leaf=lambda x: hasattr(x, "value")))(
                                             jax.random.PRNGKey(0))
  assert ("linking_head" in state.params) == (task != "tagging")
  step = jax.jit(state_lib.make_train_step(
      env.model, tx, mode="train", task_loss=env.linking.loss if env.linking else None))
  new, metrics = step(state, batch)
  assert np.isfinite(float(metrics["train/loss"]))
  if task != "tagging":
    assert float(metrics["train/link_values"]) > 0
    assert float(metrics["train/link_loss"]) > 0
    moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()),
                         state.params["linking_head"], new.params["linking_head"])
    assert max(jax.tree.leaves(moved)) > 0
  assert ("train/tag_loss" in metrics) == (task != "linking")


def test_linking_without_relations_names_dataset_and_split():
  with pytest.raises(ValueError, match=r"dataset 'synthetic'.*link_keys=True"):
    setup.Experiment.create(_config("tagging+linking", link_keys=False))
  # Labels that exist but were never linked: the split has no relations.
  config = _config("tagging+linking", link_keys=False)
  config.linking.pairs = "seller:buyer"
  env = setup.Experiment.create(config)
  with pytest.raises(ValueError, match=r"dataset 'synthetic' split 'train' has none.*link_keys"):
    env.featurized("train")


def _oracle_window_linker():
  """Window logits that put each value on its gold target (untrained slots on "no key")."""
  def run(batch):
    target = batch["link_target"]  # [B, V]
    B, V, C = batch["link_candidates"].shape
    logits = np.zeros((B, V, C + 1))
    tgt = np.where(target >= 0, target, C)
    np.put_along_axis(logits, tgt[..., None], 5.0, axis=-1)
    return {"link_logits": logits}
  return linking.Linker(run, score=None)


def _oracle_document_linker(gold: set[tuple[int, int]]):
  """One document's oracle across windows: each entity's encodings carry its document
  index, and `score` puts each value on its gold key (or on "no key")."""
  def run(batch):
    ids = batch["link_entity_id"].astype(np.float32)[..., None]  # [B, E, 1]
    return {"link_logits": None, "link_value_vectors": ids, "link_key_vectors": ids,
            "link_none": np.zeros(ids.shape[:2], np.float32)}

  def score(a):
    (v, c), valued = a["mask"].shape, {v for _, v in gold}
    assert a["key"].shape == (v, c, 1) and a["key_box"].shape == (v, c, 4)
    logits = np.full((v, c + 1), -1e9)  # masked candidates, as the head scores them
    for s in range(v):
      value = int(a["value"][s, 0])
      for j in np.flatnonzero(a["mask"][s]):
        logits[s, j] = 5.0 if (int(a["key"][s, j, 0]), value) in gold else -5.0
      logits[s, c] = 0.0 if value in valued else 5.0
    return logits
  return linking.Linker(run, score)


def test_evaluate_with_oracle_links_scores_one():
  config = _config("tagging+linking", **{"data.max_len": 512})
  env = setup.Experiment.create(config)
  env.linking.scope = "window"
  split = env.featurized("dev")
  gold_preds = [type("P", (), {"entities": [decode._make_entity(d, e.label, e.words, None)
                                            for e in d.entities]})()
                for d in split.documents]
  # Gold entities: links read from the gold targets are exactly the gold relations.
  scores = env.linking.evaluate(split, None, _oracle_window_linker(), 4)
  assert scores["rel_f1_gold"] == 1.0
  assert scores["rel_num_gold_gold"] == sum(len(r) for r in env.linking.gold_relations(
      split.documents))
  # End to end with predicted (= gold) entities there are no targets: all "no key", F1 0.
  scores = env.linking.evaluate(split, gold_preds, _oracle_window_linker(), 4)
  assert scores["rel_num_pred"] == 0 and scores["rel_recall"] == 0.0


def _small_windows():
  """A synthetic document in 64-token windows, with links between entities of different
  windows."""
  doc = make_document(0, 2, SyntheticConfig(link_keys=True))
  config = _config("tagging+linking", **{"data.max_len": 64})
  env = setup.Experiment.create(config)
  from flaxdoc.train.input_pipeline import featurize_split  # pylint: disable=import-outside-toplevel
  split = featurize_split([doc], env.tokenizer, env.feature_config)
  env.linking.add_gold(split, "test")
  assert len(split.windows) > 1
  return doc, env, split


def test_link_pairs_keeps_the_most_confident_window():
  doc, env, split = _small_windows()
  env.linking.scope = "window"
  pairs = env.linking.link_pairs([doc], split.windows, split.window_doc,
                                 _oracle_window_linker(), 8, [doc.entities])[0]
  gold = set(env.linking.gold_relations([doc])[0])
  assert pairs and {(k, v) for k, v, _ in pairs} <= gold
  assert all(0.5 < p <= 1.0 for _, _, p in pairs)


def test_document_scope_links_keys_and_values_of_different_windows():
  doc, env, split = _small_windows()
  gold = set(env.linking.gold_relations([doc])[0])
  together = {(k, v) for k, v in gold if any(
      {k, v} <= set(np.asarray(w["link_entity_id"]).tolist()) for w in split.windows)}
  assert together < gold  # some pairs never share a window
  assert env.linking.scope == "document"  # the default
  pairs = env.linking.link_pairs([doc], split.windows, split.window_doc,
                                 _oracle_document_linker(gold), 8, [doc.entities])[0]
  assert {(k, v) for k, v, _ in pairs} == gold
  assert all(0.99 < p <= 1.0 for _, _, p in pairs)


def test_document_scope_equals_window_scope_when_one_window_holds_the_document():
  """A random model: the head's halves over document candidates give the window's links."""
  config = _config("tagging+linking", **{"data.max_len": 512})
  env = setup.Experiment.create(config)
  split = env.featurized("dev")
  assert len(split.windows) == len(split.documents)  # one window each
  params = models_lib.random_parameters(env.model, env.example_batch(2), seed=1, stddev=0.2)
  linker = linking.make_linker(env.model, lambda: params,
                               sharding_lib.make_mesh(dict(config.mesh.shape)))
  ents = [d.entities for d in split.documents]
  got = {}
  for scope in ("window", "document"):
    env.linking.scope = scope
    got[scope] = env.linking.link_pairs(split.documents, split.windows, split.window_doc,
                                        linker, 2, ents)
  assert sum(map(len, got["window"])) > 0
  for w, d in zip(got["window"], got["document"]):
    assert [(k, v) for k, v, _ in w] == [(k, v) for k, v, _ in d]
    np.testing.assert_allclose([p for *_, p in w], [p for *_, p in d], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_train_then_predict_pdfs_writes_pairs(tmp_path):
  """tagging+linking trained for a few steps; predict on synthetic PDFs writes `pairs`."""
  pytest.importorskip("pypdfium2")
  from flaxdoc.data.synthetic.render_pdf import write_pdf  # pylint: disable=import-outside-toplevel
  from flaxdoc.train import inference, trainer  # pylint: disable=import-outside-toplevel
  config = _config("tagging+linking", **{"data.max_len": 128, "total_steps": 2,
                                         "eval_every": 2, "checkpoint_every": 2})
  result = trainer.train_and_evaluate(config, str(tmp_path / "run"))
  for key in ("eval/rel_f1_gold", "eval/rel_f1", "eval/rel_precision", "eval/rel_recall"):
    assert 0.0 <= result[key] <= 1.0
  docs = [make_document(7, i, SyntheticConfig(link_keys=True)) for i in range(2)]
  for doc in docs:
    write_pdf(doc, tmp_path / f"{doc.id}.pdf")
  config.mode = "predict"
  config.predict.input = str(tmp_path / "*.pdf")
  config.predict.draw = True
  config.predict.draw_dir = str(tmp_path / "png")
  out = inference.run_predict(config, str(tmp_path / "run"))
  rows = [json.loads(line) for line in open(out, encoding="utf-8")]
  assert len(rows) == 2 and all(isinstance(r["pairs"], list) for r in rows)
  for r in rows:
    for p in r["pairs"]:
      assert set(p) == {"key", "value", "score"} and 0.0 <= p["score"] <= 1.0
      assert p["key"]["words"] != p["value"]["words"]
  assert len(list((tmp_path / "png").glob("*.png"))) == 2
  # eval mode reports the relation scores next to the tagging ones.
  config.mode = "eval"
  scores = inference.run_eval(config, str(tmp_path / "run"))
  assert "rel_f1_gold" in scores["relations"]
