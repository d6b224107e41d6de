"""`LoadReport`: what a reader loaded, skipped or repaired, and why.

Readers never drop anything silently: every skipped document, word or entity is
recorded here with its reason, and `summary()` prints a readable account.
"""

from __future__ import annotations

import collections
import dataclasses
import logging

log = logging.getLogger(__name__)

# Where a page's words came from, in `LoadReport.page_sources`: the PDF's own text
# layer, or else the name of the OCR engine that read the page's picture.
TEXT_LAYER = "text layer"
# Documents with OCR'd pages a mixed summary names one by one.
MAX_LISTED_DOCUMENTS = 20


def describe_page_sources(sources) -> str:
  """Per-page sources in words: "3 pages: 2 from the PDF's text layer, 1 by tesseract"."""
  sources = list(sources)
  counts = collections.Counter(sources)
  n = len(sources)
  if not n:
    return "no pages"
  # The text layer first (exact words), then the engines in the order pages met them.
  names = sorted(dict.fromkeys(sources), key=lambda s: s != TEXT_LAYER)
  what = {s: "from the PDF's text layer" if s == TEXT_LAYER else f"by {s}" for s in names}
  if len(names) == 1:
    return f"1 page, {what[names[0]]}" if n == 1 else f"{n} pages, all {what[names[0]]}"
  return f"{n} pages: " + ", ".join(f"{counts[s]} {what[s]}" for s in names)


@dataclasses.dataclass
class LoadReport:
  """Counts and reasons collected while reading one dataset split."""
  source: str
  loaded: int = 0
  # (where, reason) for each skipped document / word / entity.
  skipped_documents: list[tuple[str, str]] = dataclasses.field(default_factory=list)
  skipped_words: list[tuple[str, str]] = dataclasses.field(default_factory=list)
  skipped_entities: list[tuple[str, str]] = dataclasses.field(default_factory=list)
  repairs: list[tuple[str, str]] = dataclasses.field(default_factory=list)
  # Free-form statistics a reader wants to report (e.g. SROIE alignment rates).
  stats: dict = dataclasses.field(default_factory=dict)
  # Document id -> where each page's words came from: TEXT_LAYER or an OCR engine's name
  # (PDF and OCR readers), so that OCR'd pages, the less exact ones, can be told apart.
  page_sources: dict[str, list[str]] = dataclasses.field(default_factory=dict)

  def skip_document(self, where: str, reason: str):
    self.skipped_documents.append((where, reason))
    log.warning("%s: skipped document %s: %s", self.source, where, reason)

  def skip_word(self, where: str, reason: str):
    self.skipped_words.append((where, reason))

  def skip_entity(self, where: str, reason: str):
    self.skipped_entities.append((where, reason))

  def repair(self, where: str, what: str):
    self.repairs.append((where, what))

  def record_page_sources(self, doc_id: str, sources) -> None:
    self.page_sources[doc_id] = list(sources)

  @staticmethod
  def _reasons(items) -> dict[str, int]:
    return dict(collections.Counter(reason for _, reason in items).most_common())

  def summary(self) -> str:
    lines = [f"{self.source}: loaded {self.loaded} documents"]
    for name, items in (("documents", self.skipped_documents), ("words", self.skipped_words),
                        ("entities", self.skipped_entities), ("repairs", self.repairs)):
      if items:
        label = "repaired" if name == "repairs" else f"skipped {name}"
        lines.append(f"  {label}: {len(items)}")
        for reason, count in self._reasons(items).items():
          lines.append(f"    {count:6d} x {reason}")
    for key, value in self.stats.items():
      lines.append(f"  {key}: {value}")
    if self.page_sources:
      every = [s for sources in self.page_sources.values() for s in sources]
      lines.append(f"  words from: {describe_page_sources(every)}")
      if len(set(every)) > 1:  # mixed: say which documents' pages were OCR'd
        ocrd = [(d, s) for d, s in self.page_sources.items() if set(s) != {TEXT_LAYER}]
        # The first few by name (a corpus of thousands would drown the log); the count says
        # how many more.
        for doc_id, sources in ocrd[:MAX_LISTED_DOCUMENTS]:
          lines.append(f"    {doc_id}: {describe_page_sources(sources)}")
        if len(ocrd) > MAX_LISTED_DOCUMENTS:
          lines.append(f"    ... and {len(ocrd) - MAX_LISTED_DOCUMENTS} more documents with "
                       "OCR'd pages")
    return "\n".join(lines)

  def __str__(self) -> str:
    return self.summary()
