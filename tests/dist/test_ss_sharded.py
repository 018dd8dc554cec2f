"""The sharded joint model of ``strategy=ss`` on two gloo ranks: four shards of one contracted model, two per
rank (2 x 2 through the centre, so both cut planes cross between ranks), render and train exactly as the one
model held by every rank (float64; ``tests/sharded_case.py``): the segment all-gather, the occupancy merge's
bit-packed all-gather (``D.all_reduce_or``) and the face copies' gradient all-reduces all run across the ranks."""
from __future__ import annotations

import json

from tests import sharded_case as case
from tests.conftest import spawn


def test_two_ranks_hold_one_model_sharded(tmp_path):
    spawn(case.sharded_worker, 2, "mipnerf360", 4, str(tmp_path), timeout=240)
    results = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in range(2)]
    for r, res in enumerate(results):
        assert "error" not in res, res.get("error")
        assert res["regions"] == [2 * r, 2 * r + 1]
        assert res["occupancy_equal"] and res["occupancy_equal_20"]
        for when in ("step0", "step20"):
            d = res[when]
            assert d["rgb_abs"] < 1e-9 and d["grad_rel"] < 1e-9, (r, when, d)
        assert res["face_bytes"] > 0 and res["occupancy_bytes"] > 0  # face planes and occupancy crossed the ranks
        # the occupancy merge: D.all_reduce_or, bit for bit the all-reduce (max) it replaced, and its bytes
        assert res["or_checks"] == {"by_hand": True, "max": True, "flag_209": True}
        cells = res["occupancy_cells"]
        assert len(cells) == 4  # the merge in sharded(), then the refreshes at steps 8, 10 (upsampling) and 16
        assert res["occupancy_bytes"] == sum(2 * -(-n // 8) for n in cells) < sum(cells) / 3  # W x M^3 / 8 each
