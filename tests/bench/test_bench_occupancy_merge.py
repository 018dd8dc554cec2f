"""bench/scaling/occupancy_merge.py's untimed output: two real gloo ranks, the two merges equal bit for bit and each
one's bytes against its formula (M^3 cells: the all-reduce's M^3-byte buffer; 2 x ceil(M^3 / 8) bytes gathered)."""
from __future__ import annotations

from bench.scaling.occupancy_merge import KINDS, measure, shard_cells


def test_the_occupancy_merge_runner_counts_each_merges_bytes():
    rows = measure(2, [5, 8], occupied=0.5, repeats=1)
    assert [r["resolution"] for r in rows] == [5, 8]
    for r in rows:
        n = r["resolution"] ** 3
        assert r["cells"] == n and r["identical"]
        union = shard_cells(r["resolution"], 0, 2, 0.5) | shard_cells(r["resolution"], 1, 2, 0.5)
        assert r["occupied_share"] == round(float(union.float().mean()), 4) > 0
        assert r["bytes"]["max"] == {"recorded": n, "bus": n}  # 2 (W - 1) / W = 1 at W = 2
        assert r["bytes"]["or_bits"] == {"recorded": 2 * -(-n // 8), "bus": -(-n // 8)}  # 125 cells: 16 bytes a rank
        assert set(r["seconds"]) == set(KINDS) and all(s > 0 for s in r["seconds"].values())
