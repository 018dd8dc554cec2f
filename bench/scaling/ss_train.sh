#!/usr/bin/env bash
# ss vs ddp at the same training-time budget on 2 ranks (BENCHMARKS.md, "Spatial segmentation").
#   [SS_EXTRA="..."] [DDP_EXTRA="..."] tools/bench_ss_train.sh MINUTES NAME [hydra overrides...]
# trains bench/NAME_ss (strategy=ss) then bench/NAME_ddp (strategy=ddp), both evaluated on every
# test view (ss through distributed segment fusion); SS_EXTRA / DDP_EXTRA add overrides to one run
# only (whitespace-separated), e.g. DDP_EXTRA="model.resolutions=[64,128,202]" for a ddp model with
# as many table entries as the two ss sub-models. Each run's metrics.json and metrics.jsonl are
# copied to bench/results/NAME/{ss,ddp}/ (BENCHMARKS_RESULTS overrides bench/results) with a
# meta.json entry (command, date, git commit, load before/after, wall seconds). Then
# `python tools/bench_ss.py bench/NAME_ss bench/NAME_ddp` (-> bench/results/NAME/bench_ss.json)
# measures fused render time, blend quality and the samples spent outside each region.
set -euo pipefail
. "$(dirname "$0")/bench_record.sh"  # run_and_record
minutes="$1"; name="$2"; shift 2
res="${BENCHMARKS_RESULTS:-bench/results}/$name"
mkdir -p bench "$res"
for strategy in ss ddp; do
  out="bench/${name}_${strategy}"
  extra_var="${strategy^^}_EXTRA"; read -r -a extra <<< "${!extra_var:-}"
  cmd=(torchrun --standalone --nproc_per_node=2 -m distnerf.train strategy="$strategy" run_dir="$out" \
    train.max_minutes="$minutes" train.max_steps=1000000 train.progress=false train.log_every=25 \
    logger.wandb.mode=disabled eval.lpips=false "${extra[@]}" "$@")
  rm -rf "$out"
  run_and_record "$res" "$strategy" "$out" "${cmd[@]}"
done
