"""Linking inputs: candidate table, relation orientation, window arrays, readers' relations."""

import json

import numpy as np
import pytest

from flaxdoc.data import jsonl
from flaxdoc.data.document import Document
from flaxdoc.data.linking import (LinkShapes, add_link_arrays, document_candidates,
                                  entity_boxes, oriented_relations, parse_pairs,
                                  window_link_arrays)
from flaxdoc.data.synthetic import LABELS_WITH_KEYS, SyntheticConfig, make_document

LABELS = ("header", "question", "answer")


def test_parse_pairs():
  a = parse_pairs("question:answer", LABELS)
  assert a.sum() == 1 and a[1, 2]
  star = parse_pairs("header:*", LABELS)
  assert star[0].tolist() == [False, True, True]
  with pytest.raises(ValueError, match="unknown label 'answr'"):
    parse_pairs("question:answr", LABELS)
  with pytest.raises(ValueError, match="key_label:value_label"):
    parse_pairs("question", LABELS)


def _form():
  """q0 a1 | q2 a3 | h4: relations listed answer-first, plus a header link (not RE)."""
  words = ["Name:", "Ann", "Date:", "1.2.20", "FORM"]
  boxes = [[0, 0, 10, 5], [20, 0, 30, 5], [0, 10, 10, 15], [20, 10, 30, 15], [0, 30, 10, 35]]
  ents = [("question", [0]), ("answer", [1]), ("question", [2]), ("answer", [3]),
          ("header", [4])]
  return Document.create("f", words, boxes, page_sizes=[[100, 100]], entities=ents,
                         relations=[(1, 0), (2, 3), (4, 0)], label_set=LABELS)


def test_relations_are_oriented_key_to_value():
  doc = _form()
  rels = oriented_relations(doc, parse_pairs("question:answer", LABELS),
                            {l: i for i, l in enumerate(LABELS)})
  assert rels == [(0, 1), (2, 3)]


def test_window_arrays():
  doc = _form()
  # A window: [CLS] Name: Ann Date: 1.2.20 FORM [SEP] pad pad (one token per word).
  window = {"word_ids": np.asarray([-1, 0, 1, 2, 3, 4, -1, -1, -1], np.int32)}
  allowed = parse_pairs("question:answer", LABELS)
  idx = {l: i for i, l in enumerate(LABELS)}
  rels = oriented_relations(doc, allowed, idx)
  a = window_link_arrays(doc, window, doc.entities, rels, allowed, idx, LinkShapes(6, 3, 4))
  assert a["link_first"][:5].tolist() == [1, 2, 3, 4, 5]
  assert a["link_token_entity"].tolist() == [-1, 0, 1, 2, 3, 4, -1, -1, -1]
  assert a["link_entity_id"].tolist() == [0, 1, 2, 3, 4, -1]
  assert a["link_label"][:5].tolist() == [1, 2, 1, 2, 0]
  # Two value slots (the answers), candidates = the questions, nearest first.
  assert a["link_value"].tolist()[:2] == [1, 3]
  assert a["link_candidates"][0, :2].tolist() == [0, 2]
  assert a["link_candidates"][1, :2].tolist() == [2, 0]
  assert a["link_candidate_mask"].tolist() == [[True, True, False, False]] * 2 + [[False] * 4]
  assert a["link_target"].tolist() == [0, 0, -1]
  # Without targets (predicted entities) nothing is trained.
  b = window_link_arrays(doc, window, doc.entities, None, allowed, idx, LinkShapes(6, 3, 4))
  assert b["link_target"].tolist() == [-1, -1, -1]
  # A window without the key of answer 1: its target is "not trained", not "no key".
  cut = {"word_ids": np.asarray([-1, 1, 2, 3, -1], np.int32)}
  c = window_link_arrays(doc, cut, doc.entities, rels, allowed, idx, LinkShapes(6, 3, 4))
  assert c["link_entity_id"][:3].tolist() == [1, 2, 3]
  assert c["link_target"].tolist() == [-1, 0, -1]


def test_candidates_nearest_box_first():
  """A wide question ending just left of the answer comes before a small one above it whose
  centre is nearer; equal box distances fall back to the centres."""
  words = ["Name of the applicant:", "Ann", "Name", "Surname"]
  boxes = [[0, 100, 295, 110], [300, 100, 350, 110], [300, 70, 350, 80], [400, 85, 420, 95]]
  ents = [("question", [0]), ("answer", [1]), ("question", [2]), ("question", [3])]
  doc = Document.create("w", words, boxes, page_sizes=[[1000, 1000]], entities=ents,
                        relations=[(0, 1)], label_set=LABELS)
  window = {"word_ids": np.asarray([-1, 0, 1, 2, 3, -1], np.int32)}
  allowed = parse_pairs("question:answer", LABELS)
  idx = {l: i for i, l in enumerate(LABELS)}
  a = window_link_arrays(doc, window, doc.entities, oriented_relations(doc, allowed, idx),
                         allowed, idx, LinkShapes(6, 2, 4))
  # Box distances 5, 20, 50 (centre distances 177.5, 30, 85): by the box, not the centre.
  assert a["link_candidates"][0, :3].tolist() == [0, 2, 3] and a["link_target"][0] == 0
  # Two questions touching the answer (box distance 0): the nearer centre first.
  far = [[0, 100, 300, 110], [300, 100, 350, 110], [350, 100, 360, 110], [400, 85, 420, 95]]
  doc = Document.create("t", words, far, page_sizes=[[1000, 1000]], entities=ents,
                        relations=[(0, 1)], label_set=LABELS)
  a = window_link_arrays(doc, window, doc.entities, oriented_relations(doc, allowed, idx),
                         allowed, idx, LinkShapes(6, 2, 4))
  assert a["link_candidates"][0, :3].tolist() == [2, 0, 3] and a["link_target"][0] == 1


def test_no_key_target_and_size_cuts():
  doc = _form().replace(relations=[(0, 1)])
  window = {"word_ids": np.asarray([-1, 0, 1, 2, 3, 4, -1], np.int32)}
  allowed = parse_pairs("question:answer", LABELS)
  stats = add_link_arrays([doc], [window], np.zeros(1, int), [doc.entities],
                          [oriented_relations(doc, allowed, {l: i for i, l in enumerate(LABELS)})],
                          allowed, LABELS, LinkShapes(6, 1, 1))
  assert window["link_target"].tolist() == [0]  # answer 1 -> its nearest question
  assert stats == {"values_cut": 1, "candidates_cut": 1}
  stats = add_link_arrays([doc], [window], np.zeros(1, int), [doc.entities], [[]], allowed,
                          LABELS, LinkShapes(6, 2, 2))
  assert window["link_target"].tolist() == [2, 2]  # no relation at all: "no key"


def _brute_candidates(labels, boxes, allowed, encoded, value):
  """Allowed, encoded keys of `value`, ordered by box gap then centre distance (loops)."""
  rows = []
  for j in range(len(labels)):
    if j == value or not encoded[j] or labels[j] < 0 or not allowed[labels[j], labels[value]]:
      continue
    k, v = boxes[j], boxes[value]
    gx = max(v[0] - k[2], k[0] - v[2], 0.0)
    gy = max(v[1] - k[3], k[1] - v[3], 0.0)
    cx = (k[0] + k[2]) / 2 - (v[0] + v[2]) / 2
    cy = (k[1] + k[3]) / 2 - (v[1] + v[3]) / 2
    rows.append((float(np.hypot(gx, gy)), float(np.hypot(cx, cy)), j))
  return [j for *_, j in sorted(rows)]


def test_document_candidates_against_loops():
  rng = np.random.default_rng(0)
  n, c = 40, 6
  labels = rng.integers(-1, 3, size=n)  # -1: a label outside the table
  lo = rng.uniform(0, 2000, size=(n, 2)).astype(np.float32)
  boxes = np.concatenate([lo, lo + rng.uniform(1, 80, size=(n, 2)).astype(np.float32)], 1)
  allowed = parse_pairs("question:answer,header:question", LABELS)
  encoded = rng.uniform(size=n) < 0.9
  stats = {}
  values, cands, mask = document_candidates(labels, boxes, allowed, c, encoded, stats)
  want_values = [i for i in range(n) if encoded[i] and labels[i] in (1, 2)]
  assert values.tolist() == want_values
  cut = 0
  for slot, i in enumerate(values):
    want = _brute_candidates(labels, boxes, allowed, encoded, i)
    cut += max(len(want) - c, 0)
    assert cands[slot][mask[slot]].tolist() == want[:c]
    assert mask[slot].tolist() == [True] * min(len(want), c) + [False] * (c - min(len(want), c))
  assert cut > 0 and stats == {"candidates_cut": cut}


def test_document_candidates_are_the_windows_when_one_window_holds_the_document():
  doc = make_document(0, 1, SyntheticConfig(link_keys=True))
  window = {"word_ids": np.arange(len(doc))}
  allowed = parse_pairs("key:*", LABELS_WITH_KEYS)
  index = {l: i for i, l in enumerate(LABELS_WITH_KEYS)}
  shapes = LinkShapes(len(doc.entities), len(doc.entities), 8)
  w = window_link_arrays(doc, window, doc.entities, None, allowed, index, shapes)
  labels = np.asarray([index[e.label] for e in doc.entities])
  values, cands, mask = document_candidates(labels, entity_boxes(doc, doc.entities), allowed, 8)
  ids = w["link_entity_id"]
  slots = np.flatnonzero(w["link_candidate_mask"].any(1))
  assert len(slots) > 3
  assert ids[w["link_value"][slots]].tolist() == values[mask.any(1)].tolist()
  for s, row in zip(slots, np.flatnonzero(mask.any(1))):
    assert (ids[w["link_candidates"][s][w["link_candidate_mask"][s]]].tolist() ==
            cands[row][mask[row]].tolist())


def test_synthetic_writes_key_value_relations():
  doc = make_document(0, 3, SyntheticConfig(link_keys=True))
  plain = make_document(0, 3)
  assert doc.words == plain.words and doc.label_set == LABELS_WITH_KEYS
  assert doc.relations and not plain.relations
  ents = doc.entities
  for k, v in doc.relations:
    assert ents[k].label == "key" and ents[v].label != "key"
  # Every value of the plain document is still an entity with the same words and label.
  assert {(e.label, e.words) for e in plain.entities} <= {(e.label, e.words) for e in ents}
  keys = {doc.entity_text(ents[k]).lower() for k, _ in doc.relations}
  assert any(("date" in k or "total" in k or "no" in k) for k in keys), keys


def test_jsonl_round_trip_keeps_relations(tmp_path):
  docs = [make_document(0, i, SyntheticConfig(link_keys=True)) for i in range(3)]
  path = tmp_path / "d.jsonl"
  jsonl.write_jsonl(path, docs)
  back, report = jsonl.read_jsonl(path)
  assert report.loaded == 3 and not report.repairs
  assert [d.relations for d in back] == [d.relations for d in docs]


def test_jsonl_drops_and_reports_a_relation_to_a_missing_entity(tmp_path):
  obj = jsonl.document_to_json(_form())
  obj["relations"] = [[1, 0], [3, 9]]
  path = tmp_path / "bad.jsonl"
  path.write_text(json.dumps(obj) + "\n", encoding="utf-8")
  docs, report = jsonl.read_jsonl(path)
  assert docs[0].relations == ((1, 0),)
  assert len(report.repairs) == 1
  where, what = report.repairs[0]
  assert "f" in where and "relation 1 [3, 9]" in what and "5 entities" in what
  assert "dropped 1 relation" in report.summary()


def test_funsd_reader_keeps_links(tmp_path):
  form = {"form": [
      {"id": 0, "label": "question", "box": [0, 0, 10, 5], "text": "Name:",
       "words": [{"text": "Name:", "box": [0, 0, 10, 5]}], "linking": [[0, 1]]},
      {"id": 1, "label": "answer", "box": [20, 0, 30, 5], "text": "Ann",
       "words": [{"text": "Ann", "box": [20, 0, 30, 5]}], "linking": [[0, 1], [0, 7]]},
  ]}
  ann = tmp_path / "training_data" / "annotations"
  ann.mkdir(parents=True)
  (ann / "a.json").write_text(json.dumps(form), encoding="utf-8")
  from flaxdoc.data import funsd  # pylint: disable=import-outside-toplevel
  docs, report = funsd.load_funsd(str(tmp_path), "train")
  assert docs[0].relations == ((0, 1),)
  assert report.stats["relations_dropped"] == {"links an unknown entity id": 1}
