"""Tests for the document / graph / attention pictures (flaxdoc.viz)."""

import collections

import numpy as np
import pytest
from PIL import Image

from flaxdoc import viz
from flaxdoc.data import Document, Entity

Predicted = collections.namedtuple("Predicted", "label words score")


def make_doc():
  words = ["Date:", "12/03/98", "Name:", "John", "Smith", "Total", "42"]
  boxes = [[10, 10, 50, 22], [55, 10, 120, 22], [10, 40, 52, 52], [58, 40, 90, 52],
           [95, 40, 140, 52], [10, 20, 60, 35], [70, 20, 90, 35]]
  pages = [0, 0, 0, 0, 0, 1, 1]
  return Document.create(
      "form-1", words, boxes, pages=pages, page_sizes=[[200, 100], [200, 80]],
      entities=[("question", [0]), ("answer", [1]), ("question", [2]), ("answer", [3, 4]),
                ("total", [5, 6])],
      label_set=["question", "answer", "total"])


def pixels(path) -> np.ndarray:
  with Image.open(path) as im:
    assert im.format == "PNG"
    return np.asarray(im.convert("RGB"))


def has_color(img: np.ndarray, color, tol: int = 0) -> bool:
  return bool((np.abs(img.astype(int) - np.array(color)) <= tol).all(-1).any())


def not_blank(img: np.ndarray) -> bool:
  packed = (img[..., 0].astype(np.int64) << 16) | (img[..., 1].astype(np.int64) << 8) | img[..., 2]
  return len(np.unique(packed)) > 10 and img.std() > 5


def test_draw_document_size_and_content(tmp_path):
  doc = make_doc()
  edges = np.array([[0, 1], [0, 2], [2, 3], [3, 4], [1, 3], [4, 5]])  # (4, 5) crosses pages
  path = viz.draw_document(doc, tmp_path / "sub" / "doc.png", edges=edges, entities=doc.entities,
                           scale=2.0)
  img = pixels(path)
  # Page 200 x 100 at scale 2, margins, title band, legend column.
  assert img.shape == (100 * 2 + 2 * viz.MARGIN + viz.TITLE_HEIGHT,
                       200 * 2 + 2 * viz.MARGIN + viz.LEGEND_WIDTH, 3)
  assert not_blank(img)
  colors = viz.label_colors(doc.label_set)
  for label in ("question", "answer"):  # legend swatches are drawn in the full colour
    assert has_color(img, colors[label]), label
  assert has_color(img, viz._PAGE)
  # Translucent fills: the middle of word 1 ("answer") is tinted towards its colour.
  x0, y0, x1, y1 = (np.array(doc.boxes[1]) * 2).astype(int)
  inside = img[viz.MARGIN + viz.TITLE_HEIGHT + (y0 + y1) // 2 - 2,
               viz.MARGIN + (x0 + x1) // 2 - 10]
  page = np.array(viz._PAGE)
  tint = np.array(colors["answer"]) - page
  assert np.dot(inside - page, tint) > 0


def test_draw_document_default_scale_and_no_entities(tmp_path):
  doc = make_doc()
  img = pixels(viz.draw_document(doc, tmp_path / "d.png"))
  # Longer page side -> 1000 px; no legend.
  assert img.shape == (500 + 2 * viz.MARGIN + viz.TITLE_HEIGHT, 1000 + 2 * viz.MARGIN, 3)
  assert not_blank(img)
  assert not has_color(img, viz.label_colors(doc.label_set)["question"])


def test_draw_document_edges_are_drawn(tmp_path):
  doc = make_doc()
  with_edges = pixels(viz.draw_document(doc, tmp_path / "e.png", edges=[[0, 4], [1, 2]],
                                        scale=3.0))
  without = pixels(viz.draw_document(doc, tmp_path / "n.png", edges=[], scale=3.0))
  assert with_edges.shape == without.shape
  changed = (with_edges != without).any(-1)
  assert changed[viz.MARGIN + viz.TITLE_HEIGHT:].sum() > 100  # lines, not just the title
  # The edge (blue) colour appears where words are joined.
  assert (with_edges[..., 2].astype(int) - with_edges[..., 0] > 60).sum() > 50


def test_draw_document_second_page_predictions_and_text(tmp_path):
  doc = make_doc()
  preds = [Predicted("total", (5, 6), 0.9), Predicted("answer", (1,), 0.5)]  # word 1: page 0
  bg = Image.new("L", (400, 160), 128)
  img = pixels(viz.draw_document(doc, tmp_path / "p.png", page=1, entities=preds, scale=1.5,
                                 show_text=True, background=bg, edges=[[0, 1], [5, 6]]))
  assert img.shape == (120 + 2 * viz.MARGIN + viz.TITLE_HEIGHT,
                       300 + 2 * viz.MARGIN + viz.LEGEND_WIDTH, 3)
  assert not_blank(img)
  assert has_color(img, viz.label_colors(doc.label_set)["total"])


@pytest.mark.parametrize("kwargs, match", [
    (dict(page=2), "page 2 does not exist"),
    (dict(page=-1), "page -1 does not exist"),
    (dict(edges=[[0, 7]]), "edges"),
    (dict(edges=[[0.5, 1]]), "edges"),
    (dict(entities=[Entity("question", (9,))]), "entity 0"),
    (dict(scale=0), "scale"),
])
def test_draw_document_bad_arguments(tmp_path, kwargs, match):
  with pytest.raises(ValueError, match=match):
    viz.draw_document(make_doc(), tmp_path / "x.png", **kwargs)


def test_draw_attention_size_masking_and_colours(tmp_path):
  m = np.arange(35, dtype=float).reshape(5, 7)
  m[2, 3] = np.nan
  img = pixels(viz.draw_attention(m, tmp_path / "a.png", cell=10))
  bar = 70
  assert img.shape == (viz.MARGIN + viz.TITLE_HEIGHT + max(50, 40) + viz.MARGIN,
                       viz.MARGIN + 70 + viz.MARGIN + bar, 3)
  top, left = viz.MARGIN + viz.TITLE_HEIGHT, viz.MARGIN
  cell = lambda r, c: img[top + 10 * r + 5, left + 10 * c + 5]
  np.testing.assert_array_equal(cell(2, 3), viz._MASKED)
  np.testing.assert_array_equal(cell(0, 0), viz._VIRIDIS[0])   # minimum
  np.testing.assert_array_equal(cell(4, 6), viz._VIRIDIS[-1])  # maximum
  # Brighter for larger values along a row (viridis luminance rises).
  lum = [cell(1, c).astype(float) @ [0.299, 0.587, 0.114] for c in range(7)]
  assert all(np.diff(lum) > 0)


def test_draw_attention_labels_and_constant_matrix(tmp_path):
  toks = ["[CLS]", "Date", ":", "12", "[SEP]"]
  img = pixels(viz.draw_attention(np.full((5, 5), 0.2), tmp_path / "c.png", row_labels=toks,
                                  col_labels=toks, title="head 0", cell=16))
  assert img.shape[0] > 5 * 16 + viz.TITLE_HEIGHT and img.shape[1] > 5 * 16 + 70
  big = pixels(viz.draw_attention(np.random.default_rng(0).random((300, 200)),
                                  tmp_path / "b.png"))
  assert not_blank(big)
  with pytest.raises(ValueError, match=r"shape \[Q, K\]"):
    viz.draw_attention(np.zeros(4), tmp_path / "z.png")
  with pytest.raises(ValueError, match="row_labels"):
    viz.draw_attention(np.zeros((2, 2)), tmp_path / "z.png", row_labels=["a"])
