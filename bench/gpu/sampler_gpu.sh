#!/usr/bin/env bash
# Superseded for the CUDA sampler tests by tools/gpu_check.sh (one prepared script for all single-GPU
# checks); this script's sync/pipelined/device throughput comparison is not in it. Kept as it was.
# Sampler checks and sync / pipelined / device comparison on a GPU machine (16 cores), at most ~8 minutes.
#   bench/gpu/sampler_gpu.sh [OUT_DIR] [DATASET]     DATASET: lego (default) | fern | synthetic
# 1. tests/unit/test_sampler.py on CUDA (device sampler bitwise vs sync, pinned side-stream copy);
# 2. the stall-bound regime: one rank, 4 compute threads, 4 workers, 65536-ray batches over all images;
# 3. the default batch (8192 rays) with the same layout;
# 4. per-batch image decoding (sampler.source=files, 8 images per step), sync vs pipelined with 4 workers.
# The JSON of 2-4 (with their meta blocks: command, date, git commit, load) and the text logs go to
# OUT_DIR, by default bench/gpu/results/sampler_gpu (committed; read by bench/tables.py).
set -euo pipefail
out="${1:-bench/gpu/results/sampler_gpu}"; dataset="${2:-lego}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpu.txt" || true
timeout 90 python -m pytest -q tests/unit/test_sampler.py 2>&1 | tail -20 | tee "$out/tests.txt" || true
common=(--dataset "$dataset" --device cuda --nproc 1 --threads 4 --num-workers 4 --steps 60 --warmup 10)
timeout 150 python -m bench.throughput.sampler compare alone "${common[@]}" --global-rays 65536 \
  --json "$out/${dataset}_stall.json" | tee "$out/${dataset}_stall.txt" || true
timeout 100 python -m bench.throughput.sampler compare "${common[@]}" --global-rays 8192 \
  --json "$out/${dataset}_default.json" | tee "$out/${dataset}_default.txt" || true
timeout 120 python -m bench.throughput.sampler compare alone "${common[@]}" --samplers sync pipelined --global-rays 16384 \
  --extra sampler.source=files sampler.policy=per_image sampler.images_per_step=8 \
  --json "$out/${dataset}_decode.json" | tee "$out/${dataset}_decode.txt" || true
