"""The `Document` record: words, boxes, pages, segments and (optionally) gold entities.

Everything in flaxdoc reads and writes this one record. It is validated when it is
made, so that code further down (featurisation, geometry, models) can trust it:

* every per-word array has one entry per word;
* boxes are finite `[x0, y0, x1, y1]` in page pixels with `x0 <= x1`, `y0 <= y1`,
  inside their page (or clipped to it, by the explicit `box_policy="clip"`);
* words are non-empty strings of valid Unicode: no lone surrogates (`"\ud800"`
  is valid JSON but not valid text, and kills SentencePiece) and no control
  characters other than whitespace (or each one replaced by U+FFFD, by the
  explicit `text_policy="replace"`);
* entity labels belong to the document's label set (when one is given) and entity
  word indices are valid and not shared between entities.

Anything wrong raises `DocumentError` naming the document and the field. Repairs
happen only through a named policy, and every repair is logged and counted in
`Document.repairs`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import unicodedata
from typing import Iterable, Sequence

import numpy as np

log = logging.getLogger(__name__)

BOX_POLICIES = ("error", "clip")
TEXT_POLICIES = ("error", "replace")
REPLACEMENT_CHAR = "\ufffd"
_INT32_LIMIT = 2**31


class DocumentError(ValueError):
  """A document (or an input file) is malformed. The message names document and field."""

  def __init__(self, message: str, *, doc_id: str | None = None, field: str | None = None,
               source: str | None = None):
    where = []
    if source:
      where.append(f"file {source!r}")
    if doc_id is not None:
      where.append(f"document {doc_id!r}")
    if field:
      where.append(f"field {field!r}")
    prefix = ", ".join(where)
    super().__init__(f"{prefix}: {message}" if prefix else message)
    self.doc_id = doc_id
    self.field = field
    self.source = source


@dataclasses.dataclass(frozen=True)
class Entity:
  """A labelled span: a label and the (sorted, unique) indices of its words."""
  label: str
  words: tuple[int, ...]

  def __post_init__(self):
    object.__setattr__(self, "words", tuple(int(w) for w in self.words))


@dataclasses.dataclass(frozen=True)
class PageImage:
  """Where the picture of one page is: an image file (its frame `index`: TIFF pages) or a
  PDF page (`index` 0-based), and the page's size in the document's box units, so a
  picture can be drawn under the boxes (`flaxdoc.viz`) at the right scale."""
  path: str
  index: int
  width: float
  height: float


@dataclasses.dataclass(frozen=True, eq=False)
class Document:
  """One document. Build it with `Document.create(...)`, which validates.

  Attributes:
    id: a unique, human-readable identifier (file stem, dataset id...).
    words: the OCR units, `N` non-empty strings.
    boxes: `float32 [N, 4]`, `[x0, y0, x1, y1]` in page pixels.
    pages: `int32 [N]`, page index of each word, in `[0, P)`.
    page_sizes: `float32 [P, 2]`, `(width, height)` of each page in pixels.
    segments: `int32 [N]`, id of the OCR line / annotated block of each word.
      Ids are arbitrary non-negative integers; words of one segment share an id.
    entities: gold entities (or `None` for unlabelled documents).
    relations: pairs of entity indices (FUNSD `linking`), kept for later use.
    label_set: the labels entities may use (`None`: not checked).
    repairs: human-readable notes of what the box and text policies repaired.
    page_images: one `PageImage` per page (scans, OCR'd files), or `None`.
  """
  id: str
  words: tuple[str, ...]
  boxes: np.ndarray
  pages: np.ndarray
  page_sizes: np.ndarray
  segments: np.ndarray
  entities: tuple[Entity, ...] | None = None
  relations: tuple[tuple[int, int], ...] = ()
  label_set: tuple[str, ...] | None = None
  repairs: tuple[str, ...] = ()
  page_images: tuple[PageImage, ...] | None = None

  # ------------------------------------------------------------------ creation
  @classmethod
  def create(
      cls,
      id: str,  # pylint: disable=redefined-builtin
      words: Sequence[str],
      boxes,
      *,
      pages=None,
      page_sizes=None,
      segments=None,
      entities: Iterable[Entity | tuple[str, Sequence[int]]] | None = None,
      relations: Iterable[tuple[int, int]] = (),
      label_set: Sequence[str] | None = None,
      box_policy: str = "error",
      source: str | None = None,
      text_policy: str = "error",
      page_images: Sequence[PageImage] | None = None,
  ) -> "Document":
    """Validates its input and returns a `Document`, or raises `DocumentError`.

    Args:
      id: document id.
      words: `N` strings.
      boxes: `[N, 4]` numbers, page pixels.
      pages: `[N]` page index per word (default: all on page 0).
      page_sizes: `[P, 2]` (width, height) per page. Default: one page whose
        size is the bounding box of all words (from the origin).
      segments: `[N]` segment id per word (default: one segment per word).
      entities: `Entity` objects or `(label, word_indices)` pairs.
      relations: pairs of entity indices.
      label_set: if given, every entity label must be in it.
      box_policy: "error" (default) raises on boxes outside their page or
        inverted; "clip" swaps inverted coordinates and clips boxes to the page,
        logging each repair.
      source: file the document came from, used in error messages.
      text_policy: "error" (default) raises on a word holding a lone surrogate
        or a control character other than whitespace; "replace" replaces each
        such character with U+FFFD, recording the repair.
      page_images: one `PageImage` per page (the picture under the boxes).
    """
    doc_id = str(id)

    def err(msg, field):
      return DocumentError(msg, doc_id=doc_id, field=field, source=source)

    if box_policy not in BOX_POLICIES:
      raise ValueError(f"box_policy must be one of {BOX_POLICIES}, got {box_policy!r}")
    if text_policy not in TEXT_POLICIES:
      raise ValueError(f"text_policy must be one of {TEXT_POLICIES}, got {text_policy!r}")
    if not doc_id:
      raise err("empty document id", "id")

    # --- words
    if isinstance(words, (str, bytes)):
      raise err("must be a sequence of strings, got a single string", "words")
    try:
      words = tuple(words)
    except TypeError as e:
      raise err(f"must be a sequence of strings ({e})", "words") from None
    n = len(words)
    for i, w in enumerate(words):
      if not isinstance(w, str):
        raise err(f"word {i} is {type(w).__name__}, not str", "words")
      if not w.strip():
        raise err(f"word {i} is empty or whitespace ({w!r})", "words")
    repairs: list[str] = []
    bad_words = [i for i, w in enumerate(words) if invalid_char(w) is not None]
    if bad_words:
      i = bad_words[0]
      if text_policy == "error":
        ch = invalid_char(words[i])
        raise err(f"word {i} ({words[i]!r}) holds {describe_char(ch)}; read with "
                  "text_policy='replace' to replace such characters with U+FFFD", "words")
      words = tuple(repair_text(w) if k in set(bad_words) else w for k, w in enumerate(words))
      repairs.append(f"replaced invalid characters (lone surrogates, control characters) with "
                     f"U+FFFD in {len(bad_words)} words (first: word {i})")

    # --- boxes
    boxes = _as_array(boxes, np.float64, err, "boxes")
    if n == 0 and boxes.size == 0:
      boxes = boxes.reshape(0, 4)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
      raise err(f"must have shape [N, 4], got {list(boxes.shape)}", "boxes")
    if boxes.shape[0] != n:
      raise err(f"has {boxes.shape[0]} rows for {n} words", "boxes")
    # Checked after the float32 cast the record stores: 1e300 is finite in
    # float64 but overflows to inf in float32.
    with np.errstate(over="ignore"):
      bad = ~np.isfinite(boxes.astype(np.float32)).all(axis=1)
    if bad.any():
      i = int(np.argmax(bad))
      raise err(f"word {i} ({words[i]!r}) has a non-finite box {boxes[i].tolist()}", "boxes")

    # --- pages
    if pages is None:
      pages = np.zeros(n, np.int64)
    pages = _as_array(pages, None, err, "pages")
    if pages.shape != (n,):
      raise err(f"must have shape [{n}], got {list(pages.shape)}", "pages")
    if n and not np.issubdtype(pages.dtype, np.integer):
      if not np.isfinite(pages.astype(np.float64)).all() or (pages != np.round(pages)).any():
        raise err("page indices must be integers", "pages")
    if n and (np.abs(pages.astype(np.float64)) >= _INT32_LIMIT).any():
      raise err("page index does not fit in int32", "pages")
    pages = pages.astype(np.int64)
    if n and pages.min() < 0:
      raise err(f"negative page index {int(pages.min())}", "pages")

    # --- page sizes
    if page_sizes is None:
      num_pages = int(pages.max()) + 1 if n else 1
      page_sizes = np.zeros((num_pages, 2))
      for p in range(num_pages):
        sel = boxes[pages == p]
        if len(sel):
          page_sizes[p] = [max(sel[:, [0, 2]].max(), 1.0), max(sel[:, [1, 3]].max(), 1.0)]
        else:
          page_sizes[p] = [1.0, 1.0]
    page_sizes = _as_array(page_sizes, np.float64, err, "page_sizes")
    if page_sizes.ndim == 1 and page_sizes.shape == (2,):
      page_sizes = page_sizes[None]
    if page_sizes.ndim != 2 or page_sizes.shape[1] != 2 or page_sizes.shape[0] == 0:
      raise err(f"must have shape [P, 2] with P >= 1, got {list(page_sizes.shape)}", "page_sizes")
    if not np.isfinite(page_sizes).all() or (page_sizes <= 0).any():
      raise err(f"page sizes must be finite and positive, got {page_sizes.tolist()}", "page_sizes")
    if n and pages.max() >= len(page_sizes):
      raise err(f"page index {int(pages.max())} but only {len(page_sizes)} page sizes", "pages")

    # --- box geometry: inverted and out-of-page boxes
    inverted = (boxes[:, 0] > boxes[:, 2]) | (boxes[:, 1] > boxes[:, 3])
    if inverted.any():
      i = int(np.argmax(inverted))
      if box_policy == "error":
        raise err(f"word {i} ({words[i]!r}) has an inverted box {boxes[i].tolist()} "
                  "(need x0 <= x1 and y0 <= y1)", "boxes")
      boxes = boxes.copy()
      boxes[:, [0, 2]] = np.sort(boxes[:, [0, 2]], axis=1)
      boxes[:, [1, 3]] = np.sort(boxes[:, [1, 3]], axis=1)
      repairs.append(f"swapped the corners of {int(inverted.sum())} inverted boxes")
    if n:
      w = page_sizes[pages, 0]
      h = page_sizes[pages, 1]
      # Half a pixel of slack: OCR engines round box edges outward.
      outside = ((boxes[:, 0] < -0.5) | (boxes[:, 1] < -0.5) | (boxes[:, 2] > w + 0.5) |
                 (boxes[:, 3] > h + 0.5))
      if outside.any():
        i = int(np.argmax(outside))
        if box_policy == "error":
          raise err(f"word {i} ({words[i]!r}) has box {boxes[i].tolist()} outside its page "
                    f"{int(pages[i])} of size {page_sizes[pages[i]].tolist()}", "boxes")
        repairs.append(f"clipped {int(outside.sum())} boxes to their page")
      boxes = boxes.copy()
      boxes[:, 0] = np.clip(boxes[:, 0], 0, w)
      boxes[:, 2] = np.clip(boxes[:, 2], 0, w)
      boxes[:, 1] = np.clip(boxes[:, 1], 0, h)
      boxes[:, 3] = np.clip(boxes[:, 3], 0, h)

    # --- segments
    if segments is None:
      segments = np.arange(n)
    segments = _as_array(segments, None, err, "segments")
    if segments.shape != (n,):
      raise err(f"must have shape [{n}], got {list(segments.shape)}", "segments")
    if n and not np.issubdtype(segments.dtype, np.integer):
      if not np.isfinite(segments.astype(np.float64)).all() or (segments != np.round(segments)).any():
        raise err("segment ids must be integers", "segments")
    if n and (np.abs(segments.astype(np.float64)) >= _INT32_LIMIT).any():
      raise err("segment id does not fit in int32", "segments")
    segments = segments.astype(np.int64)
    if n and segments.min() < 0:
      raise err(f"negative segment id {int(segments.min())}", "segments")

    # --- entities
    if label_set is not None:
      label_set = tuple(str(l) for l in label_set)
    ents = None
    if entities is not None:
      ents = []
      owner = {}
      for k, e in enumerate(entities):
        if not isinstance(e, Entity):
          try:
            label, idx = e
          except (TypeError, ValueError):
            raise err(f"entity {k} must be an Entity or a (label, words) pair, got {e!r}",
                      "entities") from None
          try:
            idx = [int(i) for i in idx]
          except (TypeError, ValueError):
            raise err(f"entity {k} has non-integer word indices {idx!r}", "entities") from None
          e = Entity(str(label), tuple(sorted(set(idx))))
        if not e.label or not isinstance(e.label, str):
          raise err(f"entity {k} has an empty label", "entities")
        if label_set is not None and e.label not in label_set:
          raise err(f"entity {k} has unknown label {e.label!r} (known: {list(label_set)})",
                    "entities")
        if not e.words:
          raise err(f"entity {k} ({e.label}) has no words", "entities")
        if list(e.words) != sorted(set(e.words)):
          e = Entity(e.label, tuple(sorted(set(e.words))))
        for i in e.words:
          if not 0 <= i < n:
            raise err(f"entity {k} ({e.label}) refers to word {i}, but there are {n} words",
                      "entities")
          if i in owner:
            raise err(f"word {i} ({words[i]!r}) belongs to entities {owner[i]} and {k}",
                      "entities")
          owner[i] = k
        ents.append(e)
      ents = tuple(ents)

    rels = []
    for r in relations:
      try:
        a, b = (int(x) for x in r)
      except (TypeError, ValueError):
        raise err(f"relation {r!r} is not a pair of entity indices", "relations") from None
      num_ents = len(ents) if ents is not None else 0
      if not (0 <= a < num_ents and 0 <= b < num_ents):
        raise err(f"relation {(a, b)} refers to a missing entity (there are {num_ents})",
                  "relations")
      rels.append((a, b))

    if page_images is not None:
      page_images = tuple(page_images)
      if len(page_images) != len(page_sizes):
        raise err(f"has {len(page_images)} entries for {len(page_sizes)} pages", "page_images")
      for k, im in enumerate(page_images):
        if not isinstance(im, PageImage):
          raise err(f"entry {k} is {type(im).__name__}, not a PageImage", "page_images")

    for note in repairs:
      log.info("document %r: %s", doc_id, note)
    return cls(
        id=doc_id,
        words=words,
        boxes=boxes.astype(np.float32),
        pages=pages.astype(np.int32),
        page_sizes=page_sizes.astype(np.float32),
        segments=segments.astype(np.int32),
        entities=ents,
        relations=tuple(rels),
        label_set=label_set,
        repairs=tuple(repairs),
        page_images=page_images,
    )

  # --------------------------------------------------------------- accessors
  def __len__(self) -> int:
    return len(self.words)

  @property
  def num_pages(self) -> int:
    return int(self.page_sizes.shape[0])

  def normalized_boxes(self) -> np.ndarray:
    """`int32 [N, 4]` boxes in LayoutLM units: integers in [0, 1000] per page axis."""
    if not len(self):
      return np.zeros((0, 4), np.int32)
    size = self.page_sizes[self.pages]  # [N, 2]
    scale = np.concatenate([size, size], axis=1)
    return np.clip(np.round(self.boxes / scale * 1000.0), 0, 1000).astype(np.int32)

  def word_labels(self) -> list[str | None]:
    """The entity label of every word, or None for words outside all entities."""
    out: list[str | None] = [None] * len(self)
    for e in self.entities or ():
      for i in e.words:
        out[i] = e.label
    return out

  def entity_text(self, entity: Entity) -> str:
    return " ".join(self.words[i] for i in entity.words)

  def replace(self, **changes) -> "Document":
    """A validated copy with some fields changed (as `Document.create` arguments)."""
    args = dict(id=self.id, words=self.words, boxes=self.boxes, pages=self.pages,
                page_sizes=self.page_sizes, segments=self.segments, entities=self.entities,
                relations=self.relations, label_set=self.label_set,
                page_images=self.page_images)
    args.update(changes)
    return Document.create(**args)

  def __repr__(self) -> str:
    ents = "unlabelled" if self.entities is None else f"{len(self.entities)} entities"
    return f"Document(id={self.id!r}, {len(self)} words, {self.num_pages} pages, {ents})"


def _as_array(value, dtype, err, field) -> np.ndarray:
  try:
    arr = np.asarray(value, dtype=dtype)
  except (TypeError, ValueError, OverflowError) as e:
    raise err(f"cannot be read as numbers ({e})", field) from None
  if arr.dtype == object or arr.dtype.kind in "USV":
    raise err("cannot be read as numbers", field)
  if dtype is None and arr.dtype.kind == "b":
    arr = arr.astype(np.int64)
  if arr.dtype.kind == "f" and field in ("pages", "segments"):
    if arr.size and not np.isfinite(arr).all():
      raise err("contains NaN or inf", field)
  return arr


# Lone surrogates, and the control characters (category Cc) that are not whitespace
# to Python's str.isspace (\t \n \v \f \r, \x1c-\x1f and \x85 are, and stay allowed).
_INVALID_TEXT = re.compile("[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f\ud800-\udfff]")


def invalid_char(text: str) -> str | None:
  """The first character of `text` that is a lone surrogate or a non-whitespace control, or None."""
  m = _INVALID_TEXT.search(text)
  return m.group() if m else None


def describe_char(ch: str) -> str:
  kind = "a lone surrogate" if unicodedata.category(ch) == "Cs" else "a control character"
  return f"{kind} (U+{ord(ch):04X}), not valid text"


def repair_text(text: str) -> str:
  """`text` with each lone surrogate and non-whitespace control character replaced by U+FFFD."""
  return _INVALID_TEXT.sub(REPLACEMENT_CHAR, text)


def is_finite_number(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
