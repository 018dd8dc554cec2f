#!/usr/bin/env bash
# The test suite (CPU, gloo). Slow real-data learning runs are included; pass extra pytest args through.
# DISTNERF_TEST_WORKERS (default 2): pytest-xdist workers, one test file (or the Slurm tests) per worker at a
# time (tests/conftest.py: pytest_xdist_make_scheduler), one OpenMP thread each: the machine's cores go to the
# two workers. The tests marked `exclusive` (they time themselves against the machine) then run alone. 0: the whole suite in one process.
set -uo pipefail
cd "$(dirname "$0")/.."
workers="${DISTNERF_TEST_WORKERS:-2}"
export WANDB_MODE=disabled
if [ "$workers" = 0 ]; then
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
  exec python -m pytest -q --durations=15 "$@" tests
fi
ok() { [ "$1" = 0 ] || [ "$1" = 5 ]; }  # 5: nothing selected (e.g. -k picked no exclusive test)
OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" python -m pytest -q -rs --durations=15 -n "$workers" \
  -m "not exclusive" "$@" tests
parallel=$?
OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" python -m pytest -q --durations=5 -m exclusive "$@" tests
alone=$?
echo "run_tests: parallel part rc $parallel, exclusive part rc $alone"
ok "$parallel" && ok "$alone"
