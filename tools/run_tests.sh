#!/usr/bin/env bash
# The test suite (CPU, gloo). Slow real-data learning runs are included; pass extra pytest args through.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" WANDB_MODE=disabled
python -m pytest -q --durations=15 "$@" tests
