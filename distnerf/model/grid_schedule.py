"""The grid model's coarse-to-fine schedule: at ``upsample_steps`` the vertex tables are resampled
to the next of ``resolutions``, inside a box tightened around the occupied cells
(``tighten_aabb``), and the occupancy grid is refreshed every ``occupancy_every`` steps.

Legend: N schedule resolution (vertices per axis), V vertices of a table.

:class:`GridSchedule` is a part of :class:`~distnerf.model.grid.GridModel` (a mixin, so the
model's state and checkpoint keys stay its own); it reads the model's ``cfg``
(:class:`~distnerf.schema.GridModelConfig`), tables (``density``, ``features``, the table box,
``grid_resolution``), ``tighten_aabb`` and ``occupancy``. Replacing the tables replaces
parameters: :meth:`GridSchedule.update_state` says so, and the step rebuilds the optimizer.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .grid_tables import interpolate, voxel_shape


def next_resolution(resolutions: Sequence[int], upsample_steps: Sequence[int], resolution: int,
                    stage_step: int) -> int | None:
    """The resolution to move to at ``stage_step``, or None to stay.

    The stage is read from the current ``resolution`` (its last place in ``resolutions``; a
    resolution not in the list is the last stage), so a model restored at any stage goes on
    from it; one stage per call.
    """
    stage = max(i for i, r in enumerate(resolutions) if r == resolution) \
        if resolution in resolutions else len(resolutions) - 1
    if stage < len(upsample_steps) and stage_step >= upsample_steps[stage]:
        return resolutions[stage + 1]
    return None


class GridSchedule:
    """Upsampling and the refresh schedule of :class:`~distnerf.model.grid.GridModel` (see the
    module docstring)."""

    @torch.no_grad()
    def upsample(self, resolution: int) -> None:
        """Resample the tables to ``resolution`` (inside a tightened box if enabled)."""
        new_aabb = self._table_box().clone()
        if self.tighten_aabb:
            self.update_occupancy()
            box = self.occupancy.occupied_aabb()
            pad = (self.grid_aabb[1] - self.grid_aabb[0]) / self.resolution
            new_aabb = torch.stack([torch.maximum(box[0] - pad, self.grid_aabb[0]),
                                    torch.minimum(box[1] + pad, self.grid_aabb[1])])
            lo, hi = new_aabb.tolist()  # host sync (once per upsampling): the new box's bounds
            shape = voxel_shape(resolution, new_aabb, self.cfg.cubic_voxels, self.multiple)
            axes = [torch.linspace(lo[i], hi[i], shape[i], device=self.density.device) for i in range(3)]
            points = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3)  # x-major
        else:  # the box stays: the new lattice's vertices in it (a shard's slice)
            points = self.table_vertices(resolution).to(self.density.device)
        index, weights = self._corners(points)
        density = interpolate(self.density, index, weights)
        features = interpolate(self.features, index, weights)
        self.density, self.features = nn.Parameter(density), nn.Parameter(features)
        self._table_box().copy_(new_aabb)
        self.grid_resolution.fill_(resolution)
        self.update_occupancy()

    def update_state(self, step: int, stage_step: int | None = None) -> bool:
        """Move to the next resolution once ``stage_step`` (default ``step``) reaches the current
        stage's entry of ``upsample_steps`` (one stage per call: the stage is read from the
        current resolution, so a model restored at any stage goes on from it); refresh the
        occupancy grid every ``occupancy_every`` steps of ``step``."""
        nxt = next_resolution(self.cfg.resolutions, self.cfg.upsample_steps, self.resolution,
                              step if stage_step is None else stage_step)
        if nxt is not None:
            self.upsample(nxt)
        if step > 0 and step % self.cfg.occupancy_every == 0:
            self.update_occupancy()
        return nxt is not None
