"""The synthetic dataset: seeded forms, invoices and receipts as `Document`s.

`make_document(seed, index, config)` is a pure function of its arguments: each
document draws from its own random streams, seeded from `(seed, index)` only,
so any document can be made on demand, in any order, in parallel or sharded
across hosts, and the same arguments always give the same document.

Three independent streams per document keep the noise options orthogonal to
the content: the *content* stream draws the kind, text and layout, the *order*
stream the reading order, the *noise* stream the OCR damage. Turning a noise
option on therefore changes the word order or the words of a document, never
what it says or where it is printed (beyond the few pixels of OCR box jitter).

The dataset is built so that layout is needed to tag it: table columns of
quantities, unit prices and amounts (and O tax rates) share one number format
and come in a per-document order, so only the header above a cell decides its
label; dates and due dates (and O look-alikes such as order dates) share a
format, so only their key decides; values sit right of or below their keys,
and key strips and side-by-side seller / buyer blocks interleave when read
line by line.

Labels (`LABELS`) are the values; keys, titles, headers, notes and footers are
O (no `key` label). With `SyntheticConfig(link_keys=True)` the generator also
writes the pairs it knows: every key word group ("Invoice No.", "Date:", "Total",
a table's column header) that a labelled value belongs to becomes an entity
labelled `key` (label set `LABELS_WITH_KEYS`), and `Document.relations` holds one
`(key entity, value entity)` pair per value (table cells link to their column's
header on the same page).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Iterator, Mapping

import numpy as np

from flaxdoc.data.document import Document, Entity
from flaxdoc.data.report import LoadReport
from flaxdoc.data.synthetic import noise
from flaxdoc.data.synthetic.blocks import LengthPlan
from flaxdoc.data.synthetic.canvas import Canvas
from flaxdoc.data.synthetic.kinds import BUILDERS, KINDS

LABELS = (
    "doc_id",           # invoice / receipt / form reference number
    "date",             # issue date
    "due_date",         # payment due date, "valid until", expiry
    "seller",           # issuing company or shop
    "buyer",            # customer, applicant
    "address",          # one line of a postal address (of any party)
    "phone",
    "email",
    "item_desc",        # line-item description
    "item_qty",
    "item_unit_price",
    "item_amount",
    "subtotal",
    "tax",
    "total",
)

# The label set of documents made with `link_keys=True`.
KEY_LABEL = "key"
LABELS_WITH_KEYS = LABELS + (KEY_LABEL,)

# First index of each split: disjoint ranges, independent of the split sizes.
SPLIT_STARTS = {"train": 0, "dev": 1_000_000_000, "test": 2_000_000_000}
_SPLIT_ALIASES = {"validation": "dev", "valid": "dev", "val": "dev", "eval": "dev"}


@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
  """What kind of documents to generate, how long, and how noisy.

  Attributes:
    kinds: document kinds to draw from (uniformly): "form", "invoice", "receipt"
      (a tuple, or a comma-separated string).
    min_pages, max_pages: page count, drawn uniformly per document. With more
      than one page the line-item table runs over the pages (header repeated).
    target_words: if > 0, tables grow until the document has at least this
      many words (before OCR noise), paginating as needed; overrides the pages.
    min_items, max_items: line items of a single-page document (fewer if the
      page is full).
    value_below: probability that a group of key/value fields puts each value
      below its key (else right of it).
    shuffle_columns: probability that a table's numeric columns come in a
      random order (else the usual quantity, unit price, amount).
    interleave_columns: probability that a document comes in the naive OCR line
      order (side-by-side blocks interleaved line by line).
    shuffle_blocks: probability that a document in block order has the blocks
      of each page in random order.
    ocr_noise: per-word probability of an OCR error (substituted or deleted
      character, split or merged word); also scales box jitter. 0 is clean.
    link_keys: label the keys of labelled values `key` and write the key -> value
      relations (for entity linking; see the module docstring).
  """
  kinds: tuple[str, ...] = KINDS
  min_pages: int = 1
  max_pages: int = 1
  target_words: int = 0
  min_items: int = 2
  max_items: int = 12
  value_below: float = 0.5
  shuffle_columns: float = 0.8
  interleave_columns: float = 0.5
  shuffle_blocks: float = 0.2
  ocr_noise: float = 0.0
  link_keys: bool = False

  def __post_init__(self):
    # A string is a comma-separated list (as a command-line override gives it).
    if isinstance(self.kinds, str):
      kinds = tuple(k.strip() for k in self.kinds.split(",") if k.strip())
    else:
      kinds = tuple(self.kinds)
    object.__setattr__(self, "kinds", kinds)
    if not kinds or any(k not in KINDS for k in kinds):
      raise ValueError(f"SyntheticConfig.kinds must be a non-empty subset of {KINDS}, got {kinds}")
    for name in ("min_pages", "max_pages", "target_words", "min_items", "max_items"):
      v = getattr(self, name)
      if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
        raise ValueError(f"SyntheticConfig.{name} must be an integer, got {v!r}")
    if not 1 <= self.min_pages <= self.max_pages:
      raise ValueError(f"SyntheticConfig needs 1 <= min_pages <= max_pages, got "
                       f"{self.min_pages}, {self.max_pages}")
    if not 1 <= self.min_items <= self.max_items:
      raise ValueError(f"SyntheticConfig needs 1 <= min_items <= max_items, got "
                       f"{self.min_items}, {self.max_items}")
    if self.target_words < 0:
      raise ValueError(f"SyntheticConfig.target_words must be >= 0, got {self.target_words}")
    if not isinstance(self.link_keys, bool):
      raise ValueError(f"SyntheticConfig.link_keys must be a bool, got {self.link_keys!r}")
    for name in ("value_below", "shuffle_columns", "interleave_columns", "shuffle_blocks",
                 "ocr_noise"):
      v = getattr(self, name)
      if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0.0 <= v <= 1.0:
        raise ValueError(f"SyntheticConfig.{name} is a probability in [0, 1], got {v!r}")


def _streams(seed: int, index: int) -> tuple[random.Random, random.Random, random.Random]:
  # String seeds are hashed with SHA-512 by `random.seed`: stable across runs,
  # platforms and Python versions (and not affected by PYTHONHASHSEED).
  base = f"flaxdoc.synthetic/{seed}/{index}"
  return (random.Random(base + "/content"), random.Random(base + "/order"),
          random.Random(base + "/noise"))


def _check_seed_index(seed, index):
  for name, v in (("seed", seed), ("index", index)):
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
      raise ValueError(f"synthetic document {name} must be an integer, got {v!r}")
  if index < 0:
    raise ValueError(f"synthetic document index must be >= 0, got {index}")


def _layout(rng: random.Random, config: SyntheticConfig) -> Canvas:
  """Draws the kind, length and content of a document and lays it out."""
  kind = config.kinds[int(rng.random() * len(config.kinds))]
  plan = LengthPlan(items=rng.randint(config.min_items, config.max_items),
                    pages=rng.randint(config.min_pages, config.max_pages),
                    target_words=config.target_words, last_fill=0.35 + 0.65 * rng.random())
  return BUILDERS[kind](rng, plan, value_below=config.value_below,
                        shuffle_columns=config.shuffle_columns)


def _reading_order(canvas: Canvas, rng: random.Random, config: SyntheticConfig) -> list[int]:
  if rng.random() < config.interleave_columns:
    return noise.line_order(canvas.segments)
  if rng.random() < config.shuffle_blocks:
    return noise.shuffled_block_order(canvas.segments, rng)
  return noise.logical_order(canvas.segments)


def make_document(seed: int, index: int, config: SyntheticConfig = SyntheticConfig()) -> Document:
  """Synthetic document number `index` of the dataset seeded `seed`.

  Deterministic in `(seed, index, config)` and independent of every other
  document. The id is `f"synthetic-{seed}-{index}"`, the label set `LABELS`.
  """
  _check_seed_index(seed, index)
  content_rng, order_rng, noise_rng = _streams(seed, index)
  canvas = _layout(content_rng, config)
  order = _reading_order(canvas, order_rng, config)

  words: list[str] = []
  boxes: list[list[float]] = []
  pages: list[int] = []
  segment_ids: list[int] = []
  entities: list[Entity] = []
  rate = config.ocr_noise
  segments = canvas.segments
  # Keys (segment indices) that a labelled value links to, when writing relations.
  linked_keys = ({s.key for s in segments if s.label is not None and s.key is not None}
                 if config.link_keys else set())
  entity_of_segment: dict[int, int] = {}
  for new_id, i in enumerate(order):
    seg = segments[i]
    seg_words, seg_boxes = seg.words, canvas.word_boxes(seg)
    if rate > 0:
      jitter = min(1.0, 4.0 * rate) * 0.15 * seg.font_size
      seg_words, seg_boxes = noise.ocr_segment(
          seg_words, seg_boxes, noise_rng, rate, jitter,
          (canvas.width, canvas.page_heights[seg.page]))
    start = len(words)
    words.extend(seg_words)
    boxes.extend(seg_boxes)
    pages.extend([seg.page] * len(seg_words))
    segment_ids.extend([new_id] * len(seg_words))
    label = seg.label if seg.label is not None else (KEY_LABEL if i in linked_keys else None)
    if label is not None and len(words) > start:
      entity_of_segment[i] = len(entities)
      entities.append(Entity(label, tuple(range(start, len(words)))))
  relations = [(entity_of_segment[s.key], entity_of_segment[i]) for i, s in enumerate(segments)
               if config.link_keys and s.label is not None and s.key is not None
               and s.key in entity_of_segment and i in entity_of_segment]
  page_sizes = [(canvas.width, h) for h in canvas.page_heights]
  return Document.create(
      f"synthetic-{seed}-{index}", words, np.asarray(boxes, np.float64).reshape(-1, 4),
      pages=np.asarray(pages, np.int32), page_sizes=page_sizes,
      segments=np.asarray(segment_ids, np.int32), entities=entities, relations=relations,
      label_set=LABELS_WITH_KEYS if config.link_keys else LABELS, source="synthetic")


def generate(num_docs: int, seed: int = 0, config: SyntheticConfig = SyntheticConfig(),
             start: int = 0) -> list[Document]:
  """Documents `start .. start + num_docs - 1` of the dataset seeded `seed`."""
  if num_docs < 0 or start < 0:
    raise ValueError(f"need num_docs >= 0 and start >= 0, got {num_docs}, {start}")
  return [make_document(seed, start + i, config) for i in range(num_docs)]


def split_range(split: str, size: int) -> range:
  """The document indices of a split ("train", "dev" or "test"; "validation" = "dev")."""
  name = _SPLIT_ALIASES.get(split, split)
  if name not in SPLIT_STARTS:
    raise ValueError(f"unknown synthetic split {split!r}; expected one of "
                     f"{sorted(SPLIT_STARTS) + sorted(_SPLIT_ALIASES)}")
  if size < 0 or size > SPLIT_STARTS["dev"]:
    raise ValueError(f"split size must be in [0, {SPLIT_STARTS['dev']}], got {size}")
  return range(SPLIT_STARTS[name], SPLIT_STARTS[name] + size)


def load_synthetic(split: str, *, num_train: int = 2000, num_dev: int = 200, num_test: int = 200,
                   seed: int = 0, config: SyntheticConfig | None = None,
                   **overrides) -> tuple[list[Document], LoadReport]:
  """A split of the synthetic dataset, as the dataset readers return theirs.

  Splits use disjoint index ranges (train from 0, dev from 1e9, test from 2e9),
  so they never share a document, and a split does not change when the size
  of another one does.

  Args:
    split: "train", "dev" (or "validation") or "test".
    num_train, num_dev, num_test: split sizes.
    seed: dataset seed.
    config: generator options: a `SyntheticConfig` or a mapping of its fields
      (default `SyntheticConfig()`).
    **overrides: `SyntheticConfig` fields to change, e.g. `ocr_noise=0.05`.
  """
  known = {f.name for f in dataclasses.fields(SyntheticConfig)}
  if config is None:
    config = SyntheticConfig()
  elif isinstance(config, Mapping):  # e.g. a dict from a config file
    overrides = {**config, **overrides}
    config = SyntheticConfig()
  elif not isinstance(config, SyntheticConfig):
    raise ValueError(f"config must be a SyntheticConfig or a mapping, got {type(config).__name__}")
  if overrides:
    unknown = sorted(set(overrides) - known)
    if unknown:
      raise ValueError(f"unknown synthetic option(s) {unknown}; known: {sorted(known)}")
    config = dataclasses.replace(config, **overrides)
  name = _SPLIT_ALIASES.get(split, split)
  sizes = {"train": num_train, "dev": num_dev, "test": num_test}
  indices = split_range(split, sizes.get(name, 0))
  docs = generate(len(indices), seed, config, indices.start)
  report = LoadReport(source=f"synthetic:{name}")
  report.loaded = len(docs)
  report.stats["seed"] = seed
  report.stats["indices"] = f"{indices.start}..{indices.stop - 1}" if docs else "none"
  report.stats["words"] = sum(len(d) for d in docs)
  report.stats["entities"] = sum(len(d.entities or ()) for d in docs)
  return docs, report


def corpus_text(num_docs: int, seed: int = 0,
                config: SyntheticConfig | None = None) -> Iterator[str]:
  """Lines of text of the first `num_docs` training documents, for tokenizer training.

  One string per visual line (words of the line's segments, left to right).
  """
  config = config or SyntheticConfig()
  for index in range(num_docs):
    canvas = _layout(_streams(seed, index)[0], config)
    for line in noise.visual_lines(canvas.segments):
      yield " ".join(w for i in line for w in canvas.segments[i].words)
