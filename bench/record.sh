# Sourced by the shell runners bench/<question>/*.sh (not run on its own):
# run_and_record RESULT_DIR SUBDIR RUN_DIR COMMAND...: run COMMAND, copy RUN_DIR's JSON to RESULT_DIR/SUBDIR
# this checkout's root, wherever the run's cwd is (bench/quality/regression.sh runs from a worktree of another
# commit): its bench package comes first for `python -m bench.common` (a regular package wins over the
# namespace folder an older checkout's bench/ is), the meta's commit is still the cwd's
_BENCH_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_bench() { PYTHONPATH="$_BENCH_ROOT${PYTHONPATH:+:$PYTHONPATH}" python -m "$@"; }
run_and_record() {
  local res="$1" sub="$2" out="$3"; shift 3
  local l1 l5 l15 rest started t0 wall p=""
  [ "$sub" = . ] || p="$sub/"
  read -r l1 l5 l15 rest < /proc/loadavg
  started=$(date -u +%FT%TZ); t0=$(date +%s.%N)
  "$@"
  wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b - a}')
  mkdir -p "$res/$p"
  cp "$out/metrics.json" "$out/metrics.jsonl" "$res/$p"
  _bench bench.common meta "$res" --started "$started" --wall-s "$wall" --load-before "$l1" "$l5" "$l15" \
    --command "$(_bench bench.common quote "$@")" \
    --files "${p}metrics.json" "${p}metrics.jsonl"
}
