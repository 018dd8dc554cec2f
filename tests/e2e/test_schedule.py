"""``python -m distnerf.train --cfg job`` shows the resolved schedule (the schedules themselves:
tests/unit/test_schedule.py)."""
from __future__ import annotations

import sys

from tests.conftest import REPO


def test_cfg_job_shows_the_resolved_schedule():
    import subprocess

    out = subprocess.run([sys.executable, "-m", "distnerf.train", "--cfg", "job", "--resolve", "train.max_minutes=10"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = next(l for l in out.stdout.splitlines() if l.strip().startswith("schedule:"))
    assert "time budget" in line
