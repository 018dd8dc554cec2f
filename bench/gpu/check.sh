#!/usr/bin/env bash
# Everything one GPU checks, as a plan of runs of at most 7 minutes each (issue 62 item 4). The plan is
# bench/gpu/check.py RUNS: each run's sections in priority order, each with a cap in seconds; a run's caps and
# its 20 s of start-up (STARTUP_S) sum to at most 420 s (tests/bench/test_gpu_check_plan.py). Each section's
# Python: bench/gpu/check.py; the findings: bench/gpu/README.md. From the repository root, through
# tools/gpu_check.sh:
#
#   bash tools/gpu_check.sh --run N [--out DIR] [--runs DIR]   # run N of the plan, on a CUDA machine
#   bash tools/gpu_check.sh --plan                              # the runs: sections, caps, what each produces
#   bash tools/gpu_check.sh --cpu --run all [--out DIR] [--runs DIR]
#                      # every section once, end to end on the CPU at toy sizes (gloo, the built-in scene)
#   bash tools/gpu_check.sh --prepare                           # the data and wheels for a machine without them
#
# The runs, in order (the caps: --plan):
#   1  env, lego_1min, sweep, cuda_tests
#   2  env, lego_2min, two_ranks
#   3  env, lego_5min
#   4  env, sync_debug, ops, ddp_trace, ss_trace, hta_overlap, sync_counter
#   5  env, study, nsys
#   6  env, paths, sweep_more
#
# What each section does on a GPU machine (--cpu: the same code at toy sizes, or "skipped: why"):
#   env           torch, CUDA, GPU, driver, NCCL, the C compiler (cc, gcc) and triton that inductor needs for
#                 the sweep's compiled rows, /dev/shm, nsys, HTA, commit
#   lego_1min     dataset=blender dataset.root=$DISTNERF_LEGO, the default grid model, train.max_minutes=1,
#                 evaluated on all 200 test views: PSNR/SSIM (and over the 25-view subset), the evaluation's
#                 seconds, training and evaluation rays/s; stopped by its cap inside the evaluation, the views
#                 it rendered and their rate (--cpu: 20 steps, 2 views of the built-in scene)
#   lego_2min,    the same trained 2 and 5 minutes, 25 test views (the CPU's 2-minute protocol)
#   lego_5min     (--cpu: 8 steps, 2 views)
#   sweep         bench/gpu/sweep.py --part first: rays/s and samples/s at lego's final grid for the eager and
#                 graphed (torch.compile reduce-overhead) static step at 2^18 samples, then the hand-recorded
#                 CUDA graph (step.cuda_graph); each configuration in its own process under its own cap, so a
#                 device-side assert or a hang fails its row only (--cpu: eager and the graph's body
#                 uncaptured at 2^10 samples of the built-in scene; graphed "skipped: needs CUDA")
#   sweep_more    bench/gpu/sweep.py --part rest: compiled; budgets 2^16 and 2^20; bf16 (--cpu: eager at 2^12)
#   cuda_tests    `pytest -m cuda` over the unit tests marked cuda (the device and pipelined sampler,
#                 the device/NVML mapping, two ranks sharing one device, ...); --cpu: they skip
#   two_ranks     2 ranks on the one device (dist_backend=gloo: gloo carries the CUDA tensors, so the ranks
#                 may share a GPU; a check, not a way to train), for each strategy of GPU_CHECK_TWO_RANKS
#                 (default "ddp ss_joint ss_joint_route", the last with strategy.joint_exchange=route; --cpu:
#                 "ss_joint"): train with a checkpoint, resume past it, evaluate (ss: segment fusion)
#   sync_debug    torch.cuda.set_sync_debug_mode("warn") over a few training steps of each model of
#                 GPU_CHECK_SYNC_MODELS (default "grid ngp nerf"): warnings per step and where
#   ops           bench/throughput/ops.py --data $DISTNERF_LEGO: ATen operators per training step on this device
#   ddp_trace     1-rank torchrun (NCCL; gloo with --cpu) strategy=ddp profiler=trace, then
#                 `python -m distnerf.profile report RUN`: step time, phase shares, rays/s, communication
#   ss_trace      the same with strategy=ss strategy.num_regions=2
#   hta_overlap   HolisticTraceAnalysis communication/computation overlap of the two traces
#   sync_counter  bench/throughput/syncs.py: the would-be host syncs, counted on the CPU
#   study         conf/study/gpu_one.yaml (ddp and joint ss at 1 and 2 ranks on lego, 2 ranks sharing the GPU
#                 through gloo): its cells (PSNR, step time, exposed communication) and the scaling model's
#                 device speed; --cpu: the cells are listed (the config checked), not run
#   nsys          an Nsight Systems capture of a short 1-rank run and its NVTX summary, if nsys is on PATH
#   paths         what users run, 30 steps each with evaluation: ss (segment fusion), ss joint, bf16
#                 (experiment=gpu; CUDA only), sampler=device (GPU_CHECK_PATHS; --cpu: no ss_joint, which
#                 two_ranks covers): status, PSNR, rays/s, peak memory
# A section gets its cap, at most what is left of the run's sum of caps; one that cannot start is
# "skipped: time ...". --cpu doubles every cap (toy sizes on a small shared CPU; not a GPU run's limit).
# Writes OUT/summary.json (default bench/gpu/results/gpu_check/runN; the run's plan, and per section "status":
# "ok", "failed: why" or "skipped: why", its numbers, its cap and its seconds) and OUT/log.txt; the runs
# (traces, checkpoints off) go to RUNS (default runs/gpu_check, git-ignored).
#
# Environment: DISTNERF_LEGO (lego's folder: every data path of a GPU run; default .gpu_data/lego, what
# --prepare writes; --prepare copies from it, default ../shared/data/nerf_synthetic_half/lego), PYTHON
# (python3), GPU_CHECK_ONLY (a space-separated list of the run's sections to run; the rest are "skipped: not
# selected"), GPU_CHECK_SYNC_MODELS, GPU_CHECK_QUALITY_EXTRA (more overrides of the lego runs),
# GPU_CHECK_PATHS, GPU_CHECK_TWO_RANKS, GPU_CHECK_COMMIT (recorded where the tree has no .git). The lego runs
# are bounded by time, not steps (train.max_steps=1000000): the learning-rate decay follows steps
# (optim.decay_steps), so a faster GPU decays further in the same minutes.
#
# On a GPU machine that has this working tree but neither ../shared nor a package index:
#  1. here, once: `bash tools/gpu_check.sh --prepare` copies lego's train and test splits into .gpu_data/lego
#     (git-ignored through .git/info/exclude) and downloads the pure-Python wheels such a machine lacks into
#     .whl (git-ignored): hydra-core, omegaconf, antlr4 (built here: it has no wheel), HolisticTraceAnalysis
#     and plotly (HTA imports it); then it measures them and fails above 60 MiB in all (PREPARE_LIMIT_MIB).
#  2. there, with .gpu_data and .whl in the tree, one run per command:
#       python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#         .whl/*.whl && export PYTHONPATH=/tmp/site && DISTNERF_LEGO=.gpu_data/lego GPU_CHECK_COMMIT=<commit> \
#         bash tools/gpu_check.sh --run N --out OUT/gpu_check_runN
# Known on the H200 of 2026-12-04: torch 2.11 (pyproject asks >= 2.13; the code runs from the tree through
# PYTHONPATH, not installed), no wandb (every run sets logger.wandb.mode=disabled), no LPIPS weights
# (eval.lpips=false), nsys not on PATH (the nsys section skips).
set -uo pipefail
MODE=gpu; OUT=; RUNS=runs/gpu_check; PREPARE=0; RUN=1; PLAN_ONLY=0
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) MODE=cpu; shift;; --out) OUT=$2; shift 2;; --runs) RUNS=$2; shift 2;; --prepare) PREPARE=1; shift;;
    --run) RUN=$2; shift 2;; --plan) PLAN_ONLY=1; shift;;
    -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0;;
    *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2;;
  esac
done
cd "$(dirname "$0")/../.." || exit 2
PY=${PYTHON:-python3}
helper() { "$PY" -m bench.gpu.check "$@"; }
[ "$PLAN_ONLY" = 1 ] && { helper describe; exit $?; }

if [ "$PREPARE" = 1 ]; then  # here, with network: the data subset and the wheels, measured against the limit
  set -e
  FROM=${DISTNERF_LEGO:-../shared/data/nerf_synthetic_half/lego}
  mkdir -p .git/info && for p in /.gpu_data/ /.whl/; do
    grep -qxF "$p" .git/info/exclude 2>/dev/null || echo "$p" >> .git/info/exclude; done
  mkdir -p .gpu_data/lego .whl
  cp -r "$FROM"/train "$FROM"/test "$FROM"/transforms_*.json .gpu_data/lego/
  # the versions of this environment (tested here), else these
  pins=$($PY -m bench.gpu.check versions)
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl $(echo "$pins" | grep -v antlr4)
  # omegaconf 2.3's grammar was generated by antlr 4.9 (an antlr4 4.13 runtime refuses it: "Could not
  # deserialize ATN with version 3"), so the runtime is pinned, whatever this environment has; no wheel on PyPI
  rm -f .whl/antlr4_python3_runtime-*.whl; $PY -m pip wheel -q --no-deps antlr4-python3-runtime==4.9.3 -w .whl
  helper prepared_size .gpu_data .whl  # exits 1 above PREPARE_LIMIT_MIB
  exit 0
fi

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 WANDB_MODE=disabled
mapfile -t PLAN < <(helper plan "$RUN")
[ ${#PLAN[@]} -gt 0 ] || { echo "gpu_check: no plan for --run $RUN (see --plan)" >&2; exit 2; }
if [ "$MODE" = cpu ]; then
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}; DEVICE=cpu; SCALE=2; LEGO=
else
  DEVICE=cuda; SCALE=1; LEGO=${DISTNERF_LEGO:-.gpu_data/lego}
  if [ ! -f "$LEGO/transforms_train.json" ]; then
    echo "gpu_check: no lego scene at $LEGO (set DISTNERF_LEGO; --prepare writes .gpu_data/lego)" >&2; exit 2
  fi
  LEGO=$(cd "$LEGO" && pwd)
fi
BUDGET=0; for line in "${PLAN[@]}"; do read -r _ cap <<< "$line"; BUDGET=$((BUDGET + cap * SCALE)); done
OUT=${OUT:-bench/gpu/results/gpu_check/run$RUN}
mkdir -p "$OUT" "$RUNS/sections" || exit 2
OUT=$(cd "$OUT" && pwd); RUNS=$(cd "$RUNS" && pwd); SECT=$RUNS/sections; rm -f "$SECT"/*.json "$SECT"/_timings.txt
exec > >(tee "$OUT/log.txt") 2>&1
T0=$(date +%s); DEADLINE=$((T0 + BUDGET))

export GC_SECT=$SECT GC_RUNS=$RUNS
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.2f", b - a}'; }
# limit CAP: seconds a section may take, at most what is left of the run's budget (0: too little left)
limit() { local left=$((DEADLINE - $(date +%s) - 5)); [ "$left" -lt 15 ] && { echo 0; return; }
          [ "$1" -lt "$left" ] && echo "$1" || echo "$left"; }
# part_limit WANT: seconds one step of a section may take, at most what is left of its cap (0: too little)
part_limit() { local left=$((SECTION_END - $(date +%s) - 2)); [ "$left" -lt 5 ] && { echo 0; return; }
               [ "$1" -lt "$left" ] && echo "$1" || echo "$left"; }
# reserve CAP SECONDS: CAP less SECONDS kept for what follows in the section (at least 10)
reserve() { local t=$(($1 - $2)); [ "$t" -lt 10 ] && t=10; echo "$t"; }
banner() { echo; echo "=== $1 (${2:+cap $2 s; }$(($(date +%s) - T0)) s of $BUDGET s)"; }
# want NAME: the section is selected (GPU_CHECK_ONLY unset, or it names NAME); else it is recorded as skipped
want() { [ -z "${GPU_CHECK_ONLY:-}" ] && return 0; case " $GPU_CHECK_ONLY " in *" $1 "*) return 0;; esac
         helper skipped "$1" "not selected (GPU_CHECK_ONLY=$GPU_CHECK_ONLY)"; return 1; }
COMMON=(monitor.progress=false checkpoints.every=-1 logger.wandb.mode=disabled device=$DEVICE)
if [ "$MODE" = cpu ]; then
  DATA=(experiment=smoke); DATA_NAME="built-in scene (experiment=smoke; --cpu)"
  TRACE=(train.max_steps=8 profiler.trace.wait=2 profiler.trace.warmup=1 profiler.trace.active=2)
  SYNC_MODELS=${GPU_CHECK_SYNC_MODELS:-grid}; SYNC_STEPS=4
  SYNC_ARGS=(--configs grid --step 2); NSYS_STEPS=10; OPS_CONFIGS=(smoke_grid); OPS_DATA=()
else
  DATA=(dataset=blender "dataset.root=$LEGO"); DATA_NAME=$LEGO
  TRACE=(train.max_steps=40 profiler.trace.wait=20 profiler.trace.warmup=2 profiler.trace.active=3 profiler.nvtx=true)
  SYNC_MODELS=${GPU_CHECK_SYNC_MODELS:-grid ngp nerf}; SYNC_STEPS=12; SYNC_ARGS=(); NSYS_STEPS=40
  OPS_CONFIGS=(lego_grid lego_grid_64_rays smoke_ngp); OPS_DATA=(--data "$LEGO")
fi
TORCHRUN=("$PY" -m torch.distributed.run --standalone --nproc_per_node=1 -m distnerf.train)
CUDA=$(helper cuda_available 2>/dev/null || echo 0)
[ "$MODE" = cpu ] && CUDA=0
echo "gpu_check: mode $MODE, run $RUN, out $OUT, runs $RUNS, data $DATA_NAME, budget $BUDGET s"

# ---------------------------------------------------------------------------- sections: sec_NAME CAP
sec_env() { timeout -k 5 "$1" "$PY" -m bench.gpu.check env "$MODE" || helper failed env "exited with $? (cap $1 s)"; }

# lego_MIN: trained MIN minutes (--cpu: STEPS steps), evaluated on VIEWS test views (--cpu: 2)
sec_lego() {  # MIN VIEWS STEPS CAP
  local run="$RUNS/lego_${1}min" s q
  q=(train.max_minutes="$1" train.max_steps=1000000 eval.num_views="$2" eval.lpips=false ${GPU_CHECK_QUALITY_EXTRA:-})
  [ "$MODE" = cpu ] && q=(train.max_steps="$3" eval.num_views=2 eval.lpips=false)
  rm -rf "$run"; s=$(now)
  timeout -k 15 "$4" "$PY" -m distnerf.train "${DATA[@]}" "${COMMON[@]}" "${q[@]}" run_dir="$run"
  helper quality "lego_${1}min" "$run" "$?" "$(since "$s")" "$DATA_NAME"
}
sec_lego_1min() { sec_lego 1 200 20 "$1"; }
sec_lego_2min() { sec_lego 2 25 8 "$1"; }
sec_lego_5min() { sec_lego 5 25 8 "$1"; }

sec_sweep_part() {  # PART SECTION CAP: each configuration its own process (bench/gpu/sweep.py)
  local data=() rc; [ "$MODE" = cpu ] || data=(--data "$LEGO")
  timeout -k 20 "$3" "$PY" -m bench.gpu.sweep --mode "$([ "$CUDA" = 1 ] && echo cuda || echo cpu)" "${data[@]}" \
    --part "$1" --section "$2" --seconds "$(reserve "$3" 15)" --runs "$RUNS/$2"
  rc=$?; [ -f "$SECT/$2.json" ] || helper failed "$2" "bench.gpu.sweep exited with $rc before writing (see log.txt)"
}
sec_sweep() { sec_sweep_part first sweep "$1"; }
sec_sweep_more() { sec_sweep_part rest sweep_more "$1"; }

sec_cuda_tests() {
  local files s rc
  files=$(grep -lis cuda tests/unit/test_*.py | tr '\n' ' '); rm -f "$RUNS/cuda_tests.xml"
  s=$(now); timeout -k 10 "$1" "$PY" -m pytest -q -rs -p no:cacheprovider $files -m cuda --junitxml="$RUNS/cuda_tests.xml"
  rc=$?; helper tests "$RUNS/cuda_tests.xml" "$rc" "$(since "$s")" "$CUDA"
}

sec_trace() {  # STRATEGY CAP: a 1-rank torchrun with profiler=trace, then its report
  local strat=$1 extra=() run="$RUNS/$1" s rc secs rrc=124 t
  [ "$strat" = ss ] && extra=(strategy.num_regions=2)
  rm -rf "$run"; s=$(now)
  timeout -k 15 "$(reserve "$2" 20)" "${TORCHRUN[@]}" "${DATA[@]}" "${COMMON[@]}" strategy="$strat" "${extra[@]}" \
    profiler=trace "${TRACE[@]}" eval.enabled=false run_dir="$run"
  rc=$?; secs=$(since "$s"); t=$(part_limit 60)
  if [ $rc = 0 ] && [ "$t" != 0 ]; then timeout -k 5 "$t" "$PY" -m distnerf.profile report "$run" | head -40; rrc=${PIPESTATUS[0]}; fi
  helper report "${strat}_trace" "$run" "$rc" "$secs" "$rrc"
}
sec_ddp_trace() { sec_trace ddp "$1"; }
sec_ss_trace() { sec_trace ss "$1"; }

sec_hta_overlap() { timeout -k 5 "$1" "$PY" -m bench.gpu.check hta || helper failed hta_overlap "exited with $?"; }

sec_paths() {  # what users run, each short: ss with evaluation (segment fusion), ss joint, bf16, sampler=device
  local steps=(train.max_steps=30 eval.num_views=1 eval.lpips=false monitor.log_every=5) p what extra run s t
  local default="ss_fusion ss_joint bf16 sampler_device"
  # --cpu leaves ss_joint to the two_ranks section (two ranks, a resume and the fused evaluation: a superset)
  [ "$MODE" = cpu ] && { steps=(train.max_steps=8 eval.num_views=1 eval.lpips=false monitor.log_every=2)
                         default="ss_fusion bf16 sampler_device"; }
  for p in ${GPU_CHECK_PATHS:-$default}; do
    case $p in
      ss_fusion) what="strategy=ss, 2 regions, evaluated through segment fusion (timed)"
                 extra=(strategy=ss strategy.num_regions=2 eval.fusion_timing=true);;
      ss_joint) what="strategy=ss strategy.training=joint, 2 regions, evaluated"
                extra=(strategy=ss strategy.training=joint strategy.num_regions=2);;
      bf16) what="experiment=gpu (bf16 autocast, 8192 rays)"; extra=(experiment=gpu);;
      sampler_device) what="sampler=device (batches built on the device)"; extra=(sampler=device);;
      *) echo "gpu_check: GPU_CHECK_PATHS: unknown path $p" >&2; continue;;
    esac
    if [ "$p" = bf16 ] && [ "$CUDA" != 1 ]; then helper path_skipped "$p" "$what" "bf16 autocast needs CUDA"; continue; fi
    t=$(part_limit 60); if [ "$t" = 0 ]; then helper path_skipped "$p" "$what" "time (the section's cap)"; continue; fi
    run="$RUNS/path_$p"; rm -rf "$run"; s=$(now)
    timeout -k 15 "$t" "${TORCHRUN[@]}" "${DATA[@]}" "${extra[@]}" "${COMMON[@]}" "${steps[@]}" run_dir="$run"
    helper path "$p" "$run" "$?" "$(since "$s")" "$what"
  done
}

sec_two_ranks() {  # two ranks on the one device through gloo: train to a checkpoint, resume past it, evaluate
  local n=(16 24) strat extra run s t rc1 rc2 two torchrun2
  [ "$MODE" = cpu ] && n=(4 6)
  two=(monitor.progress=false logger.wandb.mode=disabled device=$DEVICE dist_backend=gloo eval.num_views=1
       eval.lpips=false monitor.log_every=2)
  torchrun2=("$PY" -m torch.distributed.run --standalone --nproc_per_node=2 -m distnerf.train)
  for strat in ${GPU_CHECK_TWO_RANKS:-$([ "$MODE" = cpu ] && echo ss_joint || echo "ddp ss_joint ss_joint_route")}; do
    case $strat in ddp) extra=(strategy=ddp);; ss_joint) extra=(strategy=ss strategy.training=joint);;
      ss_joint_route) extra=(strategy=ss strategy.training=joint strategy.joint_exchange=route);;
      *) echo "gpu_check: GPU_CHECK_TWO_RANKS: unknown strategy $strat" >&2; continue;; esac
    t=$(part_limit 90); if [ "$t" = 0 ]; then helper two_ranks_skipped "$strat" "time (the section's cap)"; continue; fi
    run="$RUNS/two_$strat"; rm -rf "$run"; s=$(now)
    timeout -k 15 "$t" "${torchrun2[@]}" "${DATA[@]}" "${extra[@]}" "${two[@]}" train.max_steps="${n[0]}" \
      checkpoints.every="${n[0]}" eval.enabled=false run_dir="$run"
    rc1=$?; rc2=-1; t=$(part_limit 90)
    if [ $rc1 = 0 ] && [ "$t" != 0 ]; then
      timeout -k 15 "$t" "${torchrun2[@]}" "${DATA[@]}" "${extra[@]}" "${two[@]}" train.max_steps="${n[1]}" \
        checkpoints.every=0 resume=true run_dir="$run"
      rc2=$?
    fi
    helper two_ranks "$strat" "$run" "$rc1" "$rc2" "$(since "$s")" "${n[0]}" "${n[1]}" "$DEVICE"
  done
}

sec_sync_debug() {
  timeout -k 10 "$1" "$PY" -m bench.gpu.check sync_debug "$MODE" "$SYNC_MODELS" "$SYNC_STEPS" "${DATA[@]}" \
    "${COMMON[@]}" eval.enabled=false profiler.telemetry=false || echo "sync_debug: rc $?"
}

sec_ops() {
  local s; rm -f "$RUNS/ops.json"; s=$(now)
  timeout -k 10 "$1" "$PY" -m bench.throughput.ops --label gpu_check --device "$DEVICE" "${OPS_DATA[@]}" \
    --configs "${OPS_CONFIGS[@]}" --out "$RUNS/ops.json"
  helper ops "$RUNS/ops.json" "$?" "$(since "$s")"
}

sec_sync_counter() {
  local s
  if [ ! -f bench/throughput/syncs.py ]; then helper skipped sync_counter "bench/throughput/syncs.py not in this checkout"; return; fi
  rm -f "$RUNS/bench_syncs.json"; s=$(now)
  timeout -k 10 "$1" "$PY" -m bench.throughput.syncs --label gpu_check "${SYNC_ARGS[@]}" --out "$RUNS/bench_syncs.json"
  helper sync_counter "$RUNS/bench_syncs.json" "$?" "$(since "$s")"
}

sec_nsys() {
  local s rc secs
  if [ "$CUDA" != 1 ]; then helper skipped nsys "needs CUDA"; return; fi
  if ! command -v nsys >/dev/null; then helper skipped nsys "nsys not on PATH"; return; fi
  rm -rf "$RUNS/nsys"; mkdir -p "$RUNS/nsys"; s=$(now)
  timeout -k 15 "$(reserve "$1" 20)" nsys profile -t cuda,nvtx,osrt --force-overwrite true -o "$RUNS/nsys/ddp1" \
    "${TORCHRUN[@]}" "${DATA[@]}" "${COMMON[@]}" train.max_steps=$NSYS_STEPS profiler.nvtx=true eval.enabled=false \
    run_dir="$RUNS/nsys/run"
  rc=$?; secs=$(since "$s")
  [ $rc = 0 ] && timeout 15 nsys stats --report nvtx_sum "$RUNS/nsys/ddp1.nsys-rep" > "$RUNS/nsys/nvtx_sum.txt" 2>&1
  helper nsys "$rc" "$secs" "$RUNS/nsys/ddp1.nsys-rep" "$RUNS/nsys/nvtx_sum.txt"
}

sec_study() {  # the characterisation on this GPU
  local conf=conf/study/gpu_one.yaml n s rc t
  if [ "$CUDA" != 1 ]; then
    n=$("$PY" -m distnerf.study list "$conf" | wc -l)  # the config expands (checked here, run on a GPU)
    helper skipped study "needs CUDA ($conf lists $n cells)"; return
  fi
  rm -rf "$RUNS/study"; s=$(now)
  DISTNERF_LEGO=$LEGO timeout -k 15 "$(reserve "$1" 30)" "$PY" -m distnerf.study run "$conf" "$RUNS/study"
  rc=$?; t=$(part_limit 30)
  [ -f "$RUNS/study/report/report.json" ] || [ "$t" = 0 ] ||
    DISTNERF_LEGO=$LEGO timeout -k 5 "$t" "$PY" -m distnerf.study report "$RUNS/study"
  helper study "$RUNS/study" "$rc" "$(since "$s")"
}

# ---------------------------------------------------------------------------- the run's plan, in order
for line in "${PLAN[@]}"; do
  read -r name cap <<< "$line"; cap=$((cap * SCALE))
  banner "$name" "$cap"
  want "$name" || continue
  t=$(limit "$cap")
  if [ "$t" = 0 ]; then helper skipped "$name" "time (the run's $BUDGET s spent before it)"; continue; fi
  SECTION_END=$(($(date +%s) + t)); s=$(now)
  "sec_$name" "$t"
  echo "$name $cap $(since "$s")" >> "$SECT/_timings.txt"
done

banner summary
helper merge "$OUT" "$MODE" "$RUN" "$T0" "$BUDGET"
