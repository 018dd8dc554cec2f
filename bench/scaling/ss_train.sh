#!/usr/bin/env bash
# ss vs ddp at the same training-time budget on 2 ranks (BENCHMARKS.md, "Spatial segmentation").
#   [SS_EXTRA="..."] [DDP_EXTRA="..."] bench/scaling/ss_train.sh MINUTES NAME [hydra overrides...]
# trains runs/bench/NAME_ss (strategy=ss) then runs/bench/NAME_ddp (strategy=ddp), both evaluated on every
# test view (ss through distributed segment fusion); SS_EXTRA / DDP_EXTRA add overrides to one run
# only (whitespace-separated), e.g. DDP_EXTRA="model.resolutions=[64,128,202]" for a ddp model with
# as many table entries as the two ss sub-models. Each run's metrics.json and metrics.jsonl are
# copied to bench/scaling/results/NAME/{ss,ddp}/ (BENCHMARKS_RESULTS overrides bench/scaling/results) with a
# meta.json entry (command, date, git commit, load before/after, wall seconds). Then
# `python -m bench.scaling.ss runs/bench/NAME_ss runs/bench/NAME_ddp` (-> bench/scaling/results/NAME/bench_ss.json)
# measures fused render time, blend quality and the samples spent outside each region.
set -euo pipefail
. "$(dirname "$0")/../record.sh"  # run_and_record
minutes="$1"; name="$2"; shift 2
res="${BENCHMARKS_RESULTS:-bench/scaling/results}/$name"
mkdir -p runs/bench "$res"
for strategy in ss ddp; do
  out="runs/bench/${name}_${strategy}"
  extra_var="${strategy^^}_EXTRA"; read -r -a extra <<< "${!extra_var:-}"
  cmd=(torchrun --standalone --nproc_per_node=2 -m distnerf.train strategy="$strategy" run_dir="$out" \
    train.max_minutes="$minutes" train.max_steps=1000000 monitor.progress=false monitor.log_every=25 \
    logger.wandb.mode=disabled eval.lpips=false "${extra[@]}" "$@")
  rm -rf "$out"
  run_and_record "$res" "$strategy" "$out" "${cmd[@]}"
done
