"""DDP benchmarks: weak scaling 1 -> N processes and all-reduce cost per model.

    python -m bench.scaling.ddp scaling --nprocs 1 2 --rays-per-process 2048 --steps 60 --repeats 3
    python -m bench.scaling.ddp allreduce --models grid ngp nerf --steps 8

Each writes JSON to ``--out`` (default ``bench/scaling/results/ddp_scaling.json`` /
``bench/scaling/results/ddp_allreduce.json``) with a ``meta`` block (command, date, git commit, load
before/after).

``scaling``: ``torchrun --nproc_per_node=N`` with one thread per process
(OMP_NUM_THREADS=1), a fixed per-process batch (``train.rays_per_rank``: a global batch of N x rays) on
lego, ``log_every=1``; per run the median over steps after ``--warmup`` of the
global rays/s, then the median over ``--repeats`` runs. The runs of all N alternate
(1, 2, 1, 2, ...) so drift of the machine hits both alike.

``allreduce``: a 2-process run per model (and the grid at its final 160^3 resolution
with dense, sparse and bf16 gradient exchange); all-reduce seconds and bytes per step
as measured by the DDP communication hook, and their share of the step.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import default_out, start_meta, write_result
from distnerf.observe.logger import read_metrics_log

LEGO = "../shared/data/nerf_synthetic_half/lego"


def run(nproc: int, run_dir: Path, overrides: list[str], threads: int) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "distnerf.train", "device=cpu", f"run_dir={run_dir}", "dataset=blender", f"dataset.root={LEGO}",
           "monitor.progress=false", "monitor.log_every=1", "checkpoints.every=-1", "eval.enabled=false",
           "logger.wandb.mode=disabled", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    rows = read_metrics_log(run_dir)
    return [r for r in rows if "loss" in r]  # step rows only (not end-of-run summaries)


def scaling(args):
    results = {n: [] for n in args.nprocs}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for n in args.nprocs:
                rows = run(n, Path(tmp) / f"n{n}_r{rep}", [f"train.rays_per_rank={args.rays_per_process}",
                                                             f"train.max_steps={args.steps}"], 1)
                rates = [r["rays_per_s"] for r in rows if r["step"] > args.warmup]
                results[n].append(statistics.median(rates))
                print(f"nproc={n} repeat={rep}: {results[n][-1]:.0f} rays/s", flush=True)
    base = statistics.median(results[args.nprocs[0]])
    summary = {}
    for n in args.nprocs:
        med = statistics.median(results[n])
        summary[str(n)] = {"rays_per_s_runs": results[n], "rays_per_s_median": med,
                           "global_rays_per_step": n * args.rays_per_process, "ratio": med / base}
        print(f"nproc={n}: median {med:.0f} rays/s over {args.repeats} runs; ratio vs {args.nprocs[0]}: "
              f"{med / base:.2f}")
    return {"settings": {k: getattr(args, k) for k in ("nprocs", "rays_per_process", "steps", "warmup", "repeats")},
            "nprocs": summary}


VARIANTS = {
    # the grid model at its final resolution, gradients all-reduced densely and sparsely
    "grid160_dense": ["model=grid", "model.resolutions=[160]", "model.upsample_steps=[]",
                      "strategy.sparse_min_numel=null"],
    "grid160_sparse": ["model=grid", "model.resolutions=[160]", "model.upsample_steps=[]",
                       "strategy.sparse_mode=counted"],
    # the device path (no host sync): slots sized by the forward's row bounds
    "grid160_bounded": ["model=grid", "model.resolutions=[160]", "model.upsample_steps=[]",
                        "strategy.sparse_mode=bounded"],
    "grid160_bf16": ["model=grid", "model.resolutions=[160]", "model.upsample_steps=[]",
                     "strategy.sparse_min_numel=null", "strategy.compression=bf16"],
}


def allreduce(args):
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            extra = VARIANTS.get(model, [f"model={model}"]) + [f"train.max_steps={args.steps}", "train.global_rays=4096"]
            rows = run(2, Path(tmp) / model, extra, args.threads)
            rows = [r for r in rows if r["step"] > 2]
            step_s = [sum(v for k, v in r.items() if k.startswith("time_")) for r in rows]
            out[model] = {
                "allreduce_bytes_per_step": statistics.median(r["allreduce_bytes"] for r in rows),
                "allreduce_s_per_step": statistics.median(r["allreduce_s"] for r in rows),
                "step_s": statistics.median(step_s),
                "share_of_step": statistics.median(r["allreduce_s"] / s for r, s in zip(rows, step_s)),
            }
            print(model, json.dumps(out[model]), flush=True)
    return {"settings": {"steps": args.steps, "threads": args.threads, "global_rays": 4096, "nprocs": 2},
            "models": out}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("scaling")
    s.add_argument("--nprocs", type=int, nargs="+", default=[1, 2])
    s.add_argument("--rays-per-process", type=int, default=2048)
    s.add_argument("--steps", type=int, default=60)
    s.add_argument("--warmup", type=int, default=20)
    s.add_argument("--repeats", type=int, default=3)
    a = sub.add_parser("allreduce")
    a.add_argument("--models", nargs="+", default=["grid", "grid160_dense", "grid160_sparse", "grid160_bounded", "grid160_bf16",
                                                   "ngp", "nerf"])
    a.add_argument("--steps", type=int, default=8)
    a.add_argument("--threads", type=int, default=1)
    for sp in (s, a):
        sp.add_argument("--out", type=Path, default=None,
                        help="result JSON (default bench/scaling/results/ddp_scaling.json or ddp_allreduce.json)")
    args = p.parse_args()
    meta = start_meta()
    report = scaling(args) if args.cmd == "scaling" else allreduce(args)
    write_result(args.out or default_out(__file__, f"ddp_{args.cmd}.json"), report, meta)


if __name__ == "__main__":
    main()
