r"""Serving: whole-pipeline documents per second, from a document to its entities.

    python -m flaxdoc.bench.serve [--json] [--quick] [--sizes 1 4 16] [--batch 4]
        [--rows formnet_jax formnet_torch ...] [--threads N] [--malloc keep] [--inprocess]
        [--pad_multiple 512]

A synthetic document of 1, 4 or 16 pages (`--sizes`; about 500, 2,000 and 8,000
tokens) goes through every stage a server runs, each timed on its own:

| stage | what |
|---|---|
| `featurise_s` | tokenising and cutting into windows (`flaxdoc.data.features.featurize`, no graph) |
| `graph_s` | the beta-skeleton token graph and its edge features (GCN rows only) |
| `model_s` | the encoder and tagging head over the document's windows |
| `decode_s` | stitching windows, word scores, constrained Viterbi, entity assembly |

Rows, all 12 layers x 768 wide (random parameters; `--quick` shrinks them to 2 x 64):

| row | what |
|---|---|
| `formnet_jax` | FormNet-A2-size (GCN + ETC + Rich Attention), `jax.jit`, the document as one window |
| `formnet_torch`, `formnet_torch_compiled` | its PyTorch export (`flaxdoc.export.torch`), eager and `torch.compile` |
| `etc_rich_jax`, `etc_rich_torch`, `etc_rich_torch_compiled` | the same without the GCN |
| `layoutlm_torch` | Hugging Face `LayoutLMModel` (random init, offline) + a linear tag head over 512-token windows with stride 128, stitched as flaxdoc stitches |
| `layoutlm_torch_compiled` | the same through `torch.compile` (the fair baseline for the compiled flaxdoc rows) |

`--xla_no_thunks` runs the JAX rows on XLA:CPU's older whole-program runtime: one
16-core run of `flaxdoc.bench.gemm` put it level with PyTorch (see the README; jaxlib
0.10 warns that the flag is no longer supported, so it is opt-in until confirmed).
Each row runs in a subprocess of its own (`--inprocess`: all in this one): in one
process, rows changed each other's times by up to 30% through the allocator's and
the thread pools' state. `--malloc keep` makes glibc keep large blocks for reuse
(`keep_large_allocations`): an 8,000-token ETC forward otherwise spends about a
quarter of its time in page faults.
`--batch B` adds, per size, a row of `B` documents run as one batch (`b = B`).
Totals are documents/s and tokens/s; `gflop_per_s` is the matrix-multiply rate of
the model stage (FLOPs from `flaxdoc.bench.attention.forward_gflop`, plus the GCN's
for FormNet rows). The table also prints the targets of issue 14: the PyTorch
ETC + Rich row against windowed LayoutLM (>= 1.25x at 2,048 tokens, >= 1.3x at
8,000; eager against eager, compiled against compiled where both rows ran) and the
graph + featurise (<= 10%) and decode (<= 5%) shares. Rows measured one after another
drift with the machine's speed (15-30% on a shared 2-core host); `bench.serve_paired`
times the model rows in alternation for the ratios. `--pad_multiple` sets what the
one-window rows pad to (512 by default; a server bucketing by 128 pads less).

`--quick` checks the whole table rather than measuring it: 2 x 64 models, documents of
about 290 tokens a page, sizes 1 4, a batch of 2, one timed run per row, and every row
in this process (Dynamo reset between rows, so a compiled row compiles its shapes as in
a process of its own). Flags given explicitly still win (`--no-inprocess`: subprocesses).
On a shared 2-core host it took 83-115 s with Inductor's cache warm (575 s: the full plan
it ran before), and 316 s on the first run, when Inductor compiles the three compiled
rows' nine shapes (10-55 s each, 250 s in all).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time

import numpy as np

from flaxdoc.bench import common
from flaxdoc.bench.pretrain_step import Sizes as Size, gcn_gflop

ROWS = ("formnet_jax", "formnet_torch", "formnet_torch_compiled", "etc_rich_jax",
        "etc_rich_torch", "etc_rich_torch_compiled", "layoutlm_torch", "layoutlm_torch_compiled",
        "etc_rich_torch_tensor")
# `*_tensor`: the export with its native kernels off (`EtcAttention.native = False`), the
# tensor form a machine without a C compiler runs; the default rows leave it out.
DEFAULT_ROWS = tuple(r for r in ROWS if not r.endswith("_tensor"))
TOKENS_PER_PAGE = 500
LAYOUTLM_WINDOW, LAYOUTLM_STRIDE = 512, 128
COLUMNS = ("row", "pages", "b", "tokens", "windows", "featurise_s", "graph_s", "model_s",
           "decode_s", "total_s", "docs_per_s", "tokens_per_s", "gflop_per_s", "graph_feat_pct",
           "decode_pct")


QUICK = Size(layers=2, width=64, heads=4, mlp=128, local_radius=16, gcn_layers=2)
# The plan `main` runs for the flags left unset. `--quick` checks that every row builds,
# compiles and fills the table, so it skips what only a measurement needs: a process per
# row cost 5-10 s of imports and set-up (over half of a 575 s run of the full plan), and
# each input shape a compiled row meets is a torch.compile of 2-5 s (Inductor's cache
# warm) to 10-55 s (cold). 4 pages keeps the issue-14 target lines; a batch of 2 shows
# the batched row as well as 4 would.
FULL_PLAN = dict(sizes=[1, 4, 16], batch=4, repeats=2, inprocess=False)
QUICK_PLAN = dict(sizes=[1, 4], batch=2, repeats=1, inprocess=True)


# --------------------------------------------------------------------------- documents
def make_documents(pages: int, count: int, quick: bool = False, tokenizer=None):
  """`count` synthetic documents of `pages * 500` tokens each, within 5% (fewer words: sub-tokens).

  The words-per-token ratio of the generator drifts with document size (0.43 gave 2,004
  tokens for 4 pages but 7,074 for 16), so each document's word target is corrected
  from its measured token count, at most three times.
  """
  from flaxdoc.data import features, synthetic, tokenizers  # pylint: disable=import-outside-toplevel
  tokenizer = tokenizer or tokenizers.load_tokenizer("default")
  target = pages * TOKENS_PER_PAGE * (0.58 if quick else 1.0)
  docs = []
  for i in range(count):
    words = int(target * 0.43)
    for _ in range(4):
      doc = synthetic.make_document(7, 1000 * pages + i, synthetic.SyntheticConfig(target_words=words))
      tokens = len(features.tokenize_document(doc, tokenizer))
      if abs(tokens - target) <= 0.05 * target:
        break
      words = max(1, int(words * target / tokens))
    docs.append(doc)
  return docs


def window_length(num_tokens: int, multiple: int = 512) -> int:
  """The one-window length of an ETC row: tokens + [CLS]/[SEP], rounded up to `multiple`."""
  return max(multiple, -(-(num_tokens + 2) // multiple) * multiple)


# --------------------------------------------------------------------------- models
def model_config(row: str, size: Size):
  from flaxdoc.models import formnet  # pylint: disable=import-outside-toplevel
  c = formnet.model_config("A2" if row.startswith("formnet") else "A2/etc_rich")
  c.width, c.num_heads, c.mlp_dim, c.depth = size.width, size.heads, size.mlp, size.layers
  c.local_radius = size.local_radius
  c.gcn_layers = size.gcn_layers if row.startswith("formnet") else 0
  c.dropout_rate = c.attention_dropout_rate = 0.0
  return c


def model_gflop(row: str, length: int, windows: int, size: Size) -> float:
  """Matrix-multiply GFLOP of the model stage (all windows)."""
  from flaxdoc.bench import attention as ab  # pylint: disable=import-outside-toplevel
  s = size
  if row.startswith("layoutlm_torch"):
    return windows * ab.forward_gflop("layoutlm_torch", length, s)
  gflop = ab.forward_gflop("etc_rich", length, s)
  if row.startswith("formnet"):
    gflop += gcn_gflop(length, size)
  return windows * gflop


class Runner:
  """One row's model: `__call__(batch of numpy arrays) -> [B, L, T] float32 logits`."""

  def __init__(self, row: str, size: Size, vocab: int, num_tags: int, max_len: int, example):
    self.row = row
    if row.startswith("layoutlm_torch"):
      self._init_layoutlm(size, vocab, num_tags, compiled=row.endswith("_compiled"))
      return
    import jax  # pylint: disable=import-outside-toplevel
    from flaxdoc import models  # pylint: disable=import-outside-toplevel
    config = model_config(row, size)
    model = models.build_model(config, vocab_size=vocab, num_tags=num_tags, max_len=max_len,
                               pretraining=False)
    params = models.random_parameters(model, example)
    if row.endswith("_jax"):
      params = jax.device_put(params)
      forward = jax.jit(lambda p, b: model.apply({"params": p}, b)["tag_logits"])
      self.fn = lambda b: np.asarray(forward(params, b))
      return
    import torch  # pylint: disable=import-outside-toplevel
    from flaxdoc.export import weights as weights_lib  # pylint: disable=import-outside-toplevel
    from flaxdoc.export.torch import build_torch_model, compiled  # pylint: disable=import-outside-toplevel
    export_config = {"model": dataclasses.asdict(model.spec), "vocab_size": vocab,
                     "num_tags": num_tags, "max_len": max_len}
    tmodel = build_torch_model(export_config, weights_lib.export_tensors(params)).eval()
    if row.endswith("_tensor"):
      for module in tmodel.modules():
        if hasattr(module, "native"):
          module.native = False
    self.torch_model = tmodel
    if row.endswith("_compiled"):
      tmodel = compiled.compile_layers(tmodel)

    def call(b):
      with torch.inference_mode():
        return tmodel({k: torch.as_tensor(v) for k, v in b.items()}).numpy()
    self.fn = call

  def _init_layoutlm(self, size: Size, vocab: int, num_tags: int, compiled: bool = False):
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    torch.manual_seed(0)
    config = transformers.LayoutLMConfig(
        vocab_size=vocab, hidden_size=size.width, num_hidden_layers=size.layers,
        num_attention_heads=size.heads, intermediate_size=size.mlp, max_position_embeddings=512)
    model = transformers.LayoutLMModel(config).eval()
    head = torch.nn.Linear(size.width, num_tags).eval()
    if compiled:
      model = torch.compile(model)

    def call(b):
      with torch.inference_mode():
        hidden = model(input_ids=torch.as_tensor(b["input_ids"]).long(),
                       bbox=torch.as_tensor(np.clip(b["boxes"], 0, 1000)).long(),
                       attention_mask=torch.as_tensor(b["attention_mask"]).long())[0]
        return head(hidden).numpy()
    self.fn = call

  def __call__(self, batch):
    return self.fn(batch)


# --------------------------------------------------------------------------- pipeline
def feature_configs(row: str, max_len: int, labels):
  """(config with the graph if the row needs it, the same without)."""
  from flaxdoc.data.features import FeatureConfig  # pylint: disable=import-outside-toplevel
  if row.startswith("layoutlm_torch"):
    fc = FeatureConfig(max_len=LAYOUTLM_WINDOW, stride=LAYOUTLM_STRIDE, labels=labels,
                       scheme="BIOES", graph=False)
    return fc, fc
  graph = row.startswith("formnet")
  with_graph = FeatureConfig(max_len=max_len, labels=labels, scheme="BIOES", graph=graph)
  return with_graph, dataclasses.replace(with_graph, graph=False)


MODEL_KEYS = ("input_ids", "boxes", "page_ids", "segment_ids", "positions", "attention_mask",
              "token_in_segment", "neighbor_ids", "neighbor_features", "neighbor_mask")


def run_pipeline(docs, runner, tokenizer, fc, fc_nograph, tag_names) -> dict:
  """Times each stage once over `docs` (batched as one model call) and returns the stages."""
  from flaxdoc import decode  # pylint: disable=import-outside-toplevel
  from flaxdoc.data import features  # pylint: disable=import-outside-toplevel
  # Featurising and the graph are timed apart (sequentially, so a loaded machine cannot
  # make one look negative); a GCN row's windows, graph slices included, are then built
  # once more untimed (the slicing is a copy of arrays already built).
  t0 = time.perf_counter()
  per_doc = [features.featurize(d, tokenizer, fc_nograph) for d in docs]
  featurise_s = time.perf_counter() - t0
  graph_s = 0.0
  if fc.graph:
    for d in docs:
      tok = features.tokenize_document(d, tokenizer)
      g0 = time.perf_counter()
      features._graph(d, tok, fc)  # pylint: disable=protected-access
      graph_s += time.perf_counter() - g0
    per_doc = [features.featurize(d, tokenizer, fc) for d in docs]
  windows = [w for ws in per_doc for w in ws]
  batch = features.batch_features(windows)
  batch = {k: v for k, v in batch.items() if k in MODEL_KEYS}
  t2 = time.perf_counter()
  logits = runner(batch)
  t3 = time.perf_counter()
  entities = 0
  i = 0
  for d, ws in zip(docs, per_doc):
    scores = [logits[i + j][: len(w["input_ids"])] for j, w in enumerate(ws)]
    i += len(ws)
    word_scores = features.stitch(d, ws, scores)
    entities += len(decode.decode_document(d, word_scores, tag_names, "BIOES"))
  t4 = time.perf_counter()
  return dict(featurise_s=featurise_s, graph_s=graph_s, model_s=t3 - t2,
              decode_s=t4 - t3, windows=len(windows), length=int(batch["input_ids"].shape[1]),
              tokens=int(sum(int((w["word_ids"] >= 0).sum()) for w in windows)
                         if "word_ids" in windows[0] else batch["attention_mask"].sum()),
              entities=entities)


def set_up_row(row: str, docs, tokenizer, size: Size, quick: bool,
               pad_multiple: int | None = None):
  """A row's model for `docs`: `(runner, fc, fc_nograph, doc_tokens, tag_names)`, the
  feature configs with and without the graph, padded to `pad_multiple` (512; 128 quick)."""
  from flaxdoc import tags as tags_lib  # pylint: disable=import-outside-toplevel
  from flaxdoc.data import features, synthetic  # pylint: disable=import-outside-toplevel
  labels = tuple(synthetic.LABELS)
  tag_names = tags_lib.tag_names(labels, "BIOES")
  doc_tokens = max(len(features.tokenize_document(d, tokenizer)) for d in docs)
  max_len = window_length(doc_tokens, pad_multiple or (128 if quick else 512))
  fc, fc_nograph = feature_configs(row, max_len, labels)
  example = features.batch_features(features.featurize(docs[0], tokenizer, fc)[:1])
  example = {k: v for k, v in example.items() if k in MODEL_KEYS}
  runner = Runner(row, size, tokenizer.vocab_size, len(tag_names), fc.max_len, example)
  return runner, fc, fc_nograph, doc_tokens, tag_names


def measure(row: str, pages: int, b: int, size: Size, quick: bool, repeats: int,
            pad_multiple: int | None = None) -> dict:
  from flaxdoc.data import tokenizers  # pylint: disable=import-outside-toplevel
  tokenizer = tokenizers.load_tokenizer("default")
  docs = make_documents(pages, b, quick, tokenizer)
  runner, fc, fc_nograph, doc_tokens, tag_names = set_up_row(row, docs, tokenizer, size, quick,
                                                             pad_multiple)
  t0 = time.perf_counter()
  run_pipeline(docs, runner, tokenizer, fc, fc_nograph, tag_names)  # compile / warm-up
  warmup_s = time.perf_counter() - t0
  runs = [run_pipeline(docs, runner, tokenizer, fc, fc_nograph, tag_names)
          for _ in range(repeats)]
  stages = ("featurise_s", "graph_s", "model_s", "decode_s")
  r = {k: float(np.median([x[k] for x in runs])) for k in stages}
  total = sum(r.values())
  first = runs[0]
  gflop = model_gflop(row, first["length"], first["windows"], size)
  return dict(bench="serve", row=row, pages=pages, b=b, tokens=doc_tokens, length=first["length"],
              windows=first["windows"], **r, total_s=total, docs_per_s=b / total,
              tokens_per_s=b * doc_tokens / total, gflop=gflop,
              gflop_per_s=gflop / r["model_s"] if r["model_s"] > 0 else None,
              graph_feat_pct=100 * (r["featurise_s"] + r["graph_s"]) / total,
              decode_pct=100 * r["decode_s"] / total, warmup_s=warmup_s, repeats=repeats,
              entities=first["entities"], layers=size.layers, width=size.width)


def targets(rows) -> list[str]:
  """Issue 14's targets, read off the measured rows."""
  lines = []
  by = {(r["row"], r["pages"], r["b"]): r for r in rows if "docs_per_s" in r}
  for pages, goal in ((4, 1.25), (16, 1.3)):
    for row, base in (("etc_rich_torch", "layoutlm_torch"),
                      ("etc_rich_torch_compiled", "layoutlm_torch"),
                      ("etc_rich_torch_compiled", "layoutlm_torch_compiled")):
      r, lm = by.get((row, pages, 1)), by.get((base, pages, 1))
      if lm and r:
        ratio = r["docs_per_s"] / lm["docs_per_s"]
        lines.append(f"{row} vs {base} (windowed) at {pages} pages ({r['tokens']} tokens): "
                     f"{ratio:.2f}x (target >= {goal}x)")
  for r in rows:
    if r.get("row", "").startswith("formnet") and "graph_feat_pct" in r:
      lines.append(f"{r['row']} {r['pages']} pages b={r['b']}: graph+featurise "
                   f"{r['graph_feat_pct']:.2f}% (<= 10%), decode {r['decode_pct']:.2f}% (<= 5%)")
  return lines


def keep_large_allocations() -> bool:
  """Makes glibc serve large blocks from its heap and keep them (Linux; False elsewhere).

  glibc hands every block above its mmap threshold (at most 32 MB) to the kernel
  and back, so each fresh `[nb, H, b, 3b]` tensor of an 8,000-token document (about
  100 MB) costs some 25,000 page faults. Raising the threshold and the trim limit
  to 1 GB lets such blocks be reused, as jemalloc or tcmalloc (PyTorch's CPU tuning
  guide) would; it must run before the tensors are first allocated.
  """
  import ctypes  # pylint: disable=import-outside-toplevel
  try:
    libc = ctypes.CDLL("libc.so.6")
  except OSError:
    return False
  m_trim_threshold, m_mmap_threshold = -1, -3
  return bool(libc.mallopt(m_mmap_threshold, 1 << 30) and libc.mallopt(m_trim_threshold, 1 << 30))


def _measure_row(row: str, pages: int, b: int, a) -> dict:
  """One row, in a subprocess of its own unless `--inprocess`: rows run in one process
  changed each other's times by up to 30% (allocator and thread-pool state)."""
  size = QUICK if a.quick else Size()
  try:
    if a.inprocess:
      _reset_compiled_state()
      r = measure(row, pages, b, size, a.quick, a.repeats, a.pad_multiple)
      return dict(r, malloc=a.malloc)
    spec = dict(row=row, pages=pages, b=b, quick=a.quick, repeats=a.repeats,
                threads=a.threads, xla_no_thunks=a.xla_no_thunks, malloc=a.malloc,
                pad_multiple=a.pad_multiple)
    out = subprocess.run([sys.executable, "-m", "flaxdoc.bench.serve", "--one", json.dumps(spec)],
                         capture_output=True, text=True, timeout=a.timeout, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
      tail = (out.stderr.strip().splitlines() or ["?"])[-1]
      raise RuntimeError(f"row subprocess exited {out.returncode}: {tail}")
    return json.loads(lines[-1])
  except subprocess.TimeoutExpired:
    return dict(bench="serve", row=row, pages=pages, b=b, error=f"timed out after {a.timeout} s")
  except Exception as e:  # pylint: disable=broad-except  # one row failing keeps the table
    return dict(bench="serve", row=row, pages=pages, b=b, error=f"{type(e).__name__}: {e}"[:300])


def _reset_compiled_state():
  """Dynamo's caches cleared before an in-process row, as a subprocess starts with them.

  A compiled row sharing the process with an earlier one otherwise meets a second
  input shape for the same `forward` and recompiles it with symbolic shapes (automatic
  dynamic), not the kernels a row in a process of its own runs, and slower to build:
  `etc_rich_torch_compiled` at two sizes took 57 s to compile in one process against
  24 s with the reset (2-core host). Inductor's on-disk caches are kept.
  """
  if "torch" in sys.modules:
    import torch  # pylint: disable=import-outside-toplevel
    torch._dynamo.reset()  # pylint: disable=protected-access


def _set_up_process(xla_no_thunks: bool, malloc: str, threads: int | None):
  """XLA flags, allocator and torch threads: once per process, before any row runs."""
  common.use_xla_cpu_defaults(xla_no_thunks)
  if malloc == "keep":
    keep_large_allocations()
  if threads:
    import torch  # pylint: disable=import-outside-toplevel
    torch.set_num_threads(threads)


def _run_one(spec: dict) -> dict:
  _set_up_process(spec.get("xla_no_thunks", False), spec.get("malloc", "default"),
                  spec.get("threads"))
  size = QUICK if spec.get("quick") else Size()
  r = measure(spec["row"], spec["pages"], spec["b"], size, spec.get("quick", False),
              spec.get("repeats", 2), spec.get("pad_multiple"))
  r["malloc"] = spec.get("malloc", "default")
  return r


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  # The plan's flags default to None: `--quick` resolves the ones the user left unset to
  # a smaller plan (`QUICK_PLAN`), explicit values stand either way.
  p.add_argument("--sizes", type=int, nargs="*", default=None,
                 help="pages per document (none: only the batched row; default 1 4 16, "
                      "--quick 1 4)")
  p.add_argument("--rows", nargs="+", default=list(DEFAULT_ROWS), choices=ROWS)
  p.add_argument("--batch", type=int, default=None,
                 help="documents in the batched row (0: none; default 4, --quick 2)")
  p.add_argument("--batch_pages", type=int, default=1, help="pages of the batched row's documents")
  p.add_argument("--repeats", type=int, default=None,
                 help="timed runs per row, after one warm-up (default 2, --quick 1)")
  p.add_argument("--pad_multiple", type=int, default=None,
                 help="one-window rows pad tokens + [CLS]/[SEP] up to a multiple of this "
                      "(default 512; 128 with --quick); LayoutLM always uses 512-token windows")
  p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
  p.add_argument("--quick", action="store_true",
                 help="2 layers x 64, small documents, a smaller plan in this process "
                      "(a check of the table in a minute or two; explicit flags still win)")
  p.add_argument("--xla_no_thunks", action="store_true",
                 help="XLA:CPU without its thunk runtime (see flaxdoc.bench.common)")
  p.add_argument("--malloc", default="default", choices=["default", "keep"],
                 help="keep: glibc keeps large blocks for reuse (keep_large_allocations)")
  p.add_argument("--inprocess", action=argparse.BooleanOptionalAction, default=None,
                 help="all rows in this process (default: one subprocess per row; "
                      "--quick: in this process)")
  p.add_argument("--timeout", type=float, default=3600, help="seconds per row subprocess")
  p.add_argument("--json", action="store_true")
  p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: one row in-process
  a = p.parse_args(argv)
  for key, value in (QUICK_PLAN if a.quick else FULL_PLAN).items():
    if getattr(a, key) is None:
      setattr(a, key, value)
  return a


def main(argv=None) -> int:
  a = parse_args(argv)
  if a.one:
    print(json.dumps(_run_one(json.loads(a.one))), flush=True)
    return 0
  if a.inprocess:
    _set_up_process(a.xla_no_thunks, a.malloc, a.threads)
  plan = [(row, pages, 1) for pages in a.sizes for row in a.rows]
  if a.batch > 1:
    plan += [(row, a.batch_pages, a.batch) for row in a.rows]
  rows = []
  for row, pages, b in plan:
    r = _measure_row(row, pages, b, a)
    rows.append(r)
    # Each row as it comes (a long run killed half-way keeps what it measured).
    print(json.dumps(r) if a.json else "# " + json.dumps(r), flush=True)
  if not a.json:
    size = QUICK if a.quick else Size()
    common.emit(rows, as_json=False, title=f"serve: {size.layers} layers x {size.width}",
                columns=list(COLUMNS) + ["error"])
    print("\n".join(targets(rows)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
