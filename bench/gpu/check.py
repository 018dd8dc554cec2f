"""The sections of the prepared GPU check (``bench/gpu/check.sh``, run through ``tools/gpu_check.sh``) and its
plan: which sections each run of at most :data:`RUN_LIMIT_S` seconds takes, in priority order, with a cap each.

    python -m bench.gpu.check SUBCOMMAND ARGS...

The shell script runs each section's commands under its cap; a subcommand here turns what they left (a run
directory, a report, a junit file, an exit status) into that section's JSON in the folder ``$GC_SECT``, and
``merge`` gathers the sections into ``OUT/summary.json``. Every section records ``"status"``: ``"ok"``,
``"failed: why"`` or ``"skipped: why"``, and its numbers. ``sync_debug`` trains a few steps itself
(``$GC_RUNS/sync_MODEL``). Subcommands that serve the script's set-up: ``plan RUN`` (the run's sections and caps,
one ``NAME CAP`` a line; ``all``: every section once), ``describe`` (the plan, readable), ``versions`` (the wheels
``--prepare`` downloads, pinned), ``prepared_size DIR...`` (refuses above :data:`PREPARE_LIMIT_MIB`) and
``cuda_available`` (prints 1 or 0); ``hta_trace DIR`` (the overlap of one trace folder) serves
``bench/gpu/profile_gpu.sh``.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

RUN_LIMIT_S = 420
"""A run's wall-clock limit on the GPU machine: its sections' caps plus :data:`STARTUP_S`."""
STARTUP_S = 20
"""Seconds of a run outside its sections: installing the prepared wheels, the CUDA probe, the summary."""
PREPARE_LIMIT_MIB = 60
"""``--prepare``'s data and wheels together may not exceed this (they go to the GPU machine with the working tree)."""

SECTIONS = {  # name: what it produces
    "env": "torch, CUDA, GPU, driver, NCCL; the C compiler (cc, gcc) and triton that inductor needs; /dev/shm, "
           "nsys, HTA, commit",
    "lego_1min": "lego (dataset=blender, default grid model) trained 1 minute, evaluated on all 200 test views: "
                 "PSNR/SSIM (also over the 25-view subset r_0, r_8, ...), the 200 views' evaluation seconds, "
                 "training and evaluation rays/s; stopped inside the evaluation: the views rendered and their rate",
    "lego_2min": "lego trained 2 minutes, 25 test views: PSNR/SSIM, training and evaluation rays/s",
    "lego_5min": "lego trained 5 minutes, 25 test views: PSNR/SSIM, training and evaluation rays/s",
    "sweep": "bench/gpu/sweep.py's first rows, each configuration its own process: the eager and graphed "
             "(torch.compile reduce-overhead) static step at 2^18 samples, then the hand-recorded CUDA graph: "
             "rays/s, samples/s, step ms, warm-up (compilation) seconds, peak memory",
    "sweep_more": "the sweep's other rows (compiled; budgets 2^16 and 2^20; bf16), each its own process",
    "cuda_tests": "pytest -m cuda over the unit tests marked cuda: passed, failed, skipped",
    "two_ranks": "2 ranks on the one GPU through gloo, per strategy (ddp, joint ss, joint ss routed): trained to a "
                 "checkpoint, resumed past it, evaluated; world size, device, PSNR",
    "sync_debug": "torch.cuda.set_sync_debug_mode('warn') over a few training steps of grid, ngp, nerf: "
                  "warnings per step and where",
    "ops": "bench/throughput/ops.py on the GPU: ATen operators per training step (lego grid, 64 rays, ngp)",
    "ddp_trace": "1-rank torchrun (NCCL) strategy=ddp profiler=trace and its report: step time, phase shares, "
                 "rays/s, communication",
    "ss_trace": "the same with strategy=ss strategy.num_regions=2",
    "hta_overlap": "HolisticTraceAnalysis communication/computation overlap of the two traces",
    "sync_counter": "bench/throughput/syncs.py: the would-be host syncs per step, counted on the CPU",
    "study": "conf/study/gpu_one.yaml (ddp and joint ss at 1 and 2 ranks on lego): per cell PSNR, step time, "
             "exposed communication; the scaling model's device speed",
    "nsys": "an Nsight Systems capture of a short 1-rank run and its NVTX summary (nsys on PATH)",
    "paths": "what users run, 30 steps each with evaluation: ss (segment fusion), ss joint, bf16, sampler=device: "
             "status, PSNR, rays/s, peak memory",
}

RUNS = {  # run: [(section, cap in seconds)], priority order; each run's caps + STARTUP_S <= RUN_LIMIT_S
    1: [("env", 20), ("lego_1min", 210), ("sweep", 135), ("cuda_tests", 35)],
    2: [("env", 20), ("lego_2min", 190), ("two_ranks", 190)],
    3: [("env", 20), ("lego_5min", 370)],
    4: [("env", 20), ("sync_debug", 100), ("ops", 90), ("ddp_trace", 55), ("ss_trace", 60), ("hta_overlap", 10),
        ("sync_counter", 60)],
    5: [("env", 20), ("study", 330), ("nsys", 50)],
    6: [("env", 20), ("paths", 130), ("sweep_more", 250)],
}


def plan(run: str) -> list[tuple[str, int]]:
    """Run ``run``'s sections and caps in order; ``"all"``: every run's, each section once (the first cap),
    in the runs' order. Raises ValueError for a run not in :data:`RUNS`."""
    if run == "all":
        seen = {}
        for sections in RUNS.values():
            for name, cap in sections:
                seen.setdefault(name, cap)
        return list(seen.items())
    if not run.isdigit() or int(run) not in RUNS:
        raise ValueError(f"no run {run!r} in the GPU check's plan (runs {', '.join(map(str, RUNS))}, or all)")
    return list(RUNS[int(run)])


def describe() -> str:
    """The plan, readable: each run's sections in order with their caps and what each produces."""
    lines = []
    for run, sections in RUNS.items():
        total = sum(cap for _, cap in sections) + STARTUP_S
        lines.append(f"run {run} ({total} s of {RUN_LIMIT_S} s with {STARTUP_S} s of start-up):")
        lines += [f"  {name:12s} {cap:4d} s  {SECTIONS[name]}" for name, cap in sections]
    return "\n".join(lines)


def tree_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (``path`` itself if a file; links not followed)."""
    path = Path(path)
    if path.is_symlink() or not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def prepared_size(paths: list[Path], limit_mib: float = PREPARE_LIMIT_MIB) -> tuple[bool, str]:
    """Whether what ``--prepare`` wrote (``paths``) fits ``limit_mib`` MiB, and a line saying each path's size."""
    sizes = {str(p): tree_bytes(p) for p in paths}
    total = sum(sizes.values())
    each = ", ".join(f"{p} {b / 2**20:.1f} MiB" for p, b in sizes.items())
    ok = total <= limit_mib * 2**20
    verdict = "within" if ok else "above"
    return ok, f"prepared: {each}; {total / 2**20:.1f} MiB in all, {verdict} the {limit_mib:g} MiB limit"


def sections_dir() -> Path:
    """``$GC_SECT``: where each section's JSON goes (set by the script)."""
    return Path(os.environ["GC_SECT"])


def write(name, body):
    (sections_dir() / f"{name}.json").write_text(json.dumps(body, indent=1, default=str))


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
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
            out["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
            first = smi.stdout.strip().splitlines()[:1] if smi.returncode == 0 else []
            fields = [f.strip() for f in first[0].split(",")] if first else []
            out["driver"] = fields[1] if len(fields) > 1 else None
        except (OSError, subprocess.TimeoutExpired) as err:
            out["nvidia_smi"], out["driver"] = f"not run: {err}", None
    elif mode == "gpu":
        out["status"] = "failed: torch.cuda.is_available() is False on a GPU run (use --cpu)"
    try:
        st = os.statvfs("/dev/shm")
        out["dev_shm_free_mb"] = round(st.f_bavail * st.f_frsize / 2**20, 1)
    except OSError:
        out["dev_shm_free_mb"] = None
    from shutil import which
    out["nsys"] = which("nsys")
    # torch.compile's inductor (the sweep's compiled and graphed rows) needs triton and a C compiler on CUDA
    out["cc"] = tool_version(os.environ.get("CC") or "cc")
    out["gcc"] = tool_version("gcc")
    out["triton"] = next((v for v in map(package_version, ("triton", "pytorch-triton")) if v != "absent"), "absent")
    try:
        import hta  # noqa: F401
        out["hta"] = "importable"
    except Exception as err:
        out["hta"] = f"not importable: {err}"
    write("env", out)


def tool_version(command: str) -> str:
    """The first line of ``command --version`` and where it is, or ``"absent"`` (not on PATH)."""
    from shutil import which

    path = which(command)
    if path is None:
        return "absent"
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{path}: --version failed ({err})"
    first = (proc.stdout or proc.stderr).strip().splitlines()
    return f"{first[0] if first else '(no output)'} ({path})"


def package_version(name: str) -> str:
    """The installed version of distribution ``name``, or ``"absent"``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"


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
        f = sections_dir() / f"{name}.json"
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


def quality_section(name, run, rc, seconds, dataset):
    """Sections ``lego_1min``, ``lego_2min``, ``lego_5min``: the run's metrics.json (PSNR, SSIM, evaluation
    seconds and rays/s), its training rays/s, and the PSNR over the 25-view subset (:func:`psnr_subset`) where
    more views were evaluated. A run stopped inside its evaluation (no metrics.json, its renders begun) is
    failed with the views it rendered and their rate (:func:`partial_evaluation`)."""
    out = {"run_dir": run, "seconds": seconds, "rc": rc, "dataset": dataset}
    m = Path(run) / "metrics.json"
    log = Path(run) / "metrics.jsonl"
    rows = [json.loads(x) for x in log.read_text().splitlines() if x.strip()] if log.exists() else []
    train = [r for r in rows if "rays_per_s" in r]
    out.update(step=train[-1].get("step") if train else None,
               train_seconds=train[-1].get("train_seconds") if train else None,
               train_rays_per_s_median=statistics.median(r["rays_per_s"] for r in train[1:] or train) if train else None)
    if rc != 0 or not m.exists():
        out["status"] = status_of(rc, "training") if rc != 0 else f"failed: no {m}"
        partial = partial_evaluation(Path(run) / "test")
        if partial is not None:
            out["partial_evaluation"] = partial
            out["status"] += f" (inside the evaluation: {partial['views_rendered']} views rendered)"
        return write(name, out)
    metrics = json.loads(m.read_text())
    per_view = metrics.get("per_view", [])
    out.update(status="ok", step=metrics.get("step"), psnr=metrics.get("psnr"), ssim=metrics.get("ssim"),
               lpips=metrics.get("lpips"), lpips_reason=metrics.get("lpips_reason"),
               num_views=metrics.get("protocol", {}).get("num_views"),
               resolution=metrics.get("protocol", {}).get("resolution"),
               psnr_25_views=psnr_subset(per_view, 25),
               eval_rays_per_s=metrics.get("eval_rays_per_s"), eval_rays_per_s_median=metrics.get("eval_rays_per_s_median"),
               eval_seconds=sum(r.get("seconds", 0.0) for r in per_view))
    write(name, out)


def psnr_subset(per_view: list[dict], num_views: int) -> float | None:
    """Mean PSNR over the ``num_views`` evenly spaced views of an evaluation of every view (``per_view``'s
    ``view`` 0..N-1, N > ``num_views``; e.g. r_0, r_8, ... of lego's 200), the views at the PSNR cap left out as
    :func:`~distnerf.engine.evaluate.evaluate_run` leaves them; None for a smaller or partial evaluation."""
    from distnerf.engine.evaluate import select_views
    from distnerf.observe.metrics import PSNR_MAX_DB

    n = len(per_view)
    if n <= num_views or sorted(r["view"] for r in per_view) != list(range(n)):
        return None
    keep = set(select_views(n, num_views))
    picked = [r["psnr"] for r in per_view if r["view"] in keep]
    scored = [p for p in picked if p < PSNR_MAX_DB] or picked
    return sum(scored) / len(scored)


def partial_evaluation(test_dir: Path) -> dict | None:
    """What an evaluation stopped part-way left in ``test_dir`` (one ``NNN_name_rgb.png`` a rendered view):
    the views rendered and their rate between the first and the last render's file times; None without renders."""
    renders = sorted(Path(test_dir).glob("*_rgb.png"), key=lambda f: f.stat().st_mtime)
    if not renders:
        return None
    span = renders[-1].stat().st_mtime - renders[0].stat().st_mtime
    rate = (len(renders) - 1) / span if len(renders) > 1 and span > 0 else None
    return {"views_rendered": len(renders), "first_to_last_s": round(span, 2),
            "views_per_s": rate, "seconds_per_200_views": 200 / rate if rate else None}


def path_run(name, run, rc, seconds, what):
    """One of the user paths (section "paths"): status, steps, PSNR, step time, peak memory."""
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
    add_run("paths", name, out)


def path_skipped(name, what, reason):
    add_run("paths", name, {"what": what, "status": f"skipped: {reason}"})


def add_run(section, name, entry):
    """Record ``entry`` as run ``name`` of a section made of runs (``paths``, ``two_ranks``): the section is
    ok while every run is ok or skipped, else "failed: " and the failed runs' names."""
    f = sections_dir() / f"{section}.json"
    body = json.loads(f.read_text()) if f.exists() else {"runs": {}}
    body["runs"][name] = entry
    bad = [k for k, v in body["runs"].items() if not str(v["status"]).startswith(("ok", "skipped"))]
    body["status"] = "ok" if not bad else "failed: " + ", ".join(bad)
    write(section, body)


def two_ranks(strategy, run, rc_train, rc_resume, seconds, first, last, device):
    """Section "two_ranks": a 2-rank run through gloo on the one device, trained to ``first`` steps
    with a checkpoint there, resumed to ``last`` and evaluated. ok when both runs ended 0, the log
    has the resume at ``first`` and a step at ``last``, ``train.log`` names a world size of 2 with
    ``device`` (``cuda:0`` on a GPU run: both ranks on it) and ``metrics.json`` has a PSNR."""
    from distnerf.observe.logger import read_metrics_log

    run = Path(run)
    out = {"run_dir": str(run), "rc_train": rc_train, "rc_resume": rc_resume, "seconds": seconds}
    rows = read_metrics_log(run) if (run / "metrics.jsonl").exists() else []
    resumed = [r["step"] for r in rows if r.get("event") == "resumed"]
    steps = [r["step"] for r in rows if "rays_per_s" in r]
    log_text = (run / "train.log").read_text() if (run / "train.log").exists() else ""
    where = re.search(r"world size (\d+); backend (\S+); device (\S+)", log_text)
    out.update(resumed_at=resumed, last_step=steps[-1] if steps else None,
               world_size=int(where.group(1)) if where else None, backend=where.group(2).rstrip(";") if where else None,
               device=where.group(3) if where else None)
    m = run / "metrics.json"
    metrics = json.loads(m.read_text()) if m.exists() else {}
    out["psnr"] = metrics.get("psnr")
    want_device = "cuda:0" if device == "cuda" else "cpu"
    problems = [p for p, bad in (
        (status_of(rc_train, "training"), rc_train != 0),
        (status_of(rc_resume, "the resumed run") if rc_resume >= 0 else "failed: not resumed", rc_resume != 0),
        (f"no resume at step {first} (resumed at {resumed})", resumed != [first]),
        (f"last step {out['last_step']}, not {last}", out["last_step"] != last),
        (f"world size {out['world_size']}, backend {out['backend']}, device {out['device']} (want 2, gloo, "
         f"{want_device})", (out["world_size"], out["backend"], out["device"]) != (2, "gloo", want_device)),
        (f"no PSNR in {m}", not isinstance(out["psnr"], (int, float))),
    ) if bad]
    out["status"] = "ok" if not problems else "failed: " + "; ".join(problems)
    add_run("two_ranks", strategy, out)


def study_section(study_dir, rc, seconds):
    """Section "study" (issue 50 item 7): ``conf/study/gpu_one.yaml``'s cells from its report: status,
    PSNR, step time, global rays/s and exposed communication per cell; the scaling model's inputs (its
    device speed: the world-size-1 ddp cell's seconds per ray on this GPU)."""
    report = Path(study_dir) / "report" / "report.json"
    out = {"study_dir": str(study_dir), "rc": rc, "seconds": seconds}
    if not report.exists():
        out["status"] = status_of(rc, "the study") if rc != 0 else f"failed: no {report}"
        return write("study", out)
    data = json.loads(report.read_text())
    cells = {}
    for c in data["cells"]:
        f = c.get("figures") or {}
        cells[c["id"]] = {"status": c["status"], "psnr": f.get("psnr"), "step_ms": 1e3 * f["step_s_median"]
                          if f.get("step_s_median") else None, "global_rays_per_s": f.get("global_rays_per_s"),
                          "exposed_comm_share": f.get("exposed_comm_share")}
    scaling = (data.get("tables") or {}).get("scaling") or {}
    out.update(cells=cells, scaling_inputs=scaling.get("inputs"), status_counts=data.get("status"))
    bad = [k for k, v in cells.items() if v["status"] != "done"]
    out["status"] = ("ok" if rc == 0 else status_of(rc, "the study")) if not bad else "failed: not done: " + ", ".join(bad)
    write("study", out)


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
    original = getattr(trainer_mod.Trainer, "step_once", None)  # the trainer's public step (fit's body)
    if original is not None:  # tag each warning with the step it came from (None: set-up)
        def tagged(self, *a, **k):
            current["step"] = int(self.step)
            return original(self, *a, **k)
        trainer_mod.Trainer.step_once = tagged
    events = []
    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            events.append((current["step"], f"{os.path.relpath(filename)}:{lineno}", str(message).splitlines()[0]))
    conf = str(Path.cwd() / "conf")
    for i, model in enumerate(models):
        sync_debug_write(out, cuda, models[i:])  # a timeout inside this model keeps the ones before it
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
        trainer_mod.Trainer.step_once = original
    sync_debug_write(out, cuda, [])


def sync_debug_write(out: dict, cuda: bool, pending: list[str]) -> None:
    """Section ``sync_debug`` as it stands: failed while ``pending`` models have not run (its cap ended it)."""
    errors = [f"{m}: {v['error']}" for m, v in out["models"].items() if v["error"]]
    if errors:
        out["status"] = "failed: " + "; ".join(errors)
    elif pending:
        out["status"] = f"failed: stopped before {', '.join(pending)} ended (the section's cap)"
    elif not cuda:
        out["status"] = (f"skipped: torch.cuda.set_sync_debug_mode needs CUDA (the harness ran "
                         f"{out['steps']} steps of {', '.join(out['models'])} on the CPU; nothing warns there)")
    else:
        out["status"] = "ok"
    write("sync_debug", out)


def counted_configs(name, path, rc, seconds, runner):
    """The ``gpu_check`` label's configurations of a counting runner's JSON (``runner`` wrote ``path``), or
    None after writing section ``name`` as failed; returns ``(configs, the section's record so far)``."""
    out = {"seconds": seconds, "rc": rc, "file": path}
    if rc != 0 or not Path(path).exists():
        out["status"] = status_of(rc, runner)
        write(name, out)
        return None, out
    return json.loads(Path(path).read_text()).get("gpu_check", {}).get("configs", {}), out


def sync_counter_section(path, rc, seconds):
    configs, out = counted_configs("sync_counter", path, rc, seconds, "bench/throughput/syncs.py")
    if configs is None:
        return
    out["configs"] = {name: {k: c[k]["total"] for k in ("count_step", "refresh_step") if k in c}
                      for name, c in configs.items()}
    out["by_location"] = {name: c["count_step"].get("by_location") for name, c in configs.items()
                          if "count_step" in c}
    out["status"] = "ok"
    write("sync_counter", out)


def ops_section(path, rc, seconds):
    """Operators per training step on this device (bench/throughput/ops.py; issue 49's target <= 250)."""
    configs, out = counted_configs("ops", path, rc, seconds, "bench/throughput/ops.py")
    if configs is None:
        return
    out["totals"] = {name: c["total"] for name, c in configs.items()}
    out["by_section"] = {name: c["by_section"] for name, c in configs.items()}
    out["status"] = "ok"
    write("ops", out)


def nsys_section(rc, seconds, rep, stats_file):
    out = {"seconds": seconds, "rc": rc, "report": rep}
    text = Path(stats_file).read_text() if Path(stats_file).exists() else ""
    out["nvtx_sum_head"] = text.splitlines()[:40]
    out["status"] = "ok" if rc == 0 and Path(rep).exists() else status_of(rc, "nsys profile")
    write("nsys", out)


def skipped(name, reason):
    write(name, {"status": f"skipped: {reason}"})


def merge(out_dir, mode, run, t0, budget):
    """``OUT/summary.json``: run ``run``'s sections in plan order, each with its cap and the seconds it took
    (``$GC_SECT/_timings.txt``, one ``NAME CAP SECONDS`` a line from the script)."""
    timings = {}
    f = sections_dir() / "_timings.txt"
    for line in (f.read_text().splitlines() if f.exists() else []):
        name, cap, secs = line.split()
        timings[name] = {"cap_s": float(cap), "section_s": float(secs)}
    sections = {}
    for name, _ in plan(run):
        f = sections_dir() / f"{name}.json"
        sections[name] = json.loads(f.read_text()) if f.exists() else {"status": "failed: no result (see log.txt)"}
        sections[name].update(timings.get(name, {}))
    summary = {"mode": mode, "run": run, "plan": [[n, c, SECTIONS[n]] for n, c in plan(run)],
               "started_unix": t0, "wall_s": round(time.time() - t0, 1), "budget_s": budget,
               "load_after": [round(x, 2) for x in os.getloadavg()], "sections": sections,
               "statuses": {k: v.get("status") for k, v in sections.items()}}
    Path(out_dir, "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    for k, v in summary["statuses"].items():
        print(f"  {k:13s} {v}")
    print(f"wrote {Path(out_dir, 'summary.json')} ({summary['wall_s']} s)")


def versions() -> None:
    """The pure-Python wheels the device machine lacks, pinned to this environment's versions (else the
    versions tested here): one ``name==version`` a line."""
    from importlib.metadata import PackageNotFoundError, version

    for name, known in (("hydra-core", "1.3.2"), ("omegaconf", "2.3.0"), ("HolisticTraceAnalysis", "0.5.0"),
                        ("plotly", "6.0.1")):
        try:
            print(f"{name}=={version(name)}")
        except PackageNotFoundError:
            print(f"{name}=={known}")


def hta_trace(traces: str) -> None:
    """Print HolisticTraceAnalysis's communication/computation overlap of rank 0's trace in the folder
    ``traces`` (``rank_0.*.json.gz``, as ``profiler=trace`` writes). Raises StopIteration when there is none."""
    from distnerf.observe.traces import hta_overlap

    print(hta_overlap({0: next(Path(traces).glob("rank_0.*.json.gz"))}))


def cuda_available() -> None:
    import torch

    print(int(torch.cuda.is_available()))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cmd, args = argv[0], argv[1:]
    if cmd == "versions":
        versions()
    elif cmd == "cuda_available":
        cuda_available()
    elif cmd == "plan":
        try:
            print("\n".join(f"{name} {cap}" for name, cap in plan(args[0])))
        except ValueError as err:
            raise SystemExit(f"bench.gpu.check: {err}")
    elif cmd == "describe":
        print(describe())
    elif cmd == "prepared_size":
        ok, line = prepared_size([Path(a) for a in args])
        print(line)
        if not ok:
            raise SystemExit(f"bench.gpu.check: --prepare wrote more than {PREPARE_LIMIT_MIB} MiB; make the "
                             f"copied splits or the wheels smaller")
    elif cmd == "hta_trace":
        hta_trace(args[0])
    elif cmd == "env":
        env_section(args[0])
    elif cmd == "tests":
        tests_section(args[0], int(args[1]), float(args[2]), args[3] == "1")
    elif cmd == "report":
        report_section(args[0], args[1], int(args[2]), float(args[3]), int(args[4]))
    elif cmd == "hta":
        hta_section()
    elif cmd == "quality":
        quality_section(args[0], args[1], int(args[2]), float(args[3]), args[4])
    elif cmd == "sync_debug":
        sync_debug(args[0], args[1].split(), int(args[2]), args[3:])
    elif cmd == "sync_counter":
        sync_counter_section(args[0], int(args[1]), float(args[2]))
    elif cmd == "ops":
        ops_section(args[0], int(args[1]), float(args[2]))
    elif cmd == "nsys":
        nsys_section(int(args[0]), float(args[1]), args[2], args[3])
    elif cmd == "skipped":
        skipped(args[0], args[1])
    elif cmd == "failed":  # a section whose command wrote nothing
        write(args[0], {"status": f"failed: {args[1]}"})
    elif cmd == "path":
        path_run(args[0], args[1], int(args[2]), float(args[3]), args[4])
    elif cmd == "path_skipped":
        path_skipped(args[0], args[1], args[2])
    elif cmd == "two_ranks":
        two_ranks(args[0], args[1], int(args[2]), int(args[3]), float(args[4]), int(args[5]), int(args[6]), args[7])
    elif cmd == "two_ranks_skipped":
        add_run("two_ranks", args[0], {"status": f"skipped: {args[1]}"})
    elif cmd == "study":
        study_section(args[0], int(args[1]), float(args[2]))
    elif cmd == "merge":
        merge(args[0], args[1], args[2], float(args[3]), float(args[4]))
    else:
        raise SystemExit(f"bench.gpu.check: unknown subcommand {cmd!r}")


if __name__ == "__main__":
    main()
