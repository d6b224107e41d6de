"""A PDF page's text layer -> words with boxes on the displayed page, and their lines.

The geometry and text half of `flaxdoc.data.pdf` (which opens files, checks them and
assembles `Document`s; its docstring says what the words, boxes and orders are):

* `PageFrame` / `page_frame(page)`: PDF user space -> the displayed page (CropBox,
  `/Rotate`), in points.
* `page_words(pdfium, page, frame)`: PDFium's characters -> words (`PageWords`),
  their tight and loose boxes, uprightness and PDFium's line breaks (`no_words()`:
  an empty page).
* `layout_segments` / `stream_segments`: words -> lines (segments) in reading order.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import unicodedata

import numpy as np

# PDFium marks the hyphen of a word broken across two lines with U+0002.
_PDFIUM_HYPHEN = "\x02"
# Text further than this (degrees) from upright on the displayed page is
# "rotated": no line grouping by rows for it.
_UPRIGHT_TOLERANCE_DEG = 10.0


# --------------------------------------------------------------------------- geometry
@dataclasses.dataclass(frozen=True)
class PageFrame:
  """Maps PDF user space (points, y up) to the displayed page (points, y down).

  `left, bottom, right, top` is the visible page box (CropBox within MediaBox);
  `rotation` the page's clockwise `/Rotate` in {0, 90, 180, 270}.
  """
  left: float
  bottom: float
  right: float
  top: float
  rotation: int

  @property
  def size(self) -> tuple[float, float]:
    """Displayed (width, height) in points: swapped for quarter turns."""
    w, h = self.right - self.left, self.top - self.bottom
    return (h, w) if self.rotation in (90, 270) else (w, h)

  def to_display(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points `(x, y)` in user space -> displayed `(x', y')`, origin top-left."""
    w, h = self.right - self.left, self.top - self.bottom
    u, v = x - self.left, self.top - y  # unrotated, y down
    if self.rotation == 0:
      return u, v
    if self.rotation == 90:  # clockwise: the top-left corner goes to the top-right
      return h - v, u
    if self.rotation == 180:
      return w - u, h - v
    return v, w - u  # 270

  def boxes_to_display(self, boxes: np.ndarray) -> np.ndarray:
    """`[n, 4]` user-space `(left, bottom, right, top)` -> displayed `[x0, y0, x1, y1]`."""
    xa, ya = self.to_display(boxes[:, 0], boxes[:, 1])
    xb, yb = self.to_display(boxes[:, 2], boxes[:, 3])
    return np.stack([np.minimum(xa, xb), np.minimum(ya, yb), np.maximum(xa, xb),
                     np.maximum(ya, yb)], axis=1)


def page_frame(page) -> PageFrame:
  left, bottom, right, top = (float(v) for v in page.get_bbox())
  rotation = int(page.get_rotation()) % 360
  return PageFrame(left, bottom, right, top, rotation)


# --------------------------------------------------------------------------- characters -> words
@dataclasses.dataclass
class PageWords:
  """The words of one page in PDFium's order, in displayed points (struct of arrays)."""
  texts: list[str]
  tight: np.ndarray  # [W, 4] union of the glyph boxes
  loose: np.ndarray  # [W, 4] union of the font-height cells
  upright: np.ndarray  # [W] bool: upright on the displayed page
  stream_break: np.ndarray  # [W] bool: PDFium (or a jump) starts a new line here

  def __len__(self) -> int:
    return len(self.texts)

  def select(self, keep: np.ndarray) -> "PageWords":
    return PageWords([t for t, k in zip(self.texts, keep) if k], self.tight[keep],
                      self.loose[keep], self.upright[keep], self.stream_break[keep])


def no_words() -> PageWords:
  return PageWords([], np.zeros((0, 4)), np.zeros((0, 4)), np.zeros(0, bool), np.zeros(0, bool))


def _page_codes(raw, tp, n: int) -> np.ndarray:
  """`int64 [n]` Unicode code point of each PDFium character (0 when it has none).

  One `FPDFText_GetText` call instead of `n` `FPDFText_GetUnicode` calls (ctypes
  calls cost microseconds each). That call returns UTF-16 and spells the
  end-of-line hyphen U+FFFE; when the page has characters beyond the BMP
  (surrogate pairs) the per-character call is used instead.
  """
  buf = (ctypes.c_uint16 * (n + 1))()
  written = raw.FPDFText_GetText(tp, 0, n, buf)
  units = np.frombuffer(buf, np.uint16)[:max(written - 1, 0)].astype(np.int64)
  if len(units) == n and not ((units >= 0xD800) & (units <= 0xDFFF)).any():
    units[units == 0xFFFE] = ord(_PDFIUM_HYPHEN)
    return units
  return np.asarray([raw.FPDFText_GetUnicode(tp, i) for i in range(n)], np.int64)


# Per code point: 0 = letter (kept), 1 = whitespace, 2 = line break, 3 = PDFium's
# end-of-line hyphen, 4 = invisible control/format character (dropped).
_KEEP, _SPACE, _NEWLINE, _HYPHEN, _DROP = range(5)
_LINE_BREAKS = frozenset("\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


def _char_class(code: int) -> int:
  if code <= 0 or code >= 0x110000:
    return _SPACE  # no Unicode value: treated as a separator, like a space
  ch = chr(code)
  if ch == _PDFIUM_HYPHEN:
    return _HYPHEN
  if ch in _LINE_BREAKS:
    return _NEWLINE
  if ch.isspace() or ch == "\u200b":  # a zero-width space separates words too
    return _SPACE
  if unicodedata.category(ch) in ("Cc", "Cf", "Cs"):
    return _DROP
  return _KEEP


def page_words(pdfium, page, frame: PageFrame) -> tuple[PageWords, int]:
  """The words of one page in PDFium's order, and the number of dropped control characters."""
  raw = pdfium.raw
  textpage = page.get_textpage()
  try:
    tp = textpage.raw
    n = raw.FPDFText_CountChars(tp)
    if n <= 0:
      return no_words(), 0
    codes = _page_codes(raw, tp, n)
    classes = {code: _char_class(code) for code in set(codes.tolist())}
    cls = np.asarray([classes[code] for code in codes.tolist()], np.int8)  # [n]
    # The end-of-line hyphen is kept as "-": it belongs to the first piece.
    kept = np.flatnonzero((cls == _KEEP) | (cls == _HYPHEN))  # [m] PDFium indices
    m = len(kept)
    if m == 0:
      return no_words(), int((cls == _DROP).sum())
    # The per-character ctypes calls dominate the run time: keep the loop bare.
    l, r, b, t = ctypes.c_double(), ctypes.c_double(), ctypes.c_double(), ctypes.c_double()
    get_box, get_loose = raw.FPDFText_GetCharBox, raw.FPDFText_GetLooseCharBox
    tight_list = []
    add = tight_list.append
    nan_box = (math.nan,) * 4
    rects = (raw.FS_RECTF * m)()  # float32 (left, top, right, bottom) per character
    loose_failed = []
    for j, i in enumerate(kept.tolist()):
      if get_box(tp, i, l, r, b, t):
        add((l.value, b.value, r.value, t.value))
      else:
        add(nan_box)
      if not get_loose(tp, i, rects[j]):
        loose_failed.append(j)
    tight = np.asarray(tight_list, np.float64)  # [m, 4] user space (left, bottom, right, top)
    loose = np.frombuffer(rects, np.float32).reshape(m, 4)[:, [0, 3, 2, 1]].astype(np.float64)
    loose[loose_failed] = math.nan
    # A character PDFium has only one kind of box for borrows it for the other;
    # one with neither makes its word's box NaN, and `read_pdf` skips that word.
    tight = np.where(np.isnan(tight), loose, tight)
    loose = np.where(np.isnan(loose), tight, loose)

    # Word and line boundaries between consecutive kept characters, from the
    # separators PDFium put between them (counted with prefix sums).
    # Dropped characters (soft hyphens, zero-width joiners...) do not split words.
    is_sep = ((cls == _SPACE) | (cls == _NEWLINE)).astype(np.int64)
    is_break = (cls == _NEWLINE).astype(np.int64)
    hyphen = cls[kept] == _HYPHEN  # [m]
    sep_count = np.concatenate([[0], np.cumsum(is_sep)])
    break_count = np.concatenate([[0], np.cumsum(is_break)])
    # Separators strictly between kept[j-1] and kept[j].
    sep_between = sep_count[kept[1:]] - sep_count[kept[:-1] + 1] > 0  # [m-1]
    break_between = break_count[kept[1:]] - break_count[kept[:-1] + 1] > 0
    after_hyphen = hyphen[:-1]
    run_start = np.concatenate([[True], sep_between | after_hyphen])  # [m]
    line_start = np.concatenate([[True], break_between | after_hyphen])

    tight = frame.boxes_to_display(tight)
    loose = frame.boxes_to_display(loose)
    # Is each run upright on the displayed page? One angle per run (not per
    # character). PDFium's angle turns clockwise as seen on the unrotated page
    # (matplotlib's `rotation=90`, counter-clockwise, reads 270 degrees), and
    # /Rotate turns the page clockwise too, so the two add up.
    starts = np.flatnonzero(run_start)
    angles = np.degrees([raw.FPDFText_GetCharAngle(tp, int(i)) for i in kept[starts]])
  finally:
    textpage.close()
  shown = (angles + frame.rotation) % 360.0
  run_upright = np.minimum(shown, 360.0 - shown) <= _UPRIGHT_TOLERANCE_DEG  # [runs]
  upright = np.repeat(run_upright, np.diff(np.append(starts, m)))  # [m]

  # Inside an upright run, a character on another line (font cells overlapping
  # by less than a third of the smaller height: superscripts still continue) or
  # more than half a cell to the left of its predecessor starts a new word.
  prev, cur = loose[:-1], loose[1:]
  height = np.minimum(prev[:, 3] - prev[:, 1], cur[:, 3] - cur[:, 1])
  overlap = np.minimum(prev[:, 3], cur[:, 3]) - np.maximum(prev[:, 1], cur[:, 1])
  jump = (height > 0) & ((overlap < height / 3) | (cur[:, 0] < prev[:, 0] - height / 2))
  jump = np.concatenate([[False], jump & upright[1:]])
  word_start = run_start | jump
  line_start = line_start | jump

  chars = [chr(c) for c in codes[kept].tolist()]
  for j in np.flatnonzero(hyphen):
    chars[j] = "-"
  starts = np.flatnonzero(word_start)
  ends = np.append(starts[1:], m)
  words = PageWords(
      texts=["".join(chars[s:e]) for s, e in zip(starts.tolist(), ends.tolist())],
      tight=np.concatenate([np.minimum.reduceat(tight[:, :2], starts),
                            np.maximum.reduceat(tight[:, 2:], starts)], axis=1),
      loose=np.concatenate([np.minimum.reduceat(loose[:, :2], starts),
                            np.maximum.reduceat(loose[:, 2:], starts)], axis=1),
      upright=upright[starts], stream_break=line_start[starts])
  return words, int((cls == _DROP).sum())


# ------------------------------------------------------------------- words -> lines and order
def _same_row(a, b) -> bool:
  """Loose boxes on one text row: vertical overlap >= half the smaller height."""
  height = min(a[3] - a[1], b[3] - b[1])
  overlap = min(a[3], b[3]) - max(a[1], b[1])
  return overlap >= 0.5 * height if height > 0 else overlap >= 0


def _gap_breaks(a, b, segment_gap: float) -> bool:
  """Whether the horizontal gap from loose box `a` to `b` splits their line."""
  height = max(a[3] - a[1], b[3] - b[1])
  return b[0] - a[2] > segment_gap * height


def layout_segments(words: PageWords, segment_gap: float) -> list[list[int]]:
  """Segments (lists of word indices) read top-to-bottom, then left-to-right."""
  loose = words.loose.tolist()  # plain floats: this loop is scalar work
  centre = [(b[1] + b[3]) / 2 for b in loose]
  upright = [i for i in range(len(words)) if words.upright[i]]
  upright.sort(key=lambda i: (centre[i], loose[i][0]))
  rows: list[list[int]] = []
  for i in upright:
    # Compare with the row's first word (not its last) so rows cannot drift down.
    if rows and _same_row(loose[rows[-1][0]], loose[i]):
      rows[-1].append(i)
    else:
      rows.append([i])
  units: list[tuple[float, float, list[int]]] = []  # (row centre, x0, word indices)
  for row in rows:
    row.sort(key=lambda i: (loose[i][0], loose[i][2]))
    start = 0
    for k in range(1, len(row) + 1):
      if k == len(row) or _gap_breaks(loose[row[k - 1]], loose[row[k]], segment_gap):
        units.append((centre[row[0]], loose[row[start]][0], row[start:k]))
        start = k
  # Rotated text: PDFium's words and lines as they come, each line placed by its first word.
  for line in _rotated_lines(words):
    units.append((centre[line[0]], loose[line[0]][0], line))
  # Stable sort: the pieces of one row keep their left-to-right order.
  units.sort(key=lambda u: (u[0], u[1]))
  return [u[2] for u in units]


def _rotated_lines(words: PageWords) -> list[list[int]]:
  """Runs of consecutive non-upright words that PDFium puts on one line."""
  lines: list[list[int]] = []
  for i in np.flatnonzero(~words.upright).tolist():
    if lines and lines[-1][-1] == i - 1 and not words.stream_break[i]:
      lines[-1].append(i)
    else:
      lines.append([i])
  return lines


def stream_segments(words: PageWords, segment_gap: float) -> list[list[int]]:
  """Segments in PDFium's order: a new one at each line break, jump or wide gap."""
  loose = words.loose.tolist()
  upright = words.upright.tolist()
  breaks = words.stream_break.tolist()
  segments: list[list[int]] = []
  for i in range(len(words)):
    if segments:
      p = segments[-1][-1]
      if upright[i] and upright[p]:
        joined = (not breaks[i] and _same_row(loose[p], loose[i]) and
                  loose[i][0] >= loose[p][0] and
                  not _gap_breaks(loose[p], loose[i], segment_gap))
      else:  # rotated text: PDFium's lines
        joined = not breaks[i] and not upright[i] and not upright[p]
      if joined:
        segments[-1].append(i)
        continue
    segments.append([i])
  return segments
