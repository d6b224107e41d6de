"""Tests of the synthetic dataset (`flaxdoc.data.synthetic`).

Numbers are checked against independent computations (amounts re-derived from
the printed quantity and unit price, headers looked up geometrically), and
properties (determinism, validity, reading-order invariances) over a few
hundred generated documents.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from flaxdoc import tags as tagging
from flaxdoc.data.document import Document
from flaxdoc.data.synthetic import (LABELS, SPLIT_STARTS, SyntheticConfig, corpus_text, generate,
                                    load_synthetic, make_document)
from flaxdoc.data.synthetic import vocab
from flaxdoc.data.synthetic.__main__ import main as cli_main

ITEM_NUMERIC = ("item_qty", "item_unit_price", "item_amount")
# A bare number in any of the generator's formats: "3", "3.00", "1,234.50", "1.234,50", "1'234.50".
PLAIN_NUMBER = re.compile(r"^\d{1,3}(?:[,.']?\d{3})*(?:[.,]\d{1,2})?$")


@pytest.fixture(scope="module")
def docs() -> list[Document]:
  return generate(300, seed=3)


@pytest.fixture(scope="module")
def invoices() -> list[Document]:
  return generate(120, seed=5, config=SyntheticConfig(kinds=("invoice",)))


def _words(doc: Document, entity) -> list[str]:
  return [doc.words[i] for i in entity.words]


def _parse_number(text: str) -> float:
  """Reads a printed number without knowing its format: a final separator
  followed by exactly three digits groups thousands, any other is the decimal point."""
  digits = re.sub(r"[^\d,.']", "", text)
  m = re.search(r"[,.'](\d+)$", digits)
  if m and len(m.group(1)) != 3:
    whole, frac = digits[:m.start()], m.group(1)
    return float(re.sub(r"\D", "", whole) or "0") + float("0." + frac)
  return float(re.sub(r"\D", "", digits))


def _overlap(a0, a1, b0, b1) -> float:
  return max(0.0, min(a1, b1) - max(a0, b0))


# ------------------------------------------------------------------ determinism
def test_same_seed_and_index_give_the_same_document():
  a = make_document(11, 42)
  generate(5, seed=11, start=40)  # other documents in between change nothing
  b = make_document(11, 42)
  assert a.id == b.id == "synthetic-11-42"
  assert a.words == b.words
  np.testing.assert_array_equal(a.boxes, b.boxes)
  np.testing.assert_array_equal(a.pages, b.pages)
  np.testing.assert_array_equal(a.segments, b.segments)
  np.testing.assert_array_equal(a.page_sizes, b.page_sizes)
  assert a.entities == b.entities
  assert a.label_set == LABELS


def test_different_index_or_seed_give_different_documents():
  base = make_document(0, 0)
  others = [make_document(0, i) for i in range(1, 20)] + [make_document(s, 0) for s in (1, 2, 3)]
  assert all(o.words != base.words for o in others)
  assert len({o.words for o in others}) == len(others)


def test_documents_do_not_depend_on_the_process():
  """Another interpreter, with another string-hash seed, makes the same documents."""
  code = ("import json, sys; sys.path.insert(0, sys.argv[1]);"
          "from flaxdoc.data.synthetic import SyntheticConfig, generate;"
          "docs = generate(12, seed=9, config=SyntheticConfig(ocr_noise=0.2, shuffle_blocks=0.5));"
          "print(json.dumps([[d.words, d.boxes.tolist(), d.segments.tolist(),"
          " [[e.label, e.words] for e in d.entities]] for d in docs]))")
  root = Path(__file__).resolve().parents[2]
  env = dict(os.environ, PYTHONHASHSEED="12345")
  out = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True,
                       env=env, cwd=root, check=True)
  theirs = json.loads(out.stdout)
  ours = generate(12, seed=9, config=SyntheticConfig(ocr_noise=0.2, shuffle_blocks=0.5))
  for d, (words, boxes, segments, entities) in zip(ours, theirs, strict=True):
    assert list(d.words) == words
    np.testing.assert_array_equal(d.boxes, np.asarray(boxes, np.float32))
    assert d.segments.tolist() == segments
    assert [[e.label, list(e.words)] for e in d.entities] == entities


def test_generate_matches_make_document():
  batch = generate(4, seed=7, start=10)
  assert [d.id for d in batch] == [f"synthetic-7-{i}" for i in range(10, 14)]
  assert all(d.words == make_document(7, 10 + k).words for k, d in enumerate(batch))


# --------------------------------------------------------------------- validity
def _check_valid(doc: Document):
  assert len(doc) > 0 and doc.entities
  assert np.isfinite(doc.boxes).all()
  assert (doc.boxes[:, 0] <= doc.boxes[:, 2]).all() and (doc.boxes[:, 1] <= doc.boxes[:, 3]).all()
  size = doc.page_sizes[doc.pages]
  assert (doc.boxes[:, :2] >= 0).all()
  assert (doc.boxes[:, 2] <= size[:, 0]).all() and (doc.boxes[:, 3] <= size[:, 1]).all()
  assert all(w and w == w.strip() and " " not in w for w in doc.words)
  # Re-validating through the public constructor (strict box policy) succeeds unchanged.
  again = doc.replace()
  assert again.repairs == ()
  np.testing.assert_array_equal(again.boxes, doc.boxes)


def test_every_document_validates_and_stays_on_its_page(docs):
  for doc in docs:
    _check_valid(doc)
  noisy = generate(60, seed=4, config=SyntheticConfig(ocr_noise=0.3, shuffle_blocks=0.5))
  for doc in noisy:
    _check_valid(doc)


def test_page_sizes_are_a4_letter_or_receipt_shaped(docs):
  for doc in docs:
    w, h = doc.page_sizes[0]
    if w > 1500:
      assert h > w  # portrait office paper
    else:
      assert 500 <= w <= 1000  # a till roll


def test_clean_words_do_not_overlap(docs):
  """Plausible geometry: no two words of a clean document cover each other."""
  for doc in docs[:150]:
    for p in range(doc.num_pages):
      b = doc.boxes[doc.pages == p].astype(np.float64)
      ix = np.clip(np.minimum(b[:, None, 2], b[None, :, 2]) -
                   np.maximum(b[:, None, 0], b[None, :, 0]), 0, None)
      iy = np.clip(np.minimum(b[:, None, 3], b[None, :, 3]) -
                   np.maximum(b[:, None, 1], b[None, :, 1]), 0, None)
      area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
      frac = ix * iy / np.minimum(area[:, None], area[None, :])
      np.fill_diagonal(frac, 0.0)
      assert frac.max() < 0.05, doc.id


def test_single_page_by_default_and_page_counts_follow_the_config(docs):
  assert {d.num_pages for d in docs} == {1}
  three = generate(8, seed=1, config=SyntheticConfig(min_pages=3, max_pages=3))
  assert {d.num_pages for d in three} == {3}
  for d in three:
    assert set(d.pages.tolist()) == {0, 1, 2}
  varied = {d.num_pages for d in generate(30, config=SyntheticConfig(min_pages=1, max_pages=4))}
  assert varied == {1, 2, 3, 4}


def test_long_documents_reach_16k_words():
  start = time.process_time()
  doc = make_document(0, 9, SyntheticConfig(target_words=16_000, kinds=("invoice",)))
  seconds = time.process_time() - start
  assert len(doc) >= 16_000
  assert doc.num_pages > 10
  _check_valid(doc)
  assert seconds < 5.0  # measured ~0.25 s; generous for loaded CI machines
  # The table runs over the pages, with its header repeated on each.
  item_pages = {int(doc.pages[e.words[0]]) for e in doc.entities if e.label == "item_amount"}
  assert item_pages == set(range(doc.num_pages)) or len(item_pages) >= doc.num_pages - 1


# ----------------------------------------------------------------------- labels
def test_every_label_appears(docs):
  counts = collections.Counter(e.label for d in docs for e in d.entities)
  assert set(counts) == set(LABELS), set(LABELS) - set(counts)
  assert min(counts.values()) >= 30, counts
  kinds = collections.Counter(
      "receipt" if d.page_sizes[0, 0] < 1500 else "office" for d in docs)
  assert kinds["receipt"] > 50 and kinds["office"] > 150


def test_entities_are_whole_segments_and_contiguous(docs):
  for doc in docs:
    labels = doc.word_labels()
    for e in doc.entities:
      assert list(e.words) == list(range(e.words[0], e.words[-1] + 1))
      seg = {int(doc.segments[i]) for i in e.words}
      assert len(seg) == 1
      members = np.flatnonzero(doc.segments == seg.pop())
      assert sorted(members.tolist()) == list(e.words)  # the segment holds the entity only
    # A segment is one piece of one line: same page and same top for all its words.
    for s in np.unique(doc.segments):
      idx = np.flatnonzero(doc.segments == s)
      assert len(set(doc.pages[idx].tolist())) == 1
      assert np.ptp(doc.boxes[idx, 1]) < 1e-3
      assert len({labels[i] for i in idx}) == 1


@pytest.mark.parametrize("scheme", ["BIOES", "BIO"])
def test_entities_tags_spans_round_trip(docs, scheme):
  for doc in docs:
    word_tags = tagging.entities_to_tags(len(doc), doc.entities, scheme)
    spans = tagging.tags_to_spans(word_tags, scheme)
    expected = sorted((e.label, e.words[0], e.words[-1] + 1) for e in doc.entities)
    assert sorted(spans) == expected
    names = set(tagging.tag_names(LABELS, scheme))
    assert set(word_tags) <= names


def test_values_look_like_their_fields(docs):
  for doc in docs:
    for e in doc.entities:
      text = doc.entity_text(e)
      if e.label == "email":
        assert re.fullmatch(r"[\w.'-]+@[\w-]+(\.[a-z]+)+", text), text
      elif e.label == "phone":
        assert sum(ch.isdigit() for ch in text) >= 7, text
      elif e.label in ("date", "due_date"):
        assert re.search(r"\d", text) and len(text) >= 8, text


# ----------------------------------------------------------- layout is needed
def _table_cells(doc: Document):
  """`(label, word index)` of the single-word numeric item cells."""
  return [(e.label, e.words[0]) for e in doc.entities
          if e.label in ITEM_NUMERIC and len(e.words) == 1]


def test_table_amount_is_quantity_times_unit_price(invoices):
  """Reads the printed numbers back: each row's amount = quantity x unit price."""
  checked = 0
  for doc in invoices:
    rows = collections.defaultdict(dict)
    for label, i in _table_cells(doc):
      rows[(int(doc.pages[i]), round(float(doc.boxes[i, 1]), 1))][label] = doc.words[i]
    for row in rows.values():
      if len(row) == 3 and all(PLAIN_NUMBER.match(row[k]) for k in ITEM_NUMERIC):
        qty, unit, amount = (_parse_number(row[k]) for k in ITEM_NUMERIC)
        assert abs(qty * unit - amount) <= 0.01 * max(1.0, amount) + 0.01, (doc.id, row)
        checked += 1
  assert checked > 200


def test_numeric_columns_share_one_token_kind(invoices):
  """Quantity, unit price and amount cells can all be plain numbers in one document."""
  all_plain = 0
  decimals_qty = 0
  for doc in invoices:
    cells = collections.defaultdict(list)
    for label, i in _table_cells(doc):
      cells[label].append(doc.words[i])
    if set(cells) == set(ITEM_NUMERIC) and all(PLAIN_NUMBER.match(w) for v in cells.values()
                                                for w in v):
      all_plain += 1
      if any(re.search(r"[.,]\d\d$", w) for w in cells["item_qty"]):
        decimals_qty += 1  # quantities printed exactly like prices ("3.00")
  assert all_plain >= 30
  assert decimals_qty >= 5


def test_column_order_varies_and_row_position_does_not_decide(invoices):
  orders = collections.Counter()
  first_numeric = collections.Counter()
  for doc in invoices:
    xs = collections.defaultdict(list)
    for label, i in _table_cells(doc):
      xs[label].append(float(doc.boxes[i, 0] + doc.boxes[i, 2]) / 2)
    if set(xs) == set(ITEM_NUMERIC):
      order = tuple(sorted(ITEM_NUMERIC, key=lambda l: np.mean(xs[l])))
      orders[order] += 1
      first_numeric[order[0]] += 1
  assert len(orders) >= 5, orders
  # The leftmost numeric column is each of the three kinds in many documents.
  assert min(first_numeric[l] for l in ITEM_NUMERIC) >= 10, first_numeric


def test_numeric_columns_are_separated_by_x_and_named_by_the_header_above(invoices):
  """Cells of different columns never share x; the first O word above a cell (in
  its x range, skipping its own column) is a header wording of that column."""
  header_words = {
      "item_qty": vocab.COLUMN_HEADERS["qty"], "item_unit_price": vocab.COLUMN_HEADERS["unit_price"],
      "item_amount": vocab.COLUMN_HEADERS["amount"]}
  header_words = {l: {w.lower() for h in hs for w in h.split()} for l, hs in header_words.items()}
  labels_checked = collections.Counter()
  for doc in invoices:
    labels = doc.word_labels()
    spans = collections.defaultdict(lambda: [np.inf, -np.inf])
    for label, i in _table_cells(doc):
      spans[label][0] = min(spans[label][0], doc.boxes[i, 0])
      spans[label][1] = max(spans[label][1], doc.boxes[i, 2])
    names = list(spans)
    for a in range(len(names)):
      for b in range(a + 1, len(names)):
        assert _overlap(*spans[names[a]], *spans[names[b]]) == 0, (doc.id, names[a], names[b])
    for label, i in _table_cells(doc)[:12]:
      x0, y0, x1, _ = doc.boxes[i]
      above = [j for j in np.flatnonzero((doc.pages == doc.pages[i]) & (doc.boxes[:, 3] <= y0))
               if _overlap(x0, x1, doc.boxes[j, 0], doc.boxes[j, 2]) > 0 and labels[j] != label]
      nearest = max(above, key=lambda j: doc.boxes[j, 1])
      assert labels[nearest] is None, (doc.id, label, doc.words[nearest])
      assert doc.words[nearest].lower().rstrip(":") in header_words[label], (
          doc.id, label, doc.words[nearest])
      labels_checked[label] += 1
  assert min(labels_checked.values()) > 100


def test_key_value_arrangements_vary(docs):
  """Document numbers sit right of an O key on their line in some documents, under it in others."""
  right = below = 0
  for doc in docs:
    labels = doc.word_labels()
    for e in doc.entities:
      if e.label != "doc_id":
        continue
      x0, y0, _, y1 = doc.boxes[e.words[0]]
      same_line = [j for j in range(len(doc)) if labels[j] is None and doc.pages[j] == doc.pages[
          e.words[0]] and _overlap(y0, y1, doc.boxes[j, 1], doc.boxes[j, 3]) > 0.5 * (y1 - y0)
                   and doc.boxes[j, 2] <= x0]
      if same_line:
        right += 1
      else:
        below += 1
  assert right >= 30 and below >= 30, (right, below)


# ------------------------------------------------------------------ noise options
def _entity_texts(doc):
  return sorted((e.label, doc.entity_text(e)) for e in doc.entities)


@pytest.mark.parametrize("option", ["interleave_columns", "shuffle_blocks"])
def test_reading_order_noise_reorders_but_keeps_content(option):
  clean_cfg = SyntheticConfig(interleave_columns=0.0, shuffle_blocks=0.0)
  noisy_cfg = dataclasses.replace(clean_cfg, **{option: 1.0})
  changed = 0
  for index in range(40):
    clean, noisy = make_document(2, index, clean_cfg), make_document(2, index, noisy_cfg)
    assert sorted(clean.words) == sorted(noisy.words)
    assert _entity_texts(clean) == _entity_texts(noisy)
    # Same words at the same places: the multiset of (word, box) pairs is unchanged.
    key = lambda d: sorted(zip(d.words, map(tuple, d.boxes.round(3).tolist())))
    assert key(clean) == key(noisy)
    changed += clean.words != noisy.words
  assert changed >= 20


def _address_column_switches(doc: Document) -> int:
  """How often consecutive address lines (in word order) sit in different columns."""
  boxes = [doc.boxes[list(e.words)] for e in doc.entities if e.label == "address"]
  spans = [(b[:, 0].min(), b[:, 2].max()) for b in boxes]
  return sum(_overlap(*a, *b) == 0 for a, b in zip(spans, spans[1:]))


def test_interleaving_reads_side_by_side_blocks_line_by_line():
  cfg = SyntheticConfig(kinds=("invoice",), interleave_columns=1.0)
  lined = generate(40, seed=8, config=cfg)
  blocked = generate(40, seed=8, config=dataclasses.replace(cfg, interleave_columns=0.0,
                                                            shuffle_blocks=0.0))
  for doc in lined:
    # Naive OCR order: segment tops never go back up the page (beyond line jitter).
    firsts = [np.flatnonzero(doc.segments == s)[0] for s in dict.fromkeys(doc.segments.tolist())]
    y = doc.boxes[firsts, 1] + doc.pages[firsts] * 1e5
    assert (np.diff(y) > -0.5 * (doc.boxes[firsts, 3] - doc.boxes[firsts, 1])[1:]).all(), doc.id
  # Block order goes back up to read the next block, and reads each address
  # block to its end; line order alternates between side-by-side address blocks.
  assert any((np.diff(d.boxes[:, 1] + d.pages * 1e5) < -100).any() for d in blocked)
  switches_lined = sum(_address_column_switches(d) for d in lined)
  switches_blocked = sum(_address_column_switches(d) for d in blocked)
  assert switches_lined > 2 * switches_blocked, (switches_lined, switches_blocked)


def test_ocr_noise_changes_text_but_keeps_entities_consistent():
  clean_cfg = SyntheticConfig(interleave_columns=0.0, shuffle_blocks=0.0)
  noisy_cfg = dataclasses.replace(clean_cfg, ocr_noise=0.3)
  changed_words = moved = 0
  for index in range(30):
    clean, noisy = make_document(6, index, clean_cfg), make_document(6, index, noisy_cfg)
    _check_valid(noisy)
    assert [e.label for e in clean.entities] == [e.label for e in noisy.entities]
    changed_words += clean.words != noisy.words
    moved += not np.array_equal(clean.boxes.shape, noisy.boxes.shape) or not np.allclose(
        clean.boxes, noisy.boxes)
    for ce, ne in zip(clean.entities, noisy.entities):
      assert list(ne.words) == list(range(ne.words[0], ne.words[-1] + 1))
      # The damaged entity covers the same printed area (up to the box jitter).
      cb, nb = clean.boxes[list(ce.words)], noisy.boxes[list(ne.words)]
      tol = 0.2 * float(cb[0, 3] - cb[0, 1]) + 1.0
      assert abs(nb[:, 0].min() - cb[:, 0].min()) <= tol
      assert abs(nb[:, 2].max() - cb[:, 2].max()) <= tol
      # Character edits keep most of the text.
      a, b = clean.entity_text(ce).replace(" ", ""), noisy.entity_text(ne).replace(" ", "")
      assert abs(len(a) - len(b)) <= max(3, len(a) // 2)
  assert changed_words >= 25 and moved >= 25


# ------------------------------------------------------------------------ splits
def test_splits_are_disjoint_and_stable():
  train, report = load_synthetic("train", num_train=30, num_dev=10, num_test=10)
  dev, _ = load_synthetic("dev", num_train=30, num_dev=10, num_test=10)
  test, _ = load_synthetic("test", num_train=30, num_dev=10, num_test=10)
  assert (len(train), len(dev), len(test)) == (30, 10, 10)
  assert report.loaded == 30 and "synthetic" in report.summary()
  ids = [{d.id for d in s} for s in (train, dev, test)]
  assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
  texts = [{d.words for d in s} for s in (train, dev, test)]
  assert not (texts[0] & texts[1] or texts[0] & texts[2] or texts[1] & texts[2])
  assert dev[0].id == f"synthetic-0-{SPLIT_STARTS['dev']}"
  # A split does not depend on the other splits' sizes.
  dev_again, _ = load_synthetic("validation", num_train=5, num_dev=10)
  assert [d.words for d in dev_again] == [d.words for d in dev]


def test_load_synthetic_options_and_errors():
  noisy, _ = load_synthetic("train", num_train=3, ocr_noise=0.5, interleave_columns=0.0,
                            shuffle_blocks=0.0)
  clean, _ = load_synthetic("train", num_train=3, interleave_columns=0.0, shuffle_blocks=0.0)
  assert [d.words for d in noisy] != [d.words for d in clean]
  receipts, _ = load_synthetic("dev", num_dev=4, config=SyntheticConfig(kinds=("receipt",)))
  assert all(d.page_sizes[0, 0] < 1500 for d in receipts)
  as_dict, _ = load_synthetic("dev", num_dev=4, config={"kinds": "receipt"})
  assert [d.words for d in as_dict] == [d.words for d in receipts]
  with pytest.raises(ValueError, match="config must be"):
    load_synthetic("dev", num_dev=1, config=3)
  with pytest.raises(ValueError, match="split"):
    load_synthetic("training")
  with pytest.raises(ValueError, match="unknown synthetic option"):
    load_synthetic("train", num_train=1, ocr_nosie=0.1)


@pytest.mark.parametrize("bad", [
    dict(kinds=("letter",)), dict(kinds=()), dict(min_pages=0), dict(min_pages=3, max_pages=2),
    dict(ocr_noise=1.5), dict(shuffle_blocks=-0.1), dict(min_items=5, max_items=2),
    dict(target_words=-1), dict(max_pages=2.5)])
def test_config_rejects_bad_values(bad):
  with pytest.raises(ValueError, match="SyntheticConfig"):
    SyntheticConfig(**bad)


def test_config_accepts_kinds_as_a_comma_separated_string():
  assert SyntheticConfig(kinds="invoice, receipt").kinds == ("invoice", "receipt")
  assert SyntheticConfig(kinds=["form"]).kinds == ("form",)


def test_bad_seed_or_index():
  with pytest.raises(ValueError, match="index"):
    make_document(0, -1)
  with pytest.raises(ValueError, match="seed"):
    make_document("0", 1)


# ------------------------------------------------------------- corpus, CLI, speed
def test_corpus_text_has_the_documents_words():
  lines = list(corpus_text(5, seed=4))
  assert all(isinstance(l, str) and l.strip() for l in lines)
  clean = generate(5, seed=4, config=SyntheticConfig(ocr_noise=0.0))
  corpus_words = sorted(w for l in lines for w in l.split())
  assert corpus_words == sorted(w for d in clean for w in d.words)
  assert list(corpus_text(5, seed=4)) == lines


def test_cli_prints_statistics():
  out = io.StringIO()
  with redirect_stdout(out):
    assert cli_main(["--num", "12", "--seed", "1", "--show", "1"]) == 0
  text = out.getvalue()
  assert "docs/s" in text and "words / doc" in text
  for label in LABELS:
    assert label in text
  out = io.StringIO()
  with redirect_stdout(out):
    cli_main(["--num", "6", "--json", "--kinds", "receipt"])
  stats = json.loads(out.getvalue())
  assert stats["docs"] == 6 and sum(stats["entities"].values()) > 0


@pytest.mark.parametrize("flag", ["--num", "--start"])
def test_cli_rejects_negative_counts(flag, capsys):
  with pytest.raises(SystemExit) as info:
    cli_main([flag, "-5"])
  assert info.value.code == 2 and "must be >= 0" in capsys.readouterr().err


def test_speed_sanity():
  start = time.process_time()
  generate(50, seed=12)
  assert time.process_time() - start < 10.0  # measured ~0.1 s
