"""``python -m distnerf.render video=PATH`` / ``orbit=true`` end to end on a tiny run (built-in scene, ~15 s)."""
from __future__ import annotations

import sys

import imageio.v3 as iio

from tests.conftest import run_cli


def test_fly_through_and_orbit_videos_have_the_frames_asked_for(tmp_path, synthetic_cache):
    run = tmp_path / "run"
    run_cli([sys.executable, "-m", "distnerf.train", "experiment=smoke", "monitor.progress=false", "train.max_steps=4",
             "checkpoints.every=0", "eval.enabled=false", "sampler=sync", f"run_dir={run}",
             f"dataset.cache_dir={synthetic_cache}"])
    video = tmp_path / "videos" / "fly.gif"  # the folder is made
    proc = run_cli([sys.executable, "-m", "distnerf.render", f"run_dir={run}", "eval.num_views=1", f"video={video}",
                    "video_frames=7", "video_fps=10", "orbit=true"])
    frames = iio.imread(video, index=None)
    assert frames.shape == (7, 40, 40, 3), proc.stderr[-2000:]
    assert iio.imread(run / "render" / "orbit.gif", index=None).shape == (7, 40, 40, 3)
    assert f"video: 7 frames (40x40) -> {video}" in proc.stderr
