#!/usr/bin/env bash
# One task of a multi-process flaxdoc job under SLURM: tell JAX's distributed
# runtime who it is, then exec the trainer.
#
#   srun bash launch/slurm/run_task.sh [--dry-run] [--port PORT] -- \
#       --config=configs/x.py --workdir=DIR
#
# launch/slurm/flaxdoc.sub starts one of these per GPU. Each task derives, from
# what srun puts in its environment:
#
#   JAX_COORDINATOR_ADDRESS  first host of the step's node list (`scontrol show
#                            hostnames`; task 0 runs there and hosts the
#                            coordinator) + ":" + port
#   JAX_NUM_PROCESSES        SLURM_NTASKS
#   JAX_PROCESS_ID           SLURM_PROCID
#   JAX_LOCAL_DEVICE_IDS     the GPU(s) this task drives: SLURM_LOCALID, or 0 when
#                            SLURM already narrowed CUDA_VISIBLE_DEVICES to this task
#
# and then execs `python -m flaxdoc.main "$@"`, whose jax.distributed.initialize()
# reads them (JAX reads JAX_COORDINATOR_ADDRESS and JAX_LOCAL_DEVICE_IDS itself;
# the process count and id it takes from the same SLURM variables).
#
# Environment knobs:
#   FLAXDOC_COORDINATOR_PORT  port (default: the one JAX itself would pick for
#                             this job, 61440 + SLURM_JOB_ID % 4096; --port wins)
#   FLAXDOC_COORDINATOR_HOST  host, instead of the first node of the step
#   FLAXDOC_DEVICES_PER_TASK  GPUs per task (default 1; 8 for one task per 8-GPU node)
#   FLAXDOC_PYTHON            interpreter for the default entry point (default python3)
#   FLAXDOC_ENTRYPOINT        command to run instead of `$FLAXDOC_PYTHON -m flaxdoc.main`
#                             (whitespace-separated words, no shell syntax), e.g. a
#                             probe script that only checks the wiring
#   DRY_RUN=1                 same as --dry-run: print the exports and the command

set -euo pipefail

usage() {
  cat <<'EOF'
Usage: srun bash launch/slurm/run_task.sh [--dry-run] [--port PORT] [--] [MAIN_ARGS...]
MAIN_ARGS go to `python -m flaxdoc.main` (or to $FLAXDOC_ENTRYPOINT).
EOF
}

die() {
  echo "run_task.sh: error: $*" >&2
  exit 2
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

# Exports NAME=VALUE, or prints the export under --dry-run.
export_var() {
  if [[ "${DRY_RUN}" == 1 ]]; then
    printf '+ export %s\n' "$(shell_quote "$1=$2")"
  fi
  export "$1=$2"
}

is_uint() {
  [[ "$1" =~ ^[0-9]+$ ]]
}

require_uint() {
  local name="$1" value="${!1:-}"
  [[ -n "${value}" ]] || die "${name} is not set: run this under srun" \
    "(see launch/slurm/flaxdoc.sub)"
  is_uint "${value}" || die "${name}='${value}' is not a non-negative integer"
}

# First host of a SLURM node list such as "gpu-[017-018,020],cpu1" without
# scontrol (login containers and tests lack it): prefix + first number + suffix.
first_host_without_scontrol() {
  local list="$1"
  if [[ "${list}" =~ ^([^],[]*)\[([^]]*)\]([^],[]*)(,|$) ]]; then
    local inside="${BASH_REMATCH[2]}"
    echo "${BASH_REMATCH[1]}${inside%%[,-]*}${BASH_REMATCH[3]}"
  elif [[ "${list}" =~ ^([^],[]+)(,|$) ]]; then
    echo "${BASH_REMATCH[1]}"
  else
    die "cannot read the first host of '${list}' without scontrol; set FLAXDOC_COORDINATOR_HOST"
  fi
}

first_host() {
  local list="$1" hosts
  if command -v scontrol >/dev/null 2>&1; then
    hosts="$(scontrol show hostnames "${list}")" \
      || die "scontrol show hostnames '${list}' failed"
    [[ -n "${hosts}" ]] || die "scontrol show hostnames '${list}' printed nothing"
    echo "${hosts%%$'\n'*}"
  else
    echo "run_task.sh: scontrol not on PATH; parsing '${list}' myself" >&2
    first_host_without_scontrol "${list}"
  fi
}

# --- flags -------------------------------------------------------------------

DRY_RUN="${DRY_RUN:-0}"
[[ "${DRY_RUN}" == 1 || "${DRY_RUN}" == 0 ]] || die "DRY_RUN must be 0 or 1, not '${DRY_RUN}'"
port="${FLAXDOC_COORDINATOR_PORT:-}"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --port) [[ $# -ge 2 ]] || die "--port needs a value"; port="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *) break ;;  # flaxdoc.main's arguments
  esac
done

# --- who am I ------------------------------------------------------------------

require_uint SLURM_NTASKS
require_uint SLURM_PROCID
num_processes="${SLURM_NTASKS}"
process_id="${SLURM_PROCID}"
((num_processes > 0)) || die "SLURM_NTASKS must be positive"
((process_id < num_processes)) || die "SLURM_PROCID=${process_id} but SLURM_NTASKS=${num_processes}"

# The step's node list (where srun put the tasks, task 0 on the first node) is
# what matters; the job's is the fallback for running outside a step.
nodelist="${SLURM_STEP_NODELIST:-${SLURM_JOB_NODELIST:-}}"
host="${FLAXDOC_COORDINATOR_HOST:-}"
if [[ -z "${host}" ]]; then
  [[ -n "${nodelist}" ]] || die "neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set"
  host="$(first_host "${nodelist}")"
fi

if [[ -z "${port}" ]]; then
  # The same default as jax's own SLURM detection, so both sides agree.
  if is_uint "${SLURM_JOB_ID:-}"; then
    port=$((61440 + SLURM_JOB_ID % 4096))
  else
    port=61440
  fi
fi
if ! is_uint "${port}" || ((port < 1 || port > 65535)); then
  die "port '${port}' is not in 1..65535"
fi

# Which local GPUs this task drives. Default: one per task, chosen by SLURM_LOCALID
# among the GPUs the node shows us; but if SLURM already bound exactly our share
# (--gpus-per-task, --gpu-bind), CUDA renumbers them from 0.
devices_per_task="${FLAXDOC_DEVICES_PER_TASK:-1}"
if ! is_uint "${devices_per_task}" || ((devices_per_task < 1)); then
  die "FLAXDOC_DEVICES_PER_TASK='${devices_per_task}' is not a positive integer"
fi
local_device_ids="${JAX_LOCAL_DEVICE_IDS:-}"
if [[ -z "${local_device_ids}" ]]; then
  visible=()
  if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    IFS=, read -r -a visible <<<"${CUDA_VISIBLE_DEVICES}"
  fi
  if ((${#visible[@]} == devices_per_task)); then
    first=0
  else
    require_uint SLURM_LOCALID
    first=$((SLURM_LOCALID * devices_per_task))
  fi
  ids=()
  for ((i = first; i < first + devices_per_task; i++)); do
    ids+=("${i}")
  done
  local_device_ids="$(IFS=,; echo "${ids[*]}")"
fi

export_var JAX_COORDINATOR_ADDRESS "${host}:${port}"
export_var JAX_NUM_PROCESSES "${num_processes}"
export_var JAX_PROCESS_ID "${process_id}"
export_var JAX_LOCAL_DEVICE_IDS "${local_device_ids}"

if [[ -n "${FLAXDOC_ENTRYPOINT:-}" ]]; then
  read -r -a entrypoint <<<"${FLAXDOC_ENTRYPOINT}"
  [[ ${#entrypoint[@]} -gt 0 ]] || die "FLAXDOC_ENTRYPOINT is blank"
else
  entrypoint=("${FLAXDOC_PYTHON:-python3}" -m flaxdoc.main)
fi

if ((process_id == 0)); then
  echo "run_task.sh: ${num_processes} processes, coordinator ${host}:${port}" >&2
fi
if [[ "${DRY_RUN}" == 1 ]]; then
  printf '+ %s\n' "$(shell_quote "${entrypoint[@]}" "$@")"
else
  exec "${entrypoint[@]}" "$@"
fi
