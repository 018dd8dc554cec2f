"""The march's two walks of the occupied cells give the same samples, bit for bit: the two-level walk
(the CPU's) and the dense one (the CUDA paths', fewer operators), on random grids and rays; and both
against a float64 enumeration of every interval's midpoint."""
from __future__ import annotations

import pytest
import torch

from distnerf.host_buffers import sync_free_paths
from distnerf.renderer.occupancy import OccupancyGrid, march


@pytest.mark.parametrize("trial", range(3))
def test_dense_walk_equals_two_level_walk(trial):
    g = torch.Generator().manual_seed(trial)
    aabb = torch.tensor([[-1.0, -1.2, -0.9], [1.1, 1.0, 1.3]])
    occupancy = OccupancyGrid(aabb, 16 + 8 * trial)
    occupancy.binary.copy_(torch.rand(occupancy.binary.shape, generator=g) < 0.15)
    origins = torch.randn(200, 3, generator=g) * 2
    directions = -origins + torch.randn(200, 3, generator=g) * 0.5
    near = torch.rand(200, generator=g) * 0.2
    far = near + 3 + torch.rand(200, generator=g)
    anchor = near + torch.rand(200, generator=g) * 0.01
    for step in (0.01, 0.03):
        a = march(origins, directions, anchor, near, far, step, occupancy)
        with sync_free_paths(True):
            b = march(origins, directions, anchor, near, far, step, occupancy)
        assert len(a) > 0
        for x, y in zip((a.ray_indices, a.t_starts, a.t_ends), (b.ray_indices, b.t_starts, b.t_ends)):
            assert torch.equal(x, y)
    # the samples are the grid's intervals, clipped to [near, far] within the occupied cells' box (a float64
    # slab test), whose midpoints are occupied (a float64 enumeration of every interval)
    o, d, a64 = origins.double(), directions.double(), anchor.double()
    box = occupancy.occupied_box().double()
    faces = (box[:, None] - o) / d  # (2, R, 3)
    lo = torch.maximum(faces.amin(0).amax(-1), near.double())
    hi = torch.minimum(faces.amax(0).amin(-1), far.double())
    dt = step / d.norm(dim=-1)
    j = torch.arange(-1, 2000, dtype=torch.float64)
    t0 = (a64[:, None] + j * dt[:, None]).clamp(lo[:, None], hi[:, None])
    t1 = (a64[:, None] + (j + 1) * dt[:, None]).clamp(lo[:, None], hi[:, None])
    mids = o[:, None] + d[:, None] * (0.5 * (t0 + t1))[..., None]
    cells = ((mids - aabb[0].double()) / (aabb[1] - aabb[0]).double() * occupancy.resolution).floor().long()
    inside = ((cells >= 0) & (cells < occupancy.resolution)).all(-1) & (t1 > t0)
    c = cells.clamp(0, occupancy.resolution - 1)
    occupied = occupancy.binary[c[..., 0], c[..., 1], c[..., 2]] & inside
    per_ray = torch.bincount(b.ray_indices, minlength=200)
    # midpoints exactly on a cell face may round either way in float32: allow a handful per thousand
    assert (per_ray - occupied.sum(1)).abs().sum() <= max(3, occupied.sum() // 300)
