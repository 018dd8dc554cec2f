"""The pipelined sampler checks /dev/shm before allocating: too little free space is a clear
error (size needed, size free, the fixes) that leaves no process and no /dev/shm entry."""
from __future__ import annotations

import pytest

from distnerf.sampler import build_sampler
from distnerf.sampler import pipelined
from distnerf.sampler.pipelined import PipelinedSampler, SharedMemoryError, check_shared_memory
from distnerf.sampler.worker import SLOT_FLOATS

from .test_sampler import R, children, shm_entries, tiny_scene

PREFETCH = 3
SLOT_BYTES = 4 * PREFETCH * SLOT_FLOATS * R  # 49 kB


def fake_free(monkeypatch, free: int | None):
    monkeypatch.setattr(pipelined, "shm_free_bytes", lambda path=pipelined.SHM_DIR: free)


def test_too_little_shm_is_a_clear_error_and_leaves_nothing(monkeypatch):
    scene = tiny_scene(num_images=4, height=100, width=100)  # 480 kB of pixels
    fake_free(monkeypatch, 64 * 1024)
    before_shm, before_children = shm_entries(), children()
    with pytest.raises(SharedMemoryError) as info:
        build_sampler({"name": "pipelined", "num_workers": 2, "prefetch": PREFETCH}, scene, R, 0, 0, "cpu")
    text = str(info.value)
    assert "needs 0.5 MB of shared memory (/dev/shm)" in text and "has 0.1 MB free" in text, text
    assert "0.5 MB of images and cameras, 0.0 MB of batch slots" in text, text
    for fix in ("docker run --shm-size=1g", "sampler.cache_dir=DIR", "sampler=sync"):
        assert fix in text, fix
    assert not scene.images.is_shared() and not scene.cameras.c2w.is_shared()  # nothing allocated
    assert children() == before_children  # no worker, no fork server started
    assert shm_entries() <= before_shm


def test_cache_dir_needs_only_the_slots(monkeypatch, tmp_path):
    scene = tiny_scene(num_images=4, height=100, width=100)
    fake_free(monkeypatch, 200 * 1024)  # the slots fit, the pixels would not
    with pytest.raises(SharedMemoryError):
        PipelinedSampler(scene, _spec(), "cpu", 1, PREFETCH)
    sampler = PipelinedSampler(scene, _spec(), "cpu", 1, PREFETCH, cache_dir=str(tmp_path))
    try:
        assert len(sampler.batch(0).rgb) == R
    finally:
        sampler.close()
    fake_free(monkeypatch, 1024)
    with pytest.raises(SharedMemoryError, match="sampler=sync") as info:
        PipelinedSampler(tiny_scene(), _spec(), "cpu", 1, PREFETCH, cache_dir=str(tmp_path / "other"))
    assert "sampler.cache_dir=DIR" not in str(info.value)  # already memory-mapped: not offered again


def test_needed_size_counts_unshared_tensors_and_slots(monkeypatch):
    scene = tiny_scene()
    fake_free(monkeypatch, None)  # no /dev/shm (not Linux): nothing to check, no error
    need = check_shared_memory([scene.images], SLOT_BYTES)
    assert need >= scene.images.numel() * 4 + SLOT_BYTES
    scene.images.share_memory_()
    assert check_shared_memory([scene.images], SLOT_BYTES) < need  # already shared: costs nothing more


def test_real_free_space_is_read():
    free = pipelined.shm_free_bytes()
    assert free is None or free > 0
    assert pipelined.shm_free_bytes("/no/such/dir") is None


def _spec():
    from distnerf.sampler import BatchSpec

    return BatchSpec(R, 0, 0)
