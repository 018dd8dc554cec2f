"""Ray samplers (distnerf.sampler): sync, pipelined and device draw bitwise the same
batches; streams differ; policies and filters; worker failures surface within
seconds; close() leaves no processes and no /dev/shm entries.
"""
from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from distnerf.data.base import Cameras, SceneData
from distnerf.sampler import (BatchSpec, BoxFilter, DeviceSampler, PipelinedSampler, SamplerWorkerError,
                              SyncSampler, build_sampler)

R, STEPS = 256, 6


def tiny_scene(num_images: int = 5, height: int = 12, width: int = 16, seed: int = 0) -> SceneData:
    """A scene with random pixels and cameras on a circle looking at the origin."""
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(num_images, height, width, 3, generator=g)
    c2w = []
    for i in range(num_images):
        a = 2 * torch.pi * i / num_images
        eye = torch.tensor([3 * torch.cos(torch.tensor(a)), 0.5, 3 * torch.sin(torch.tensor(a))])
        back = eye / eye.norm()  # camera +Z points away from the origin (it looks down -Z)
        right = torch.linalg.cross(torch.tensor([0.0, 1.0, 0.0]), back)
        right = right / right.norm()
        up = torch.linalg.cross(back, right)
        c2w.append(torch.stack([right, up, back, eye], dim=1))
    n = num_images
    cams = Cameras(torch.stack(c2w).float(), torch.full((n,), 14.0), torch.full((n,), 14.0),
                   torch.full((n,), width / 2), torch.full((n,), height / 2), width, height)
    return SceneData("train", images, cams, 2.0, 6.0, torch.tensor([[-1.0] * 3, [1.0] * 3]), torch.ones(3),
                     source="tiny")


def assert_same(a, b):
    assert a.jitter_seed == b.jitter_seed
    for name in ("origins", "directions", "viewdirs", "near", "far"):
        x, y = getattr(a.rays, name).cpu(), getattr(b.rays, name).cpu()
        assert x.dtype == y.dtype and torch.equal(x, y), name
    assert a.rays.image_ids.dtype == torch.int64 and torch.equal(a.rays.image_ids.cpu(), b.rays.image_ids.cpu())
    assert torch.equal(a.rgb.cpu(), b.rgb.cpu()) and torch.equal(a.valid.cpu(), b.valid.cpu())
    assert a.valid.dtype == torch.bool and a.rgb.is_contiguous() and a.rays.origins.is_contiguous()


def shm_entries() -> set:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def children() -> set:
    """Pids of this process's live (non-zombie) children."""
    out = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            out.add(int(pid))
    return out


def sampler_children(sampler) -> set:
    return {pid for pid in sampler.worker_pids if os.path.exists(f"/proc/{pid}")
            and open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"}


@pytest.fixture(scope="module")
def scene():
    return tiny_scene()


@pytest.mark.parametrize("num_workers", [1, 3])
def test_pipelined_equals_sync_bitwise(scene, num_workers):
    spec = BatchSpec(R, seed=7, stream=1)
    sync = SyncSampler(scene, spec)
    with PipelinedSampler(scene, spec, "cpu", num_workers=num_workers, prefetch=3) as pipe:
        pipe.start(0)
        for k in range(STEPS):
            assert_same(pipe.batch(k), sync.batch(k))
        assert not any(pipe.worker_cuda_initialised.values())
        assert_same(pipe.batch(STEPS + 5), sync.batch(STEPS + 5))  # a jump restarts the ring
        assert pipe.state_dict()["next_step"] == STEPS + 6
        time.sleep(0.5)  # the next batches are built: to_device copies the following one ahead
        assert_same(pipe.batch(STEPS + 6), sync.batch(STEPS + 6))
        assert pipe._ahead is not None and pipe._ahead[0] == STEPS + 7
        assert_same(pipe.batch(STEPS + 7), sync.batch(STEPS + 7))  # handed out from the look-ahead
        time.sleep(0.5)
        pipe.batch(STEPS + 8)
        assert pipe._ahead[0] == STEPS + 9
        assert_same(pipe.batch(3), sync.batch(3))  # a jump drops the look-ahead
        assert_same(pipe.batch(4), sync.batch(4))


def test_memory_mapped_pixel_cache_is_shared_and_reused(tmp_path):
    scene, reference = tiny_scene(seed=3), tiny_scene(seed=3)
    spec = BatchSpec(R, seed=2, stream=0)
    sync = SyncSampler(reference, spec)
    with PipelinedSampler(scene, spec, "cpu", num_workers=2, prefetch=2, cache_dir=str(tmp_path)) as pipe:
        for k in range(3):
            assert_same(pipe.batch(k), sync.batch(k))
    (cached,) = tmp_path.glob("pixels-train-*.npy")
    stale = tmp_path / f"{cached.name}.999999999.tmp"  # a writer that crashed (no such pid)
    stale.write_bytes(b"torn")
    assert str(cached) in open("/proc/self/maps").read()  # scene.images is now the file's mapping
    assert torch.equal(scene.images, reference.images)
    stamp = cached.stat().st_mtime_ns
    with PipelinedSampler(tiny_scene(seed=3), spec, "cpu", num_workers=1, prefetch=2, cache_dir=str(tmp_path)) as p:
        assert_same(p.batch(5), sync.batch(5))
    assert [cached] == list(tmp_path.glob("pixels-*.npy")) and cached.stat().st_mtime_ns == stamp
    assert not list(tmp_path.glob("*.tmp"))  # stale swept


def two_by_two_scene() -> SceneData:
    """Two 2x2 images with distinct pixels; camera 0 at (0, 0, 3) looking down -Z, camera 1
    at (1, 2, 0) turned 90 degrees about +Y (looking down -X); fx = fy = 2, centre (1, 1)."""
    images = torch.arange(2 * 2 * 2 * 3, dtype=torch.float32).reshape(2, 2, 2, 3) / 24.0
    turn = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [-1.0, 0.0, 0.0]])  # camera -Z -> world -X
    c2w = torch.stack([torch.cat([torch.eye(3), torch.tensor([[0.0], [0.0], [3.0]])], 1),
                       torch.cat([turn, torch.tensor([[1.0], [2.0], [0.0]])], 1)])
    cams = Cameras(c2w, torch.full((2,), 2.0), torch.full((2,), 2.0), torch.ones(2), torch.ones(2), 2, 2)
    return SceneData("train", images, cams, 0.5, 4.0, torch.tensor([[-1.0] * 3, [1.0] * 3]), torch.ones(3),
                     source="2x2")


def hand_built_batch(seed: int, stream: int, step: int, num_rays: int):
    """The documented recipe written out by hand: numpy's PCG64 of SeedSequence([seed, stream,
    step]) draws R flat pixel indices (image-major, row-major) and then the jitter seed; a
    pixel (u, v) of camera i has the camera-space direction ((u + 0.5 - 1) / 2, -(v + 0.5 - 1) / 2, -1)."""
    import numpy as np

    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, stream, step])))
    flat = rng.integers(0, 8, size=num_rays)
    jitter = int(rng.integers(0, 2**62))
    norm = (0.25 ** 2 + 0.25 ** 2 + 1.0) ** 0.5  # every pixel centre is (+-0.25, +-0.25, -1) in camera space
    half, one = 0.25 / norm, 1.0 / norm
    origins, directions, rgb = [], [], []
    for f in flat.tolist():
        image, v, u = f // 4, (f % 4) // 2, f % 2
        x, y = (-half if u == 0 else half), (half if v == 0 else -half)
        if image == 0:
            origins.append([0.0, 0.0, 3.0])
            directions.append([x, y, -one])
        else:  # camera x -> world -z, camera z -> world x
            origins.append([1.0, 2.0, 0.0])
            directions.append([-one, y, -x])
        rgb.append([(image * 12 + v * 6 + u * 3 + c) / 24.0 for c in range(3)])
    return (torch.tensor(origins), torch.tensor(directions), torch.tensor(rgb), jitter, torch.from_numpy(flat // 4))


@pytest.mark.parametrize("kind", ["sync", "pipelined", "device"])
def test_batches_equal_a_hand_built_reference_on_a_2x2_scene(kind):
    scene = two_by_two_scene()
    spec = BatchSpec(64, seed=5, stream=1)
    sampler = {"sync": lambda: SyncSampler(scene, spec), "device": lambda: DeviceSampler(scene, spec, "cpu"),
               "pipelined": lambda: PipelinedSampler(scene, spec, "cpu", num_workers=1, prefetch=2)}[kind]()
    with sampler:
        sampler.start(3)
        for step in (3, 4):
            batch = sampler.batch(step)
            origins, directions, rgb, jitter, image_ids = hand_built_batch(5, 1, step, 64)
            assert torch.equal(batch.rays.image_ids, image_ids)  # the training image of each ray
            assert batch.jitter_seed == jitter
            torch.testing.assert_close(batch.rays.origins, origins, rtol=0, atol=1e-6)
            torch.testing.assert_close(batch.rays.directions, directions, rtol=0, atol=1e-6)
            torch.testing.assert_close(batch.rays.viewdirs, directions, rtol=0, atol=1e-6)
            assert torch.equal(batch.rgb, rgb)
            assert batch.valid.all() and (batch.rays.near == 0.5).all() and (batch.rays.far == 4.0).all()
    assert len({tuple(o) for o in origins.tolist()}) == 2  # both cameras were drawn: the check is not vacuous


def test_device_sampler_equals_sync(scene):
    spec = BatchSpec(R, seed=7, stream=0, policy="per_image", images_per_step=2, ray_filter=BoxFilter(scene.aabb))
    sync, dev = SyncSampler(scene, spec), DeviceSampler(scene, spec, "cpu")
    for k in range(STEPS):
        assert_same(dev.batch(k), sync.batch(k))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_sampler_on_cuda_matches_sync():
    """Pixels, colours and seeds bitwise; ray geometry within 1 ulp (torch.norm differs by device)."""
    scene = tiny_scene()
    spec = BatchSpec(R, seed=7, stream=0, policy="per_image", images_per_step=2)
    sync, dev = SyncSampler(scene, spec), DeviceSampler(scene, spec, "cuda")
    for k in range(STEPS):
        a, b = dev.batch(k), sync.batch(k)
        assert a.rgb.is_cuda and a.jitter_seed == b.jitter_seed
        assert torch.equal(a.rgb.cpu(), b.rgb) and torch.equal(a.valid.cpu(), b.valid)
        assert torch.equal(a.rays.near.cpu(), b.rays.near) and torch.equal(a.rays.origins.cpu(), b.rays.origins)
        for name in ("directions", "viewdirs"):
            torch.testing.assert_close(getattr(a.rays, name).cpu(), getattr(b.rays, name), rtol=2.4e-7, atol=1e-7)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pipelined_on_cuda_equals_sync_bitwise():
    scene = tiny_scene()
    spec = BatchSpec(R, seed=7, stream=0)
    sync = SyncSampler(scene, spec)
    with PipelinedSampler(scene, spec, "cuda", num_workers=2, prefetch=3) as pipe:
        for k in range(STEPS):
            if k == 3:
                time.sleep(0.5)  # exercise the side-stream look-ahead copy
            b = pipe.batch(k)
            assert b.rgb.is_cuda
            assert_same(b, sync.batch(k))
        assert not any(pipe.worker_cuda_initialised.values())


def test_streams_and_steps_differ(scene):
    a, b = SyncSampler(scene, R, 0, 0), SyncSampler(scene, R, 0, 1)
    assert not torch.equal(a.batch(0).rgb, b.batch(0).rgb)
    assert not torch.equal(a.batch(0).rgb, a.batch(1).rgb)
    assert a.batch(0).jitter_seed != b.batch(0).jitter_seed


def test_per_image_policy_draws_from_k_images(scene):
    spec = BatchSpec(R, 1, 0, policy="per_image", images_per_step=2)
    s = SyncSampler(scene, spec)
    images = scene.images.reshape(len(scene), -1, 3)
    for k in range(4):
        b = s.batch(k)
        used = {i for i in range(len(scene))
                if (b.rgb[:, None, :] == images[i][None]).all(-1).any(-1).sum() > 0}
        assert 1 <= len(used) <= 2


def test_box_filter_marks_rays(scene):
    spec = BatchSpec(R, 1, 0, ray_filter=BoxFilter([[-0.3, -0.3, -0.3], [0.3, 0.3, 0.3]]))
    b = SyncSampler(scene, spec).batch(0)
    assert 0 < int(b.valid.sum()) < R
    # expected from the distance of each ray to the origin (the box holds a ball of radius 0.3, sits in 0.52)
    o, d = b.rays.origins.double(), b.rays.directions.double()
    dist = torch.linalg.cross(o, d).norm(dim=-1)
    assert bool(b.valid[dist < 0.3].all()) and not bool(b.valid[dist > 0.53].any())


def test_a_batch_built_on_the_host_carries_its_valid_count(scene):
    """``RayBatch.num_valid`` (the trainer's valid count without reading the device): counted on the
    host before the copy, by both host samplers, for batches copied at once and copied ahead."""
    spec = BatchSpec(R, 1, 0, ray_filter=BoxFilter([[-0.3, -0.3, -0.3], [0.3, 0.3, 0.3]]))
    sync = SyncSampler(scene, spec)
    with PipelinedSampler(scene, spec, "cpu", num_workers=1, prefetch=2) as pipe:
        pipe.start(0)
        for step in range(4):
            want = sync.batch(step)
            time.sleep(0.2)  # the next batch is ready: to_device copies it ahead (the second path)
            got = pipe.batch(step)
            assert torch.equal(got.valid, want.valid) and 0 < want.num_valid < R
            assert got.num_valid == want.num_valid == float(want.valid.sum())


class Boom:
    """A ray filter that raises on the third call (picklable)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, rays):
        self.calls += 1
        if self.calls >= 3:
            raise ValueError("boom in the ray filter")
        return torch.ones(len(rays), dtype=torch.bool)


def test_worker_exception_reaches_trainer_quickly(scene):
    pipe = PipelinedSampler(scene, BatchSpec(R, 0, 0, ray_filter=Boom()), "cpu", num_workers=1, prefetch=2)
    start = time.monotonic()
    with pytest.raises(SamplerWorkerError, match="boom in the ray filter"):
        for k in range(10):
            pipe.batch(k)
    assert time.monotonic() - start < 60  # includes the worker's start; the failure itself is immediate
    assert not sampler_children(pipe)


def test_killed_worker_fails_within_seconds(scene):
    pipe = PipelinedSampler(scene, BatchSpec(R, 0, 0), "cpu", num_workers=2, prefetch=2)
    pipe.batch(0)
    victim = pipe.worker_pids[1]
    os.kill(victim, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(SamplerWorkerError, match=rf"pid {victim}\) (exited with code -9|closed its pipe)"):
        for k in range(1, 100):
            pipe.batch(k)
    assert time.monotonic() - start < 5
    assert not sampler_children(pipe)


def test_workers_ignore_signals_and_close_cleans_up(scene):
    before_shm, before_children = shm_entries(), children()
    pipe = build_sampler({"name": "pipelined", "num_workers": 2, "prefetch": 3}, scene, R, 0, 0, "cpu")
    assert isinstance(pipe, PipelinedSampler)
    pipe.batch(0)
    for pid in pipe.worker_pids:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
            os.kill(pid, sig)
    time.sleep(0.3)
    assert sampler_children(pipe) == set(pipe.worker_pids)
    pipe.batch(1)
    pipe.close()
    pipe.close()  # idempotent
    assert not sampler_children(pipe)
    assert children() - before_children <= _forkserver()
    assert shm_entries() <= before_shm
    with pytest.raises(SamplerWorkerError, match="closed"):
        pipe.batch(2)


def _forkserver() -> set:
    """The multiprocessing fork server (one per trainer process, not per sampler)."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    return {pid} if pid else set()


def test_unpicklable_ray_filter_is_a_clear_error(scene):
    before = children()
    with pytest.raises(ValueError, match="must be picklable"):
        PipelinedSampler(scene, BatchSpec(R, 0, 0, ray_filter=lambda rays: rays.near > 0), "cpu", num_workers=2)
    assert children() - before <= _forkserver()


def test_build_sampler_kinds_and_errors(scene):
    assert isinstance(build_sampler({"name": "sync"}, scene, R, 0, 0, "cpu"), SyncSampler)
    assert isinstance(build_sampler({"name": "device"}, scene, R, 0, 0, "cpu"), DeviceSampler)
    # sampler=auto (the default): the GPU's input on the GPU, unless decoded per batch; workers on the CPU
    from distnerf.sampler import auto_kind
    assert (auto_kind("cuda"), auto_kind("cuda:1"), auto_kind("cuda", "files"), auto_kind("cpu")) == \
        ("device", "device", "pipelined", "pipelined")
    with pytest.raises(ValueError, match=r"sampler.name='bogus' is not one of \['auto', 'pipelined', 'sync', 'device'\]"):
        build_sampler({"name": "bogus"}, scene, R, 0, 0, "cpu")
    with pytest.raises(ValueError, match="sampler.policy"):
        build_sampler({"name": "sync", "policy": "nope"}, scene, R, 0, 0, "cpu")
    with pytest.raises(ValueError, match="sampler.filter.aabb"):
        build_sampler({"name": "sync", "filter": {"kind": "box", "aabb": [1, 2]}}, scene, R, 0, 0, "cpu")


TRAINER_SCRIPT = """
import sys, time
sys.path.insert(0, {tests!r})
from test_sampler import tiny_scene
from distnerf.sampler import BatchSpec, PipelinedSampler
s = PipelinedSampler(tiny_scene(), BatchSpec(64, 0, 0), "cpu", num_workers=2, prefetch=2, start_method={method!r})
s.batch(0)
print(" ".join(map(str, s.worker_pids)), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_workers_exit_when_the_trainer_is_killed(method):
    import subprocess
    import sys
    from pathlib import Path

    before_shm = shm_entries()
    script = TRAINER_SCRIPT.format(tests=str(Path(__file__).parent), method=method)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(os.path.exists(f"/proc/{p}") for p in pids)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)
    assert shm_entries() <= before_shm


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_device_sampler_falls_back_with_a_clear_message(scene, monkeypatch):
    import logging

    import distnerf.sampler as sampler_pkg

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("distnerf")
    logger.addHandler(handler)
    monkeypatch.setattr(sampler_pkg, "fits_on_device", lambda *a: (False, "the training images need 9 GiB"))
    try:
        s = build_sampler({"name": "device", "fallback": "sync"}, scene, R, 0, 0, "cpu")
    finally:
        logger.removeHandler(handler)
    assert isinstance(s, SyncSampler)
    assert any("need 9 GiB" in r.getMessage() and "falling back to sampler=sync" in r.getMessage() for r in records)


def test_resume_checks_only_the_sampler_settings_that_change_batches(tmp_path):
    from distnerf import checkpoint as ckpt
    from distnerf.sampler import batch_config

    def h(cfg):
        return ckpt.config_hashes({"sampler": batch_config(cfg)}, ("sampler",))

    base = {"name": "pipelined", "policy": "uniform", "images_per_step": 4, "filter": None, "num_workers": 2}
    # performance settings (and images_per_step, unused under uniform) keep the batches: same hash
    assert h(base) == h({**base, "name": "sync", "num_workers": 5, "prefetch": 9, "images_per_step": 9,
                         "source": "files", "cache_dir": "/x"})
    for change in ({"policy": "per_image"}, {"filter": {"kind": "box", "aabb": [[0, 0, 0], [1, 1, 1]]}}):
        assert h(base) != h({**base, **change})
    per_image = {**base, "policy": "per_image"}
    assert h(per_image) != h({**per_image, "images_per_step": 2})
    manifest = {"config": {"model": "m", **h(base)}}
    ckpt.check_compatible(manifest, {"model": "m", **h({**base, "name": "sync"})}, tmp_path)
    with pytest.raises(ckpt.CheckpointError, match="the sampler config differs"):
        ckpt.check_compatible(manifest, {"model": "m", **h(per_image)}, tmp_path)
    with pytest.raises(ckpt.CheckpointError, match="the sampler config differs"):  # a manifest without it
        ckpt.check_compatible({"config": {"model": "m"}}, {"model": "m", **h(per_image)}, tmp_path)
    with pytest.raises(ckpt.CheckpointError, match="the model config differs"):
        ckpt.check_compatible({"config": {"model": "other", **h(base)}}, {"model": "m", **h(base)}, tmp_path)
