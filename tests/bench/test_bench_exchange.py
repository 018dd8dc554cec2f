"""bench/scaling/exchange.py's untimed output: two real gloo ranks, each exchange's bytes against its formula."""
from __future__ import annotations

from bench.scaling.exchange import KINDS, measure


def test_the_crossover_runner_counts_each_exchanges_bytes():
    numel = 4096
    rows = measure(2, numel, [0.01, 0.5], repeats=1)
    assert [r["density"] for r in rows] == [0.01, 0.5]
    for r in rows:
        nnz = int(r["density"] * numel)
        assert r["nonzeros_per_rank"] == nnz and r["capacity"] == nnz  # both ranks draw the same count
        sent = r["bytes_per_rank"]
        assert sent["dense"] == numel * 4  # float32, the whole bucket
        assert sent["bounded"] == nnz * (4 + 4)  # int32 index + float32 value per slot
        assert sent["counted"] == nnz * (8 + 4)  # int64 index (nonzero's) + float32 value, padded to the max count
        assert set(r["seconds"]) == set(KINDS) and all(s > 0 for s in r["seconds"].values())
