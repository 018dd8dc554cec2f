"""Occupancy refresh of the grid model, both paths in one process (BENCHMARKS.md, lego budget).

    python -m bench.throughput.occupancy [--resolutions 64 128 160] [--repeats 15] [--threads 2]
        [--out bench/throughput/results/occupancy_refresh/bench_occupancy.json]

``GridModel.update_occupancy`` on a bounded field compares the raw density table against the raw
value of the opacity threshold (``GridModel.raw_threshold``) and ORs each voxel's 8 corners; the
opacity path (a 2x2x2 max-pool, softplus, exp, compare), which contracted fields still take, is
what every field took before. Both run here on the same tables, alternating (order flipped every
repeat) after one warm-up each: the table is a lego-like density (an opaque blob in free air,
random raw values around the threshold's), the threshold the grid's default. Each resolution
also checks that both paths mark the same voxels (reported as ``differing_voxels``).

Writes JSON (``meta``: command, date, commit, load before/after): per-repeat milliseconds of each
path, medians and ``opacity_over_raw``. Run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch


from bench.common import default_out, start_meta, write_result
from distnerf.model.grid import GridModel


def lego_like_table(model: GridModel, seed: int = 0) -> None:
    """Fill the density table: free air well below the threshold, an opaque ellipsoid, and noise."""
    m = model.resolution
    axis = torch.linspace(-1, 1, m)
    x, y, z = torch.meshgrid(axis, axis, axis, indexing="ij")
    inside = (x / 0.6) ** 2 + (y / 0.8) ** 2 + (z / 0.5) ** 2 < 1.0
    threshold = model.raw_threshold(model.current_occupancy_threshold(), model.step_size())
    noise = torch.randn((m, m, m), generator=torch.Generator().manual_seed(seed))
    raw = torch.where(inside, threshold + 8.0 + noise, threshold - 6.0 + 2.0 * noise)
    with torch.no_grad():
        model.density.copy_(raw.reshape(-1, 1))


def time_path(model: GridModel, opacity: bool) -> float:
    """Milliseconds of one refresh by the raw-threshold path, or by the opacity path."""
    original = model.raw_threshold
    if opacity:
        model.raw_threshold = lambda threshold, step: None  # the instance's attribute: the opacity path
    try:
        start = time.perf_counter()
        model.update_occupancy()
        return (time.perf_counter() - start) * 1e3
    finally:
        if opacity:
            del model.raw_threshold
        assert model.raw_threshold == original


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resolutions", type=int, nargs="+", default=[64, 128, 160])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=default_out(__file__, "occupancy_refresh") / "bench_occupancy.json")
    args = parser.parse_args(argv)
    meta = start_meta()
    torch.set_num_threads(args.threads)
    rows = []
    for resolution in args.resolutions:
        model = GridModel(torch.tensor([[-1.0] * 3, [1.0] * 3]), torch.zeros(3), resolutions=[resolution],
                          upsample_steps=[], color="sh", tv_weight=0.0, tighten_aabb=False)
        lego_like_table(model)
        time_path(model, opacity=True)
        by_opacity = model.occupancy.binary.clone()
        time_path(model, opacity=False)
        differing = int((model.occupancy.binary != by_opacity).sum())
        raw_ms, opacity_ms = [], []
        for repeat in range(args.repeats):
            for opacity in ((False, True) if repeat % 2 == 0 else (True, False)):
                (opacity_ms if opacity else raw_ms).append(time_path(model, opacity))
        raw_median, opacity_median = statistics.median(raw_ms), statistics.median(opacity_ms)
        rows.append({"resolution": resolution, "voxels": (resolution - 1) ** 3,
                     "occupied_share": round(float(by_opacity.float().mean()), 4), "differing_voxels": differing,
                     "raw_ms": [round(t, 3) for t in raw_ms], "opacity_ms": [round(t, 3) for t in opacity_ms],
                     "raw_ms_median": round(raw_median, 3), "opacity_ms_median": round(opacity_median, 3),
                     "opacity_over_raw": round(opacity_median / raw_median, 3)})
        print(f"{resolution}^3: raw-threshold path {raw_median:.2f} ms, opacity path {opacity_median:.2f} ms "
              f"({opacity_median / raw_median:.2f}x); voxels that differ: {differing}")
    write_result(args.out, {"threads": args.threads, "repeats": args.repeats, "rows": rows}, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
