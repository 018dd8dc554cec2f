"""Evaluation in fixed rounds (issue 49 item 6): the dynamic rounds against the fixed-layout rounds that a
CUDA run takes (``distnerf/renderer/rounds.py``), on the same checkpoint in one process.

    python -m bench.throughput.eval_rounds RUN_DIR [--views 8] [--threads 2] [--sync-chunk 4096]
        [--out bench/throughput/results/eval_rounds/RUN_NAME.json]

The CPU takes the dynamic rounds by default; ``sync_free_paths(True)`` makes it take the fixed ones (what
``sync_free(device)`` selects on CUDA). Both render the same ``--views`` evenly spaced test views of the
run's checkpoint at ``eval.chunk`` rays per chunk, alternating per view (order flipped every view); per
view: seconds, PSNR and ``uptime``. First, host syncs of one chunk of ``--sync-chunk`` rays of the first
view are counted with :class:`~distnerf.observe.syncs.SyncCounter` after a warm-up of both paths (not timed),
with the number of rounds a fixed chunk marches. This machine is shared: the seconds are indicative
(``uptime`` is stored beside them).

Writes JSON (``meta``: command, date, commit, load before/after).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

from bench.common import default_out, start_meta, write_result
from bench.throughput.eval_swap import load_eval_model

PATHS = ("dynamic", "fixed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--views", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sync-chunk", type=int, default=4096, help="rays of the chunk whose host syncs are counted")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    meta = start_meta()

    import torch

    from distnerf.data.rays import image_rays
    from distnerf.engine.evaluate import render_image, select_views
    from distnerf.host_buffers import sync_free_paths
    from distnerf.observe.metrics import psnr
    from distnerf.observe.syncs import SyncCounter
    from distnerf.renderer.rounds import num_rounds

    torch.set_num_threads(args.threads)
    cfg, run_dir, scene, model, step = load_eval_model(args.run_dir)
    chunk, device = int(cfg.eval.chunk), torch.device("cpu")
    views = select_views(len(scene), args.views)
    rays = image_rays(scene.cameras, views[0], scene.near, scene.far, scene.ndc)
    middle = len(rays) // 2 - args.sync_chunk // 2  # the view's middle rows: rays that hit the object
    part = rays.map(lambda t: t[middle:middle + args.sync_chunk])
    syncs = {}
    with torch.no_grad():  # a warm-up of both paths (first-use copies), then counted (one Python call an operator)
        for name in PATHS:
            with sync_free_paths(name == "fixed"):
                model(part)
        for name in PATHS:
            with sync_free_paths(name == "fixed"), SyncCounter() as counter:
                model(part)
            syncs[name] = {"total": counter.total, "by_op": counter.by_op()}
    rows = {name: [] for name in PATHS}
    counts = {}
    for i, v in enumerate(views):
        for name in (PATHS if i % 2 == 0 else PATHS[::-1]):
            with sync_free_paths(name == "fixed"):
                start = time.perf_counter()
                out = render_image(model, scene, v, chunk, device)
                seconds = time.perf_counter() - start
            counts.setdefault(name, {})[v] = out["num_samples"]
            rows[name].append({"view": v, "seconds": seconds, "psnr": psnr(out["rgb"], scene.images[v]),
                               "num_samples": out["num_samples"], "uptime": subprocess.run(
                                   ["uptime"], capture_output=True, text=True).stdout.strip()})
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    rounds = num_rounds(model.occupancy, model.step_size(), model.eval_round_steps)

    med = {k: statistics.median(r["seconds"] for r in v) for k, v in rows.items()}
    mean_psnr = {k: statistics.mean(r["psnr"] for r in v) for k, v in rows.items()}
    report = {"run_dir": str(run_dir), "step": step, "threads": args.threads, "chunk": chunk, "views": views,
              "eval_round_steps": model.eval_round_steps, "fixed_rounds_per_chunk": rounds,
              "rows": rows, "seconds_median": med, "psnr_mean": mean_psnr,
              "fixed_over_dynamic_seconds": med["fixed"] / med["dynamic"],
              "psnr_fixed_minus_dynamic": mean_psnr["fixed"] - mean_psnr["dynamic"],
              "same_num_samples": counts["fixed"] == counts["dynamic"],
              "sync_chunk_rays": args.sync_chunk, "syncs_per_chunk": syncs, "uptime_after_timing": uptime}
    print(f"dynamic {med['dynamic']:.3f} s/view {mean_psnr['dynamic']:.3f} dB, fixed {med['fixed']:.3f} s/view "
          f"{mean_psnr['fixed']:.3f} dB ({rounds} rounds/chunk); syncs per {args.sync_chunk}-ray chunk "
          f"{syncs['dynamic']['total']} -> {syncs['fixed']['total']}; {uptime}")
    write_result(args.out or default_out(__file__, f"eval_rounds/{Path(run_dir).name}.json"), report, meta)


if __name__ == "__main__":
    main()
