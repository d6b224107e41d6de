"""OCR engines by name: `get_engine("rapidocr")` -> an engine that reads a page image into
words, word boxes and line/block ids (the interface and `OcrWord` are in `words`).

Two engines sit behind it (`ENGINES`), each in its own module and imported only
when asked for, so flaxdoc works without either installed:

* `tesseract`: Tesseract 5 through `pytesseract` (the engine Hugging Face's
  LayoutLM processors run). Needs the system program (`apt-get install
  tesseract-ocr`) and `pip install pytesseract`.
* `rapidocr`: RapidOCR (`pip install rapidocr-onnxruntime`): PP-OCR detection and
  recognition models inside the wheel, pip only.

An engine returns `OcrWord`s with boxes in the pixels of the image it was given;
`flaxdoc.data.ocr.pages` converts them to the document's units (PDF points for
PDFs).
"""

from __future__ import annotations

# The common types live in `words`, which the engine modules import; this registry
# imports the engine modules only inside `get_engine`, and re-exports the types.
from flaxdoc.data.ocr.words import OcrEngine, OcrUnavailableError, OcrWord

__all__ = ["DEFAULT_ENGINE", "ENGINES", "OcrEngine", "OcrUnavailableError", "OcrWord",
           "available_engines", "get_engine"]

ENGINES = ("rapidocr", "tesseract")
# Chosen by measurement (README, "Reading scans (OCR)"): on FUNSD dev forms a
# model trained on gold words scores a higher entity F1 on RapidOCR's words
# than on Tesseract's.
DEFAULT_ENGINE = "rapidocr"


_ENGINES: dict[str, OcrEngine] = {}


def get_engine(name: str) -> OcrEngine:
  """The engine called `name` (built once per process: model loading is slow).

  Raises:
    ValueError: an unknown name.
    OcrUnavailableError: the engine is not installed (the message says how to install it).
  """
  if name not in ENGINES:
    raise ValueError(f"unknown OCR engine {name!r}; expected one of {ENGINES}")
  if name not in _ENGINES:
    if name == "tesseract":
      from flaxdoc.data.ocr.tesseract import TesseractEngine  # pylint: disable=import-outside-toplevel
      _ENGINES[name] = TesseractEngine()
    else:
      from flaxdoc.data.ocr.rapidocr import RapidOcrEngine  # pylint: disable=import-outside-toplevel
      _ENGINES[name] = RapidOcrEngine()
  return _ENGINES[name]


def available_engines() -> list[str]:
  """The engines that can run here (installed package and, for Tesseract, program)."""
  out = []
  for name in ENGINES:
    try:
      get_engine(name)
    except OcrUnavailableError:
      continue
    out.append(name)
  return out
