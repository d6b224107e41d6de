"""`flaxdoc.bench.serve` and `flaxdoc.bench.gemm` at tiny sizes: stages add up, FLOPs, targets."""

import numpy as np
import pytest

from flaxdoc.bench import attention as ab
from flaxdoc.bench import gemm
from flaxdoc.bench import serve


def test_window_length_rounds_tokens_plus_specials_up():
  assert serve.window_length(100) == 512
  assert serve.window_length(510) == 512
  assert serve.window_length(511) == 1024
  assert serve.window_length(200, multiple=128) == 256


def test_model_gflop_windows_and_gcn():
  s = serve.Size()
  lm = serve.model_gflop("layoutlm_torch", 512, 3, s)
  assert lm == pytest.approx(3 * ab.forward_gflop("layoutlm_torch", 512, ab.Size()))
  etc = serve.model_gflop("etc_rich_torch", 2048, 1, s)
  assert etc == pytest.approx(ab.forward_gflop("etc_rich", 2048, ab.Size()))
  # The GCN (12 layers, hidden 2E + F) adds about half the encoder's matmul work.
  ratio = serve.model_gflop("formnet_torch", 2048, 1, s) / etc
  assert 1.3 < ratio < 1.7


def test_gemm_shapes_and_flops():
  assert gemm.shapes(8, 4, 16) == [(8, 4, 4), (8, 4, 16), (8, 16, 4)]
  assert gemm.gflop(1000, 1000, 1000) == pytest.approx(2.0)


def test_targets_read_the_rows():
  rows = [dict(row="layoutlm_torch", pages=4, b=1, docs_per_s=1.0, tokens=2000),
          dict(row="etc_rich_torch", pages=4, b=1, docs_per_s=1.5, tokens=2000),
          dict(row="formnet_torch", pages=4, b=1, docs_per_s=1.0, graph_feat_pct=2.0,
               decode_pct=1.0)]
  lines = serve.targets(rows)
  assert any("etc_rich_torch vs layoutlm_torch" in line and "1.50x (target >= 1.25x)" in line
             for line in lines)
  # A compiled row is read against the compiled baseline when that row ran.
  rows += [dict(row="etc_rich_torch_compiled", pages=16, b=1, docs_per_s=2.6, tokens=8000),
           dict(row="layoutlm_torch", pages=16, b=1, docs_per_s=1.0, tokens=8000),
           dict(row="layoutlm_torch_compiled", pages=16, b=1, docs_per_s=2.0, tokens=8000)]
  lines = serve.targets(rows)
  assert any("compiled vs layoutlm_torch_compiled" in line and "1.30x (target >= 1.3x)" in line
             for line in lines)
  assert any("compiled vs layoutlm_torch (windowed)" in line and "2.60x" in line for line in lines)
  assert any("graph+featurise 2.00%" in line for line in lines)


@pytest.mark.parametrize("row", ["formnet_torch", "layoutlm_torch"])
def test_quick_row_times_every_stage(row):
  r = serve.measure(row, 1, 2, serve.QUICK, True, 1)
  stages = ("featurise_s", "graph_s", "model_s", "decode_s")
  assert all(r[k] >= 0 for k in stages)
  assert r["total_s"] == pytest.approx(sum(r[k] for k in stages))
  assert r["docs_per_s"] == pytest.approx(2 / r["total_s"])
  assert r["entities"] > 0  # random weights still tag something, and decode assembles it
  if row == "formnet_torch":
    assert r["graph_s"] > 0 and r["windows"] == 2
  else:
    assert r["graph_s"] == 0 and r["length"] == serve.LAYOUTLM_WINDOW


def test_xla_cpu_defaults_add_once_and_respect_the_user(monkeypatch):
  from flaxdoc.bench import common
  monkeypatch.setenv("XLA_FLAGS", "--foo=1")
  assert common.use_xla_cpu_defaults() == "--foo=1 --xla_cpu_use_thunk_runtime=false"
  assert common.use_xla_cpu_defaults() == "--foo=1 --xla_cpu_use_thunk_runtime=false"
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_thunk_runtime=true")
  assert common.use_xla_cpu_defaults() == "--xla_cpu_use_thunk_runtime=true"
  monkeypatch.setenv("XLA_FLAGS", "")
  assert common.use_xla_cpu_defaults(False) == ""


@pytest.mark.parametrize("pages", [4, 16])
def test_documents_have_the_planned_token_count(pages):
  # The sizes: about 2,000 and 8,000 tokens (500 a page), within 5%.
  from flaxdoc.data import features, tokenizers
  tok = tokenizers.load_tokenizer("default")
  docs = serve.make_documents(pages, 2, tokenizer=tok)
  for d in docs:
    assert abs(len(features.tokenize_document(d, tok)) - 500 * pages) <= 25 * pages
  assert docs[0].words != docs[1].words  # two different documents, not one twice


def test_rows_run_in_subprocesses_and_report_their_allocator(capsys):
  # The default driver: each row in a subprocess of its own, one JSON line per row.
  # (`--quick` alone runs in this process: `--no-inprocess` asks for the subprocesses.)
  assert serve.main(["--quick", "--json", "--sizes", "1", "--rows", "etc_rich_torch",
                     "--batch", "0", "--repeats", "1", "--malloc", "keep",
                     "--no-inprocess"]) == 0
  rows = [__import__("json").loads(line) for line in capsys.readouterr().out.splitlines()
          if line.startswith("{")]
  assert len(rows) == 1 and "error" not in rows[0], rows
  assert rows[0]["malloc"] == "keep" and rows[0]["model_s"] > 0


def test_quick_fills_in_a_small_plan_and_explicit_flags_win():
  # `--quick` is a check of the table in a minute or two (one process, fewer shapes to
  # compile); only the flags the user left unset change, and the full plan is unchanged.
  full, quick = serve.parse_args([]), serve.parse_args(["--quick"])
  assert (full.sizes, full.batch, full.repeats, full.inprocess) == ([1, 4, 16], 4, 2, False)
  assert (quick.sizes, quick.batch, quick.repeats, quick.inprocess) == ([1, 4], 2, 1, True)
  assert quick.rows == full.rows == list(serve.DEFAULT_ROWS)
  mine = serve.parse_args(["--quick", "--sizes", "--batch", "4", "--repeats", "3",
                           "--no-inprocess"])
  assert (mine.sizes, mine.batch, mine.repeats, mine.inprocess) == ([], 4, 3, False)


def test_keep_large_allocations_on_linux():
  import subprocess
  import sys
  if not sys.platform.startswith("linux"):
    pytest.skip("glibc mallopt is Linux-only")
  # In a child process: the setting is process-wide and should not reach the test run.
  out = subprocess.run([sys.executable, "-c", "from flaxdoc.bench import serve; "
                        "print(serve.keep_large_allocations())"],
                       capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "True"


def test_pad_multiple_sets_the_one_window_length():
  r = serve.measure("etc_rich_torch", 1, 1, serve.QUICK, True, 1, pad_multiple=64)
  assert r["length"] == serve.window_length(r["tokens"], 64)
  assert r["length"] % 64 == 0 and r["length"] - 64 < r["tokens"] + 2 <= r["length"]


def test_tensor_row_is_the_export_without_its_native_kernels():
  # `etc_rich_torch_tensor` measures what the native kernels bring: the same weights and
  # logits as `etc_rich_torch`, with every ETC layer on its tensor form.
  from flaxdoc.data import features, tokenizers
  tokenizer = tokenizers.load_tokenizer("default")
  docs = serve.make_documents(1, 1, True, tokenizer)
  out = {}
  for row in ("etc_rich_torch", "etc_rich_torch_tensor"):
    runner, fc, _, _, _ = serve.set_up_row(row, docs, tokenizer, serve.QUICK, True)
    flags = [m.native for m in runner.torch_model.modules() if hasattr(m, "native")]
    assert flags and all(f == (row == "etc_rich_torch") for f in flags)
    batch = features.batch_features(features.featurize(docs[0], tokenizer, fc))
    out[row] = runner({k: v for k, v in batch.items() if k in serve.MODEL_KEYS})
  np.testing.assert_allclose(out["etc_rich_torch"], out["etc_rich_torch_tensor"], atol=1e-4)
  assert "etc_rich_torch_tensor" not in serve.DEFAULT_ROWS
