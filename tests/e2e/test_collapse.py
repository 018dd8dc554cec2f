"""An occupancy grid that empties during training stops the run like a non-finite loss:
an error naming the step and the likely cause, no checkpoint of the collapsed model.

Real runs of the CLI on the built-in scene (``experiment=smoke``), not a mock: an
occupancy threshold no cell can pass empties the grid at its first refresh.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from distnerf.observe.logger import read_metrics_log
from tests.conftest import REPO


@pytest.mark.parametrize("model, refresh", [("grid", 8), ("ngp", 16)])
def test_an_emptied_occupancy_grid_stops_the_run_naming_the_step(tmp_path, model, refresh):
    run = tmp_path / "run"
    # checkpoints.every=5: a checkpoint before the collapse is kept; none is written after it
    proc = subprocess.run([sys.executable, "-m", "distnerf.train", "experiment=smoke", f"model={model}",
                           "model.occupancy_threshold=0.999", f"model.occupancy_every={refresh}",
                           "checkpoints.every=5", "train.max_steps=40", f"run_dir={run}", "sampler=sync"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    err = proc.stderr
    assert f"training collapsed at step {refresh}" in err and "occupancy grid" in err, err[-2000:]
    assert "occupancy_threshold" in err and "Traceback" not in err, err[-2000:]
    steps = sorted(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*"))
    assert steps and max(steps) < refresh, steps  # nothing saved at or after the collapse
    rows = read_metrics_log(run)
    assert any(r.get("event") == "occupancy_collapse" and r["step"] == refresh for r in rows)
    assert not (run / "metrics.json").exists()  # no evaluation of a collapsed model
