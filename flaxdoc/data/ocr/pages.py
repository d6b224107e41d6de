"""Files -> page pictures: PNG, JPEG, TIFF (every frame) through Pillow, PDF pages through PDFium.

The format is taken from the file's first bytes, not its name, so that a
misnamed file is read for what it is and a file that is no picture is refused
with what it looks like. Errors are `DocumentError`s naming the file:

* unsupported format: neither PNG, JPEG, TIFF nor PDF (e.g. a GIF, a ZIP, text);
* unreadable image: Pillow cannot decode it (truncated, corrupt);
* PDF errors as `flaxdoc.data.pdf` gives them (truncated, encrypted, ...).

PDF pages are rendered with pypdfium2 at `dpi` (rotation and CropBox applied,
as `flaxdoc.data.pdf.read_pdf` sees the page); boxes found on the picture are
brought back to PDF points by `72 / dpi`, the units `read_pdf` uses by default.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from flaxdoc.data import pdf as pdf_lib
from flaxdoc.data.document import DocumentError, PageImage

IMAGE_FORMATS = {b"\x89PNG": "png", b"\xff\xd8\xff": "jpeg", b"II*\x00": "tiff",
                 b"MM\x00*": "tiff"}
SUPPORTED = "PNG, JPEG, TIFF (multi-page too) or PDF"
# Pillow refuses images over ~179 Mpixel as "decompression bombs"; a 300-dpi A0
# scan is ~140 Mpixel, so the default limit is kept.


def sniff_format(path: str | os.PathLike) -> str:
  """"png", "jpeg", "tiff" or "pdf" from the first bytes; else `DocumentError` naming the file."""
  source = os.fspath(path)
  try:
    with open(path, "rb") as f:
      head = f.read(1024)
  except FileNotFoundError:
    raise DocumentError("no such file", source=source) from None
  except IsADirectoryError:
    raise DocumentError("is a directory, not an image or PDF file", source=source) from None
  except OSError as e:
    raise DocumentError(f"cannot read file ({e.strerror or e})", source=source) from None
  for magic, kind in IMAGE_FORMATS.items():
    if head.startswith(magic):
      return kind
  if b"%PDF-" in head:
    return "pdf"
  raise DocumentError(f"unsupported file format: it looks like {_describe(head)}; flaxdoc reads "
                      f"{SUPPORTED} files (and its own .jsonl)", source=source)


def _describe(head: bytes) -> str:
  for magic, what in pdf_lib.FILE_SIGNATURES:
    start = head.lstrip() if magic in (b"{", b"<") else head
    if start.startswith(magic):
      return what
  if not head:
    return "an empty file"
  try:
    head.decode("utf-8")
    return "plain text"
  except UnicodeDecodeError:
    return f"a file starting with {head[:16]!r}"


def image_frames(path: str | os.PathLike) -> Iterator:
  """Yields `(frame index, RGB PIL image)` for every frame (TIFF page) of an image file."""
  from PIL import Image, ImageSequence  # pylint: disable=import-outside-toplevel
  source = os.fspath(path)
  try:
    with Image.open(path) as im:
      for k, frame in enumerate(ImageSequence.Iterator(im)):
        yield k, frame.convert("RGB")  # decodes the pixels: errors surface here
  except DocumentError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    # Pillow raises many types on bad data (OSError, SyntaxError, ValueError,
    # DecompressionBombError): all mean "this image cannot be read".
    raise DocumentError(f"unreadable image: Pillow cannot decode it ({type(e).__name__}: {e}); "
                        "the file is probably truncated or corrupt", source=source) from None


def open_pdf(path: str | os.PathLike, password: str | None = None):
  """A `pypdfium2.PdfDocument`, after `flaxdoc.data.pdf`'s checks (errors name the file);
  an encrypted one with `password`, else `$FLAXDOC_PDF_PASSWORD` (`pdf.open_pdf`)."""
  pdfium = pdf_lib.import_pdfium()
  source = os.fspath(path)
  pdf_lib.check_file(Path(path), source)
  return pdf_lib.open_pdf(pdfium, Path(path), password, source)


def render_pdf_page(pdf, index: int, dpi: float):
  """PDF page `index` as an RGB PIL image at `dpi` (rotation and CropBox applied)."""
  page = pdf[index]
  try:
    return page.render(scale=float(dpi) / 72.0).to_pil().convert("RGB")
  finally:
    page.close()


def open_page_image(image: PageImage, *, max_side: int = 2000):
  """The picture of one page (`Document.page_images[k]`) as an RGB PIL image.

  A PDF page is rendered so that its longer side has about `max_side` pixels.
  Raises `DocumentError` naming the file when it is gone or unreadable.
  """
  kind = sniff_format(image.path)
  if kind == "pdf":
    pdf = open_pdf(image.path)
    try:
      dpi = 72.0 * max_side / max(image.width, image.height)
      return render_pdf_page(pdf, image.index, dpi)
    finally:
      pdf.close()
  for k, frame in image_frames(image.path):
    if k == image.index:
      return frame
  raise DocumentError(f"has no frame {image.index}", source=image.path, field="page_images")
