"""Reading orders and OCR noise: what turns a clean layout into an OCR engine's output.

Reading orders (which order the segments come in):
* `logical_order`: block by block, as a born-digital text layer gives it
  (side-by-side blocks one after the other, a key then its value).
* `shuffled_block_order`: the blocks of each page in random order, each block's
  own order kept (an OCR layout analysis that returns regions in any order).
* `line_order`: the naive OCR order, top to bottom by visual line, left to right
  within a line: the lines of side-by-side blocks interleave and a strip of keys
  comes before the strip of their values.

Every order keeps segments whole, so an entity (always one whole segment) stays
contiguous in the word sequence.

`ocr_segment` damages one segment's words the way OCR does (character
confusions and deletions, merged and split words, box jitter), keeping the
segment's label valid for all its words.
"""

from __future__ import annotations

import random
from typing import Sequence

from flaxdoc.data.synthetic.canvas import Segment

# Typical OCR confusions (both directions where they are symmetric).
_CONFUSIONS = {
    "0": "O", "O": "0", "1": "l", "l": "1", "I": "1", "5": "S", "S": "5", "8": "B", "B": "8",
    "e": "c", "c": "e", "m": "rn", "a": "o", "o": "a", ",": ".", ".": ",", "2": "Z", "Z": "2",
    "6": "b", "g": "9", "9": "g", "u": "v", "n": "h", "i": "l", "t": "f", "E": "F", "D": "O",
    "G": "6", "7": "T", "/": "1", "-": "~", "h": "b", "rn": "m",
}
_RANDOM_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,-"


def logical_order(segments: Sequence[Segment]) -> list[int]:
  """Placement order, page by page."""
  return sorted(range(len(segments)), key=lambda i: segments[i].page)


def shuffled_block_order(segments: Sequence[Segment], rng: random.Random) -> list[int]:
  """The blocks of every page in a random order; segments inside a block keep theirs."""
  pages: dict[int, dict[int, list[int]]] = {}
  for i in logical_order(segments):
    s = segments[i]
    pages.setdefault(s.page, {}).setdefault(s.block, []).append(i)
  order = []
  for page in sorted(pages):
    blocks = list(pages[page].values())
    rng.shuffle(blocks)
    for b in blocks:
      order.extend(b)
  return order


def visual_lines(segments: Sequence[Segment]) -> list[list[int]]:
  """Segments grouped into visual lines (page by page, top to bottom, left to right).

  A segment joins the current line when its vertical centre is within half a
  font size of the line's first segment, as a simple OCR line finder would do.
  """
  lines: list[list[int]] = []
  by_page: dict[int, list[int]] = {}
  for i, s in enumerate(segments):
    by_page.setdefault(s.page, []).append(i)
  for page in sorted(by_page):
    idx = sorted(by_page[page], key=lambda i: segments[i].y + segments[i].font_size / 2)
    current: list[int] = []
    center = 0.0
    for i in idx:
      s = segments[i]
      c = s.y + s.font_size / 2
      if current and c - center > 0.5 * min(s.font_size, segments[current[0]].font_size):
        lines.append(sorted(current, key=lambda j: segments[j].x))
        current = []
      if not current:
        center = c
      current.append(i)
    if current:
      lines.append(sorted(current, key=lambda j: segments[j].x))
  return lines


def line_order(segments: Sequence[Segment]) -> list[int]:
  """The naive OCR reading order: visual lines top to bottom, each left to right."""
  return [i for line in visual_lines(segments) for i in line]


# --------------------------------------------------------------------- OCR noise
def _substitute(word: str, rng: random.Random) -> str:
  p = int(rng.random() * len(word))
  if p + 1 < len(word) and word[p:p + 2] == "rn":
    return word[:p] + "m" + word[p + 2:]
  rep = _CONFUSIONS.get(word[p])
  if rep is None or rng.random() < 0.2:
    rep = _RANDOM_CHARS[int(rng.random() * len(_RANDOM_CHARS))]
  return word[:p] + rep + word[p + 1:]


def ocr_segment(words: list[str], boxes: list[list[float]], rng: random.Random, rate: float,
                jitter: float, page_size: tuple[float, float]) -> tuple[list[str], list[list[float]]]:
  """One segment's words and boxes as a noisy OCR engine might return them.

  Each word is damaged with probability `rate`: a character substituted by a
  look-alike (45%), a character deleted (15%), the word split in two (20%) or
  merged with the next word of the segment (20%). Boxes keep the printed
  extent of their text (a split divides its box in proportion, a merge takes
  the union); then every box edge moves by up to `jitter` pixels, staying on
  the page. Words never become empty.
  """
  out_words: list[str] = []
  out_boxes: list[list[float]] = []
  i, n = 0, len(words)
  while i < n:
    w, b = words[i], list(boxes[i])
    if rng.random() < rate:
      op = rng.random()
      if op < 0.45:
        w = _substitute(w, rng)
      elif op < 0.6:
        if len(w) > 1:
          p = int(rng.random() * len(w))
          w = w[:p] + w[p + 1:]
      elif op < 0.8:
        if len(w) >= 4:
          k = 1 + int(rng.random() * (len(w) - 1))
          xm = b[0] + (b[2] - b[0]) * k / len(w)
          out_words.append(w[:k])
          out_boxes.append([b[0], b[1], xm, b[3]])
          w, b = w[k:], [xm, b[1], b[2], b[3]]
      elif i + 1 < n:
        nb = boxes[i + 1]
        w = w + words[i + 1]
        b = [min(b[0], nb[0]), min(b[1], nb[1]), max(b[2], nb[2]), max(b[3], nb[3])]
        i += 1
    out_words.append(w)
    out_boxes.append(b)
    i += 1
  if jitter > 0:
    width, height = page_size
    for b in out_boxes:
      x0 = min(max(b[0] + (2 * rng.random() - 1) * jitter, 0.0), width)
      x1 = min(max(b[2] + (2 * rng.random() - 1) * jitter, 0.0), width)
      y0 = min(max(b[1] + (2 * rng.random() - 1) * jitter, 0.0), height)
      y1 = min(max(b[3] + (2 * rng.random() - 1) * jitter, 0.0), height)
      b[0], b[2] = min(x0, x1), max(x0, x1)
      b[1], b[3] = min(y0, y1), max(y0, y1)
  return out_words, out_boxes
