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

A value is linked to the argmax of its softmax over candidates and "no key".
Training scores the candidates of each window. At inference (`config.linking.scope`):

* "document" (the default): each entity is encoded in the window where it sits most
  centrally, and every value is scored against its nearest allowed keys anywhere in the
  document, so a key and a value in different windows can be linked (the head's `score`
  runs alone on those candidates: `Linker`);
* "window": each window's own candidates, as in training; when windows overlap, the
  window whose decision is the most confident wins; a key and a value that never share a
  window cannot be linked.

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
from flaxdoc.models.document_encoder import linking_head
from flaxdoc.nn.linking import LinkingSpec
from flaxdoc.train import objectives
from flaxdoc.train import sharding as sharding_lib
from flaxdoc.train.config_error import ConfigError
from flaxdoc.train.input_pipeline import FeaturizedSplit, eval_batches

TASKS = ("tagging", "linking", "tagging+linking")
SCOPES = ("document", "window")


@dataclasses.dataclass(frozen=True)
class Linker:
  """The linking head at inference, for any backend (JAX here, PyTorch in the export).

  `run(batch)`: the model on a batch of windows with `link_*` arrays -> numpy
  `{"link_logits": [B, V, C + 1], "link_value_vectors": [B, E, D], "link_key_vectors":
  [B, E, D] (with the text score), "link_none": [B, E]}` (`LinkingHead.encode`).
  `score(arrays)`: `LinkingHead.score` alone on one document's candidates -> numpy
  `[V, C + 1]`, from `{"value": [V, D], "none": [V], "key": [V, C, D] or None,
  "value_box": [V, 4], "key_box": [V, C, 4], "mask": bool [V, C]}`.
  """
  run: Callable[[dict], dict]
  score: Callable[[dict], np.ndarray]


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
  scope: str = "document"

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
    scope = lc.get("scope", "document")
    if scope not in SCOPES:
      raise ConfigError(f"config.linking.scope={scope!r}: must be one of {SCOPES}")
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
    return cls(task, dataset, labels, allowed, shapes, float(lc.get("weight", 1.0)), spec,
               scope)

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
  def link_pairs(self, documents, windows: list[dict], window_doc: np.ndarray, linker: Linker,
                 batch_size: int, entities_of: Sequence[Sequence]
                 ) -> list[list[tuple[int, int, float]]]:
    """Per document, `(key entity, value entity, probability)` of the predicted links.

    The windows must carry `link_*` arrays built from `entities_of` (per document, the
    entities the indices refer to: gold or decoded).
    """
    split = FeaturizedSplit(list(documents), windows, np.asarray(window_doc))
    per_doc: list[dict] = [{} for _ in documents]
    row = 0
    for batch, valid in eval_batches(split, batch_size):
      out = linker.run(batch)
      for b in np.flatnonzero(valid):
        w, d = windows[row], int(window_doc[row])
        row += 1
        if self.scope == "window":
          _window_decisions(w, np.asarray(out["link_logits"][b], np.float64), per_doc[d])
        else:
          _keep_central(w, {k: np.asarray(v[b]) for k, v in out.items()
                            if k != "link_logits"}, per_doc[d])
    if self.scope == "window":
      return [[(k, v, p) for v, (p, k) in sorted(dec.items()) if k is not None]
              for dec in per_doc]
    return [self._document_links(doc, ents, homes, linker)
            for doc, ents, homes in zip(documents, entities_of, per_doc)]

  def _document_links(self, doc, entities: Sequence, homes: dict, linker: Linker
                      ) -> list[tuple[int, int, float]]:
    """One document's links over `document_candidates`, from its entities' encodings."""
    if not homes:
      return []
    index = self._label_index()
    labels = np.asarray([index.get(e.label, -1) for e in entities], np.int64)
    boxes = data_linking.entity_boxes(doc, entities)
    encoded = np.zeros(len(entities), bool)
    encoded[list(homes)] = True
    values, cands, mask = data_linking.document_candidates(
        labels, boxes, self.allowed, self.shapes.max_candidates, encoded)
    if not len(values):
      return []
    n, c = len(values), cands.shape[1]
    rows = -(-n // 64) * 64  # a few shapes for the jitted score, not one per document
    first = next(iter(homes.values()))
    table = {k: np.zeros((len(entities),) + np.shape(v), np.float32)
             for k, v in first.items() if k != "centrality"}
    for e, home in homes.items():
      for k in table:
        table[k][e] = home[k]

    def pad(x, fill=0):
      return np.concatenate([x, np.full((rows - n,) + x.shape[1:], fill, x.dtype)])
    arrays = {"value": pad(table["link_value_vectors"][values]),
              "none": pad(table["link_none"][values]),
              "key": (pad(table["link_key_vectors"][cands]) if "link_key_vectors" in table
                      else None),
              "value_box": pad(boxes[values]), "key_box": pad(boxes[cands]),
              "mask": pad(mask, False)}
    logits = np.asarray(linker.score(arrays), np.float64)[:n]  # [V, C + 1]
    out = []
    for s in np.flatnonzero(mask.any(axis=1)):
      p = _softmax(logits[s])
      j = int(np.argmax(p))
      if j < c:
        out.append((int(cands[s, j]), int(values[s]), float(p[j])))
    return sorted(out, key=lambda x: x[1])

  def evaluate(self, split: FeaturizedSplit, tag_predictions, linker: Linker,
               batch_size: int) -> dict:
    """Relation scores with gold entities and (when tagging) end to end."""
    docs = split.documents
    gold = self.gold_relations(docs)
    out = {}
    gold_entities = [d.entities or () for d in docs]
    pred = self.link_pairs(docs, split.windows, split.window_doc, linker, batch_size,
                           gold_entities)
    m = metrics_lib.RelationMetrics()
    for g, p, ents in zip(gold, pred, gold_entities):
      m.add([(ents[k].words, ents[v].words) for k, v in g],
            [(ents[k].words, ents[v].words) for k, v, _ in p])
    out.update({f"rel_{k}_gold": v for k, v in m.compute().items()})
    if self.tagging and tag_predictions is not None:
      entities = [p.entities for p in tag_predictions]
      pred = self.predicted_pairs(docs, split, entities, linker, batch_size)
      m = metrics_lib.RelationMetrics()
      for g, p, pe, ents in zip(gold, pred, entities, gold_entities):
        m.add([(ents[k].words, ents[v].words) for k, v in g],
              [(pe[k].words, pe[v].words) for k, v, _ in p])
      out.update({f"rel_{k}": v for k, v in m.compute().items()})
    return out

  def predicted_pairs(self, documents, split: FeaturizedSplit, entities_of, linker: Linker,
                      batch_size: int) -> list[list[tuple[int, int, float]]]:
    """Links between the given (e.g. Viterbi-decoded) entities, on copies of the windows."""
    windows = [dict(w) for w in split.windows]
    data_linking.add_link_arrays(documents, windows, split.window_doc, entities_of, None,
                                 self.allowed, self.labels, self.shapes)
    return self.link_pairs(documents, windows, split.window_doc, linker, batch_size,
                           entities_of)


def _softmax(z: np.ndarray) -> np.ndarray:
  z = np.exp(z - z.max())
  return z / z.sum()


def _window_decisions(window: dict, logits: np.ndarray, best: dict) -> None:
  """Each value slot's decision (key or none, probability); keeps the most confident."""
  mask = np.asarray(window["link_candidate_mask"])  # [V, C]
  ids = np.asarray(window["link_entity_id"])
  values = np.asarray(window["link_value"])
  cands = np.asarray(window["link_candidates"])
  for s in np.flatnonzero(mask.any(axis=1)):
    p = _softmax(logits[s])
    j = int(np.argmax(p))
    key = None if j == mask.shape[1] else int(ids[cands[s, j]])
    value = int(ids[values[s]])
    if value not in best or p[j] > best[value][0]:
      best[value] = (float(p[j]), key)


def _keep_central(window: dict, encoded: dict, homes: dict) -> None:
  """Keeps each entity's encodings from the window where its first token sits most
  centrally (the most context on both sides; the earlier window on a tie)."""
  content = np.flatnonzero(np.asarray(window["word_ids"]) >= 0)
  if not len(content):
    return
  lo, hi = int(content[0]), int(content[-1])
  ids = np.asarray(window["link_entity_id"])
  first = np.asarray(window["link_first"])
  for e in np.flatnonzero(ids >= 0):
    centrality = min(int(first[e]) - lo, hi - int(first[e]))
    d = int(ids[e])
    if d not in homes or centrality > homes[d]["centrality"]:
      homes[d] = {"centrality": centrality, **{k: v[e] for k, v in encoded.items()}}


def make_linker(model, params_fn: Callable[[], object], mesh) -> Linker:
  """A `Linker` for `model` (a `DocumentEncoder` with a linking head), reading the current
  params from `params_fn`."""
  run = jax.jit(lambda params, batch: {
      k: v for k, v in model.apply({"params": params}, batch, deterministic=True).items()
      if k.startswith("link_")})
  head = linking_head(model)

  @jax.jit
  def score(params, a):  # a value per batch row: [V, 1, ...], so rows shard as a batch does
    return head.apply({"params": params}, a["value"], a["none"], a.get("key"), a["value_box"],
                      a["key_box"], a["mask"], method="score")[:, 0]

  def run_fn(batch):
    with jax.set_mesh(mesh):
      out = run(params_fn(), sharding_lib.replicated_batch_to_global(batch, mesh))
    return {k: np.asarray(multihost_utils.process_allgather(v, tiled=True))
            for k, v in out.items()}

  def score_fn(arrays):
    rows = {k: np.asarray(v)[:, None] for k, v in arrays.items() if v is not None}
    with jax.set_mesh(mesh):
      out = score(params_fn()["linking_head"], sharding_lib.replicated_batch_to_global(rows, mesh))
    return np.asarray(multihost_utils.process_allgather(out, tiled=True))
  return Linker(run_fn, score_fn)


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


def linker_for(config: ml_collections.ConfigDict, model, params) -> Linker:
  """A `Linker` for restored `params` on the config's mesh (eval / predict modes)."""
  mesh = sharding_lib.make_mesh(dict(config.mesh.shape))
  return make_linker(model, lambda: params, mesh)


def document_pairs(task: LinkingTask, documents, split: FeaturizedSplit, tag_predictions,
                   linker: Linker, batch_size: int) -> list[list[tuple[object, object, float]]]:
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
  pairs = task.predicted_pairs(documents, split, entities, linker, batch_size)
  return [[(ents[k], ents[v], p) for k, v, p in doc_pairs]
          for ents, doc_pairs in zip(entities, pairs)]
