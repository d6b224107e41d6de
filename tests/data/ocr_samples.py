"""Pictures with known words for the OCR tests: synthetic documents rendered, and plain text.

`render_pages` writes a synthetic document as a born-digital PDF
(`flaxdoc.data.synthetic.render_pdf`) and renders its pages to PNG with
pypdfium2; the reference words are the generator's, with the glyph-tight boxes
`read_pdf` reads from that PDF at the same scale (the generator's boxes are
em-high cells, taller than any ink an OCR engine can see).

The generator sets words half a character apart, tighter than any typesetter;
both engines read such words as one. `spaced` shrinks each box about its
centre, so the words get the gaps of ordinary text.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from flaxdoc.data.document import Document
from flaxdoc.data.pdf import read_pdf
from flaxdoc.data.synthetic.render_pdf import write_pdf


def spaced(doc: Document, factor: float = 0.8) -> Document:
  """`doc` unlabelled, every box scaled by `factor` about its centre."""
  b = doc.boxes.astype(np.float64)
  centre, half = (b[:, :2] + b[:, 2:]) / 2, (b[:, 2:] - b[:, :2]) / 2 * factor
  return doc.replace(boxes=np.concatenate([centre - half, centre + half], 1), entities=None,
                     relations=())


def render_pages(doc: Document, folder: Path, scale: float = 0.5
                 ) -> tuple[Path, list[Image.Image], Document]:
  """(PDF path, page pictures at `scale` pixels per document pixel, reference document)."""
  import pypdfium2  # pylint: disable=import-outside-toplevel
  pdf_path = write_pdf(doc, Path(folder) / f"{doc.id}.pdf")
  pdf = pypdfium2.PdfDocument(pdf_path)
  try:
    pictures = [pdf[k].render(scale=scale).to_pil().convert("RGB") for k in range(len(pdf))]
  finally:
    pdf.close()
  return pdf_path, pictures, read_pdf(pdf_path, dpi=72.0 * scale)


def _font(size: int):
  import matplotlib  # pylint: disable=import-outside-toplevel
  path = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
  return ImageFont.truetype(str(path), size)


def text_image(lines: list[str], width: int = 700, size: int = 36) -> Image.Image:
  """A white picture with `lines` of black text (DejaVu Sans, `size` px), 1.6 lines apart."""
  image = Image.new("RGB", (width, int(size * (1.6 * len(lines) + 1.2))), "white")
  draw = ImageDraw.Draw(image)
  for k, line in enumerate(lines):
    draw.text((size // 2, int(size * (0.6 + 1.6 * k))), line, fill="black", font=_font(size))
  return image
