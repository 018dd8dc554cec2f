"""Batches that scale: lego at W = 1, 2, 4 ranks with the per-rank batch default, equal steps (issue 50 item 1).

    python -m bench.scaling.per_rank_batch [--world-sizes 1 2 4] [--sqrt-world-sizes 4] [--steps 300] \
        [--eval-views 8] [--wait-while PATH] [--out bench/scaling/results/per_rank_batch/result.json]

With ``train.rays_per_rank`` (the default, 4096) the global batch is W times it, so W ranks train on
W times the rays per step. The loss is the mean over the global batch, so its gradient has the scale
of one ray's whatever W (only its noise falls, as 1/sqrt(W)); Adam divides by the gradient's running
RMS, so the usual rule for Adam with a mean loss is the same learning rate. The square-root rule
(lr x sqrt(W), Malladi et al. 2022, "On the SDEs and scaling rules for adaptive gradient algorithms")
is the alternative; ``--sqrt-world-sizes`` trains those world sizes under it too, so the two rules are
compared on the same steps; ``--control-lr-scales`` trains W = 1 at the base rate times each scale (rule
``x<scale>``), to tell a larger rate's gain from the larger batch's.

Every run: ``torchrun --standalone --nproc_per_node W -m distnerf.train device=cpu strategy=ddp
dataset=blender dataset.root=LEGO train.max_steps=STEPS eval.num_views=VIEWS eval.lpips=false seed=0``
(gloo on the CPU, one thread per rank), run directory ``--work/w<W>_<rule>``, one run at a time (before
each launch the runner waits while ``--wait-while`` exists: a machine's quiet window). Quality at equal
steps, not timed: the machine may be shared. Writes JSON after every run (``--out``): per run the world
size, rule, learning rate, rays per rank and global, test PSNR / SSIM on the evaluated views, the last
logged training loss, and the difference to W = 1; and a ``meta`` block.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from bench.common import default_out, run_timed, start_meta, write_result

LEGO = "../shared/data/nerf_synthetic_half/lego"


def launch(world_size: int, run_dir: Path, args, lr: float) -> float:
    """Train one run under torchrun; wall seconds. Raises SystemExit with the tail of its log on failure."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world_size}",
           "-m", "distnerf.train", "device=cpu", "strategy=ddp", "dataset=blender", f"dataset.root={args.data}",
           f"run_dir={run_dir}", f"train.max_steps={args.steps}", f"optim.lr={lr}", f"eval.num_views={args.eval_views}",
           "eval.lpips=false", "checkpoints.every=-1", "monitor.log_every=25", "monitor.progress=false",
           "logger.wandb.mode=disabled", "seed=0", *args.set]
    if args.rays_per_rank:
        cmd.append(f"train.rays_per_rank={args.rays_per_rank}")
    return run_timed(cmd, args.threads)


def summarise(run_dir: Path, world_size: int, rule: str, lr: float, wall_s: float) -> dict:
    """One run's row from its metrics.json, metrics.jsonl and train.log."""
    final = json.loads((run_dir / "metrics.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "loss" in r]
    batch_line = next(line for line in (run_dir / "train.log").read_text().splitlines() if "global batch" in line)
    global_rays = int(batch_line.split("global batch ")[1].split()[0])
    return {"world_size": world_size, "rule": rule, "lr": lr, "global_rays": global_rays,
            "rays_per_rank": global_rays // world_size, "steps": steps[-1]["step"], "psnr": final["psnr"],
            "ssim": final["ssim"], "num_views": len(final.get("per_view", [])), "final_train_loss": steps[-1]["loss"],
            "wall_s": round(wall_s, 1), "batch_log": batch_line.split("INFO ", 1)[-1]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-sizes", type=int, nargs="*", default=[1, 2, 4])
    p.add_argument("--sqrt-world-sizes", type=int, nargs="*", default=[4],
                   help="world sizes also trained under the square-root rule (lr x sqrt(W))")
    p.add_argument("--control-lr-scales", type=float, nargs="*", default=[],
                   help="W = 1 also trained at lr x each scale (rule 'x<scale>'): is a larger rate's gain the batch's?")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-views", type=int, default=8)
    p.add_argument("--rays-per-rank", type=int, default=None, help="train.rays_per_rank (default: the schema's)")
    p.add_argument("--lr", type=float, default=None, help="base learning rate (default: the schema's optim.lr)")
    p.add_argument("--threads", type=int, default=1, help="OMP threads per rank")
    p.add_argument("--data", default=LEGO)
    p.add_argument("--set", nargs="*", default=[], help="further training overrides")
    p.add_argument("--work", type=Path, default=Path("runs/per_rank_batch"), help="run directories")
    p.add_argument("--wait-while", type=Path, default=None, help="before each launch, wait while this file exists")
    p.add_argument("--out", type=Path, default=None, help="result JSON (default bench/scaling/results/per_rank_batch/result.json)")
    args = p.parse_args()
    from distnerf.schema import OptimConfig

    base_lr = args.lr if args.lr is not None else OptimConfig().lr
    plan = ([(w, "same") for w in args.world_sizes] + [(w, "sqrt") for w in args.sqrt_world_sizes if w > 1]
            + [(1, f"x{s:g}") for s in args.control_lr_scales])
    out = args.out or default_out(__file__, "per_rank_batch/result.json")
    meta = start_meta()
    runs = []
    for world_size, rule in plan:
        while args.wait_while is not None and args.wait_while.exists():
            time.sleep(20)
        scale = {"same": 1.0, "sqrt": math.sqrt(world_size)}.get(rule)
        lr = base_lr * (float(rule[1:]) if scale is None else scale)  # "x<scale>": a W = 1 control
        run_dir = args.work / f"w{world_size}_{rule}"
        wall = launch(world_size, run_dir, args, lr)
        runs.append(summarise(run_dir, world_size, rule, lr, wall))
        base = next((r["psnr"] for r in runs if r["world_size"] == 1 and r["rule"] == "same"), None)
        for r in runs:
            r["psnr_minus_w1"] = None if base is None else round(r["psnr"] - base, 3)
        print(json.dumps({k: runs[-1][k] for k in ("world_size", "rule", "lr", "global_rays", "psnr",
                                                   "psnr_minus_w1", "wall_s")}), flush=True)
        settings = {k: getattr(args, k) for k in ("steps", "eval_views", "rays_per_rank", "threads", "data", "set",
                                                  "control_lr_scales")}
        write_result(out, {"settings": {**settings, "base_lr": base_lr, "strategy": "ddp", "backend": "gloo"},
                           "runs": runs}, dict(meta))


if __name__ == "__main__":
    main()
