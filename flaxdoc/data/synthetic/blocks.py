"""Layout pieces shared by the document kinds: text blocks, key/value groups, tables.

The block functions place segments on a `Canvas` from a given top and return
the y below them without moving the canvas cursor, so that blocks can be set
side by side from the same top (`arrange_row`); tables flow with the cursor
and paginate. These pieces are where layout becomes necessary for tagging:

* `kv_group` sets values right of their keys or below them; in a strip of
  several keys side by side, a naive line-by-line reading separates each value
  from its key by the other keys.
* `Table` draws line items whose numeric columns (quantity, unit price, amount,
  tax rate) share one number format and come in a per-document column order with
  per-document header wordings: the x position under the header is what tells
  the columns apart.
* `fill_rows` grows a table until the document reaches its planned length
  (item count, page count or word count), repeating the header on new pages.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Callable, Sequence

from flaxdoc.data.synthetic import values
from flaxdoc.data.synthetic import vocab
from flaxdoc.data.synthetic.canvas import Canvas

# A piece of a line: (text, label or None). A line: (font scale, pieces).
Piece = tuple[str, "str | None"]
Line = tuple[float, Sequence[Piece]]


def line_width(c: Canvas, pieces: Sequence[Piece], font_size: float, gap_chars: float) -> float:
  gap = gap_chars * c.char_width(font_size)
  return sum(c.text_width(t.split(), font_size) for t, _ in pieces) + gap * (len(pieces) - 1)


def block_width(c: Canvas, lines: Sequence[Line], gap_chars: float = 1.0) -> float:
  return max((line_width(c, p, c.font_size * s, gap_chars) for s, p in lines), default=0.0)


def block_height(c: Canvas, lines: Sequence[Line]) -> float:
  return sum(c.line_height(c.font_size * s) for s, _ in lines)


def place_lines(c: Canvas, lines: Sequence[Line], x: float, y: float, align: str = "left",
                gap_chars: float = 1.0) -> float:
  """Places a block of lines anchored at `x` (left edge, right edge or centre).

  The pieces of one line are separate segments (a key and its value, say) set
  one after the other with a gap of `gap_chars` characters. Returns the y below.
  """
  c.new_block()
  for scale, pieces in lines:
    fs = c.font_size * scale
    if pieces:
      w = line_width(c, pieces, fs, gap_chars)
      if w > c.content_width:  # a long line (an e-mail on a receipt): set it smaller
        fs *= c.content_width / w
        w = c.content_width
      x0 = x - w if align == "right" else (x - w / 2 if align == "center" else x)
      gap = gap_chars * c.char_width(fs)
      key = None
      for text, label in pieces:
        # A labelled piece's key is the unlabelled piece before it on its line ("Total" 9.00).
        _, x1 = c.put(text, x0, y, font_size=fs, label=label,
                      key=key if label is not None else None)
        key = c.last_segment if label is None else None
        x0 = x1 + gap
    y += c.line_height(fs)
  return y


def kv_group(c: Canvas, pairs: Sequence[tuple[str, str, str | None]], x: float, y: float, *,
             arrangement: str, value_align: str = "left", width: float | None = None,
             spacing: float = 0.25) -> float:
  """Key/value pairs stacked vertically, each value right of its key or below it.

  Args:
    pairs: `(key, value, label)`; the key is labelled O, the value `label`.
    x: left edge of the group.
    arrangement: "right" (value on the key's line, at a common tab stop) or
      "below" (value on the next line, under the key).
    value_align: "left" (values start at the tab) or "right" (values end at
      `x + width`), for "right" arrangements.
    width: group width for right-aligned values.
    spacing: extra space between pairs, in lines.
  Returns:
    The y below the group.
  """
  c.new_block()
  lh = c.line_height()
  if arrangement == "right":
    tab = x + max(c.text_width(k.split()) for k, _, _ in pairs) + 1.5 * c.char_width()
    right = x + (width if width is not None else pair_group_width(c, pairs, "right"))
    for key, value, label in pairs:
      c.put(key, x, y)
      k = c.last_segment
      if value_align == "right":
        c.put(value, right, y, label=label, align="right", key=k)
      else:
        c.put(value, tab, y, label=label, key=k)
      y += lh * (1 + spacing)
  else:
    for key, value, label in pairs:
      c.put(key, x, y)
      c.put(value, x, y + lh, label=label, key=c.last_segment)
      y += lh * (2 + spacing)
  return y


def pair_group_width(c: Canvas, pairs: Sequence[tuple[str, str, str | None]],
                     arrangement: str) -> float:
  keys = max(c.text_width(k.split()) for k, _, _ in pairs)
  vals = max(c.text_width(v.split()) for _, v, _ in pairs)
  if arrangement == "right":
    return keys + 1.5 * c.char_width() + vals
  return max(keys, vals)


def arrange_row(c: Canvas, items: Sequence[tuple[float, Callable[[float, float], float]]],
                y: float, min_gap_chars: float = 3.0) -> float:
  """Sets blocks side by side from height `y`: the first at the left margin, the
  last flush right, the others spread between. Blocks that do not fit side by
  side are stacked instead. `items` are `(width, place(x, y) -> y_below)`.
  Returns the y below the lowest block.
  """
  gap = min_gap_chars * c.char_width()
  total = sum(w for w, _ in items) + gap * (len(items) - 1)
  if len(items) == 1 or total > c.content_width:
    for _, place in items:
      y = place(c.left, y) + 0.5 * c.line_height()
    return y
  spare = (c.content_width - total) / (len(items) - 1)
  x, bottom = c.left, y
  for w, place in items:
    bottom = max(bottom, place(x, y))
    x += w + gap + spare
  return bottom


def kv_strip(c: Canvas, pairs: Sequence[tuple[str, str, str | None]], x: float, width: float,
             y: float) -> float:
  """Keys side by side on one line, each value on the line below its key.

  Read line by line (as a naive OCR does) this gives "k1 k2 k3 v1 v2 v3": only
  the x alignment ties a value to its key. Returns the y below the strip.
  """
  c.new_block()
  lh = c.line_height()
  step = width / len(pairs)
  for i, (key, value, label) in enumerate(pairs):
    c.put(key, x + i * step, y)
    c.put(value, x + i * step, y + lh, label=label, key=c.last_segment)
  return y + 2 * lh


def kv_strip_fits(c: Canvas, pairs: Sequence[tuple[str, str, str | None]], width: float) -> bool:
  step = width / len(pairs)
  gap = 1.5 * c.char_width()
  return all(max(c.text_width(k.split()), c.text_width(v.split())) + gap <= step
             for k, v, _ in pairs)


# ------------------------------------------------------------------------ items
@dataclasses.dataclass
class LengthPlan:
  """How long a document grows: an item count (one page), a page count or a word count."""
  items: int
  pages: int = 1
  target_words: int = 0
  last_fill: float = 1.0  # how far down the last page the items may go (multi-page)


def fill_rows(c: Canvas, plan: LengthPlan, row_height: float, tail_height: float,
              place_row: Callable[[int, float], None]) -> int:
  """Adds item rows until the plan is met; returns the number of rows.

  `place_row(i, y)` draws row `i` at height `y`. Rows never overlap the space
  kept for the tail (totals, notes) on the page the tail will go on; page
  breaks call the canvas's `on_new_page` (which repeats the table header).
  """
  n = 0
  while True:
    if plan.target_words:
      if c.num_words >= plan.target_words:
        break
    elif plan.pages > 1 and c.page >= plan.pages - 1:
      limit = c.top + plan.last_fill * (c.bottom - c.top)
      if c.y + row_height + tail_height > min(c.bottom, limit):
        break
    elif plan.pages <= 1:
      if n >= plan.items or not c.fits(row_height + tail_height):
        break
    if not c.fits(row_height):
      c.new_page()
    place_row(n, c.y)
    c.y += row_height
    n += 1
  return n


@dataclasses.dataclass
class Column:
  """One table column: its kind (see `vocab.COLUMN_HEADERS`), header, geometry."""
  kind: str
  header: str
  width: float = 0.0
  x: float = 0.0        # left edge
  align: str = "left"

  @property
  def anchor(self) -> float:
    if self.align == "right":
      return self.x + self.width
    if self.align == "center":
      return self.x + self.width / 2
    return self.x


ITEM_LABELS = {"desc": "item_desc", "qty": "item_qty", "unit_price": "item_unit_price",
               "amount": "item_amount"}
NUMERIC = ("qty", "unit_price", "amount", "tax_rate", "discount")


def choose_columns(rng: random.Random, *, shuffle: bool) -> list[str]:
  """A column order: optional line number / code, the description, and the numbers.

  With `shuffle`, the numeric columns come in a random order (so neither their
  position in a row nor their format tells them apart, only the header does).
  """
  numeric = ["qty", "unit_price", "amount"]
  # O columns of the same number kind: only the header says they are not items.
  if rng.random() < 0.3:
    numeric.append("tax_rate")
  if rng.random() < 0.15:
    numeric.append("discount")
  if shuffle:
    rng.shuffle(numeric)
  else:
    numeric = [k for k in ("qty", "unit_price", "discount", "tax_rate", "amount") if k in numeric]
  if rng.random() < 0.25:
    numeric.insert(numeric.index("qty") + 1, "unit")
  cols = ["desc"] + numeric
  if rng.random() < 0.2:
    cols.remove("qty")
    cols.insert(0, "qty")
  if rng.random() < 0.25:
    cols.insert(0, "code")
  if rng.random() < 0.3:
    cols.insert(0, "no")
  return cols


class Table:
  """A line-item table: a header row and item rows, one segment per cell."""

  def __init__(self, c: Canvas, rng: random.Random, style: values.ValueStyle, kinds: Sequence[str],
               *, x: float, width: float, menu: bool = False, header: bool = True,
               row_spacing: float = 1.0):
    self.c, self.rng, self.style = c, rng, style
    self.menu = menu
    self.header = header
    case = rng.choice(("title", "upper", "title")) if style.key_case != "upper" else "upper"
    self.columns = []
    self.kinds = frozenset(kinds)
    for kind in kinds:
      name = rng.choice(vocab.COLUMN_HEADERS[kind])
      self.columns.append(Column(kind, name.upper() if case == "upper" else name))
    self.font_size = c.font_size
    self.row_spacing = row_spacing
    self.amounts: list[float] = []
    self.header_segments: dict[str, int] = {}
    self._layout(x, width)

  # Widest value a column is expected to show, to size it.
  def _sample_width(self, kind: str, fs: float) -> float:
    s = self.style
    samples = {
        "no": "999", "code": "AA-99999", "unit": "pack", "tax_rate": "20%", "discount": "10%",
        "qty": s.quantity(999),
        "unit_price": s.cell_money(9999.99 * s.price_scale),
        "amount": s.cell_money(99999.99 * s.price_scale),
    }
    return self.c.text_width(samples[kind].split(), fs)

  def _layout(self, x: float, width: float):
    c = self.c
    fs = self.font_size
    min_desc_chars = 16
    for _ in range(12):
      cw = c.char_width(fs)
      gap = 2.0 * cw
      fixed = 0.0
      for col in self.columns:
        col.width = max(c.text_width(col.header.split(), fs),
                        0.0 if col.kind == "desc" else self._sample_width(col.kind, fs))
        if col.kind != "desc":
          fixed += col.width
      fixed += gap * (len(self.columns) - 1)
      desc = width - fixed
      if desc >= min_desc_chars * cw:
        break
      fs *= 0.88  # a smaller table font, as dense invoices use
    self.font_size = fs
    cw = c.char_width(fs)
    desc_col = next(col for col in self.columns if col.kind == "desc")
    max_desc = 36 * cw
    desc_col.width = max(min(desc, max_desc), min_desc_chars * cw)
    spare = max(0.0, width - fixed - desc_col.width)
    gap = 2.0 * cw + (spare / (len(self.columns) - 1) if len(self.columns) > 1 else 0.0)
    numeric_align = self.rng.choice(("right", "right", "right", "left", "center"))
    xpos = x
    for col in self.columns:
      col.x = xpos
      col.align = numeric_align if col.kind in NUMERIC else "left"
      xpos += col.width + gap
    self.right = xpos - gap

  @property
  def row_height(self) -> float:
    return self.c.line_height(self.font_size) * self.row_spacing

  def column(self, kind: str) -> Column | None:
    return next((col for col in self.columns if col.kind == kind), None)

  def place_header(self, c: Canvas | None = None):
    """Draws the header row at the cursor and moves the cursor below it."""
    c = c or self.c
    c.new_block()
    if not self.header:
      return
    for col in self.columns:
      c.put(col.header, col.anchor, c.y, font_size=self.font_size, align=col.align)
      # Cells below link to the latest header of their column (repeated on each page).
      self.header_segments[col.kind] = c.last_segment
    # The rows stay in the header's block: a table is one region for block shuffling.
    c.y += c.line_height(self.font_size) * 1.3

  def place_row(self, i: int, y: float):
    """Draws item `i` (random description, quantity and price) at height `y`."""
    rng, s, c = self.rng, self.style, self.c
    if self.menu:
      name, low, high = rng.choice(vocab.MENU_ITEMS)
      desc = name.upper() if rng.random() < 0.3 else name
      qty = 1 + int(rng.random() ** 3 * 4)
    else:
      desc, low, high = values.product_description(rng)
      if s.qty_decimals and rng.random() < 0.5:
        qty = round(0.5 + rng.random() * 20, 1 if s.qty_decimals == 1 else 2)
      else:
        qty = 1 + int(rng.random() ** 2.5 * 49)
    unit_price = s.round_money(values.log_uniform(rng, low, high) * s.price_scale)
    amount = s.round_money(qty * unit_price)
    self.amounts.append(amount)
    cells = {"qty": s.quantity(qty), "unit_price": s.cell_money(unit_price),
             "amount": s.cell_money(amount)}
    # The optional O columns (drawn only when present).
    kinds = self.kinds
    if "no" in kinds:
      cells["no"] = str(i + 1)
    if "code" in kinds:
      cells["code"] = values.fill_pattern(rng, rng.choice(("AA-9999", "99999", "A999-99", "AAA99")))
    if "unit" in kinds:
      cells["unit"] = rng.choice(vocab.UNITS)
    if "tax_rate" in kinds:
      cells["tax_rate"] = rng.choice(("0%", "5%", "7%", "10%", "19%", "20%", "0", "10", "20", "8.5"))
    if "discount" in kinds:
      cells["discount"] = rng.choice(("0%", "5%", "10%", s.number(0), s.number(5)))
    fs = self.font_size
    for col in self.columns:
      if col.kind == "desc":
        words = desc.split()
        while len(words) > 1 and c.text_width(words, fs) > col.width:
          words.pop()
        text = words
      else:
        text = cells[col.kind]
      c.put(text, col.anchor, y, font_size=fs, label=ITEM_LABELS.get(col.kind), align=col.align,
            key=self.header_segments.get(col.kind))


def totals_rows(rng: random.Random, style: values.ValueStyle, *, upper: bool = False,
                tax_probability: float = 0.85,
                extras: Sequence[str] = vocab.DISTRACTOR_TOTAL_KEYS) -> list[tuple[str, str]]:
  """Chooses the totals lines before the amounts are known: `(kind, key text)`.

  Kinds: "subtotal", "tax", "total", or "extra" (shipping, discount...: O).
  The tax rate, when the key shows one, is remembered for `totals_values` in
  the kind string ("tax:20").
  """
  rows = []
  if rng.random() < 0.85:
    rows.append(("subtotal", rng.choice(vocab.SUBTOTAL_KEYS)))
  if rng.random() < 0.25:
    rows.append(("extra", rng.choice(extras)))
  if rng.random() < tax_probability:
    key = rng.choice(vocab.TAX_KEYS)
    rate = rng.choice((5, 6, 7, 8, 10, 12, 15, 19, 20, 21))
    if rng.random() < 0.5:
      key = f"{key} ({rate}%)" if rng.random() < 0.5 else f"{key} {rate}%"
    rows.append((f"tax:{rate}", key))
  rows.append(("total", rng.choice(vocab.TOTAL_KEYS)))
  out = []
  for kind, key in rows:
    key = style.key(key)
    out.append((kind, key.upper() if upper else key))
  return out


def totals_values(rng: random.Random, style: values.ValueStyle, rows: Sequence[tuple[str, str]],
                  amounts: Sequence[float]) -> list[tuple[str, str, str | None]]:
  """Fills in the totals lines from the item amounts: `(key, value, label)`."""
  subtotal = style.round_money(sum(amounts))
  total = subtotal
  out = []
  for kind, key in rows:
    if kind == "subtotal":
      value = subtotal
    elif kind.startswith("tax"):
      kind, rate = kind.split(":")
      value = style.round_money(subtotal * int(rate) / 100)
      total += value
    elif kind == "extra":
      value = style.round_money(values.log_uniform(rng, 1, 50) * style.price_scale)
      if any(w in key.lower() for w in ("discount", "deposit", "paid", "rounding")):
        value = -min(value, style.round_money(subtotal / 2))  # deducted, shown negative
      total += value
    else:
      value = style.round_money(total)
    out.append((key, style.money(value), None if kind == "extra" else kind))
  return out
