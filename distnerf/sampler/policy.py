"""Sampling policies (which pixels a batch holds) and ray filter hooks.

Legend: R rays per batch, N images, P = H * W pixels per image.

Policies draw from a per-batch ``numpy`` generator only, so a batch stays a pure
function of ``(seed, stream, step)``. Ray filters are picklable callables
``fn(rays) -> (R,) bool`` (they run in sampler workers and on the device); the mask
becomes the batch's ``valid`` so filtered rays do not count in the loss.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np
import torch

from ..config_check import choices_of
from ..schema import SamplerConfig

POLICIES = choices_of(SamplerConfig, "policy")


@dataclass(frozen=True)
class PixelTable:
    """The sampleable pixels of a split whose ``SceneData.mask`` excludes some.

    Attributes:
        valid: (M,) int64 flat indices into the N * P pixels (image-major, ascending) of
            every pixel that may be drawn.
        offsets: (N + 1,) int64: image i's pixels are ``valid[offsets[i]:offsets[i + 1]]``.
    """

    valid: np.ndarray
    offsets: np.ndarray

    @property
    def counts(self) -> np.ndarray:
        """(N,) int64 sampleable pixels per image."""
        return np.diff(self.offsets)


_TABLES: dict = {}  # id(mask) -> (weakref to mask, PixelTable): built once per process


def pixel_table(mask: Optional[torch.Tensor], source: str = "") -> Optional[PixelTable]:
    """The :class:`PixelTable` of a (N, H, W) bool sampling mask (``None``: no mask, no table).

    Cached per mask tensor (each sampler worker builds it once from the shared mask).

    Raises:
        ValueError: the mask leaves no pixel to sample (names ``source``).
    """
    if mask is None:
        return None
    entry = _TABLES.get(id(mask))
    if entry is not None and entry[0]() is mask:
        return entry[1]
    flat = mask.reshape(-1).numpy() if mask.device.type == "cpu" else mask.reshape(-1).cpu().numpy()
    valid = np.flatnonzero(flat).astype(np.int64)
    if valid.size == 0:
        raise ValueError(f"every training pixel of {source or 'the scene'} is masked out: nothing to sample "
                         "(check the dataset's masks)")
    per_image = mask.reshape(mask.shape[0], -1).sum(dim=1).cpu().numpy().astype(np.int64)
    table = PixelTable(valid, np.concatenate([[0], np.cumsum(per_image)]).astype(np.int64))
    for key in [k for k, (ref, _) in _TABLES.items() if ref() is None]:
        del _TABLES[key]
    _TABLES[id(mask)] = (weakref.ref(mask), table)
    return table


def draw_pixels(rng: np.random.Generator, policy: str, num_rays: int, num_images: int, pixels_per_image: int,
                images_per_step: int = SamplerConfig.images_per_step,
                table: Optional[PixelTable] = None) -> np.ndarray:
    """Flat pixel indices of one batch.

    Args:
        rng: the batch's generator (consumed in a fixed order).
        policy: ``uniform``: every (sampleable) pixel of every image equally likely (with
            replacement); ``per_image``: ``images_per_step`` distinct images are drawn
            (among those with a sampleable pixel), then each ray picks one of them and
            one of its pixels uniformly.
        num_rays: R. num_images: N. pixels_per_image: P.
        images_per_step: images per batch under ``per_image`` (capped at N).
        table: the sampleable pixels when the scene has a mask (:func:`pixel_table`);
            masked and padding pixels are then never drawn.
    Returns:
        (R,) int64 indices into the N * P pixels, image-major.
    """
    if policy == "uniform":
        if table is not None:
            return table.valid[rng.integers(0, table.valid.size, size=num_rays)]
        return rng.integers(0, num_images * pixels_per_image, size=num_rays)
    if policy == "per_image":
        eligible = np.arange(num_images) if table is None else np.flatnonzero(table.counts)
        k = min(int(images_per_step), eligible.size)
        if k <= 0:
            raise ValueError(f"sampler.images_per_step must be positive, got {images_per_step}")
        chosen = eligible[rng.choice(eligible.size, size=k, replace=False)]
        image = chosen[rng.integers(0, k, size=num_rays)]
        if table is not None:
            local = (rng.random(num_rays) * table.counts[image]).astype(np.int64)
            return table.valid[table.offsets[image] + local]
        return image * pixels_per_image + rng.integers(0, pixels_per_image, size=num_rays)
    raise ValueError(f"sampler.policy must be one of {POLICIES}, got {policy!r}")


class BoxFilter:
    """Keeps the rays whose segment ``[near, far]`` intersects an axis-aligned box.

    Slab test in the rays' own space (world, or NDC for forward-facing scenes).

    Args:
        aabb: (2, 3) [min, max] corners (any sequence or tensor).
    """

    def __init__(self, aabb):
        self.aabb = torch.as_tensor(aabb, dtype=torch.float32).reshape(2, 3)
        self._on_device: dict[torch.device, torch.Tensor] = {}  # the box on each device, copied once

    def __call__(self, rays) -> torch.Tensor:
        """(R,) bool: ray ``origins + t * directions`` meets the box for some t in [near, far]."""
        box = self._on_device.get(rays.origins.device)
        if box is None:  # the first batch on this device: one copy, not a blocking one every step
            box = self._on_device.setdefault(rays.origins.device, self.aabb.to(rays.origins.device))
        inv = 1.0 / rays.directions  # +-inf for axis-parallel rays is what the slab test wants
        t0, t1 = (box[0] - rays.origins) * inv, (box[1] - rays.origins) * inv
        t_in = torch.minimum(t0, t1).nan_to_num(nan=-float("inf")).amax(dim=-1)
        t_out = torch.maximum(t0, t1).nan_to_num(nan=float("inf")).amin(dim=-1)
        return (torch.maximum(t_in, rays.near) <= torch.minimum(t_out, rays.far))

    def __repr__(self) -> str:
        return f"BoxFilter({self.aabb.tolist()})"


def build_ray_filter(cfg: Optional[Mapping]):
    """A ray filter from config: ``null`` (none) or ``{kind: box, aabb: [[x,y,z],[x,y,z]]}``."""
    if not cfg:
        return None
    kind = cfg.get("kind")
    if kind == "box":
        aabb: Sequence = cfg.get("aabb")
        if aabb is None or np.asarray(aabb).shape != (2, 3):
            raise ValueError(f"sampler.filter.aabb must be [[xmin,ymin,zmin],[xmax,ymax,zmax]], got {aabb!r}")
        return BoxFilter(aabb)
    raise ValueError(f"sampler.filter.kind must be 'box', got {kind!r}")
