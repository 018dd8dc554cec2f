"""The sampler interface and the one function every sampler uses to build a batch.

Legend: R rays per batch, N images, H, W image size.

Deterministic by step: the batch of global step ``k`` of stream ``s`` is a pure
function of ``(seed, s, k)`` through ``numpy.random.SeedSequence([seed, s, k])``.
A batch may also be made of *blocks*, one per stream of a tuple of streams (``ss``: one
block per region the rank trains, the stream being the region): each block is the batch
its stream alone would give, and the jitter seed comes from :data:`~distnerf.seeds.JITTER_STREAM`, so
it depends on ``(seed, k)`` only and a block does not depend on which rank draws it.
Every implementation (``sync``, ``pipelined`` with any number of workers,
``device``) calls :func:`make_batch`, so a performance setting never changes what
is trained. The stream is the rank under ``ddp``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import Callable, Optional

import numpy as np
import torch

from ..data.base import SceneData
from ..data.rays import RayBundle, generate_rays
from ..host_buffers import host_buffer
from ..schema import SamplerConfig
from ..seeds import JITTER_STREAM
from .files import FilePixels
from .policy import PixelTable, draw_pixels, pixel_table


RayFilter = Callable[[RayBundle], torch.Tensor]
"""A ray filter hook: ``fn(rays) -> (R,) bool`` mask of the rays that count in the loss."""


@dataclass
class RayBatch:
    """One training batch.

    Attributes:
        rays: R rays. rgb: (R, 3) float32 target colours in [0, 1].
        valid: (R,) bool rays that count in the loss (all, or those the ray filter keeps).
        jitter_seed: seed of the model's sample-jitter generator for this step.
        num_valid: ``valid``'s count as a host float, when the batch was built on the host
            (counted there before its copy to the device), else None: reading it from a device
            batch would be a host sync on CUDA.
    """

    rays: RayBundle
    rgb: torch.Tensor
    valid: torch.Tensor
    jitter_seed: int
    num_valid: Optional[float] = None

    def to(self, device, non_blocking: bool = False) -> "RayBatch":
        """The batch on ``device``; counted first (``num_valid``) while ``valid`` is on the host."""
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return RayBatch(self.rays.map(move), move(self.rgb), move(self.valid), self.jitter_seed,
                        self.host_valid_count())

    def host_valid_count(self) -> float | None:
        """``num_valid``, or ``valid``'s count when it is on the host (None on a device)."""
        if self.num_valid is not None or self.valid.device.type != "cpu":
            return self.num_valid
        return float(host_buffer(self.valid.sum()))


@dataclass(frozen=True)
class BatchSpec:
    """What to draw: everything but the scene that determines a batch.

    Attributes:
        rays_per_batch: R.
        seed: base seed of the run.
        stream: stream id (the rank under ``ddp``), or a tuple of B stream ids: a block batch
            of B blocks of R / B rays, block b drawn from ``stream[b]`` alone.
        policy: ``uniform`` (all pixels of all images) or ``per_image``.
        images_per_step: images drawn per step under ``per_image``.
        ray_filter: optional picklable :data:`RayFilter`; its mask becomes ``valid``. With a
            tuple of streams, a tuple of B filters (or None): block b's rays are kept by ``ray_filter[b]``.

    Raises:
        ValueError: a tuple of streams that does not split R evenly, or whose filters are not one per stream.
    """

    rays_per_batch: int
    seed: int
    stream: int | tuple[int, ...]
    policy: str = SamplerConfig.policy
    images_per_step: int = SamplerConfig.images_per_step
    ray_filter: Optional[RayFilter] | tuple = None

    def __post_init__(self):
        if isinstance(self.stream, (tuple, list)):
            object.__setattr__(self, "stream", tuple(int(s) for s in self.stream))
            blocks = len(self.stream)
            if blocks == 0 or self.rays_per_batch % blocks:
                raise ValueError(f"a batch of {self.rays_per_batch} rays cannot be split into {blocks} equal "
                                 f"blocks (one per stream {self.stream})")
            if self.ray_filter is not None and (not isinstance(self.ray_filter, tuple)
                                                or len(self.ray_filter) != blocks):
                raise ValueError(f"a block batch of streams {self.stream} needs one ray filter per stream, got "
                                 f"{self.ray_filter!r}")
        else:
            object.__setattr__(self, "stream", int(self.stream))

    @property
    def blocks(self) -> list["BatchSpec"]:
        """The spec of each block of a block batch (one stream, R / B rays, its own filter)."""
        n = self.rays_per_batch // len(self.stream)
        filters = self.ray_filter if self.ray_filter is not None else (None,) * len(self.stream)
        return [BatchSpec(n, self.seed, s, self.policy, self.images_per_step, f) for s, f in zip(self.stream, filters)]


def batch_rng(seed: int, stream: int, step: int) -> np.random.Generator:
    """The random generator of batch ``step`` of ``stream``."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, stream, step])))


def draw_indices(spec: BatchSpec, num_images: int, height: int, width: int, step: int,
                 table: Optional[PixelTable] = None) -> tuple[np.ndarray, int]:
    """The pixels and jitter seed of batch ``step`` (host numpy; cheap, R integers).

    ``table``: the sampleable pixels of a masked scene (:func:`.policy.pixel_table`).

    Returns:
        ``(flat, jitter_seed)``: flat (R,) int64 indices into the (N * H * W) pixels in
        image-major, row-major order, and the model's jitter seed.
    """
    rng = batch_rng(spec.seed, spec.stream, step)
    flat = draw_pixels(rng, spec.policy, spec.rays_per_batch, num_images, height * width, spec.images_per_step,
                       table)
    return flat, int(rng.integers(0, 2**62))


def make_batch(spec: BatchSpec, scene: SceneData, flat_rgb: torch.Tensor | FilePixels, step: int,
               device: torch.device | None = None) -> RayBatch:
    """Build the batch of ``step``: choose pixels, make their rays, gather colours.

    Args:
        spec: what to draw.
        scene: the training split; its cameras live on ``device`` (or the CPU). Only
            cameras, image size, near/far, NDC parameters and the sampling mask (on the
            CPU; masked pixels are never drawn) are used: the pixels are ``flat_rgb``.
        flat_rgb: (N * H * W, 3) float32 pixels on the same device as the cameras, or a
            :class:`.files.FilePixels` that decodes the drawn images (CPU only).
        step: global step index.
        device: where rays are generated (default: the CPU).
    Returns:
        The batch, on ``device`` (a block batch: the blocks' batches concatenated in stream order).
    """
    if isinstance(spec.stream, tuple):
        parts = [make_batch(block, scene, flat_rgb, step, device) for block in spec.blocks]
        rays = RayBundle(**{f.name: torch.cat([getattr(p.rays, f.name) for p in parts]) for f in fields(RayBundle)})
        jitter_seed = int(batch_rng(spec.seed, JITTER_STREAM, step).integers(0, 2**62))
        return RayBatch(rays, torch.cat([p.rgb for p in parts]), torch.cat([p.valid for p in parts]), jitter_seed)
    h, w = scene.height, scene.width
    flat_np, jitter_seed = draw_indices(spec, flat_rgb.shape[0] // (h * w), h, w, step,
                                        pixel_table(scene.mask, scene.source))
    flat = torch.from_numpy(flat_np)
    if device is not None and device.type != "cpu":  # from pinned memory, not blocking the host
        flat = flat.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else flat.to(device)
    image, pixel = flat // (h * w), flat % (h * w)
    v, u = pixel // w, pixel % w
    rays = generate_rays(scene.cameras, image, u, v, scene.near, scene.far, scene.ndc)
    rays.image_ids = image  # (R,) int64 training image of each ray: the appearance table's row
    if spec.ray_filter is not None:
        valid = spec.ray_filter(rays).to(torch.bool)
        assert valid.shape == (len(flat),), f"ray filter returned shape {tuple(valid.shape)}"
    else:
        valid = torch.ones(len(flat), dtype=torch.bool, device=flat.device)
    rgb = flat_rgb.gather(flat) if isinstance(flat_rgb, FilePixels) else flat_rgb[flat]
    # every ray valid: its count is known without counting (a host batch's num_valid; None on a device)
    num_valid = float(len(flat)) if spec.ray_filter is None and flat.device.type == "cpu" else None
    return RayBatch(rays, rgb, valid, jitter_seed, num_valid)


class Sampler(ABC):
    """Produces the ray batch of each global step, strictly by step index.

    ``host_batch(step)`` waits for (or builds) the batch; ``to_device`` moves it to
    the training device and releases any host buffer behind it, so the trainer can
    time the two apart. A batch from ``host_batch`` is valid until ``to_device``
    is called on it. Stateful: ``state_dict()`` holds the next step index.
    """

    name = "base"

    def __init__(self, spec: BatchSpec, device: torch.device):
        self.spec, self.device = spec, torch.device(device)
        self.next_step = 0

    @property
    def every_ray_valid(self) -> bool:
        """Whether every ray of a batch counts (no ray filter): ``batch.valid`` is all True, so
        its count is the batch size, a host number (reading ``valid.sum()`` would be a host sync
        on CUDA)."""
        filters = self.spec.ray_filter if isinstance(self.spec.ray_filter, tuple) else (self.spec.ray_filter,)
        return all(f is None for f in filters)

    def start(self, step: int) -> None:
        """Begin preparing batches from ``step`` on (optional; prefetching samplers use it)."""

    @abstractmethod
    def host_batch(self, step: int) -> RayBatch:
        """The batch of global step ``step`` (where the sampler builds it)."""

    def to_device(self, batch: RayBatch) -> RayBatch:
        """``batch`` on the training device (non-blocking from pinned memory on CUDA)."""
        return batch.to(self.device, non_blocking=True)

    def batch(self, step: int) -> RayBatch:
        """``to_device(host_batch(step))``."""
        return self.to_device(self.host_batch(step))

    def state_dict(self) -> dict:
        """The sampler's resumable state: the next step it will draw, and what it draws."""
        return {"kind": self.name, "next_step": self.next_step, "seed": self.spec.seed,
                "stream": self.spec.stream, "rays_per_batch": self.spec.rays_per_batch,
                "policy": self.spec.policy}

    def load_state_dict(self, state: dict) -> None:
        """Continue at ``state["next_step"]`` (batches are drawn by step index)."""
        self.next_step = int(state["next_step"])

    def close(self) -> None:
        """Release workers and buffers (idempotent)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
