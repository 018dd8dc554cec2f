"""Instant-NGP style model in pure PyTorch (Mueller et al., SIGGRAPH 2022).

Legend: R rays, P packed samples.

Multiresolution hash encoding -> 1-hidden-layer density MLP (64 wide, 16 outputs,
the first is log-density) -> colour MLP (2 x 64) on the geometry features and the
encoded view direction. Empty space is skipped by an occupancy grid refreshed every
``occupancy_every`` steps from the density at cell centres (deterministic, so
replicas agree), with uniform marching steps inside the box (packed samples, early ray
termination and the colour threshold of :class:`~distnerf.model.marched.MarchingModel`).
"""
from __future__ import annotations

import torch
from torch import nn

from ..renderer.contraction import contracted_box, world_step_scale
from ..renderer.occupancy import OccupancyGrid, normalize_points
from ..config_check import section
from ..schema import NGPModelConfig
from .appearance import build_appearance
from .encoding import HashEncoding, PositionalEncoding
from .marched import MarchingModel


class NGPModel(MarchingModel):
    """Hash-grid radiance field with an occupancy grid.

    Args:
        aabb, background: see :class:`RadianceModel`.
        cfg, options: the keys of :class:`~distnerf.schema.NGPModelConfig` (defaults there):
        num_levels, features_per_level, log2_table_size, base_resolution, max_resolution:
            hash encoding (Instant-NGP Table 1).
        hidden_width: MLP width. num_steps: marching steps across the box diagonal (the
            step is a distance: diagonal / num_steps).
        occupancy_resolution, occupancy_threshold, occupancy_every: empty-space skipping.
        contraction: ``none`` or ``mipnerf360`` (the box is the unit region of a field on all
            of space; the hash grid and the occupancy grid cover the contracted doubled box).
        color_threshold, termination, eval_round_steps, train_round_steps: see :class:`MarchingModel`.
        appearance, appearance_dim: per-image appearance (:mod:`.appearance`).
        num_images: training images (rows of its table).
        table_size: hash table rows per level, any integer (derived from ``model.max_params``:
            :mod:`.budget`), instead of ``2 ** log2_table_size``.
    """

    def __init__(self, aabb, background, cfg=None, *, num_images: int = 0, table_size: int | None = None,
                 **options):
        c = section(NGPModelConfig, cfg, **options)  # the keys above; defaults: distnerf/schema.py
        num_steps, occupancy_resolution = c.num_steps, c.occupancy_resolution
        occupancy_threshold, occupancy_every, hidden_width = c.occupancy_threshold, c.occupancy_every, c.hidden_width
        num_levels, features_per_level, log2_table_size = c.num_levels, c.features_per_level, c.log2_table_size
        base_resolution, max_resolution = c.base_resolution, c.max_resolution
        super().__init__(aabb, background)
        self.init_marching(c)
        self.encoding = HashEncoding(num_levels, features_per_level, log2_table_size,
                                     base_resolution, max_resolution, table_size=table_size)
        self.density_net = nn.Sequential(nn.Linear(self.encoding.output_dim, hidden_width), nn.ReLU(),
                                         nn.Linear(hidden_width, 16))
        self.dir_encoding = PositionalEncoding(4)
        self.appearance = build_appearance(c.appearance, num_images, c.appearance_dim)
        latent_dim = self.appearance.latent_dim if self.appearance is not None else 0
        self.color_net = nn.Sequential(nn.Linear(15 + self.dir_encoding.output_dim(3) + latent_dim, hidden_width),
                                       nn.ReLU(), nn.Linear(hidden_width, hidden_width), nn.ReLU(),
                                       nn.Linear(hidden_width, 3))
        diag = (self.aabb[1] - self.aabb[0]).norm().item()
        self._step_size = diag / num_steps
        self.occupancy_threshold, self.occupancy_every = occupancy_threshold, occupancy_every
        self.init_contraction(c)
        self.occupancy = OccupancyGrid(self.aabb, occupancy_resolution, contraction_aabb=self.contraction_aabb)
        assert torch.equal(self.occupancy.aabb, self.table_aabb), "one contracted range for tables and occupancy"

    @property
    def table_aabb(self) -> torch.Tensor:
        """(2, 3) box of the hash grid: the doubled box of contracted space (all of it), else the scene box."""
        return self.aabb if self.contraction_aabb is None else contracted_box(self.aabb)

    def param_groups(self, lr: float) -> list[dict]:
        groups = [{"params": [self.encoding.table], "lr": lr, "name": "hash_table"},
                  {"params": list(self.density_net.parameters()) + list(self.color_net.parameters()),
                   "lr": lr, "name": "mlp"}]
        if self.appearance is not None:
            groups.append(self.appearance.param_group(lr))
        return groups

    def _geometry(self, points: torch.Tensor, contracted: bool = False):
        """(P, 3) world points (or field coordinates when ``contracted``) -> (P,) sigma, (P, 15) features."""
        q = points if contracted else self.field_coordinates(points)
        h = self.density_net(self.encoding(normalize_points(q, self.table_aabb).clamp(0, 1)))
        sigma = torch.exp(h[:, 0].clamp(max=15.0))  # truncated exponential (Instant-NGP Sec. 4)
        return sigma, h[:, 1:]

    def _colour(self, geo: torch.Tensor, dirs: torch.Tensor, ray_idx: torch.Tensor | None,
                image_ids: torch.Tensor | None, num_rays: int) -> torch.Tensor:
        """(Q, 15) geometry features, (Q, E) encoded view directions, (Q,) ray of each point (or
        None: one ray per point), (R,) training image ids or None -> (Q, 3) RGB (:mod:`.appearance`)."""
        app = self.appearance
        if app is None:
            return torch.sigmoid(self.color_net(torch.cat([geo, dirs], -1)))
        codes = app.codes(image_ids, num_rays)
        rgb = torch.sigmoid(self.color_net(torch.cat([geo, dirs, *app.latent(codes, ray_idx)], -1)))
        return app.transform(rgb, codes, ray_idx)

    def field(self, points: torch.Tensor, viewdirs: torch.Tensor):
        sigma, geo = self._geometry(points)
        return sigma, self._colour(geo, self.dir_encoding(viewdirs), None, None, points.shape[0])

    def field_density(self, points: torch.Tensor) -> torch.Tensor:
        return self._geometry(points)[0]

    def step_size(self) -> float:
        """Marching step (a distance): the box diagonal / ``num_steps``."""
        return self._step_size

    def marching_box(self) -> torch.Tensor:
        return self.aabb

    def colours(self, points: torch.Tensor, viewdirs: torch.Tensor, ray_indices: torch.Tensor,
                image_ids: torch.Tensor | None = None) -> torch.Tensor:
        _, geo = self._geometry(points)
        return self._colour(geo, self.dir_encoding(viewdirs)[ray_indices], ray_indices, image_ids, viewdirs.shape[0])

    @torch.no_grad()
    def update_state(self, step: int, stage_step: int | None = None) -> bool:
        if step > 0 and step % self.occupancy_every == 0:
            centers = self.occupancy.cell_centers()
            sigma = torch.cat([self._geometry(c, contracted=True)[0] for c in centers.split(65536)])
            step = self._step_size if self.contraction_aabb is None else \
                self._step_size * world_step_scale(centers, self.contraction_aabb)  # a step's length there
            alpha = 1.0 - torch.exp(-sigma * step)
            m = self.occupancy.resolution
            self.occupancy.set_from_alpha(alpha.view(m, m, m), self.occupancy_threshold, dilation=1)
        return False
