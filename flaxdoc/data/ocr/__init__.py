"""Scanned documents in: images and image-only PDF pages through an OCR engine -> `Document`.

    from flaxdoc.data.ocr import read_document, read_documents
    doc = read_document("scan.png", engine="rapidocr")       # or "tesseract"

    python -m flaxdoc.data.ocr --engine rapidocr --out scans.jsonl scans/*.png

Modules: `words` (what an engine returns: `OcrWord`, the interface), `engine`
(`get_engine`: an engine by name), `tesseract`, `rapidocr` (the two engines), `pages`
(files -> page pictures), `reader` (-> `Document`), `matching` (gold <-> OCR words:
scores and label transfer), `cache` (OCR results as JSON per file, engine and dpi).
"""

from flaxdoc.data.ocr.engine import (DEFAULT_ENGINE, ENGINES, OcrUnavailableError, OcrWord,
                                     available_engines, get_engine)
from flaxdoc.data.ocr.reader import DEFAULT_DPI, read_document, read_documents

__all__ = ["DEFAULT_DPI", "DEFAULT_ENGINE", "ENGINES", "OcrUnavailableError", "OcrWord",
           "available_engines", "get_engine", "read_document", "read_documents"]
