"""`Canvas`: places text segments on pages with a simple font metric, and paginates.

A segment is one OCR line piece (a key, a value, a table cell, an address line):
its words share a font size and a baseline, and it carries one label (or none),
so an entity never crosses a segment boundary and every reading order that keeps
segments whole keeps entities contiguous.

Geometry is a plain font model: a character is `char_factor * font_size` wide
(about 0.55 em), a space half a character, a word box spans its characters and
one font size in height. Every segment is kept inside its page: a segment that
would run over the edge is shifted back and, if still too wide, set in a
condensed width (as a narrow font would be) rather than clipped.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

LEADING = 1.4  # line height / font size
SPACE = 0.5    # space width / character width
EDGE = 2.0     # pixels kept free at the page edge


@dataclasses.dataclass
class Segment:
  """One placed segment. `x` is its left edge, `y` the top of its words."""
  words: list[str]
  x: float
  y: float
  font_size: float
  char_width: float
  page: int
  block: int
  label: str | None
  # Index (in `Canvas.segments`) of the key this segment is the value of, if any:
  # the generator's key -> value relations (`SyntheticConfig.link_keys`).
  key: int | None = None


class Canvas:
  """Segments on a flow of pages: a cursor `y` moves down, `new_page` starts the next.

  Attributes:
    width, height: page size in pixels (all pages the same; `page_heights` may
      shrink the last ones for receipts).
    left, right, top, bottom: the content area (margins excluded).
    font_size: the body font size in pixels.
    char_factor: character width / font size for this document's font.
    y: the flow cursor (top of the next line) on the current page.
    page: the current page index.
    segments: every placed segment, in placement order (the logical order).
  """

  def __init__(self, width: float, height: float, margins: tuple[float, float, float, float],
               font_size: float, char_factor: float = 0.55):
    left, top, right, bottom = margins
    self.width, self.height = float(width), float(height)
    self.left, self.top = float(left), float(top)
    self.right, self.bottom = float(width - right), float(height - bottom)
    self.font_size = float(font_size)
    self.char_factor = float(char_factor)
    self.y = self.top
    self.page = 0
    self.block = 0
    self.segments: list[Segment] = []
    self.num_words = 0
    self.page_heights = [self.height]
    # Called after each automatic page break (e.g. to repeat a table header).
    self.on_new_page: Callable[["Canvas"], None] | None = None

  # ------------------------------------------------------------------ metrics
  def char_width(self, font_size: float | None = None) -> float:
    return (font_size or self.font_size) * self.char_factor

  def text_width(self, words: Sequence[str], font_size: float | None = None) -> float:
    """Width of `words` set on one line, in pixels."""
    if not words:
      return 0.0
    chars = sum(map(len, words)) + SPACE * (len(words) - 1)
    return chars * (font_size or self.font_size) * self.char_factor

  def line_height(self, font_size: float | None = None) -> float:
    return (font_size or self.font_size) * LEADING

  @property
  def content_width(self) -> float:
    return self.right - self.left

  # ---------------------------------------------------------------- placement
  def new_block(self) -> int:
    """Starts a new block (a layout region: an address block, a table part...)."""
    self.block += 1
    return self.block

  def put(self, text: str | Sequence[str], x: float, y: float | None = None, *,
          font_size: float | None = None, label: str | None = None,
          align: str = "left", page: int | None = None,
          key: int | None = None) -> tuple[float, float]:
    """Places one segment; returns its `(left, right)` x extent.

    Args:
      text: the segment's text (split on whitespace) or its words.
      x: the anchor: left edge (`align="left"`), right edge ("right") or centre ("center").
      y: top of the line (default: the cursor `self.y`).
      font_size: default the body size.
      label: the entity label of the whole segment, or None (O).
      align: how `x` anchors the segment.
      page: default the current page (footers are added to earlier pages).
      key: index of this value's key segment (`last_segment` after placing the key).
    """
    words = text.split() if isinstance(text, str) else list(text)
    if not words:
      return x, x
    fs = font_size or self.font_size
    cw = fs * self.char_factor
    chars = sum(map(len, words)) + SPACE * (len(words) - 1)
    w = chars * cw
    if align == "right":
      x0 = x - w
    elif align == "center":
      x0 = x - w / 2
    else:
      x0 = x
    # Keep the segment on the page: shift it back, then condense it if needed.
    if x0 + w > self.width - EDGE:
      x0 = self.width - EDGE - w
    if x0 < EDGE:
      x0 = EDGE
      if x0 + w > self.width - EDGE:
        cw = (self.width - 2 * EDGE) / chars
        w = chars * cw
    top = self.y if y is None else y
    page = self.page if page is None else page
    self.segments.append(Segment(words, x0, top, fs, cw, page, self.block, label, key))
    self.num_words += len(words)
    return x0, x0 + w

  @property
  def last_segment(self) -> int:
    """Index of the segment placed last (a key, for the value placed next)."""
    return len(self.segments) - 1

  def advance(self, lines: float = 1.0, font_size: float | None = None):
    self.y += lines * self.line_height(font_size)

  # --------------------------------------------------------------- pagination
  def fits(self, height: float) -> bool:
    return self.y + height <= self.bottom

  def new_page(self, *, repeat: bool = True):
    """Moves the cursor to the top of a new page (and runs `on_new_page`)."""
    self.page += 1
    self.page_heights.append(self.height)
    self.y = self.top
    self.new_block()
    if repeat and self.on_new_page is not None:
      self.on_new_page(self)
      self.new_block()

  def shrink_pages(self, bottom_margin: float):
    """Receipts: cuts every page to its content plus `bottom_margin`."""
    lowest = [0.0] * len(self.page_heights)
    for s in self.segments:
      lowest[s.page] = max(lowest[s.page], s.y + s.font_size)
    self.page_heights = [min(h, low + bottom_margin) for h, low in zip(self.page_heights, lowest)]

  @property
  def num_pages(self) -> int:
    return len(self.page_heights)

  # ------------------------------------------------------------------- output
  def word_boxes(self, segment: Segment) -> list[list[float]]:
    """The `[x0, y0, x1, y1]` box of each word of a segment."""
    cw, x, y0 = segment.char_width, segment.x, segment.y
    y1 = y0 + segment.font_size
    boxes = []
    for w in segment.words:
      x1 = x + len(w) * cw
      boxes.append([x, y0, x1, y1])
      x = x1 + SPACE * cw
    return boxes
