"""The synchronous ray sampler: the trainer's own process builds each batch.

Legend: R rays per batch, N images, H, W image size.

Deterministic by step: the batch of global step ``k`` of stream ``s`` is a pure
function of ``(seed, s, k)`` through ``numpy.random.SeedSequence([seed, s, k])``,
so any sampler implementation (and any number of workers) yields the same rays.
The stream is the rank under ``ddp``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..data.base import SceneData
from ..data.rays import RayBundle, generate_rays


@dataclass
class RayBatch:
    """One training batch.

    Attributes:
        rays: R rays. rgb: (R, 3) float32 target colours in [0, 1].
        valid: (R,) bool rays that count in the loss.
        jitter_seed: seed of the model's sample-jitter generator for this step.
    """

    rays: RayBundle
    rgb: torch.Tensor
    valid: torch.Tensor
    jitter_seed: int

    def to(self, device, non_blocking: bool = False) -> "RayBatch":
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return RayBatch(self.rays.map(move), move(self.rgb), move(self.valid), self.jitter_seed)


def batch_rng(seed: int, stream: int, step: int) -> np.random.Generator:
    """The random generator of batch ``step`` of ``stream``."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, stream, step])))


class SyncSampler:
    """Uniform sampling over all pixels of all training images.

    Args:
        scene: the training split.
        rays_per_batch: R.
        seed: base seed of the run. stream: stream id (the rank under ``ddp``).
    """

    def __init__(self, scene: SceneData, rays_per_batch: int, seed: int, stream: int):
        if len(scene) == 0:
            raise ValueError(f"training split of {scene.source} has no images")
        self.scene, self.rays_per_batch, self.seed, self.stream = scene, rays_per_batch, seed, stream
        self._flat_rgb = scene.images.reshape(-1, 3)

    def batch(self, step: int) -> RayBatch:
        """The batch of global step ``step`` (pure function of seed, stream, step)."""
        rng = batch_rng(self.seed, self.stream, step)
        n, h, w = len(self.scene), self.scene.height, self.scene.width
        flat = torch.from_numpy(rng.integers(0, n * h * w, size=self.rays_per_batch))
        image, pixel = flat // (h * w), flat % (h * w)
        v, u = pixel // w, pixel % w
        rays = generate_rays(self.scene.cameras, image, u, v, self.scene.near, self.scene.far,
                             self.scene.ndc)
        jitter_seed = int(rng.integers(0, 2**62))
        return RayBatch(rays, self._flat_rgb[flat], torch.ones(self.rays_per_batch, dtype=torch.bool),
                        jitter_seed)

    def close(self) -> None:
        """Release resources (nothing for the synchronous sampler)."""
