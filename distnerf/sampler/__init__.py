"""Ray batch sampling. The sampler knows scenes and rays, never models.

``sync`` (the trainer builds each batch), ``pipelined`` (worker processes build
them ahead through shared memory) and ``device`` (pixels on the accelerator) draw
bitwise the same batches: batch k of stream s is a pure function of (seed, s, k).
"""
from __future__ import annotations

import logging
from typing import Mapping

import torch

from ..data.base import SceneData
from .base import BatchSpec, RayBatch, RayFilter, Sampler, batch_rng, draw_indices, make_batch
from .cache import PixelCache
from .device import DeviceSampler, fits_on_device
from .files import FilePixels, FileSource
from .pipelined import PipelinedSampler, SamplerWorkerError
from .policy import POLICIES, BoxFilter, build_ray_filter
from .sync import SyncSampler

log = logging.getLogger("distnerf")

KINDS = ("sync", "pipelined", "device")

__all__ = ["BatchSpec", "BoxFilter", "DeviceSampler", "PipelinedSampler", "PixelCache", "RayBatch", "RayFilter",
           "FilePixels", "FileSource", "Sampler", "SamplerWorkerError", "SyncSampler", "batch_rng", "build_sampler", "draw_indices", "make_batch",
           "pixel_source", "batch_config"]


SOURCES = ("memory", "files")


def pixel_source(cfg_sampler: Mapping | None) -> PixelCache | FileSource | None:
    """The ``pixels`` hook of ``load_scene`` for this sampler config.

    ``sampler.source=memory`` (default): with ``sampler.cache_dir`` set, training images
    are decoded image by image into a memory-mapped cache there (built once, reused
    across runs and ranks) and never held in RAM; without it, None (decoded into RAM).
    ``sampler.source=files``: nothing is decoded at load; every batch decodes the
    images it draws from (:mod:`.files`).

    Raises:
        ValueError: unknown ``source``, or ``source=files`` with a ``cache_dir``.
    """
    cfg = cfg_sampler or {}
    source, cache_dir = cfg.get("source") or "memory", cfg.get("cache_dir")
    if source not in SOURCES:
        raise ValueError(f"sampler.source must be one of {SOURCES}, got {source!r}")
    if source == "files":
        if cache_dir:
            raise ValueError(f"sampler.source=files decodes the image files for every batch; "
                             f"sampler.cache_dir={cache_dir!r} does not apply (use one or the other)")
        return FileSource()
    return PixelCache(cache_dir) if cache_dir else None


def build_sampler(cfg_sampler: Mapping, scene: SceneData, rays_per_batch: int, seed: int, stream: int,
                  device: torch.device | str, ray_filter: RayFilter | None = None) -> Sampler:
    """The sampler named by ``cfg_sampler.name`` (``conf/sampler/*.yaml``).

    Args:
        cfg_sampler: ``name`` (sync | pipelined | device), ``policy``, ``images_per_step``,
            ``filter``, and per kind ``num_workers``, ``prefetch``, ``start_method``,
            ``timeout_s``, ``cache_dir``, ``max_device_fraction``, ``fallback``.
        scene: the training split (CPU tensors).
        rays_per_batch: rays per batch of this rank.
        seed: base seed of the run. stream: this rank's stream (the rank under ``ddp``).
        device: the training device.
        ray_filter: a filter hook given by code (e.g. a strategy's region); overrides
            ``cfg_sampler.filter``.
    """
    cfg = dict(cfg_sampler or {})
    kind = cfg.get("name", "sync")
    if kind not in KINDS:
        raise ValueError(f"sampler={kind!r} is not one of {KINDS}")
    policy = cfg.get("policy", "uniform")
    if policy not in POLICIES:
        raise ValueError(f"sampler.policy must be one of {POLICIES}, got {policy!r}")
    spec = BatchSpec(int(rays_per_batch), int(seed), int(stream), policy, int(cfg.get("images_per_step", 4)),
                     ray_filter if ray_filter is not None else build_ray_filter(cfg.get("filter")))
    device = torch.device(device)
    if kind == "device":
        fits, reason = fits_on_device(scene, device, float(cfg.get("max_device_fraction", 0.5)))
        if fits:
            return DeviceSampler(scene, spec, device)
        fallback = cfg.get("fallback", "pipelined")
        if fallback not in ("sync", "pipelined"):
            raise ValueError(f"sampler.fallback must be sync or pipelined, got {fallback!r}")
        log.warning("sampler=device: %s; falling back to sampler=%s", reason, fallback)
        kind = fallback
    if kind == "pipelined":
        return PipelinedSampler(scene, spec, device, int(cfg.get("num_workers", 2)), int(cfg.get("prefetch", 4)),
                                cfg.get("start_method", "forkserver"), float(cfg.get("timeout_s", 300.0)),
                                cfg.get("cache_dir"))
    return SyncSampler(scene, spec, device=device)


def batch_config(cfg_sampler: Mapping | None) -> dict:
    """The part of the sampler config that decides which rays are drawn.

    ``policy``, ``images_per_step`` (under ``per_image``) and ``filter``: resuming with
    other values would train on other batches than the uninterrupted run, so the
    checkpoint records their hash and resume refuses a change. The kind, workers,
    prefetch, source and cache are performance settings (bitwise the same batches)
    and may change across a restart.
    """
    cfg = dict(cfg_sampler or {})
    out = {"policy": cfg.get("policy") or "uniform", "filter": cfg.get("filter")}
    if out["policy"] == "per_image":
        out["images_per_step"] = int(cfg.get("images_per_step") or 4)
    return out
