"""What an OCR engine returns and raises: `OcrWord`, the `OcrEngine` interface and
`OcrUnavailableError`.

The engines (`flaxdoc.data.ocr.tesseract`, `flaxdoc.data.ocr.rapidocr`) import these;
`flaxdoc.data.ocr.engine`, which picks an engine by name, imports the engines.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol


class OcrUnavailableError(RuntimeError):
  """The engine's Python package or system program is not installed (the message says how)."""


@dataclasses.dataclass(frozen=True)
class OcrWord:
  """One recognised word.

  Attributes:
    text: the word, non-empty, no whitespace inside.
    box: `(x0, y0, x1, y1)` in pixels of the image read, `x0 <= x1`, `y0 <= y1`.
    line: id of the engine's text line, unique on the page.
    block: id of the engine's block (paragraph / region), unique on the page.
    confidence: the engine's confidence in [0, 1].
  """
  text: str
  box: tuple[float, float, float, float]
  line: int
  block: int
  confidence: float


class OcrEngine(Protocol):
  """What `flaxdoc.data.ocr.reader` needs from an engine."""
  name: str

  def read(self, image) -> list[OcrWord]:
    """The words of one page image (a `PIL.Image.Image`), in reading order."""
