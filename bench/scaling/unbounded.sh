#!/usr/bin/env bash
# Quality at a budget on the large unbounded city (issue 16, BENCHMARKS.md "Large unbounded scenes"):
# 2 ranks, the same training-time budget and the same per-rank parameter budget (model.max_params)
# for every cell; ddp, ss independent and ss joint with contraction and appearance on, and the ddp
# ablations (contraction off, appearance off, both off).
#   [CELLS="ddp ss_independent ..."] bench/scaling/unbounded.sh MINUTES MAX_PARAMS NAME [hydra overrides...]
# e.g. bench/scaling/unbounded.sh 10 53248000 city_unbounded "model.upsample_steps=[100,300]"
# trains runs/bench/NAME_CELL for each cell, each evaluated on every test view (ss through distributed
# segment fusion), and copies metrics.json / metrics.jsonl (the model_size event holds the parameters
# per rank and the peak RSS) to bench/scaling/results/NAME/CELL/ with a meta.json entry (command, date, git
# commit, load before/after, wall seconds).
set -euo pipefail
. "$(dirname "$0")/../record.sh"  # run_and_record
minutes="$1"; max_params="$2"; name="$3"; shift 3
res="${BENCHMARKS_RESULTS:-bench/scaling/results}/$name"
mkdir -p runs/bench "$res"
declare -A CELL=(
  [ddp]="strategy=ddp model.contraction=mipnerf360 model.appearance=affine"
  [ss_independent]="strategy=ss strategy.training=independent model.contraction=mipnerf360 model.appearance=affine"
  [ss_joint]="strategy=ss strategy.training=joint model.contraction=mipnerf360 model.appearance=affine"
  [ddp_no_contraction]="strategy=ddp model.contraction=none model.appearance=affine"
  [ddp_no_appearance]="strategy=ddp model.contraction=mipnerf360 model.appearance=none"
  [ddp_neither]="strategy=ddp model.contraction=none model.appearance=none"
)
for cell in ${CELLS:-ddp ss_independent ss_joint ddp_neither ddp_no_contraction ddp_no_appearance}; do
  out="runs/bench/${name}_${cell}"
  read -r -a overrides <<< "${CELL[$cell]}"
  cmd=(torchrun --standalone --nproc_per_node=2 -m distnerf.train dataset=synthetic dataset.kind=city "${overrides[@]}" \
    model.max_params="$max_params" run_dir="$out" train.max_minutes="$minutes" train.max_steps=1000000 \
    monitor.progress=false monitor.log_every=25 logger.wandb.mode=disabled eval.lpips=false "$@")
  rm -rf "$out"
  run_and_record "$res" "$cell" "$out" "${cmd[@]}"
done
