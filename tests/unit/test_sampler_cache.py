"""The decoded, memory-mapped pixel cache (distnerf.sampler.cache): built image by image
from the parser's image list, equal to the decoded images, reused without decoding,
one builder among concurrent ones (a dead builder neither blocks nor leaves a torn
file), damaged files rebuilt with a warning (the trainer training from it under torchrun:
tests/launch/test_sampler_cache.py).
"""
from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import distnerf.data.images as images_module
from distnerf.data import load_scene
from distnerf.sampler import BatchSpec, PipelinedSampler, PixelCache, SyncSampler
from distnerf.fileio import exclusive_lock
from distnerf.sampler.cache import cached_file, open_pixel_cache
from tests.conftest import FERN

NUM_IMAGES, H, W = 12, 24, 32


def write_blender_scene(root: Path, num_images: int = NUM_IMAGES, height: int = H, width: int = W) -> dict:
    """A Blender-format scene of random RGBA PNGs; returns its dataset config."""
    rng = np.random.default_rng(0)
    (root / "train").mkdir(parents=True)
    frames = []
    for i in range(num_images):
        Image.fromarray(rng.integers(0, 256, (height, width, 4), dtype=np.uint8), "RGBA").save(root / f"train/r_{i}.png")
        pose = np.eye(4)
        pose[:3, 3] = [0.0, 0.0, 4.0 + 0.1 * i]
        frames.append({"file_path": f"./train/r_{i}", "transform_matrix": pose.tolist()})
    (root / "transforms_train.json").write_text(json.dumps({"camera_angle_x": 0.7, "frames": frames}))
    return {"name": "blender", "root": str(root)}


@pytest.fixture()
def blender(tmp_path):
    return write_blender_scene(tmp_path / "scene")


class CountDecodes:
    """Counts ``read_image`` calls (image decodes) while installed."""

    def __init__(self, monkeypatch=None):
        self.calls, self._read = 0, images_module.read_image
        if monkeypatch is not None:
            monkeypatch.setattr(images_module, "read_image", self)

    def __call__(self, path):
        self.calls += 1
        return self._read(path)


def capture_warnings():
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logging.getLogger("distnerf").addHandler(handler)
    return records, handler


def test_cache_equals_decoded_images_and_is_reused(blender, tmp_path, monkeypatch):
    cache_dir = tmp_path / "cache"
    for downscale in (1, 2):
        cfg = {**blender, "downscale": downscale}
        reference = load_scene(cfg, "train")
        scene = load_scene(cfg, "train", pixels=PixelCache(cache_dir))
        assert scene.images.shape == (NUM_IMAGES, H // downscale, W // downscale, 3)
        assert torch.equal(scene.images, reference.images)
        path = cached_file(scene.images)
        assert path is not None and path in open("/proc/self/maps").read()  # a mapping of the file, not a copy
        assert torch.equal(scene.cameras.c2w, reference.cameras.c2w) and scene.width == reference.width
    files = sorted(cache_dir.glob("pixels-*.npy"))
    assert len(files) == 2  # one per decoding recipe (downscale)
    stamps = [f.stat().st_mtime_ns for f in files]
    counter = CountDecodes(monkeypatch)
    again = load_scene({**blender, "downscale": 2}, "train", pixels=PixelCache(cache_dir))
    assert counter.calls == 0 and cached_file(again.images) in map(str, files)  # reused: nothing decoded
    assert [f.stat().st_mtime_ns for f in files] == stamps
    assert not list(cache_dir.glob("*.tmp"))
    # a replaced image file changes the fingerprint: a new cache, not stale pixels
    Image.new("RGBA", (W, H), (255, 0, 0, 255)).save(Path(blender["root"]) / "train/r_3.png")
    changed = load_scene(blender, "train", pixels=PixelCache(cache_dir))
    assert counter.calls == NUM_IMAGES and torch.equal(changed.images[3], torch.tensor([1.0, 0, 0]).expand(H, W, 3))


@pytest.mark.skipif(not FERN.is_dir(), reason="fern dataset not available")
def test_llff_cache_equals_decoded_images(tmp_path):
    cfg = {"name": "llff", "root": str(FERN)}
    scene = load_scene(cfg, "train", pixels=PixelCache(tmp_path))
    assert cached_file(scene.images) is not None
    assert torch.equal(scene.images, load_scene(cfg, "train").images)


def test_building_holds_a_few_decoded_images_not_all(tmp_path):
    """numpy reports its allocations to tracemalloc: the build peaks near one image per thread."""
    num_images, height, width = 40, 64, 96
    cfg = write_blender_scene(tmp_path / "scene", num_images, height, width)
    image_bytes = height * width * 3 * 4
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        load_scene(cfg, "train", pixels=PixelCache(tmp_path / "cache", num_threads=2))
        streamed = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        in_ram = load_scene(cfg, "train")
        decoded = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert decoded >= num_images * image_bytes  # the check can see a split held in RAM
    assert streamed < 16 * image_bytes < decoded / 2, (streamed, decoded, image_bytes)  # ~ 2 threads x a few arrays
    assert len(in_ram) == num_images


def _build_in_child(cfg, cache_dir, barrier, results):
    counter = CountDecodes()
    images_module.read_image = counter
    barrier.wait()
    scene = load_scene(cfg, "train", pixels=PixelCache(cache_dir, num_threads=1))
    results.put((os.getpid(), counter.calls, float(scene.images.double().sum())))


def test_concurrent_builders_build_once(blender, tmp_path):
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_build_in_child, args=(blender, tmp_path / "cache", barrier, results)) for _ in range(3)]
    for p in procs:
        p.start()
    got = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
        assert p.exitcode == 0
    decodes = sorted(calls for _, calls, _ in got)
    assert decodes == [0, 0, NUM_IMAGES]  # one builder decoded every image once; the others mapped its file
    expected = float(load_scene(blender, "train").images.double().sum())
    assert all(total == expected for _, _, total in got)
    assert len(list((tmp_path / "cache").glob("pixels-*.npy"))) == 1 and not list((tmp_path / "cache").glob("*.tmp"))


def _die_while_building(cfg, cache_dir):
    def read_then_die(path, seen=[]):  # noqa: B006 - a call counter
        seen.append(path)
        if len(seen) == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        return read(path)

    read = images_module.read_image
    images_module.read_image = read_then_die
    load_scene(cfg, "train", pixels=PixelCache(cache_dir, num_threads=1))


def test_a_dead_builder_neither_blocks_nor_leaves_a_torn_file(blender, tmp_path):
    cache_dir = tmp_path / "cache"
    child = multiprocessing.get_context("fork").Process(target=_die_while_building, args=(blender, cache_dir))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    assert len(list(cache_dir.glob("*.tmp"))) == 1 and not list(cache_dir.glob("*.npy"))  # torn, never renamed
    scene = load_scene(blender, "train", pixels=PixelCache(cache_dir))  # the kernel released the dead one's lock
    assert torch.equal(scene.images, load_scene(blender, "train").images)
    assert not list(cache_dir.glob("*.tmp"))  # swept


def test_a_builder_waits_for_the_lock(blender, tmp_path):
    cache_dir = tmp_path / "cache"
    lists = []
    load_scene(blender, "train", pixels=lambda images: lists.append(images) or torch.from_numpy(images.decode_all()))
    path = PixelCache(cache_dir).path_for(lists[0])
    cache_dir.mkdir()
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    child = ctx.Process(target=_build_in_child, args=(blender, cache_dir, barrier, results))
    child.start()  # before we take the lock: a child forked while it is held would share it
    with exclusive_lock(path.with_name(path.name + ".lock")):
        barrier.wait()
        child.join(1.5)
        assert child.is_alive() and not path.exists()  # waiting for us
    _, calls, _ = results.get(timeout=60)
    child.join(10)
    assert child.exitcode == 0 and calls == NUM_IMAGES and path.exists()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "wrong_count"])
def test_a_damaged_cache_is_rebuilt_with_a_warning(blender, tmp_path, damage):
    cache_dir = tmp_path / "cache"
    reference = load_scene(blender, "train")
    path = Path(cached_file(load_scene(blender, "train", pixels=PixelCache(cache_dir)).images))
    if damage == "truncate":
        os.truncate(path, path.stat().st_size - 100)
        phrase = "is truncated"
    elif damage == "garbage":
        path.write_bytes(b"not a numpy file at all" * 10)
        phrase = "has no valid .npy header"
    else:
        np.save(path, np.zeros((NUM_IMAGES - 1, H, W, 3), np.float32))
        phrase = f"holds {NUM_IMAGES - 1} images, not {NUM_IMAGES}"
    if damage != "wrong_count":  # (a complete file of another shape opens fine on its own)
        with pytest.raises(ValueError, match=rf"pixel cache {path} {phrase}.*delete it"):
            open_pixel_cache(path)
    records, handler = capture_warnings()
    try:
        scene = load_scene(blender, "train", pixels=PixelCache(cache_dir))
    finally:
        logging.getLogger("distnerf").removeHandler(handler)
    messages = [r.getMessage() for r in records]
    assert any(str(path) in m and phrase in m and "rebuilding" in m for m in messages), messages
    assert torch.equal(scene.images, reference.images)


def test_pipelined_workers_map_the_scene_cache(blender, tmp_path):
    cache_dir = tmp_path / "cache"
    reference = load_scene(blender, "train")
    spec = BatchSpec(128, seed=4, stream=1)
    sync = SyncSampler(reference, spec)
    for sampler_cache_dir in (cache_dir, None):  # the scene's file is used either way, never copied to shm
        scene = load_scene(blender, "train", pixels=PixelCache(cache_dir))
        mapped = cached_file(scene.images)
        with PipelinedSampler(scene, spec, "cpu", num_workers=2, prefetch=2, cache_dir=sampler_cache_dir) as pipe:
            for k in range(4):
                b, r = pipe.batch(k), sync.batch(k)
                assert torch.equal(b.rgb, r.rgb) and torch.equal(b.rays.directions, r.rays.directions)
            for pid in pipe.worker_pids:
                assert mapped in open(f"/proc/{pid}/maps").read()
        assert cached_file(scene.images) == mapped
    assert [Path(mapped)] == list(cache_dir.glob("pixels-*.npy"))  # no second, digest-keyed copy


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


# ----------------------------------------------------------------------------- sampler.source=files
def test_file_source_batches_equal_memory_batches(blender, monkeypatch):
    from distnerf.sampler import build_sampler, pixel_source

    reference = load_scene(blender, "train")
    scene = load_scene(blender, "train", pixels=pixel_source({"source": "files"}))
    assert scene.images.is_meta and scene.images.shape == reference.images.shape  # nothing decoded, no data
    spec = BatchSpec(256, seed=5, stream=1, policy="per_image", images_per_step=2)
    sync_ram = SyncSampler(reference, spec)
    counter = CountDecodes(monkeypatch)
    sync_files = SyncSampler(scene, spec)
    for k in range(3):
        a, b = sync_files.batch(k), sync_ram.batch(k)
        assert torch.equal(a.rgb, b.rgb) and torch.equal(a.rays.origins, b.rays.origins) and a.jitter_seed == b.jitter_seed
    assert counter.calls == 3 * 2  # each batch decoded its two images, nothing else
    for workers in (1, 2):
        with PipelinedSampler(scene, spec, "cpu", num_workers=workers, prefetch=2) as pipe:
            for k in range(4):
                a, b = pipe.batch(k), sync_ram.batch(k)
                assert torch.equal(a.rgb, b.rgb) and torch.equal(a.rays.directions, b.rays.directions)
    with pytest.raises(ValueError, match="sampler.source=files"):
        build_sampler({"name": "device"}, scene, 64, 0, 0, "cpu")
    with pytest.raises(ValueError, match="cache_dir"):
        pixel_source({"source": "files", "cache_dir": "/tmp/x"})
    with pytest.raises(ValueError, match=r"sampler.source='disk' is not one of \['memory', 'files'\]"):
        pixel_source({"source": "disk"})


def test_file_source_names_a_vanished_image(blender):
    from distnerf.sampler import pixel_source

    scene = load_scene(blender, "train", pixels=pixel_source({"source": "files"}))
    missing = Path(blender["root"]) / "train/r_7.png"
    missing.unlink()
    sampler = SyncSampler(scene, BatchSpec(4096, seed=0, stream=0))  # uniform: every image is drawn
    with pytest.raises(FileNotFoundError, match=rf"frame 7: image not found: {missing}"):
        sampler.batch(0)
