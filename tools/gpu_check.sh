#!/usr/bin/env bash
# Everything one GPU can check, in one run of at most ~8 minutes (issue 14, item 7); supersedes
# bench/gpu/profile_gpu.sh and the CUDA tests of bench/gpu/sampler_gpu.sh (not its sampler
# throughput comparison). Run on a lent H200 on 2026-12-04 (torch 2.11.0+cu130; BENCHMARKS section 1, bench/gpu/results/gpu_check_h200). From the repository root:
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
#   lego_quality   the lego 2-minute run (dataset=blender dataset.root=$LEGO train.max_minutes=2,
#                  default grid model, 25 test views): PSNR/SSIM, training and evaluation rays/s
#   ddp_trace      1-rank torchrun (NCCL; gloo with --cpu) strategy=ddp profiler=trace, then
#                  `python -m distnerf.profile report RUN`: step time, phase shares, rays/s, comm
#   ss_trace       the same with strategy=ss strategy.num_regions=2
#   paths          what users run, 30 steps each with evaluation: ss (segment fusion), ss joint, bf16
#                  (experiment=gpu; CUDA only), sampler=device: status, PSNR, rays/s, peak memory
#   hta_overlap    HolisticTraceAnalysis communication/computation overlap of the two kernel traces
#   sync_debug     torch.cuda.set_sync_debug_mode("warn") over a few training steps of each model
#                  (GPU_CHECK_SYNC_MODELS, default "grid ngp nerf"): warnings per step and where
#   sync_counter   bench/throughput/syncs.py (counts the would-be syncs on the CPU, any machine), if present
#   nsys           an Nsight Systems capture of a short 1-rank run and its NVTX summary, if nsys is on PATH
# Writes OUT/summary.json (default bench/results/gpu_check/; every section with "status": "ok",
# "failed: why" or "skipped: why", and its numbers) and OUT/log.txt; the runs (traces, checkpoints
# off) go to RUNS (default runs/gpu_check, git-ignored).
#
# Environment: DISTNERF_LEGO (default ../shared/data/nerf_synthetic_half/lego), PYTHON (python3),
# GPU_CHECK_BUDGET_S, GPU_CHECK_SYNC_MODELS, GPU_CHECK_QUALITY_EXTRA (more overrides of the lego run),
# GPU_CHECK_ONLY (a space-separated list of sections to run; the rest are "skipped: not selected"),
# GPU_CHECK_PATHS (which of the paths section's runs: default "ss_fusion ss_joint bf16 sampler_device"),
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
#     $OUT/gpu_check/summary.json and log.txt come back; copy them to bench/results/gpu_check/.
#     (where .git does not travel, the commit comes from GPU_CHECK_COMMIT).
# Known there: torch 2.11 (pyproject asks >= 2.13; the code runs from the tree via PYTHONPATH, not
# installed), no wandb (every run here sets logger.wandb.mode=disabled), no LPIPS weights
# (eval.lpips=false), nsys not on PATH (the nsys section skips).
set -uo pipefail
MODE=gpu; OUT=bench/results/gpu_check; RUNS=runs/gpu_check; PREPARE=0
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) MODE=cpu; shift;; --out) OUT=$2; shift 2;; --runs) RUNS=$2; shift 2;; --prepare) PREPARE=1; shift;;
    -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2;;
  esac
done
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
LEGO=${DISTNERF_LEGO:-../shared/data/nerf_synthetic_half/lego}

if [ "$PREPARE" = 1 ]; then  # here, with network: the data subset and the wheels for the device machine
  set -e
  mkdir -p .git/info && for p in /.gpu_data/ /.whl/; do
    grep -qxF "$p" .git/info/exclude 2>/dev/null || echo "$p" >> .git/info/exclude; done
  mkdir -p .gpu_data/lego .whl
  cp -r "$LEGO"/train "$LEGO"/test "$LEGO"/transforms_*.json .gpu_data/lego/
  # the versions of this environment (tested here), else these
  pins=$($PY - <<'VERSIONS'
from importlib.metadata import PackageNotFoundError, version
for name, known in (("hydra-core", "1.3.2"), ("omegaconf", "2.3.0"), ("HolisticTraceAnalysis", "0.5.0"),
                    ("plotly", "6.0.1")):
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        print(f"{name}=={known}")
VERSIONS
)
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl $(echo "$pins" | grep -v antlr4)
  # omegaconf 2.3's grammar was generated by antlr 4.9 (an antlr4 4.13 runtime refuses it: "Could not
  # deserialize ATN with version 3"), so the runtime is pinned, whatever this environment has; no wheel on PyPI
  rm -f .whl/antlr4_python3_runtime-*.whl; $PY -m pip wheel -q --no-deps antlr4-python3-runtime==4.9.3 -w .whl
  du -sh .gpu_data .whl; exit 0
fi

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 WANDB_MODE=disabled
if [ "$MODE" = cpu ]; then
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}; BUDGET=${GPU_CHECK_BUDGET_S:-170}; DEVICE=cpu
else
  BUDGET=${GPU_CHECK_BUDGET_S:-470}; DEVICE=cuda
fi
mkdir -p "$OUT" "$RUNS/sections" || exit 2
OUT=$(cd "$OUT" && pwd); RUNS=$(cd "$RUNS" && pwd); SECT=$RUNS/sections; rm -f "$SECT"/*.json
exec > >(tee "$OUT/log.txt") 2>&1
T0=$(date +%s); DEADLINE=$((T0 + BUDGET))
H=$RUNS/gpu_check_helper.py

# ---------------------------------------------------------------------------- helpers (Python)
cat > "$H" <<'PY'
"""gpu_check.sh's helpers: each subcommand writes one section's JSON (or merges them)."""
import glob, json, os, re, statistics, subprocess, sys, time, warnings
from pathlib import Path

SECT = Path(os.environ["GC_SECT"])


def write(name, body):
    (SECT / f"{name}.json").write_text(json.dumps(body, indent=1, default=str))


def status_of(rc, what="command"):
    return "ok" if rc == 0 else ("failed: timed out (rc 124)" if rc == 124 else f"failed: {what} exited with {rc}")


def env_section(mode):
    import torch
    out = {"status": "ok", "mode": mode, "torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
           "python": sys.version.split()[0], "cpu_count": os.cpu_count()}
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    out["git_commit"] = os.environ.get("GPU_CHECK_COMMIT") or git.stdout.strip() or None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    out["git_dirty"] = bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out.update(gpu=p.name, capability=f"{p.major}.{p.minor}", gpu_memory_gib=round(p.total_memory / 2**30, 1),
                   cuda=torch.version.cuda, nccl=".".join(map(str, torch.cuda.nccl.version())),
                   cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True)
        out["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    elif mode == "gpu":
        out["status"] = "failed: torch.cuda.is_available() is False on a GPU run (use --cpu)"
    try:
        st = os.statvfs("/dev/shm")
        out["dev_shm_free_mb"] = round(st.f_bavail * st.f_frsize / 2**20, 1)
    except OSError:
        out["dev_shm_free_mb"] = None
    from shutil import which
    out["nsys"] = which("nsys")
    try:
        import hta  # noqa: F401
        out["hta"] = "importable"
    except Exception as err:
        out["hta"] = f"not importable: {err}"
    write("env", out)


def tests_section(junit, rc, seconds, cuda):
    import xml.etree.ElementTree as ET
    out = {"seconds": seconds, "rc": rc}
    try:
        root = ET.parse(junit).getroot()
        cases = root.iter("testcase")
        rows = {"passed": [], "failed": [], "skipped": []}
        for c in cases:
            name = f"{c.get('classname')}::{c.get('name')}"
            if c.find("failure") is not None or c.find("error") is not None:
                rows["failed"].append(name)
            elif c.find("skipped") is not None:
                rows["skipped"].append(f"{name}: {c.find('skipped').get('message')}")
            else:
                rows["passed"].append(name)
        out.update({k: len(v) for k, v in rows.items()}, tests=rows)
    except (OSError, ET.ParseError) as err:
        out["status"] = f"failed: no junit report ({err}; pytest rc {rc})"
        return write("cuda_tests", out)
    if out["failed"] or rc not in (0, 5):
        out["status"] = f"failed: {out['failed']} failed (pytest rc {rc})"
    elif not cuda:
        out["status"] = (f"skipped: needs CUDA ({out['skipped']} CUDA tests skipped; the {out['passed']} "
                         f"selected tests that run without CUDA passed)")
    else:
        out["status"] = "ok"
    write("cuda_tests", out)


def report_section(name, run, rc, seconds, report_rc):
    out = {"run_dir": run, "seconds": seconds, "rc": rc, "report_rc": report_rc}
    rep = Path(run) / "profile" / "report.json"
    if rc != 0 or report_rc != 0 or not rep.exists():
        out["status"] = status_of(rc, "training") if rc != 0 else f"failed: report (rc {report_rc}, {rep} exists: {rep.exists()})"
        return write(name, out)
    r = json.loads(rep.read_text())
    overall = r.get("overall", {}).get("keys", {})
    out.update(status="ok", device=r.get("device"), world_size=r.get("world_size"),
               backend=(r.get("env") or {}).get("nccl") and "nccl" or "gloo",
               steps=r.get("overall", {}).get("num_steps"),
               step_ms_median=1000 * overall.get("step_s", {}).get("median", float("nan")),
               global_rays_per_s=r.get("global_rays_per_s"), shares=r.get("shares"),
               input_stall_share=r.get("input_stall_share"), exposed_comm_share=r.get("exposed_comm_share"),
               cpu_overlap=r.get("cpu_overlap"), collectives=r.get("collectives"), hta=r.get("hta"),
               telemetry=r.get("telemetry"), telemetry_nvml=r.get("telemetry_nvml"),
               top_ops={k: v.get("ops", [])[:8] for k, v in (r.get("top_ops") or {}).items()},
               traces=r.get("traces"), report_md=str(Path(run) / "profile" / "report.md"),
               # the DDP hook's / joint exchange's CUDA-event figures (NCCL): medians over the steps
               comm={k: (overall.get(k) or {}).get("median") for k in
                     ("comm_total_s", "comm_hidden_s", "bus_bandwidth_gbps", "comm_bytes", "exposed_comm",
                      "exchange_s")})
    write(name, out)


def hta_section():
    out = {}
    for name in ("ddp_trace", "ss_trace"):
        f = SECT / f"{name}.json"
        sec = json.loads(f.read_text()) if f.exists() else {"status": "failed: no section"}
        hta = sec.get("hta")
        if hta is not None and "per_rank" in hta:  # HTA's overlap is 0/0 (NaN) where no communication kernel ran
            hta = dict(hta, per_rank={r: (None if v != v else v) for r, v in hta["per_rank"].items()})
            if all(v is None for v in hta["per_rank"].values()):
                hta["note"] = "no communication kernels in the trace (world size 1): overlap undefined"
        out[name] = hta if hta is not None else {"skipped": f"no report ({sec.get('status')})"}
    got = [v for v in out.values() if "per_rank" in v]
    if got:
        out["status"] = "ok"
    else:
        reasons = sorted({v.get("skipped", "no result") for v in out.values()})
        out["status"] = "skipped: " + "; ".join(reasons)
    write("hta_overlap", out)


def quality_section(run, rc, seconds, dataset):
    out = {"run_dir": run, "seconds": seconds, "rc": rc, "dataset": dataset}
    m = Path(run) / "metrics.json"
    if rc != 0 or not m.exists():
        out["status"] = status_of(rc, "training") if rc != 0 else f"failed: no {m}"
        return write("lego_quality", out)
    metrics = json.loads(m.read_text())
    rows = [json.loads(x) for x in (Path(run) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train = [r for r in rows if "rays_per_s" in r]
    out.update(status="ok", step=metrics.get("step"), psnr=metrics.get("psnr"), ssim=metrics.get("ssim"),
               lpips=metrics.get("lpips"), lpips_reason=metrics.get("lpips_reason"),
               num_views=metrics.get("protocol", {}).get("num_views"),
               resolution=metrics.get("protocol", {}).get("resolution"),
               eval_rays_per_s=metrics.get("eval_rays_per_s"), eval_rays_per_s_median=metrics.get("eval_rays_per_s_median"),
               eval_seconds=sum(r.get("seconds", 0.0) for r in metrics.get("per_view", [])),
               train_seconds=train[-1].get("train_seconds") if train else None,
               train_rays_per_s_median=statistics.median(r["rays_per_s"] for r in train[1:] or train) if train else None)
    if out["eval_rays_per_s"] is None:
        out["eval_rays_per_s_note"] = "metrics.json has no eval_rays_per_s (engine/evaluate.py before it was added)"
    write("lego_quality", out)


def path_run(name, run, rc, seconds, what):
    """One of the user paths (section "paths"): status, steps, PSNR, step time, peak memory."""
    f = SECT / "paths.json"
    body = json.loads(f.read_text()) if f.exists() else {"runs": {}}
    out = {"what": what, "run_dir": run, "rc": rc, "seconds": seconds}
    m = Path(run) / "metrics.json"
    from distnerf.observe.logger import final_model_size, read_metrics_log

    rows = read_metrics_log(Path(run))
    steps = [r for r in rows if "rays_per_s" in r]
    size = final_model_size(rows) or {}
    if rc != 0 or not m.exists():
        out["status"] = status_of(rc, "training") if rc != 0 else f"failed: no {m}"
    else:
        metrics = json.loads(m.read_text())
        out.update(status="ok", psnr=metrics.get("psnr"), steps=steps[-1]["step"] if steps else None,
                   rays_per_s_median=statistics.median(r["rays_per_s"] for r in steps[1:] or steps) if steps else None,
                   peak_rss_mb=size.get("peak_rss_mb"), peak_device_memory_mb=size.get("peak_device_memory_mb"),
                   eval_rays_per_s=metrics.get("eval_rays_per_s"), fusion_timing=metrics.get("fusion_timing"))
    body["runs"][name] = out
    bad = [k for k, v in body["runs"].items() if not str(v["status"]).startswith(("ok", "skipped"))]
    body["status"] = "ok" if not bad else "failed: " + ", ".join(bad)
    write("paths", body)


def path_skipped(name, what, reason):
    f = SECT / "paths.json"
    body = json.loads(f.read_text()) if f.exists() else {"runs": {}, "status": "ok"}
    body["runs"][name] = {"what": what, "status": f"skipped: {reason}"}
    body.setdefault("status", "ok")
    write("paths", body)


def sync_debug(mode, models, steps, overrides):
    """A few training steps of each model with torch.cuda.set_sync_debug_mode("warn"): every
    implicit host sync of a CUDA op warns; the warnings are recorded per step and location."""
    import torch
    from hydra import compose, initialize_config_dir
    from distnerf.engine import trainer as trainer_mod
    from distnerf.train import run

    cuda = torch.cuda.is_available() and mode == "gpu"
    out = {"models": {}, "steps": steps, "overrides": overrides}
    current = {"step": None}
    original = getattr(trainer_mod.Trainer, "train_step", None)
    if original is not None:  # tag each warning with the step it came from (None: set-up, evaluation)
        def tagged(self, step, *a, **k):
            current["step"] = int(step)
            return original(self, step, *a, **k)
        trainer_mod.Trainer.train_step = tagged
    events = []
    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            events.append((current["step"], f"{os.path.relpath(filename)}:{lineno}", str(message).splitlines()[0]))
    conf = str(Path.cwd() / "conf")
    for model in models:
        events.clear(); current["step"] = None
        run_dir = Path(os.environ["GC_RUNS"]) / f"sync_{model}"
        with initialize_config_dir(config_dir=conf, version_base="1.3"):
            cfg = compose("train", overrides=[f"model={model}", *overrides, f"train.max_steps={steps}",
                                               f"run_dir={run_dir}"])
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                run(cfg)
                err = None
            except Exception as e:  # recorded, the other models still run
                err = f"{type(e).__name__}: {e}"
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode(0)
        per_step = {}
        for step, loc, _ in events:
            per_step.setdefault(step, []).append(loc)
        counted = [len(per_step.get(s, [])) for s in range(steps)]
        by_loc = {}
        for step, loc, _ in events:
            key = "set-up/evaluation" if step is None else "steps"
            by_loc.setdefault(key, {}).setdefault(loc, 0)
            by_loc[key][loc] += 1
        steady = counted[min(3, len(counted) - 1):] if counted else []
        out["models"][model] = {
            "error": err, "seconds": round(time.perf_counter() - t, 2), "per_step": counted,
            "per_step_median": statistics.median(steady) if steady else None, "per_step_max": max(steady, default=None),
            "outside_steps": len(per_step.get(None, [])),
            "by_location": {k: dict(sorted(v.items(), key=lambda kv: -kv[1])) for k, v in by_loc.items()},
            "first_messages": sorted({m for _, _, m in events})[:5]}
    if original is not None:  # the step tag off again: nothing after this section sees it
        trainer_mod.Trainer.train_step = original
    errors = [f"{m}: {v['error']}" for m, v in out["models"].items() if v["error"]]
    if errors:
        out["status"] = "failed: " + "; ".join(errors)
    elif not cuda:
        out["status"] = (f"skipped: torch.cuda.set_sync_debug_mode needs CUDA (the harness ran "
                         f"{steps} steps of {', '.join(models)} on the CPU; nothing warns there)")
    else:
        out["status"] = "ok"
    write("sync_debug", out)


def sync_counter_section(path, rc, seconds):
    out = {"seconds": seconds, "rc": rc, "file": path}
    if rc != 0 or not Path(path).exists():
        out["status"] = status_of(rc, "bench/throughput/syncs.py")
        return write("sync_counter", out)
    data = json.loads(Path(path).read_text())
    label = data.get("gpu_check", {})
    out["configs"] = {name: {k: c[k]["total"] for k in ("count_step", "refresh_step") if k in c}
                      for name, c in label.get("configs", {}).items()}
    out["by_location"] = {name: c["count_step"].get("by_location") for name, c in label.get("configs", {}).items()
                          if "count_step" in c}
    out["status"] = "ok"
    write("sync_counter", out)


def nsys_section(rc, seconds, rep, stats_file):
    out = {"seconds": seconds, "rc": rc, "report": rep}
    text = Path(stats_file).read_text() if Path(stats_file).exists() else ""
    out["nvtx_sum_head"] = text.splitlines()[:40]
    out["status"] = "ok" if rc == 0 and Path(rep).exists() else status_of(rc, "nsys profile")
    write("nsys", out)


def skipped(name, reason):
    write(name, {"status": f"skipped: {reason}"})


def merge(out_dir, mode, order, t0, budget):
    sections = {}
    for name in order:
        f = SECT / f"{name}.json"
        sections[name] = json.loads(f.read_text()) if f.exists() else {"status": "failed: no result (see log.txt)"}
    summary = {"mode": mode, "started_unix": t0, "wall_s": round(time.time() - t0, 1), "budget_s": budget,
               "load_after": [round(x, 2) for x in os.getloadavg()], "sections": sections,
               "statuses": {k: v.get("status") for k, v in sections.items()}}
    Path(out_dir, "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    for k, v in summary["statuses"].items():
        print(f"  {k:13s} {v}")
    print(f"wrote {Path(out_dir, 'summary.json')} ({summary['wall_s']} s)")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "env":
        env_section(args[0])
    elif cmd == "tests":
        tests_section(args[0], int(args[1]), float(args[2]), args[3] == "1")
    elif cmd == "report":
        report_section(args[0], args[1], int(args[2]), float(args[3]), int(args[4]))
    elif cmd == "hta":
        hta_section()
    elif cmd == "quality":
        quality_section(args[0], int(args[1]), float(args[2]), args[3])
    elif cmd == "sync_debug":
        sync_debug(args[0], args[1].split(), int(args[2]), args[3:])
    elif cmd == "sync_counter":
        sync_counter_section(args[0], int(args[1]), float(args[2]))
    elif cmd == "nsys":
        nsys_section(int(args[0]), float(args[1]), args[2], args[3])
    elif cmd == "skipped":
        skipped(args[0], args[1])
    elif cmd == "path":
        path_run(args[0], args[1], int(args[2]), float(args[3]), args[4])
    elif cmd == "path_skipped":
        path_skipped(args[0], args[1], args[2])
    elif cmd == "merge":
        merge(args[0], args[1], args[2].split(), float(args[3]), float(args[4]))
PY
export GC_SECT=$SECT GC_RUNS=$RUNS
helper() { "$PY" "$H" "$@"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.2f", b - a}'; }
# limit WANT: seconds a section may take, at most what is left of the budget (0: none left)
limit() { local left=$((DEADLINE - $(date +%s) - 5)); [ "$left" -lt 15 ] && { echo 0; return; }
          [ "$1" -lt "$left" ] && echo "$1" || echo "$left"; }
banner() { echo; echo "=== $1 ($(($(date +%s) - T0)) s of $BUDGET s)"; }
# want NAME: the section is selected (GPU_CHECK_ONLY unset, or it names NAME); else it is recorded as skipped
want() { [ -z "${GPU_CHECK_ONLY:-}" ] && return 0; case " $GPU_CHECK_ONLY " in *" $1 "*) return 0;; esac
         helper skipped "$1" "not selected (GPU_CHECK_ONLY=$GPU_CHECK_ONLY)"; return 1; }
ORDER="env cuda_tests lego_quality ddp_trace ss_trace paths hta_overlap sync_debug sync_counter nsys"
COMMON=(train.progress=false train.ckpt_every=-1 logger.wandb.mode=disabled device=$DEVICE)
if [ "$MODE" = cpu ]; then
  DATA=(experiment=smoke); DATA_NAME="built-in scene (experiment=smoke; --cpu)"
  TRACE=(train.max_steps=8 profiler.trace.wait=2 profiler.trace.warmup=1 profiler.trace.active=2)
  QUALITY=(train.max_steps=20 eval.num_views=2); SYNC_MODELS=${GPU_CHECK_SYNC_MODELS:-grid}; SYNC_STEPS=4
  SYNC_ARGS=(--configs grid --step 2); NSYS_STEPS=10
else
  DATA=(dataset=blender "dataset.root=$LEGO"); DATA_NAME=$LEGO
  TRACE=(train.max_steps=40 profiler.trace.wait=20 profiler.trace.warmup=2 profiler.trace.active=3 profiler.nvtx=true)
  # 25 test views (as the CPU's 2-minute figure): 200 did not end inside the section's 240 s on an H200
  QUALITY=(train.max_minutes=2 train.max_steps=1000000 eval.num_views=25 eval.lpips=false ${GPU_CHECK_QUALITY_EXTRA:-})
  SYNC_MODELS=${GPU_CHECK_SYNC_MODELS:-grid ngp nerf}; SYNC_STEPS=12; SYNC_ARGS=(); NSYS_STEPS=40
fi
TORCHRUN=("$PY" -m torch.distributed.run --standalone --nproc_per_node=1 -m distnerf.train)
echo "gpu_check.sh: mode $MODE, out $OUT, runs $RUNS, data $DATA_NAME, budget $BUDGET s"

# ---------------------------------------------------------------------------- sections
banner env
helper env "$MODE"
CUDA=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
[ "$MODE" = cpu ] && CUDA=0

banner cuda_tests
t=$(limit 90); if ! want cuda_tests; then :; elif [ "$t" = 0 ]; then helper skipped cuda_tests "time budget of $BUDGET s spent"; else
  files=$(grep -lis cuda tests/unit/test_*.py | tr '\n' ' ')
  s=$(now); timeout -k 10 "$t" "$PY" -m pytest -q -rs -p no:cacheprovider $files -k cuda --junitxml="$RUNS/cuda_tests.xml"
  rc=$?; helper tests "$RUNS/cuda_tests.xml" "$rc" "$(since "$s")" "$CUDA"
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
for p in ${GPU_CHECK_PATHS:-ss_fusion ss_joint bf16 sampler_device}; do
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
want hta_overlap && helper hta

banner sync_debug
t=$(limit 120); if ! want sync_debug; then :; elif [ "$t" = 0 ]; then helper skipped sync_debug "time budget of $BUDGET s spent"; else
  timeout -k 10 "$t" "$PY" "$H" sync_debug "$MODE" "$SYNC_MODELS" "$SYNC_STEPS" "${DATA[@]}" "${COMMON[@]}" \
    eval.enabled=false profiler.telemetry=false || echo "sync_debug: rc $?"
fi

banner sync_counter
t=$(limit 90)
if ! want sync_counter; then :
elif [ ! -f bench/throughput/syncs.py ]; then helper skipped sync_counter "bench/throughput/syncs.py not in this checkout"
elif [ "$t" = 0 ]; then helper skipped sync_counter "time budget of $BUDGET s spent"; else
  s=$(now); timeout -k 10 "$t" "$PY" bench/throughput/syncs.py --label gpu_check "${SYNC_ARGS[@]}" --out "$RUNS/bench_syncs.json"
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

banner summary
helper merge "$OUT" "$MODE" "$ORDER" "$T0" "$BUDGET"
