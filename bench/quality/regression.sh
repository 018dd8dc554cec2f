#!/usr/bin/env bash
# Fixed-step quality at two commits side by side (BENCHMARKS.md: lego and fern keep their scores
# after a change, contraction off): the same training command at BASE and at HEAD (a git worktree
# of each, imported through PYTHONPATH), one after the other in this invocation.
#   bench/quality/regression.sh BASE STEPS NAME [hydra overrides...]
# e.g. bench/quality/regression.sh 856a6d2 300 lego_steps dataset=blender \
#        dataset.root=../shared/data/nerf_synthetic_half/lego eval.num_views=25
# trains runs/bench/NAME_{base,head} (1 process, sampler=sync), copies metrics.json / metrics.jsonl to
# bench/quality/results/NAME/{base,head}/ with a meta.json entry each (command, date, commit, load, wall s).
set -euo pipefail
. "$(dirname "$0")/../record.sh"  # run_and_record
base="$1"; steps="$2"; name="$3"; shift 3
repo="$(cd "$(dirname "$0")/../.." && pwd)"
res="${BENCHMARKS_RESULTS:-bench/quality/results}/$name"
mkdir -p runs/bench "$res"
# each side runs from its worktree: a relative path in an override (dataset.root=../shared/...) is
# taken from this checkout's root, as for every other bench/ runner
args=()
for a in "$@"; do
  case "$a" in
    *=./*|*=../*) args+=("${a%%=*}=$(realpath -m "$repo/${a#*=}")");;
    *) args+=("$a");;
  esac
done
for side in base head; do
  rev=$([ "$side" = base ] && echo "$base" || git -C "$repo" rev-parse --short HEAD)
  tree="$(mktemp -d)/distnerf_$rev"
  git -C "$repo" worktree add --detach -q "$tree" "$rev"
  trap 'git -C "$repo" worktree remove --force "$tree"' EXIT  # also when the run fails
  out="$repo/runs/bench/${name}_${side}"
  rm -rf "$out"
  # the worktree's package first on sys.path (ahead of the editable install of this checkout)
  cmd=(env PYTHONPATH="$tree" python -m distnerf.train run_dir="$out" train.max_steps="$steps" train.max_minutes=0 \
    monitor.progress=false monitor.log_every=50 checkpoints.every=0 sampler=sync logger.wandb.mode=disabled \
    eval.lpips=false "${args[@]}")
  (cd "$tree" && python -c "import distnerf, sys; assert distnerf.__file__.startswith('$tree'), distnerf.__file__" \
    && run_and_record "$repo/$res" "$side" "$out" "${cmd[@]}")
  git -C "$repo" worktree remove --force "$tree"; trap - EXIT
done
