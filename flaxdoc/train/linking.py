"""The entity-linking task in train, eval and predict (`config.task`, `config.linking.*`).

    python -m flaxdoc.main --config=configs/formnet_a2.py:local,task=tagging+linking \
        --workdir=/tmp/kv

`config.task` is "tagging" (the default), "linking" or "tagging+linking". With
linking, the model gets a `LinkingHead` (`flaxdoc.nn.linking`) and every window the
`link_*` arrays (`flaxdoc.data.linking`):

* train: loss = tagging loss (when tagging) + `config.linking.weight` x the link
  cross-entropy (each value entity over its candidate keys and "no key");
* eval: relation precision / recall / F1 (`metrics.RelationMetrics`, LayoutXLM's RE
  definition) twice: with the gold entities (`rel_*_gold`: linking errors only) and
  end to end from the Viterbi-decoded entities (`rel_*`: a pair counts only when
  both spans and the link are right);
* predict: `"pairs": [{"key": {...}, "value": {...}, "score": p}]` per document.

A value is linked to the argmax of its softmax over candidates and "no key"; when
windows overlap, the window whose decision is the most confident wins. A key and a
value that never share a window cannot be linked (FUNSD windows of 512 tokens hold
most forms whole).

The trainer, `inference` and `setup` call this module through a few small hooks.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from flaxdoc import metrics as metrics_lib
from flaxdoc.data import linking as data_linking
from flaxdoc.nn.linking import LinkingSpec
from flaxdoc.train import objectives
from flaxdoc.train import sharding as sharding_lib
from flaxdoc.train.config_error import ConfigError
from flaxdoc.train.input_pipeline import FeaturizedSplit, eval_batches

TASKS = ("tagging", "linking", "tagging+linking")

# link_fn(batch) -> numpy link logits [B, V, C + 1].
LinkFn = Callable[[dict], np.ndarray]


def task_of(config: ml_collections.ConfigDict) -> str:
  task = config.get("task", "tagging") or "tagging"
  if task not in TASKS:
    raise ConfigError(f"config.task={task!r}: must be one of {TASKS}")
  return task


@dataclasses.dataclass
class LinkingTask:
  """What linking needs from the config: labels, candidate table, sizes, loss weight."""
  task: str
  dataset: str
  labels: tuple[str, ...]
  allowed: np.ndarray  # bool [num_labels, num_labels], [key, value]
  shapes: data_linking.LinkShapes
  weight: float
  spec: LinkingSpec

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, labels: Sequence[str]
                  ) -> "LinkingTask | None":
    """None for `task="tagging"` (and for pre-training)."""
    task = task_of(config)
    if task == "tagging" or config.get("mode") == "pretrain":
      return None
    lc = config.get("linking") or ml_collections.ConfigDict()
    dataset = config.data.dataset
    if config.data.get("block_shuffle") or config.data.get("neighbour_swap"):
      raise ConfigError(f"config.task={task!r}: block shuffling / neighbour swapping "
                        "(config.data.block_shuffle, neighbour_swap) re-featurise windows "
                        "without link arrays; set them to 0 for linking")
    pairs = lc.get("pairs") or data_linking.DEFAULT_PAIRS.get(dataset)
    if not pairs:
      raise ConfigError(f"config.task={task!r} on dataset {dataset!r}: set config.linking.pairs "
                        f"('key_label:value_label,...'; defaults exist for "
                        f"{sorted(data_linking.DEFAULT_PAIRS)})")
    labels = tuple(labels)
    shapes = data_linking.LinkShapes(int(lc.get("max_entities", 96)),
                                     int(lc.get("max_values", 64)),
                                     int(lc.get("max_candidates", 32)))
    try:
      spec = LinkingSpec(num_labels=len(labels), dim=int(lc.get("dim", 128)),
                         pooling=lc.get("pooling", "first"),
                         geometry=bool(lc.get("geometry", True)), text=bool(lc.get("text", True)),
                         text_dropout=float(lc.get("text_dropout", 0.0)))
    except ValueError as e:
      raise ConfigError(str(e)) from e
    try:
      allowed = data_linking.parse_pairs(pairs, labels)
    except ValueError as e:
      if dataset == "synthetic" and not (config.data.get("dataset_options") or {}).get("link_keys"):
        raise ConfigError(f"config.task={task!r} on dataset 'synthetic': its documents carry "
                          "key -> value relations (and 'key' entities) only with "
                          "--config.data.dataset_options.link_keys=True (the config argument "
                          f"task={task} sets it)") from e
      # parse_pairs' errors (data layer) name config.linking.pairs: one line in flaxdoc.main.
      raise ConfigError(str(e)) from e
    return cls(task, dataset, labels, allowed, shapes, float(lc.get("weight", 1.0)), spec)

  @property
  def tagging(self) -> bool:
    return self.task != "linking"

  def _label_index(self) -> dict[str, int]:
    return {l: i for i, l in enumerate(self.labels)}

  # ------------------------------------------------------------------ data
  def gold_relations(self, documents) -> list[list[tuple[int, int]]]:
    index = self._label_index()
    return [data_linking.oriented_relations(d, self.allowed, index) for d in documents]

  def add_gold(self, split: FeaturizedSplit, split_name: str) -> dict:
    """Adds gold `link_*` arrays to the split's windows; errors if it has no relations."""
    rels = self.gold_relations(split.documents)
    if not any(rels):
      hint = (" (the synthetic generator writes them with "
              "--config.data.dataset_options.link_keys=True)" if self.dataset == "synthetic"
              else "")
      raise ConfigError(f"config.task={self.task!r} needs key -> value relations, but dataset "
                        f"{self.dataset!r} split {split_name!r} has none that "
                        f"config.linking.pairs allows{hint}")
    return data_linking.add_link_arrays(
        split.documents, split.windows, split.window_doc,
        [d.entities or () for d in split.documents], rels, self.allowed, self.labels, self.shapes)

  def example_arrays(self, length: int) -> dict[str, np.ndarray]:
    return data_linking.empty_link_arrays(length, self.shapes)

  # ------------------------------------------------------------------ train
  def loss(self, outputs: dict, batch: dict) -> tuple[jax.Array, dict]:
    """Tagging loss (unless task="linking") + weight x link cross-entropy."""
    link, count = objectives.weighted_cross_entropy(outputs["link_logits"], batch["link_target"])
    aux = {"train/link_loss": link, "train/link_values": count,
           "train/link_accuracy": objectives.accuracy(outputs["link_logits"],
                                                      batch["link_target"])}
    if not self.tagging:
      return self.weight * link, aux
    tag, tag_aux = objectives.tagging_loss(outputs, batch)
    return tag + self.weight * link, {**tag_aux, **aux}

  # ------------------------------------------------------------- inference
  def link_pairs(self, documents, windows: list[dict], window_doc: np.ndarray, link_fn: LinkFn,
                 batch_size: int) -> list[list[tuple[int, int, float]]]:
    """Per document, `(key entity, value entity, probability)` of the predicted links.

    The windows must carry `link_*` arrays built from the entities the indices refer to.
    """
    split = FeaturizedSplit(list(documents), windows, np.asarray(window_doc))
    best: list[dict[int, tuple[float, int | None]]] = [{} for _ in documents]
    row = 0
    for batch, valid in eval_batches(split, batch_size):
      logits = np.asarray(link_fn(batch), np.float64)  # [B, V, C + 1]
      for b in np.flatnonzero(valid):
        w = windows[row]
        row += 1
        _window_decisions(w, logits[b], best[int(window_doc[row - 1])])
    return [[(k, v, p) for v, (p, k) in sorted(dec.items()) if k is not None] for dec in best]

  def evaluate(self, split: FeaturizedSplit, tag_predictions, link_fn: LinkFn,
               batch_size: int) -> dict:
    """Relation scores with gold entities and (when tagging) end to end."""
    docs = split.documents
    gold = self.gold_relations(docs)
    out = {}
    pred = self.link_pairs(docs, split.windows, split.window_doc, link_fn, batch_size)
    m = metrics_lib.RelationMetrics()
    for d, g, p in zip(docs, gold, pred):
      ents = d.entities or ()
      m.add([(ents[k].words, ents[v].words) for k, v in g],
            [(ents[k].words, ents[v].words) for k, v, _ in p])
    out.update({f"rel_{k}_gold": v for k, v in m.compute().items()})
    if self.tagging and tag_predictions is not None:
      entities = [p.entities for p in tag_predictions]
      pred = self.predicted_pairs(docs, split, entities, link_fn, batch_size)
      m = metrics_lib.RelationMetrics()
      for d, g, p, pe in zip(docs, gold, pred, entities):
        ents = d.entities or ()
        m.add([(ents[k].words, ents[v].words) for k, v in g],
              [(pe[k].words, pe[v].words) for k, v, _ in p])
      out.update({f"rel_{k}": v for k, v in m.compute().items()})
    return out

  def predicted_pairs(self, documents, split: FeaturizedSplit, entities_of, link_fn: LinkFn,
                      batch_size: int) -> list[list[tuple[int, int, float]]]:
    """Links between the given (e.g. Viterbi-decoded) entities, on copies of the windows."""
    windows = [dict(w) for w in split.windows]
    data_linking.add_link_arrays(documents, windows, split.window_doc, entities_of, None,
                                 self.allowed, self.labels, self.shapes)
    return self.link_pairs(documents, windows, split.window_doc, link_fn, batch_size)


def _window_decisions(window: dict, logits: np.ndarray, best: dict) -> None:
  """Each value slot's decision (key or none, probability); keeps the most confident."""
  mask = np.asarray(window["link_candidate_mask"])  # [V, C]
  ids = np.asarray(window["link_entity_id"])
  values = np.asarray(window["link_value"])
  cands = np.asarray(window["link_candidates"])
  for s in np.flatnonzero(mask.any(axis=1)):
    z = logits[s] - logits[s].max()
    p = np.exp(z) / np.exp(z).sum()
    j = int(np.argmax(p))
    key = None if j == mask.shape[1] else int(ids[cands[s, j]])
    value = int(ids[values[s]])
    if value not in best or p[j] > best[value][0]:
      best[value] = (float(p[j]), key)


def make_link_fn(model, params_fn: Callable[[], object], mesh) -> LinkFn:
  """`link_fn(batch) -> numpy [B, V, C + 1]`, reading the current params from `params_fn`."""
  apply = jax.jit(lambda params, batch: model.apply({"params": params}, batch,
                                                    deterministic=True)["link_logits"])

  def link_fn(batch):
    with jax.set_mesh(mesh):
      out = apply(params_fn(), sharding_lib.replicated_batch_to_global(batch, mesh))
    return np.asarray(multihost_utils.process_allgather(out, tiled=True))
  return link_fn


def eval_metrics(scores: dict) -> dict:
  """The trainer's `eval/...` scalars from `LinkingTask.evaluate`."""
  return {f"eval/{k}": float(v) for k, v in scores.items()
          if k.endswith(("f1", "precision", "recall", "f1_gold", "precision_gold", "recall_gold"))}


def pair_json(doc, entities, key: int, value: int, score: float, entity_json) -> dict:
  return {"key": entity_json(entities[key], doc), "value": entity_json(entities[value], doc),
          "score": float(score)}



def summary(scores: dict) -> str:
  """`gold entities 0.91 (P .., R ..), end to end 0.80 (...)` from `LinkingTask.evaluate`."""
  parts = []
  for suffix, name in (("_gold", "gold entities"), ("", "end to end")):
    if f"rel_f1{suffix}" in scores:
      parts.append(f"{name} {scores[f'rel_f1{suffix}']:.4f} (P {scores[f'rel_precision{suffix}']:.4f}, "
                   f"R {scores[f'rel_recall{suffix}']:.4f})")
  return ", ".join(parts)


def link_fn_for(config: ml_collections.ConfigDict, model, params) -> LinkFn:
  """A `LinkFn` for restored `params` on the config's mesh (eval / predict modes)."""
  mesh = sharding_lib.make_mesh(dict(config.mesh.shape))
  return make_link_fn(model, lambda: params, mesh)


def document_pairs(task: LinkingTask, documents, split: FeaturizedSplit, tag_predictions,
                   link_fn: LinkFn, batch_size: int) -> list[list[tuple[object, object, float]]]:
  """Per document, `(key entity, value entity, probability)` for `predict`.

  Entities are the Viterbi-decoded ones; with `task="linking"` (no tagging head trained)
  they are the documents' own entities, which must then be given.
  """
  from flaxdoc import decode  # pylint: disable=import-outside-toplevel
  if task.tagging:
    entities = [list(p.entities) for p in tag_predictions]
  else:
    entities = []
    for d in documents:
      if d.entities is None:
        raise ConfigError(f"config.task='linking' predicts links between given entities, but "
                          f"document {d.id!r} has none; train with task='tagging+linking' to "
                          "link the entities the model finds")
      entities.append([decode._make_entity(d, e.label, e.words, None)  # pylint: disable=protected-access
                       for e in d.entities])
  pairs = task.predicted_pairs(documents, split, entities, link_fn, batch_size)
  return [[(ents[k], ents[v], p) for k, v, p in doc_pairs]
          for ents, doc_pairs in zip(entities, pairs)]
