"""`flaxdoc.bench.serve_paired`: round-robin timing gives paired ratios that a drifting
machine speed does not change; a quick end-to-end run."""

import json

import pytest

from flaxdoc.bench import serve_paired


class _Clock:
  """A fake `time.perf_counter` that the fake runners advance."""

  def __init__(self):
    self.now = 0.0
    self.calls = 0

  def __call__(self):
    return self.now


def test_paired_ratio_cancels_a_drifting_machine_speed(monkeypatch):
  clock = _Clock()
  monkeypatch.setattr(serve_paired.time, "perf_counter", clock)
  cost = {"fast": 1.0, "slow": 2.5}

  def runner(name):
    def run(_batch):
      # The machine gets slower every call (x1.0, x1.1, x1.2, ...), like a loaded host.
      clock.calls += 1
      clock.now += cost[name] * (1.0 + 0.1 * clock.calls)
    return run

  built = {name: (runner(name), None) for name in ("slow", "fast")}
  rows = {r["row"]: r for r in serve_paired.measure_paired(built, rounds=5, baseline="slow",
                                                            warmup=1)}
  # Within a round "fast" runs right after "slow", one step slower: ratio 2.5 * s / (s + 0.1).
  assert rows["slow"]["paired_speedup"] == pytest.approx(1.0)
  assert 2.2 < rows["fast"]["paired_speedup"] < 2.5
  assert rows["fast"]["speedup_low"] <= rows["fast"]["paired_speedup"] <= rows["fast"]["speedup_high"]
  assert len(rows["fast"]["times_s"]) == 5
  # Unpaired medians drift with the machine; the paired ratio stays near the true 2.5.
  assert rows["slow"]["max_s"] > 1.3 * rows["slow"]["min_s"]


def test_unknown_baseline_is_a_clear_error():
  with pytest.raises(ValueError, match="baseline row 'layoutlm_torch'"):
    serve_paired.measure_paired({"etc_rich_torch": (lambda b: None, None)}, 1, "layoutlm_torch")


def test_quick_run_prints_one_row_each(capsys):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  assert serve_paired.main(["--quick", "--json", "--pages", "1", "--rounds", "2",
                            "--rows", "etc_rich_torch", "--baseline", "layoutlm_torch"]) == 0
  rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  assert [r["row"] for r in rows] == ["etc_rich_torch", "layoutlm_torch"]
  assert all(r["model_s"] > 0 and r["rounds"] == 2 for r in rows)
  assert rows[1]["paired_speedup"] == pytest.approx(1.0)
