"""Soak: a long 2-rank run under torchrun, sampling what could leak (BENCHMARKS.md, "Soak").

    python -m bench.reliability.soak [--steps 5000] [--ckpt-every 200] [--interval 5] [--warmup-steps 1000]
                               [--out bench/reliability/results/soak/soak.json] [-- extra overrides]

Runs ``launch/torchrun_local.sh 2 RUN -- experiment=smoke train.max_steps=STEPS
checkpoints.every=CKPT profiler=trace profiler.max_step_records=RECORDS ...`` (``--max-step-records``,
default 1000: the step profiler's memory bound engages well inside the run) and every ``--interval`` seconds samples, for the
process tree below the launcher: resident memory (``VmRSS``) and open file descriptors of the
torchrun agent, of each trainer rank and of the sampler's worker processes; the files and
bytes under ``/dev/shm``; the run directory's size; and the run's last logged step. The
summary gives each series' change per 1,000 steps after ``--warmup-steps`` (least-squares
slope) and its range: flat means no growth beyond noise. Writes JSON with a ``meta`` block
(command, commit, load before/after).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import ROOT, default_out, start_meta, write_result


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        out.setdefault(ppid, []).append(int(stat.parent.name))
    return out


def _tree(pid: int) -> list[int]:
    kids, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _kind(pid: int) -> str | None:
    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace") \
        if Path(f"/proc/{pid}/cmdline").exists() else ""
    if "torch.distributed.run" in cmd:
        return "agent"
    if "distnerf.train" in cmd:
        return "rank"
    if "multiprocessing" in cmd or "forkserver" in cmd or "spawn_main" in cmd:
        return "worker"
    return None


def _rss_mb(pid: int) -> float:
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def _last_step(run: Path) -> int:
    path = run / "metrics.jsonl"
    last = 0
    for line in _read(str(path)).splitlines():
        if '"loss"' in line:
            try:
                last = json.loads(line)["step"]
            except (json.JSONDecodeError, KeyError):
                pass
    return last


def sample(root_pid: int, run: Path) -> dict:
    by_kind: dict[str, dict] = {}
    for pid in _tree(root_pid):
        kind = _kind(pid)
        if kind is None:
            continue
        k = by_kind.setdefault(kind, {"count": 0, "rss_mb": 0.0, "fds": 0, "rss_mb_max": 0.0})
        rss = _rss_mb(pid)
        k["count"] += 1
        k["rss_mb"] += rss
        k["rss_mb_max"] = max(k["rss_mb_max"], rss)
        k["fds"] += _fds(pid)
    shm = Path("/dev/shm")
    shm_files = list(shm.iterdir()) if shm.exists() else []
    return {"t": time.monotonic(), "step": _last_step(run), "procs": by_kind,
            "shm_files": len(shm_files), "shm_bytes": sum(f.stat().st_size for f in shm_files if f.is_file()),
            "run_dir_bytes": _dir_bytes(run) if run.exists() else 0}


def slope_per_1000(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (step, value), per 1,000 steps."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    var = sum((p[0] - mx) ** 2 for p in points)
    return 1000 * sum((p[0] - mx) * (p[1] - my) for p in points) / var if var else None


def summarise(samples: list[dict], warmup_steps: int) -> dict:
    # while every rank trains (not the start-up, not the exit) and after the warm-up
    count = lambda s, kind: s["procs"].get(kind, {}).get("count", 0)  # noqa: E731
    ranks, workers = (max((count(s, kind) for s in samples), default=0) for kind in ("rank", "worker"))
    after = [s for s in samples if s["step"] >= warmup_steps and count(s, "rank") == ranks
             and count(s, "worker") == workers]
    series = {"shm_files": lambda s: s["shm_files"], "shm_mb": lambda s: s["shm_bytes"] / 2**20,
              "run_dir_mb": lambda s: s["run_dir_bytes"] / 2**20}
    for kind in ("agent", "rank", "worker"):
        series[f"{kind}_rss_mb"] = lambda s, k=kind: s["procs"].get(k, {}).get("rss_mb", 0.0)
        series[f"{kind}_fds"] = lambda s, k=kind: s["procs"].get(k, {}).get("fds", 0)
        series[f"{kind}_count"] = lambda s, k=kind: s["procs"].get(k, {}).get("count", 0)
    out = {}
    for name, f in series.items():
        vals = [f(s) for s in after]
        out[name] = {"slope_per_1000_steps": slope_per_1000([(s["step"], f(s)) for s in after]),
                     "min": min(vals) if vals else None, "max": max(vals) if vals else None,
                     "first": vals[0] if vals else None, "last": vals[-1] if vals else None}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--ckpt-every", type=int, default=200)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--warmup-steps", type=int, default=1000)
    ap.add_argument("--max-step-records", type=int, default=1000)
    ap.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "bench" / "soak")
    ap.add_argument("--out", type=Path, default=default_out(__file__, "soak/soak.json"))
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    meta = start_meta()
    shutil.rmtree(args.run_dir, ignore_errors=True)
    cmd = ["bash", str(ROOT / "launch" / "torchrun_local.sh"), "2", str(args.run_dir), "--", "experiment=smoke", "device=cpu",
           f"train.max_steps={args.steps}", f"checkpoints.every={args.ckpt_every}", "profiler=trace",
           f"profiler.max_step_records={args.max_step_records}",
           "monitor.progress=false", "monitor.log_every=50", "logger.wandb.mode=disabled", *args.overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MAX_RESTARTS": "0", "WANDB_MODE": "disabled"}
    log = args.run_dir.with_suffix(".out")
    log.parent.mkdir(parents=True, exist_ok=True)
    shm_before = len(list(Path("/dev/shm").iterdir()))
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        samples = []
        while proc.poll() is None:
            samples.append(sample(proc.pid, args.run_dir))
            time.sleep(args.interval)
        rc = proc.wait()
    time.sleep(1.0)
    report = {"command": cmd, "rc": rc, "steps": args.steps, "ckpt_every": args.ckpt_every,
              "interval_s": args.interval, "warmup_steps": args.warmup_steps, "samples": samples,
              "summary": summarise(samples, args.warmup_steps), "last_step": _last_step(args.run_dir),
              "shm_files_before": shm_before, "shm_files_after": len(list(Path("/dev/shm").iterdir())),
              "checkpoints_kept": sorted(p.name for p in (args.run_dir / "checkpoints").glob("step_*"))}
    write_result(args.out, report, meta)
    for name, s in report["summary"].items():
        print(f"{name:16s} slope/1000 steps {s['slope_per_1000_steps'] if s['slope_per_1000_steps'] is None else round(s['slope_per_1000_steps'], 3)}"
              f"  range {s['min']}..{s['max']}")
    print(f"rc {rc}, last step {report['last_step']}, /dev/shm files {shm_before} -> {report['shm_files_after']}")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
