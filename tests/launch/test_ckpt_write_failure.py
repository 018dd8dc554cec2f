"""A checkpoint write that fails for real (issue 30, item 3): the writer runs under a file-size limit
(RLIMIT_FSIZE, SIGXFSZ ignored, so write() fails with EFBIG as on a full disk); the run stops with an
error naming the file and the cause, the previous committed checkpoint stays loadable, the torn
directory is gone, and resume=true continues from the committed one."""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys

from distnerf import checkpoint as ckpt
from tests.conftest import REPO, run_cli

ARGS = ["experiment=smoke", "dataset=synthetic", "dataset.resolution=24", "monitor.progress=false",
        "eval.enabled=false", "checkpoints.every=10"]


def limited(max_bytes: int):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails (EFBIG) instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
    return apply


def test_a_failed_checkpoint_write_stops_the_run_and_loses_nothing(tmp_path):
    run_dir = tmp_path / "run"
    run_cli([sys.executable, "-m", "distnerf.train", *ARGS, f"run_dir={run_dir}", "train.max_steps=10"])
    first = ckpt.latest(run_dir / "checkpoints")
    assert first is not None and ckpt.read_manifest(first, verify=True)["step"] == 10
    model_bytes = (first / "model.pt").stat().st_size
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-m", "distnerf.train", *ARGS, f"run_dir={run_dir}", "resume=true",
                           "train.max_steps=30"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=limited(model_bytes // 2))
    assert proc.returncode != 0
    err = proc.stderr
    assert "not committed" in err and "step_00000020" in err and "File too large" in err, err[-3000:]
    assert f"{first}" in err and "resume=true continues from it" in err
    assert "Traceback" not in err  # the message is the story
    assert [d.name for d in ckpt.committed(run_dir / "checkpoints")] == [first.name]
    assert ckpt.read_manifest(first, verify=True)["step"] == 10  # still loadable, checksums intact
    assert not (run_dir / "checkpoints" / "step_00000020").exists()  # the torn directory is gone
    assert not list((run_dir / "checkpoints").rglob("*.tmp"))
    run_cli([sys.executable, "-m", "distnerf.train", *ARGS, f"run_dir={run_dir}", "resume=true", "train.max_steps=20"])
    last = ckpt.latest(run_dir / "checkpoints")
    assert ckpt.read_manifest(last, verify=True)["step"] == 20
    assert f"resumed from {first} at step 10" in (run_dir / "train.log").read_text()


def test_a_failed_pixel_cache_write_is_named_and_never_mapped(tmp_path):
    cache = tmp_path / "cache"
    common = [*ARGS, f"sampler.cache_dir={cache}", "train.max_steps=2", "checkpoints.every=0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-m", "distnerf.train", *common, f"run_dir={tmp_path / 'a'}"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300, preexec_fn=limited(20_000))
    assert proc.returncode != 0
    assert "could not write the pixel cache" in proc.stderr and "File too large" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not list(cache.glob("pixels-*.npy")) and not list(cache.glob("*.tmp"))  # nothing partial to map
    run_cli([sys.executable, "-m", "distnerf.train", *common, f"run_dir={tmp_path / 'b'}"])  # no limit: built, trained
    assert len(list(cache.glob("pixels-*.npy"))) == 1
