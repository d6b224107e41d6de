#!/usr/bin/env bash
# Runs flaxdoc on one TPU VM worker: create or reuse a virtualenv with jax[tpu]
# and flaxdoc installed, then start `python -m flaxdoc.main` from the repository root.
#
#   bash launch/tpu/setup_and_run.sh [FLAGS] -- \
#       --config=configs/x.py --workdir=gs://b/run --multihost
#
# launch/tpu/pod.sh runs this on every worker of a pod at once (`--worker=all`);
# it also works on a single-host TPU VM (leave out --multihost there).
#
# Idempotent: the venv (default ~/flaxdoc_venv, outside the code folder so that
# re-copying the code keeps it) is created once; packages are (re)installed only
# when pyproject.toml or the jax spec changed since the last install, which is
# recorded in a stamp file inside the venv. gcsfs comes along, for gs:// workdirs.
# The project is installed editable, so a fresh copy of the code needs no reinstall.
#
# flaxdoc needs Python >= 3.11 (jax and flax dropped 3.10). The Ubuntu 22.04 TPU
# images ship 3.10, so when no python3.X >= 3.11 with venv support is on PATH,
# python3.11 and python3.11-venv are installed with apt (use --no-apt to refuse
# and --python to choose an interpreter yourself).
#
# --dry-run (or DRY_RUN=1) prints every command, prefixed with "+ ", and changes
# nothing (it still looks at which interpreters exist and at the stamp file).
# FLAXDOC_ENTRYPOINT replaces `python -m flaxdoc.main` (whitespace-separated words,
# the venv's bin first on PATH), e.g. FLAXDOC_ENTRYPOINT="python my_probe.py".

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readonly ROOT
readonly STAMP_NAME=".flaxdoc-install-stamp"
# A gs:// workdir is read and written through etils.epath, whose Google Storage backend
# is gcsfs (or TensorFlow, which flaxdoc does not install); Orbax needs no more.
readonly EXTRA_PACKAGES=(gcsfs)

usage() {
  cat <<'EOF'
Usage: launch/tpu/setup_and_run.sh [FLAGS] [--] [MAIN_ARGS...]

  --venv DIR         virtualenv to create or reuse        (default: $FLAXDOC_VENV or ~/flaxdoc_venv)
  --python BIN       interpreter for a new venv (>= 3.11)  (default: newest python3.X on PATH)
  --jax-spec SPEC    what pip installs for JAX             (default: jax[tpu])
  --reinstall        delete the venv and build it again
  --setup-only       install, then exit without running flaxdoc.main
  --no-apt           never apt-get install a Python
  --dry-run          print the commands, run nothing       (or DRY_RUN=1)

MAIN_ARGS go to `python -m flaxdoc.main` (or to $FLAXDOC_ENTRYPOINT).
EOF
}

die() {
  echo "setup_and_run.sh: error: $*" >&2
  exit 2
}

note() {
  echo "setup_and_run.sh: $*" >&2
}

# Quotes like Python's shlex.quote, for --dry-run output that pastes into a shell.
shell_quote() {
  local out=() arg
  for arg in "$@"; do
    if [[ "${arg}" =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
      out+=("${arg}")
    else
      out+=("'${arg//\'/\'\\\'\'}'")
    fi
  done
  printf '%s\n' "${out[*]}"
}

run() {
  if [[ "${DRY_RUN}" == 1 ]]; then
    printf '+ %s\n' "$(shell_quote "$@")"
  else
    "$@"
  fi
}

# True when `$1` runs Python >= 3.11 and can create venvs (Debian and Ubuntu
# move ensurepip into the separate python3.X-venv package).
python_ok() {
  "$1" -c 'import sys, ensurepip; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1
}

# Sets `base_python` to the interpreter for a new venv: --python, else the newest
# suitable python3.X on PATH, else (unless --no-apt) python3.11 from apt.
choose_python() {
  if [[ -n "${python}" ]]; then
    python_ok "${python}" || die "--python '${python}' is not Python >= 3.11 with the venv module"
    base_python="${python}"
    return 0
  fi
  local candidate
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "${candidate}" >/dev/null 2>&1 && python_ok "${candidate}"; then
      base_python="${candidate}"
      return 0
    fi
  done
  [[ "${no_apt}" == 0 ]] || die "no Python >= 3.11 with the venv module on PATH (--no-apt given);" \
    "install one or pass --python"
  note "no Python >= 3.11 with the venv module on PATH: installing python3.11 with apt"
  local sudo=()
  if [[ "$(id -u)" != 0 ]]; then
    sudo=(sudo)
  fi
  run "${sudo[@]}" apt-get update -q
  run "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3.11 \
    python3.11-venv
  base_python=python3.11
}

# Identifies what is installed: a change to any of these means pip must run again.
install_stamp() {
  {
    printf 'jax_spec=%s\n' "${jax_spec}"
    printf 'extra=%s\n' "${EXTRA_PACKAGES[*]}"
    cat "${ROOT}/pyproject.toml"
  } | sha256sum | cut -d' ' -f1
}

# --- flags -------------------------------------------------------------------

DRY_RUN="${DRY_RUN:-0}"
[[ "${DRY_RUN}" == 1 || "${DRY_RUN}" == 0 ]] || die "DRY_RUN must be 0 or 1, not '${DRY_RUN}'"
venv="${FLAXDOC_VENV:-${HOME}/flaxdoc_venv}"
python=""
jax_spec="jax[tpu]"
reinstall=0
setup_only=0
no_apt=0

need_value() {
  [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --venv) need_value "$@"; venv="$2"; shift 2 ;;
    --python) need_value "$@"; python="$2"; shift 2 ;;
    --jax-spec) need_value "$@"; jax_spec="$2"; shift 2 ;;
    --reinstall) reinstall=1; shift ;;
    --setup-only) setup_only=1; shift ;;
    --no-apt) no_apt=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    -*) die "unknown flag '$1' (flaxdoc.main's own flags go after --)" ;;
    *) break ;;
  esac
done

[[ -f "${ROOT}/pyproject.toml" ]] || die "no pyproject.toml in ${ROOT}: is this a flaxdoc checkout?"
venv_python="${venv}/bin/python"

# --- the venv ------------------------------------------------------------------

if [[ "${reinstall}" == 1 && -e "${venv}" ]]; then
  run rm -rf "${venv}"
fi
if [[ "${reinstall}" == 1 || ! -x "${venv_python}" ]]; then
  base_python=""
  choose_python
  note "creating ${venv} with ${base_python}"
  run "${base_python}" -m venv "${venv}"
fi

want_stamp="$(install_stamp)"
have_stamp=""
if [[ "${reinstall}" == 0 && -f "${venv}/${STAMP_NAME}" ]]; then
  have_stamp="$(<"${venv}/${STAMP_NAME}")"
fi
if [[ "${have_stamp}" != "${want_stamp}" ]]; then
  note "installing ${jax_spec}, ${EXTRA_PACKAGES[*]} and flaxdoc (editable) into ${venv}"
  run "${venv_python}" -m pip install --quiet --upgrade pip
  # One resolver run for all, so the project's pins cannot swap out the jax
  # that matches libtpu.
  run "${venv_python}" -m pip install --quiet "${jax_spec}" "${EXTRA_PACKAGES[@]}" -e "${ROOT}"
  if [[ "${DRY_RUN}" == 1 ]]; then
    printf '+ %s > %s\n' "$(shell_quote echo "${want_stamp}")" \
      "$(shell_quote "${venv}/${STAMP_NAME}")"
  else
    echo "${want_stamp}" >"${venv}/${STAMP_NAME}"
  fi
else
  note "reusing ${venv} (packages up to date)"
fi

if [[ "${setup_only}" == 1 ]]; then
  exit 0
fi

# --- run -----------------------------------------------------------------------

if [[ -n "${FLAXDOC_ENTRYPOINT:-}" ]]; then
  read -r -a entrypoint <<<"${FLAXDOC_ENTRYPOINT}"
else
  entrypoint=("${venv_python}" -m flaxdoc.main)
fi
[[ ${#entrypoint[@]} -gt 0 ]] || die "FLAXDOC_ENTRYPOINT is blank"

# Relative config paths (configs/x.py) are relative to the repository root.
run cd "${ROOT}"
# The venv's bin first on PATH, as `activate` would, so that an entry point
# override saying `python` gets the venv's.
if [[ "${DRY_RUN}" == 1 ]]; then
  printf "+ export PATH=%s:\"\$PATH\"\n" "$(shell_quote "${venv}/bin")"
  run "${entrypoint[@]}" "$@"
else
  export PATH="${venv}/bin:${PATH}"
  export VIRTUAL_ENV="${venv}"
  exec "${entrypoint[@]}" "$@"
fi
