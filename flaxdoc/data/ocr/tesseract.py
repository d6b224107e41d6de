"""Tesseract 5 through `pytesseract`: word-level `image_to_data`, lines from its block/par/line ids.

`image_to_data` returns one row per layout element; rows of level 5 are words,
with their block, paragraph and line numbers. A line is `(block, par, line)`,
numbered here 0, 1, ... in Tesseract's order; a block is Tesseract's block.
Confidences come as 0-100 (-1 for non-words, which have no text) and are
scaled to [0, 1].
"""

from __future__ import annotations

import shutil

from flaxdoc.data.ocr.words import OcrUnavailableError, OcrWord

_INSTALL = ("Tesseract is not installed: `apt-get install tesseract-ocr` (Debian/Ubuntu; "
            "`brew install tesseract` on macOS) and `pip install pytesseract` "
            "(or `pip install flaxdoc[ocr]`)")


class TesseractEngine:
  """Tesseract 5 (LSTM engine, automatic page segmentation, English)."""
  name = "tesseract"

  def __init__(self, lang: str = "eng", config: str = "--oem 1 --psm 3"):
    try:
      import pytesseract  # pylint: disable=import-outside-toplevel
    except ImportError:
      raise OcrUnavailableError(_INSTALL) from None
    if shutil.which(pytesseract.pytesseract.tesseract_cmd) is None:
      raise OcrUnavailableError(_INSTALL)
    self._tess = pytesseract
    self.lang = lang
    self.config = config

  def read(self, image) -> list[OcrWord]:
    data = self._tess.image_to_data(image.convert("RGB"), lang=self.lang, config=self.config,
                                    output_type=self._tess.Output.DICT)
    lines: dict[tuple[int, int, int], int] = {}
    words = []
    for k, level in enumerate(data["level"]):
      text = str(data["text"][k]).strip()
      if int(level) != 5 or not text:
        continue
      key = (int(data["block_num"][k]), int(data["par_num"][k]), int(data["line_num"][k]))
      line = lines.setdefault(key, len(lines))
      x, y = float(data["left"][k]), float(data["top"][k])
      w, h = float(data["width"][k]), float(data["height"][k])
      conf = max(0.0, float(data["conf"][k])) / 100.0
      for piece in text.split():  # Tesseract words carry no spaces, but be sure
        words.append(OcrWord(piece, (x, y, x + w, y + h), line, key[0], conf))
    return words
