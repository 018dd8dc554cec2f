#!/usr/bin/env bash
# The test suite (CPU, gloo). Slow real-data learning runs are included; pass extra pytest args through.
# DISTNERF_TEST_WORKERS (default 2): pytest-xdist workers, one file (or the Slurm tests) per worker at a time
# (tests/conftest.py); 0 runs the suite in this process. Each worker runs one OpenMP thread: the machine's
# cores go to the two workers, not to threads that would wait for each other.
set -euo pipefail
cd "$(dirname "$0")/.."
workers="${DISTNERF_TEST_WORKERS:-2}"
export WANDB_MODE=disabled
if [ "$workers" = 0 ]; then
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
  exec python -m pytest -q --durations=15 "$@" tests
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec python -m pytest -q --durations=15 -n "$workers" --dist loadgroup "$@" tests
