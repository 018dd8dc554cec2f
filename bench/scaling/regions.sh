#!/usr/bin/env bash
# Regions series (issue 16, BENCHMARKS.md): strategy=ss with K regions at a fixed size per region
# and a fixed training time, one process holding every region (several regions per rank), on an
# unbounded scene (contraction + appearance): test PSNR / SSIM and render time per image, K = 1
# being the single model the fused renders are compared with.
#   bench/scaling/regions.sh MINUTES PARAMS_PER_REGION NAME "K..." [hydra overrides...]
# e.g. bench/scaling/regions.sh 2 4000000 city_small_regions "1 2 4 8" dataset.kind=city_small
# trains runs/bench/NAME_kK (model.max_params = K x PARAMS_PER_REGION: one rank's budget shared by its
# K regions), each scored on every test view through segment fusion, and copies metrics.json /
# metrics.jsonl to bench/scaling/results/NAME/kK/ with a meta.json entry (command, date, commit, load, wall s).
set -euo pipefail
. "$(dirname "$0")/../record.sh"  # run_and_record
minutes="$1"; per_region="$2"; name="$3"; counts="$4"; shift 4
res="${BENCHMARKS_RESULTS:-bench/scaling/results}/$name"
mkdir -p runs/bench "$res"
for k in $counts; do
  out="runs/bench/${name}_k$k"
  cmd=(python -m distnerf.train dataset=synthetic strategy=ss strategy.num_regions="$k" model.contraction=mipnerf360 \
    model.appearance=affine model.max_params=$((k * per_region)) run_dir="$out" train.max_minutes="$minutes" \
    train.max_steps=1000000 monitor.progress=false monitor.log_every=25 logger.wandb.mode=disabled eval.lpips=false "$@")
  rm -rf "$out"
  run_and_record "$res" "k$k" "$out" "${cmd[@]}"
done
