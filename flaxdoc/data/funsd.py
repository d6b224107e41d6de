"""FUNSD reader: scanned forms with header / question / answer / other entities and links.

Expected layout (a straight unzip of the official `dataset.zip`; an extra
top-level `dataset/` folder is also accepted)::

  <data_dir>/training_data/annotations/<stem>.json   (149 forms)
  <data_dir>/training_data/images/<stem>.png         (optional: page size)
  <data_dir>/testing_data/annotations/<stem>.json    (50 forms)
  <data_dir>/testing_data/images/<stem>.png

Each annotation is `{"form": [entity, ...]}` with entities
`{"id", "label", "box", "text", "words": [{"text", "box"}], "linking": [[from, to]]}`.

What becomes of it:

* words: the FUNSD words in file order (entity by entity). Words whose text is
  empty (624 in the training split: checkboxes and marks) cannot be `Document`
  words; each is skipped and recorded in the report.
* segments: the FUNSD entity (its `id`) of each word.
* entities: one per FUNSD entity, labelled by `label`. An entity left with no
  words (152 in the training split) is recorded as a skipped entity. Since the
  words of an entity are stored together, every entity is a run of consecutive
  words (`report.stats["noncontiguous_entities"]` counts exceptions: 0).
* relations: the `linking` pairs, deduplicated (a pair is usually listed on both
  of its entities) and mapped to entity indices; pairs that touch a skipped or
  unknown entity are counted in `report.stats["relations_dropped"]` by reason.
* page size: from the PNG header when the image is there, else the bounding box
  of the words (counted in `report.stats["page_size_from_words"]`); the PNG is
  kept as the page image (`Document.page_images`) for pictures.
* `ocr="tesseract"|"rapidocr"`: the words are re-read from the PNG by that OCR
  engine (`flaxdoc.data.ocr`, results cached in `ocr_cache_dir` when given) and
  the gold entities mapped to the OCR words by box overlap
  (`flaxdoc.data.ocr.matching`), so a model is scored on what a scan gives.
  Gold entities no OCR word lands in are counted in
  `report.stats["ocr_entities_lost"]`.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Collection

from flaxdoc.data.public_datasets import LABELS, DatasetNotFoundError
from flaxdoc.data.document import Document, DocumentError, PageImage
from flaxdoc.data.jsonl import finite_number, load_json_file, read_box
from flaxdoc.data.reading import check_on_error, list_ids, parse_each, progress, select_ids
from flaxdoc.data.report import LoadReport
from flaxdoc.tags import consecutive_runs

URL = "https://guillaumejaume.github.io/FUNSD/dataset.zip"
SPLIT_DIRS = {"train": "training_data", "test": "testing_data"}
FUNSD_LABELS = LABELS["funsd"]

_LAYOUT = ("<data_dir>/training_data/annotations/*.json and "
           "<data_dir>/testing_data/annotations/*.json (images optional, in images/*.png "
           "next to annotations/)")


def _annotation_dir(data_dir, split: str) -> Path:
  if split not in SPLIT_DIRS:
    raise DatasetNotFoundError(
        f"FUNSD has no official {split!r} split (only {sorted(SPLIT_DIRS)}); use "
        f"flaxdoc.data.datasets.load_dataset('funsd', {split!r}) to carve a dev split")
  data_dir = Path(data_dir)
  for root in (data_dir, data_dir / "dataset"):
    d = root / SPLIT_DIRS[split] / "annotations"
    if d.is_dir():
      return d
  raise DatasetNotFoundError(f"FUNSD {split!r} split not found under {str(data_dir)!r}: "
                             f"expected {_LAYOUT}")


def list_funsd_ids(data_dir, split: str) -> list[str]:
  """Sorted form ids (annotation file stems) of an official split."""
  return list_ids(_annotation_dir(data_dir, split), "*.json", f"FUNSD {split!r}")


def load_funsd(data_dir, split: str, *, ids: Collection[str] | None = None,
               box_policy: str = "clip", on_error: str = "raise", use_images: bool = True,
               other_as_entity: bool = True, ocr: str | None = None, ocr_cache_dir=None
               ) -> tuple[list[Document], LoadReport]:
  """Reads an official FUNSD split: `(documents, report)`.

  Args:
    data_dir: the FUNSD folder (see the module docstring for the layout).
    split: "train" or "test".
    ids: read only these forms (default: all, sorted by id).
    box_policy: `Document.create` policy for boxes outside the page; repairs are
      recorded in the report.
    on_error: "raise" a `DocumentError` on a malformed file, or "skip" it and
      record it in the report.
    use_images: take the page size from the PNG header (else the words' bounding box).
    other_as_entity: if False, `other` entities are not made entities (their
      words stay, untagged), as in LayoutLM's FUNSD setup; counted in
      `report.stats["other_not_entities"]`.
    ocr: None (gold words) or an OCR engine, "tesseract" or "rapidocr": words
      from the form's image, gold entities mapped to them (see the module doc).
    ocr_cache_dir: where OCR results are cached (JSON per image and engine).
  """
  check_on_error(on_error)
  ann = _annotation_dir(data_dir, split)
  ids = select_ids(ids, list_funsd_ids(data_dir, split), f"FUNSD {split!r}: no annotation",
                   ann)
  report = LoadReport(f"funsd:{split} ({ann})")
  stats = collections.Counter()
  kept_by_label = collections.Counter()
  skipped_by_label = collections.Counter()
  dropped_relations = collections.Counter()
  docs = []

  def parse(doc_id, local):
    image = ann.parent / "images" / f"{doc_id}.png" if use_images else None
    doc, info = _read_form(ann / f"{doc_id}.json", doc_id, image, local, box_policy,
                           other_as_entity)
    if ocr:
      doc, lost = _ocr_form(doc, ann.parent / "images" / f"{doc_id}.png", ocr, ocr_cache_dir,
                            local)
      info["stats"]["ocr_entities_lost"] += len(lost)
    return doc, info

  if ocr:  # seconds a form: show the count, rate and ETA
    ids = progress(ids, f"FUNSD {split}: OCR by {ocr}", "form")
  for doc_id, local, (doc, info) in parse_each(ids, parse, report, on_error):
    report.skipped_words += local.skipped_words
    report.skipped_entities += local.skipped_entities
    report.repairs += local.repairs
    # OCR (config.data.dataset_options.ocr): the pages' source and blank pages, in the summary.
    report.page_sources.update(local.page_sources)
    for k, pages in local.stats.get("pages_without_text", {}).items():
      report.stats.setdefault("pages_without_text", {})[k] = pages
    for note in doc.repairs:
      report.repair(doc_id, note)
    stats.update(info["stats"])
    kept_by_label.update(info["kept_by_label"])
    skipped_by_label.update(info["skipped_by_label"])
    dropped_relations.update(info["dropped_relations"])
    if not len(doc):
      report.skip_document(doc_id, "no words with text")
      continue
    docs.append(doc)
  report.loaded = len(docs)
  report.stats.update({
      "words": stats["words"],
      "words_kept": sum(len(d) for d in docs),
      "entities_by_label": dict(kept_by_label),
      "skipped_entities_by_label": dict(skipped_by_label),
      "relations": sum(len(d.relations) for d in docs),
      "relations_dropped": dict(dropped_relations),
      "noncontiguous_entities": stats["noncontiguous_entities"],
      "page_size_from_words": stats["page_size_from_words"],
  })
  if not other_as_entity:
    report.stats["other_not_entities"] = stats["other_not_entities"]
  if ocr:
    report.stats["ocr"] = ocr
    report.stats["ocr_entities_lost"] = stats["ocr_entities_lost"]
  return docs, report


def _ocr_form(gold: Document, image: Path, engine: str, cache_dir,
              report: LoadReport) -> tuple[Document, list[int]]:
  """The form's words read from its image by `engine`, labelled with the gold entities."""
  from flaxdoc.data.ocr.matching import with_gold_entities  # pylint: disable=import-outside-toplevel
  from flaxdoc.data.ocr.reader import read_document  # pylint: disable=import-outside-toplevel
  if not image.is_file():
    raise DocumentError(f"ocr={engine!r} needs the form's image, and {image} is missing",
                        doc_id=gold.id, field="ocr", source=str(image))
  scan = read_document(image, engine=engine, doc_id=gold.id, cache_dir=cache_dir or None,
                       report=report)
  return with_gold_entities(gold, scan)


def _read_form(path: Path, doc_id: str, image: Path | None, report: LoadReport,
               box_policy: str, other_as_entity: bool) -> tuple[Document, dict]:
  """One annotation file -> (Document, counts). Raises DocumentError if malformed."""
  source = os.fspath(path)

  def err(msg, field="form"):
    return DocumentError(msg, doc_id=doc_id, field=field, source=source)

  data = load_json_file(path, doc_id=doc_id)
  if not isinstance(data, dict) or not isinstance(data.get("form"), list):
    raise err("expected a JSON object with a 'form' list")

  words, boxes, segments = [], [], []
  entities = []       # (label, word indices)
  entity_of_id = {}   # FUNSD id -> index in `entities` (kept entities only)
  seen_ids = set()
  not_entities = set()  # `other` entities left untagged (other_as_entity=False)
  links = []          # (from_id, to_id) in file order, with duplicates
  stats = collections.Counter()
  kept_by_label = collections.Counter()
  skipped_by_label = collections.Counter()
  for k, ent in enumerate(data["form"]):
    if not isinstance(ent, dict):
      raise err(f"entity {k} is {type(ent).__name__}, not an object")
    eid = ent.get("id", k)
    if isinstance(eid, bool) or not isinstance(eid, int):
      raise err(f"entity {k} has a non-integer id {eid!r}")
    if eid in seen_ids:
      raise err(f"entity {k} repeats id {eid}")
    seen_ids.add(eid)
    label = ent.get("label")
    if label not in FUNSD_LABELS:
      raise err(f"entity {eid} has label {label!r}, not one of {list(FUNSD_LABELS)}")
    ent_words = ent.get("words")
    if not isinstance(ent_words, list):
      raise err(f"entity {eid} has no 'words' list")
    indices = []
    for j, w in enumerate(ent_words):
      if not isinstance(w, dict) or not isinstance(w.get("text"), str):
        raise err(f"entity {eid} word {j} must be an object with a string 'text', got "
                  f"{str(w)[:80]}")
      box = read_box(w.get("box"), lambda m: err(m, "box"), f"entity {eid} word {j} box")
      stats["words"] += 1
      if not w["text"].strip():
        report.skip_word(f"{doc_id} entity {eid} word {j}", "empty text")
        continue
      indices.append(len(words))
      words.append(w["text"])
      boxes.append(box)
      segments.append(eid)
    linking = ent.get("linking", [])
    if not isinstance(linking, list):
      raise err(f"entity {eid} 'linking' must be a list of pairs, got {str(linking)[:80]}",
                "linking")
    for pair in linking:
      if (not isinstance(pair, list) or len(pair) != 2 or
          any(finite_number(v) is None or v != int(v) for v in pair)):
        raise err(f"entity {eid} has a malformed link {str(pair)[:80]}", "linking")
      links.append((int(pair[0]), int(pair[1])))
    if not indices:
      report.skip_entity(f"{doc_id} entity {eid} ({label})", "no words with text")
      skipped_by_label[label] += 1
      continue
    if label == "other" and not other_as_entity:
      stats["other_not_entities"] += 1
      not_entities.add(eid)
      continue
    if len(consecutive_runs(indices)) > 1:
      stats["noncontiguous_entities"] += 1
    entity_of_id[eid] = len(entities)
    entities.append((label, indices))
    kept_by_label[label] += 1

  relations, dropped = [], collections.Counter()
  seen_links = set()
  for a, b in links:
    if (a, b) in seen_links:
      continue
    seen_links.add((a, b))
    if a not in seen_ids or b not in seen_ids:
      dropped["links an unknown entity id"] += 1
    elif a in not_entities or b in not_entities:
      dropped["links an 'other' entity (other_as_entity=False)"] += 1
    elif a not in entity_of_id or b not in entity_of_id:
      dropped["links an entity without words"] += 1
    else:
      relations.append((entity_of_id[a], entity_of_id[b]))

  page_sizes = page_images = None
  if image is not None and image.is_file():
    try:
      from PIL import Image  # pylint: disable=import-outside-toplevel
      with Image.open(image) as im:  # reads the header only
        page_sizes = [[float(im.size[0]), float(im.size[1])]]
      page_images = [PageImage(os.fspath(image), 0, *page_sizes[0])]
    except Exception as e:  # pylint: disable=broad-except
      # PIL raises many types on a bad header (OSError, SyntaxError, DecompressionBombError);
      # the image only gives the page size, so fall back and say so.
      report.repair(doc_id, f"unreadable image {image.name} ({e}); page size from the words")
  if page_sizes is None:
    stats["page_size_from_words"] += 1

  doc = Document.create(doc_id, words, boxes,
                        page_sizes=page_sizes, segments=segments, entities=entities,
                        relations=relations, label_set=FUNSD_LABELS, box_policy=box_policy,
                        source=source, page_images=page_images)
  return doc, {"stats": stats, "kept_by_label": kept_by_label,
               "skipped_by_label": skipped_by_label, "dropped_relations": dropped}
