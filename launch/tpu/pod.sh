#!/usr/bin/env bash
# Cloud TPU VM pod slices for flaxdoc: create, copy, run, delete.
#
# The documented gcloud recipe for JAX on pods (one VM per TPU host, the same
# command started on every host with `--worker=all`) as four subcommands:
#
#   launch/tpu/pod.sh create --name my-pod --zone us-central2-b --accelerator-type v4-32
#   launch/tpu/pod.sh copy   --name my-pod --zone us-central2-b \
#       [--data-src ~/datasets/funsd --data-dir gs://my-bucket/datasets/funsd]
#   launch/tpu/pod.sh run    --name my-pod --zone us-central2-b \
#       --config configs/formnet_a2.py:dataset=funsd \
#       --workdir gs://my-bucket/runs/formnet-v4-32 --data-dir gs://my-bucket/datasets/funsd \
#       -- --config.mesh.shape.data=-1 --config.batch_size=16
#   launch/tpu/pod.sh delete --name my-pod --zone us-central2-b
#
# Code is copied to every worker (each host is its own VM with its own disk).
# The workdir lives on GCS, the one file system all workers see. Data are kept on
# GCS too, but flaxdoc's dataset readers read local files, so `run --data-dir`
# first syncs the folder to ~/flaxdoc_data/NAME on every worker. `run` then executes
# launch/tpu/setup_and_run.sh on every worker, which creates or reuses a virtualenv,
# installs jax[tpu] and flaxdoc, and starts `python -m flaxdoc.main --multihost ...`.
#
# Every subcommand accepts --dry-run (or DRY_RUN=1): print each command, prefixed
# with "+ " and quoted so it can be pasted into a shell, and run nothing.
# Defaults for the common flags can come from the environment:
# FLAXDOC_TPU_NAME, FLAXDOC_TPU_ZONE, FLAXDOC_TPU_PROJECT, FLAXDOC_TPU_TYPE.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readonly ROOT
readonly SRC_ARCHIVE="flaxdoc-src.tar.gz"  # name of the code archive on the workers
readonly DATA_CACHE="flaxdoc_data"  # run --data-dir's local copies, in the workers' $HOME

usage() {
  cat <<'EOF'
Usage: launch/tpu/pod.sh SUBCOMMAND [FLAGS] [-- MAIN_ARGS...]

Subcommands:
  create   gcloud compute tpus tpu-vm create (needs --accelerator-type)
  copy     pack the working tree, scp it to every worker, unpack it in --remote-dir;
           with --data-src, also rsync a local dataset folder to --data-dir on GCS
  run      on every worker: sync --data-dir, launch/tpu/setup_and_run.sh, then
           flaxdoc.main --multihost (needs --config and a gs:// --workdir); MAIN_ARGS go to
           flaxdoc.main
  delete   gcloud compute tpus tpu-vm delete

Flags (all subcommands):
  --name NAME               TPU name                      [$FLAXDOC_TPU_NAME]
  --zone ZONE               e.g. us-central2-b            [$FLAXDOC_TPU_ZONE]
  --project PROJECT         GCP project (default: gcloud's) [$FLAXDOC_TPU_PROJECT]
  --dry-run                 print the commands, run nothing [DRY_RUN=1]
create:
  --accelerator-type TYPE   v4-32, v5litepod-64 (alias v5e-64), v5p-128, v6e-64, ...
                                                          [$FLAXDOC_TPU_TYPE]
  --version VERSION         TPU runtime (default: the one for TYPE's generation)
  --spot | --preemptible    cheaper, may be reclaimed
copy / run:
  --remote-dir DIR          code folder on the workers, relative to $HOME (default: flaxdoc)
copy:
  --data-src DIR            local dataset folder to upload ...
  --data-dir gs://...       ... to this GCS folder (gcloud storage rsync)
run:
  --config PATH[:ARG]       the config file, relative to the repository root
  --workdir gs://...        checkpoints and metrics (must be on GCS)
  --data-dir gs://...       synced to ~/flaxdoc_data/NAME on each worker (NAME: its last
                            component), which is passed as --config.data.data_dir
  --venv DIR                virtualenv on the workers (default: ~/flaxdoc_venv)
  --detach                  return at once: sync, setup and run go on under nohup,
                            logging to ~/flaxdoc-run.log on each worker
delete:
  --yes                     do not ask for confirmation (gcloud --quiet)
EOF
}

die() {
  echo "pod.sh: error: $*" >&2
  exit 2
}

note() {
  echo "pod.sh: $*" >&2
}

# Quotes its arguments like Python's shlex.quote: safe words as they are,
# anything else in single quotes. Used both for --dry-run output and to build the
# --command string that gcloud runs through the workers' shells.
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

# Runs a command, or prints it under --dry-run.
run() {
  if [[ "${DRY_RUN}" == 1 ]]; then
    printf '+ %s\n' "$(shell_quote "$@")"
  else
    "$@"
  fi
}

# The runtime image for an accelerator type (Cloud TPU docs, "TPU software versions").
default_version() {
  case "$1" in
    v2-* | v3-* | v4-*) echo "tpu-ubuntu2204-base" ;;
    v5litepod-*) echo "v2-alpha-tpuv5-lite" ;;
    v5p-*) echo "v2-alpha-tpuv5" ;;
    v6e-*) echo "v2-alpha-tpuv6e" ;;
    *) die "no default --version for accelerator type '$1'; pass --version" ;;
  esac
}

# "v4-32 = 16 chips on 4 workers, 16 JAX devices": what the mesh shape must multiply to.
# v2/v3/v4/v5p count TensorCores in the name (2 per chip); v4 and v5p fuse them into
# one JAX device per chip (megacore), v2/v3 expose both. v5e/v6e count chips.
describe_slice() {
  local type="$1" gen="${1%%-*}" n="${1##*-}" chips devices workers
  [[ "${n}" =~ ^[0-9]+$ ]] || return 0
  case "${gen}" in
    v2 | v3) chips=$((n / 2)); devices=${n}; workers=$(((chips + 3) / 4)) ;;
    v4 | v5p) chips=$((n / 2)); devices=${chips}; workers=$(((chips + 3) / 4)) ;;
    v5litepod | v6e)
      chips=${n}; devices=${n}
      if ((n <= 8)); then workers=1; else workers=$((n / 4)); fi ;;
    *) return 0 ;;
  esac
  note "${type} = ${chips} chips on ${workers} workers, ${devices} JAX devices" \
    "(the product of --config.mesh.shape.*)"
}

# A git checkout, including a `git worktree` or a submodule, where .git is a file.
in_git_checkout() {
  [[ -e "${ROOT}/.git" ]] && command -v git >/dev/null 2>&1
}

# Packs the repository's tracked and untracked-but-not-ignored files (what
# `git status` would show: no .venv, no caches) into a tar.gz.
make_source_archive() {
  local archive="$1"
  if [[ "${DRY_RUN}" == 1 ]]; then
    if in_git_checkout; then
      printf '+ %s | %s\n' \
        "$(shell_quote git -C "${ROOT}" ls-files -z --cached --others --exclude-standard)" \
        "$(shell_quote tar -C "${ROOT}" --null --files-from=- --ignore-failed-read \
          -czf "${archive}")"
    else
      printf '+ %s\n' "$(shell_quote tar -C "${ROOT}" --exclude-vcs --exclude='./.venv*' \
        --exclude=__pycache__ -czf "${archive}" .)"
    fi
    return 0
  fi
  if in_git_checkout; then
    # --ignore-failed-read: files deleted in the working tree but still in the index.
    git -C "${ROOT}" ls-files -z --cached --others --exclude-standard \
      | tar -C "${ROOT}" --null --files-from=- --ignore-failed-read -czf "${archive}"
  else
    tar -C "${ROOT}" --exclude-vcs --exclude='./.venv*' --exclude=__pycache__ -czf "${archive}" .
  fi
}

# --- flags -------------------------------------------------------------------

DRY_RUN="${DRY_RUN:-0}"
[[ "${DRY_RUN}" == 1 || "${DRY_RUN}" == 0 ]] || die "DRY_RUN must be 0 or 1, not '${DRY_RUN}'"

if [[ "${1:-}" == --dry-run ]]; then  # also accepted before the subcommand
  DRY_RUN=1
  shift
fi
if [[ $# -eq 0 ]]; then
  usage >&2
  exit 2
fi
subcommand="$1"
shift
case "${subcommand}" in
  create | copy | run | delete) ;;
  -h | --help | help) usage; exit 0 ;;
  *) usage >&2; die "unknown subcommand '${subcommand}'" ;;
esac

name="${FLAXDOC_TPU_NAME:-}"
zone="${FLAXDOC_TPU_ZONE:-}"
project="${FLAXDOC_TPU_PROJECT:-}"
accelerator_type="${FLAXDOC_TPU_TYPE:-}"
version=""
capacity=""
remote_dir="flaxdoc"
data_src=""
data_dir=""
config=""
workdir=""
venv=""
detach=0
yes=0
main_args=()

need_value() {
  [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) need_value "$@"; name="$2"; shift 2 ;;
    --zone) need_value "$@"; zone="$2"; shift 2 ;;
    --project) need_value "$@"; project="$2"; shift 2 ;;
    --accelerator-type) need_value "$@"; accelerator_type="$2"; shift 2 ;;
    --version) need_value "$@"; version="$2"; shift 2 ;;
    --spot) capacity="--spot"; shift ;;
    --preemptible) capacity="--preemptible"; shift ;;
    --remote-dir) need_value "$@"; remote_dir="$2"; shift 2 ;;
    --data-src) need_value "$@"; data_src="$2"; shift 2 ;;
    --data-dir) need_value "$@"; data_dir="$2"; shift 2 ;;
    --config) need_value "$@"; config="$2"; shift 2 ;;
    --workdir) need_value "$@"; workdir="$2"; shift 2 ;;
    --venv) need_value "$@"; venv="$2"; shift 2 ;;
    --detach) detach=1; shift ;;
    --yes) yes=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; main_args=("$@"); break ;;
    *) die "unknown flag '$1' for '${subcommand}' (flaxdoc.main's own flags go after --)" ;;
  esac
done

[[ -n "${name}" ]] || die "--name is required (or set FLAXDOC_TPU_NAME)"
[[ -n "${zone}" ]] || die "--zone is required (or set FLAXDOC_TPU_ZONE)"
if [[ ${#main_args[@]} -gt 0 && "${subcommand}" != run ]]; then
  die "arguments after -- are for 'run' only"
fi

# Flags every gcloud call shares.
common=("--zone=${zone}")
if [[ -n "${project}" ]]; then
  common+=("--project=${project}")
fi

# --- subcommands ---------------------------------------------------------------

cmd_create() {
  [[ -n "${accelerator_type}" ]] || die "create needs --accelerator-type (or FLAXDOC_TPU_TYPE)"
  # gcloud's names are v5litepod-N; the v5e-N spelling is what people say.
  if [[ "${accelerator_type}" == v5e-* ]]; then
    accelerator_type="v5litepod-${accelerator_type#v5e-}"
  fi
  if [[ -z "${version}" ]]; then
    version="$(default_version "${accelerator_type}")"
  fi
  describe_slice "${accelerator_type}"
  local args=(gcloud compute tpus tpu-vm create "${name}" "${common[@]}"
              "--accelerator-type=${accelerator_type}" "--version=${version}")
  if [[ -n "${capacity}" ]]; then
    args+=("${capacity}")
  fi
  run "${args[@]}"
}

cmd_copy() {
  if [[ -n "${data_src}" || -n "${data_dir}" ]]; then
    [[ -n "${data_src}" && -n "${data_dir}" ]] || die "--data-src and --data-dir go together"
    [[ "${data_dir}" == gs://* ]] || die "--data-dir must be a gs:// folder, not '${data_dir}'"
    [[ "${DRY_RUN}" == 1 || -d "${data_src}" ]] || die "--data-src '${data_src}' is not a folder"
  fi
  local archive="${TMPDIR:-/tmp}/flaxdoc-src-${name}.tar.gz"
  if [[ "${DRY_RUN}" != 1 ]]; then
    # Removed however the upload ends (a global: the trap runs after this function).
    archive_to_remove="${archive}"
    trap 'rm -f -- "${archive_to_remove}"' EXIT
  fi
  make_source_archive "${archive}"
  run gcloud compute tpus tpu-vm scp "${archive}" "${name}:${SRC_ARCHIVE}" "${common[@]}" \
    --worker=all
  # Unpacks over the old copy (the venv lives outside it, so it survives).
  local remote
  remote="$(shell_quote mkdir -p "${remote_dir}") && $(shell_quote tar -xzf "${SRC_ARCHIVE}" \
    -C "${remote_dir}") && $(shell_quote rm -f "${SRC_ARCHIVE}")"
  run gcloud compute tpus tpu-vm ssh "${name}" "${common[@]}" --worker=all "--command=${remote}"
  if [[ -n "${data_src}" ]]; then
    run gcloud storage rsync --recursive "${data_src}" "${data_dir}"
  fi
}

cmd_run() {
  [[ -n "${config}" ]] || die "run needs --config (e.g. configs/formnet_a2.py:mode=pretrain)"
  [[ -n "${workdir}" ]] || die "run needs --workdir gs://BUCKET/PATH"
  # Every worker writes checkpoints (Orbax writes shards from all hosts): a local
  # path would scatter them over 4..64 disks, so only GCS makes sense here.
  [[ "${workdir}" == gs://* ]] || die "--workdir must be on GCS (gs://...), not '${workdir}'"
  if [[ -n "${data_dir}" && "${data_dir}" != gs://* ]]; then
    die "--data-dir must be on GCS (gs://...), not '${data_dir}'"
  fi
  local setup=(bash launch/tpu/setup_and_run.sh)
  if [[ -n "${venv}" ]]; then
    setup+=(--venv "${venv}")
  fi
  # --multihost: JAX then finds the pod's workers through the TPU metadata server.
  local main=("--config=${config}" "--workdir=${workdir}" --multihost)
  # The text the workers' shells run: paths in it are relative to the home folder.
  local remote="" launch
  launch="$(shell_quote "${setup[@]}" -- "${main[@]}")"
  if [[ -n "${data_dir}" ]]; then
    # flaxdoc's dataset readers read local files only, so every worker first syncs
    # its own copy of the GCS folder (incremental: a rerun copies only what changed).
    local folder="${data_dir%/}"
    local copy="${DATA_CACHE}/${folder##*/}"
    remote="$(shell_quote mkdir -p "${copy}") && $(shell_quote gcloud storage rsync \
      --recursive "${data_dir}" "${copy}") && "
    # "$HOME" is left for the worker's shell to expand.
    launch+=" --config.data.data_dir=\"\$HOME\"/$(shell_quote "${copy}")"
  fi
  if [[ ${#main_args[@]} -gt 0 ]]; then
    launch+=" $(shell_quote "${main_args[@]}")"
  fi
  remote+="cd $(shell_quote "${remote_dir}") && ${launch}"
  if [[ "${detach}" == 1 ]]; then
    # One nohup'd shell for the whole line: it outlives the ssh session and holds none
    # of its output open, so gcloud returns at once. The log name is literal text for
    # the worker's shell, where ~ expands.
    remote="nohup bash -c $(shell_quote "${remote}") > ~/flaxdoc-run.log 2>&1 < /dev/null &"
  fi
  run gcloud compute tpus tpu-vm ssh "${name}" "${common[@]}" --worker=all "--command=${remote}"
}

cmd_delete() {
  local args=(gcloud compute tpus tpu-vm delete "${name}" "${common[@]}")
  if [[ "${yes}" == 1 ]]; then
    args+=(--quiet)
  fi
  run "${args[@]}"
}

"cmd_${subcommand}"
