"""Ray batch sampling. The sampler knows scenes and rays, never models.

``sync`` (the trainer builds each batch), ``pipelined`` (worker processes build
them ahead through shared memory) and ``device`` (pixels on the accelerator) draw
bitwise the same batches: batch k of stream s is a pure function of (seed, s, k).
"""
from __future__ import annotations

import logging
from typing import Mapping

import torch
from omegaconf import OmegaConf

from ..data.base import SceneData
from ..config_check import section
from ..schema import SamplerConfig
from .base import BatchSpec, RayBatch, RayFilter, Sampler, batch_rng, draw_indices, make_batch
from .cache import PixelCache
from .device import DeviceSampler, fits_on_device
from .files import FilePixels, FileSource
from .pipelined import PipelinedSampler, SamplerWorkerError
from .policy import BoxFilter, build_ray_filter, pixel_table
from .sync import SyncSampler

log = logging.getLogger("distnerf")

KINDS = ("sync", "pipelined", "device")  # what sampler=auto resolves to: auto_kind


def auto_kind(device: torch.device | str, source: str = "memory") -> str:
    """The sampler ``sampler=auto`` runs: ``device`` on CUDA (issue 49: the step's input on the GPU, no host
    copy, static buffers for a graph; :func:`build_sampler` still falls back to ``sampler.fallback`` when the
    pixels do not fit), unless the pixels are decoded per batch (``sampler.source=files``); else ``pipelined``
    (the CPU's default: workers build batches ahead).

    Args:
        device: the training device. source: ``sampler.source``.
    """
    return "device" if torch.device(device).type == "cuda" and source == "memory" else "pipelined"

__all__ = ["BatchSpec", "BoxFilter", "DeviceSampler", "PipelinedSampler", "PixelCache", "RayBatch", "RayFilter",
           "FilePixels", "FileSource", "Sampler", "SamplerWorkerError", "SyncSampler", "batch_rng", "build_sampler", "draw_indices", "make_batch",
           "pixel_source", "batch_config"]


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
    cfg = section(SamplerConfig, cfg_sampler)
    source, cache_dir = cfg.source, cfg.cache_dir
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
        cfg_sampler: the ``sampler`` config (keys and defaults: :class:`distnerf.schema.SamplerConfig`;
            a partial mapping gets the defaults).
        scene: the training split (CPU tensors).
        rays_per_batch: rays per batch of this rank.
        seed: base seed of the run. stream: this rank's stream (the rank under ``ddp``), or a tuple of
            streams: a block batch (:class:`.base.BatchSpec`; ``ss``: one block per region).
        device: the training device.
        ray_filter: a filter hook given by code (e.g. a strategy's region); overrides
            ``cfg_sampler.filter``.

    Raises:
        ValueError: the scene's mask leaves no pixel to sample (before any worker starts).
    """
    cfg = section(SamplerConfig, cfg_sampler)
    kind = auto_kind(device, cfg.source) if cfg.name == "auto" else cfg.name
    pixel_table(scene.mask, scene.source)  # a fully masked scene fails here, not in a worker
    spec = BatchSpec(int(rays_per_batch), int(seed), stream, cfg.policy, cfg.images_per_step,
                     ray_filter if ray_filter is not None else build_ray_filter(cfg.filter))
    device = torch.device(device)
    if kind == "device":
        fits, reason = fits_on_device(scene, device, cfg.max_device_fraction)
        if fits:
            return DeviceSampler(scene, spec, device)
        fallback = cfg.fallback
        log.warning("sampler=device: %s; falling back to sampler=%s", reason, fallback)
        kind = fallback
    if kind == "pipelined":
        return PipelinedSampler(scene, spec, device, cfg.num_workers, cfg.prefetch, cfg.start_method,
                                cfg.timeout_s, cfg.cache_dir)
    return SyncSampler(scene, spec, device=device)


def batch_config(cfg_sampler: Mapping | None) -> dict:
    """The part of the sampler config that decides which rays are drawn.

    ``policy``, ``images_per_step`` (under ``per_image``) and ``filter``: resuming with
    other values would train on other batches than the uninterrupted run, so the
    checkpoint records their hash and resume refuses a change. The kind, workers,
    prefetch, source and cache are performance settings (bitwise the same batches)
    and may change across a restart.
    """
    cfg = section(SamplerConfig, cfg_sampler)
    out = {"policy": cfg.policy, "filter": OmegaConf.to_container(cfg.filter) if cfg.filter is not None else None}
    if out["policy"] == "per_image":
        out["images_per_step"] = cfg.images_per_step
    return out
