"""Instant-NGP style model in pure PyTorch (Mueller et al., SIGGRAPH 2022).

Legend: R rays, S samples per ray, P evaluated samples.

Multiresolution hash encoding -> 1-hidden-layer density MLP (64 wide, 16 outputs,
the first is log-density) -> colour MLP (2 x 64) on the geometry features and the
encoded view direction. Empty space is skipped by an occupancy grid refreshed every
``occupancy_every`` steps from the density at cell centres (deterministic, so
replicas agree), with uniform marching steps inside the box.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..data.rays import RayBundle
from ..renderer.occupancy import OccupancyGrid, march_rays, normalize_points
from ..renderer.volume import volume_render
from .base import RadianceModel, scatter_samples
from .encoding import HashEncoding, PositionalEncoding


class NGPModel(RadianceModel):
    """Hash-grid radiance field with an occupancy grid.

    Args:
        aabb, background: see :class:`RadianceModel`.
        num_levels, features_per_level, log2_table_size, base_resolution, max_resolution:
            hash encoding (Instant-NGP Table 1).
        hidden_width: MLP width. num_steps: marching steps across the box diagonal.
        occupancy_resolution, occupancy_threshold, occupancy_every: empty-space skipping.
    """

    def __init__(self, aabb, background, num_levels: int = 16, features_per_level: int = 2,
                 log2_table_size: int = 17, base_resolution: int = 16, max_resolution: int = 1024,
                 hidden_width: int = 64, num_steps: int = 512, occupancy_resolution: int = 64,
                 occupancy_threshold: float = 1e-3, occupancy_every: int = 16):
        super().__init__(aabb, background)
        self.encoding = HashEncoding(num_levels, features_per_level, log2_table_size,
                                     base_resolution, max_resolution)
        self.density_net = nn.Sequential(nn.Linear(self.encoding.output_dim, hidden_width), nn.ReLU(),
                                         nn.Linear(hidden_width, 16))
        self.dir_encoding = PositionalEncoding(4)
        self.color_net = nn.Sequential(nn.Linear(15 + self.dir_encoding.output_dim(3), hidden_width),
                                       nn.ReLU(), nn.Linear(hidden_width, hidden_width), nn.ReLU(),
                                       nn.Linear(hidden_width, 3))
        diag = (self.aabb[1] - self.aabb[0]).norm().item()
        self.step = diag / num_steps
        self.occupancy_threshold, self.occupancy_every = occupancy_threshold, occupancy_every
        self.occupancy = OccupancyGrid(self.aabb, occupancy_resolution)

    def param_groups(self, lr: float) -> list[dict]:
        return [{"params": [self.encoding.table], "lr": lr, "name": "hash_table"},
                {"params": list(self.density_net.parameters()) + list(self.color_net.parameters()),
                 "lr": lr, "name": "mlp"}]

    def _geometry(self, points: torch.Tensor):
        h = self.density_net(self.encoding(normalize_points(points, self.aabb).clamp(0, 1)))
        sigma = torch.exp(h[:, 0].clamp(max=15.0))  # truncated exponential (Instant-NGP Sec. 4)
        return sigma, h[:, 1:]

    def field(self, points: torch.Tensor, viewdirs: torch.Tensor):
        sigma, geo = self._geometry(points)
        return sigma, torch.sigmoid(self.color_net(torch.cat([geo, self.dir_encoding(viewdirs)], -1)))

    def field_density(self, points: torch.Tensor) -> torch.Tensor:
        return self._geometry(points)[0]

    def march_step(self) -> float:
        return self.step

    def occupied(self, points: torch.Tensor) -> torch.Tensor:
        return self.occupancy.query(points)

    def forward(self, rays: RayBundle, generator=None) -> dict:
        t_starts, t_ends, mask = march_rays(rays.origins, rays.directions, rays.near, rays.far,
                                            self.aabb, self.step, self.occupancy, self.training, generator)
        ray_idx, sample_idx = mask.nonzero(as_tuple=True)
        t_mid = 0.5 * (t_starts + t_ends)[ray_idx, sample_idx]
        points = rays.origins[ray_idx] + rays.directions[ray_idx] * t_mid[:, None]
        sigma, geo = self._geometry(points)
        rgb = torch.sigmoid(self.color_net(torch.cat([geo, self.dir_encoding(rays.viewdirs)[ray_idx]], -1)))
        out = volume_render(scatter_samples(sigma, mask), scatter_samples(rgb, mask),
                            t_starts, t_ends, self.background)
        out["num_samples"] = int(ray_idx.numel())
        return out

    @torch.no_grad()
    def update_state(self, step: int) -> bool:
        if step > 0 and step % self.occupancy_every == 0:
            centers = self.occupancy.cell_centers()
            sigma = torch.cat([self._geometry(c)[0] for c in centers.split(65536)])
            alpha = 1.0 - torch.exp(-sigma * self.step)
            m = self.occupancy.resolution
            self.occupancy.set_from_alpha(alpha.view(m, m, m), self.occupancy_threshold, dilation=1)
        return False
