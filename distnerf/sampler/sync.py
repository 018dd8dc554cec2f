"""The synchronous ray sampler: the trainer's own process builds each batch.

Legend: R rays per batch, N images, H, W image size.

The baseline of the pipelined sampler: exactly the same work (choose images and
pixels, make rays, gather colours, see :func:`make_batch`), done at the start of
every step in the trainer's process.
"""
from __future__ import annotations

import torch

from ..data.base import SceneData
from .base import BatchSpec, RayBatch, Sampler, make_batch
from .files import flat_pixels


class SyncSampler(Sampler):
    """Builds each batch on demand in the calling process.

    Args:
        scene: the training split (CPU tensors).
        spec: what to draw (or pass ``rays_per_batch, seed, stream`` for uniform sampling).
        device: the training device batches are moved to.
    """

    name = "sync"

    def __init__(self, scene: SceneData, spec: BatchSpec | int, seed: int | None = None, stream: int | None = None,
                 device: torch.device | str = "cpu"):
        if not isinstance(spec, BatchSpec):  # SyncSampler(scene, rays_per_batch, seed, stream)
            spec = BatchSpec(int(spec), int(seed), int(stream))
        if len(scene) == 0:
            raise ValueError(f"training split of {scene.source} has no images")
        super().__init__(spec, device)
        self.scene = scene
        self._flat_rgb = flat_pixels(scene)  # or decoded per batch from the files (sampler.source=files)

    def host_batch(self, step: int) -> RayBatch:
        """The batch of global step ``step`` (pure function of seed, stream, step)."""
        self.next_step = step + 1
        return make_batch(self.spec, self.scene, self._flat_rgb, step)
