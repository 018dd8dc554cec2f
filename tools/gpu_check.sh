#!/usr/bin/env bash
# Everything one GPU can check, in one run of at most ~8 minutes: the prepared GPU check of
# bench/gpu/ (its sections: bench/gpu/check.sh; their Python: bench/gpu/check.py; its findings:
# bench/gpu/README.md). From the repository root:
#   bash tools/gpu_check.sh [--out DIR] [--runs DIR]        # on a CUDA machine (default)
#   bash tools/gpu_check.sh --cpu [--out DIR] [--runs DIR]  # end to end on the CPU, tiny sizes, gloo
#   bash tools/gpu_check.sh --prepare                       # here, before a device run
#   bash tools/gpu_check.sh --help                          # every section, option and variable
exec bash "$(dirname "$0")/../bench/gpu/check.sh" "$@"
