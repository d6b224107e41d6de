"""RapidOCR (`rapidocr-onnxruntime`): PP-OCR text lines, cut into words with its word-box option.

RapidOCR detects text *lines* and recognises each; with `return_word_box=True`
(rapidocr-onnxruntime >= 1.4) it also returns, per line, the characters it read
(spaces included) and a quadrilateral per character, placed from the
recogniser's CTC columns. Words are the runs of non-space characters; a word's
box is the axis-aligned hull of its characters' boxes. When the characters and
boxes do not pair up (an older wheel, or a line it could not split), the line
box is cut in proportion to character counts instead. The recogniser often
drops the space between close words; a blank gap between two characters at
least `GAP` line ink heights wide on the page is taken as a space as well.

RapidOCR's boxes are line-high cells (the character cells span the detected
line's full height, padding included), looser than the ink; each word box is
therefore shrunk to the dark pixels inside it (`tighten`, a global Otsu
threshold), so boxes are as tight as Tesseract's. A box with no dark pixel
stays as it was.

Each detected line is one segment and its own block (RapidOCR has no blocks).
"""

from __future__ import annotations

import numpy as np

from flaxdoc.data.ocr.words import OcrUnavailableError, OcrWord

# A blank run of columns at least this many line ink heights wide between two
# characters is a space, whether or not the recogniser put one there: PP-OCR
# often drops the space between close words ("EmailAddress:").
GAP = 0.5

_INSTALL = "RapidOCR is not installed: `pip install rapidocr-onnxruntime` (or `flaxdoc[ocr]`)"


class RapidOcrEngine:
  """RapidOCR with its default PP-OCRv4 models (inside the wheel, CPU)."""
  name = "rapidocr"

  def __init__(self, gap: float = GAP):
    self.gap = gap
    try:
      from rapidocr_onnxruntime import RapidOCR  # pylint: disable=import-outside-toplevel
    except ImportError:
      raise OcrUnavailableError(_INSTALL) from None
    self._ocr = RapidOCR()

  def read(self, image) -> list[OcrWord]:
    rgb = image.convert("RGB")
    result, _ = self._ocr(rgb, return_word_box=True)
    ink = ink_mask(np.asarray(rgb.convert("L")))
    words = []
    for line, row in enumerate(result or []):
      quad, text, score = row[0], str(row[1]), float(row[2])
      char_boxes = row[3] if len(row) > 3 else None
      chars = row[4] if len(row) > 4 else None
      for piece, box in _split_line(text, np.asarray(quad, np.float64), chars, char_boxes, ink,
                                    self.gap):
        words.append(OcrWord(piece, tighten(ink, box), line, line, score))
    return words


def ink_mask(gray: np.ndarray) -> np.ndarray:
  """`bool [H, W]`: pixels darker than the page's Otsu threshold (text on a light page)."""
  hist = np.bincount(gray.ravel(), minlength=256).astype(np.float64)
  levels = np.arange(256, dtype=np.float64)
  w0 = np.cumsum(hist)
  w1 = w0[-1] - w0
  m0 = np.cumsum(hist * levels)
  mean0 = m0 / np.maximum(w0, 1)
  mean1 = (m0[-1] - m0) / np.maximum(w1, 1)
  between = w0 * w1 * (mean0 - mean1) ** 2  # between-class variance per threshold
  return gray <= int(np.argmax(between))


def tighten(ink: np.ndarray, box) -> tuple[float, float, float, float]:
  """`box` shrunk to the ink pixels inside it (unchanged when it holds none)."""
  h, w = ink.shape
  x0, y0 = max(int(np.floor(box[0])), 0), max(int(np.floor(box[1])), 0)
  x1, y1 = min(int(np.ceil(box[2])), w), min(int(np.ceil(box[3])), h)
  if x1 <= x0 or y1 <= y0:
    return tuple(float(v) for v in box)
  cut = ink[y0:y1, x0:x1]
  rows = np.flatnonzero(cut.any(axis=1))
  cols = np.flatnonzero(cut.any(axis=0))
  if not len(rows):
    return tuple(float(v) for v in box)
  return (float(x0 + cols[0]), float(y0 + rows[0]), float(x0 + cols[-1] + 1),
          float(y0 + rows[-1] + 1))


def _hull(points) -> tuple[float, float, float, float]:
  p = np.asarray(points, np.float64).reshape(-1, 2)
  return (float(p[:, 0].min()), float(p[:, 1].min()), float(p[:, 0].max()),
          float(p[:, 1].max()))


def _split_line(text: str, quad: np.ndarray, chars, char_boxes, ink: np.ndarray, gap: float):
  """`(word, box)` pairs of one recognised line."""
  if chars is not None and char_boxes is not None and len(chars) == len(char_boxes) \
      and "".join(chars).split() == text.split():
    breaks = _ink_gaps(ink, quad, [_hull(b) for b in char_boxes], gap)
    out, run, run_boxes = [], [], []
    for k, (ch, box) in enumerate(zip(list(chars) + [" "], list(char_boxes) + [None])):
      if run and (not ch.strip() or k in breaks):
        out.append(("".join(run), _hull(run_boxes)))
        run, run_boxes = [], []
      if ch.strip():
        run.append(ch)
        run_boxes.append(box)
    return out
  # Fallback: cut the line's box in proportion to character positions.
  x0, y0, x1, y1 = _hull(quad)
  n = max(len(text), 1)
  out, pos = [], 0
  for piece in text.split(" "):
    if piece:
      a = x0 + (x1 - x0) * pos / n
      b = x0 + (x1 - x0) * (pos + len(piece)) / n
      out.append((piece, (a, y0, b, y1)))
    pos += len(piece) + 1
  return out


def _ink_gaps(ink: np.ndarray, quad: np.ndarray, cells, gap: float) -> set[int]:
  """Indices `k` of characters preceded by a blank gap >= `gap` x the line's ink height."""
  x0, y0, x1, y1 = tighten(ink, _hull(quad))
  band = ink[int(y0):int(y1), :]
  if not band.size:
    return set()
  blank = ~band.any(axis=0)  # [W] columns without ink on this line
  min_run = max(2.0, gap * (y1 - y0))
  out = set()
  for k in range(1, len(cells)):
    a = int((cells[k - 1][0] + cells[k - 1][2]) / 2)
    b = int((cells[k][0] + cells[k][2]) / 2)
    if b - a < min_run:
      continue
    run = best = 0
    for empty in blank[max(a, 0):max(b, 0)].tolist():
      run = run + 1 if empty else 0
      best = max(best, run)
    if best >= min_run:
      out.add(k)
  return out
