"""`LoadReport`: what a reader loaded, skipped or repaired, and why.

Readers never drop anything silently: every skipped document, word or entity is
recorded here with its reason, and `summary()` prints a readable account.
"""

from __future__ import annotations

import collections
import dataclasses
import logging

log = logging.getLogger(__name__)


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

  def skip_document(self, where: str, reason: str):
    self.skipped_documents.append((where, reason))
    log.warning("%s: skipped document %s: %s", self.source, where, reason)

  def skip_word(self, where: str, reason: str):
    self.skipped_words.append((where, reason))

  def skip_entity(self, where: str, reason: str):
    self.skipped_entities.append((where, reason))

  def repair(self, where: str, what: str):
    self.repairs.append((where, what))

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
    return "\n".join(lines)

  def __str__(self) -> str:
    return self.summary()
