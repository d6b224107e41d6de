"""The three document kinds: invoices, forms and receipts.

Each builder draws a document's content and layout from one `random.Random`
and returns the `Canvas` with its placed segments. Builders vary, per
document: where the seller and buyer blocks sit (letterhead, side by side, in
either order), whether field values sit right of or below their keys, the key
wordings, the table's column order and headers, the number and date formats,
the page size, margins and font size.
"""

from __future__ import annotations

import random
from typing import Sequence

from flaxdoc.data.synthetic import values
from flaxdoc.data.synthetic import vocab
from flaxdoc.data.synthetic.blocks import (
    LengthPlan, Line, Table, arrange_row, block_height, block_width, choose_columns, fill_rows,
    kv_group, kv_strip, kv_strip_fits, pair_group_width, place_lines, totals_rows, totals_values)
from flaxdoc.data.synthetic.canvas import Canvas

KINDS = ("form", "invoice", "receipt")

# (width, height) in pixels: A4 and US Letter at 300 and 200 dpi.
_PAGE_SIZES = ((2480, 3508), (2550, 3300), (1654, 2339), (1700, 2200))


def _page_canvas(rng: random.Random) -> Canvas:
  w, h = rng.choice(_PAGE_SIZES)
  scale = w / 2480
  fs = (32 + rng.random() * 12) * scale
  margins = (w * (0.06 + 0.04 * rng.random()), h * (0.04 + 0.03 * rng.random()),
             w * (0.06 + 0.04 * rng.random()), max(h * (0.05 + 0.03 * rng.random()), 3.5 * fs))
  return Canvas(w, h, margins, fs, char_factor=0.5 + 0.1 * rng.random())


def _contact_lines(rng: random.Random, s: values.ValueStyle, name: str, *, phone_p: float,
                   email_p: float, key_p: float = 0.7) -> list[Line]:
  """Phone / email lines of a party, with or without keys."""
  lines: list[Line] = []
  if rng.random() < phone_p:
    phone = values.phone_number(rng)
    pieces = [(s.key(rng.choice(vocab.PHONE_KEYS)), None)] if rng.random() < key_p else []
    lines.append((1.0, pieces + [(phone, "phone")]))
  if rng.random() < email_p:
    email = values.email_address(rng, name)
    pieces = [(s.key(rng.choice(vocab.EMAIL_KEYS)), None)] if rng.random() < key_p else []
    lines.append((1.0, pieces + [(email, "email")]))
  return lines


def _address(rng: random.Random, max_lines: int = 4) -> list[Line]:
  return [(1.0, [(line, "address")]) for line in values.address_lines(rng, max_lines)]


def _notes_lines(rng: random.Random, s: values.ValueStyle, max_notes: int) -> list[Line]:
  """Notes and bank details under the totals (all O, but full of ids and numbers)."""
  count = int(rng.random() * (max_notes + 1))
  lines: list[Line] = [(1.0, [(n, None)]) for n in rng.sample(vocab.NOTES, count)]
  if rng.random() < 0.35:
    iban = values.fill_pattern(rng, "AA99 AAAA 9999 9999 9999 99")
    lines.append((1.0, [(s.key("Bank"), None), (rng.choice(vocab.BANKS), None),
                        (s.key("IBAN"), None), (iban, None)]))
  return lines


def _page_footers(c: Canvas, rng: random.Random, extra: str | None):
  """Page numbers (and an optional company line) in the bottom margin of every page."""
  n = c.num_pages
  numbered = n > 1 or rng.random() < 0.4
  fmt = rng.choice(("Page {i} of {n}", "{i}/{n}", "- {i} -", "Page {i}", "{i} of {n}"))
  align = rng.choice(("center", "right", "right"))
  x = {"center": (c.left + c.right) / 2, "right": c.right}[align]
  fs = c.font_size * 0.8
  for p in range(n):
    y = c.page_heights[p] - (c.page_heights[p] - c.bottom) * 0.6
    c.new_block()
    if extra:
      c.put(extra, (c.left + c.right) / 2, y - c.line_height(fs), font_size=fs, align="center",
            page=p)
    if numbered:
      c.put(fmt.format(i=p + 1, n=n), x, y, font_size=fs, align=align, page=p)


def _meta_fields(rng: random.Random, s: values.ValueStyle, kind: str, day: int,
                 due_p: float, distractors: int) -> list[tuple[str, str, str | None]]:
  """The document's own fields (number, dates) and some O look-alikes, shuffled."""
  year = values.year_of(day)
  due = day + rng.choice((7, 10, 14, 15, 30, 30, 30, 45, 60, 90))
  pairs = [(s.key(rng.choice(vocab.DOC_ID_KEYS[kind])), values.doc_number(rng, year), "doc_id"),
           (s.key(rng.choice(vocab.DATE_KEYS[kind])), s.date(day), "date")]
  if rng.random() < due_p:
    pairs.append((s.key(rng.choice(vocab.DUE_DATE_KEYS[kind])), s.date(due), "due_date"))
  id_keys = rng.sample(vocab.DISTRACTOR_ID_KEYS, 2)
  date_key = rng.choice([k for k in vocab.DISTRACTOR_DATE_KEYS if k != "Date of Birth"])
  kinds = ["id", "id", "date", "terms"]
  rng.shuffle(kinds)
  for what in kinds[:distractors]:
    if what == "id":
      pairs.append((s.key(id_keys.pop()), values.distractor_id(rng, year), None))
    elif what == "date":
      pairs.append((s.key(date_key), s.date(day + int(rng.random() * 30) - 10), None))
    else:
      pairs.append((s.key(rng.choice(("Terms", "Payment Terms"))), rng.choice(vocab.TERMS_VALUES),
                    None))
  rng.shuffle(pairs)
  return pairs


def _meta_block(c: Canvas, rng: random.Random, pairs, value_below: float):
  """`(width, place)` for a key/value column, values right of or below the keys."""
  arrangement = "below" if rng.random() < value_below else "right"
  value_align = "right" if rng.random() < 0.3 else "left"
  width = pair_group_width(c, pairs, arrangement)
  return width, lambda x, y: kv_group(c, pairs, x, y, arrangement=arrangement,
                                      value_align=value_align, width=width)


def _lines_block(c: Canvas, lines: Sequence[Line], align: str = "left"):
  """`(width, place)` for a block of lines (left-aligned inside its column)."""
  width = block_width(c, lines)
  if align == "right":
    return width, lambda x, y: place_lines(c, lines, x + width, y, align="right")
  return width, lambda x, y: place_lines(c, lines, x, y)


def _items_and_tail(c: Canvas, rng: random.Random, s: values.ValueStyle, plan: LengthPlan,
                    shuffle_columns: float, tail_lines: Sequence[Line], continued: str):
  """The line-item table, then totals and the `tail_lines` (notes), paginating as needed."""
  lh = c.line_height()
  c.y += 0.8 * lh
  table = Table(c, rng, s, choose_columns(rng, shuffle=rng.random() < shuffle_columns),
                x=c.left, width=c.content_width, row_spacing=1.0 + 0.4 * rng.random())
  totals = totals_rows(rng, s)
  tail_h = (0.6 + 1.25 * len(totals) + 0.5) * lh + block_height(c, tail_lines)

  def continuation(cv: Canvas):
    cv.new_block()
    cv.put(continued, cv.left, cv.y, font_size=cv.font_size * 0.85)
    cv.y += 1.5 * cv.line_height()
    table.place_header(cv)

  table.place_header()
  c.on_new_page = continuation
  fill_rows(c, plan, table.row_height, tail_h, table.place_row)
  c.on_new_page = None
  if not c.fits(tail_h):
    c.new_page(repeat=False)
  c.y += 0.6 * lh
  rows = totals_values(rng, s, totals, table.amounts)
  amount = table.column("amount")
  right = amount.x + amount.width if amount.align != "left" else table.right
  key_w = max(c.text_width(k.split()) for k, _, _ in rows)
  val_w = max(c.text_width(v.split()) for _, v, _ in rows)
  x = max(c.left, right - val_w - key_w - 3 * c.char_width())
  c.y = kv_group(c, rows, x, c.y, arrangement="right", value_align="right", width=right - x) + 0.5 * lh
  c.y = place_lines(c, tail_lines, c.left, c.y)


# ------------------------------------------------------------------- invoices
def build_invoice(rng: random.Random, plan: LengthPlan, *, value_below: float,
                  shuffle_columns: float) -> Canvas:
  s = values.ValueStyle.sample(rng, "invoice")
  c = _page_canvas(rng)
  lh = c.line_height()
  seller, buyer = values.company_name(rng), values.party_name(rng)
  day = values.random_day(rng)
  meta = _meta_fields(rng, s, "invoice", day, due_p=0.75, distractors=int(rng.random() * 2.6))
  title = [(1.9, [(rng.choice(vocab.INVOICE_TITLES), None)])]

  seller_lines: list[Line] = [(1.5, [(seller, "seller")])] + _address(rng)
  seller_lines += _contact_lines(rng, s, seller, phone_p=0.8, email_p=0.6)
  if rng.random() < 0.3:
    seller_lines.append((1.0, [(s.key(rng.choice(("VAT Reg. No.", "Tax ID", "ABN", "Reg. No."))),
                                None), (values.distractor_id(rng, values.year_of(day)), None)]))
  buyer_lines: list[Line] = [(1.0, [(s.key(rng.choice(vocab.BUYER_HEADERS)), None)]),
                             (1.0, [(buyer, "buyer")])] + _address(rng)
  buyer_lines += _contact_lines(rng, s, buyer, phone_p=0.25, email_p=0.3)
  parties = [_lines_block(c, buyer_lines)]
  if rng.random() < 0.2:
    ship = [(1.0, [(s.key(rng.choice(vocab.SHIP_HEADERS)), None)]),
            (1.0, [(values.party_name(rng), None)])] + _address(rng, 3)
    parties.append(_lines_block(c, ship))

  y = c.top
  if rng.random() < 0.55:
    # Letterhead: the seller at the top, the title opposite; then buyer + fields.
    align = rng.choice(("left", "right", "center"))
    if align == "center":
      y = place_lines(c, seller_lines, (c.left + c.right) / 2, y, align="center")
      y = place_lines(c, title, c.left, y + 0.5 * lh)
    else:
      anchor = c.left if align == "left" else c.right
      other = c.left if align == "right" else c.right
      other_align = "left" if align == "right" else "right"
      gap = 4 * c.char_width()
      if block_width(c, title) + block_width(c, seller_lines) + gap <= c.content_width:
        y_title = place_lines(c, title, other, y, align=other_align)
        y = max(y_title, place_lines(c, seller_lines, anchor, y, align=align))
      else:  # too wide side by side: the title goes under the letterhead
        y = place_lines(c, seller_lines, anchor, y, align=align)
        y = place_lines(c, title, other, y + 0.5 * lh, align=other_align)
  else:
    # Title and fields first, then the seller ("From") and buyer blocks side by side.
    if rng.random() < 0.5:
      y = place_lines(c, title, c.left, y)
    else:
      y = place_lines(c, title, c.right, y, align="right")
    from_lines = [(1.0, [(s.key(rng.choice(vocab.SELLER_HEADERS)), None)])] + seller_lines
    parties.insert(int(rng.random() * (len(parties) + 1)), _lines_block(c, from_lines))
  y += 0.8 * lh

  if rng.random() < 0.4 and kv_strip_fits(c, meta, c.content_width):
    y = arrange_row(c, parties, y) + 0.5 * lh
    y = kv_strip(c, meta, c.left, c.content_width, y)
  else:
    row = parties + [_meta_block(c, rng, meta, value_below)]
    if rng.random() < 0.3:
      row.insert(0, row.pop())
    y = arrange_row(c, row, y)
  c.y = y
  _items_and_tail(c, rng, s, plan, shuffle_columns, _notes_lines(rng, s, 2),
                  rng.choice(("(continued)", "Continued", "Invoice continued",
                              "continued from previous page")))
  footer = None
  if rng.random() < 0.4:
    footer = f"{seller} · www.{values.email_address(rng, seller).split('@')[1]}"
  _page_footers(c, rng, footer)
  return c


# ---------------------------------------------------------------------- forms
def build_form(rng: random.Random, plan: LengthPlan, *, value_below: float,
               shuffle_columns: float) -> Canvas:
  s = values.ValueStyle.sample(rng, "form")
  c = _page_canvas(rng)
  lh = c.line_height()
  org = values.company_name(rng)
  day = values.random_day(rng)
  year = values.year_of(day)

  # Header: the issuing organisation, then the title.
  org_lines: list[Line] = [(1.4, [(org, "seller")])]
  if rng.random() < 0.6:
    org_lines += _address(rng, 2)
  org_lines += _contact_lines(rng, s, org, phone_p=0.5, email_p=0.3)
  align = rng.choice(("left", "center", "right"))
  anchor = {"left": c.left, "center": (c.left + c.right) / 2, "right": c.right}[align]
  y = place_lines(c, org_lines, anchor, c.top, align=align) + 0.5 * lh
  title = rng.choice(vocab.FORM_TITLES)
  y = place_lines(c, [(1.8, [(title.upper() if rng.random() < 0.4 else title, None)])],
                  (c.left + c.right) / 2 if rng.random() < 0.5 else c.left, y,
                  align="center" if rng.random() < 0.5 else "left")
  if rng.random() < 0.5:
    y = place_lines(c, [(1.0, [(rng.choice(vocab.DECLARATIONS), None)])], c.left, y)
  y += 0.6 * lh

  meta = _meta_fields(rng, s, "form", day, due_p=0.5, distractors=int(rng.random() * 1.6))
  if rng.random() < 0.5 and kv_strip_fits(c, meta, c.content_width):
    y = kv_strip(c, meta, c.left, c.content_width, y) + 0.5 * lh
  else:
    w, place = _meta_block(c, rng, meta, value_below)
    x = c.right - w if rng.random() < 0.5 else c.left
    y = place(x, y) + 0.3 * lh

  # The applicant's fields, in a grid of cells.
  person = values.person_name(rng)
  fields: list[tuple[str, list[str], str | None]] = [
      (rng.choice(vocab.BUYER_NAME_KEYS), [person], "buyer")]
  address = values.address_lines(rng, 3)
  if rng.random() < 0.5:
    fields.append((rng.choice(vocab.ADDRESS_KEYS), address, "address"))
  else:
    parts = ("Street", "City", "Postcode")
    fields += [(k, [v], "address") for k, v in zip(parts, address)]
  if rng.random() < 0.85:
    fields.append((rng.choice(vocab.PHONE_KEYS[:-1]), [values.phone_number(rng)], "phone"))
  if rng.random() < 0.7:
    fields.append((rng.choice([k for k in vocab.EMAIL_KEYS if len(k) > 1]),
                   [values.email_address(rng, person)], "email"))
  if rng.random() < 0.5:
    dob = day - 365 * (18 + int(rng.random() * 60)) - int(rng.random() * 365)
    fields.append(("Date of Birth", [s.date(dob)], None))
  for key, options in rng.sample(vocab.FORM_OTHER_FIELDS, int(rng.random() * 3.5)):
    fields.append((key, [rng.choice(options) if options else values.company_name(rng)], None))
  if rng.random() < 0.3:
    fields.append((rng.choice(vocab.DISTRACTOR_ID_KEYS), [values.distractor_id(rng, year)], None))
  head, rest = fields[:1], fields[1:]
  rng.shuffle(rest)
  fields = head + rest if rng.random() < 0.6 else rest[:1] + head + rest[1:]
  arrangement = "below" if rng.random() < value_below else "right"
  sections = rng.sample(vocab.FORM_SECTIONS[:6], 2)
  split = len(fields) if rng.random() < 0.5 else max(1, len(fields) // 2)
  for part, heading in ((fields[:split], sections[0]), (fields[split:], sections[1])):
    if not part:
      continue
    if rng.random() < 0.7:
      y = place_lines(c, [(1.15, [(f"{rng.choice(('', 'Section ', ''))}{heading}".strip(), None)])],
                      c.left, y + 0.3 * lh)
    y = _field_grid(c, rng, s, part, arrangement, y) + 0.3 * lh
  c.y = y

  tail: list[Line] = [(1.0, [(rng.choice(vocab.DECLARATIONS), None)])]
  tail.append((1.0, [(s.key("Signature"), None), ("______________", None),
                     (s.key("Date"), None), ("__________", None)]))
  if plan.pages > 1 or plan.target_words or rng.random() < 0.45:
    _items_and_tail(c, rng, s, plan, shuffle_columns, tail, "(continued)")
  else:
    c.y = place_lines(c, tail, c.left, c.y + lh)
  code = values.fill_pattern(rng, rng.choice(("Form AA-999", "AAA 9999", "F-99", "Form 999A")))
  _page_footers(c, rng, f"{code} Rev. {rng.choice(vocab.MONTHS_SHORT)} {year - 2}")
  return c


def _field_grid(c: Canvas, rng: random.Random, s: values.ValueStyle,
                fields: Sequence[tuple[str, list[str], str | None]], arrangement: str,
                y: float) -> float:
  """Form fields in 1-3 columns of cells; returns the y below the grid."""
  gap = 2.0 * c.char_width()

  def cell_width(key, lines):
    kw = c.text_width(s.key(key).split())
    vw = max(c.text_width(v.split()) for v in lines)
    return kw + gap + vw if arrangement == "right" else max(kw, vw)

  widest = max(cell_width(k, v) for k, v, _ in fields)
  ncols = max(n for n in (1, 2, 3) if n == 1 or widest + gap <= c.content_width / n)
  ncols = min(ncols, 1 + int(rng.random() * ncols))
  step = c.content_width / ncols
  lh = c.line_height()
  for start in range(0, len(fields), ncols):
    bottom = y
    for j, (key, lines, label) in enumerate(fields[start:start + ncols]):
      x = c.left + j * step
      c.new_block()
      c.put(s.key(key), x, y)
      key_segment = c.last_segment
      if arrangement == "right":
        vx, vy = x + c.text_width(s.key(key).split()) + gap, y
      else:
        vx, vy = x, y + lh
      for line in lines:
        c.put(line, vx, vy, label=label, key=key_segment)
        vy += lh
      bottom = max(bottom, vy)
    y = bottom + 0.4 * lh
  return y


# ------------------------------------------------------------------- receipts
class _TwoLineItems:
  """Receipt items as "NAME ... AMOUNT" over an indented "QTY x UNIT-PRICE" line."""

  def __init__(self, c: Canvas, rng: random.Random, s: values.ValueStyle):
    self.c, self.rng, self.s = c, rng, s
    self.amounts: list[float] = []
    self.sep = rng.choice(("x", "X", "@", "x", "*"))
    self.indent = c.left + c.char_width() * rng.choice((0, 2, 4))
    self.row_height = 2 * c.line_height()

  def place_row(self, i: int, y: float):
    c, rng, s = self.c, self.rng, self.s
    name, low, high = rng.choice(vocab.MENU_ITEMS)
    qty = 1 + int(rng.random() ** 2 * 5)
    unit = s.round_money(values.log_uniform(rng, low, high) * s.price_scale)
    amount = s.round_money(qty * unit)
    self.amounts.append(amount)
    c.put(name.upper() if s.key_case == "upper" else name, c.left, y, label="item_desc")
    c.put(s.cell_money(amount), c.right, y, label="item_amount", align="right")
    y2 = y + c.line_height()
    _, x1 = c.put(s.quantity(qty), self.indent, y2, label="item_qty")
    _, x1 = c.put(self.sep, x1 + 0.5 * c.char_width(), y2)
    c.put(s.cell_money(unit), x1 + 0.5 * c.char_width(), y2, label="item_unit_price")


def build_receipt(rng: random.Random, plan: LengthPlan, *, value_below: float,
                  shuffle_columns: float) -> Canvas:
  del value_below  # receipts write values next to their keys
  s = values.ValueStyle.sample(rng, "receipt")
  width = 560 + int(rng.random() * 400)
  chars = 34 + int(rng.random() * 12)
  margin = width * (0.04 + 0.04 * rng.random())
  char_factor = 0.55 + 0.05 * rng.random()
  fs = (width - 2 * margin) / (chars * char_factor)
  c = Canvas(width, 4600, (margin, margin, margin, 2 * fs), fs, char_factor=char_factor)
  lh = c.line_height()
  upper = s.key_case == "upper"

  store = rng.choice(vocab.SHOP_NAMES) if rng.random() < 0.6 else values.company_name(rng)
  head: list[Line] = [(1.3, [(store.upper() if upper else store, "seller")])] + _address(rng, 3)
  head += _contact_lines(rng, s, store, phone_p=0.75, email_p=0.1, key_p=0.6)
  if rng.random() < 0.35:
    head.append((1.0, [(s.key(rng.choice(("GST Reg No", "VAT No", "Tax ID", "ABN"))), None),
                       (values.distractor_id(rng, 2020), None)]))
  centered = rng.random() < 0.8
  if centered:
    y = place_lines(c, head, (c.left + c.right) / 2, c.top, align="center")
  else:
    y = place_lines(c, head, c.left, c.top)
  rule = rng.choice(("-", "=", "*", "_"))
  rule_line: list[Line] = [(1.0, [(rule * chars, None)])] if rng.random() < 0.6 else []
  y = place_lines(c, rule_line, c.left, y) if rule_line else y + 0.4 * lh

  # Date / time / receipt number / cashier: pairs on lines, some sharing a line.
  day = values.random_day(rng)
  date_pieces = ([(s.key(rng.choice(vocab.DATE_KEYS["receipt"])), None)] if rng.random() < 0.6
                 else []) + [(s.date(day), "date")]
  id_pieces = [(s.key(rng.choice(vocab.DOC_ID_KEYS["receipt"])), None),
               (values.doc_number(rng, values.year_of(day)), "doc_id")]
  c.new_block()
  x = c.left
  for text, label in date_pieces:
    _, x = c.put(text, x, y, label=label)
    x += c.char_width()
  c.put(values.time_of_day(rng), c.right, y, align="right")
  y += lh
  lines: list[Line] = [(1.0, id_pieces)]
  if rng.random() < 0.5:
    name = rng.choice(vocab.FIRST_NAMES)
    lines.append((1.0, [(s.key(rng.choice(vocab.RECEIPT_META_KEYS)), None),
                        (name.upper() if upper else name, None)]))
  if rng.random() < 0.15:
    lines.append((1.0, [(s.key("Customer"), None), (values.person_name(rng), "buyer")]))
  rng.shuffle(lines)
  y = place_lines(c, lines, c.left, y)
  y = place_lines(c, rule_line, c.left, y) if rule_line else y + 0.4 * lh
  c.y = y

  # Items, then totals, payment and footer lines.
  variant = rng.random()
  if variant < 0.35:
    items = _TwoLineItems(c, rng, s)
    c.new_block()
  else:
    if variant < 0.65:
      kinds = ["desc", "qty", "unit_price", "amount"]
      if rng.random() < shuffle_columns:
        numeric = kinds[1:]
        rng.shuffle(numeric)
        kinds = ["desc"] + numeric
    else:
      kinds = ["qty", "desc", "amount"]
    items = Table(c, rng, s, kinds, x=c.left, width=c.content_width, menu=True,
                  header=variant < 0.85)
    items.place_header()
  totals = totals_rows(rng, s, upper=upper, tax_probability=0.7,
                       extras=("Service Charge", "Rounding", "Discount", "Tip"))
  pay_key = s.key(rng.choice(vocab.RECEIPT_PAYMENT_KEYS))
  change_key = s.key(rng.choice(vocab.RECEIPT_CHANGE_KEYS))
  footer = rng.sample(vocab.RECEIPT_FOOTERS, 1 + int(rng.random() * 2))
  tail_h = (len(rule_line) + 1.25 * (len(totals) + 2) + 1.0 + len(footer)) * lh
  fill_rows(c, plan, items.row_height, tail_h, items.place_row)
  if not c.fits(tail_h):
    c.new_page(repeat=False)
  y = place_lines(c, rule_line, c.left, c.y) if rule_line else c.y + 0.4 * lh
  rows = totals_values(rng, s, totals, items.amounts)
  total = rows[-1][1]
  paid = s.money(_round_up(s, _parse_money(s, total)))
  rows += [(pay_key, paid, None),
           (change_key, s.money(_parse_money(s, paid) - _parse_money(s, total)), None)]
  y = kv_group(c, rows, c.left, y, arrangement="right", value_align="right",
               width=c.content_width) + 0.5 * lh
  y = place_lines(c, [(1.0, [(f, None)]) for f in footer],
                  (c.left + c.right) / 2 if centered else c.left, y,
                  align="center" if centered else "left")
  c.y = y
  c.shrink_pages(2 * fs)
  return c


def _parse_money(s: values.ValueStyle, text: str) -> float:
  """Inverse of `ValueStyle.money` (used for the paid / change lines)."""
  digits = "".join(ch for ch in text if ch.isdigit() or ch == s.decimal or ch == "-")
  if s.decimal != ".":
    digits = digits.replace(s.decimal, ".")
  return float(digits) if digits not in ("", "-") else 0.0


def _round_up(s: values.ValueStyle, amount: float) -> float:
  step = 5.0 * s.price_scale if amount < 50 * s.price_scale else 10.0 * s.price_scale
  return (int(amount // step) + 1) * step


BUILDERS = {"invoice": build_invoice, "form": build_form, "receipt": build_receipt}
