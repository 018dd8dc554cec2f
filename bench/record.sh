# Sourced by the tools/bench_*.sh training benchmarks (not run on its own):
# run_and_record RESULT_DIR SUBDIR RUN_DIR COMMAND...: run COMMAND, copy RUN_DIR's JSON to RESULT_DIR/SUBDIR
_BENCH_TOOLS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"  # this checkout's tools/, wherever the run's cwd is
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
  python "$_BENCH_TOOLS/bench_common.py" meta "$res" --started "$started" --wall-s "$wall" --load-before "$l1" "$l5" "$l15" \
    --command "$(python -c 'import shlex, sys; print(shlex.join(sys.argv[1:]))' "$@")" \
    --files "${p}metrics.json" "${p}metrics.jsonl"
}
