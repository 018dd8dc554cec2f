#!/usr/bin/env bash
# Local multi-process training with one run directory for the whole run.
#   launch/torchrun_local.sh NPROC [RUN_DIR] -- [hydra overrides...]
# The run directory is computed once here (runs/<timestamp> unless given) and passed
# to every rank, so restarts (--max-restarts) and later `resume=true` find it again.
set -euo pipefail
nproc="${1:?usage: $0 NPROC [RUN_DIR] -- [overrides...]}"; shift
run_dir="runs/$(date +%Y%m%d-%H%M%S)"
if [ $# -gt 0 ] && [ "$1" != "--" ]; then run_dir="$1"; shift; fi
[ "${1:-}" = "--" ] && shift
echo "run_dir=$run_dir"
exec torchrun --standalone --nproc_per_node="$nproc" --max-restarts="${MAX_RESTARTS:-0}" \
  -m distnerf.train strategy=ddp run_dir="$run_dir" resume=true "$@"
