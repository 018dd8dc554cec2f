#!/usr/bin/env bash
# ss vs ddp at the same training-time budget on 2 ranks (BENCHMARKS.md, "Spatial segmentation").
#   tools/bench_ss_train.sh MINUTES NAME [hydra overrides...]
# trains bench/NAME_ss (strategy=ss) then bench/NAME_ddp (strategy=ddp), both evaluated on every
# test view (ss through distributed segment fusion); then `tools/bench_ss.py bench/NAME_ss bench/NAME_ddp`
# measures fused render time, blend quality and the samples spent outside each region.
set -euo pipefail
minutes="$1"; name="$2"; shift 2
mkdir -p bench
for strategy in ss ddp; do
  out="bench/${name}_${strategy}"
  rm -rf "$out"
  torchrun --standalone --nproc_per_node=2 -m distnerf.train strategy="$strategy" run_dir="$out" \
    train.max_minutes="$minutes" train.max_steps=1000000 train.progress=false train.log_every=25 \
    logger.wandb.mode=disabled eval.lpips=false "$@"
  uptime > "$out/uptime.txt"
done
