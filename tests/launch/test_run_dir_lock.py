"""Two runs on one run directory (issue 30, item 5): a second ``distnerf.train`` with the run directory
of a live one is refused at once, naming the live process; the directory of a killed run is free."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.conftest import REPO, run_cli

ARGS = ["experiment=smoke", "dataset=synthetic", "dataset.resolution=24", "monitor.progress=false"]


def test_a_second_run_is_refused_and_a_killed_runs_directory_is_free(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    first = subprocess.Popen([sys.executable, "-m", "distnerf.train", *ARGS, f"run_dir={run_dir}",
                              "train.max_steps=100000", "checkpoints.every=5"], cwd=REPO, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        lock = run_dir / ".train.lock"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (lock.exists() and f"pid {first.pid} " in lock.read_text()):
            assert first.poll() is None, first.stderr.read()
            time.sleep(0.2)
        assert f"pid {first.pid} " in lock.read_text()
        start = time.monotonic()
        second = subprocess.run([sys.executable, "-m", "distnerf.train", *ARGS, f"run_dir={run_dir}"], cwd=REPO,
                                env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode != 0 and time.monotonic() - start < 60
        assert "is in use by another run" in second.stderr and f"pid {first.pid} " in second.stderr, second.stderr
        assert first.poll() is None  # the live run goes on
        while not list((run_dir / "checkpoints").glob("step_*/manifest.json")):  # one committed checkpoint
            assert first.poll() is None
            time.sleep(0.2)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert f"pid {first.pid} " in (run_dir / ".train.lock").read_text()  # the dead run's text is still there
    again = run_cli([sys.executable, "-m", "distnerf.train", *ARGS, f"run_dir={run_dir}", "resume=true",
                     "train.max_steps=12", "eval.enabled=false"], timeout=300)
    assert "is in use" not in again.stderr
