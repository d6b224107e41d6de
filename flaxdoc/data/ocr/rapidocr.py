"""RapidOCR (`rapidocr-onnxruntime`): PP-OCR text lines, cut into words with its word-box option.

RapidOCR detects text *lines* and recognises each; with `return_word_box=True`
(rapidocr-onnxruntime >= 1.4) it also returns, per line, the characters it read
(spaces included) and a quadrilateral per character, placed from the
recogniser's CTC columns. Words are the runs of non-space characters; a word's
box is the axis-aligned hull of its characters' boxes. When the characters and
boxes do not pair up (an older wheel, or a line it could not split), the line
box is cut in proportion to character counts instead.

Each detected line is one segment and its own block (RapidOCR has no blocks).
"""

from __future__ import annotations

import numpy as np

from flaxdoc.data.ocr.engine import OcrUnavailableError, OcrWord

_INSTALL = "RapidOCR is not installed: `pip install rapidocr-onnxruntime` (or `flaxdoc[ocr]`)"


class RapidOcrEngine:
  """RapidOCR with its default PP-OCRv4 models (inside the wheel, CPU)."""
  name = "rapidocr"

  def __init__(self):
    try:
      from rapidocr_onnxruntime import RapidOCR  # pylint: disable=import-outside-toplevel
    except ImportError:
      raise OcrUnavailableError(_INSTALL) from None
    self._ocr = RapidOCR()

  def read(self, image) -> list[OcrWord]:
    result, _ = self._ocr(image.convert("RGB"), return_word_box=True)
    words = []
    for line, row in enumerate(result or []):
      quad, text, score = row[0], str(row[1]), float(row[2])
      char_boxes = row[3] if len(row) > 3 else None
      chars = row[4] if len(row) > 4 else None
      for piece, box in _split_line(text, np.asarray(quad, np.float64), chars, char_boxes):
        words.append(OcrWord(piece, box, line, line, score))
    return words


def _hull(points) -> tuple[float, float, float, float]:
  p = np.asarray(points, np.float64).reshape(-1, 2)
  return (float(p[:, 0].min()), float(p[:, 1].min()), float(p[:, 0].max()),
          float(p[:, 1].max()))


def _split_line(text: str, quad: np.ndarray, chars, char_boxes):
  """`(word, box)` pairs of one recognised line."""
  if chars is not None and char_boxes is not None and len(chars) == len(char_boxes) \
      and "".join(chars).split() == text.split():
    out, run, run_boxes = [], [], []
    for ch, box in zip(list(chars) + [" "], list(char_boxes) + [None]):
      if ch.strip():
        run.append(ch)
        run_boxes.append(box)
      elif run:
        out.append(("".join(run), _hull(run_boxes)))
        run, run_boxes = [], []
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
