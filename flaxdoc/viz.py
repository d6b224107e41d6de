"""Pictures of documents, their word graphs and entities, and of attention maps (PNG).

Two functions, both drawing with Pillow alone (no display, no matplotlib):

* `draw_document(doc, path, page=..., edges=..., entities=...)`: one page of a
  `flaxdoc.data.Document` -- a light grey page, thin word boxes, graph edges as thin
  lines between box centres, entities (gold or predicted) as translucent fills
  coloured by label with a legend -- for checking a reader, the beta-skeleton graph
  (`flaxdoc.layout.graph`) or a model's predictions by eye.
* `draw_attention(matrix, path, ...)`: a heatmap of a `[Q, K]` matrix (attention
  weights, a layout bias), with optional row/column labels and a colour bar.

Image geometry (so callers and tests can predict it): the page occupies
`round(page_width * scale) x round(page_height * scale)` pixels, surrounded by a
`MARGIN`-pixel border, below a `TITLE_HEIGHT`-pixel title band; with entities a
`LEGEND_WIDTH`-pixel legend column is added on the right.
"""

from __future__ import annotations

import colorsys
import functools
import math
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

MARGIN = 16
TITLE_HEIGHT = 28
LEGEND_WIDTH = 180

_BACKGROUND = (255, 255, 255)
_PAGE = (242, 242, 242)
_PAGE_BORDER = (200, 200, 200)
_WORD = (90, 90, 90)
_EDGE = (30, 110, 200, 150)  # translucent blue
_TEXT = (20, 20, 20)
_MASKED = (190, 190, 190)

# Qualitative palette (Tableau 10), then evenly spaced hues for more labels.
_PALETTE = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
            (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207))

# Viridis at 9 evenly spaced points; intermediate values are interpolated.
_VIRIDIS = np.array([(68, 1, 84), (71, 44, 122), (59, 81, 139), (44, 113, 142), (33, 144, 141),
                     (39, 173, 129), (92, 200, 99), (170, 220, 50), (253, 231, 37)], np.float64)


# ----------------------------------------------------------------------------- helpers
@functools.lru_cache(maxsize=64)
def _font(size: int) -> ImageFont.ImageFont:
  """Pillow's bundled font at `size` pixels (bitmap fallback on builds without FreeType)."""
  try:
    return ImageFont.load_default(size=max(6, int(size)))
  except (TypeError, OSError):  # Pillow < 10.1 or no FreeType
    return ImageFont.load_default()


def label_colors(labels: Sequence[str]) -> dict[str, tuple[int, int, int]]:
  """A stable colour per label, in the order given (pass the label set for consistency
  between gold and predicted pictures)."""
  out = {}
  for k, label in enumerate(labels):
    if k < len(_PALETTE):
      out[label] = _PALETTE[k]
    else:
      r, g, b = colorsys.hsv_to_rgb((k * 0.618034) % 1.0, 0.65, 0.85)
      out[label] = (int(r * 255), int(g * 255), int(b * 255))
  return out


def _save(image: Image.Image, path) -> Path:
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  image.save(path, format="PNG")
  return path


def _check_scale(scale) -> float:
  if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) \
      or scale <= 0:
    raise ValueError(f"scale must be a positive number, got {scale!r}")
  return float(scale)


# ----------------------------------------------------------------------------- documents
def draw_document(doc, path, *, page: int = 0, edges=None, entities=None, show_text: bool = False,
                  scale: float | None = None, background=None, title: str | None = None,
                  labels: Sequence[str] | None = None, pairs=None) -> Path:
  """Draws one page of a document as a PNG.

  Args:
    doc: a `flaxdoc.data.Document`.
    path: output PNG file (parent folders are created).
    page: which page to draw.
    edges: `[E, 2]` word index pairs (e.g. `flaxdoc.layout.graph.build_word_graph`),
      drawn as lines between box centres; pairs with a word on another page are skipped.
    entities: gold (`doc.entities`) or predicted entities: objects with `.label` and
      `.words` (word indices), drawn as translucent fills coloured by label plus the
      outline of each entity's extent on this page, with a legend.
    show_text: write each word in its box.
    scale: output pixels per page pixel; default: the page's longer side becomes 1000 px.
    background: optional page image (path or PIL image), shown faded under the drawing.
      Default: the document's own page image (`doc.page_images`, e.g. a scan read by
      `flaxdoc.data.ocr` or a FUNSD PNG), shown less faded; over a real page the
      words are not written in again (`show_text` is ignored: the page shows them).
    title: text above the page; default: the document id and page.
    labels: the label order for colours (default: `doc.label_set`, else sorted labels).
    pairs: key -> value links, `(key, value)` pairs of entities (objects with `.words`),
      drawn as arrows from the key's extent to the value's (both on this page).

  Returns:
    The path written. Raises `ValueError` for a page, edge or entity word that does
    not exist in `doc`.
  """
  num_words = len(doc.words)
  if isinstance(page, bool) or not isinstance(page, (int, np.integer)) \
      or not 0 <= page < doc.num_pages:
    raise ValueError(f"document {doc.id!r}: page {page!r} does not exist "
                     f"({doc.num_pages} pages)")
  width, height = (float(v) for v in doc.page_sizes[page])
  scale = 1000.0 / max(width, height) if scale is None else _check_scale(scale)
  pw, ph = max(1, round(width * scale)), max(1, round(height * scale))
  on_page = np.asarray(doc.pages) == page  # [N]
  boxes = np.asarray(doc.boxes, np.float64) * scale  # [N, 4] in output pixels

  edges_arr = None
  if edges is not None:
    edges_arr = np.asarray(edges).reshape(-1, 2)
    if len(edges_arr) and (not np.issubdtype(edges_arr.dtype, np.integer) or
                           edges_arr.min() < 0 or edges_arr.max() >= num_words):
      raise ValueError(f"document {doc.id!r}: edges must be word index pairs in "
                       f"[0, {num_words})")
  ents = list(entities) if entities is not None else []
  for k, e in enumerate(ents):
    words = list(e.words)
    if any(not 0 <= int(w) < num_words for w in words):
      raise ValueError(f"document {doc.id!r}: entity {k} ({e.label}) refers to a word outside "
                       f"[0, {num_words})")
  if labels is None:
    labels = doc.label_set or sorted({e.label for e in ents})
  colors = label_colors(list(labels) + sorted({e.label for e in ents} - set(labels)))

  legend = LEGEND_WIDTH if ents else 0
  size = (pw + 2 * MARGIN + legend, ph + 2 * MARGIN + TITLE_HEIGHT)
  ox, oy = MARGIN, MARGIN + TITLE_HEIGHT  # page origin in the image
  image = Image.new("RGB", size, _BACKGROUND)
  draw = ImageDraw.Draw(image)
  draw.rectangle([ox - 1, oy - 1, ox + pw, oy + ph], fill=_PAGE, outline=_PAGE_BORDER)
  alpha = 0.3
  if background is None and getattr(doc, "page_images", None):
    from flaxdoc.data.ocr.pages import open_page_image  # pylint: disable=import-outside-toplevel
    background = open_page_image(doc.page_images[page], max_side=max(pw, ph))
    alpha, show_text = 0.7, False
  if background is not None:
    scan = background if isinstance(background, Image.Image) else Image.open(background)
    scan = scan.convert("RGB").resize((pw, ph), Image.Resampling.LANCZOS)
    page_img = Image.blend(Image.new("RGB", (pw, ph), _PAGE), scan, alpha)
    image.paste(page_img, (ox, oy))

  def rect(i):
    x0, y0, x1, y1 = boxes[i]
    return [ox + x0, oy + y0, ox + max(x1, x0 + 1), oy + max(y1, y0 + 1)]

  # Translucent layers (entity fills, edges) are drawn on an overlay and composited.
  overlay = Image.new("RGBA", size, (0, 0, 0, 0))
  odraw = ImageDraw.Draw(overlay)
  for e in ents:
    words = [int(w) for w in e.words if on_page[int(w)]]
    if not words:
      continue
    color = colors[e.label]
    for w in words:
      odraw.rectangle(rect(w), fill=color + (90,))
    ext = boxes[words]
    odraw.rectangle([ox + ext[:, 0].min() - 2, oy + ext[:, 1].min() - 2,
                     ox + ext[:, 2].max() + 2, oy + ext[:, 3].max() + 2], outline=color + (230,),
                    width=1)
  centres = 0.5 * (boxes[:, :2] + boxes[:, 2:])  # [N, 2]
  page_edges = np.zeros((0, 2), np.int64)
  if edges_arr is not None and len(edges_arr):
    page_edges = edges_arr[on_page[edges_arr[:, 0]] & on_page[edges_arr[:, 1]]]
    for i, j in page_edges.tolist():
      odraw.line([ox + centres[i, 0], oy + centres[i, 1], ox + centres[j, 0], oy + centres[j, 1]],
                 fill=_EDGE, width=1)
  image = Image.alpha_composite(image.convert("RGBA"), overlay).convert("RGB")
  draw = ImageDraw.Draw(image)

  for i in np.flatnonzero(on_page).tolist():
    draw.rectangle(rect(i), outline=_WORD, width=1)
  for i in np.unique(page_edges).tolist():  # a dot where edges meet a box
    cx, cy = ox + centres[i, 0], oy + centres[i, 1]
    draw.ellipse([cx - 1.5, cy - 1.5, cx + 1.5, cy + 1.5], fill=_EDGE[:3])
  if show_text:
    for i in np.flatnonzero(on_page).tolist():
      x0, y0, _, y1 = rect(i)
      draw.text((x0 + 1, y0), doc.words[i], fill=_TEXT, font=_font(round(0.8 * (y1 - y0))))

  for key, value in pairs or ():
    _draw_link(draw, boxes, on_page, key.words, value.words, ox, oy)

  if title is None:
    title = f"{doc.id} - page {page + 1} of {doc.num_pages} - {int(on_page.sum())} words"
    if edges_arr is not None:
      title += f", {len(page_edges)} edges"
  draw.text((MARGIN, MARGIN // 2), title, fill=_TEXT, font=_font(16))
  if ents:
    lx = ox + pw + MARGIN
    draw.text((lx, oy), "entities", fill=_TEXT, font=_font(14))
    counts = {}
    for e in ents:
      counts[e.label] = counts.get(e.label, 0) + 1
    for k, label in enumerate(l for l in colors if l in counts):
      y = oy + 24 + 20 * k
      draw.rectangle([lx, y, lx + 14, y + 14], fill=colors[label], outline=_WORD)
      draw.text((lx + 20, y), f"{label} ({counts[label]})", fill=_TEXT, font=_font(13))
  return _save(image, path)


_LINK = (200, 30, 30)


def _draw_link(draw, boxes, on_page, key_words, value_words, ox, oy):
  """An arrow from the key's extent to the value's: from the key's edge facing the value."""
  kw = [int(w) for w in key_words if on_page[int(w)]]
  vw = [int(w) for w in value_words if on_page[int(w)]]
  if not kw or not vw:
    return
  k, v = boxes[kw], boxes[vw]
  kx0, ky0, kx1, ky1 = k[:, 0].min(), k[:, 1].min(), k[:, 2].max(), k[:, 3].max()
  vx0, vy0, vx1, vy1 = v[:, 0].min(), v[:, 1].min(), v[:, 2].max(), v[:, 3].max()
  if vx0 >= kx1:  # value to the right: right edge -> left edge
    a, b = (kx1, (ky0 + ky1) / 2), (vx0, (vy0 + vy1) / 2)
  elif vy0 >= ky1:  # value below: bottom edge -> top edge
    a, b = ((kx0 + kx1) / 2, ky1), ((vx0 + vx1) / 2, vy0)
  else:
    a, b = ((kx0 + kx1) / 2, (ky0 + ky1) / 2), ((vx0 + vx1) / 2, (vy0 + vy1) / 2)
  a, b = (ox + a[0], oy + a[1]), (ox + b[0], oy + b[1])
  draw.line([a, b], fill=_LINK, width=2)
  angle = math.atan2(b[1] - a[1], b[0] - a[0])
  head = [b] + [(b[0] - 8 * math.cos(angle + s), b[1] - 8 * math.sin(angle + s))
                for s in (0.45, -0.45)]
  draw.polygon(head, fill=_LINK)


# ----------------------------------------------------------------------------- attention
def _colormap(values: np.ndarray) -> np.ndarray:
  """`[...]` in [0, 1] -> `uint8 [..., 3]` viridis colours."""
  t = np.clip(values, 0.0, 1.0) * (len(_VIRIDIS) - 1)
  lo = np.minimum(np.floor(t).astype(np.int64), len(_VIRIDIS) - 2)
  frac = (t - lo)[..., None]
  return np.round(_VIRIDIS[lo] * (1 - frac) + _VIRIDIS[lo + 1] * frac).astype(np.uint8)


def draw_attention(matrix, path, *, row_labels: Sequence[str] | None = None,
                   col_labels: Sequence[str] | None = None, title: str | None = None,
                   cell: int | None = None, vmin: float | None = None,
                   vmax: float | None = None) -> Path:
  """Draws a `[Q, K]` matrix (e.g. one head's attention weights) as a heatmap PNG.

  Args:
    matrix: `[Q, K]` numbers (numpy or jax). NaN / inf entries (masked) are grey.
    path: output PNG file.
    row_labels, col_labels: tick labels (e.g. the tokens), drawn when cells are at
      least 8 pixels.
    title: text above the map.
    cell: pixels per matrix entry; default: up to 24, so the map is about 800 pixels.
    vmin, vmax: the colour range (default: the finite minimum and maximum).

  Returns:
    The path written. The heatmap itself is `K * cell` by `Q * cell` pixels; the
    image adds the labels, a 70-pixel colour bar and `MARGIN` / `TITLE_HEIGHT` borders.
  """
  m = np.asarray(matrix, np.float64)
  if m.ndim != 2 or 0 in m.shape:
    raise ValueError(f"matrix must have shape [Q, K] with Q, K >= 1, got {list(m.shape)}")
  q, k = m.shape
  for name, labels, n in (("row_labels", row_labels, q), ("col_labels", col_labels, k)):
    if labels is not None and len(labels) != n:
      raise ValueError(f"{name} has {len(labels)} entries for {n} {name.split('_')[0]}s")
  if cell is None:
    cell = max(1, min(24, 800 // max(q, k)))
  elif isinstance(cell, bool) or not isinstance(cell, (int, np.integer)) or cell < 1:
    raise ValueError(f"cell must be a positive integer, got {cell!r}")
  finite = np.isfinite(m)
  lo = vmin if vmin is not None else (float(m[finite].min()) if finite.any() else 0.0)
  hi = vmax if vmax is not None else (float(m[finite].max()) if finite.any() else 1.0)
  span = hi - lo if hi > lo else 1.0
  rgb = _colormap((np.where(finite, m, lo) - lo) / span)  # [Q, K, 3]
  rgb[~finite] = _MASKED
  heat = Image.fromarray(rgb, "RGB").resize((k * cell, q * cell), Image.Resampling.NEAREST)

  font = _font(min(12, max(cell - 2, 6)))
  show_rows = row_labels is not None and cell >= 8
  show_cols = col_labels is not None and cell >= 8
  left = MARGIN + (max(font.getbbox(str(s))[2] for s in row_labels) + 6 if show_rows else 0)
  top = MARGIN + TITLE_HEIGHT + (max(font.getbbox(str(s))[2] for s in col_labels) + 6
                                 if show_cols else 0)
  bar = 70  # colour bar and its numbers
  bh = max(q * cell, 40)  # colour bar height
  size = (left + k * cell + MARGIN + bar, top + bh + MARGIN)
  image = Image.new("RGB", size, _BACKGROUND)
  image.paste(heat, (left, top))
  draw = ImageDraw.Draw(image)
  if show_rows:
    for r, s in enumerate(row_labels):
      w = font.getbbox(str(s))[2]
      draw.text((left - 4 - w, top + r * cell + (cell - 12) // 2), str(s), fill=_TEXT, font=font)
  if show_cols:
    for c, s in enumerate(col_labels):
      w, h = font.getbbox(str(s))[2:]
      label = Image.new("RGBA", (w + 2, h + 2), (0, 0, 0, 0))
      ImageDraw.Draw(label).text((0, 0), str(s), fill=_TEXT, font=font)
      label = label.rotate(90, expand=True)
      image.paste(label, (left + c * cell + (cell - label.width) // 2, top - 4 - label.height),
                  label)
  # Colour bar: top = hi, bottom = lo.
  bx = left + k * cell + MARGIN
  ramp = _colormap(np.linspace(1.0, 0.0, bh))[:, None, :].repeat(12, axis=1)
  image.paste(Image.fromarray(ramp, "RGB"), (bx, top))
  small = _font(11)
  draw.text((bx + 16, top - 2), f"{hi:.3g}", fill=_TEXT, font=small)
  draw.text((bx + 16, top + bh - 12), f"{lo:.3g}", fill=_TEXT, font=small)
  if title:
    draw.text((MARGIN, MARGIN // 2), title, fill=_TEXT, font=_font(16))
  return _save(image, path)
