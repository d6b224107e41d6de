"""The launchers in `launch/`: TPU pod scripts and the SLURM batch file.

Nothing here touches a cloud or a cluster. Each script's `--dry-run` prints its
commands (one per line, `+ ` then shell words), which are parsed with `shlex`
and compared with what the Cloud TPU and SLURM recipes say they must be; fake
`gcloud`/`srun`/`pip`/... on PATH prove a dry run runs none of them. The SLURM
wiring is also run for real: two local "tasks" of `run_task.sh` start JAX's
distributed runtime on the CPU and must agree on a process count of 2.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
POD = REPO / "launch" / "tpu" / "pod.sh"
SETUP = REPO / "launch" / "tpu" / "setup_and_run.sh"
SUB = REPO / "launch" / "slurm" / "flaxdoc.sub"
TASK = REPO / "launch" / "slurm" / "run_task.sh"
SCRIPTS = (POD, SETUP, SUB, TASK)
BASH = shutil.which("bash") or "/bin/bash"

# Tools that must never run during a dry run.
TRAPPED = ("gcloud", "srun", "sbatch", "pip", "pip3", "apt-get", "sudo", "git", "tar")


# --- helpers -------------------------------------------------------------------------


def _write_exe(path: Path, text: str) -> Path:
  path.write_text(textwrap.dedent(text).lstrip())
  path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
  return path


def _base_env(**extra: str) -> dict[str, str]:
  """The test process's env minus anything a launcher reads, plus `extra`."""
  env = {
      k: v for k, v in os.environ.items()
      if not (k.startswith(("SLURM_", "FLAXDOC_", "JAX_", "TPU_", "CUDA_")) or k == "DRY_RUN"
              or "proxy" in k.lower())
  }
  env.update(extra)
  return env


@pytest.fixture
def trap_bin(tmp_path: Path) -> Path:
  """A bin dir whose gcloud/srun/pip/... record that they were called, and fail."""
  bin_dir = tmp_path / "trap_bin"
  bin_dir.mkdir()
  for tool in TRAPPED:
    _write_exe(bin_dir / tool, f"""
        #!{BASH}
        echo "{tool} $*" >> "{tmp_path}/trapped.log"
        exit 97
        """)
  return bin_dir


def _assert_nothing_ran(tmp_path: Path) -> None:
  log = tmp_path / "trapped.log"
  assert not log.exists(), f"a dry run executed: {log.read_text()}"


def _sh(script: Path, *args: str, env: dict[str, str], cwd: Path | None = None,
        ok: bool = True) -> subprocess.CompletedProcess:
  proc = subprocess.run([BASH, str(script), *args], env=env, cwd=cwd or REPO, text=True,
                        capture_output=True, timeout=60, check=False)
  if ok:
    assert proc.returncode == 0, f"{script.name} failed:\n{proc.stdout}\n{proc.stderr}"
  return proc


def _commands(stdout: str) -> list[list[str]]:
  """The dry-run lines (`+ word word ...`) as argv lists."""
  return [shlex.split(line[2:]) for line in stdout.splitlines() if line.startswith("+ ")]


def _flags(argv: list[str]) -> dict[str, str]:
  """`--k=v` and bare `--k` words of a command line as a dict."""
  out = {}
  for word in argv:
    if word.startswith("--"):
      key, _, value = word.partition("=")
      out[key] = value
  return out


def _env_with_path(*dirs: Path, **extra: str) -> dict[str, str]:
  env = _base_env(**extra)
  env["PATH"] = os.pathsep.join([*map(str, dirs), env.get("PATH", "")])
  return env


# --- static checks ------------------------------------------------------------------


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck_clean(script: Path):
  if shutil.which("shellcheck") is None:
    pytest.skip("shellcheck is not installed (apt-get install -y shellcheck)")
  proc = subprocess.run(["shellcheck", "--shell=bash", "--severity=style", "--external-sources",
                         str(script)], capture_output=True, text=True, timeout=60, check=False)
  assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_are_strict_executable_and_have_dry_run(script: Path):
  text = script.read_text()
  assert text.startswith("#!/usr/bin/env bash\n")
  assert "set -euo pipefail" in text
  assert "--dry-run" in text and 'DRY_RUN="${DRY_RUN:-0}"' in text
  assert "\t" not in text, "2-space indentation, no tabs"
  assert os.access(script, os.X_OK), f"chmod +x {script}"


# Long sbatch options (`man sbatch`) and whether they take a value.
SBATCH_OPTIONS = {
    "account": "value", "array": "value", "begin": "value", "chdir": "value",
    "comment": "value", "constraint": "value", "cpus-per-gpu": "value",
    "cpus-per-task": "value", "dependency": "value", "error": "value",
    "exclude": "value", "exclusive": "optional", "export": "value", "gpu-bind": "value",
    "gpus": "value", "gpus-per-node": "value", "gpus-per-task": "value", "gres": "value",
    "hint": "value", "job-name": "value", "mail-type": "value", "mail-user": "value",
    "mem": "value", "mem-per-cpu": "value", "mem-per-gpu": "value", "nodelist": "value",
    "nodes": "value", "ntasks": "value", "ntasks-per-gpu": "value",
    "ntasks-per-node": "value", "open-mode": "value", "output": "value",
    "partition": "value", "qos": "value", "requeue": "flag", "no-requeue": "flag",
    "reservation": "value", "signal": "value", "switches": "value", "time": "value",
    "wckey": "value",
}


def _sbatch_header(path: Path) -> dict[str, str]:
  """`#SBATCH --opt[=value]` lines, checked the way sbatch reads them."""
  lines = path.read_text().splitlines()
  assert lines[0].startswith("#!"), "sbatch needs an interpreter line"
  options, seen_command = {}, False
  for number, line in enumerate(lines[1:], start=2):
    stripped = line.strip()
    if not stripped or stripped.startswith("#") and not stripped.startswith("#SBATCH"):
      continue
    if not stripped.startswith("#SBATCH"):
      seen_command = True
      continue
    # sbatch stops reading directives at the first command: later ones are ignored.
    assert not seen_command, f"line {number}: #SBATCH after the first command is ignored"
    assert line.startswith("#SBATCH --"), f"line {number}: {line!r}"
    match = re.fullmatch(r"#SBATCH --([a-z-]+)(?:=(\S+))?\s*", line)
    assert match, f"line {number}: not `#SBATCH --option[=value]`: {line!r}"
    name, value = match.groups()
    assert name in SBATCH_OPTIONS, f"line {number}: unknown sbatch option --{name}"
    kind = SBATCH_OPTIONS[name]
    assert (value is not None) == (kind == "value") or kind == "optional", f"line {number}"
    assert name not in options, f"line {number}: --{name} given twice"
    options[name] = value or ""
  return options


def test_sbatch_header_is_sane():
  opts = _sbatch_header(SUB)
  # 2 nodes x 8 GPUs, one task (one JAX process) per GPU.
  assert int(opts["nodes"]) == 2
  assert int(opts["ntasks-per-node"]) == int(opts["gpus-per-node"]) == 8
  assert "ntasks" not in opts and "gpus-per-task" not in opts
  assert re.fullmatch(r"(\d+-)?\d{1,2}:\d\d:\d\d", opts["time"])
  assert "%j" in opts["output"]


def test_sbatch_header_checker_catches_mistakes(tmp_path: Path):
  # The checker itself must fail on the mistakes it exists for.
  bad = {
      "late": "#!/bin/bash\necho hi\n#SBATCH --nodes=2\n",
      "typo": "#!/bin/bash\n#SBATCH --node=2\n",
      "short": "#!/bin/bash\n#SBATCH -N 2\n",
      "missing value": "#!/bin/bash\n#SBATCH --time\n",
  }
  for name, text in bad.items():
    path = tmp_path / f"{name}.sub"
    path.write_text(text)
    with pytest.raises(AssertionError):
      _sbatch_header(path)


# --- launch/tpu/pod.sh ---------------------------------------------------------------

POD_FLAGS = ("--name", "my-pod", "--zone", "us-central2-b", "--project", "my-proj")

# Slice facts from the Cloud TPU docs (system architecture pages): chips, VMs
# (workers), JAX devices. v4/v5p count TensorCores in the name and fuse the two
# of a chip into one device; v3 exposes both; v5e/v6e count chips, 4 per VM.
SLICES = {
    "v4-32": (16, 4, 16),
    "v4-8": (4, 1, 4),
    "v5litepod-64": (64, 16, 64),
    "v5litepod-8": (8, 1, 8),
    "v3-32": (16, 4, 32),
    "v5p-128": (64, 16, 64),
    "v6e-16": (16, 4, 16),
}


def test_pod_create_v4_32(tmp_path, trap_bin):
  proc = _sh(POD, "create", *POD_FLAGS, "--accelerator-type", "v4-32", "--dry-run",
             env=_env_with_path(trap_bin))
  (cmd,) = _commands(proc.stdout)
  assert cmd[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "my-pod"]
  assert _flags(cmd) == {"--zone": "us-central2-b", "--project": "my-proj",
                         "--accelerator-type": "v4-32", "--version": "tpu-ubuntu2204-base"}
  assert "v4-32 = 16 chips on 4 workers, 16 JAX devices" in proc.stderr
  _assert_nothing_ran(tmp_path)


@pytest.mark.parametrize("accelerator", sorted(SLICES))
def test_pod_create_describes_the_slice(accelerator, tmp_path, trap_bin):
  chips, workers, devices = SLICES[accelerator]
  proc = _sh(POD, "create", *POD_FLAGS, "--accelerator-type", accelerator, "--dry-run",
             env=_env_with_path(trap_bin))
  assert f"= {chips} chips on {workers} workers, {devices} JAX devices" in proc.stderr


def test_pod_create_v5e_alias_spot_and_env_defaults(tmp_path, trap_bin):
  env = _env_with_path(trap_bin, DRY_RUN="1", FLAXDOC_TPU_NAME="pod5",
                       FLAXDOC_TPU_ZONE="us-west4-a", FLAXDOC_TPU_TYPE="v5e-64")
  proc = _sh(POD, "create", "--spot", env=env)
  (cmd,) = _commands(proc.stdout)
  assert cmd[5] == "pod5"
  assert _flags(cmd) == {"--zone": "us-west4-a", "--accelerator-type": "v5litepod-64",
                         "--version": "v2-alpha-tpuv5-lite", "--spot": ""}
  assert "64 chips on 16 workers, 64 JAX devices" in proc.stderr
  _assert_nothing_ran(tmp_path)


def test_pod_copy_sends_code_to_every_worker_and_data_to_gcs(tmp_path, trap_bin):
  data = tmp_path / "funsd"
  data.mkdir()
  proc = _sh(POD, "copy", *POD_FLAGS, "--data-src", str(data), "--data-dir",
             "gs://my-bucket/datasets/funsd", "--dry-run", env=_env_with_path(trap_bin))
  pack, scp, ssh, rsync = _commands(proc.stdout)
  # git ls-files ... | tar ... -czf ARCHIVE
  bar = pack.index("|")
  assert pack[:bar] == ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                        "--exclude-standard"]
  assert pack[bar + 1] == "tar" and "--files-from=-" in pack and "--null" in pack
  archive = pack[pack.index("-czf") + 1]
  assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
  assert scp[5:7] == [archive, "my-pod:flaxdoc-src.tar.gz"]
  assert _flags(scp) == {"--zone": "us-central2-b", "--project": "my-proj", "--worker": "all"}
  assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-pod"]
  flags = _flags(ssh)
  assert flags["--worker"] == "all" and flags["--zone"] == "us-central2-b"
  assert shlex.split(flags["--command"]) == [
      "mkdir", "-p", "flaxdoc", "&&", "tar", "-xzf", "flaxdoc-src.tar.gz", "-C", "flaxdoc",
      "&&", "rm", "-f", "flaxdoc-src.tar.gz"]
  assert rsync == ["gcloud", "storage", "rsync", "--recursive", str(data),
                   "gs://my-bucket/datasets/funsd"]
  _assert_nothing_ran(tmp_path)


def test_pod_copy_archive_holds_the_working_tree(tmp_path):
  """A real (not dry) copy against a fake gcloud: what reaches the workers."""
  if shutil.which("git") is None or shutil.which("tar") is None:
    pytest.skip("needs git and tar")
  repo = tmp_path / "repo"
  (repo / "launch" / "tpu").mkdir(parents=True)
  shutil.copy2(POD, repo / "launch" / "tpu" / "pod.sh")
  (repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")
  (repo / ".gitignore").write_text(".venv/\n")
  (repo / "gone.py").write_text("deleted after git add\n")
  git_env = _base_env(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                      GIT_COMMITTER_EMAIL="t@t")
  for args in (["init", "-q"], ["add", "-A"]):
    subprocess.run(["git", *args], cwd=repo, env=git_env, check=True, capture_output=True)
  (repo / "gone.py").unlink()
  (repo / "new_untracked.py").write_text("print('hi')\n")
  (repo / ".venv" / "bin").mkdir(parents=True)
  (repo / ".venv" / "bin" / "python").write_text("not code\n")

  fake = tmp_path / "fake_bin"
  fake.mkdir()
  kept = tmp_path / "uploaded"
  kept.mkdir()
  _write_exe(fake / "gcloud", f"""
      #!{sys.executable}
      import json, os, shutil, sys
      with open({str(tmp_path / "gcloud.jsonl")!r}, "a") as f:
        f.write(json.dumps(sys.argv[1:]) + "\\n")
      if "scp" in sys.argv:
        shutil.copy(sys.argv[sys.argv.index("scp") + 1], {str(kept)!r})
      sys.exit(int(os.environ.get("FAKE_GCLOUD_RC", "0")))
      """)
  _sh(repo / "launch" / "tpu" / "pod.sh", "copy", *POD_FLAGS,
      env=_env_with_path(fake, TMPDIR=str(tmp_path)))
  calls = [json.loads(line) for line in (tmp_path / "gcloud.jsonl").read_text().splitlines()]
  assert [c[:4] for c in calls] == [["compute", "tpus", "tpu-vm", "scp"],
                                    ["compute", "tpus", "tpu-vm", "ssh"]]
  (archive,) = kept.iterdir()
  with tarfile.open(archive) as tar:
    names = {n.removeprefix("./") for n in tar.getnames()}
  assert names == {".gitignore", "pyproject.toml", "launch/tpu/pod.sh", "new_untracked.py"}
  # The local archive is cleaned up after the upload, and when it fails.
  assert not (tmp_path / "flaxdoc-src-my-pod.tar.gz").exists()
  proc = _sh(repo / "launch" / "tpu" / "pod.sh", "copy", *POD_FLAGS, ok=False,
             env=_env_with_path(fake, TMPDIR=str(tmp_path), FAKE_GCLOUD_RC="1"))
  assert proc.returncode == 1
  assert not (tmp_path / "flaxdoc-src-my-pod.tar.gz").exists()


def test_pod_copy_packs_a_git_worktree_with_git(tmp_path, trap_bin):
  """In a `git worktree` (or a submodule) .git is a file: git still lists what to pack."""
  if shutil.which("git") is None:
    pytest.skip("needs git")
  repo, tree = tmp_path / "repo", tmp_path / "tree"
  (repo / "launch" / "tpu").mkdir(parents=True)
  shutil.copy2(POD, repo / "launch" / "tpu" / "pod.sh")
  git_env = _base_env(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                      GIT_COMMITTER_EMAIL="t@t")
  for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "x"],
               ["worktree", "add", "-q", str(tree)]):
    subprocess.run(["git", *args], cwd=repo, env=git_env, check=True, capture_output=True)
  assert (tree / ".git").is_file()
  proc = _sh(tree / "launch" / "tpu" / "pod.sh", "copy", *POD_FLAGS, "--dry-run",
             env=_env_with_path(trap_bin))
  pack = _commands(proc.stdout)[0]
  assert pack[:5] == ["git", "-C", str(tree), "ls-files", "-z"]
  _assert_nothing_ran(tmp_path)


def test_pod_run_starts_setup_and_run_on_all_workers(tmp_path, trap_bin):
  odd = "--config.predict.input=it's a file.jsonl"  # quoting must survive two shells
  proc = _sh(POD, "run", *POD_FLAGS, "--config", "configs/formnet_a2.py:dataset=funsd",
             "--workdir", "gs://my-bucket/runs/v4-32", "--data-dir",
             "gs://my-bucket/datasets/funsd/", "--dry-run", "--",
             "--config.mesh.shape.data=-1", "--config.batch_size=512", odd,
             env=_env_with_path(trap_bin))
  (cmd,) = _commands(proc.stdout)
  assert cmd[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-pod"]
  flags = _flags(cmd)
  assert flags["--worker"] == "all"
  assert flags["--zone"] == "us-central2-b" and flags["--project"] == "my-proj"
  remote = shlex.split(flags["--command"])
  # The dataset readers read local files: each worker syncs the GCS folder into its home.
  main_args = ["--config=configs/formnet_a2.py:dataset=funsd",
               "--workdir=gs://my-bucket/runs/v4-32",
               "--multihost", "--config.data.data_dir=$HOME/flaxdoc_data/funsd",
               "--config.mesh.shape.data=-1", "--config.batch_size=512", odd]
  assert remote == ["mkdir", "-p", "flaxdoc_data/funsd", "&&", "gcloud", "storage", "rsync",
                    "--recursive", "gs://my-bucket/datasets/funsd/", "flaxdoc_data/funsd", "&&",
                    "cd", "flaxdoc", "&&", "bash", "launch/tpu/setup_and_run.sh", "--",
                    *main_args]
  _assert_nothing_ran(tmp_path)

  # What the workers would then run: setup_and_run.sh hands the arguments over intact,
  # with $HOME expanded by the worker's shell.
  home = tmp_path / "home"
  (home / "flaxdoc" / "launch" / "tpu").mkdir(parents=True)
  shutil.copy2(SETUP, home / "flaxdoc" / "launch" / "tpu")
  shutil.copy2(REPO / "pyproject.toml", home / "flaxdoc")
  remote_text = flags["--command"].replace("bash launch/tpu/setup_and_run.sh",
                                           "bash launch/tpu/setup_and_run.sh --dry-run")
  setup = subprocess.run([BASH, "-c", remote_text], env=_env_with_path(trap_bin, HOME=str(home)),
                         cwd=home, text=True, capture_output=True, timeout=60, check=False)
  # The fake gcloud (the sync) ran, and failed, so nothing else did.
  assert setup.returncode == 97 and not _commands(setup.stdout)
  assert (tmp_path / "trapped.log").read_text() == (
      "gcloud storage rsync --recursive gs://my-bucket/datasets/funsd/ flaxdoc_data/funsd\n")
  (tmp_path / "trapped.log").unlink()
  _write_exe(trap_bin / "gcloud", f"#!{BASH}\nexit 0\n")  # a sync that succeeds
  setup = subprocess.run([BASH, "-c", remote_text], env=_env_with_path(trap_bin, HOME=str(home)),
                         cwd=home, text=True, capture_output=True, timeout=60, check=True)
  main_args[3] = f"--config.data.data_dir={home}/flaxdoc_data/funsd"
  assert _commands(setup.stdout)[-1] == [str(home / "flaxdoc_venv" / "bin" / "python"), "-m",
                                         "flaxdoc.main", *main_args]
  assert (home / "flaxdoc_data" / "funsd").is_dir()
  _assert_nothing_ran(tmp_path)


def test_pod_run_detached_logs_on_each_worker(tmp_path, trap_bin):
  proc = _sh(POD, "run", *POD_FLAGS, "--config", "configs/x.py", "--workdir", "gs://b/r",
             "--venv", "/opt/venv", "--detach", "--dry-run", env=_env_with_path(trap_bin))
  (cmd,) = _commands(proc.stdout)
  command = _flags(cmd)["--command"]
  # One nohup'd shell runs the whole line, its output in the log: the worker's shell
  # returns at once (`cd x && nohup y > log &` would keep ssh's output open until y ends).
  assert command.endswith(" > ~/flaxdoc-run.log 2>&1 < /dev/null &")
  words = shlex.split(command.removesuffix(" > ~/flaxdoc-run.log 2>&1 < /dev/null &"))
  assert words[:3] == ["nohup", "bash", "-c"] and len(words) == 4
  assert shlex.split(words[3]) == [
      "cd", "flaxdoc", "&&", "bash", "launch/tpu/setup_and_run.sh", "--venv", "/opt/venv", "--",
      "--config=configs/x.py", "--workdir=gs://b/r", "--multihost"]
  home = tmp_path / "home"
  (home / "flaxdoc" / "launch" / "tpu").mkdir(parents=True)
  (home / "flaxdoc" / "launch" / "tpu" / "setup_and_run.sh").write_text(
      'sleep 30 & echo "$!" > started; echo "args: $*"\n')
  worker = subprocess.Popen([BASH, "-c", command], env=_base_env(HOME=str(home)), cwd=home,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  try:
    out, _ = worker.communicate(timeout=20)  # returns although the "run" goes on
  finally:
    worker.kill()
  assert out == b""
  for _ in range(200):
    if "args:" in (home / "flaxdoc-run.log").read_text():
      break
    time.sleep(0.05)
  assert (home / "flaxdoc-run.log").read_text() == (
      "args: --venv /opt/venv -- --config=configs/x.py --workdir=gs://b/r --multihost\n")
  os.kill(int((home / "flaxdoc" / "started").read_text()), 9)


def test_pod_delete_asks_unless_yes(tmp_path, trap_bin):
  env = _env_with_path(trap_bin)
  (cmd,) = _commands(_sh(POD, "delete", *POD_FLAGS, "--dry-run", env=env).stdout)
  assert cmd == ["gcloud", "compute", "tpus", "tpu-vm", "delete", "my-pod",
                 "--zone=us-central2-b", "--project=my-proj"]
  (cmd,) = _commands(_sh(POD, "--dry-run", "delete", *POD_FLAGS, "--yes", env=env).stdout)
  assert cmd[-1] == "--quiet"
  _assert_nothing_ran(tmp_path)


@pytest.mark.parametrize("args, message", [
    (("run", *POD_FLAGS, "--config", "c.py", "--workdir", "/tmp/local"), "gs://"),
    (("run", *POD_FLAGS, "--workdir", "gs://b/r"), "--config"),
    (("run", *POD_FLAGS, "--config", "c.py", "--workdir", "gs://b/r", "--data-dir", "/data"),
     "--data-dir"),
    (("create", *POD_FLAGS), "--accelerator-type"),
    (("create", "--zone", "z", "--accelerator-type", "v4-8"), "--name"),
    (("create", *POD_FLAGS, "--accelerator-type", "tpu9-8"), "--version"),
    (("copy", *POD_FLAGS, "--data-src", "/tmp"), "go together"),
    (("delete", *POD_FLAGS, "--", "--config=x"), "for 'run' only"),
    (("delete", *POD_FLAGS, "--bogus"), "unknown flag"),
    (("resize", *POD_FLAGS), "unknown subcommand"),
])
def test_pod_usage_errors(args, message, tmp_path, trap_bin):
  proc = _sh(POD, *args, "--dry-run", env=_env_with_path(trap_bin), ok=False)
  assert proc.returncode == 2 and message in proc.stderr, proc.stderr
  assert not _commands(proc.stdout)
  _assert_nothing_ran(tmp_path)


# --- launch/tpu/setup_and_run.sh ------------------------------------------------------


def _fake_python(path: Path, log: Path, *, version_ok: bool = True) -> Path:
  """An interpreter stand-in: logs its argv and cwd; `-m venv DIR` makes DIR/bin/python."""
  return _write_exe(path, f"""
      #!{BASH}
      echo "$0 $* [cwd=$PWD]" >> "{log}"
      case "$1" in
        -c) exit {0 if version_ok else 1} ;;
        -m) if [[ "$2" == venv ]]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; fi ;;
      esac
      exit 0
      """)


def test_setup_dry_run_on_a_fresh_worker(tmp_path, trap_bin):
  log = tmp_path / "python.log"
  py = _fake_python(tmp_path / "python3.12", log)
  home = tmp_path / "home"
  home.mkdir()
  proc = _sh(SETUP, "--dry-run", "--python", str(py), "--", "--config=configs/x.py",
             "--workdir=gs://b/r", "--multihost", env=_env_with_path(trap_bin, HOME=str(home)))
  venv = home / "flaxdoc_venv"
  vpy = str(venv / "bin" / "python")
  cmds = _commands(proc.stdout)
  assert cmds[0] == [str(py), "-m", "venv", str(venv)]
  assert cmds[1] == [vpy, "-m", "pip", "install", "--quiet", "--upgrade", "pip"]
  assert cmds[2] == [vpy, "-m", "pip", "install", "--quiet", "jax[tpu]", "gcsfs", "-e", str(REPO)]
  assert cmds[3][0] == "echo" and cmds[3][-2:] == [">", str(venv / ".flaxdoc-install-stamp")]
  assert cmds[4] == ["cd", str(REPO)]
  assert cmds[5] == ["export", f"PATH={venv}/bin:$PATH"]
  assert cmds[6] == [vpy, "-m", "flaxdoc.main", "--config=configs/x.py", "--workdir=gs://b/r",
                     "--multihost"]
  assert len(cmds) == 7
  # Only the version probe ran; nothing was created.
  assert [line.split()[1] for line in log.read_text().splitlines()] == ["-c"]
  assert list(home.iterdir()) == []
  _assert_nothing_ran(tmp_path)


def test_setup_is_idempotent(tmp_path):
  """Real runs with a stand-in python: venv and pip once, again only when pyproject changes."""
  repo = tmp_path / "repo"
  (repo / "launch" / "tpu").mkdir(parents=True)
  script = repo / "launch" / "tpu" / "setup_and_run.sh"
  shutil.copy2(SETUP, script)
  (repo / "pyproject.toml").write_text("[project]\nname = 'flaxdoc'\n")
  log = tmp_path / "python.log"
  py = _fake_python(tmp_path / "python3.11", log)
  venv = tmp_path / "venv"
  env = _base_env(FLAXDOC_VENV=str(venv))

  def run_once(*extra: str) -> list[str]:
    log.unlink(missing_ok=True)
    _sh(script, "--python", str(py), *extra, "--", "--config=c.py", env=env, cwd=tmp_path)
    return [line.split(" [cwd=")[0] for line in log.read_text().splitlines()]

  vpy = str(venv / "bin" / "python")
  install = [f"{vpy} -m pip install --quiet --upgrade pip",
             f"{vpy} -m pip install --quiet jax[tpu] gcsfs -e {repo}"]
  main = [f"{vpy} -m flaxdoc.main --config=c.py"]
  assert run_once() == [f"{py} -c import sys, ensurepip; sys.exit(sys.version_info < (3, 11))",
                        f"{py} -m venv {venv}", *install, *main]
  assert f"[cwd={repo}]" in log.read_text().splitlines()[-1]  # ran from the repository root
  assert run_once() == main
  assert run_once() == main
  (repo / "pyproject.toml").write_text("[project]\nname = 'flaxdoc'\nversion = '2'\n")
  assert run_once() == install + main
  assert run_once() == main
  assert run_once("--jax-spec", "jax[tpu]==0.10.2") == [
      install[0], f"{vpy} -m pip install --quiet jax[tpu]==0.10.2 gcsfs -e {repo}", *main]
  assert run_once("--reinstall", "--setup-only")[1:] == [f"{py} -m venv {venv}", *install]


def test_setup_installs_python_311_when_missing(tmp_path, trap_bin):
  # A PATH with the few tools the script uses, but no python at all; `id` says
  # we are not root, so apt-get goes through sudo.
  tools = tmp_path / "tools"
  tools.mkdir()
  for tool in ("dirname", "sha256sum", "cut", "cat"):
    os.symlink(shutil.which(tool), tools / tool)
  _write_exe(tools / "id", f"#!{BASH}\necho 1000\n")
  for tool in ("sudo", "apt-get"):
    os.symlink(trap_bin / tool, tools / tool)
  home = tmp_path / "home"
  home.mkdir()
  env = _base_env(HOME=str(home), PATH=str(tools))
  cmds = _commands(_sh(SETUP, "--dry-run", "--", "--config=c.py", env=env).stdout)
  assert cmds[0] == ["sudo", "apt-get", "update", "-q"]
  assert cmds[1] == ["sudo", "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y",
                     "-q", "python3.11", "python3.11-venv"]
  assert cmds[2] == ["python3.11", "-m", "venv", str(home / "flaxdoc_venv")]
  proc = _sh(SETUP, "--dry-run", "--no-apt", "--", "--config=c.py", env=env, ok=False)
  assert proc.returncode == 2 and "--no-apt" in proc.stderr and not _commands(proc.stdout)
  _assert_nothing_ran(tmp_path)


def test_setup_rejects_old_python_and_stray_flags(tmp_path, trap_bin):
  py = _fake_python(tmp_path / "python3.10", tmp_path / "python.log", version_ok=False)
  env = _env_with_path(trap_bin, HOME=str(tmp_path))
  proc = _sh(SETUP, "--dry-run", "--python", str(py), env=env, ok=False)
  assert proc.returncode == 2 and ">= 3.11" in proc.stderr
  proc = _sh(SETUP, "--dry-run", "--config=c.py", env=env, ok=False)
  assert proc.returncode == 2 and "after --" in proc.stderr
  _assert_nothing_ran(tmp_path)


def test_setup_entrypoint_override(tmp_path, trap_bin):
  py = _fake_python(tmp_path / "python3.11", tmp_path / "python.log")
  env = _env_with_path(trap_bin, HOME=str(tmp_path), FLAXDOC_ENTRYPOINT="python  probe.py --x")
  cmds = _commands(_sh(SETUP, "--dry-run", "--python", str(py), "--", "a b", env=env).stdout)
  assert cmds[-1] == ["python", "probe.py", "--x", "a b"]


# --- launch/slurm/run_task.sh --------------------------------------------------------


@pytest.fixture
def scontrol_bin(tmp_path: Path) -> Path:
  """A stand-in `scontrol show hostnames` for lists like `gpu-node[017-018,020],cpu1`."""
  bin_dir = tmp_path / "scontrol_bin"
  bin_dir.mkdir()
  _write_exe(bin_dir / "scontrol", f"""
      #!{sys.executable}
      import re, sys
      with open({str(tmp_path / "scontrol.log")!r}, "a") as f:
        f.write(" ".join(sys.argv[1:]) + "\\n")
      assert sys.argv[1:3] == ["show", "hostnames"], sys.argv
      for item in re.findall(r"[^,\\[]+(?:\\[[^\\]]*\\])?[^,]*", sys.argv[3]):
        m = re.fullmatch(r"([^\\[]*)\\[([^\\]]*)\\](.*)", item)
        if not m:
          print(item)
          continue
        for part in m.group(2).split(","):
          lo, _, hi = part.partition("-")
          for i in range(int(lo), int(hi or lo) + 1):
            print(f"{{m.group(1)}}{{i:0{{len(lo)}}d}}{{m.group(3)}}")
      """)
  return bin_dir


def _slurm_env(procid: int, *, nodes: str = "gpu-node[017-018]", ntasks: int = 16,
               per_node: int = 8, job_id: int = 4242, **extra: str) -> dict[str, str]:
  """What srun sets for task `procid` of a 2-node, 8-task-per-node step."""
  return {
      "SLURM_JOB_ID": str(job_id), "SLURM_JOB_NODELIST": nodes, "SLURM_STEP_NODELIST": nodes,
      "SLURM_NNODES": str(ntasks // per_node), "SLURM_NTASKS": str(ntasks),
      "SLURM_NTASKS_PER_NODE": str(per_node), "SLURM_TASKS_PER_NODE": f"{per_node}(x2)",
      "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(procid % per_node),
      "SLURM_NODEID": str(procid // per_node), "SLURM_GPUS_ON_NODE": str(per_node),
      "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(per_node))), **extra,
  }


def _jax_would_pick(env: dict[str, str]) -> str:
  """The coordinator JAX's own SLURM detection computes from the same variables."""
  from jax._src.clusters import slurm_cluster  # pylint: disable=import-outside-toplevel
  old = dict(os.environ)
  try:
    os.environ.update(env)
    return slurm_cluster.SlurmCluster.get_coordinator_address(None, None)
  finally:
    os.environ.clear()
    os.environ.update(old)


def _exports(stdout: str) -> dict[str, str]:
  out = {}
  for cmd in _commands(stdout):
    if cmd[0] == "export":
      key, _, value = cmd[1].partition("=")
      out[key] = value
  return out


@pytest.mark.parametrize("procid", [0, 7, 8, 15])
def test_run_task_two_nodes_of_eight_gpus(procid, tmp_path, scontrol_bin, trap_bin):
  slurm = _slurm_env(procid)
  env = _env_with_path(scontrol_bin, trap_bin, **slurm)
  proc = _sh(TASK, "--dry-run", "--", "--config=configs/formnet_a2.py:mode=pretrain",
             "--workdir=/shared/runs/x", env=env)
  exports = _exports(proc.stdout)
  assert exports == {
      "JAX_COORDINATOR_ADDRESS": f"gpu-node017:{61440 + 4242 % 4096}",
      "JAX_NUM_PROCESSES": "16",
      "JAX_PROCESS_ID": str(procid),
      "JAX_LOCAL_DEVICE_IDS": str(procid % 8),
  }
  # The same host and port as jax.distributed.initialize() would derive itself.
  assert exports["JAX_COORDINATOR_ADDRESS"] == _jax_would_pick(slurm)
  assert _commands(proc.stdout)[-1] == [
      "python3", "-m", "flaxdoc.main", "--config=configs/formnet_a2.py:mode=pretrain",
      "--workdir=/shared/runs/x"]
  assert (tmp_path / "scontrol.log").read_text() == "show hostnames gpu-node[017-018]\n"
  assert ("coordinator" in proc.stderr) == (procid == 0)
  _assert_nothing_ran(tmp_path)


def test_run_task_uses_the_step_nodes_and_port_overrides(tmp_path, scontrol_bin):
  env = _env_with_path(scontrol_bin, **_slurm_env(3, SLURM_JOB_NODELIST="a[1-4]",
                                                  SLURM_STEP_NODELIST="a[3-4],b7"))
  got = _exports(_sh(TASK, "--dry-run", env=env).stdout)
  assert got["JAX_COORDINATOR_ADDRESS"] == f"a3:{61440 + 4242 % 4096}"  # jax's default port
  env["FLAXDOC_COORDINATOR_PORT"] = "2222"
  assert _exports(_sh(TASK, "--dry-run", env=env).stdout)["JAX_COORDINATOR_ADDRESS"] == "a3:2222"
  got = _exports(_sh(TASK, "--dry-run", "--port", "12345", env=env).stdout)
  assert got["JAX_COORDINATOR_ADDRESS"] == "a3:12345"
  env["FLAXDOC_COORDINATOR_HOST"] = "login-ib0"
  assert _exports(_sh(TASK, "--dry-run", env=env).stdout)["JAX_COORDINATOR_ADDRESS"] == \
      "login-ib0:2222"
  del env["SLURM_STEP_NODELIST"], env["FLAXDOC_COORDINATOR_HOST"]
  assert _exports(_sh(TASK, "--dry-run", env=env).stdout)["JAX_COORDINATOR_ADDRESS"] == "a1:2222"


@pytest.mark.parametrize("localid, extra, want", [
    (5, {}, "5"),  # sees all 8 GPUs of the node: take the SLURM_LOCALID-th
    (3, {"CUDA_VISIBLE_DEVICES": "3"}, "0"),  # SLURM bound one GPU, renumbered from 0
    (3, {"CUDA_VISIBLE_DEVICES": ""}, "3"),
    (0, {"FLAXDOC_DEVICES_PER_TASK": "8"}, "0,1,2,3,4,5,6,7"),  # one task per node
    (1, {"FLAXDOC_DEVICES_PER_TASK": "4"}, "4,5,6,7"),
    (1, {"FLAXDOC_DEVICES_PER_TASK": "4", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}, "0,1,2,3"),
    (6, {"JAX_LOCAL_DEVICE_IDS": "2"}, "2"),  # the user's choice wins
])
def test_run_task_local_device_ids(localid, extra, want, tmp_path, scontrol_bin):
  env = _env_with_path(scontrol_bin, **{**_slurm_env(8 + localid), **extra})
  assert _exports(_sh(TASK, "--dry-run", env=env).stdout)["JAX_LOCAL_DEVICE_IDS"] == want


@pytest.mark.parametrize("nodelist, want", [
    ("gpu-node[017-018]", "gpu-node017"),
    ("a1,b[1-2]", "a1"),
    ("n[3,5-7]", "n3"),
    ("rack[1-2]-ib", "rack1-ib"),
    ("x[08-09]y,z", "x08y"),
    ("single", "single"),
])
def test_run_task_parses_node_lists_without_scontrol(nodelist, want, tmp_path):
  tools = tmp_path / "tools"  # a PATH without scontrol
  tools.mkdir()
  env = _base_env(PATH=str(tools), **_slurm_env(1, nodes=nodelist))
  proc = _sh(TASK, "--dry-run", env=env)
  host = _exports(proc.stdout)["JAX_COORDINATOR_ADDRESS"].rsplit(":", 1)[0]
  assert host == want and "scontrol not on PATH" in proc.stderr
  if not re.search(r"\][^,]", nodelist):  # JAX's parser drops suffixes after brackets
    assert _jax_would_pick(_slurm_env(1, nodes=nodelist)).rsplit(":", 1)[0] == want


@pytest.mark.parametrize("change, message", [
    ({"SLURM_NTASKS": None}, "SLURM_NTASKS is not set"),
    ({"SLURM_PROCID": "16"}, "SLURM_PROCID=16 but SLURM_NTASKS=16"),
    ({"SLURM_PROCID": "x"}, "not a non-negative integer"),
    ({"SLURM_NTASKS": "0"}, "positive"),
    ({"SLURM_STEP_NODELIST": None, "SLURM_JOB_NODELIST": None}, "NODELIST"),
    ({"FLAXDOC_COORDINATOR_PORT": "70000"}, "1..65535"),
    ({"FLAXDOC_DEVICES_PER_TASK": "0"}, "FLAXDOC_DEVICES_PER_TASK"),
    ({"SLURM_LOCALID": None}, "SLURM_LOCALID is not set"),
    ({"SLURM_STEP_NODELIST": "r[1-2]n[3-4]", "PATH": "/nonexistent"}, "FLAXDOC_COORDINATOR_HOST"),
    ({"DRY_RUN": "yes"}, "DRY_RUN must be 0 or 1"),
])
def test_run_task_errors(change, message, tmp_path, scontrol_bin, trap_bin):
  env = _env_with_path(scontrol_bin, trap_bin, **_slurm_env(2))
  for key, value in change.items():
    if value is None:
      env.pop(key)
    else:
      env[key] = value
  proc = _sh(TASK, "--dry-run", "--", "--config=c.py", env=env, ok=False)
  assert proc.returncode == 2 and message in proc.stderr, proc.stderr
  assert not _commands(proc.stdout)
  _assert_nothing_ran(tmp_path)


# --- launch/slurm/flaxdoc.sub --------------------------------------------------------


def test_sub_dry_run_starts_one_srun(tmp_path, trap_bin):
  # sbatch runs a spooled copy from elsewhere: the checkout comes from SLURM_SUBMIT_DIR.
  env = _env_with_path(trap_bin, SLURM_SUBMIT_DIR=str(REPO), SLURM_CPUS_PER_TASK="8",
                       SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="gpu-node[017-018]",
                       SLURM_NTASKS="16", FLAXDOC_VENV="/shared/venvs/flaxdoc")
  main_args = ["--config=configs/formnet_a2.py:mode=pretrain", "--workdir=/shared/runs/x",
               "--config.mesh.shape.data=2", "--config.mesh.shape.fsdp=8"]
  proc = _sh(SUB, "--dry-run", *main_args, env=env, cwd=tmp_path)
  cmds = _commands(proc.stdout)
  assert cmds == [
      ["export", "FLAXDOC_PYTHON=/shared/venvs/flaxdoc/bin/python"],
      ["export", "NCCL_DEBUG=WARN"],
      ["cd", str(REPO)],
      ["srun", "--kill-on-bad-exit=1", "--cpus-per-task=8", "bash", str(TASK), "--", *main_args],
  ]
  _assert_nothing_ran(tmp_path)

  # What srun would then start, as task 9 of 16: the arguments arrive intact.
  srun = cmds[-1]
  task_argv = srun[srun.index("bash") + 1:]
  task = subprocess.run(
      [BASH, task_argv[0], "--dry-run", *task_argv[1:]], cwd=REPO, text=True, capture_output=True,
      env=_env_with_path(trap_bin, FLAXDOC_PYTHON="/shared/venvs/flaxdoc/bin/python",
                         FLAXDOC_COORDINATOR_HOST="gpu-node017", **_slurm_env(9)),
      timeout=60, check=True)
  assert _exports(task.stdout)["JAX_PROCESS_ID"] == "9"
  assert _commands(task.stdout)[-1] == ["/shared/venvs/flaxdoc/bin/python", "-m", "flaxdoc.main",
                                        *main_args]


def test_sub_needs_the_checkout(tmp_path, trap_bin):
  proc = _sh(SUB, "--config=c.py", env=_env_with_path(trap_bin, DRY_RUN="1"), cwd=tmp_path,
             ok=False)
  assert proc.returncode == 2 and "FLAXDOC_ROOT" in proc.stderr
  proc = _sh(SUB, "--config=c.py", env=_env_with_path(trap_bin, DRY_RUN="1",
                                                      FLAXDOC_ROOT=str(REPO)), cwd=tmp_path)
  assert _commands(proc.stdout)[-1][:2] == ["srun", "--kill-on-bad-exit=1"]
  _assert_nothing_ran(tmp_path)


# --- the real thing: two local tasks, one JAX distributed runtime -------------------

PROBE = """
import os, sys
import jax
from jax._src import distributed

if sys.argv[1] == "explicit":
  # What flaxdoc.main would do with the change proposed in launch/README.md.
  jax.distributed.initialize(num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                             process_id=int(os.environ["JAX_PROCESS_ID"]))
else:
  jax.distributed.initialize()  # exactly what flaxdoc.main calls today
print("RESULT", jax.process_index(), jax.process_count(), jax.device_count(),
      distributed.global_state.coordinator_address, flush=True)
jax.distributed.shutdown()
"""


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.parametrize("mode", ["as_main_today",
                                  pytest.param("explicit", marks=pytest.mark.slow)])
def test_run_task_really_starts_jax_distributed(mode, tmp_path):
  """Two tasks on this machine (coordinator 127.0.0.1, CPU) find each other.

  `as_main_today`: full srun environment, bare `jax.distributed.initialize()`.
  `explicit`: only the variables run_task.sh needs (no SLURM_JOB_ID, no step
  node list, so JAX's own SLURM detection is off): the process count and id
  must come from JAX_NUM_PROCESSES / JAX_PROCESS_ID.
  """
  pytest.importorskip("jax")
  probe = tmp_path / "probe.py"
  probe.write_text(PROBE)
  fake = tmp_path / "bin"
  fake.mkdir()
  _write_exe(fake / "scontrol", f"#!{BASH}\necho 127.0.0.1\n")
  port = _free_port()
  procs = []
  for procid in range(2):
    slurm = _slurm_env(procid, nodes="127.0.0.1", ntasks=2, per_node=2, job_id=777)
    slurm.pop("CUDA_VISIBLE_DEVICES")
    if mode == "explicit":
      for key in ("SLURM_JOB_ID", "SLURM_STEP_NODELIST"):
        slurm.pop(key)
    env = _env_with_path(fake, **slurm, JAX_PLATFORMS="cpu", FLAXDOC_COORDINATOR_PORT=str(port),
                         FLAXDOC_ENTRYPOINT=f"{sys.executable} {probe} {mode}")
    procs.append(subprocess.Popen([BASH, str(TASK)], env=env, cwd=tmp_path, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE))
  outputs = []
  try:
    for proc in procs:
      out, err = proc.communicate(timeout=120)
      assert proc.returncode == 0, err
      outputs.append(out)
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
  results = sorted(line.split()[1:] for out in outputs for line in out.splitlines()
                   if line.startswith("RESULT"))
  address = f"127.0.0.1:{port}"
  assert results == [["0", "2", "2", address], ["1", "2", "2", address]]


# --- gcloud's own help agrees with the flags we pass ---------------------------------


@pytest.mark.slow
def test_gcloud_accepts_the_flags(tmp_path, trap_bin):
  gcloud = shutil.which("gcloud")
  if gcloud is None:
    pytest.skip("gcloud is not installed")
  env = _env_with_path(trap_bin)
  runs = [("create", "--accelerator-type", "v4-32", "--spot"), ("copy", "--data-src", "/tmp",
          "--data-dir", "gs://b/d"), ("run", "--config", "c.py", "--workdir", "gs://b/r"),
          ("delete",)]
  cmds = [c for args in runs
          for c in _commands(_sh(POD, args[0], *POD_FLAGS, *args[1:], "--dry-run", env=env).stdout)
          if c[0] == "gcloud"]
  help_env = _base_env(CLOUDSDK_CORE_DISABLE_PROMPTS="1", HOME=str(tmp_path))
  for cmd in cmds:
    group = [w for w in cmd[1:] if not w.startswith("-")][:4 if cmd[1] == "compute" else 2]
    text = subprocess.run([gcloud, *group, "--help"], env=help_env, capture_output=True,
                          text=True, timeout=120, check=False).stdout
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    assert "SYNOPSIS" in text, (group, text[:500])
    for flag in _flags(cmd):
      if flag not in ("--project", "--quiet"):  # gcloud-wide flags
        assert re.search(rf"{re.escape(flag)}\b", text), f"{' '.join(group)} has no {flag}"


@pytest.mark.parametrize("env, want", [
    ({}, False),
    ({"SLURM_NTASKS": "1"}, False),
    ({"SLURM_NTASKS": "4"}, True),
    ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}, True),
    ({"TPU_WORKER_HOSTNAMES": "host0"}, False),
    ({"TPU_WORKER_HOSTNAMES": "host0,host1"}, True),
    ({"TPU_PROCESS_ADDRESSES": "10.0.0.1:8476"}, False),
    ({"TPU_PROCESS_ADDRESSES": "10.0.0.1:8476,10.0.0.2:8476"}, True),
])
def test_main_initialises_the_distributed_runtime_where_the_environment_says(env, want):
  """What each launcher's environment makes `flaxdoc.main` do, and --multihost overriding it."""
  from flaxdoc.main import wants_distributed  # pylint: disable=import-outside-toplevel
  assert wants_distributed(None, env) is want
  assert wants_distributed(True, env) is True and wants_distributed(False, env) is False
