#!/usr/bin/env bash
# The README's lego line as written, at a time budget (issue 28 item 1: the schedules follow
# train.max_minutes): one process, no other override than the budget and the test views scored.
#   OMP_NUM_THREADS=2 ../shared/tools/quiet --log bench/history/quiet/quiet_issue28.jsonl -- bench/quality/budget.sh MINUTES VIEWS
# -> bench/quality/results/lego_budget/<MINUTES>min/{metrics.json,metrics.jsonl} with a meta.json entry
# A variant of the line (a schedule probe): NAME and its overrides after VIEWS, e.g.
#   bench/quality/budget.sh 2 25 no_decay optim.decay=1.0
# -> bench/quality/results/lego_budget/<MINUTES>min_probe/NAME/
set -euo pipefail
. "$(dirname "$0")/../record.sh"  # run_and_record
minutes="$1"; views="$2"; shift 2
sub="${minutes}min"; out="runs/bench/lego_budget_${minutes}min"
if [ $# -gt 0 ]; then
  sub="${minutes}min_probe/$1"; out="runs/bench/lego_budget_${minutes}min_$1"; shift
fi
rm -rf "$out"
run_and_record bench/quality/results/lego_budget "$sub" "$out" python -m distnerf.train dataset=blender \
  dataset.root=../shared/data/nerf_synthetic_half/lego train.max_minutes="$minutes" eval.num_views="$views" \
  run_dir="$out" monitor.progress=false logger.wandb.mode=disabled "$@"
