"""Which training step the CPU should take (issue 49 item 7: "if the compiled path is faster on the CPU, it
becomes the CPU default"): the real trainer's step on lego at the final grid stage, for each step path.

    python -m bench.throughput.cpu_paths --data ../shared/data/nerf_synthetic_half/lego
        [--warm-steps 1000] [--from CHECKPOINT] [--steps 32] [--blocks 5]
        [--out bench/throughput/results/cpu_paths/cpu_paths.json]

First a trained state: ``python -m distnerf.train`` with the README's lego settings for ``--warm-steps`` steps
(the grid reaches its final 160^3 stage at step 600 and the occupancy grid prunes), one checkpoint at the end;
or ``--from`` an existing checkpoint directory of the same model. Then, for each path of :data:`PATHS`, one
process builds the real :class:`~distnerf.engine.trainer.Trainer` at that stage (``model.resolutions=[160]
model.upsample_steps=[]``: no upsampling while timed), starts from the checkpoint's model (``Trainer.start_from``:
parameters, occupancy grid, box; its step and optimizer built again over them, fresh Adam state: the same work a
step), runs ``--warmup`` steps
(torch.compile compiles there; its seconds reported) and times ``--blocks`` blocks of ``--steps`` steps of
``Trainer.step_once``, ``fit``'s body (the sampler, the step, the occupancy refresh every 8 steps; no logging,
evaluation or checkpoints). Figures per path: the median block's milliseconds per step and rays/s (rays the loss
counted: the batch's valid rays on the dynamic step, the sample budget's counted rays on the static one), samples
per ray.

Paths: the dynamic step (the CPU default: packed samples, sparse colour-row gradients and lazy Adam), the same
with dense gradients, the static step (``step.samples_per_step``, the CUDA default) eager, and compiled with
inductor (``model.compile=true``: render ``fullgraph=True``, the optimizer compiled on its own; dense gradients:
the sparse gradient's CSR build does not trace), and the dynamic step under ``model.compile=true`` (its shapes
change every step). Run it on a quiet machine (``../shared/tools/quiet --``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, default_out, start_meta, write_result

P = 1 << 17  # the static step's sample slots: about lego's 4096-ray batch at its final stage's samples per ray
PATHS = {  # label -> overrides beyond the README's lego line
    "dynamic (CPU default: sparse colour gradients, lazy Adam)": [],
    "dynamic, dense gradients": ["model.sparse_grad=false"],
    "static, eager": [f"step.samples_per_step={P}"],
    "static, eager, dense gradients": [f"step.samples_per_step={P}", "model.sparse_grad=false"],
    "static, compiled (inductor)": [f"step.samples_per_step={P}", "model.compile=true", "model.sparse_grad=false"],
    "dynamic, compiled (inductor)": ["model.compile=true"],
}
COMMON = ["checkpoints.every=-1", "eval.enabled=false", "monitor.progress=false", "logger.wandb.mode=disabled",
          "profiler.telemetry=false", "train.max_steps=1000000", "monitor.log_every=1000000"]


def warm_checkpoint(data: str, steps: int, run_dir: Path) -> Path:
    """Train lego (the README's settings) for ``steps`` steps into ``run_dir``; its last checkpoint."""
    cmd = [sys.executable, "-m", "distnerf.train", f"run_dir={run_dir}", "dataset=blender", f"dataset.root={data}",
           f"train.max_steps={steps}", f"checkpoints.every={steps}", "eval.enabled=false", "monitor.progress=false",
           "logger.wandb.mode=disabled"]
    subprocess.run(cmd, check=True, cwd=ROOT)
    return sorted((run_dir / "checkpoints").glob("step_*"))[-1]


def measure(label: str, data: str, ckpt: Path, warmup: int, steps: int, blocks: int, run_dir: Path) -> dict:
    """One path's figures (module docstring), in this process."""
    import torch

    from bench.throughput.syncs import build_trainer, run_step
    from distnerf import distributed as D

    torch.manual_seed(0)
    cfg = ["dataset=blender", f"dataset.root={data}", "device=cpu", "model.resolutions=[160]",
           "model.upsample_steps=[]", *PATHS[label]]
    trainer, env = build_trainer(cfg, run_dir, device="cpu", common=COMMON)
    try:
        # the checkpoint's model, then its step and optimizer built over the loaded tables (fresh Adam state)
        from_step = trainer.start_from(ckpt)
        t0 = time.perf_counter()
        for _ in range(warmup):
            run_step(trainer)
        warm_s = time.perf_counter() - t0
        runs = []
        for _ in range(blocks):
            rays = samples = 0.0
            t0 = time.perf_counter()
            for _ in range(steps):
                batch, out = run_step_counted(trainer, run_step)
                rays += batch
                samples += out
            seconds = time.perf_counter() - t0
            runs.append({"step_ms": 1e3 * seconds / steps, "rays_per_s": rays / seconds,
                         "samples_per_ray": samples / rays if rays else None})
        mid = sorted(runs, key=lambda r: r["step_ms"])[len(runs) // 2]
        return {"overrides": cfg, "warmup_steps": warmup, "warmup_s": round(warm_s, 2), "steps": steps,
                "runs": runs, "step_ms_median": mid["step_ms"], "rays_per_s_median": mid["rays_per_s"],
                "samples_per_ray": mid["samples_per_ray"], "from_step": from_step}
    finally:
        trainer.close()
        D.shutdown(env)


def run_step_counted(trainer, run_step) -> tuple[float, float]:
    """One step; (rays the loss counted, samples marched) of that step (the static step's: its budget's report
    of the previous step, read a step late without a sync, so a block counts its steps shifted by one)."""
    result = run_step(trainer)
    budget = trainer.train_step.budget_metrics()
    if trainer.train_step.budget is not None:
        rays = budget.get("budget_counted_rays", 0.0)
        return rays, budget.get("budget_samples_per_ray", 0.0) * budget.get("budget_active_rays", 0.0)
    return float(result.agreed.mine.valid_rays), float(result.out.get("num_samples", 0))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="lego's folder (nerf_synthetic layout)")
    ap.add_argument("--from", dest="ckpt", type=Path, default=None, help="a checkpoint directory to start from")
    ap.add_argument("--warm-steps", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=16, help="untimed steps: compilation, recompiles")
    ap.add_argument("--steps", type=int, default=32, help="a block: a multiple of the occupancy refresh cadence (8)")
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--path", default=None, help=argparse.SUPPRESS)  # one path in this process (internal)
    ap.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=default_out(__file__, "cpu_paths") / "cpu_paths.json")
    args = ap.parse_args(argv)
    data = str(Path(args.data).resolve())
    if args.path is not None:  # a child: one path, its figures to --result
        with tempfile.TemporaryDirectory() as tmp:
            row = measure(args.path, data, args.ckpt, args.warmup, args.steps, args.blocks, Path(tmp) / "run")
        args.result.write_text(json.dumps(row))
        return 0
    meta = start_meta()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = args.ckpt.resolve() if args.ckpt else warm_checkpoint(data, args.warm_steps, Path(tmp) / "warm")
        for label in PATHS:  # each in its own process: compiled state and thread pools start clean
            result = Path(tmp) / "row.json"
            cmd = [sys.executable, "-m", "bench.throughput.cpu_paths", "--data", data, "--from", str(ckpt),
                   "--warmup", str(args.warmup), "--steps", str(args.steps), "--blocks", str(args.blocks),
                   "--path", label, "--result", str(result)]
            done = subprocess.run(cmd, cwd=ROOT)
            rows[label] = json.loads(result.read_text()) if done.returncode == 0 else {"failed": done.returncode}
            print(label, json.dumps({k: rows[label].get(k) for k in ("step_ms_median", "rays_per_s_median",
                                                                      "samples_per_ray", "warmup_s", "failed")}),
                  flush=True)
            result.unlink(missing_ok=True)
    base = rows[next(iter(PATHS))].get("rays_per_s_median")
    for row in rows.values():
        if base and row.get("rays_per_s_median"):
            row["rays_per_s_over_default"] = row["rays_per_s_median"] / base
    write_result(args.out, {"paths": rows, "samples_per_step": P, "warm_steps": None if args.ckpt else args.warm_steps,
                            "from": str(args.ckpt) if args.ckpt else None}, meta)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
