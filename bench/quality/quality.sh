#!/usr/bin/env bash
# Quality at a training-time budget (BENCHMARKS.md): train for MINUTES of training time with
# checkpoints at 2 and 5 minutes, score the final model on every test view and the 2- and
# 5-minute checkpoints on the fixed 25-view subset (r_0, r_8, ...).
#   bench/quality/quality.sh NAME NPROC MINUTES [hydra overrides...]
# e.g. bench/quality/quality.sh lego_1p 1 10 dataset=blender dataset.root=../shared/data/nerf_synthetic_half/lego
# The run goes to runs/bench/NAME (git-ignored: checkpoints, images); its JSON results (metrics.json,
# metrics.jsonl, at_2min/metrics.json, at_5min/metrics.json) are copied to bench/quality/results/NAME/
# (committed; BENCHMARKS_RESULTS overrides bench/quality/results) with a meta.json entry: command, date,
# git commit, load before/after, wall seconds per phase. `python -m bench.tables` reads them.
set -euo pipefail
cmdline=$(python -m bench.common quote bench/quality/quality.sh "$@")
[ "${OMP_NUM_THREADS:-}" ] && cmdline="OMP_NUM_THREADS=$OMP_NUM_THREADS $cmdline"
name="$1"; nproc="$2"; minutes="$3"; shift 3
out="runs/bench/$name"
res="${BENCHMARKS_RESULTS:-bench/quality/results}/$name"
mkdir -p runs/bench
read -r l1 l5 l15 _ < /proc/loadavg
started=$(date -u +%FT%TZ); t0=$(date +%s.%N)
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b - a}'; }
if [ "$nproc" = 1 ]; then launcher=(python -m distnerf.train); else
  launcher=(torchrun --standalone --nproc_per_node="$nproc" -m distnerf.train); fi
"${launcher[@]}" run_dir="$out" train.max_minutes="$minutes" train.max_steps=1000000 monitor.progress=false \
  monitor.log_every=25 "checkpoints.at_minutes=[2,5]" checkpoints.every=0 checkpoints.keep=5 \
  logger.wandb.mode=disabled "$@"
phases="\"train_and_final_eval\": $(elapsed "$t0")"
i=0
for m in 2 5; do
  i=$((i + 1))
  ck=$(ls -d "$out"/checkpoints/step_* | sed -n "${i}p")
  t=$(date +%s.%N)
  python -m distnerf.render run_dir="$out" checkpoint="$ck" out_dir="$out/at_${m}min" eval.num_views=25
  phases="$phases, \"render_${m}min\": $(elapsed "$t")"
done
wall=$(elapsed "$t0")
mkdir -p "$res/at_2min" "$res/at_5min"
cp "$out/metrics.json" "$out/metrics.jsonl" "$res/"
for m in 2 5; do cp "$out/at_${m}min/metrics.json" "$res/at_${m}min/metrics.json"; done
python -m bench.common meta "$res" --command "$cmdline" --started "$started" --wall-s "$wall" \
  --load-before "$l1" "$l5" "$l15" --phases "{$phases}" \
  --files metrics.json metrics.jsonl at_2min/metrics.json at_5min/metrics.json
python -m bench.quality.summary "$out"
