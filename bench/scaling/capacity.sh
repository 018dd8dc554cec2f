#!/usr/bin/env bash
# Capacity series (issue 15): ddp test PSNR at a fixed number of steps for 0.5x, 1x and 2x the
# default per-rank parameter count of model=grid (the final grid resolution scaled by the cube
# root: 127, 160, 202 vertices per axis; earlier stages as in the default). BENCHMARKS.md, city.
#   bench/scaling/capacity.sh STEPS NAME [hydra overrides...]
# e.g. bench/scaling/capacity.sh 600 city_capacity dataset.kind=city "model.upsample_steps=[100,300]"
# trains runs/bench/NAME_x0.5, runs/bench/NAME_x1, runs/bench/NAME_x2 (2 ranks, torchrun, strategy=ddp), each
# evaluated on every test view; copies metrics.json / metrics.jsonl (its model_size event holds
# the parameters per rank and the peak RSS) to bench/scaling/results/NAME/x{0.5,1,2}/ with a meta.json
# entry (command, date, git commit, load before/after, wall seconds).
set -euo pipefail
. "$(dirname "$0")/../record.sh"  # run_and_record
steps="$1"; name="$2"; shift 2
res="${BENCHMARKS_RESULTS:-bench/scaling/results}/$name"
mkdir -p runs/bench "$res"
declare -A RESOLUTIONS=([x0.5]="[64,112,127]" [x1]="[64,128,160]" [x2]="[64,128,202]")
for scale in x0.5 x1 x2; do
  out="runs/bench/${name}_${scale}"
  cmd=(torchrun --standalone --nproc_per_node=2 -m distnerf.train strategy=ddp dataset=synthetic run_dir="$out" \
    "model.resolutions=${RESOLUTIONS[$scale]}" train.max_steps="$steps" train.max_minutes=0 monitor.progress=false \
    monitor.log_every=50 logger.wandb.mode=disabled eval.lpips=false "$@")
  rm -rf "$out"
  run_and_record "$res" "$scale" "$out" "${cmd[@]}"
done
