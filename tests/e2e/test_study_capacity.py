"""The capacity study end to end on its smoke version (conf/study/capacity_smoke.yaml: 6 real cells, two
seeds each): the capacity curve, quality against ranks, their figures, the constant-colour level and
the wall time, from real runs; the statistics themselves are checked by hand in tests/unit/test_study_capacity.py."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from PIL import Image

from tests.conftest import REPO

CONFIG = REPO / "conf" / "study" / "capacity_smoke.yaml"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("study") / "capacity_smoke"
    proc = subprocess.run([sys.executable, "-m", "distnerf.study", "run", str(CONFIG), str(root)], cwd=REPO,
                          env={**os.environ, "WANDB_MODE": "disabled"}, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return root, json.loads((root / "report" / "report.json").read_text())


def test_the_capacity_curve_and_quality_against_ranks_from_real_cells(report):
    root, rep = report
    assert rep["status"] == {"done": 6}
    cells = {c["id"]: c for c in rep["cells"]}
    cap = rep["tables"]["capacity"]
    assert [r["budget"] for r in cap] == ["p20k", "p40k"]
    for row in cap:
        runs = [cells[f"ddp-w1-{row['budget']}-r{r}"]["figures"] for r in (0, 1)]
        assert row["n"] == 2 and row["psnr_mean"] == pytest.approx((runs[0]["psnr"] + runs[1]["psnr"]) / 2)
        assert row["psnr_sd"] is not None and row["psnr_sd"] >= 0
        assert 0 < row["params_per_rank"] <= int(row["budget"][1:-1]) * 1000  # within its budget
        assert 0 < row["constant_psnr"] < 100  # the trivial level beside it (12 steps do not beat it)
        assert row["gain_last_max"] is not None  # the validation curve (every 4 of 12 steps) reaches back 20 %
    # dB per doubling worked out here from the cells' own figures (test PSNR and parameters of each run),
    # not from the table: (mean PSNR at p40k - mean at p20k) / log2(parameters at p40k / at p20k)
    psnr = {b: [cells[f"ddp-w1-{b}-r{r}"]["figures"]["psnr"] for r in (0, 1)] for b in ("p20k", "p40k")}
    params = {b: {cells[f"ddp-w1-{b}-r{r}"]["figures"]["parameters_per_rank"] for r in (0, 1)} for b in psnr}
    assert all(len(p) == 1 for p in params.values()), params  # the seeds change no model size
    (small,), (large,) = params["p20k"], params["p40k"]
    assert small < large
    gain = (sum(psnr["p40k"]) / 2 - sum(psnr["p20k"]) / 2) / math.log2(large / small)
    assert cap[1]["db_per_doubling"] == pytest.approx(gain, abs=1e-9)
    ranks = rep["tables"]["ranks"]
    joint = [r for r in ranks if r["strategy"] == "ss_joint"]
    assert [r["world_size"] for r in joint] == [1, 2] and joint[0]["source"].startswith("ddp-w1-p20k")
    assert joint[1]["n"] == 2 and joint[1]["delta_vs_w1"] == pytest.approx(joint[1]["psnr_mean"] - cap[0]["psnr_mean"])
    assert any(v.startswith("capacity curve at budget p20k") for v in rep["tables"]["verdicts"])
    assert rep["timing"]["cells_wall_s"] > 0 and rep["timing"]["first_cell_started"]


def test_the_capacity_figures_and_the_page(report):
    root, rep = report
    out = root / "report"
    assert {"capacity.png", "ranks.png", "ranks_views.png"} <= set(rep["figures"])
    for name in ("capacity.png", "ranks.png", "ranks_views.png"):
        with Image.open(out / name) as im:
            im.verify()
    page = (out / "report.html").read_text()
    assert "Capacity: test PSNR against parameters per rank" in page and "Quality against ranks" in page
    assert "Wall time: cells from" in page
