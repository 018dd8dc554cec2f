"""A run that shares its cores: the README main job's training rays/s alone and beside one CPU-bound
process, per thread setting, warmed up, interleaved and repeated in one invocation (issue 52 item 5; the method,
issue 60 item 5).

    python -m bench.reliability.shared_cores [--variants default,planned] [--repeats 5] [--seconds 8]
        [--warmup-steps 700] [--settle-steps 30] [--out bench/reliability/results/shared_cores/shared_cores.json]

Expected wall time at the defaults on a quiet 2-core host: about 6.5 minutes (the warm-up's 700 steps about
100 s, each variant's start and settle about 15 s, then 2 variants x 5 repeats x 3 phases of 8 s plus about
0.6 s each); about 10 minutes on a host 1.5x slower. Each variant added costs about 15 s + repeats x 26 s.

The trainer is the real :class:`~distnerf.engine.trainer.Trainer` of the README main job (the default config:
built-in scene, grid model, the pipelined sampler and its worker processes, 4096 rays per step; no evaluation,
checkpoints or logging). Its throughput climbs about 5x over the first steps (the occupancy grid prunes the
scene's free space; the grid changes resolution at ``model.upsample_steps``, the last at step 600), so:

1. **Warm-up, once for all variants**: one process trains ``--warmup-steps`` steps from step 0 (past the
   final grid stage) and writes a checkpoint; its rays/s per window of 50 steps are recorded (the climb and
   the plateau it reached).
2. **One process per variant** (``child``), started one after another, each once the machine's cores are idle
   (:func:`wait_for_idle_cores`: the start-up choice of the OpenMP wait sees what a run started alone sees), each resumed from that checkpoint
   (hard links to it in a run directory of its own: every variant starts from the same model, occupancy
   grid, optimizer and sampler state), trains ``--settle-steps`` more (allocator, sampler workers), then
   waits for the parent's ``measure SECONDS`` lines. The processes stay alive between their phases, idle.
3. **Phases, interleaved and repeated** (:func:`phase_plan`): repeat r visits every variant in the order given
   (A B A B ...); a visit is three phases of ``--seconds`` each: alone; beside ``nice -n 19 python -c "while
   True: pass"``; beside the same un-niced, in an order rotated by r (each competitor takes each position
   once in three repeats).

The figure of one repeat is the ratio alone / beside of that visit's rays/s (phases seconds apart); a variant's
figure is the **median over the repeats, with the min and max** (never the best); the headline is the
``planned`` variant's (what ``python -m distnerf.train`` sets; else the first variant) beside the un-niced
competitor, issue 52's bound (at most 2x). Absolute rays/s on a shared machine are noise.

Variants (environment of the child; ``OMP_NUM_THREADS``/``OMP_WAIT_POLICY`` removed first):

- ``default``: torch's own choice (intra-op threads = the CPU count; libgomp spins at its barriers);
- ``passive``: ``OMP_WAIT_POLICY=PASSIVE`` (threads sleep at barriers), threads as ``default``;
- ``threads1``: ``OMP_NUM_THREADS=1``;
- ``sync``: ``default`` with ``sampler=sync`` (no sampler worker processes);
- ``planned``: what ``python -m distnerf.train`` sets: the OpenMP wait it chooses at start-up
  (:func:`distnerf.cpu.choose_wait`: a bounded spin when the cores are free then, passive when busy; the children
  start while the others idle) and its threads (:func:`distnerf.cpu.configure`);
- ``spin30k``, ``spin3k``: ``planned`` with ``GOMP_SPINCOUNT=30000`` / ``3000`` (threads spin that many times at
  a barrier, then sleep; libgomp's default is 300,000, ``PASSIVE`` 0), which ``python -m distnerf.train`` keeps.

The JSON: ``rows`` (every phase: repeat, variant, competitor, position, the trainer's step before it, steps,
seconds, rays/s, CPU seconds, load before/after), ``repeats`` (every repeat's ratios), ``summary`` (per variant:
medians and min..max), ``headline``, ``warmup``, ``children`` (each variant's start: threads, resumed step, grid
resolution, the OpenMP wait), ``settings``, ``meta`` (command, git commit and whether the tree was dirty, load,
``uptime``). Tables: ``bench/reliability/tables.py``; page: ``bench/reliability/README.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, default_out, load_average, start_meta, write_result

OVERRIDES = ["logger.wandb.mode=disabled", "profiler.telemetry=false", "train.max_steps=100000",
             "checkpoints.every=-1", "eval.enabled=false", "monitor.progress=false", "monitor.log_every=100000"]
VARIANTS = {
    "default": ({}, []),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, []),
    "threads1": ({"OMP_NUM_THREADS": "1"}, []),
    "sync": ({}, ["sampler=sync"]),
    "planned": ({}, []),
    "spin30k": ({"GOMP_SPINCOUNT": "30000"}, []),
    "spin3k": ({"GOMP_SPINCOUNT": "3000"}, []),
}
PLANNED = ("planned", "spin30k", "spin3k")
"""The variants that start as ``python -m distnerf.train`` does (:func:`distnerf.cpu.choose_wait`, which keeps a
``GOMP_SPINCOUNT`` the variant set, then :func:`distnerf.cpu.configure`)."""
HEADLINE = "planned"
"""The variant whose ratio beside the un-niced competitor is the headline (when measured)."""
WARMUP_VARIANT = "planned"
"""The warm-up process's environment (its speed is recorded, not compared)."""
COMPETITORS = {"alone": None, "nice": ["nice", "-n", "19"], "plain": []}
WINDOW = 50
"""Steps per recorded window of the warm-up's rays/s."""


def _trainer(variant: str, run_dir: Path, resume: bool):
    """The README main job's trainer in this process, as ``variant`` (call before anything imports torch).
    Returns (trainer, what it runs with: torch's intra-op threads, the OpenMP wait as the runtime read it, the
    entry point's wait choice and thread plan (None for a variant that does not start as it does))."""
    from distnerf import cpu

    # before torch loads, as distnerf/train.py does
    choice = cpu.choose_wait() if variant in PLANNED else None
    import torch
    from hydra import compose, initialize_config_dir

    from distnerf import distributed as D
    from distnerf.config_check import validate
    from distnerf.engine.trainer import Trainer
    from distnerf.strategy import build_strategy

    overrides = [*OVERRIDES, *VARIANTS[variant][1], f"run_dir={run_dir}", f"resume={str(resume).lower()}"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = validate(compose("train", overrides=overrides))
    plan = cpu.configure(cfg.num_threads, local_world_size=1).describe() if variant in PLANNED else None
    env = D.init_distributed("cpu", timeout_s=cfg.dist_timeout_s, setup_timeout_s=cfg.dist_setup_timeout_s)
    run_dir.mkdir(parents=True, exist_ok=True)
    runs = {"torch_threads": torch.get_num_threads(), "omp_wait": cpu.wait_setting(), "wait_choice": choice,
            "plan": plan}
    trainer = Trainer(cfg, build_strategy(cfg.strategy, env), run_dir)
    if choice == "spin":  # as distnerf/train.py: fewer threads while another process shares the cores
        watch = cpu.CoreWatch(torch.get_num_threads(), os.getpid())
        trainer.phase_hooks.append(watch.phase_hook)
    runs["core_watch"] = choice == "spin"
    return trainer, runs


def _resolution(trainer) -> int | None:
    """The grid model's vertices per axis now (its stage), None for another model."""
    n = getattr(trainer.model, "grid_resolution", None)
    return None if n is None else int(n)


def _train(trainer, steps: int) -> float:
    """Train ``steps`` steps (0: none); their wall seconds."""
    from bench.throughput.syncs import run_step

    t0 = time.perf_counter()
    for _ in range(steps):
        run_step(trainer)
    return time.perf_counter() - t0


def child_warmup(variant: str, run_dir: Path, steps: int) -> None:
    """The warm-up: train ``steps`` steps from step 0, write a checkpoint, print one JSON line (steps, seconds,
    rays/s per window of :data:`WINDOW` steps with the grid resolution, the final stage's step)."""
    trainer, runs = _trainer(variant, run_dir, resume=False)
    rays, windows, total = trainer.global_rays, [], 0.0
    while trainer.step < steps:
        n = min(WINDOW, steps - trainer.step)
        dt = _train(trainer, n)
        total += dt
        windows.append({"step": trainer.step, "rays_per_s": round(rays * n / dt), "resolution": _resolution(trainer)})
    upsample = list(getattr(trainer.cfg.model, "upsample_steps", None) or [])
    got = {"variant": variant, "steps": trainer.step, "seconds": round(total, 2), "windows": windows,
           "resolution": _resolution(trainer), "final_stage_step": max(upsample) if upsample else None,
           **runs, "checkpoint": trainer.save_checkpoint().name}
    trainer.close()
    print(json.dumps(got), flush=True)


def child_measure(variant: str, run_dir: Path, settle_steps: int) -> None:
    """The measured process: resumes from the checkpoint in ``run_dir``, trains ``settle_steps``, prints a
    ready line, then answers ``measure SECONDS`` lines on stdin with one JSON line (the step before, steps,
    seconds, rays/s, CPU seconds) on stdout, until ``quit``."""
    trainer, runs = _trainer(variant, run_dir, resume=True)  # first: it chooses the OpenMP wait before torch loads
    import torch

    from bench.throughput.syncs import run_step

    resumed, rays = trainer.step, trainer.global_rays
    if resumed == 0:  # the trainer starts fresh when it finds no checkpoint
        raise SystemExit(f"variant {variant}: no checkpoint resumed from {run_dir / 'checkpoints'}")
    dt = _train(trainer, settle_steps)
    print(json.dumps({"ready": True, **runs, "resumed_step": resumed,
                      "resolution": _resolution(trainer), "settle_steps": settle_steps,
                      "settle_rays_per_s": round(rays * settle_steps / dt) if settle_steps else None}), flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        seconds = float(line.split()[1])
        before, t0, steps, cpu0 = trainer.step, time.perf_counter(), 0, time.process_time()
        while time.perf_counter() - t0 < seconds or steps == 0:
            run_step(trainer)
            steps += 1
        dt = time.perf_counter() - t0
        print(json.dumps({"step_before": before, "steps": steps, "seconds": dt, "rays_per_s": rays * steps / dt,
                          "threads_end": torch.get_num_threads(),
                          "cpu_s": time.process_time() - cpu0}), flush=True)
    trainer.close()


def _child_env(variant: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS")}
    env.update(VARIANTS[variant][0])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _child_cmd(role: str, variant: str, run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "bench.reliability.shared_cores", "child", role, variant, "--run-dir", str(run_dir),
            *extra]


def _json_line(proc: subprocess.Popen, what: str) -> dict:
    """The next line of a child's stdout as JSON; SystemExit naming ``what`` when the child ended instead."""
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"{what}: the child process ended (rc {proc.wait()}) without an answer; see its stderr above")
    return json.loads(line)


def warm_up(run_dir: Path, steps: int) -> dict:
    """Run the warm-up process (:func:`child_warmup`) to its end; what it printed."""
    proc = subprocess.Popen(_child_cmd("warmup", WARMUP_VARIANT, run_dir, "--steps", str(steps)), cwd=ROOT,
                            env=_child_env(WARMUP_VARIANT), stdout=subprocess.PIPE, text=True)
    got = _json_line(proc, "warm-up")
    proc.wait(timeout=120)
    return got


def link_checkpoints(warm_dir: Path, run_dir: Path) -> None:
    """``run_dir/checkpoints``: hard links to the warm-up's (the children only read them)."""
    src = warm_dir / "checkpoints"
    for f in sorted(src.rglob("*")):
        dst = run_dir / "checkpoints" / f.relative_to(src)
        if f.is_dir():
            dst.mkdir(parents=True, exist_ok=True)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.link(f, dst)


def wait_for_idle_cores(limit: float = 0.3, timeout_s: float = 60.0) -> float | None:
    """Wait until the machine's processes keep at most ``limit`` cores busy over half a second
    (:func:`distnerf.cpu.busy_cores`; the warm-up's or a settled variant's processes winding down), at most
    ``timeout_s``; the last reading (None where /proc/stat is unreadable). A variant started on busy cores
    would make another start-up choice (:func:`distnerf.cpu.choose_wait`) than a run started alone."""
    from distnerf import cpu

    deadline = time.time() + timeout_s
    while True:
        busy = cpu.busy_cores(0.5)
        if busy is None or busy <= limit or time.time() > deadline:
            return busy
        time.sleep(0.5)


class Child:
    """One variant's measured process (:func:`child_measure`), started now; ``ready``: its ready line."""

    def __init__(self, variant: str, run_dir: Path, settle_steps: int):
        self.variant = variant
        self.proc = subprocess.Popen(_child_cmd("measure", variant, run_dir, "--settle-steps", str(settle_steps)),
                                     cwd=ROOT, env=_child_env(variant), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        self.ready = _json_line(self.proc, f"variant {variant}")

    def measure(self, seconds: float) -> dict:
        self.proc.stdin.write(f"measure {seconds}\n")
        self.proc.stdin.flush()
        return _json_line(self.proc, f"variant {self.variant}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
        self.proc.wait(timeout=120)


def start_competitor(name: str) -> subprocess.Popen | None:
    """The phase's competitor (None alone), given 0.5 s to run before the phase starts."""
    prefix = COMPETITORS[name]
    comp = None if prefix is None else subprocess.Popen([*prefix, sys.executable, "-c", "while True: pass"])
    time.sleep(0.5)
    return comp


def phase_plan(variants: list[str], repeats: int) -> list[tuple[int, str, str]]:
    """The phases in measuring order, (repeat, variant, competitor): repeat r visits each variant in the order
    given (A B A B ...), a visit being its three phases with the competitors' order rotated by r (r = 0: alone,
    nice, plain; 1: nice, plain, alone; 2: plain, alone, nice)."""
    names = list(COMPETITORS)
    return [(r, v, names[(r + i) % len(names)]) for r in range(repeats) for v in variants for i in range(len(names))]


def measure(plan: list[tuple[int, str, str]], children: dict, seconds: float,
            competitor=start_competitor) -> list[dict]:
    """Run ``plan``'s phases: ``children[variant].measure(seconds)`` beside ``competitor(name)`` (a process
    killed after the phase, or None). One row per phase, in order."""
    rows = []
    for index, (r, variant, name) in enumerate(plan):
        position = sum(1 for rr, v, _ in plan[:index] if (rr, v) == (r, variant))
        comp = competitor(name)
        try:
            load = load_average()
            got = children[variant].measure(seconds)
        finally:  # a busy loop left behind would load every later measurement on this machine
            if comp is not None:
                comp.kill()
                comp.wait()
        rows.append({"index": index, "repeat": r, "variant": variant, "competitor": name, "position": position,
                     **got, "load_before": load, "load_after": load_average()})
        print(f"  r{r} {variant:9s} {name:6s} {got['rays_per_s']:9.0f} rays/s ({got['steps']} steps from step "
              f"{got.get('step_before')}, cpu {got['cpu_s']:.1f} s / {got['seconds']:.1f} s) load {load}", flush=True)
    return rows


def median_spread(values: list[float]) -> dict:
    """The median of ``values`` with their min and max (the spread over the repeats; with 3-5 repeats a
    quartile would be one of the values anyway) and their count, rounded to 3 decimals."""
    if not values:
        raise ValueError("median_spread of no values")
    v = sorted(values)
    return {"median": round(statistics.median(v), 3), "min": round(v[0], 3), "max": round(v[-1], 3), "n": len(v)}


def repeat_ratios(rows: list[dict]) -> list[dict]:
    """Per (variant, repeat): its three phases' rays/s and the slow-downs alone / beside each competitor."""
    out = []
    for variant, r in dict.fromkeys((x["variant"], x["repeat"]) for x in rows):
        rate = {x["competitor"]: x["rays_per_s"] for x in rows if (x["variant"], x["repeat"]) == (variant, r)}
        out.append({"variant": variant, "repeat": r, **{f"rays_per_s_{k}": round(v) for k, v in rate.items()},
                    "slowdown_nice": round(rate["alone"] / rate["nice"], 3),
                    "slowdown_plain": round(rate["alone"] / rate["plain"], 3)})
    return out


def summarise(rows: list[dict], children: dict[str, dict]) -> list[dict]:
    """Per variant: the median rays/s per competitor over the repeats, the slow-downs alone / beside as
    :func:`median_spread` of the repeats' ratios, and the trainer's CPU seconds per step over all its phases
    (threads that spin at their barriers burn CPU time without progress: more CPU per step for the same work).
    ``children``: each variant's ready line (its threads)."""
    reps = repeat_ratios(rows)
    out = []
    for variant in dict.fromkeys(r["variant"] for r in rows):
        mine, ratios = [r for r in rows if r["variant"] == variant], [r for r in reps if r["variant"] == variant]
        out.append({"variant": variant, "torch_threads": children[variant]["torch_threads"], "repeats": len(ratios),
                    **{f"rays_per_s_{k}": round(statistics.median(r[f"rays_per_s_{k}"] for r in ratios))
                       for k in COMPETITORS},
                    "slowdown_nice": median_spread([r["slowdown_nice"] for r in ratios]),
                    "slowdown_plain": median_spread([r["slowdown_plain"] for r in ratios]),
                    "cpu_s_per_step": round(sum(r["cpu_s"] for r in mine) / sum(r["steps"] for r in mine), 3),
                    "load_1min": round(sum(r["load_before"][0] for r in mine) / len(mine), 1)})
    return out


def headline(summary: list[dict]) -> dict:
    """The :data:`HEADLINE` variant's (else the first's) slow-down beside the un-niced competitor, median and
    spread, with the nice'd one beside it."""
    s = next((s for s in summary if s["variant"] == HEADLINE), summary[0])
    return {"variant": s["variant"], "beside": "un-niced", **s["slowdown_plain"], "nice": s["slowdown_nice"]}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["child"]:
        ap = argparse.ArgumentParser()
        ap.add_argument("role", choices=["warmup", "measure"])
        ap.add_argument("variant", choices=list(VARIANTS))
        ap.add_argument("--run-dir", type=Path, required=True)
        ap.add_argument("--steps", type=int, default=0)
        ap.add_argument("--settle-steps", type=int, default=0)
        args = ap.parse_args(argv[1:])
        if args.role == "warmup":
            child_warmup(args.variant, args.run_dir, args.steps)
        else:
            child_measure(args.variant, args.run_dir, args.settle_steps)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="default,planned", help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--repeats", type=int, default=5, help="visits of every variant (three phases each)")
    ap.add_argument("--seconds", type=float, default=8.0, help="one phase's training time")
    ap.add_argument("--warmup-steps", type=int, default=700,
                    help="steps trained once, from step 0, before any phase (past the grid's last stage, step 600)")
    ap.add_argument("--settle-steps", type=int, default=30, help="steps each variant trains after resuming")
    ap.add_argument("--out", type=Path, default=default_out(__file__, "shared_cores/shared_cores.json"))
    args = ap.parse_args(argv)
    variants = list(dict.fromkeys(args.variants.split(",")))
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"--variants {args.variants!r}: unknown {unknown} (known: {', '.join(VARIANTS)})")
    if args.repeats < 1 or args.warmup_steps < 1 or args.seconds <= 0 or args.settle_steps < 0:
        raise ValueError(f"--repeats {args.repeats}, --warmup-steps {args.warmup_steps} (>= 1), --seconds "
                         f"{args.seconds} (> 0), --settle-steps {args.settle_steps} (>= 0)")
    meta = start_meta()
    meta["uptime_before"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="shared_cores_") as tmp:
        warm = warm_up(Path(tmp) / "warmup", args.warmup_steps)
        print(f"warm-up: {warm['steps']} steps in {warm['seconds']:.0f} s; rays/s per {WINDOW} steps: "
              f"{[w['rays_per_s'] for w in warm['windows']]}", flush=True)
        children: dict[str, Child] = {}
        try:
            for v in variants:
                link_checkpoints(Path(tmp) / "warmup", Path(tmp) / v)
                busy = wait_for_idle_cores()  # as a run started alone: the planned wait's choice sees free cores
                children[v] = Child(v, Path(tmp) / v, args.settle_steps)
                children[v].ready["busy_cores_at_start"] = busy
                print(f"{v}: {children[v].ready}", flush=True)
            rows = measure(phase_plan(variants, args.repeats), children, args.seconds)
        finally:
            for c in children.values():
                c.close()
    meta["uptime_after"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    ready = {v: c.ready for v, c in children.items()}
    summary = summarise(rows, ready)
    for s in summary:
        print(s)
    top = headline(summary)
    print(f"headline: {top['variant']} beside an un-niced competitor {top['median']:.2f}x slower "
          f"(median of {top['n']}; {top['min']:.2f}-{top['max']:.2f})", flush=True)
    settings = {"variants": variants, "repeats": args.repeats, "seconds": args.seconds,
                "warmup_steps": args.warmup_steps, "settle_steps": args.settle_steps, "warmup_variant": WARMUP_VARIANT}
    write_result(args.out, {"headline": top, "summary": summary, "repeats": repeat_ratios(rows), "rows": rows,
                            "warmup": warm, "children": ready, "settings": settings,
                            "note": "ratios alone / beside per repeat (phases seconds apart); median and min..max "
                                    "over the repeats"}, meta)


if __name__ == "__main__":
    main()
