"""Realistic field values: names, addresses, phone numbers, ids, dates and amounts.

A `ValueStyle` holds the per-document formatting choices (number format,
currency, date format, how keys are written), so all values of one document
look consistent with each other while documents differ. Quantities, unit prices
and amounts share one number format within a document: that is what makes them
"the same kind of token" whose label only the table column decides.

All randomness comes from the `random.Random` passed in, so values are
deterministic in the caller's seed.
"""

from __future__ import annotations

import dataclasses
import datetime
import random

from flaxdoc.data.synthetic import vocab

_UPPER = "ABCDEFGHJKLMNPQRSTUVWXYZ"  # no I / O: as on real ids
_DIGITS = "0123456789"

# (thousands separator, decimal separator) pairs seen on real documents.
_NUMBER_FORMATS = ((",", "."), ("", "."), (".", ","), ("", ","), ("'", "."))
# (symbol, placement): "pre" -> "$12.00", "pre_space" -> "USD 12.00", "post_space" -> "12.00 EUR".
_CURRENCIES = (("$", "pre"), ("€", "pre"), ("£", "pre"), ("USD", "pre_space"), ("EUR", "post_space"),
               ("€", "post_space"), ("RM", "pre"), ("S$", "pre"), ("CHF", "pre_space"), ("", "none"))
# Currencies without minor units (amounts look like "45,000").
_INTEGER_CURRENCIES = (("Rp", "pre_space"), ("¥", "pre"), ("IDR", "pre_space"), ("", "none"))

_DATE_FORMATS = ("iso", "dmy_slash", "mdy_slash", "dmy_dot", "d_mon_y", "month_d_y", "d_mon_yy",
                 "mon_d_y", "d_month_y", "dmy_dash")
_FIRST_DAY = datetime.date(2012, 1, 1).toordinal()
_LAST_DAY = datetime.date(2026, 12, 31).toordinal()

_ID_PATTERNS = ("INV-9999", "INV-{Y}-99999", "99999", "A-99999", "#999999", "{Y}/9999", "SO-999999",
                "9999999999", "AA-9999-99", "INV99999", "{Y}-99999", "99-99999", "AA999999",
                "R9999999")
_DISTRACTOR_ID_PATTERNS = ("PO-99999", "C-9999", "AA999999999", "99999999", "9999-9999",
                           "AA-99999", "999999", "{Y}-9999", "P99999")
_PHONE_PATTERNS = ("+1 (999) 999-9999", "(999) 999-9999", "999-999-9999", "+44 99 9999 9999",
                   "099 9999 9999", "+49 99 99999999", "+61 9 9999 9999", "(09) 9999 9999",
                   "+60 3-9999 9999", "+65 9999 9999", "999.999.9999", "+33 9 99 99 99 99",
                   "9999 999 999", "+91 99999 99999")


def fill_pattern(rng: random.Random, pattern: str, year: int | None = None) -> str:
  """Replaces `9` by a random digit and `A` by a random capital; `{Y}` by the year."""
  if year is not None and "{Y}" in pattern:
    pattern = pattern.replace("{Y}", str(year))
  out = []
  for c in pattern:
    if c == "9":
      out.append(_DIGITS[int(rng.random() * 10)])
    elif c == "A":
      out.append(_UPPER[int(rng.random() * len(_UPPER))])
    else:
      out.append(c)
  return "".join(out)


@dataclasses.dataclass
class ValueStyle:
  """Formatting choices shared by all values of one document."""
  thousands: str
  decimal: str
  decimals: int          # 2 for most currencies, 0 for currencies without minor units
  price_scale: float     # 1, or ~1000 for currencies without minor units
  currency: str
  currency_place: str    # "pre", "pre_space", "post_space" or "none"
  currency_in_cells: bool
  qty_decimals: int      # 0: "3"; 1 or 2: "3.0" / "3.00" (same look as prices)
  date_format: str
  key_case: str          # "title", "upper" or "lower"
  key_colon: bool

  @classmethod
  def sample(cls, rng: random.Random, kind: str) -> "ValueStyle":
    integer_currency = rng.random() < 0.15
    if integer_currency:
      currency, place = rng.choice(_INTEGER_CURRENCIES)
      thousands, decimal = rng.choice(((",", "."), (".", ",")))
      decimals, scale = 0, rng.choice((100.0, 1000.0))
    else:
      currency, place = rng.choice(_CURRENCIES)
      thousands, decimal = rng.choice(_NUMBER_FORMATS)
      decimals, scale = 2, 1.0
    # Quantities printed like prices on a good share of documents, so that the
    # token shape alone cannot separate the numeric columns.
    r = rng.random()
    qty_decimals = 0 if r < 0.45 or decimals == 0 else (2 if r < 0.85 else 1)
    return cls(
        thousands=thousands, decimal=decimal, decimals=decimals, price_scale=scale,
        currency=currency, currency_place=place, currency_in_cells=rng.random() < 0.25,
        qty_decimals=qty_decimals, date_format=rng.choice(_DATE_FORMATS),
        key_case="upper" if kind == "receipt" and rng.random() < 0.6 else
        rng.choice(("title", "title", "title", "upper", "lower")),
        key_colon=rng.random() < 0.6)

  # ------------------------------------------------------------------ numbers
  def number(self, value: float, decimals: int | None = None) -> str:
    """`value` with this document's separators (e.g. "1,234.50" or "1.234,50")."""
    decimals = self.decimals if decimals is None else decimals
    units = int(round(abs(value) * 10 ** decimals))
    whole, frac = divmod(units, 10 ** decimals)
    text = f"{whole:,}"
    if self.thousands != ",":
      text = text.replace(",", self.thousands)
    if decimals:
      text += self.decimal + f"{frac:0{decimals}d}"
    return "-" + text if value < 0 else text

  def money(self, value: float, with_currency: bool = True) -> str:
    """An amount, with the currency attached the way this document writes it."""
    text = self.number(value)
    if not with_currency or self.currency_place == "none":
      return text
    if self.currency_place == "pre":
      return self.currency + text
    if self.currency_place == "pre_space":
      return f"{self.currency} {text}"
    return f"{text} {self.currency}"

  def cell_money(self, value: float) -> str:
    return self.money(value, with_currency=self.currency_in_cells)

  def quantity(self, q: float) -> str:
    return self.number(q, self.qty_decimals)

  def round_money(self, value: float) -> float:
    return round(value, self.decimals)

  # --------------------------------------------------------------------- keys
  def key(self, text: str, colon: bool | None = None) -> str:
    """A key as this document writes keys ("Invoice No.:", "INVOICE NO.", ...)."""
    if self.key_case == "upper":
      text = text.upper()
    elif self.key_case == "lower" and len(text) > 1:
      text = text[0] + text[1:].lower()
    colon = self.key_colon if colon is None else colon
    if colon and not text.endswith(":"):
      text += ":"
    return text

  # -------------------------------------------------------------------- dates
  def date(self, ordinal: int, fmt: str | None = None) -> str:
    return format_date(ordinal, fmt or self.date_format)


def format_date(ordinal: int, fmt: str) -> str:
  """A date in one of the `_DATE_FORMATS` (month names in English, no locale)."""
  d = datetime.date.fromordinal(ordinal)
  if fmt == "iso":
    return f"{d.year:04d}-{d.month:02d}-{d.day:02d}"
  if fmt == "dmy_slash":
    return f"{d.day:02d}/{d.month:02d}/{d.year}"
  if fmt == "mdy_slash":
    return f"{d.month:02d}/{d.day:02d}/{d.year}"
  if fmt == "dmy_dot":
    return f"{d.day:02d}.{d.month:02d}.{d.year}"
  if fmt == "dmy_dash":
    return f"{d.day:02d}-{d.month:02d}-{d.year}"
  if fmt == "d_mon_y":
    return f"{d.day} {vocab.MONTHS_SHORT[d.month - 1]} {d.year}"
  if fmt == "month_d_y":
    return f"{vocab.MONTHS[d.month - 1]} {d.day}, {d.year}"
  if fmt == "d_mon_yy":
    return f"{d.day:02d}-{vocab.MONTHS_SHORT[d.month - 1]}-{d.year % 100:02d}"
  if fmt == "mon_d_y":
    return f"{vocab.MONTHS_SHORT[d.month - 1]} {d.day} {d.year}"
  if fmt == "d_month_y":
    return f"{d.day} {vocab.MONTHS[d.month - 1]} {d.year}"
  raise ValueError(f"unknown date format {fmt!r}")


def random_day(rng: random.Random) -> int:
  return _FIRST_DAY + int(rng.random() * (_LAST_DAY - _FIRST_DAY))


def year_of(ordinal: int) -> int:
  return datetime.date.fromordinal(ordinal).year


def time_of_day(rng: random.Random) -> str:
  h, m = 7 + int(rng.random() * 15), int(rng.random() * 60)
  if rng.random() < 0.3:
    return f"{(h - 1) % 12 + 1}:{m:02d} {'AM' if h < 12 else 'PM'}"
  return f"{h:02d}:{m:02d}" + (f":{int(rng.random() * 60):02d}" if rng.random() < 0.4 else "")


# --------------------------------------------------------------------- people
def person_name(rng: random.Random) -> str:
  first, last = rng.choice(vocab.FIRST_NAMES), rng.choice(vocab.LAST_NAMES)
  r = rng.random()
  if r < 0.55:
    return f"{first} {last}"
  if r < 0.7:
    return f"{first} {rng.choice(_UPPER)}. {last}"
  if r < 0.8:
    return f"{first[0]}. {last}"
  if r < 0.9:
    return f"{rng.choice(('Mr.', 'Ms.', 'Dr.', 'Mrs.'))} {first} {last}"
  return f"{last}, {first}"


def company_name(rng: random.Random) -> str:
  r = rng.random()
  if r < 0.55:
    name = f"{rng.choice(vocab.COMPANY_WORDS)} {rng.choice(vocab.COMPANY_TRADES)}"
  elif r < 0.75:
    name = f"{rng.choice(vocab.LAST_NAMES)} & {rng.choice(vocab.LAST_NAMES)}"
  elif r < 0.9:
    name = f"{rng.choice(vocab.COMPANY_WORDS)}{rng.choice(vocab.COMPANY_TRADES).lower()}"
  else:
    name = f"{rng.choice(vocab.LAST_NAMES)} {rng.choice(vocab.COMPANY_TRADES)}"
  suffix = rng.choice(vocab.COMPANY_SUFFIXES)
  return f"{name} {suffix}" if suffix else name


def party_name(rng: random.Random) -> str:
  """A buyer: a company most of the time, a person otherwise."""
  return company_name(rng) if rng.random() < 0.6 else person_name(rng)


def address_lines(rng: random.Random, max_lines: int = 4) -> list[str]:
  """1 to `max_lines` lines of a postal address (street, unit, city + postcode, country)."""
  city, region, pattern, country = rng.choice(vocab.CITIES)
  number = str(1 + int(rng.random() ** 2 * 1200))
  street = f"{rng.choice(vocab.STREET_NAMES)} {rng.choice(vocab.STREET_TYPES)}"
  if country in ("Germany", "Netherlands", "Switzerland", "Italy", "Spain") and rng.random() < 0.8:
    lines = [f"{street} {number}"]
  else:
    lines = [f"{number} {street}"]
  if rng.random() < 0.3:
    lines.append(f"{rng.choice(vocab.UNIT_PREFIXES)} {1 + int(rng.random() * 40)}")
  postcode = fill_pattern(rng, pattern)
  if country in ("USA", "Canada", "Australia", "India"):
    lines.append(f"{city}, {region} {postcode}" if region else f"{city} {postcode}")
  elif country in ("United Kingdom", "Ireland", "Japan", "Singapore"):
    lines.append(f"{city} {postcode}")
  else:
    lines.append(f"{postcode} {city}")
  if rng.random() < 0.45:
    lines.append(country)
  return lines[:max(1, max_lines)]


def phone_number(rng: random.Random) -> str:
  return fill_pattern(rng, rng.choice(_PHONE_PATTERNS))


def email_address(rng: random.Random, name: str) -> str:
  """An address at a domain made from `name` (a company) or a personal one."""
  letters = [w.lower() for w in name.replace("&", " ").replace(",", " ").split()
             if w.isalpha() and len(w) > 2]
  if not letters:
    letters = [rng.choice(vocab.COMPANY_WORDS).lower()]
  if rng.random() < 0.5:
    user = rng.choice(vocab.EMAIL_USERS)
  else:
    user = f"{rng.choice(vocab.FIRST_NAMES).lower()}.{rng.choice(vocab.LAST_NAMES).lower()}"
    user = user.replace("'", "").replace(" ", "")
  domain = "".join(letters[:2]) if rng.random() < 0.6 else letters[0]
  return f"{user}@{domain}.{rng.choice(vocab.EMAIL_TLDS)}"


def doc_number(rng: random.Random, year: int) -> str:
  return fill_pattern(rng, rng.choice(_ID_PATTERNS), year)


def distractor_id(rng: random.Random, year: int) -> str:
  """An id that is not the document number (PO, customer, VAT number): labelled O."""
  pool = _DISTRACTOR_ID_PATTERNS if rng.random() < 0.6 else _ID_PATTERNS
  return fill_pattern(rng, rng.choice(pool), year)


def product_description(rng: random.Random) -> tuple[str, float, float]:
  name, low, high = rng.choice(vocab.PRODUCTS)
  adjective = rng.choice(vocab.PRODUCT_ADJECTIVES)
  if adjective and rng.random() < 0.4:
    name = f"{adjective} {name}"
  return name, float(low), float(high)


def log_uniform(rng: random.Random, low: float, high: float) -> float:
  return low * (high / low) ** rng.random()
