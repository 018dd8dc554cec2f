"""Profiling benchmarks: instrumentation overhead, trace sizes, reports of 2-rank runs.

    python -m bench.throughput.profile overhead --repeats 5 --steps 120
    python -m bench.throughput.profile paired --steps 600       # on/off drawn step by step within one run
    python -m bench.throughput.profile runs --steps 60          # 2-rank ddp and ss lego runs with profiler=trace

``overhead``: (1) in process, the cost of one step's instrumentation (begin_step, the
ten phases, end_step with its figures) against the same calls with the breakdown
disabled, over many iterations: a noise-free per-step figure; (2) end to end, single
process, OMP_NUM_THREADS=1, runs with ``profiler=off`` and ``profiler=default``
alternating (off, on, off, on, ...) in one invocation; per run the median step time
after ``--warmup`` steps (from the trainer's own ``train_seconds``, logged every step,
present in both modes), then per mode the median over runs and the spread of the run
medians (run-to-run noise).

``runs``: a 2-rank ``strategy=ddp`` and a 2-rank ``strategy=ss`` lego run with
``profiler=trace`` (default schedule); prints the trace size per rank and runs
``python -m distnerf.profile report`` on each (Markdown to stdout).

Each part writes its figures as JSON to ``--out`` (default ``bench/throughput/results/profile_PART.json``;
``runs`` embeds each run's ``profile/report.json``) with a ``meta`` block (command, date, git
commit, load before/after).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench.common import default_out, start_meta, write_result
from distnerf.observe.logger import read_metrics_log

LEGO = "../shared/data/nerf_synthetic_half/lego"
COMMON = ["device=cpu", "monitor.progress=false", "checkpoints.every=-1", "logger.wandb.mode=disabled"]


def train(cmd_prefix: list[str], run_dir: Path, overrides: list[str]) -> subprocess.CompletedProcess:
    cmd = [*cmd_prefix, "-m", "distnerf.train", f"run_dir={run_dir}", *COMMON, *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return proc


def step_times(run_dir: Path) -> list[float]:
    rows = read_metrics_log(run_dir)
    seconds = [r["train_seconds"] for r in rows if "loss" in r]
    return [b - a for a, b in zip(seconds, seconds[1:])]


def micro(iterations: int) -> dict:
    """Per-step cost (us) of the instrumentation calls, enabled vs disabled."""
    from distnerf.observe.breakdown import PHASES, StepProfiler
    from distnerf.schema import ProfilerConfig

    comm = {"in_hook_s": 1e-4, "last_return": time.perf_counter(), "spans": [(0.0, 1e-3), (1e-3, 2e-3)],
            "bytes": 1 << 20}
    out, cfg = {}, ProfilerConfig()
    for enabled in (False, True, False, True):
        prof = StepProfiler(torch.device("cpu"), world_size=2, skip_steps=cfg.skip_steps,
                            max_records=cfg.max_step_records, enabled=enabled)
        start = time.perf_counter()
        for step in range(iterations):
            prof.begin_step()
            for name in PHASES:
                with prof.phase(name):
                    pass
            prof.end_step(step, 2048, 100000, dict(comm))
        out.setdefault("on" if enabled else "off", []).append((time.perf_counter() - start) / iterations * 1e6)
    return {k: min(v) for k, v in out.items()}


def overhead(args) -> dict:
    m = micro(args.iterations)
    print(f"in-process instrumentation per step: {m['on']:.1f} us enabled, {m['off']:.1f} us disabled "
          f"(best of 2 x {args.iterations} steps; 10 phases + end_step)", flush=True)
    base = [sys.executable]
    overrides = ["experiment=smoke", f"train.max_steps={args.steps}", "monitor.log_every=1", "eval.enabled=false",
                 "sampler=sync", f"train.global_rays={args.rays}", "model.upsample_steps=[100000]"]
    medians = {"off": [], "default": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for mode in ("off", "default"):
                run_dir = Path(tmp) / f"{mode}_{rep}"
                train(base, run_dir, overrides + [f"profiler={mode}"])
                medians[mode].append(statistics.median(step_times(run_dir)[args.warmup:]))
                print(f"repeat {rep} profiler={mode}: median step {1e3 * medians[mode][-1]:.2f} ms", flush=True)
    off, on = statistics.median(medians["off"]), statistics.median(medians["default"])
    for mode, vals in medians.items():
        med = statistics.median(vals)
        print(f"profiler={mode}: median of run medians {1e3 * med:.2f} ms; run medians "
              f"{1e3 * min(vals):.2f}..{1e3 * max(vals):.2f} ms (spread {100 * (max(vals) - min(vals)) / med:.1f}%)")
    print(f"ratio on/off: {on / off:.4f} (overhead {100 * (on / off - 1):+.2f}%); in-process cost "
          f"{m['on'] - m['off']:.1f} us = {100 * (m['on'] - m['off']) * 1e-6 / off:.3f}% of the off step")
    return {"settings": {k: getattr(args, k) for k in ("repeats", "steps", "warmup", "rays", "iterations")},
            "in_process_us_per_step": m, "in_process_cost_us": m["on"] - m["off"],
            "run_median_step_s": medians, "median_step_s": {"off": off, "default": on}, "ratio_on_off": on / off}


def paired(args) -> dict:
    """One single-process training run in this process whose steps are randomly assigned
    (seeded coin before every step) to the breakdown enabled or disabled: both arms share the
    machine's load. Step times come from the trainer's own ``train_seconds`` (logged
    every step, independent of the breakdown)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    from hydra import compose, initialize_config_dir

    from distnerf import distributed as D
    from distnerf.config_check import validate
    from distnerf.engine.trainer import Trainer
    from distnerf.strategy import build_strategy

    with tempfile.TemporaryDirectory() as tmp:
        with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base="1.3"):
            cfg = validate(compose("train", overrides=[
                *COMMON, "experiment=smoke", f"train.max_steps={args.steps}", "monitor.log_every=1",
                "eval.enabled=false", "sampler=sync", f"train.global_rays={args.rays}",
                "model.upsample_steps=[100000]", f"run_dir={tmp}/run", "profiler.telemetry=false"]))
        Path(tmp, "run").mkdir()
        env = D.init_distributed("cpu", timeout_s=cfg.dist_timeout_s, setup_timeout_s=cfg.dist_setup_timeout_s)
        trainer = Trainer(cfg, build_strategy(cfg.strategy, env), Path(tmp, "run"))
        prof, begin = trainer.timer, trainer.timer.begin_step
        arms = []

        coin = random.Random(0)

        def alternate():  # a seeded coin per step: periodic work (occupancy updates every 8 steps) hits both arms
            prof.enabled = coin.random() < 0.5
            arms.append(prof.enabled)
            begin()

        prof.begin_step = alternate
        trainer.fit()
        times = step_times(Path(tmp, "run"))  # times[i] = duration of step i + 1
    on = [t for t, a in zip(times, arms[1:]) if a][args.warmup:]
    off = [t for t, a in zip(times, arms[1:]) if not a][args.warmup:]
    med_on, med_off = statistics.median(on), statistics.median(off)
    q = statistics.quantiles
    print(f"paired in one run ({len(on)} + {len(off)} steps): median step {1e3 * med_on:.2f} ms instrumented, "
          f"{1e3 * med_off:.2f} ms not; ratio {med_on / med_off:.4f} ({100 * (med_on / med_off - 1):+.2f}%); "
          f"interquartile range of the off steps {1e3 * (q(off, n=4)[2] - q(off, n=4)[0]):.2f} ms")
    rng = np.random.default_rng(0)  # bootstrap of the ratio of medians: how far the noise lets us see
    a, b = np.array(on), np.array(off)
    ratios = [np.median(rng.choice(a, a.size)) / np.median(rng.choice(b, b.size)) for _ in range(2000)]
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    print(f"95% bootstrap interval of the ratio: {lo:.4f}..{hi:.4f}")
    return {"settings": {k: getattr(args, k) for k in ("steps", "warmup", "rays")},
            "steps": {"on": len(on), "off": len(off)}, "median_step_s": {"on": med_on, "off": med_off},
            "ratio_on_off": med_on / med_off, "ratio_95_interval": [float(lo), float(hi)],
            "off_iqr_s": q(off, n=4)[2] - q(off, n=4)[0]}


def runs(args) -> dict:
    prefix = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    common = ["dataset=blender", f"dataset.root={LEGO}", f"train.max_steps={args.steps}", "monitor.log_every=10",
              "eval.enabled=false", "profiler=trace", f"train.global_rays={args.rays}"]
    root = Path(args.run_root)
    result = {"settings": {"steps": args.steps, "rays": args.rays}, "runs": {}}
    for name, extra in (("ddp", ["strategy=ddp"]), ("ss", ["strategy=ss"])):
        run_dir = root / f"lego_{name}"
        start = time.perf_counter()
        train(prefix, run_dir, common + extra)
        wall = time.perf_counter() - start
        print(f"\n## 2-rank {name} lego run ({args.steps} steps, {wall:.0f} s wall)\n", flush=True)
        traces = {}
        for p in sorted((run_dir / "profile" / "traces").iterdir()):
            traces[p.name] = p.stat().st_size
            print(f"trace {p.name}: {p.stat().st_size / 2**20:.2f} MB")
        rep = subprocess.run([sys.executable, "-m", "distnerf.profile", "report", str(run_dir)], capture_output=True,
                             text=True)
        if rep.returncode:
            raise SystemExit(f"report of {run_dir} failed:\n{rep.stderr[-3000:]}")
        print(rep.stdout, flush=True)
        report_json = run_dir / "profile" / "report.json"
        result["runs"][name] = {"run_dir": str(run_dir), "wall_s": wall, "trace_bytes": traces,
                                "report": json.loads(report_json.read_text()) if report_json.exists() else None}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    o = sub.add_parser("overhead")
    o.add_argument("--repeats", type=int, default=5)
    o.add_argument("--steps", type=int, default=120)
    o.add_argument("--warmup", type=int, default=10)
    o.add_argument("--rays", type=int, default=2048)
    o.add_argument("--iterations", type=int, default=20000)
    pr = sub.add_parser("paired")
    pr.add_argument("--steps", type=int, default=400)
    pr.add_argument("--warmup", type=int, default=10)
    pr.add_argument("--rays", type=int, default=1024)
    r = sub.add_parser("runs")
    r.add_argument("--steps", type=int, default=60)
    r.add_argument("--rays", type=int, default=4096)
    r.add_argument("--run-root", default="runs/bench_profile", help="where the two runs are written")
    for sp in (o, pr, r):
        sp.add_argument("--out", type=Path, default=None, help="result JSON (default bench/throughput/results/profile_PART.json)")
    args = parser.parse_args()
    meta = start_meta()
    print(f"uptime: {os.popen('uptime').read().strip()}", flush=True)
    report = {"overhead": overhead, "paired": paired, "runs": runs}[args.command](args)
    print(f"uptime: {os.popen('uptime').read().strip()}", flush=True)
    write_result(args.out or default_out(__file__, f"profile_{args.command}.json"), report, meta)


if __name__ == "__main__":
    main()
