"""Where the sparse gradient exchange stops paying: dense all-reduce against the counted and the bounded sparse
exchange of one DDP bucket, timed at several world sizes and densities (issue 50 item 3: the crossover
measured as W grows, bytes and time).

    python -m bench.scaling.exchange [--world-sizes 2 4] [--numel 4194304] [--densities 0.001 0.01 0.05 0.1 0.25 0.5]
        [--repeats 15] [--out bench/scaling/results/exchange_crossover/result.json]

Each world size is one group of W spawned gloo processes (one thread each, ``tests.conftest``-style, on this
machine's loopback). Every rank fills a float32 bucket of ``--numel`` entries with non-zeros at ``density`` x numel
random positions (its own positions: ranks' rows overlap as training rays' do), then times, alternating the
three in turn after one warm-up each: ``dense`` (the ring all-reduce DDP's hook runs, :func:`distnerf.distributed.all_reduce_`),
``counted`` (:func:`distnerf.strategy.sparse_exchange.sparse_allreduce_`: a count all-gather, then the
pairs) and ``bounded`` (:func:`~distnerf.strategy.sparse_exchange.bounded_sparse_allreduce_` with a capacity of
exactly the non-zeros, i.e. a bound that holds with no slack). Seconds are rank 0's, barrier to barrier, median
over ``--repeats``; bytes are what a rank sends (the hook's own counts). For each (W, density) it reports which
exchange was fastest and what the package's byte rule (:func:`~distnerf.strategy.sparse_exchange.sparse_pays`)
would choose. At W > cores the ranks share cores: the times then include the sharing (recorded: ``cpu_count``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from bench.common import default_out, free_port, start_meta, write_result

KINDS = ("dense", "counted", "bounded")


def _rank(rank: int, world_size: int, port: int, numel: int, densities: list[float], repeats: int, out: str) -> None:
    import json

    import torch.distributed as dist

    from distnerf import distributed as D
    from distnerf.strategy.sparse_exchange import bounded_sparse_allreduce_, sparse_allreduce_

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world_size, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    gen = torch.Generator().manual_seed(1000 + rank)
    rows = []
    for density in densities:
        nnz = max(1, int(density * numel))
        index = torch.randperm(numel, generator=gen)[:nnz]
        values = torch.randn(nnz, generator=gen)
        cap = torch.tensor([nnz])
        D.all_reduce_(cap, op="max")  # the bounded exchange's capacity: every rank's count (the same everywhere)

        def fresh() -> torch.Tensor:
            buf = torch.zeros(numel)
            buf[index] = values
            return buf

        def run(kind: str) -> tuple[float, int]:
            buf = fresh()
            dist.barrier()
            t0 = time.perf_counter()
            if kind == "dense":
                buf.div_(world_size)
                D.all_reduce_(buf)
                nbytes = buf.numel() * buf.element_size()
            elif kind == "counted":
                nbytes = sparse_allreduce_(buf, world_size, max_density=1.0)
            else:
                nbytes, _ = bounded_sparse_allreduce_(buf, world_size, int(cap))
            dist.barrier()
            return time.perf_counter() - t0, int(nbytes)

        times = {k: [] for k in KINDS}
        sent = {}
        for k in KINDS:
            run(k)  # warm-up
        for r in range(repeats):
            order = KINDS if r % 2 == 0 else KINDS[::-1]
            for k in order:
                s, sent[k] = run(k)
                times[k].append(s)
        rows.append({"density": density, "nonzeros_per_rank": nnz, "capacity": int(cap),
                     "seconds": {k: statistics.median(v) for k, v in times.items()},
                     "seconds_all": times, "bytes_per_rank": sent})
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def measure(world_size: int, numel: int, densities: list[float], repeats: int) -> list[dict]:
    import json
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        mp.start_processes(_rank, args=(world_size, free_port(), numel, densities, repeats, out), nprocs=world_size,
                           start_method="spawn", join=True)
        return json.loads(Path(out).read_text())


def main(argv: list[str] | None = None) -> None:
    from distnerf.strategy.sparse_exchange import sparse_pays

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    p.add_argument("--numel", type=int, default=4 * 1024 * 1024)
    p.add_argument("--densities", type=float, nargs="+", default=[0.001, 0.01, 0.05, 0.1, 0.25, 0.5])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    meta = start_meta()
    results = []
    for w in args.world_sizes:
        for row in measure(w, args.numel, args.densities, args.repeats):
            sec = row["seconds"]
            fastest = min(KINDS, key=sec.get)
            sparse_best = min(("counted", "bounded"), key=sec.get)
            rule = "sparse" if sparse_pays(row["capacity"], args.numel, w, 4, 4) else "dense"
            results.append({"world_size": w, **row, "fastest": fastest, "rule_chooses": rule,
                            "rule_agrees": (rule == "dense") == (fastest == "dense"),
                            "sparse_over_dense_time": sec[sparse_best] / sec["dense"],
                            "sparse_over_dense_bytes": row["bytes_per_rank"]["bounded"] / row["bytes_per_rank"]["dense"]})
            print(f"W={w} density={row['density']:g}: " + ", ".join(f"{k} {1e3 * sec[k]:.2f} ms" for k in KINDS)
                  + f"; fastest {fastest}, byte rule {rule}", flush=True)
    report = {"settings": {"numel": args.numel, "dtype": "float32", "repeats": args.repeats, "threads_per_rank": 1,
                           "backend": "gloo"}, "rows": results}
    write_result(args.out or default_out(__file__, "exchange_crossover/result.json"), report, meta)


if __name__ == "__main__":
    main()
