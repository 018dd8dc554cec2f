#!/usr/bin/env bash
# Superseded by tools/gpu_check.sh (one prepared script for all single-GPU checks: these traces, their
# reports and HTA overlap, nsys, CUDA tests, host syncs, lego quality); kept for its committed results.
# Prepared GPU profiling check (issue 6), at most ~8 minutes on one GPU. NOT RUN YET: no GPU was
# available when it was written. Run from the repository root with .venv active:
#   bash bench/gpu/profile_gpu.sh [OUT_DIR]
# 1. a short 1-rank torchrun (nccl) lego run with profiler=trace, NVTX ranges and NVML telemetry,
#    then its report (HTA overlap on the GPU trace);
# 2. a small GPU trace (one active step, no shapes/memory) and the HTA overlap of it, printed
#    (the GPU-trace unit test was removed: it had no fixture here; issue 14's GPU check covers it);
# 3. an nsys timeline when nsys is installed.
# The report run's JSON (profile/report.json, metrics.jsonl) is copied to RESULTS_DIR (default
# bench/gpu/results/gpu_profile, committed; read by bench/tables.py) with a meta.json entry.
#   bash bench/gpu/profile_gpu.sh [OUT_DIR [RESULTS_DIR]]
set -euo pipefail
OUT="${1:-runs/gpu_profile}"; RES="${2:-bench/gpu/results/gpu_profile}"
LEGO=../shared/data/nerf_synthetic_half/lego
TR="python -m torch.distributed.run --standalone --nproc_per_node=1 -m distnerf.train"
COMMON="dataset=blender dataset.root=$LEGO device=cuda monitor.progress=false checkpoints.every=-1 eval.enabled=false"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
read -r l1 l5 l15 _ < /proc/loadavg; started=$(date -u +%FT%TZ); t0=$(date +%s.%N)
timeout 240 $TR $COMMON run_dir="$OUT/report" train.max_steps=300 profiler=trace profiler.nvtx=true
wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b - a}')
python -m distnerf.profile report "$OUT/report" | head -80
mkdir -p "$RES"
cp "$OUT/report/profile/report.json" "$OUT/report/metrics.jsonl" "$RES/"
python -m bench.common meta "$RES" --started "$started" --wall-s "$wall" --load-before "$l1" "$l5" "$l15" \
  --command "$TR $COMMON run_dir=$OUT/report train.max_steps=300 profiler=trace profiler.nvtx=true" \
  --files report.json metrics.jsonl
timeout 120 $TR $COMMON run_dir="$OUT/fixture" train.max_steps=8 profiler=trace profiler.trace.wait=4 \
  profiler.trace.warmup=1 profiler.trace.active=1 profiler.trace.record_shapes=false \
  profiler.trace.profile_memory=false profiler.telemetry=false
python -m bench.gpu.check hta_trace "$OUT/fixture/profile/traces" || true
if command -v nsys >/dev/null; then
  timeout 120 nsys profile -t cuda,nvtx,osrt -o "$OUT/nsys_ddp1" $TR $COMMON run_dir="$OUT/nsys" \
    train.max_steps=100 profiler.nvtx=true
  nsys stats --report nvtx_sum "$OUT/nsys_ddp1.nsys-rep" | head -30
fi
