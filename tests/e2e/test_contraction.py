"""Scene contraction refused before training where it cannot apply: NDC rays (a real run of the CLI
on fern; the contraction itself is checked in tests/unit/test_contraction.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import FERN, REPO


@pytest.mark.skipif(not FERN.is_dir(), reason="needs ../shared/data (fern)")
def test_contraction_with_ndc_rays_is_refused_before_training(tmp_path):
    run = subprocess.run([sys.executable, "-m", "distnerf.train", "dataset=llff", f"dataset.root={FERN}",
                          "model.contraction=mipnerf360", f"run_dir={tmp_path / 'run'}", "train.max_steps=1",
                          "logger.wandb.mode=disabled", "sampler=sync"], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode != 0
    assert "model.contraction='mipnerf360' with NDC rays" in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert not list((tmp_path / "run").glob("checkpoints/step_*"))
