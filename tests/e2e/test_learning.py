"""End to end: the CLI trains, renders and learns (PSNR floors set from measurement).

The built-in scene run is short; the lego and fern runs are slow-marked, short and
low-resolution, and catch camera-convention, LLFF axis-order and NDC bugs (a wrong
convention leaves PSNR near that of a constant image).
"""
from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import FERN, LEGO, run_cli

# floors 1.5 dB under what the packed-sample engine measured (2026-12-01, 2-core CPU, these exact runs, one thread):
# tight enough that a half-pixel, NDC-step or compositing bug fails them
BUILTIN_FLOOR = 24.1  # measured 25.65 dB (200 steps at [48, 64], 2 threads, 2026-12-02 00:10)
LEGO_FLOOR = 24.6  # measured 26.17 dB at 100x100 (200 steps at [48, 64], 2026-12-01 23:20)
FERN_FLOOR = 19.5  # measured 20.99 dB at 252x189 (eval.downscale=2; 200 steps of 1024 rays at [48, 64], 2026-12-02 00:01)


def train(run_dir, *overrides):
    # one process on the 2-core machine: both cores (the floors were measured so)
    run_cli([sys.executable, "-m", "distnerf.train", f"run_dir={run_dir}", "monitor.progress=false",
             "logger.wandb.mode=disabled", "eval.lpips=false", *overrides], env={"OMP_NUM_THREADS": "2"})
    return json.loads((run_dir / "metrics.json").read_text())


def test_builtin_scene_learns(tmp_path, synthetic_cache):
    m = train(tmp_path, f"dataset.cache_dir={synthetic_cache}", "dataset.resolution=64", "train.max_steps=200",
              "train.global_rays=2048", "model.resolutions=[48,64]", "model.upsample_steps=[100]",
              "eval.num_views=4", "checkpoints.every=0")
    assert m["psnr"] > BUILTIN_FLOOR, m["psnr"]
    assert m["protocol"]["num_views"] == 4 and m["protocol"]["resolution"] == [64, 64]
    assert m["lpips"] is None and m["lpips_reason"]


@pytest.mark.slow
@pytest.mark.skipif(not LEGO.exists(), reason=f"{LEGO} not present")
def test_lego_low_res_learns(tmp_path):
    m = train(tmp_path, "dataset=blender", f"dataset.root={LEGO}", "dataset.downscale=4", "train.max_steps=200",
              "train.global_rays=2048", "model.resolutions=[48,64]", "model.upsample_steps=[100]",
              "eval.num_views=4", "checkpoints.every=0")
    assert m["psnr"] > LEGO_FLOOR, m["psnr"]


@pytest.mark.slow
@pytest.mark.skipif(not FERN.exists(), reason=f"{FERN} not present")
def test_fern_ndc_learns(tmp_path):
    m = train(tmp_path, "dataset=llff", f"dataset.root={FERN}", "train.max_steps=200", "train.global_rays=1024",
              "model.resolutions=[48,64]", "model.upsample_steps=[100]", "eval.downscale=2",
              "checkpoints.every=0")
    assert m["protocol"]["num_views"] == 3  # images 0, 8, 16
    assert m["psnr"] > FERN_FLOOR, m["psnr"]
