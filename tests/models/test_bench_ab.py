"""`flaxdoc.bench.ab`: two versions' benchmark runs in alternation, tagged, paired, within a budget.

Two stand-in versions (each a directory with a `flaxdoc` package and a tiny benchmark
module, `flaxdoc.bench.probe`, that prints JSON rows and logs its call) replace real
checkouts, so the mechanics are tested without a GPU or a second clone.
"""

from __future__ import annotations

import json
import os
import textwrap
import time

import pytest

from flaxdoc.bench import ab

PROBE = """
import json, sys, time
from pathlib import Path
version = Path(__file__).parents[2]  # DIR/flaxdoc/bench/probe.py
with open(version.parent / "calls.txt", "a") as f:
  f.write(version.name + "\\n")
time.sleep({sleep})
assert sys.argv[-1] == "--json", sys.argv
for size, ms in ((1, {ms}), (2, 2 * {ms})):
  print(json.dumps({{"part": "probe", "size": size, "step_ms": ms, "compile_s": 0.1,
                    "device": "cpu"}}))
print("a line that is not JSON")
"""


def version(tmp_path, name, ms, sleep=0.0):
  d = tmp_path / name
  (d / "flaxdoc" / "bench").mkdir(parents=True)
  (d / "flaxdoc" / "__init__.py").write_text("")
  (d / "flaxdoc" / "bench" / "__init__.py").write_text("")
  (d / "flaxdoc" / "bench" / "probe.py").write_text(textwrap.dedent(PROBE.format(ms=ms,
                                                                                  sleep=sleep)))
  return d


def test_runs_alternate_and_pair_into_ratios(tmp_path):
  base, head = version(tmp_path, "base", 4.0), version(tmp_path, "head", 3.0)
  out = tmp_path / "rows.jsonl"
  rows, errors = ab.run_rounds(base, head, ["probe"], rounds=3, budget=300, out=str(out),
                               log=lambda s: None)
  assert errors == []
  # base, head, then head, base, then base, head: drift moves both alike.
  assert (tmp_path / "calls.txt").read_text().split() == ["base", "head", "head", "base",
                                                          "base", "head"]
  assert len(rows) == 12 and {r["code"] for r in rows} == {"base", "head"}
  assert [json.loads(line) for line in out.read_text().splitlines()] == rows
  table = ab.paired_table(rows)
  # Paired on the keys that are not measurements (compile_s, device are not keys).
  assert table == [
      {"part": "probe", "size": 1, "base_step_ms": 4.0, "head_step_ms": 3.0, "head/base": 0.75,
       "runs": "3+3"},
      {"part": "probe", "size": 2, "base_step_ms": 8.0, "head_step_ms": 6.0, "head/base": 0.75,
       "runs": "3+3"}]


def test_stops_before_a_run_would_pass_the_budget(tmp_path):
  base, head = version(tmp_path, "base", 4.0, sleep=2.0), version(tmp_path, "head", 3.0)
  rows, errors = ab.run_rounds(base, head, ["probe"], rounds=2, budget=3.0,
                               log=lambda s: None)
  # The first run takes over 2 s, which leaves less than that: nothing else starts (on a
  # machine so slow that the first run passes the budget, it is stopped at the budget).
  assert (tmp_path / "calls.txt").read_text().split() == ["base"]
  assert errors and "not started" in errors[-1], errors
  assert {r["code"] for r in rows} <= {"base"}
  assert all(row["head/base"] is None for row in ab.paired_table(rows))


def test_a_timeout_ends_the_benchmarks_own_subprocesses(tmp_path):
  base = version(tmp_path, "base", 1.0)
  pid_file = tmp_path / "child.pid"
  (base / "flaxdoc" / "bench" / "probe.py").write_text(textwrap.dedent(f"""
      import subprocess, sys, time
      child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
      open({str(pid_file)!r}, "w").write(str(child.pid))
      time.sleep(60)
      """))
  rows, error = ab.run_once("base", base, ["probe"], timeout=3.0)
  assert rows == [] and "timed out" in error
  pid = int(pid_file.read_text())
  deadline = time.monotonic() + 5
  while time.monotonic() < deadline and _alive(pid):
    time.sleep(0.1)
  assert not _alive(pid), "the benchmark's own subprocess outlived the timeout"


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  # A killed child of an exited parent may linger as a zombie until reaped by init.
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      return f.read().split()[2] != "Z"
  except OSError:
    return False


def test_command_line_prints_the_paired_table(tmp_path, capsys):
  base, head = version(tmp_path, "base", 2.0), version(tmp_path, "head", 1.0)
  assert ab.main(["--base", str(base), "--head", str(head), "--rounds", "1", "--json",
                  "--", "probe"]) == 0
  table = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  assert [r["head/base"] for r in table] == [0.5, 0.5]


def test_a_failing_version_is_reported(tmp_path, capsys):
  base, head = version(tmp_path, "base", 2.0), version(tmp_path, "head", 1.0)
  (head / "flaxdoc" / "bench" / "probe.py").write_text("raise SystemExit('head is broken')\n")
  rows, errors = ab.run_rounds(base, head, ["probe"], rounds=1, budget=300,
                               log=lambda s: None)
  assert {r["code"] for r in rows} == {"base"}
  assert errors == ["round 0 head: exit 1: head is broken"]


def test_clear_errors(tmp_path):
  head = version(tmp_path, "head", 1.0)
  with pytest.raises(SystemExit):
    ab.main(["--base", str(tmp_path / "missing"), "--head", str(head), "--", "probe"])
  with pytest.raises(SystemExit):
    ab.main(["--base", str(head), "--head", str(head)])
