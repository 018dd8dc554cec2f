"""Fusion of sub-scene models: ``segment`` equals one render of the union field (float64).

The reference renders every ray in ONE volume-rendering pass (``volume_render``)
over the same samples, taking each sample's density and colour from the sub-model
that owns it; the fused renderer instead renders one segment per region and
composites the segments front to back. They must agree to float64 round-off.
"""
from __future__ import annotations

import pytest
import torch

from distnerf.data.rays import RayBundle
from distnerf.model.grid import GridModel
from distnerf.model.nerf import NeRFModel
from distnerf.renderer.occupancy import march_rays
from distnerf.renderer.samples import intervals_from_points, sample_pdf, stratified_samples
from distnerf.renderer.volume import render_weights, volume_render
from distnerf.strategy.fusion import FusedRenderer, composite_segments
from distnerf.strategy.partition import grid_partition

AABB = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
BG = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)


def random_rays(n: int, seed: int) -> RayBundle:
    g = torch.Generator().manual_seed(seed)
    origins = torch.randn(n, 3, generator=g, dtype=torch.float64)
    origins = 3.0 * origins / origins.norm(dim=-1, keepdim=True)
    target = (torch.rand(n, 3, generator=g, dtype=torch.float64) - 0.5) * 1.2
    d = target - origins
    d = d / d.norm(dim=-1, keepdim=True)
    return RayBundle(origins, d, d.clone(), torch.full((n,), 0.5, dtype=torch.float64),
                     torch.full((n,), 6.0, dtype=torch.float64))


def grid_submodels(part, seed: int) -> dict:
    models = {}
    for k, box in enumerate(part.enlarged()):
        torch.manual_seed(seed + k)
        m = GridModel(AABB.float(), BG.float(), resolutions=[12], upsample_steps=[], color="sh",
                      focus_aabb=box.float(), context_resolution=6).double()
        with torch.no_grad():
            for t in (m.density, m.context_density):
                t.copy_(torch.randn_like(t) * 3.0 + 6.0)
            for t in (m.features, m.context_features):
                t.copy_(torch.randn_like(t))
            # some empty cells: each model's own occupancy decides for its samples
            m.occupancy.binary.copy_(torch.rand(m.occupancy.binary.shape) > 0.2)
        models[k] = m.eval()
    return models


def union_reference(part, models, rays, step, color_threshold: float = 0.0):
    """One pass over the union field (independent of the segment compositing); colours
    only where the global weight exceeds ``color_threshold``, as a single grid model does."""
    t_starts, t_ends, mask = march_rays(rays.origins, rays.directions, rays.near, rays.far, part.bounds, step,
                                        None, False)
    ray_idx, sample_idx = mask.nonzero(as_tuple=True)
    mid = 0.5 * (t_starts + t_ends)[ray_idx, sample_idx]
    pts = rays.origins[ray_idx] + rays.directions[ray_idx] * mid[:, None]
    owner = part.region_of(pts)
    sigmas = torch.zeros(mask.shape, dtype=torch.float64)
    rgbs = torch.zeros(mask.shape + (3,), dtype=torch.float64)
    for k, m in models.items():
        sel = (owner == k) & m.occupied(pts)
        sigmas[ray_idx[sel], sample_idx[sel]] = m.field_density(pts[sel])
    weights = render_weights(1 - torch.exp(-sigmas * (t_ends - t_starts)))[0]
    for k, m in models.items():
        sel = (owner == k) & m.occupied(pts) & (weights[ray_idx, sample_idx] > color_threshold)
        rgbs[ray_idx[sel], sample_idx[sel]] = m.field_rgb(pts[sel], rays.viewdirs[ray_idx[sel]])
    return volume_render(sigmas, rgbs, t_starts, t_ends, BG)


@pytest.mark.parametrize("counts", [[2, 1, 1], [2, 2, 1]], ids=["2 regions", "4 regions"])
def test_segment_fusion_equals_single_render_of_union_field(counts):
    part = grid_partition(AABB, counts[0] * counts[1] * counts[2], counts, overlap=0.15)
    models = grid_submodels(part, 0)
    rays = random_rays(300, 1)
    fused = FusedRenderer(part, models, "segment", background=BG, color_threshold=0.0)
    out = fused(rays)
    with torch.no_grad():
        ref = union_reference(part, models, rays, fused.step)
    assert float(ref["opacity"].mean()) > 0.3  # a non-trivial field: most rays hit something
    assert torch.allclose(out["rgb"], ref["rgb"], atol=1e-10, rtol=0)
    assert torch.allclose(out["opacity"], ref["opacity"], atol=1e-10, rtol=0)
    t_starts, t_ends, _ = march_rays(rays.origins, rays.directions, rays.near, rays.far, part.bounds, fused.step,
                                     None, False)
    t_mid = 0.5 * (t_starts + t_ends)
    assert torch.allclose(out["depth"], (ref["weights"] * t_mid).sum(-1), atol=1e-9, rtol=0)


def test_colour_threshold_uses_exchanged_transmittance_like_one_model():
    part = grid_partition(AABB, 2, [2, 1, 1], overlap=0.15)
    models = grid_submodels(part, 3)
    rays = random_rays(200, 4)
    fused = FusedRenderer(part, models, "segment", background=BG, color_threshold=1e-3)
    out = fused(rays)
    with torch.no_grad():
        ref = union_reference(part, models, rays, fused.step, color_threshold=1e-3)
        exact = union_reference(part, models, rays, fused.step, color_threshold=0.0)
    assert torch.allclose(out["rgb"], ref["rgb"], atol=1e-10, rtol=0)
    assert float((exact["rgb"] - ref["rgb"]).abs().max()) > 1e-6  # the threshold did drop samples


def test_blend_equals_union_where_regions_do_not_overlap():
    part = grid_partition(AABB, 2, [1, 1, 2], overlap=0.0)
    models = grid_submodels(part, 5)
    rays = random_rays(200, 6)
    blend = FusedRenderer(part, models, "blend", background=BG, color_threshold=0.0)(rays)
    segment = FusedRenderer(part, models, "segment", background=BG, color_threshold=0.0)(rays)
    assert torch.allclose(blend["rgb"], segment["rgb"], atol=1e-10, rtol=0)
    # with overlap the two differ (blend mixes the sub-models inside the overlap)
    part_o = grid_partition(AABB, 2, [1, 1, 2], overlap=0.2)
    blend_o = FusedRenderer(part_o, models, "blend", background=BG, color_threshold=0.0)(rays)
    assert float((blend_o["rgb"] - segment["rgb"]).abs().max()) > 1e-3


def test_composite_segments_order_by_entry():
    # two segments given back to front must be composited front to back
    rgb = torch.tensor([[[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]], dtype=torch.float64)  # far blue, near red
    trans = torch.tensor([[0.5, 0.25]], dtype=torch.float64)
    entry = torch.tensor([[2.0, 1.0]], dtype=torch.float64)
    out, _, opacity = composite_segments(rgb, trans, torch.zeros_like(trans), entry, None)
    assert torch.allclose(out, torch.tensor([[1.0, 0.0, 0.25]], dtype=torch.float64))  # red + 0.25 x blue
    assert torch.allclose(opacity, torch.tensor([1 - 0.125], dtype=torch.float64))


def test_nerf_segment_fusion_composites_the_coarse_pass_across_regions():
    part = grid_partition(AABB, 2, [2, 1, 1], overlap=0.15)
    models = {}
    for k in range(2):
        torch.manual_seed(10 + k)
        models[k] = NeRFModel(AABB.float(), BG.float(), num_coarse=16, num_fine=16, width=16, depth=2,
                              pos_frequencies=3, dir_frequencies=2).double().eval()
    rays = random_rays(100, 7)
    rays = RayBundle(rays.origins, rays.directions, rays.viewdirs, torch.full_like(rays.near, 1.5),
                     torch.full_like(rays.far, 4.5))
    out = FusedRenderer(part, models, "segment", background=BG, color_threshold=0.0)(rays)

    def union(level, t_starts, t_ends):
        mid = 0.5 * (t_starts + t_ends)
        pts = rays.origins[:, None] + rays.directions[:, None] * mid[..., None]
        owner = part.region_of(pts.reshape(-1, 3)).view(mid.shape)
        sigma, rgb = torch.zeros_like(mid), torch.zeros(mid.shape + (3,), dtype=torch.float64)
        for k, m in models.items():
            sel = owner == k
            s, c = m.field(pts[sel], rays.viewdirs[:, None].expand_as(pts)[sel], level=level)
            sigma[sel], rgb[sel] = s, c
        return volume_render(sigma, rgb, t_starts, t_ends, BG)

    t_starts, t_ends = stratified_samples(rays.near, rays.far, 16, False)
    with torch.no_grad():
        coarse = union("coarse", t_starts, t_ends)
    bins = torch.cat([t_starts, t_ends[:, -1:]], dim=-1)
    t_fine = sample_pdf(bins, coarse["weights"], 16, False)
    f_starts, f_ends = intervals_from_points(torch.sort(torch.cat([t_starts, t_fine], -1), -1).values, rays.far)
    with torch.no_grad():
        ref = union("fine", f_starts, f_ends)
    assert torch.allclose(out["rgb"], ref["rgb"], atol=1e-10, rtol=0)
    assert render_weights  # (imported for the reader: the module doc's Eq.)


def test_fusion_rejects_missing_regions_and_distributed_blend():
    part = grid_partition(AABB, 2, [2, 1, 1])
    models = grid_submodels(part, 0)
    with pytest.raises(ValueError, match="needs all 2 regions"):
        FusedRenderer(part, {0: models[0]}, "segment")
    with pytest.raises(ValueError, match="one process"):
        FusedRenderer(part, models, "blend", distributed=True)
    with pytest.raises(ValueError, match="fusion="):
        FusedRenderer(part, models, "average")


def test_region_models_train_only_on_rays_crossing_their_region():
    from distnerf.engine.loss import photometric_sse
    from distnerf.strategy.ss import RegionModels

    part = grid_partition(AABB, 2, [2, 1, 1], overlap=0.0)
    subs = {k: GridModel(AABB.float(), BG.float(), resolutions=[8], upsample_steps=[], color="sh",
                         focus_aabb=part.enlarged()[k].float(), context_resolution=4) for k in range(2)}
    models = RegionModels(subs, part)
    # two rays along z: one at x = -0.5 (region 0 only), one at x = +0.5 (region 1 only); one that misses the box
    o = torch.tensor([[-0.5, 0.0, -3.0], [0.5, 0.0, -3.0], [5.0, 5.0, -3.0]])
    d = torch.tensor([[0.0, 0.0, 1.0]] * 3)
    rays = RayBundle(o, d, d.clone(), torch.zeros(3), torch.full((3,), 6.0))
    out = models(rays)
    assert out["ray_index"].tolist() == [0, 1]  # region 0 renders ray 0, region 1 renders ray 1
    sse = photometric_sse(out, torch.rand(3, 3), torch.ones(3, dtype=torch.bool))
    sse.backward()
    assert subs[0].density.grad.abs().sum() > 0 and subs[1].density.grad.abs().sum() > 0
    # a batch whose rays cross none of the regions: zero loss that still backpropagates (no crash, no hang)
    models.zero_grad()
    empty = models(RayBundle(o[2:], d[2:], d[2:], torch.zeros(1), torch.full((1,), 6.0)))
    loss = photometric_sse(empty, torch.rand(1, 3), torch.ones(1, dtype=torch.bool))
    loss.backward()
    assert float(loss.detach()) == 0.0 and all(float(p.grad.abs().sum()) == 0 for p in models.parameters())


def test_joint_nerf_segments_sample_on_their_own():
    """The documented estimator choice of joint NeRF: each segment draws its fine samples
    from its OWN coarse weights, so changing another region's networks leaves a segment's
    values unchanged; the coarse pass is composited across regions (``rgb_coarse``)."""
    from distnerf.strategy.joint import render_segments

    part = grid_partition(AABB, 2, [2, 1, 1])
    rays = random_rays(64, 9)

    def nerfs(seed_other: int):
        out = []
        for k, seed in enumerate([20, seed_other]):
            torch.manual_seed(seed)
            out.append(NeRFModel(part.boxes[k].float(), torch.zeros(3), num_coarse=8, num_fine=8, width=16, depth=2,
                                 pos_frequencies=3, dir_frequencies=2).double().eval())
        return out

    a = render_segments(nerfs(21), [0, 1], part.boxes, rays)["values"]
    b = render_segments(nerfs(22), [0, 1], part.boxes, rays)["values"]
    assert a.shape[-1] == 9  # fine colour, T, depth, coarse colour, coarse T
    assert torch.equal(a[:, 0], b[:, 0])  # region 0's segment: its own samples only
    assert not torch.allclose(a[:, 1], b[:, 1])
    from distnerf.strategy.ss import JointRegionModels

    joint = JointRegionModels(dict(enumerate(nerfs(21))), part, BG, distributed=False).eval()
    out = joint(rays)
    assert "rgb_coarse" in out and out["rgb_coarse"].shape == (64, 3)
