#!/usr/bin/env bash
# Everything one GPU can check, in one run of at most ~8 minutes (issue 14, item 7); supersedes
# bench/gpu/profile_gpu.sh and the CUDA tests of bench/gpu/sampler_gpu.sh (not its sampler
# throughput comparison). Run on a lent H200 on 2026-12-04 (torch 2.11.0+cu130; bench/gpu/README.md,
# bench/gpu/results/gpu_check_h200). Run it through tools/gpu_check.sh, from the repository root:
#
#   bash tools/gpu_check.sh [--out DIR] [--runs DIR]      # on a CUDA machine (default)
#   bash tools/gpu_check.sh --cpu [--out DIR] [--runs DIR] # the same script end to end on the CPU,
#                                                          # tiny sizes, gloo: about a minute
#   bash tools/gpu_check.sh --prepare                      # here, before a device run (below)
#
# Sections, each with its own time limit inside one overall budget (GPU_CHECK_BUDGET_S, default
# 470 s; a section that would start past it is "skipped: time budget ..."):
#   env            torch, CUDA, GPU, driver, NCCL, /dev/shm, nsys, commit
#   cuda_tests     `pytest -k cuda` over the unit tests that mention CUDA (the device and pipelined
#                  sampler on CUDA, the device/NVML mapping, ...); the CUDA-only ones skip on the CPU
#   sweep          bench/gpu/sweep.py (issue 49 item 8): rays/s and samples/s at lego's final grid for the
#                  eager, graph (train.cuda_graph: the whole step as one CUDA graph), compiled and graphed
#                  (reduce-overhead) static step over sample budgets 2^16-2^20, bf16 in two; --cpu: the
#                  built-in scene, eager at two small budgets and the graph's body uncaptured
#   lego_quality   the lego 2-minute run (dataset=blender dataset.root=$LEGO train.max_minutes=2,
#                  default grid model, 25 test views): PSNR/SSIM, training and evaluation rays/s
#   ddp_trace      1-rank torchrun (NCCL; gloo with --cpu) strategy=ddp profiler=trace, then
#                  `python -m distnerf.profile report RUN`: step time, phase shares, rays/s, comm
#   ss_trace       the same with strategy=ss strategy.num_regions=2
#   paths          what users run, 30 steps each with evaluation: ss (segment fusion), ss joint, bf16
#                  (experiment=gpu; CUDA only), sampler=device: status, PSNR, rays/s, peak memory
#   two_ranks      issue 50 item 6: 2 ranks on the one device (dist_backend=gloo: gloo carries the CUDA
#                  tensors, so the ranks may share a GPU; a check, not a way to train), for each strategy
#                  of GPU_CHECK_TWO_RANKS (default "ddp ss_joint ss_joint_route", the last joint ss with
#                  strategy.joint_exchange=route; --cpu: "ss_joint", the launch tests
#                  cover ddp's): train with a checkpoint, resume past it, evaluate (ss: segment fusion)
#   hta_overlap    HolisticTraceAnalysis communication/computation overlap of the two kernel traces
#   sync_debug     torch.cuda.set_sync_debug_mode("warn") over a few training steps of each model
#                  (GPU_CHECK_SYNC_MODELS, default "grid ngp nerf"): warnings per step and where
#   ops            bench/throughput/ops.py: ATen operators per training step on this device (issue 49: <= 250)
#   sync_counter   bench/throughput/syncs.py (counts the would-be syncs on the CPU, any machine), if present
#   study          issue 50 item 7, last: conf/study/gpu_one.yaml (ddp and joint ss at 1 and 2 ranks on
#                  lego, 2 ranks sharing the GPU through gloo): its report's cells (PSNR, step time,
#                  exposed communication) and the scaling model's device speed from this GPU; --cpu: the
#                  study's cells are listed (the config checked), not run
#   nsys           an Nsight Systems capture of a short 1-rank run and its NVTX summary, if nsys is on PATH
# Each section's Python: bench/gpu/check.py. Writes OUT/summary.json (default bench/gpu/results/gpu_check/;
# every section with "status": "ok", "failed: why" or "skipped: why", and its numbers) and OUT/log.txt; the runs (traces, checkpoints
# off) go to RUNS (default runs/gpu_check, git-ignored).
#
# Environment: DISTNERF_LEGO (default ../shared/data/nerf_synthetic_half/lego), PYTHON (python3),
# GPU_CHECK_BUDGET_S, GPU_CHECK_SYNC_MODELS, GPU_CHECK_QUALITY_EXTRA (more overrides of the lego run),
# GPU_CHECK_ONLY (a space-separated list of sections to run; the rest are "skipped: not selected"),
# GPU_CHECK_PATHS (which of the paths section's runs: default "ss_fusion ss_joint bf16 sampler_device"; --cpu: no ss_joint),
# GPU_CHECK_TWO_RANKS (the two_ranks section's strategies),
# GPU_CHECK_COMMIT (recorded where the checkout has no .git). The lego run is bounded by time, not
# steps (train.max_steps=1000000): its learning-rate decay follows steps (train.decay_steps), so a
# faster GPU decays further within the 2 minutes.
#
# On this workplace's device machine (one H200; see /work/.library/device/README.md). Nothing
# outside the repository travels (../shared stays behind) and the machine has no package index:
#  1. here, once: `bash tools/gpu_check.sh --prepare` copies lego's train and test splits (37 MB)
#     into .gpu_data/lego (git-ignored through .git/info/exclude) and downloads the pure-Python
#     wheels the machine lacks into .whl (git-ignored): hydra-core, omegaconf, antlr4 (built here:
#     it has no wheel), HolisticTraceAnalysis and plotly (HTA imports it). About 49 MB travel in all.
#  2. run (timeout_s 540 leaves the device time of a machine start; python3 there has torch+CUDA):
#       run(carry=[".whl", ".gpu_data"], timeout_s=540, command=
#         "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site
#          .whl/*.whl && export PYTHONPATH=/tmp/site || exit; DISTNERF_LEGO=.gpu_data/lego
#          GPU_CHECK_COMMIT=<git rev-parse --short HEAD, written here> bash tools/gpu_check.sh --out $OUT/gpu_check")
#     $OUT/gpu_check/summary.json and log.txt come back; copy them to bench/gpu/results/gpu_check/.
#     (where .git does not travel, the commit comes from GPU_CHECK_COMMIT).
# Known there: torch 2.11 (pyproject asks >= 2.13; the code runs from the tree via PYTHONPATH, not
# installed), no wandb (every run here sets logger.wandb.mode=disabled), no LPIPS weights
# (eval.lpips=false), nsys not on PATH (the nsys section skips).
set -uo pipefail
MODE=gpu; OUT=bench/gpu/results/gpu_check; RUNS=runs/gpu_check; PREPARE=0
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) MODE=cpu; shift;; --out) OUT=$2; shift 2;; --runs) RUNS=$2; shift 2;; --prepare) PREPARE=1; shift;;
    -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0;;
    *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2;;
  esac
done
cd "$(dirname "$0")/../.." || exit 2
PY=${PYTHON:-python3}
LEGO=${DISTNERF_LEGO:-../shared/data/nerf_synthetic_half/lego}

if [ "$PREPARE" = 1 ]; then  # here, with network: the data subset and the wheels for the device machine
  set -e
  mkdir -p .git/info && for p in /.gpu_data/ /.whl/; do
    grep -qxF "$p" .git/info/exclude 2>/dev/null || echo "$p" >> .git/info/exclude; done
  mkdir -p .gpu_data/lego .whl
  cp -r "$LEGO"/train "$LEGO"/test "$LEGO"/transforms_*.json .gpu_data/lego/
  # the versions of this environment (tested here), else these
  pins=$($PY -m bench.gpu.check versions)
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl $(echo "$pins" | grep -v antlr4)
  # omegaconf 2.3's grammar was generated by antlr 4.9 (an antlr4 4.13 runtime refuses it: "Could not
  # deserialize ATN with version 3"), so the runtime is pinned, whatever this environment has; no wheel on PyPI
  rm -f .whl/antlr4_python3_runtime-*.whl; $PY -m pip wheel -q --no-deps antlr4-python3-runtime==4.9.3 -w .whl
  du -sh .gpu_data .whl; exit 0
fi

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 WANDB_MODE=disabled
if [ "$MODE" = cpu ]; then
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}; BUDGET=${GPU_CHECK_BUDGET_S:-200}; DEVICE=cpu
else
  BUDGET=${GPU_CHECK_BUDGET_S:-470}; DEVICE=cuda
fi
mkdir -p "$OUT" "$RUNS/sections" || exit 2
OUT=$(cd "$OUT" && pwd); RUNS=$(cd "$RUNS" && pwd); SECT=$RUNS/sections; rm -f "$SECT"/*.json
exec > >(tee "$OUT/log.txt") 2>&1
T0=$(date +%s); DEADLINE=$((T0 + BUDGET))

export GC_SECT=$SECT GC_RUNS=$RUNS
helper() { "$PY" -m bench.gpu.check "$@"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.2f", b - a}'; }
# limit WANT: seconds a section may take, at most what is left of the budget (0: none left)
limit() { local left=$((DEADLINE - $(date +%s) - 5)); [ "$left" -lt 15 ] && { echo 0; return; }
          [ "$1" -lt "$left" ] && echo "$1" || echo "$left"; }
banner() { echo; echo "=== $1 ($(($(date +%s) - T0)) s of $BUDGET s)"; }
# want NAME: the section is selected (GPU_CHECK_ONLY unset, or it names NAME); else it is recorded as skipped
want() { [ -z "${GPU_CHECK_ONLY:-}" ] && return 0; case " $GPU_CHECK_ONLY " in *" $1 "*) return 0;; esac
         helper skipped "$1" "not selected (GPU_CHECK_ONLY=$GPU_CHECK_ONLY)"; return 1; }
ORDER="env ops cuda_tests sweep lego_quality ddp_trace ss_trace paths two_ranks hta_overlap sync_debug sync_counter nsys study"
COMMON=(train.progress=false train.ckpt_every=-1 logger.wandb.mode=disabled device=$DEVICE)
if [ "$MODE" = cpu ]; then
  DATA=(experiment=smoke); DATA_NAME="built-in scene (experiment=smoke; --cpu)"
  TRACE=(train.max_steps=8 profiler.trace.wait=2 profiler.trace.warmup=1 profiler.trace.active=2)
  QUALITY=(train.max_steps=20 eval.num_views=2); SYNC_MODELS=${GPU_CHECK_SYNC_MODELS:-grid}; SYNC_STEPS=4
  SYNC_ARGS=(--configs grid --step 2); NSYS_STEPS=10; OPS_CONFIGS=(smoke_grid)
else
  DATA=(dataset=blender "dataset.root=$LEGO"); DATA_NAME=$LEGO
  TRACE=(train.max_steps=40 profiler.trace.wait=20 profiler.trace.warmup=2 profiler.trace.active=3 profiler.nvtx=true)
  # 25 test views (as the CPU's 2-minute figure): 200 did not end inside the section's 240 s on an H200
  QUALITY=(train.max_minutes=2 train.max_steps=1000000 eval.num_views=25 eval.lpips=false ${GPU_CHECK_QUALITY_EXTRA:-})
  SYNC_MODELS=${GPU_CHECK_SYNC_MODELS:-grid ngp nerf}; SYNC_STEPS=12; SYNC_ARGS=(); NSYS_STEPS=40
  OPS_CONFIGS=(lego_grid lego_grid_64_rays smoke_ngp)
fi
TORCHRUN=("$PY" -m torch.distributed.run --standalone --nproc_per_node=1 -m distnerf.train)
echo "gpu_check: mode $MODE, out $OUT, runs $RUNS, data $DATA_NAME, budget $BUDGET s"

# ---------------------------------------------------------------------------- sections
banner env
helper env "$MODE"
CUDA=$(helper cuda_available 2>/dev/null || echo 0)
[ "$MODE" = cpu ] && CUDA=0

banner ops
t=$(limit 60); if ! want ops; then :; elif [ "$t" = 0 ]; then helper skipped ops "time budget of $BUDGET s spent"; else
  s=$(now); timeout -k 10 "$t" "$PY" -m bench.throughput.ops --label gpu_check --device "$DEVICE" \
    --configs "${OPS_CONFIGS[@]}" --out "$RUNS/ops.json"
  helper ops "$RUNS/ops.json" "$?" "$(since "$s")"
fi

banner cuda_tests
t=$(limit 90); if ! want cuda_tests; then :; elif [ "$t" = 0 ]; then helper skipped cuda_tests "time budget of $BUDGET s spent"; else
  files=$(grep -lis cuda tests/unit/test_*.py | tr '\n' ' ')
  s=$(now); timeout -k 10 "$t" "$PY" -m pytest -q -rs -p no:cacheprovider $files -k cuda --junitxml="$RUNS/cuda_tests.xml"
  rc=$?; helper tests "$RUNS/cuda_tests.xml" "$rc" "$(since "$s")" "$CUDA"
fi

banner sweep
t=$(limit 170); if ! want sweep; then :; elif [ "$t" = 0 ]; then helper skipped sweep "time budget of $BUDGET s spent"; else
  SWEEP_DATA=(); [ "$MODE" = cpu ] || SWEEP_DATA=(--data "$LEGO")
  timeout -k 15 "$t" "$PY" -m bench.gpu.sweep --mode "$([ "$CUDA" = 1 ] && echo cuda || echo cpu)" "${SWEEP_DATA[@]}" \
    --seconds $((t - 45)) --runs "$RUNS/sweep"
  rc=$?; [ -f "$SECT/sweep.json" ] || helper failed sweep "bench.gpu.sweep exited with $rc before writing (see log.txt)"
fi

banner lego_quality
t=$(limit 240); if ! want lego_quality; then :; elif [ "$t" = 0 ]; then helper skipped lego_quality "time budget of $BUDGET s spent"; else
  rm -rf "$RUNS/lego"; s=$(now)
  timeout -k 15 "$t" "$PY" -m distnerf.train "${DATA[@]}" "${COMMON[@]}" "${QUALITY[@]}" run_dir="$RUNS/lego"
  helper quality "$RUNS/lego" "$?" "$(since "$s")" "$DATA_NAME"
fi

for strat in ddp ss; do
  banner ${strat}_trace
  want ${strat}_trace || continue
  t=$(limit 75); if [ "$t" = 0 ]; then helper skipped ${strat}_trace "time budget of $BUDGET s spent"; continue; fi
  extra=(); [ $strat = ss ] && extra=(strategy.num_regions=2)
  run="$RUNS/$strat"; rm -rf "$run"; s=$(now)
  timeout -k 15 "$t" "${TORCHRUN[@]}" "${DATA[@]}" "${COMMON[@]}" strategy=$strat "${extra[@]}" profiler=trace \
    "${TRACE[@]}" eval.enabled=false run_dir="$run"
  rc=$?; secs=$(since "$s"); rrc=1
  if [ $rc = 0 ]; then timeout -k 5 60 "$PY" -m distnerf.profile report "$run" | head -40; rrc=${PIPESTATUS[0]}; fi
  helper report ${strat}_trace "$run" "$rc" "$secs" "$rrc"
done

# what users run, each short: ss with evaluation (segment fusion), ss joint, bf16 (experiment=gpu), sampler=device
banner paths
rm -f "$SECT/paths.json"
if want paths; then
PATH_STEPS=(train.max_steps=30 eval.num_views=1 eval.lpips=false train.log_every=5)
[ "$MODE" = cpu ] && PATH_STEPS=(train.max_steps=8 eval.num_views=1 eval.lpips=false train.log_every=2)
# --cpu leaves ss_joint to the two_ranks section (two ranks, a resume and the fused evaluation: a superset)
PATHS_DEFAULT="ss_fusion ss_joint bf16 sampler_device"; [ "$MODE" = cpu ] && PATHS_DEFAULT="ss_fusion bf16 sampler_device"
for p in ${GPU_CHECK_PATHS:-$PATHS_DEFAULT}; do
  case $p in
    ss_fusion) what="strategy=ss, 2 regions, evaluated through segment fusion (timed)"; extra=(strategy=ss strategy.num_regions=2 eval.fusion_timing=true);;
    ss_joint) what="strategy=ss strategy.training=joint, 2 regions, evaluated"; extra=(strategy=ss strategy.training=joint strategy.num_regions=2);;
    bf16) what="experiment=gpu (bf16 autocast, 8192 rays)"; extra=(experiment=gpu);;
    sampler_device) what="sampler=device (batches built on the device)"; extra=(sampler=device);;
  esac
  if [ $p = bf16 ] && [ "$CUDA" != 1 ]; then helper path_skipped $p "$what" "bf16 autocast needs CUDA"; continue; fi
  t=$(limit 60); if [ "$t" = 0 ]; then helper path_skipped $p "$what" "time budget of $BUDGET s spent"; continue; fi
  run="$RUNS/path_$p"; rm -rf "$run"; s=$(now)
  timeout -k 15 "$t" "${TORCHRUN[@]}" "${DATA[@]}" "${extra[@]}" "${COMMON[@]}" "${PATH_STEPS[@]}" run_dir="$run"
  helper path $p "$run" "$?" "$(since "$s")" "$what"
done
fi
# two ranks on the one device through gloo: train to a checkpoint, resume past it, evaluate
banner two_ranks
rm -f "$SECT/two_ranks.json"
if want two_ranks; then
TWO_STEPS=(16 24); [ "$MODE" = cpu ] && TWO_STEPS=(4 6)
TWO=(train.progress=false logger.wandb.mode=disabled device=$DEVICE dist_backend=gloo eval.num_views=1
     eval.lpips=false train.log_every=2)
TORCHRUN2=("$PY" -m torch.distributed.run --standalone --nproc_per_node=2 -m distnerf.train)
for strat in ${GPU_CHECK_TWO_RANKS:-$([ "$MODE" = cpu ] && echo ss_joint || echo "ddp ss_joint ss_joint_route")}; do
  case $strat in ddp) extra=(strategy=ddp);; ss_joint) extra=(strategy=ss strategy.training=joint);;
    ss_joint_route) extra=(strategy=ss strategy.training=joint strategy.joint_exchange=route);;
    *) echo "gpu_check: GPU_CHECK_TWO_RANKS: unknown strategy $strat" >&2; continue;; esac
  t=$(limit 90); if [ "$t" = 0 ]; then helper two_ranks_skipped $strat "time budget of $BUDGET s spent"; continue; fi
  run="$RUNS/two_$strat"; rm -rf "$run"; s=$(now)
  timeout -k 15 "$t" "${TORCHRUN2[@]}" "${DATA[@]}" "${extra[@]}" "${TWO[@]}" train.max_steps=${TWO_STEPS[0]} \
    train.ckpt_every=${TWO_STEPS[0]} eval.enabled=false run_dir="$run"
  rc1=$?; rc2=-1
  t=$(limit 90)
  if [ $rc1 = 0 ] && [ "$t" != 0 ]; then
    timeout -k 15 "$t" "${TORCHRUN2[@]}" "${DATA[@]}" "${extra[@]}" "${TWO[@]}" train.max_steps=${TWO_STEPS[1]} \
      train.ckpt_every=0 resume=true run_dir="$run"
    rc2=$?
  fi
  helper two_ranks $strat "$run" "$rc1" "$rc2" "$(since "$s")" "${TWO_STEPS[0]}" "${TWO_STEPS[1]}" "$DEVICE"
done
fi
want hta_overlap && helper hta

banner sync_debug
t=$(limit 120); if ! want sync_debug; then :; elif [ "$t" = 0 ]; then helper skipped sync_debug "time budget of $BUDGET s spent"; else
  timeout -k 10 "$t" "$PY" -m bench.gpu.check sync_debug "$MODE" "$SYNC_MODELS" "$SYNC_STEPS" "${DATA[@]}" "${COMMON[@]}" \
    eval.enabled=false profiler.telemetry=false || echo "sync_debug: rc $?"
fi

banner sync_counter
t=$(limit 90)
if ! want sync_counter; then :
elif [ ! -f bench/throughput/syncs.py ]; then helper skipped sync_counter "bench/throughput/syncs.py not in this checkout"
elif [ "$t" = 0 ]; then helper skipped sync_counter "time budget of $BUDGET s spent"; else
  s=$(now); timeout -k 10 "$t" "$PY" -m bench.throughput.syncs --label gpu_check "${SYNC_ARGS[@]}" --out "$RUNS/bench_syncs.json"
  helper sync_counter "$RUNS/bench_syncs.json" "$?" "$(since "$s")"
fi

banner nsys
t=$(limit 90)
if ! want nsys; then :
elif [ "$CUDA" != 1 ]; then helper skipped nsys "needs CUDA"
elif ! command -v nsys >/dev/null; then helper skipped nsys "nsys not on PATH"
elif [ "$t" = 0 ]; then helper skipped nsys "time budget of $BUDGET s spent"; else
  rm -rf "$RUNS/nsys"; mkdir -p "$RUNS/nsys"; s=$(now)
  timeout -k 15 "$t" nsys profile -t cuda,nvtx,osrt --force-overwrite true -o "$RUNS/nsys/ddp1" \
    "${TORCHRUN[@]}" "${DATA[@]}" "${COMMON[@]}" train.max_steps=$NSYS_STEPS profiler.nvtx=true eval.enabled=false \
    run_dir="$RUNS/nsys/run"
  rc=$?; secs=$(since "$s")
  [ $rc = 0 ] && timeout 60 nsys stats --report nvtx_sum "$RUNS/nsys/ddp1.nsys-rep" > "$RUNS/nsys/nvtx_sum.txt" 2>&1
  helper nsys "$rc" "$secs" "$RUNS/nsys/ddp1.nsys-rep" "$RUNS/nsys/nvtx_sum.txt"
fi

# the characterisation on this GPU (after every other section: it gets what the budget has left)
banner study
STUDY_CONF=conf/study/gpu_one.yaml
t=$(limit 300)
if ! want study; then :
elif [ "$CUDA" != 1 ]; then
  n=$("$PY" -m distnerf.study list "$STUDY_CONF" | wc -l)  # the config expands (checked here, run on a GPU)
  helper skipped study "needs CUDA ($STUDY_CONF lists $n cells)"
elif [ "$t" = 0 ]; then helper skipped study "time budget of $BUDGET s spent"; else
  rm -rf "$RUNS/study"; s=$(now)
  DISTNERF_LEGO=$LEGO timeout -k 15 "$t" "$PY" -m distnerf.study run "$STUDY_CONF" "$RUNS/study"
  rc=$?
  [ -f "$RUNS/study/report/report.json" ] || timeout -k 5 60 "$PY" -m distnerf.study report "$RUNS/study"
  helper study "$RUNS/study" "$rc" "$(since "$s")"
fi

banner summary
helper merge "$OUT" "$MODE" "$ORDER" "$T0" "$BUDGET"
