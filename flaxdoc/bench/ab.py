r"""Two versions of flaxdoc, one benchmark, in alternation on one machine: paired ratios.

    python -m flaxdoc.bench.ab --base DIR [--head DIR] [--rounds 2] [--budget 540]
        [--out rows.jsonl] [--metric step_ms] [--json] -- MODULE [ARGS ...]

Runs `python -m MODULE ARGS --json` (`MODULE` as `gcn_kernel` or in full,
`flaxdoc.bench.gcn_kernel`) once per round with each version's directory first on
`PYTHONPATH`: `--base`, a directory holding another version's `flaxdoc` package, made
with `git worktree add DIR REV` or `mkdir DIR && git archive REV flaxdoc | tar -x -C DIR`;
`--head`, this checkout (the default). Each run starts in its version's directory, so
give paths in `ARGS` absolute (`$OUT/...`). The order alternates, base then head, head then
base, so a machine that speeds up or slows down during the run moves both alike.

Why: accelerator time is lent in short slices, and two cards of the same kind differ by
a few percent (docs/accelerators.md), so a change is measured against the code before it
on the same machine in the same call, not against a figure from another session. The
tool stops starting runs once the next would pass `--budget` seconds (each run's time is
estimated from the slowest run so far), and gives each run the budget left as its timeout.

Every JSON row the benchmark prints is tagged with `code` (`base` / `head`), `round` and
the directory, and appended to `--out` as it arrives. The table pairs a base row with a
head row when they agree on every key that all rows have and that is not a measurement
(strings, ints, booleans, lists; `--by` names the keys instead) and prints the median of
`--metric` over rounds for each and their ratio, head / base (below 1: head is faster
for a time).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from flaxdoc.bench import common

HEAD = Path(__file__).resolve().parents[2]  # this checkout: the directory holding flaxdoc/
# Keys that describe a run rather than what it measured: never used to pair rows.
NOT_IDENTITY = ("code", "round", "dir", "compile_s", "device", "commit", "session", "note",
                "error", "seconds")
METRICS = ("step_ms", "fwd_bwd_ms", "ms", "seconds")


def module_name(name: str) -> str:
  return name if "." in name else f"flaxdoc.bench.{name}"


def run_once(code: str, directory: Path, command: list[str], timeout: float) -> tuple[list, str]:
  """`(rows, error)`: one benchmark run with `directory` first on `PYTHONPATH`."""
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join([str(directory)] + (
      [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
  cmd = [sys.executable, "-m", module_name(command[0])] + command[1:] + ["--json"]
  # In the version's directory: `python -m` puts the working directory first on
  # sys.path, so elsewhere (this checkout's root, say) another flaxdoc would shadow it,
  # in the benchmark and in any subprocess it starts. In a session of its own, so that a
  # timeout ends the benchmark's own subprocesses too (bench.accelerator runs each row in
  # one), not only the process this starts, which would leave them on the device.
  proc = subprocess.Popen(cmd, env=env, cwd=directory, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True)
  try:
    stdout, stderr = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    stdout, _ = proc.communicate()
    return _rows(stdout or ""), f"{code}: timed out after {timeout:.0f} s"
  error = ""
  if proc.returncode:
    last = stderr.strip().splitlines()[-1:]
    error = f"{code}: exit {proc.returncode}" + (f": {last[0]}" if last else "")
  return _rows(stdout), error


def _rows(stdout: str) -> list[dict]:
  rows = []
  for line in stdout.splitlines():
    line = line.strip()
    if line.startswith("{"):
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:  # a line cut off by a timeout
        continue
  return rows


def identity_keys(rows: list[dict], by: list[str] | None) -> list[str]:
  """The keys rows are paired on: `by`, or those every row has with a non-float value."""
  if by:
    return by
  if not rows:
    return []
  keys = set.intersection(*(set(r) for r in rows)) - set(NOT_IDENTITY)
  return sorted(k for k in keys if not any(isinstance(r[k], float) for r in rows))


def pick_metric(rows: list[dict], metric: str | None) -> str | None:
  if metric:
    return metric
  return next((m for m in METRICS if any(isinstance(r.get(m), (int, float)) for r in rows)),
              None)


def paired_table(rows: list[dict], metric: str | None = None,
                 by: list[str] | None = None) -> list[dict]:
  """One row per configuration: the median `metric` of base and head, and head / base."""
  metric = pick_metric(rows, metric)
  keys = identity_keys(rows, by)
  groups: dict[str, dict] = {}
  for r in rows:
    if metric is None or not isinstance(r.get(metric), (int, float)):
      continue
    ident = json.dumps([r.get(k) for k in keys])
    g = groups.setdefault(ident, {"row": {k: r.get(k) for k in keys}, "base": [], "head": []})
    g[r["code"]].append(float(r[metric]))
  table = []
  for g in groups.values():
    base = statistics.median(g["base"]) if g["base"] else None
    head = statistics.median(g["head"]) if g["head"] else None
    table.append({**g["row"], f"base_{metric}": base, f"head_{metric}": head,
                  "head/base": head / base if base and head is not None else None,
                  "runs": f"{len(g['base'])}+{len(g['head'])}"})
  return table


def run_rounds(base: Path, head: Path, command: list[str], rounds: int, budget: float,
               out: str | None = None, log=print) -> tuple[list[dict], list[str]]:
  """All rows of all runs, tagged, and the errors; stops before a run would pass `budget`."""
  start, slowest, rows, errors = time.monotonic(), 0.0, [], []
  for rnd in range(rounds):
    order = [("base", base), ("head", head)]
    for code, directory in order if rnd % 2 == 0 else order[::-1]:
      left = budget - (time.monotonic() - start)
      if left < max(slowest, 1.0):
        errors.append(f"round {rnd} {code}: not started, {left:.0f} s of the budget left "
                      f"and the slowest run took {slowest:.0f} s")
        return rows, errors
      t0 = time.monotonic()
      new, error = run_once(code, directory, command, left)
      slowest = max(slowest, time.monotonic() - t0)
      for r in new:
        r.update(code=code, round=rnd, dir=str(directory))
      rows += new
      if out:
        with open(out, "a", encoding="utf-8") as f:
          for r in new:
            f.write(json.dumps(r) + "\n")
      if error:
        errors.append(f"round {rnd} {error}")
      log(f"# round {rnd} {code}: {len(new)} rows in {time.monotonic() - t0:.0f} s"
          + (f" ({error})" if error else ""))
  return rows, errors


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--base", required=True, type=Path,
                 help="directory holding the other version's flaxdoc package")
  p.add_argument("--head", default=HEAD, type=Path, help="default: this checkout")
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--budget", type=float, default=540.0, help="seconds for all runs")
  p.add_argument("--out", default=None, help="append the tagged JSON rows to this file")
  p.add_argument("--metric", default=None, help=f"default: the first of {METRICS} present")
  p.add_argument("--by", nargs="+", default=None, help="keys that pair rows (default: all "
                 "keys every row has with a value that is not a float)")
  p.add_argument("--json", action="store_true")
  p.add_argument("command", nargs=argparse.REMAINDER, help="-- MODULE [ARGS ...]")
  a = p.parse_args(argv)
  command = a.command[1:] if a.command[:1] == ["--"] else a.command
  if not command:
    p.error("name the benchmark after --, e.g. -- gcn_kernel --kernels pallas")
  for name, directory in (("--base", a.base), ("--head", a.head)):
    if not (directory / "flaxdoc" / "__init__.py").is_file():
      p.error(f"{name} {directory}: no flaxdoc package there (make one with git worktree "
              "add DIR REV, or git archive REV flaxdoc | tar -x -C DIR)")
  rows, errors = run_rounds(a.base.resolve(), a.head.resolve(), command, a.rounds, a.budget,
                            a.out, log=lambda s: print(s, file=sys.stderr, flush=True))
  table = paired_table(rows, a.metric, a.by)
  common.emit(table, as_json=a.json, title=f"{' '.join(command)}: base {a.base} vs head "
              f"{a.head}, median over rounds")
  for e in errors:
    print(f"# {e}", file=sys.stderr)
  return 1 if errors and not rows else 0


if __name__ == "__main__":
  sys.exit(main())
