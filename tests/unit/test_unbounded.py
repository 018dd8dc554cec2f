"""Partitions of unbounded scenes: the outer regions reach infinity, each sub-model is
contracted around its own region, and a ray leaving the scene box is sampled to the sky
and its segments composite exactly.

The reference (float64) places every region's samples as the engine's contract says: the
ray's segment in the region's extent (to infinity for the outer regions), marched on the
contracted spacing of that region's sub-model, anchored at ``near``, kept where the
sub-model's occupancy grid holds the midpoint; it merges all regions' samples along each
ray and renders them in ONE pass of NeRF's quadrature (:func:`tests.reference.render_loop`).
Joint training's segments and ``segment`` fusion must both equal it.
"""
from __future__ import annotations

import pytest
import torch

from distnerf.distributed import DistEnv
from distnerf.data.rays import RayBundle
from distnerf.model.grid import GridModel
from distnerf.renderer.contraction import ray_breaks
from distnerf.renderer.occupancy import march
from distnerf.renderer.samples import clip_to_box
from distnerf.strategy.partition import grid_partition
from distnerf.strategy.regions import JointRegionModels, RegionRayFilter
from tests.reference import render_loop
from tests.unit.test_fusion import fused_renderer

# a flat aerial box (y up): the ground-plane grid splits x and z, so every region is a column
AABB = torch.tensor([[-4.0, 0.0, -4.0], [4.0, 2.0, 4.0]], dtype=torch.float64)
BG = torch.tensor([0.25, 0.5, 0.875], dtype=torch.float64)  # exact in float32 (the renderers keep it so)
INF = float("inf")
DENSITY_SHIFT = 0.0  # raw density offset: a field through which part of the sky shows


def unbounded_partition(counts=(2, 1, 2)):
    part = grid_partition(AABB, counts[0] * counts[1] * counts[2], list(counts), overlap=0.0)
    part.unbounded = True
    return part


def test_outer_regions_extend_to_infinity_and_every_point_has_one_owner():
    part = unbounded_partition()
    ext = part.extents()
    assert torch.isinf(ext[:, :, 1]).all()  # columns: every region is unbounded vertically
    assert (torch.isinf(ext[:, 0, 0]) == (part.boxes[:, 0, 0] == AABB[0, 0])).all()
    assert (torch.isinf(ext[:, 1, 2]) == (part.boxes[:, 1, 2] == AABB[1, 2])).all()
    pts = torch.randn(5000, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 1e4
    pts[:10] = torch.tensor([INF, 0.0, -INF], dtype=torch.float64)  # at infinity too
    inside = ((pts[:, None] >= ext[None, :, 0]) & (pts[:, None] <= ext[None, :, 1])).all(-1)
    assert (inside.sum(1) >= 1).all()
    owner = part.region_of(pts.clamp(-1e300, 1e300))
    assert inside[torch.arange(len(pts)), owner].all()  # the owner's extent holds the point
    bounded = grid_partition(AABB, 4, [2, 1, 2])
    assert torch.equal(bounded.extents(), bounded.boxes)


def test_a_ray_filter_to_infinity_routes_rays_that_leave_the_box():
    part = unbounded_partition()
    o = torch.tensor([[0.5, 10.0, 0.5], [-0.5, 10.0, 0.5]])
    d = torch.tensor([[1.0, -0.05, 0.0], [-1.0, -0.05, 0.0]])  # grazing: they reach y = 2 beyond x = 4 / -4
    d = d / d.norm(dim=-1, keepdim=True)
    rays = RayBundle(o, d, d, torch.zeros(2), torch.full((2,), 5.0))
    outer = RegionRayFilter(part.extents()[2:], to_infinity=True)  # the regions of x > 0
    assert outer(rays).tolist() == [True, False]
    assert RegionRayFilter(part.boxes[2:].float())(rays).tolist() == [False, False]  # the box alone: missed


def contracted_submodels(part, seed: int) -> dict:
    models = {}
    for k, box in enumerate(part.boxes):
        torch.manual_seed(seed + k)
        m = GridModel(box.float(), BG.float(), resolutions=[10], upsample_steps=[], color="sh",
                      contraction="mipnerf360").double()
        with torch.no_grad():
            m.density.copy_(torch.randn_like(m.density) * 2.0 + DENSITY_SHIFT)
            m.features.copy_(torch.randn_like(m.features))
            m.occupancy.binary.copy_(torch.rand(m.occupancy.binary.shape) > 0.2)
        m.termination, m.color_threshold = 0.0, 0.0
        models[k] = m.eval()
    return models


def aerial_rays(n: int, seed: int) -> RayBundle:
    """Rays from above the box, most leaving it sideways: they reach the sky through outer regions."""
    g = torch.Generator().manual_seed(seed)
    origins = torch.cat([(torch.rand(n, 1, generator=g, dtype=torch.float64) - 0.5) * 6,
                         torch.full((n, 1), 3.0, dtype=torch.float64),
                         (torch.rand(n, 1, generator=g, dtype=torch.float64) - 0.5) * 6], dim=1)
    d = torch.randn(n, 3, generator=g, dtype=torch.float64)
    d[:, 1] = -d[:, 1].abs() * 0.3  # shallow, downwards
    d = d / d.norm(dim=-1, keepdim=True)
    return RayBundle(origins, d, d.clone(), torch.full((n,), 0.1, dtype=torch.float64),
                     torch.full((n,), 6.0, dtype=torch.float64))  # far is not a limit here


def union_reference(part, models, rays, step):
    o, d, ext = rays.origins, rays.directions, part.extents()
    inf = torch.full_like(rays.far, INF)
    ray, t0, t1, sig, rgb = [], [], [], [], []
    for k, m in models.items():
        t_lo, t_hi = clip_to_box(o, d, rays.near, inf, ext[k])
        s = march(o, d, rays.near, t_lo, t_hi, step, None, spacing_aabb=m.contraction_aabb)
        s = s.select(m.occupied(s.points(o, d)))
        pts = s.points(o, d)
        ray.append(s.ray_indices), t0.append(s.t_starts), t1.append(s.t_ends)
        sig.append(m.field_density(pts)), rgb.append(m.field_rgb(pts, rays.viewdirs[s.ray_indices]))
    out = render_loop(torch.cat(ray), torch.cat(t0), torch.cat(t1), torch.cat(sig), torch.cat(rgb), len(rays), BG,
                      colour_threshold=0.0)
    return out, torch.cat(ray), torch.cat(t1)


@pytest.mark.parametrize("mode", ["segment fusion", "joint"])
def test_rays_leaving_the_box_are_sampled_to_the_sky_and_composite_exactly(mode):
    part = unbounded_partition()
    models = contracted_submodels(part, 0)
    rays = aerial_rays(256, 1)
    with torch.no_grad():
        if mode == "joint":
            out = JointRegionModels(models, part, BG, DistEnv()).eval()(rays)
            step = models[0].step_size()
            assert all(m.step_size() == step for m in models.values())  # equal regions: one step
        else:
            fused = fused_renderer(part, models, "segment", background=BG, color_threshold=0.0)
            out, step = fused(rays), fused.step_size
        ref, ray, t_end = union_reference(part, models, rays, step)
    # the rays leave the box, through the outer regions, and are sampled far beyond it
    _, t_exit = clip_to_box(rays.origins, rays.directions, rays.near, torch.full_like(rays.far, INF), AABB)
    beyond = torch.zeros(len(rays), dtype=torch.bool)
    beyond[ray[t_end > 10 * 8.0]] = True  # ten box sizes; the furthest sample (2 b^2 / step) is further
    assert beyond.float().mean() > 0.3 and torch.isfinite(t_end).all() and torch.isfinite(t_exit).all()
    assert 0.2 < float(ref["opacity"].mean()) < 0.98  # some of the background shows: a real test of the sky term
    assert torch.allclose(out["rgb"], ref["rgb"], atol=1e-10, rtol=0)
    assert torch.allclose(out["opacity"], ref["opacity"], atol=1e-10, rtol=0)


def test_each_sub_model_contracts_around_its_own_region():
    part = unbounded_partition()
    models = contracted_submodels(part, 0)
    for k, m in models.items():
        assert torch.equal(m.contraction_aabb, part.boxes[k])
        # its break: where a ray from its own centre leaves its own region
        centre = part.boxes[k].mean(0)[None]
        d = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
        b = ray_breaks(centre, d, torch.zeros(1, dtype=torch.float64), m.contraction_aabb)
        assert float(b) == pytest.approx(float(part.boxes[k, 1, 0] - centre[0, 0]))


def test_blend_refuses_an_unbounded_partition():
    part = unbounded_partition()
    with pytest.raises(ValueError, match="unbounded"):
        fused_renderer(part, contracted_submodels(part, 0), "blend", background=BG)
