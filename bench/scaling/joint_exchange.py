"""Joint ss's exchange as the ranks grow: bytes per rank per step of the gathered and the routed exchange at
equal rays per rank (issue 50 item 3, target: the same at W = 2 and 4 within 10%).

    python -m bench.scaling.joint_exchange [--world-sizes 2 4] [--exchanges gather route] [--steps 60] \
        [--rays-per-rank 1024] [--out bench/scaling/results/joint_exchange/result.json]

Every run: ``torchrun --standalone --nproc_per_node W -m distnerf.train device=cpu strategy=ss
strategy.training=joint strategy.joint_exchange=EXCHANGE`` on the built-in aerial scene ``city_small`` with the
aerial study's cheap march (opaque floor, final-stage pruning; conf/study/aerial.yaml), K = W regions on the
ground grid, ``train.rays_per_rank`` rays per rank, ``--steps`` steps, seed 0. ``gather``: every rank draws the
same W x rays_per_rank rays, renders its region's segments of all of them and all-gathers them (the bytes it
contributes: rays x regions of this rank x C floats, C = 8 with the opaque floor); ``route``: each rank draws its
own rays and sends each only to the ranks whose regions it crosses (14 floats a ray), receives their segment values
back and, in the backward, sends their gradients (rays x m x C floats each way). Bytes are rank 0's, from its
metrics log (``exchange_bytes`` summed over the logged steps, over those steps): what it contributes, and what
leaves it on the wire (``moved``: an all-gather's contribution goes to each of the W - 1 others, the
nccl-tests bus convention of ``distnerf.strategy.ddp.bus_bytes``; routed bytes are point-to-point already), beside
the mean number of regions a training ray crosses (the ss start-up log), which routed bytes follow; the
step time is the training log's median, untimed (the machine may be shared: recorded in ``meta``), and the test
PSNR at these few steps only says both train. Writes JSON after every run.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.common import default_out, run_timed, start_meta, write_result

AERIAL = ["dataset=synthetic", "dataset.kind=city_small", "model.contraction=mipnerf360", "model.appearance=affine",
          "model.min_altitude=-0.5", "model.opaque_floor=true", "model.occupancy_threshold_final=0.02",
          "model.cubic_voxels=true", "model.max_params=62500", "model.tv_weight=0", "model.upsample_steps=[20,40]"]


def launch(world_size: int, exchange: str, run_dir: Path, args) -> float:
    """Train one run under torchrun; wall seconds. Raises SystemExit with the tail of its log on failure."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world_size}",
           "-m", "distnerf.train", "device=cpu", "sampler=sync", "strategy=ss", "strategy.training=joint",
           f"strategy.joint_exchange={exchange}", *AERIAL, f"run_dir={run_dir}", f"train.max_steps={args.steps}",
           "train.max_minutes=0", f"train.rays_per_rank={args.rays_per_rank}", "monitor.log_every=10",
           "checkpoints.every=0", "monitor.progress=false", "eval.num_views=2", "eval.lpips=false",
           "logger.wandb.mode=disabled", "seed=0", *args.set]
    return run_timed(cmd)


def summarise(run_dir: Path, world_size: int, exchange: str, wall_s: float) -> dict:
    """One run's row: rank 0's exchange bytes per step (logged rows that carry them), the step median, PSNR."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    logged = [r for r in rows if "exchange_bytes" in r and "step" in r]
    steps = [r["step"] for r in logged]
    covered = steps[-1] - (steps[0] - (steps[1] - steps[0])) if len(steps) > 1 else None  # the first row's window too
    total = sum(r["exchange_bytes"] for r in logged)
    log = (run_dir / "train.log").read_text()
    median = [line for line in log.splitlines() if "profile rank 0: step median" in line]
    final = json.loads((run_dir / "metrics.json").read_text())
    crossed = [line for line in log.splitlines() if "'regions_crossed_mean': " in line]
    crossed_mean = float(crossed[0].split("'regions_crossed_mean': ")[1].split(",")[0]) if crossed else None
    per_step = total / covered if covered else None
    # what leaves rank 0 on the wire: an all-gather's contribution travels to the W - 1 others (the
    # nccl-tests bus convention, distnerf.strategy.ddp.bus_bytes); routed rows are point-to-point already
    moved = per_step * (world_size - 1) if per_step is not None and exchange == "gather" else per_step
    return {"world_size": world_size, "regions": world_size, "exchange": exchange,
            "bytes_per_step_rank0": per_step, "moved_bytes_per_step_rank0": moved,
            "regions_crossed_mean": crossed_mean, "logged_steps": covered,
            "exchange_calls": sum(r.get("exchange_calls", 0) for r in logged),
            "step_ms_median": float(median[-1].split("step median ")[1].split(" ms")[0]) if median else None,
            "psnr": final["psnr"], "wall_s": round(wall_s, 1)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-sizes", type=int, nargs="*", default=[2, 4])
    p.add_argument("--exchanges", nargs="*", default=["gather", "route"])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--rays-per-rank", type=int, default=1024)
    p.add_argument("--set", nargs="*", default=[], help="further training overrides")
    p.add_argument("--work", type=Path, default=Path("runs/joint_exchange"), help="run directories")
    p.add_argument("--out", type=Path, default=None,
                   help="result JSON (default bench/scaling/results/joint_exchange/result.json)")
    args = p.parse_args()
    out = args.out or default_out(__file__, "joint_exchange/result.json")
    meta = start_meta()
    runs = []
    for exchange in args.exchanges:
        for world_size in args.world_sizes:
            run_dir = args.work / f"{exchange}_w{world_size}"
            runs.append(summarise(run_dir, world_size, exchange, launch(world_size, exchange, run_dir, args)))
            print(json.dumps(runs[-1]), flush=True)
            for r in runs:  # the growth from the smallest world size, per exchange
                first = next(x for x in runs if x["exchange"] == r["exchange"])
                for key in ("bytes_per_step_rank0", "moved_bytes_per_step_rank0"):
                    r[key.replace("_per_step_rank0", "_vs_smallest_w")] = r[key] / first[key] if first[key] else None
            write_result(out, {"settings": {"steps": args.steps, "rays_per_rank": args.rays_per_rank,
                                            "scene": AERIAL, "set": args.set, "backend": "gloo"},
                               "runs": runs}, dict(meta))


if __name__ == "__main__":
    main()
