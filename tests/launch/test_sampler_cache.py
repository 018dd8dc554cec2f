"""The trainer trains from the pixel cache under torchrun: two ranks, one cache built once, and a
resume with a sampler setting that changes the drawn rays refused (the cache itself:
tests/unit/test_sampler_cache.py)."""
from __future__ import annotations

import os

import torch

from distnerf.data import load_scene
from distnerf.sampler.cache import open_pixel_cache
from tests.conftest import REPO, run_cli, torchrun


def test_two_ranks_train_from_one_cache_built_once(tmp_path, synthetic_cache):
    import subprocess

    cache_dir = tmp_path / "pixels"
    args = torchrun(2) + ["-m", "distnerf.train", "experiment=smoke", "device=cpu", f"run_dir={tmp_path / 'run'}",
                          f"dataset.cache_dir={synthetic_cache}", "sampler=pipelined", "sampler.num_workers=1",
                          f"sampler.cache_dir={cache_dir}", "train.max_steps=2", "checkpoints.every=0",
                          "monitor.progress=false", "eval.enabled=false"]
    proc = run_cli(args)
    log = proc.stdout + proc.stderr
    assert log.count("building the pixel cache") <= 1, log[-3000:]  # (only rank 0 logs INFO)
    (path,) = cache_dir.glob("pixels-*.npy")
    assert not list(cache_dir.glob("*.tmp"))
    synthetic = load_scene({"name": "synthetic", "cache_dir": str(synthetic_cache), "resolution": 40}, "train")
    assert torch.equal(open_pixel_cache(path), synthetic.images)
    assert (tmp_path / "run" / "metrics.jsonl").exists()
    # resuming with a sampler setting that changes the drawn rays is refused, naming the section
    refused = subprocess.run(args + ["resume=true", "train.max_steps=4", "sampler.policy=per_image"], cwd=REPO,
                             capture_output=True, text=True, timeout=600,
                             env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"})
    assert refused.returncode != 0 and "the sampler config differs" in refused.stdout + refused.stderr
