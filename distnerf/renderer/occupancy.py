"""Occupancy grid for empty-space skipping and uniform ray marching.

Legend: R rays, S samples per ray, P points, M occupancy resolution per axis.

The occupancy grid is a binary (M, M, M) grid over the scene box, indexed
``[ix, iy, iz]`` (x first). It is derived deterministically from the model's density
(no random numbers), so every process that holds the same parameters holds the same
grid (Instant-NGP, Mueller et al. 2022, Sec. 4 "accelerated ray marching").
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .samples import clip_to_box


def normalize_points(points: torch.Tensor, aabb: torch.Tensor) -> torch.Tensor:
    """Map points from the box to [0, 1]^3. points: (P, 3); aabb: (2, 3)."""
    return (points - aabb[0]) / (aabb[1] - aabb[0])


class OccupancyGrid(nn.Module):
    """Binary occupancy over an axis-aligned box.

    Args:
        aabb: (2, 3) float32 box [min, max] (world units, or NDC for LLFF).
        resolution: M cells per axis.
    """

    def __init__(self, aabb: torch.Tensor, resolution: int):
        super().__init__()
        self.register_buffer("aabb", aabb.clone().float())
        self.register_buffer("binary", torch.ones((resolution,) * 3, dtype=torch.bool))

    @property
    def resolution(self) -> int:
        return self.binary.shape[0]

    def cell_centers(self) -> torch.Tensor:
        """(M^3, 3) float32 world positions of cell centres, x-major like ``binary``."""
        m = self.resolution
        axis = (torch.arange(m, device=self.aabb.device, dtype=torch.float32) + 0.5) / m
        grid = torch.stack(torch.meshgrid(axis, axis, axis, indexing="ij"), dim=-1).reshape(-1, 3)
        return self.aabb[0] + grid * (self.aabb[1] - self.aabb[0])

    def query(self, points: torch.Tensor) -> torch.Tensor:
        """Occupancy of points. points: (P, 3) float. Returns (P,) bool; outside the box is False."""
        x = normalize_points(points, self.aabb)
        inside = ((x >= 0) & (x <= 1)).all(dim=-1)
        m = self.resolution
        idx = (x * m).long().clamp(0, m - 1)
        occ = self.binary[idx[:, 0], idx[:, 1], idx[:, 2]]
        return occ & inside

    @torch.no_grad()
    def set_from_alpha(self, alpha: torch.Tensor, threshold: float, dilation: int = 1) -> None:
        """Occupied where the (dilated) opacity of a cell exceeds ``threshold``.

        Args:
            alpha: (M, M, M) float opacity of one marching step at each cell centre.
            threshold: opacity below which a cell is empty.
            dilation: cells of max-pool dilation so that surfaces are not clipped.
        """
        if dilation > 0:
            k = 2 * dilation + 1
            alpha = F.max_pool3d(alpha[None, None], k, stride=1, padding=dilation)[0, 0]
        self.binary.copy_(alpha > threshold)

    def resize(self, aabb: torch.Tensor, resolution: int) -> None:
        """Reset to all-occupied at a new box and resolution (after a grid change)."""
        self.aabb = aabb.clone().float().to(self.aabb.device)
        self.binary = torch.ones((resolution,) * 3, dtype=torch.bool, device=self.binary.device)

    def occupied_aabb(self) -> torch.Tensor:
        """(2, 3) float32 box around the occupied cells (the whole box if none)."""
        idx = self.binary.nonzero()
        if idx.numel() == 0:
            return self.aabb.clone()
        cell = (self.aabb[1] - self.aabb[0]) / self.resolution
        lo = self.aabb[0] + idx.min(dim=0).values * cell
        hi = self.aabb[0] + (idx.max(dim=0).values + 1) * cell
        return torch.stack([lo, hi])


def march_rays(origins, directions, near, far, aabb, step_size: float,
               occupancy: OccupancyGrid | None, perturb: bool,
               generator: torch.Generator | None = None):
    """Uniform ray marching through a box with empty-space skipping.

    Samples are intervals of length ``step_size`` starting at the ray's entry into
    ``aabb`` (clipped to ``[near, far]``), jittered by one random offset per ray when
    ``perturb``. Samples in unoccupied cells or beyond the exit are masked out.

    Args:
        origins, directions: (R, 3) float rays. near, far: (R,) float bounds.
        aabb: (2, 3) float box. step_size: interval length in ray-parameter units.
        occupancy: grid used to skip empty space, or None.
        perturb: random per-ray offset in [0, step) (training) or none (evaluation).
    Returns:
        t_starts, t_ends: (R, S) float; mask: (R, S) bool samples to evaluate, where S
        is the largest sample count of any ray in this batch.
    """
    t_min, t_max = clip_to_box(origins, directions, near, far, aabb)
    length = (t_max - t_min).clamp(min=0)
    num = int(math.ceil(float(length.max()) / step_size)) if length.numel() else 0
    num = max(num, 1)
    offset = torch.zeros_like(t_min)
    if perturb:
        offset = torch.rand(t_min.shape, generator=generator, device=t_min.device) * step_size
    steps = torch.arange(num, device=origins.device, dtype=origins.dtype)
    t_starts = t_min[:, None] + offset[:, None] + steps * step_size
    t_ends = t_starts + step_size
    mask = t_ends <= t_max[:, None] + 1e-6
    if occupancy is not None:
        mids = 0.5 * (t_starts + t_ends)
        ray_idx, sample_idx = mask.nonzero(as_tuple=True)
        pts = origins[ray_idx] + directions[ray_idx] * mids[ray_idx, sample_idx, None]
        keep = occupancy.query(pts)
        mask[ray_idx[~keep], sample_idx[~keep]] = False
    return t_starts, t_ends, mask
