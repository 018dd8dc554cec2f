#!/usr/bin/env bash
# Local multi-process training with one run directory for the whole run, restarts and auto-resume.
#   launch/torchrun_local.sh NPROC [RUN_DIR] -- [hydra overrides...]
# The run directory is computed once here (runs/<timestamp> unless given) and passed to every rank,
# so restarted ranks (torchrun --max-restarts) and later runs resume from its newest committed
# checkpoint (resume=true). SIGUSR1/SIGTERM/SIGINT to this script stop all ranks at one step with a
# checkpoint.
# Env:
#   MAX_RESTARTS   worker-group restarts after a rank fails (default 3; 0: fail at once, naming the rank)
#   NNODES         1 (default: --standalone) or N / MIN:MAX for a multi-node c10d rendezvous; then also
#   RDZV_ENDPOINT  host:port of the rendezvous (the same on every node), RDZV_ID (a job id, default
#                  the run directory's name)
#   TORCHRUN_ARGS  extra torchrun flags (e.g. "--monitor-interval=1")
set -euo pipefail
nproc="${1:?usage: $0 NPROC [RUN_DIR] -- [overrides...]}"; shift
run_dir="runs/$(date +%Y%m%d-%H%M%S)"
if [ $# -gt 0 ] && [ "$1" != "--" ]; then run_dir="$1"; shift; fi
[ "${1:-}" = "--" ] && shift
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
distnerf_setup
nnodes="${NNODES:-1}"
if [ "$nnodes" = 1 ]; then
  rdzv=(--standalone)
else
  rdzv=(--nnodes="$nnodes" --rdzv_backend=c10d --rdzv_endpoint="${RDZV_ENDPOINT:?NNODES=$nnodes needs RDZV_ENDPOINT=host:port}"
        --rdzv_id="${RDZV_ID:-$(basename "$run_dir")}")
fi
echo "run_dir=$run_dir"
distnerf_flight_recorder "$run_dir"
# shellcheck disable=SC2086
distnerf_run python -m torch.distributed.run "${rdzv[@]}" --nproc_per_node="$nproc" \
  --max-restarts="${MAX_RESTARTS:-3}" ${TORCHRUN_ARGS:-} \
  -m distnerf.train run_dir="$run_dir" resume=true "$@"
exit "$DISTNERF_RC"
