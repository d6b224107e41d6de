r"""Fuzz campaign over every input path: counts of accepted / DocumentError / crash per source.

    python -m flaxdoc.bench.fuzz --cases 10000 --seed 0
    python -m flaxdoc.bench.fuzz --cases 500 --sources jsonl,pdf --crash-dir /tmp/crashes

Sources, each case one file built from a valid seed and then broken:
* `jsonl`: synthetic documents as flaxdoc JSON Lines, with structural mutations
  (values replaced by NaN / inf / huge numbers / wrong types / lone surrogates /
  control characters, keys deleted, lists inflated) and byte mutations;
* `funsd`, `cord`, `sroie`: mutated copies of real files of the datasets'
  train splits, read by flaxdoc's readers (skipped when the datasets are absent);
* `pdf`: synthetic documents rendered to PDF, then random bytes, truncations,
  flipped bytes, or encrypted with pypdf (read without and with the password).

Outcomes: `accepted` (the reader returned documents, and they featurise into
finite, in-range windows), `DocumentError` (the documented error), `crash`
(any other exception, or accepted output that breaks an invariant). The exit
status is 1 when there is any crash; `--crash-dir` keeps each crashing input.
Deterministic in `--seed`. The default suite runs a few hundred cases
(tests/data/test_fuzz_pipeline.py); this is the long campaign.
"""

from __future__ import annotations

import argparse
import collections
import copy
import io
import json
import os
import pathlib
import shutil
import sys
import tempfile
import traceback
from typing import Callable

import numpy as np

from flaxdoc.bench.common import emit
from flaxdoc.bench.data import DATASETS_HELP, default_datasets_dir
from flaxdoc.data import tokenizers as tk
from flaxdoc.data.document import Document, DocumentError
from flaxdoc.data.features import FeatureConfig, batch_features, featurize

SOURCES = ("jsonl", "funsd", "cord", "sroie", "pdf")
OUTCOMES = ("accepted", "DocumentError", "crash")

ODD_VALUES = [float("nan"), float("inf"), -float("inf"), 1e300, -1e300, 3.5e38, 2**64, -(2**63),
              -1, 0, 0.5, 1e-320, None, True, False, "", " ", "\ud800", "a\udfffb", "\x00", "x\x1b",
              "\x7f", "\u200b", "\ufeff", "🙂", "\U0010ffff", "\u2028", "[CLS]", "x" * 5000, [],
              {}, [[]], [0, 0, 0], [1, 2, 3, 4], {"label": "x", "words": [0]}, "nan", "1e999"]


# Characters inserted into strings: invalid (lone surrogates, controls) and valid but odd.
ODD_CHARS = ["\ud800", "\udc00", "\x00", "\x1b", "\x9b", "\u200b", "\ufffd", "\t", "\n", "\u0301",
             "\u202e", "🙂", "\U0001d11e", "東", "\ufeff", "\u2028", "\xa0", " "]


def _odd_value(rng: np.random.Generator):
  """A fresh copy of a random odd value (the lists and dicts must not be shared between cases)."""
  return copy.deepcopy(ODD_VALUES[int(rng.integers(len(ODD_VALUES)))])


# ------------------------------------------------------------------ mutators

def json_paths(obj, prefix=()):
  """Every path (tuple of keys / indices) into a decoded JSON value, the root `()` first."""
  yield prefix
  if isinstance(obj, dict):
    for k, v in obj.items():
      yield from json_paths(v, prefix + (k,))
  elif isinstance(obj, list):
    for i, v in enumerate(obj):
      yield from json_paths(v, prefix + (i,))


def mutate_json(obj, rng: np.random.Generator, n: int):
  """`obj` with `n` structural mutations (replace / delete / inflate / retype a value)."""
  obj = json.loads(json.dumps(obj))
  for _ in range(n):
    paths = list(json_paths(obj))
    path = paths[int(rng.integers(len(paths)))]
    if not path:
      if rng.random() < 0.05:
        obj = _odd_value(rng)
      continue
    parent = obj
    for key in path[:-1]:
      parent = parent[key]
    key, value = path[-1], parent[path[-1]]
    action = rng.choice(["replace", "replace", "delete", "inflate", "nudge", "nudge", "nudge"])
    if action == "delete":
      del parent[key]
    elif action == "inflate" and isinstance(value, list) and value:
      parent[key] = value * int(rng.integers(2, 30))
    elif action == "nudge" and isinstance(value, (int, float)) and not isinstance(value, bool):
      # Half the time a small move that may stay valid, else a wild one.
      scale = float(rng.choice([1, 1, -1, 0, 1e6, 1e30]))
      parent[key] = value * scale + float(rng.normal() * (0.5 if scale == 1 else 1e3))
    elif action == "nudge" and isinstance(value, str):
      at = int(rng.integers(len(value) + 1))
      odd = ODD_CHARS[int(rng.integers(len(ODD_CHARS)))]
      parent[key] = value[:at] + odd + value[at:]
    else:
      parent[key] = _odd_value(rng)
  return obj


def mutate_bytes(raw: bytes, rng: np.random.Generator, n: int) -> bytes:
  """`raw` with `n` byte mutations: flips, random inserts, deletions, a truncation."""
  data = bytearray(raw)
  for _ in range(n):
    action = rng.choice(["flip", "insert", "delete", "truncate"])
    at = int(rng.integers(len(data) + 1))
    if action == "flip" and data:
      at = min(at, len(data) - 1)
      data[at] ^= 1 << int(rng.integers(8))
    elif action == "insert":
      data[at:at] = rng.bytes(int(rng.integers(1, 8)))
    elif action == "delete":
      del data[at:at + int(rng.integers(1, 16))]
    else:
      del data[at:]
  return bytes(data)


def dump_json(obj, rng: np.random.Generator) -> bytes:
  """JSON with NaN / Infinity literals; lone surrogates force `\\uXXXX` escapes."""
  try:
    return json.dumps(obj, ensure_ascii=bool(rng.random() < 0.5)).encode("utf-8")
  except UnicodeEncodeError:
    return json.dumps(obj, ensure_ascii=True).encode("ascii")


def _mutated_json_file(seed_raw: bytes, rng: np.random.Generator) -> bytes:
  obj = json.loads(seed_raw)
  raw = dump_json(mutate_json(obj, rng, int(rng.integers(1, 4))), rng)
  if rng.random() < 0.3:
    raw = mutate_bytes(raw, rng, int(rng.integers(1, 3)))
  return raw


# -------------------------------------------------------------------- checks

def check_accepted(docs: list[Document], tokenizer, config: FeatureConfig):
  """Raises AssertionError when accepted documents break an invariant downstream code trusts."""
  for d in docs:
    assert np.isfinite(d.boxes).all() and np.isfinite(d.page_sizes).all(), "non-finite geometry"
    assert (d.page_sizes > 0).all() and (d.boxes[:, :2] <= d.boxes[:, 2:]).all(), "bad boxes"
    assert (d.pages >= 0).all() and (d.pages < len(d.page_sizes)).all(), "bad pages"
    assert all(w.strip() for w in d.words), "empty word"
    assert not any(0xD800 <= ord(c) <= 0xDFFF for w in d.words for c in w), "lone surrogate"
    if not len(d):
      continue
    windows = featurize(d, tokenizer, config)
    batch = batch_features(windows)
    for key, value in batch.items():
      if value.dtype.kind == "f":
        assert np.isfinite(value).all(), f"non-finite {key}"
    ids = batch["input_ids"]
    assert ids.min() >= 0 and ids.max() < tokenizer.vocab_size, "id out of vocabulary"
    assert batch["boxes"].min() >= 0 and batch["boxes"].max() <= 1000, "box out of [0, 1000]"
    assert -1 <= batch["word_ids"].min() and batch["word_ids"].max() < len(d), "bad word id"


# ------------------------------------------------------------------- sources

class Campaign:
  """Seeds, a scratch folder and one `run_case(source, rng)` per source."""

  def __init__(self, datasets_dir: pathlib.Path, scratch: pathlib.Path, num_seeds: int = 12):
    from flaxdoc.data.jsonl import document_to_json  # pylint: disable=import-outside-toplevel
    from flaxdoc.data.synthetic import make_document  # pylint: disable=import-outside-toplevel
    self.scratch = scratch
    self.synthetic = [make_document(0, i) for i in range(num_seeds)]
    self.jsonl_seeds = [json.dumps(document_to_json(d)).encode() for d in self.synthetic]
    corpus = [" ".join(d.words) for d in self.synthetic]
    self.tokenizer = tk.SentencePieceTokenizer(
        tk.train_sentencepiece(corpus, scratch / "sp", vocab_size=600))
    self.config = FeatureConfig(max_len=64)
    self.files = {
        "funsd": sorted((datasets_dir / "funsd" / "training_data" / "annotations").glob("*.json")),
        "cord": sorted((datasets_dir / "cord" / "train" / "json").glob("*.json")),
        "sroie": sorted((datasets_dir / "sroie" / "train" / "box").glob("*.txt")),
    }
    self.pdf_seeds: list[bytes] = []
    try:
      import pypdf  # pylint: disable=import-outside-toplevel,unused-import
      self.has_pypdf = True
    except ImportError:
      self.has_pypdf = False
    self.missing: dict[str, str] = {}
    for name, files in self.files.items():
      if not files:
        self.missing[name] = f"no {name} files under {datasets_dir}"
    try:
      from flaxdoc.data.synthetic import render_pdf  # pylint: disable=import-outside-toplevel
      for i, d in enumerate(self.synthetic[:4]):
        path = render_pdf.write_pdf(d, scratch / f"seed{i}.pdf")
        self.pdf_seeds.append(path.read_bytes())
    except ImportError as e:
      self.missing["pdf"] = f"cannot render seed PDFs ({e})"

  def available(self, sources) -> list[str]:
    return [s for s in sources if s not in self.missing]

  def _fresh(self) -> pathlib.Path:
    case = self.scratch / "case"
    shutil.rmtree(case, ignore_errors=True)
    case.mkdir()
    return case

  # Each returns (documents, input bytes for --crash-dir).
  def jsonl(self, rng):
    from flaxdoc.data.jsonl import read_jsonl  # pylint: disable=import-outside-toplevel
    seed = self.jsonl_seeds[int(rng.integers(len(self.jsonl_seeds)))]
    raw = _mutated_json_file(seed, rng).replace(b"\n", b" ")
    path = self._fresh() / "fuzz.jsonl"
    path.write_bytes(raw + b"\n")
    policy = "replace" if rng.random() < 0.3 else "error"
    return read_jsonl(path, text_policy=policy, box_policy=str(rng.choice(["error", "clip"])))[0], raw

  def funsd(self, rng):
    from flaxdoc.data.funsd import load_funsd  # pylint: disable=import-outside-toplevel
    src = self.files["funsd"][int(rng.integers(len(self.files["funsd"])))]
    raw = _mutated_json_file(src.read_bytes(), rng)
    root = self._fresh() / "training_data"
    (root / "annotations").mkdir(parents=True)
    (root / "images").mkdir()
    (root / "annotations" / src.name).write_bytes(raw)
    image = src.parent.parent / "images" / f"{src.stem}.png"
    if image.exists():
      (root / "images" / image.name).symlink_to(image)
    return load_funsd(root.parent, "train")[0], raw

  def cord(self, rng):
    from flaxdoc.data.cord import load_cord  # pylint: disable=import-outside-toplevel
    src = self.files["cord"][int(rng.integers(len(self.files["cord"])))]
    raw = _mutated_json_file(src.read_bytes(), rng)
    root = self._fresh() / "train" / "json"
    root.mkdir(parents=True)
    (root / src.name).write_bytes(raw)
    return load_cord(root.parent.parent, "train")[0], raw

  def sroie(self, rng):
    from flaxdoc.data.sroie import load_sroie  # pylint: disable=import-outside-toplevel
    src = self.files["sroie"][int(rng.integers(len(self.files["sroie"])))]
    box = src.read_bytes()
    ent_src = src.parent.parent / "entities" / src.name
    ent = ent_src.read_bytes() if ent_src.exists() else b"{}"
    target = rng.choice(["box", "box", "entities", "both"])
    if target in ("box", "both"):
      lines = box.split(b"\n")
      for _ in range(int(rng.integers(1, 4))):
        i = int(rng.integers(len(lines)))
        fields = lines[i].split(b",")
        j = int(rng.integers(len(fields)))
        odd = _odd_value(rng)
        fields[j] = str(odd).encode("utf-8", "surrogatepass")
        lines[i] = b",".join(fields)
      box = b"\n".join(lines)
      if rng.random() < 0.3:
        box = mutate_bytes(box, rng, int(rng.integers(1, 3)))
    if target in ("entities", "both"):
      try:
        ent = _mutated_json_file(ent, rng)
      except ValueError:
        ent = mutate_bytes(ent, rng, 2)
    root = self._fresh() / "train"
    (root / "box").mkdir(parents=True)
    (root / "entities").mkdir()
    (root / "box" / src.name).write_bytes(box)
    (root / "entities" / src.name).write_bytes(ent)
    return load_sroie(root.parent, "train")[0], box + b"\n---entities---\n" + ent

  def pdf(self, rng):
    from flaxdoc.data.pdf import read_pdf  # pylint: disable=import-outside-toplevel
    seed = self.pdf_seeds[int(rng.integers(len(self.pdf_seeds)))]
    kinds = ["random", "truncated", "flipped"]
    if self.has_pypdf:  # pypdf (a test extra) writes the encrypted copies
      kinds += ["encrypted", "encrypted_with_password"]
    kind = rng.choice(kinds)
    password = None
    if kind == "random":
      raw = (b"%PDF-1.7\n" if rng.random() < 0.5 else b"") + rng.bytes(int(rng.integers(0, 4096)))
    elif kind == "truncated":
      raw = seed[:int(rng.integers(len(seed)))]
    elif kind == "flipped":
      raw = mutate_bytes(seed, rng, int(rng.integers(1, 20)))
    else:
      import pypdf  # pylint: disable=import-outside-toplevel
      writer = pypdf.PdfWriter(clone_from=pypdf.PdfReader(io.BytesIO(seed)))
      secret = f"pw{int(rng.integers(1000))}"
      writer.encrypt(secret, algorithm="RC4-128")  # RC4 needs no `cryptography` package
      buf = io.BytesIO()
      writer.write(buf)
      raw = buf.getvalue()
      if kind == "encrypted_with_password":
        password = secret
    path = self._fresh() / "fuzz.pdf"
    path.write_bytes(raw)
    return [read_pdf(path, password=password)], raw

  def run_case(self, source: str, rng: np.random.Generator) -> tuple[str, str, bytes]:
    """(outcome, detail, input bytes) of one case."""
    raw = b""
    try:
      docs, raw = getattr(self, source)(rng)
    except DocumentError as e:
      return "DocumentError", str(e).splitlines()[0][:200] if str(e) else "", raw
    except Exception as e:  # pylint: disable=broad-except
      return "crash", f"{type(e).__name__}: {e}"[:300] + "\n" + traceback.format_exc(), raw
    try:
      check_accepted(docs, self.tokenizer, self.config)
    except DocumentError as e:  # featurize refusing a document is documented too
      return "DocumentError", str(e)[:200], raw
    except Exception as e:  # pylint: disable=broad-except
      return "crash", f"accepted output breaks an invariant: {type(e).__name__}: {e}"[:300], raw
    return "accepted", "", raw


def run(cases: int, seed: int, sources=SOURCES, datasets_dir: pathlib.Path | None = None,
        crash_dir: str | None = None, progress: bool = True,
        on_case: Callable[[str, str, str], None] | None = None) -> dict:
  """Runs the campaign; returns {"counts": {source: {outcome: n}}, "crashes": [...], "skipped": {...}}."""
  from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
  import logging  # pylint: disable=import-outside-toplevel
  # Repairs are expected, by the thousand; the level is put back after the campaign, so a caller
  # in the same process (a test session) keeps its warnings.
  logger = logging.getLogger("flaxdoc")
  level = logger.level
  logger.setLevel(logging.ERROR)
  scratch = pathlib.Path(tempfile.mkdtemp(prefix="flaxdoc-fuzz-"))
  try:
    camp = Campaign(datasets_dir or default_datasets_dir(), scratch)
    active = camp.available(sources)
    if not active:
      raise SystemExit(f"no source available: {camp.missing}")
    counts = {s: collections.Counter() for s in active}
    crashes = []
    rng = np.random.default_rng(seed)
    bar = tqdm(range(cases), desc="fuzz", unit="case", disable=not progress)
    for k in bar:
      source = active[k % len(active)]
      case_rng = np.random.default_rng([seed, k])
      outcome, detail, raw = camp.run_case(source, case_rng)
      counts[source][outcome] += 1
      if on_case is not None:
        on_case(source, outcome, detail)
      if outcome == "crash":
        crashes.append({"case": k, "source": source, "detail": detail.splitlines()[0]})
        if crash_dir:
          os.makedirs(crash_dir, exist_ok=True)
          pathlib.Path(crash_dir, f"case{k}-{source}.bin").write_bytes(raw)
          pathlib.Path(crash_dir, f"case{k}-{source}.txt").write_text(detail, encoding="utf-8")
      if k % 50 == 0:
        bar.set_postfix(crashes=len(crashes))
    bar.close()
    del rng
    return {"counts": {s: dict(c) for s, c in counts.items()}, "crashes": crashes,
            "skipped": camp.missing}
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
    logger.setLevel(level)


def table_rows(result: dict) -> list[dict]:
  rows = []
  total = collections.Counter()
  for source, c in result["counts"].items():
    row = {"source": source, "cases": sum(c.values()), **{o: c.get(o, 0) for o in OUTCOMES}}
    rows.append(row)
    total.update({o: c.get(o, 0) for o in OUTCOMES})
  rows.append({"source": "total", "cases": sum(total.values()), **{o: total[o] for o in OUTCOMES}})
  return rows


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m flaxdoc.bench.fuzz", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--cases", type=int, default=10000)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--sources", default=",".join(SOURCES),
                      help=f"comma-separated subset of {','.join(SOURCES)}")
  parser.add_argument("--datasets", default=None,
                      help=DATASETS_HELP)
  parser.add_argument("--crash-dir", default=None, help="keep each crashing input and traceback here")
  parser.add_argument("--json", action="store_true", help="one JSON object per source")
  parser.add_argument("--no-progress", action="store_true")
  args = parser.parse_args(argv)
  sources = [s.strip() for s in args.sources.split(",") if s.strip()]
  unknown = sorted(set(sources) - set(SOURCES))
  if unknown:
    parser.error(f"unknown sources {unknown}; choose from {list(SOURCES)}")
  result = run(args.cases, args.seed, sources,
               pathlib.Path(args.datasets) if args.datasets else None, args.crash_dir,
               progress=not args.no_progress)
  for source, why in result["skipped"].items():
    if source in sources:
      print(f"skipped {source}: {why}", file=sys.stderr)
  emit(table_rows(result), as_json=args.json, columns=["source", "cases", *OUTCOMES],
       title=f"fuzz campaign: {args.cases} cases, seed {args.seed}")
  for c in result["crashes"][:20]:
    print(f"crash: case {c['case']} ({c['source']}): {c['detail']}", file=sys.stderr)
  return 1 if result["crashes"] else 0


if __name__ == "__main__":
  sys.exit(main())
