"""The sharded joint model's occupancy merge: the bit-packed OR (:func:`distnerf.distributed.all_reduce_or`, one
all-gather of 8 cells a byte) against the all-reduce (max) of one byte a cell that it replaced, bytes and time per
merge.

    python -m bench.scaling.occupancy_merge [--world-size 2] [--resolutions 64 128] [--occupied 0.3] [--repeats 15]
        [--out bench/scaling/results/occupancy_merge/result.json]

One group of W spawned gloo processes (one thread each, on this machine's loopback), as
``bench/scaling/exchange.py``. For each resolution M every rank holds an (M, M, M) bool grid, the cells of its
shard (its slab of the x axis, ``--occupied`` of them set at random, the rest empty), and merges it as
:meth:`~distnerf.strategy.regions.JointRegionModels.merge_occupancy` does, timed barrier to barrier, alternating
the two after one warm-up each: ``max`` (``all_reduce_(grid.to(uint8), "max") > 0``) and ``or_bits``
(``all_reduce_or(env, grid)``). Seconds are rank 0's median over ``--repeats``. Bytes are exact, per merge and
rank: ``recorded`` is what the merge counts in ``occupancy_bytes`` (the all-reduce's M^3-byte buffer; the W x
ceil(M^3 / 8) bytes the all-gather delivers), ``bus`` the nccl-tests bus convention of
:func:`distnerf.strategy.ddp.bus_bytes` (what leaves a rank: 2 (W - 1) / W x M^3; (W - 1) x ceil(M^3 / 8)). Every
merge's result is checked against the other's, bit for bit (``identical``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.common import default_out, free_port, start_meta, write_result

KINDS = ("max", "or_bits")


def shard_cells(resolution: int, rank: int, world_size: int, occupied: float) -> torch.Tensor:
    """Rank ``rank``'s cells: ``occupied`` of its slab of the x axis set (seeded by rank), the rest empty."""
    gen = torch.Generator().manual_seed(2000 + rank)
    cells = torch.rand((resolution,) * 3, generator=gen) < occupied
    slab = torch.zeros(resolution, dtype=torch.bool)
    slab[rank * resolution // world_size:(rank + 1) * resolution // world_size] = True
    return cells & slab[:, None, None]


def merge_bytes(kind: str, numel: int, world_size: int) -> dict:
    """One merge's bytes per rank: ``recorded`` (the merge's own count) and ``bus`` (nccl-tests' convention)."""
    from distnerf import distributed as D
    from distnerf.strategy.ddp import bus_bytes

    if kind == "max":
        return {"recorded": numel, "bus": bus_bytes("all_reduce", numel, world_size)}
    return {"recorded": D.all_reduce_or_bytes(world_size, numel), "bus": bus_bytes("all_gather", -(-numel // 8), world_size)}


def _rank(rank: int, world_size: int, port: int, resolutions: list[int], occupied: float, repeats: int,
          out: str) -> None:
    import torch.distributed as dist

    from distnerf import distributed as D

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world_size, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    env = D.DistEnv(rank=rank, world_size=world_size, backend="gloo")
    rows = []
    for resolution in resolutions:
        cells = shard_cells(resolution, rank, world_size, occupied)
        merged = {}

        def run(kind: str) -> float:
            dist.barrier()
            t0 = time.perf_counter()
            if kind == "max":
                t = cells.to(torch.uint8)
                D.all_reduce_(t, "max")
                merged[kind] = t > 0
            else:
                merged[kind] = D.all_reduce_or(env, cells)
            dist.barrier()
            return time.perf_counter() - t0

        for k in KINDS:
            run(k)  # warm-up
        times = {k: [] for k in KINDS}
        for r in range(repeats):
            for k in (KINDS if r % 2 == 0 else KINDS[::-1]):
                times[k].append(run(k))
        numel = cells.numel()
        rows.append({"resolution": resolution, "cells": numel,
                     "occupied_share": round(float(merged["max"].float().mean()), 4),
                     "identical": bool(torch.equal(merged["max"], merged["or_bits"])),
                     "bytes": {k: merge_bytes(k, numel, world_size) for k in KINDS},
                     "seconds": {k: statistics.median(v) for k, v in times.items()}, "seconds_all": times})
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def measure(world_size: int, resolutions: list[int], occupied: float, repeats: int) -> list[dict]:
    """Rank 0's rows, one per resolution (module docstring)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        mp.start_processes(_rank, args=(world_size, free_port(), resolutions, occupied, repeats, out),
                           nprocs=world_size, start_method="spawn", join=True)
        return json.loads(Path(out).read_text())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--resolutions", type=int, nargs="+", default=[64, 128])
    p.add_argument("--occupied", type=float, default=0.3, help="share of a rank's own cells that are set")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    meta = start_meta()
    rows = measure(args.world_size, args.resolutions, args.occupied, args.repeats)
    for r in rows:
        sec, recorded = r["seconds"], {k: r["bytes"][k]["recorded"] for k in KINDS}
        r["or_bits_over_max_time"] = sec["or_bits"] / sec["max"]
        r["or_bits_over_max_bytes"] = recorded["or_bits"] / recorded["max"]
        print(f"{r['resolution']}^3: max {1e3 * sec['max']:.2f} ms {recorded['max']:,} B, or_bits "
              f"{1e3 * sec['or_bits']:.2f} ms {recorded['or_bits']:,} B; identical {r['identical']}", flush=True)
    report = {"settings": {"world_size": args.world_size, "occupied": args.occupied, "repeats": args.repeats,
                           "threads_per_rank": 1, "backend": "gloo"}, "rows": rows}
    write_result(args.out or default_out(__file__, "occupancy_merge/result.json"), report, meta)


if __name__ == "__main__":
    main()
