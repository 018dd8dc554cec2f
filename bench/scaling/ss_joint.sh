#!/usr/bin/env bash
# ss joint training at a training-time budget on 2 ranks (BENCHMARKS.md, "ss joint training").
#   bench/scaling/ss_joint.sh MINUTES NAME [hydra overrides...]   -> runs/bench/NAME_joint
# and the quality-vs-regions series at a fixed number of steps:
#   bench/scaling/ss_joint.sh scaling STEPS [hydra overrides...] -> runs/bench/scaling_K{1,2,4}
# Each run's metrics.json and metrics.jsonl are copied to bench/scaling/results/NAME_joint/ or
# bench/scaling/results/scaling/K{1,2,4}/ (BENCHMARKS_RESULTS overrides bench/scaling/results) with a meta.json
# entry (command, date, git commit, load before/after, wall seconds).
set -euo pipefail
res_root="${BENCHMARKS_RESULTS:-bench/scaling/results}"
mkdir -p runs/bench
common=(monitor.progress=false monitor.log_every=25 logger.wandb.mode=disabled eval.lpips=false)
. "$(dirname "$0")/../record.sh"  # run_and_record
if [ "$1" = scaling ]; then
  steps="$2"; shift 2
  # a deliberately small per-region grid: total capacity grows with the number of regions
  small=(model.resolutions=[32,48,64] model.upsample_steps=[100,200] train.max_steps="$steps")
  out=runs/bench/scaling_K1; rm -rf "$out"
  run_and_record "$res_root/scaling" K1 "$out" \
    torchrun --standalone --nproc_per_node=2 -m distnerf.train strategy=ddp run_dir="$out" "${small[@]}" "${common[@]}" "$@"
  for k in 2 4; do
    out="runs/bench/scaling_K$k"; rm -rf "$out"
    run_and_record "$res_root/scaling" "K$k" "$out" \
      torchrun --standalone --nproc_per_node=2 -m distnerf.train strategy=ss strategy.training=joint \
      strategy.num_regions="$k" run_dir="$out" "${small[@]}" "${common[@]}" "$@"
  done
  exit 0
fi
minutes="$1"; name="$2"; shift 2
out="runs/bench/${name}_joint"; rm -rf "$out"
run_and_record "$res_root/${name}_joint" . "$out" \
  torchrun --standalone --nproc_per_node=2 -m distnerf.train strategy=ss strategy.training=joint run_dir="$out" \
  train.max_minutes="$minutes" train.max_steps=1000000 "${common[@]}" "$@"
