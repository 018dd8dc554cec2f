#!/usr/bin/env bash
# Everything one GPU checks, as a plan of runs of at most 7 minutes each: the prepared GPU check of
# bench/gpu/ (its sections: bench/gpu/check.sh; their Python and the plan: bench/gpu/check.py; its
# findings: bench/gpu/README.md). From the repository root:
#   bash tools/gpu_check.sh --run N [--out DIR] [--runs DIR]    # run N of the plan, on a CUDA machine
#   bash tools/gpu_check.sh --plan                               # each run's sections, caps, what each produces
#   bash tools/gpu_check.sh --cpu --run all [--out DIR] [--runs DIR]  # every section at toy sizes on the CPU
#   bash tools/gpu_check.sh --prepare                            # the data and wheels for a machine without them
#   bash tools/gpu_check.sh --help                               # every section, option and variable
exec bash "$(dirname "$0")/../bench/gpu/check.sh" "$@"
