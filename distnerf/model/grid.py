"""Voxel-grid radiance field (DVGO / Plenoxels style), the CPU-practical default.

Legend: R rays, S samples per ray, P evaluated samples, C feature channels,
N grid resolution per axis.

A dense grid of shape (1, 1 + C, N, N, N) holds a raw density and C colour
features per vertex; values between vertices are trilinearly interpolated
(``grid_sample`` with ``align_corners=True``; the grid's last three axes are
z, y, x as ``grid_sample`` expects). Density uses DVGO's shifted softplus
(Sun et al. 2022, Eq. 5-6) in units of the *final* voxel size so that a
resolution change keeps the field unchanged; colour is a tiny MLP on the
features and the encoded view direction (DVGO Sec. 5). Training is coarse to
fine: at ``upsample_steps`` the grid is resampled to the next of ``resolutions``
inside a box tightened around the occupied cells. Empty space is skipped with an
occupancy grid derived from the density; a total-variation term regularises the
density (Plenoxels, Fridovich-Keil et al. 2022, Eq. 3).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..data.rays import RayBundle
from ..render.occupancy import OccupancyGrid, march_rays
from ..render.volume import volume_render
from .base import RadianceModel, scatter_samples
from .encoding import PositionalEncoding


class GridModel(RadianceModel):
    """Dense voxel grid with a tiny colour MLP.

    Args:
        aabb, background: see :class:`RadianceModel`.
        resolutions: grid resolutions of the coarse-to-fine schedule, e.g. [64, 128, 160].
        upsample_steps: training steps at which to move to the next resolution.
        num_features: C. hidden_width, viewdir_frequencies: colour MLP.
        step_ratio: marching step in voxels of the current resolution.
        alpha_init: initial opacity of one step of the final resolution.
        occupancy_threshold / occupancy_every: empty-space skipping.
        tv_weight: weight of the density total-variation regulariser.
        tighten_aabb: shrink the box to the occupied region at each upsampling.
    """

    def __init__(self, aabb, background, resolutions=(64, 128, 160), upsample_steps=(500, 1500),
                 num_features: int = 12, hidden_width: int = 64, viewdir_frequencies: int = 4,
                 step_ratio: float = 0.5, alpha_init: float = 1e-3,
                 occupancy_threshold: float = 1e-4, occupancy_every: int = 16,
                 tv_weight: float = 1e-5, tighten_aabb: bool = True):
        super().__init__(aabb, background)
        if len(upsample_steps) != len(resolutions) - 1:
            raise ValueError(f"model.upsample_steps ({list(upsample_steps)}) needs one entry per "
                             f"resolution change of model.resolutions ({list(resolutions)})")
        self.resolutions, self.upsample_steps = list(resolutions), list(upsample_steps)
        self.step_ratio, self.occupancy_threshold = step_ratio, occupancy_threshold
        self.occupancy_every, self.tv_weight, self.tighten_aabb = occupancy_every, tv_weight, tighten_aabb
        extent = (self.aabb[1] - self.aabb[0]).max().item()
        self.base_voxel = extent / self.resolutions[-1]  # density unit: 1 / final voxel size
        # softplus(shift) * step / base_voxel = -log(1 - alpha_init) at step = step_ratio voxels
        target = -math.log(1.0 - alpha_init) / step_ratio
        self.density_shift = math.log(math.expm1(target))
        n = self.resolutions[0]
        self.grid = nn.Parameter(torch.zeros(1, 1 + num_features, n, n, n))
        self.dir_encoding = PositionalEncoding(viewdir_frequencies)
        self.color_net = nn.Sequential(
            nn.Linear(num_features + self.dir_encoding.output_dim(3), hidden_width), nn.ReLU(),
            nn.Linear(hidden_width, hidden_width), nn.ReLU(),
            nn.Linear(hidden_width, 3))
        self.register_buffer("grid_aabb", self.aabb.clone())
        self.occupancy = OccupancyGrid(self.aabb, n)

    # ---------------------------------------------------------------- state
    @property
    def resolution(self) -> int:
        return self.grid.shape[-1]

    def get_extra_state(self):
        return {"resolution": self.resolution}

    def set_extra_state(self, state):
        n = int(state["resolution"])
        if n != self.resolution:  # resize so load_state_dict can copy the saved grid
            self.grid = nn.Parameter(self.grid.new_zeros(self.grid.shape[:2] + (n, n, n)))
            self.occupancy.resize(self.grid_aabb, n)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # the resolution and occupancy shape must match before tensors are copied
        key = prefix + "_extra_state"
        if key in state_dict:
            self.set_extra_state(state_dict[key])
        occ = state_dict.get(prefix + "occupancy.binary")
        if occ is not None and occ.shape != self.occupancy.binary.shape:
            self.occupancy.binary = torch.ones_like(occ)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def param_groups(self, lr: float) -> list[dict]:
        """Grid at ``lr`` * 100 (DVGO uses 0.1 for grids and 1e-3 for the MLP)."""
        return [{"params": [self.grid], "lr": lr * 100.0, "name": "grid"},
                {"params": list(self.color_net.parameters()), "lr": lr, "name": "color_net"}]

    # ---------------------------------------------------------------- field
    def _sample_grid(self, points: torch.Tensor) -> torch.Tensor:
        """(P, 3) world points inside ``grid_aabb`` -> (P, 1 + C) interpolated values."""
        x = (points - self.grid_aabb[0]) / (self.grid_aabb[1] - self.grid_aabb[0]) * 2 - 1
        out = F.grid_sample(self.grid, x.view(1, 1, 1, -1, 3), mode="bilinear",
                            padding_mode="border", align_corners=True)
        return out.view(self.grid.shape[1], -1).t()

    def densities(self, raw: torch.Tensor) -> torch.Tensor:
        """Raw grid density -> sigma (1 / world unit)."""
        return F.softplus(raw + self.density_shift) / self.base_voxel

    def step_size(self) -> float:
        extent = (self.grid_aabb[1] - self.grid_aabb[0]).max().item()
        return self.step_ratio * extent / (self.resolution - 1)

    def forward(self, rays: RayBundle, generator=None) -> dict:
        t_starts, t_ends, mask = march_rays(rays.origins, rays.directions, rays.near, rays.far,
                                            self.grid_aabb, self.step_size(), self.occupancy,
                                            self.training, generator)
        ray_idx, sample_idx = mask.nonzero(as_tuple=True)
        t_mid = 0.5 * (t_starts + t_ends)[ray_idx, sample_idx]
        points = rays.origins[ray_idx] + rays.directions[ray_idx] * t_mid[:, None]
        values = self._sample_grid(points)
        sigmas = self.densities(values[:, 0])
        dirs = self.dir_encoding(rays.viewdirs)[ray_idx]
        rgbs = torch.sigmoid(self.color_net(torch.cat([values[:, 1:], dirs], dim=-1)))
        out = volume_render(scatter_samples(sigmas, mask), scatter_samples(rgbs, mask),
                            t_starts, t_ends, self.background)
        out["num_samples"] = int(ray_idx.numel())
        if self.training and self.tv_weight > 0:
            out["regularizer"] = self.tv_weight * total_variation(self.grid[:, :1])
        return out

    # ---------------------------------------------------------------- schedule
    @torch.no_grad()
    def update_occupancy(self) -> None:
        """Occupancy from the density at cell centres (deterministic)."""
        n = self.resolution
        centers = self.occupancy.cell_centers()  # x-major, (n^3, 3)
        if self.occupancy.resolution != n:
            self.occupancy.resize(self.grid_aabb, n)
            centers = self.occupancy.cell_centers()
        sigma = self.densities(self._sample_grid(centers)[:, 0])
        alpha = 1.0 - torch.exp(-sigma * self.step_size())
        self.occupancy.set_from_alpha(alpha.view(n, n, n), self.occupancy_threshold, dilation=1)

    @torch.no_grad()
    def upsample(self, resolution: int) -> None:
        """Resample the grid to ``resolution`` (inside a tightened box if enabled)."""
        new_aabb = self.grid_aabb.clone()
        if self.tighten_aabb:
            self.update_occupancy()
            box = self.occupancy.occupied_aabb()
            pad = (self.grid_aabb[1] - self.grid_aabb[0]) / self.resolution
            new_aabb = torch.stack([torch.maximum(box[0] - pad, self.grid_aabb[0]),
                                    torch.minimum(box[1] + pad, self.grid_aabb[1])])
        axes = [torch.linspace(float(new_aabb[0, i]), float(new_aabb[1, i]), resolution) for i in range(3)]
        zz, yy, xx = torch.meshgrid(axes[2], axes[1], axes[0], indexing="ij")
        points = torch.stack([xx, yy, zz], dim=-1).reshape(-1, 3).to(self.grid.device)
        values = self._sample_grid(points).t().reshape(1, -1, resolution, resolution, resolution)
        self.grid = nn.Parameter(values.contiguous())
        self.grid_aabb.copy_(new_aabb)
        self.occupancy.resize(self.grid_aabb, resolution)
        self.update_occupancy()

    def update_state(self, step: int) -> bool:
        replaced = False
        for i, at in enumerate(self.upsample_steps):
            if step == at and self.resolution != self.resolutions[i + 1]:
                self.upsample(self.resolutions[i + 1])
                replaced = True
        if step > 0 and step % self.occupancy_every == 0:
            self.update_occupancy()
        return replaced


def total_variation(grid: torch.Tensor) -> torch.Tensor:
    """Mean squared difference of neighbouring voxels (Plenoxels Eq. 3).

    Args:
        grid: (1, C, D, H, W) float.
    Returns:
        scalar tensor.
    """
    dz = (grid[:, :, 1:] - grid[:, :, :-1]).pow(2).mean()
    dy = (grid[:, :, :, 1:] - grid[:, :, :, :-1]).pow(2).mean()
    dx = (grid[..., 1:] - grid[..., :-1]).pow(2).mean()
    return dx + dy + dz
