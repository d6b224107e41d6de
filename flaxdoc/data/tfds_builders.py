"""TFDS builders for FUNSD, CORD, SROIE and the synthetic set, written as array_record.

Built from the same readers as `load_dataset`, so a TFDS split holds exactly the
documents `load_dataset(name, split, data_dir=manual_dir)` returns, in the same
(sorted-id) order. No TensorFlow is needed: with tensorflow-datasets 4.9 a
`GeneratorBasedBuilder` writes array_record files through its own serializer (no
Beam, no TF), and `tfds.data_source` reads them back as numpy. Never use
`tfds.load` (it needs TensorFlow).

Building (local copy in `manual_dir`, laid out as the reader expects)::

  import tensorflow_datasets as tfds
  from flaxdoc.data import tfds_builders  # registers funsd, cord, sroie, synthetic

  builder = tfds_builders.Funsd(data_dir="~/tensorflow_datasets")
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir="/data/funsd"))
  source = tfds.data_source("funsd", split="train", data_dir="~/tensorflow_datasets",
                            download=False)
  doc = tfds_builders.document_from_example(source[0])

FUNSD alone can also be downloaded (`URL`) when no manual dir is given and the
machine is online; that path is not exercised by the tests. Splits: `train`,
`dev` (official, or carved from train as `load_dataset` does) and `test` when
present on disk.

Features (one example per document, `N` words, `E` entities, `R` relations):

| feature | type | meaning |
|---|---|---|
| `id` | Text | `Document.id` |
| `words` | Sequence(Text) | the `N` words |
| `boxes` | float32 `[N, 4]` | page pixels |
| `pages` | int32 `[N]` | |
| `page_sizes` | float32 `[P, 2]` | (width, height) |
| `segments` | int32 `[N]` | |
| `has_entities` | bool | False for unlabelled documents (`entities is None`) |
| `entity_labels` | Sequence(Text) | the `E` labels |
| `entity_offsets` | int32 `[E + 1]` | entity `e` owns `entity_words[offsets[e]:offsets[e + 1]]` |
| `entity_words` | int32 `[sum of entity lengths]` | word indices, flat |
| `relations` | int32 `[R, 2]` | pairs of entity indices |
| `label_set` | Sequence(Text) | the label set (empty: none) |
"""

from __future__ import annotations

import logging

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from flaxdoc.data.datasets import available_splits, load_dataset
from flaxdoc.data.document import Document, DocumentError, Entity

log = logging.getLogger(__name__)

FEATURES_VERSION = "1.0.0"


def document_features() -> tfds.features.FeaturesDict:
  """The feature spec of one document (see the module docstring)."""
  f = tfds.features
  return f.FeaturesDict({
      "id": f.Text(),
      "words": f.Sequence(f.Text()),
      "boxes": f.Tensor(shape=(None, 4), dtype=np.float32),
      "pages": f.Tensor(shape=(None,), dtype=np.int32),
      "page_sizes": f.Tensor(shape=(None, 2), dtype=np.float32),
      "segments": f.Tensor(shape=(None,), dtype=np.int32),
      "has_entities": f.Tensor(shape=(), dtype=np.bool_),
      "entity_labels": f.Sequence(f.Text()),
      "entity_offsets": f.Tensor(shape=(None,), dtype=np.int32),
      "entity_words": f.Tensor(shape=(None,), dtype=np.int32),
      "relations": f.Tensor(shape=(None, 2), dtype=np.int32),
      "label_set": f.Sequence(f.Text()),
  })


def example_from_document(doc: Document) -> dict:
  """The TFDS example (a dict of numpy arrays and strings) of one document."""
  ents = doc.entities or ()
  lengths = [len(e.words) for e in ents]
  return {
      "id": doc.id,
      "words": list(doc.words),
      "boxes": doc.boxes.astype(np.float32).reshape(-1, 4),
      "pages": doc.pages.astype(np.int32),
      "page_sizes": doc.page_sizes.astype(np.float32).reshape(-1, 2),
      "segments": doc.segments.astype(np.int32),
      "has_entities": doc.entities is not None,
      "entity_labels": [e.label for e in ents],
      "entity_offsets": np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32),
      "entity_words": np.asarray([i for e in ents for i in e.words], np.int32),
      "relations": np.asarray(doc.relations, np.int32).reshape(-1, 2),
      "label_set": list(doc.label_set or ()),
  }


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, (bytes, np.bytes_)) else str(value)


def document_from_example(example) -> Document:
  """Rebuilds (and re-validates) the `Document` of a decoded TFDS example.

  Accepts what `tfds.data_source(...)[i]` returns (text as bytes) as well as the
  output of `example_from_document` (text as str).

  Raises:
    DocumentError: if the example is inconsistent (e.g. offsets out of range).
  """
  doc_id = _text(example["id"])
  offsets = np.asarray(example["entity_offsets"], np.int64).reshape(-1)
  flat = np.asarray(example["entity_words"], np.int64).reshape(-1)
  labels = [_text(l) for l in example["entity_labels"]]
  if (len(offsets) != len(labels) + 1 or offsets[0] != 0 or offsets[-1] != len(flat) or
      (np.diff(offsets) < 0).any()):
    raise DocumentError(f"entity_offsets {offsets.tolist()[:10]} do not fit "
                        f"{len(labels)} labels and {len(flat)} words", doc_id=doc_id,
                        field="entity_offsets")
  entities = None
  if bool(np.asarray(example["has_entities"])):
    entities = [Entity(l, tuple(flat[offsets[k]:offsets[k + 1]].tolist()))
                for k, l in enumerate(labels)]
  elif labels:
    raise DocumentError("entities present but has_entities is False", doc_id=doc_id,
                        field="has_entities")
  label_set = [_text(l) for l in example["label_set"]] or None
  relations = [tuple(r) for r in np.asarray(example["relations"], np.int64).reshape(-1, 2)]
  return Document.create(
      doc_id, [_text(w) for w in example["words"]],
      np.asarray(example["boxes"], np.float32).reshape(-1, 4),
      pages=np.asarray(example["pages"], np.int64).reshape(-1),
      page_sizes=np.asarray(example["page_sizes"], np.float32).reshape(-1, 2),
      segments=np.asarray(example["segments"], np.int64).reshape(-1),
      entities=entities, relations=relations, label_set=label_set)


class _DocumentBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Shared body: one example per `Document` of `load_dataset(DATASET, split)`."""

  VERSION = tfds.core.Version(FEATURES_VERSION)
  RELEASE_NOTES = {FEATURES_VERSION: "First flaxdoc release (features of flaxdoc.data.Document)."}
  DATASET = ""
  HOMEPAGE = ""
  CITATION = ""
  DESCRIPTION = ""

  def __init__(self, *, file_format: str | None = "array_record",
               reader_options: dict | None = None, **kwargs):
    """Args: `file_format` (array_record by default, for `tfds.data_source`);
    `reader_options`, keyword arguments for `load_dataset` (e.g. `{"num_train": 100}`
    for `synthetic`); they are not part of the dataset version, so build
    differently-configured copies into different `data_dir`s; other arguments go
    to `tfds.core.GeneratorBasedBuilder` (`data_dir`, ...).
    """
    super().__init__(file_format=file_format, **kwargs)
    self._reader_options = dict(reader_options or {})

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    # tfds 4.9.10 finds this file through the `importlib_resources` backport, which
    # it only installs on Python < 3.9; the path is only used to look for a
    # checksums file next to the code (there is none).
    return epath.Path(__file__)

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description=self.DESCRIPTION, features=document_features(), homepage=self.HOMEPAGE,
        citation=self.CITATION, disable_shuffling=True)

  def _source_dir(self, dl_manager):
    """The folder the reader gets; the manual dir by default."""
    return dl_manager.manual_dir

  def _split_generators(self, dl_manager):
    root = self._source_dir(dl_manager)
    root = str(root) if root is not None else None
    splits = available_splits(self.DATASET, root)
    if not splits:
      raise FileNotFoundError(f"{self.DATASET}: no split found in {root!r}. "
                              f"{self.MANUAL_DOWNLOAD_INSTRUCTIONS}")
    return {split: self._generate_examples(root, split) for split in splits}

  def _generate_examples(self, root, split):
    docs, report = load_dataset(self.DATASET, split, root, **self._reader_options)
    log.info("%s", report.summary())
    for doc in docs:
      yield doc.id, example_from_document(doc)


class Funsd(_DocumentBuilder):
  """FUNSD forms (header / question / answer / other, with links)."""
  name = "funsd"
  DATASET = "funsd"
  URL = "https://guillaumejaume.github.io/FUNSD/dataset.zip"
  HOMEPAGE = "https://guillaumejaume.github.io/FUNSD/"
  CITATION = ("Jaume, Ekenel, Thiran. FUNSD: A Dataset for Form Understanding in Noisy "
              "Scanned Documents. ICDAR-OST 2019.")
  DESCRIPTION = "FUNSD read by flaxdoc.data.funsd (non-commercial research use only)."
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "Put the unzipped official dataset.zip in manual_dir: manual_dir/training_data/"
      "annotations/*.json (and images/*.png), manual_dir/testing_data/... (a top-level "
      "dataset/ folder, or dataset.zip itself, also works). Without a manual dir the zip "
      f"is downloaded from {URL}.")

  def _source_dir(self, dl_manager):
    try:
      manual = dl_manager.manual_dir
    except AssertionError:  # no (or an empty) manual dir: download the official zip
      return dl_manager.download_and_extract(self.URL)
    if (manual / "dataset.zip").exists() and not any(
        (manual / d).exists() for d in ("training_data", "dataset")):
      return dl_manager.extract(manual / "dataset.zip")
    return manual


class Cord(_DocumentBuilder):
  """CORD receipts (30 valid_line categories)."""
  name = "cord"
  DATASET = "cord"
  HOMEPAGE = "https://github.com/clovaai/cord"
  CITATION = ("Park et al. CORD: A Consolidated Receipt Dataset for Post-OCR Parsing. "
              "Document Intelligence Workshop at NeurIPS 2019.")
  DESCRIPTION = "CORD read by flaxdoc.data.cord (CC BY 4.0)."
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "Put the receipts' JSON in manual_dir/{train,dev,test}/json/<id>.json (the "
      "ground_truth of each row of naver-clova-ix/cord-v2 or cord-v1; dev and test optional).")


class Sroie(_DocumentBuilder):
  """SROIE receipts (company / date / address / total aligned to words)."""
  name = "sroie"
  DATASET = "sroie"
  HOMEPAGE = "https://rrc.cvc.uab.es/?ch=13"
  CITATION = ("Huang et al. ICDAR2019 Competition on Scanned Receipt OCR and Information "
              "Extraction. ICDAR 2019.")
  DESCRIPTION = "SROIE read by flaxdoc.data.sroie; key fields aligned to the OCR words."
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "Put the SROIE2019 text files in manual_dir/{train,test}/box/<ID>.txt and "
      "manual_dir/{train,test}/entities/<ID>.txt (images are not needed).")


class Synthetic(_DocumentBuilder):
  """flaxdoc's synthetic documents (`flaxdoc.data.synthetic`), for smoke tests."""
  name = "synthetic"
  DATASET = "synthetic"
  DESCRIPTION = "Synthetic documents from flaxdoc.data.synthetic.load_synthetic."

  def _source_dir(self, dl_manager):
    return None  # generated, nothing to read
