"""Exposed gradient communication of 2-rank ``ddp`` on lego, by the dtype the dense buckets travel in, or with the
colour tables exchanged as rows (``sparse_tables``) (issue 50 item 3's target: <= 10% of the step, gloo).

    ../shared/tools/quiet -- python -m bench.scaling.exposed_comm [--compressions none bf16 sparse_tables] [--repeats 2] \
        [--steps 300] [--eval-views 8] [--out bench/scaling/results/exposed_comm/result.json]

Every run: ``torchrun --standalone --nproc_per_node 2 -m distnerf.train device=cpu strategy=ddp
strategy.compression=C dataset=blender dataset.root=LEGO train.global_rays=2048 train.max_steps=STEPS seed=0``
(gloo over loopback, one thread a rank, the pipelined sampler), the compressions alternating, ``--repeats`` times
each, one at a time. From each rank's profile (``RUN/profile/rank_R.json``, the step breakdown of
``distnerf.observe.breakdown``: exposed = the hooks' own time + the wait from the last bucket's launch to the
backward's return) it takes the exposed share of the step time and the median step; the test PSNR at these
steps says whether the wire dtype costs quality at equal steps. Timed: run it alone (``quiet``); medians over
the repeats. Writes JSON after every run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from bench.common import default_out, run_timed, start_meta, write_result

LEGO = "../shared/data/nerf_synthetic_half/lego"


VARIANTS = {  # label -> the strategy overrides of a run: the dense buckets' wire dtype, or the tables as rows
    "none": ["strategy.compression=none"], "bf16": ["strategy.compression=bf16"], "fp16": ["strategy.compression=fp16"],
    # the colour-feature tables keep their sparse row gradients (lazy Adam, as one process) and travel as rows
    # outside DDP's buckets (strategy/sparse_exchange.py launch_row_exchange)
    "sparse_tables": ["strategy.compression=none", "strategy.sparse_tables=true"],
}


def launch(compression: str, run_dir: Path, args) -> float:
    """Train one run (``compression``: a :data:`VARIANTS` label) under torchrun; wall seconds. Raises SystemExit
    with the tail of its log on failure."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "distnerf.train",
           "device=cpu", "strategy=ddp", *VARIANTS[compression], "dataset=blender",
           f"dataset.root={args.data}", f"run_dir={run_dir}", "train.global_rays=2048", f"train.max_steps={args.steps}",
           "train.max_minutes=0", f"eval.num_views={args.eval_views}", "eval.lpips=false", "checkpoints.every=0",
           "monitor.log_every=50", "monitor.progress=false", "logger.wandb.mode=disabled", "seed=0", *args.set]
    return run_timed(cmd)


def summarise(run_dir: Path, compression: str, repeat: int, wall_s: float) -> dict:
    """One run's row: per rank the exposed share and median step (its profile), and the test PSNR."""
    ranks = []
    for path in sorted((run_dir / "profile").glob("rank_*.json")):
        keys = json.loads(path.read_text())["summary"]["keys"]
        ranks.append({"exposed_share": keys["exposed_comm"]["share"], "exposed_ms_median": 1e3 * keys["exposed_comm"]["median"],
                      "step_ms_median": 1e3 * keys["step_s"]["median"]})
    final = json.loads((run_dir / "metrics.json").read_text())
    return {"compression": compression, "repeat": repeat, "ranks": ranks,
            "exposed_share_mean": statistics.mean(r["exposed_share"] for r in ranks),
            "step_ms_median_mean": statistics.mean(r["step_ms_median"] for r in ranks),
            "psnr": final["psnr"], "wall_s": round(wall_s, 1)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compressions", nargs="*", default=["none", "bf16"], choices=sorted(VARIANTS),
                   help="the variants run side by side (VARIANTS: a wire dtype, or sparse_tables)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-views", type=int, default=8)
    p.add_argument("--data", default=LEGO)
    p.add_argument("--set", nargs="*", default=[], help="further training overrides")
    p.add_argument("--work", type=Path, default=Path("runs/exposed_comm"), help="run directories")
    p.add_argument("--out", type=Path, default=None, help="result JSON (default bench/scaling/results/exposed_comm/result.json)")
    args = p.parse_args()
    out = args.out or default_out(__file__, "exposed_comm/result.json")
    meta = start_meta()
    runs = []
    for repeat in range(args.repeats):
        for compression in args.compressions:
            run_dir = args.work / f"{compression}_r{repeat}"
            runs.append(summarise(run_dir, compression, repeat, launch(compression, run_dir, args)))
            print(json.dumps({k: runs[-1][k] for k in ("compression", "repeat", "exposed_share_mean",
                                                       "step_ms_median_mean", "psnr")}), flush=True)
            medians = {c: {k: statistics.median(r[k] for r in runs if r["compression"] == c)
                           for k in ("exposed_share_mean", "step_ms_median_mean", "psnr")}
                       for c in args.compressions if any(r["compression"] == c for r in runs)}
            write_result(out, {"settings": {"steps": args.steps, "eval_views": args.eval_views, "data": args.data,
                                            "set": args.set, "world_size": 2, "global_rays": 2048, "backend": "gloo"},
                               "runs": runs, "medians": medians}, dict(meta))


if __name__ == "__main__":
    main()
