"""A run that shares its cores: the README main job's training rays/s alone and beside one CPU-bound
process, per thread setting, in one invocation (issue 52, item 5).

    python -m bench.reliability.shared_cores [--variants default,passive,threads1,sync,planned,spin30k,spin3k]
        [--seconds 8] [--rounds 2] [--out bench/reliability/results/shared_cores/shared_cores.json]

Each variant is one fresh process (``child``) that builds the real :class:`~distnerf.engine.trainer.Trainer`
of the README main job (the default config: built-in scene, grid model, ``sampler=pipelined`` with its
worker processes, 4096 rays per step; no evaluation, checkpoints or logging) and then, on the parent's
request, runs training steps for ``--seconds`` and reports steps and rays/s. The parent measures each
variant in phases that alternate ``--rounds`` times between: alone; beside ``nice -n 19 python -c
"while True: pass"``; beside the same un-niced. The ratio alone / beside is the figure (absolute rays/s
on a shared machine are noise; the ratios of one child are taken minutes apart at most).

Variants (environment of the child; ``OMP_NUM_THREADS``/``OMP_WAIT_POLICY`` removed first):

- ``default``: torch's own choice (intra-op threads = the CPU count; libgomp spins at its barriers);
- ``passive``: ``OMP_WAIT_POLICY=PASSIVE`` (threads sleep at barriers), threads as ``default``;
- ``threads1``: ``OMP_NUM_THREADS=1``;
- ``sync``: ``default`` with ``sampler=sync`` (no sampler worker processes);
- ``planned``: what ``python -m distnerf.train`` now sets (:func:`distnerf.cpu.configure`);
- ``spin30k``, ``spin3k``: ``planned`` with ``GOMP_SPINCOUNT=30000`` / ``3000`` (threads spin that many times at
  a barrier, then sleep; libgomp's default is 300,000, ``PASSIVE`` 0), which ``python -m distnerf.train`` keeps.

``uptime`` (load averages) is recorded before and after each phase.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, default_out, load_average, start_meta, write_result

OVERRIDES = ["logger.wandb.mode=disabled", "profiler.telemetry=false", "train.max_steps=100000",
             "train.ckpt_every=-1", "eval.enabled=false", "train.progress=false"]
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
COMPETITORS = {"alone": None, "nice": ["nice", "-n", "19"], "plain": []}


def child(variant: str, run_dir: Path) -> None:
    """The measured process: builds the trainer, then answers ``measure SECONDS`` lines on stdin with one
    JSON line (steps, seconds, rays_per_s, torch threads) on stdout, until ``quit``."""
    if variant in PLANNED:  # before torch loads, as distnerf/train.py does
        from distnerf import cpu
        cpu.choose_wait()
    import torch
    from hydra import compose, initialize_config_dir

    from bench.throughput.syncs import run_step
    from distnerf import dist as D
    from distnerf.config_check import validate
    from distnerf.engine.trainer import Trainer
    from distnerf.strategy import build_strategy

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = validate(compose("train", overrides=[*OVERRIDES, *VARIANTS[variant][1], f"run_dir={run_dir}"]))
    plan = None
    if variant in PLANNED:
        from distnerf import cpu
        plan = cpu.configure(cfg.num_threads, local_world_size=1)
    env = D.init_distributed("cpu", timeout_s=cfg.dist_timeout_s, setup_timeout_s=cfg.dist_setup_timeout_s)
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(cfg, build_strategy(cfg.strategy, env), run_dir)
    for _ in range(3):  # warm-up: allocator, occupancy grid, the workers' first batches
        run_step(trainer)
    rays = trainer.global_rays
    print(json.dumps({"ready": True, "torch_threads": torch.get_num_threads(),
                      "plan": None if plan is None else plan.describe()}), flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        seconds = float(line.split()[1])
        t0, steps, cpu0 = time.perf_counter(), 0, time.process_time()
        while time.perf_counter() - t0 < seconds or steps == 0:
            run_step(trainer)
            steps += 1
        dt = time.perf_counter() - t0
        print(json.dumps({"steps": steps, "seconds": dt, "rays_per_s": rays * steps / dt,
                          "cpu_s": time.process_time() - cpu0}), flush=True)
    trainer.close()


def _child_env(variant: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS")}
    env.update(VARIANTS[variant][0])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def measure(variants: list[str], seconds: float, rounds: int) -> list[dict]:
    rows = []
    for variant in variants:
        with tempfile.TemporaryDirectory(prefix="shared_cores_") as tmp:
            proc = subprocess.Popen([sys.executable, "-m", "bench.reliability.shared_cores", "child", variant,
                                     "--run-dir", str(Path(tmp) / "run")], cwd=ROOT, env=_child_env(variant),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            ready = json.loads(proc.stdout.readline())
            print(f"{variant}: {ready}", flush=True)
            for r in range(rounds):
                order = list(COMPETITORS) if r % 2 == 0 else list(reversed(COMPETITORS))
                for name in order:
                    prefix = COMPETITORS[name]
                    comp = None if prefix is None else subprocess.Popen(
                        [*prefix, sys.executable, "-c", "while True: pass"])
                    time.sleep(0.5)  # the competitor is running
                    load = load_average()
                    proc.stdin.write(f"measure {seconds}\n")
                    proc.stdin.flush()
                    got = json.loads(proc.stdout.readline())
                    if comp is not None:
                        comp.kill()
                        comp.wait()
                    rows.append({"variant": variant, "competitor": name, "round": r, **got,
                                 "torch_threads": ready["torch_threads"], "plan": ready["plan"],
                                 "load_before": load, "load_after": load_average()})
                    print(f"  {name:6s} {got['rays_per_s']:9.0f} rays/s ({got['steps']} steps, "
                          f"cpu {got['cpu_s']:.1f} s / {got['seconds']:.1f} s) load {load}", flush=True)
            proc.stdin.write("quit\n")
            proc.stdin.flush()
            proc.wait(timeout=120)
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """Per variant: rays/s per competitor (all rounds' steps over their seconds), the slow-down alone /
    beside, and the trainer's CPU seconds per step over all phases (threads that spin at their barriers
    burn CPU time without progress: more CPU per step for the same work)."""
    out = []
    for variant in dict.fromkeys(r["variant"] for r in rows):
        rate = {}
        for name in COMPETITORS:
            mine = [r for r in rows if r["variant"] == variant and r["competitor"] == name]
            rate[name] = sum(r["steps"] for r in mine) / sum(r["seconds"] for r in mine)
        mine = [r for r in rows if r["variant"] == variant]
        rays = mine[0]["rays_per_s"] * mine[0]["seconds"] / mine[0]["steps"]
        out.append({"variant": variant, "torch_threads": mine[0]["torch_threads"],
                    **{f"rays_per_s_{k}": round(rays * v) for k, v in rate.items()},
                    "slowdown_nice": round(rate["alone"] / rate["nice"], 2),
                    "slowdown_plain": round(rate["alone"] / rate["plain"], 2),
                    "cpu_s_per_step": round(sum(r["cpu_s"] for r in mine) / sum(r["steps"] for r in mine), 3),
                    "load_1min": round(sum(r["load_before"][0] for r in mine) / len(mine), 1)})
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["child"]:
        ap = argparse.ArgumentParser()
        ap.add_argument("variant", choices=list(VARIANTS))
        ap.add_argument("--run-dir", type=Path, required=True)
        args = ap.parse_args(argv[1:])
        child(args.variant, args.run_dir)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--seconds", type=float, default=8.0, help="one phase's training time")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the three phases per variant")
    ap.add_argument("--out", type=Path, default=default_out(__file__, "shared_cores/shared_cores.json"))
    args = ap.parse_args(argv)
    meta = start_meta()
    meta["uptime_before"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    rows = measure(args.variants.split(","), args.seconds, args.rounds)
    meta["uptime_after"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    summary = summarise(rows)
    for s in summary:
        print(s)
    write_result(args.out, {"summary": summary, "rows": rows,
                            "note": "measured on a machine shared with other sessions (see load): indicative"}, meta)


if __name__ == "__main__":
    main()
