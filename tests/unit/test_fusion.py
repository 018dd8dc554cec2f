"""Fusion of sub-scene models: ``segment`` equals one render of the union field (float64).

The reference places each region's samples as the engine's contract says (the ray's
segment in the region's box, clipped to the box of the sub-model's occupied cells,
marched on the ray's one sample grid, anchored at ``near``, with the fused step; a sample
kept where its midpoint is occupied for the region's sub-model), merges all regions' samples along each ray and renders them in ONE pass of
NeRF's quadrature as a float64 per-ray loop (:func:`tests.reference.render_loop`),
colouring a sample only where its *global* weight exceeds the colour threshold. The fused
renderer instead renders one segment per region and composites the segments front to
back; they must agree to float64 round-off.
"""
from __future__ import annotations

import pytest
import torch

from distnerf.distributed import DistEnv
from distnerf.data.rays import RayBundle
from distnerf.model.grid import GridModel
from distnerf.model.nerf import NeRFModel
from distnerf.renderer.occupancy import march
from distnerf.renderer.packed import PackedSamples
from distnerf.renderer.samples import clip_to_box, intervals_from_points, sample_pdf, stratified_samples
from distnerf.renderer.segments import composite_segments
from distnerf.renderer.volume import render_weights, volume_render
from distnerf.schema import SSStrategyConfig
from distnerf.strategy.fusion import FusedRenderer
from distnerf.strategy.partition import grid_partition
from tests.reference import render_loop

AABB = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
BG = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)


def fused_renderer(partition, models, fusion: str, **options) -> FusedRenderer:
    """A :class:`FusedRenderer` with the schema's fusion settings (:class:`SSStrategyConfig`'s
    ``color_threshold``, ``blend_power``) where ``options`` do not set them."""
    ss = SSStrategyConfig()
    return FusedRenderer(partition, models, fusion, **{"color_threshold": ss.color_threshold,
                                                       "blend_power": ss.blend_power, **options})


def random_rays(n: int, seed: int) -> RayBundle:
    g = torch.Generator().manual_seed(seed)
    origins = torch.randn(n, 3, generator=g, dtype=torch.float64)
    origins = 3.0 * origins / origins.norm(dim=-1, keepdim=True)
    target = (torch.rand(n, 3, generator=g, dtype=torch.float64) - 0.5) * 1.2
    d = target - origins
    d = d / d.norm(dim=-1, keepdim=True)
    return RayBundle(origins, d, d.clone(), torch.full((n,), 0.5, dtype=torch.float64),
                     torch.full((n,), 6.0, dtype=torch.float64))


def grid_submodels(part, seed: int, termination: float | None = None) -> dict:
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
        if termination is not None:
            m.termination = termination
        models[k] = m.eval()
    return models


def union_reference(part, models, rays, step, color_threshold: float, shared: bool = False):
    """One pass over the union of the regions' samples (module docstring).

    ``shared``: instead of one march per region segment, one march of the whole scene box,
    each sample taken by the region holding its midpoint (the samples of ``blend``).
    """
    o, d = rays.origins, rays.directions
    if shared:
        t_lo, t_hi = clip_to_box(o, d, rays.near, rays.far, part.bounds)
        whole = march(o, d, rays.near, t_lo, t_hi, step, None)
        owner = part.region_of(whole.points(o, d))
        per_region = {k: whole.select(owner == k) for k in models}
    else:
        per_region = {}
        for k in models:
            t_lo, t_hi = clip_to_box(o, d, rays.near, rays.far, part.boxes[k])
            per_region[k] = march(o, d, rays.near, t_lo, t_hi, step, None)
    ray, t0, t1, sig, rgb = [], [], [], [], []
    for k, m in models.items():
        s = per_region[k]
        if not shared:  # a sub-model samples nothing outside the box of its occupied cells
            grid = m.occupancy
            idx = grid.binary.nonzero()
            cell = (grid.aabb[1] - grid.aabb[0]) / grid.resolution
            occ_box = torch.stack([grid.aabb[0] + idx.min(0).values * cell, grid.aabb[0] + (idx.max(0).values + 1) * cell])
            lo, hi = clip_to_box(o, d, rays.near, rays.far, part.boxes[k])
            lo, hi = clip_to_box(o, d, lo, hi, occ_box.to(o.dtype))
            s = march(o, d, rays.near, lo, hi, step, None)
        s = s.select(m.occupied(s.points(o, d)))
        pts = s.points(o, d)
        ray.append(s.ray_indices), t0.append(s.t_starts), t1.append(s.t_ends)
        sig.append(m.field_density(pts)), rgb.append(m.field_rgb(pts, rays.viewdirs[s.ray_indices]))
    return render_loop(torch.cat(ray), torch.cat(t0), torch.cat(t1), torch.cat(sig), torch.cat(rgb), len(rays), BG,
                       colour_threshold=color_threshold)


@pytest.mark.parametrize("threshold", [SSStrategyConfig().color_threshold, 0.0],
                         ids=["default threshold", "threshold 0"])
@pytest.mark.parametrize("counts", [[2, 1, 1], [2, 2, 1]], ids=["2 regions", "4 regions"])
def test_segment_fusion_equals_single_render_of_union_field(counts, threshold):
    part = grid_partition(AABB, counts[0] * counts[1] * counts[2], counts, overlap=0.15)
    models = grid_submodels(part, 0, termination=0.0)
    rays = random_rays(300, 1)
    fused = fused_renderer(part, models, "segment", background=BG, color_threshold=threshold)
    out = fused(rays)
    with torch.no_grad():
        ref = union_reference(part, models, rays, fused.step_size, threshold)
    assert float(ref["opacity"].mean()) > 0.3  # a non-trivial field: most rays hit something
    assert torch.allclose(out["rgb"], ref["rgb"], atol=1e-10, rtol=0)
    assert torch.allclose(out["opacity"], ref["opacity"], atol=1e-10, rtol=0)
    assert torch.allclose(out["depth"], ref["depth"], atol=1e-9, rtol=0)
    if threshold > 0:
        with torch.no_grad():
            exact = union_reference(part, models, rays, fused.step_size, 0.0)
        assert float((exact["rgb"] - ref["rgb"]).abs().max()) > 1e-6  # the threshold did drop samples


@pytest.mark.parametrize("counts", [[2, 1, 1], [2, 2, 1]], ids=["2 regions", "4 regions"])
def test_segment_fusion_with_default_termination(counts):
    """The sub-models' termination (1e-4): a ray stops inside a segment once its
    transmittance there is below eps, so the global one is too, and what lies behind the
    cut (total weight < eps, colours and background in [0, 1]) changes by < eps per channel."""
    part = grid_partition(AABB, counts[0] * counts[1] * counts[2], counts, overlap=0.15)
    models = grid_submodels(part, 0)
    assert all(m.termination == 1e-4 for m in models.values())
    rays = random_rays(300, 1)
    fused = fused_renderer(part, models, "segment", background=BG)
    out = fused(rays)
    with torch.no_grad():
        ref = union_reference(part, models, rays, fused.step_size, 1e-3)
    diff = (out["rgb"] - ref["rgb"]).abs()
    assert float(diff.max()) <= 1e-4 and float(diff.max()) > 0.0


def test_blend_equals_union_of_shared_samples_where_regions_do_not_overlap():
    part = grid_partition(AABB, 2, [1, 1, 2], overlap=0.0)
    models = grid_submodels(part, 5)
    rays = random_rays(200, 6)
    blend = fused_renderer(part, models, "blend", background=BG, color_threshold=0.0)
    out = blend(rays)
    with torch.no_grad():
        ref = union_reference(part, models, rays, blend.step_size, 0.0, shared=True)
    assert float(ref["opacity"].mean()) > 0.3
    assert torch.allclose(out["rgb"], ref["rgb"], atol=1e-10, rtol=0)
    assert torch.allclose(out["opacity"], ref["opacity"], atol=1e-10, rtol=0)
    # with overlap the two differ (blend mixes the sub-models inside the overlap)
    part_o = grid_partition(AABB, 2, [1, 1, 2], overlap=0.2)
    blend_o = fused_renderer(part_o, models, "blend", background=BG, color_threshold=0.0)(rays)
    assert float((blend_o["rgb"] - ref["rgb"]).abs().max()) > 1e-3


@pytest.mark.parametrize("cuda_paths", [False, True])
def test_segment_entries_of_k_boxes_by_hand_and_operators_constant_in_k(cuda_paths):
    """Entries into K slabs along x, by hand: a ray along +x from x = -3 enters slab [a, b] at a + 3,
    one from inside at its near bound, a ray missing every box at +inf; the near/far bounds clip them.
    Then the operators of the entries and the compositing (issue 50 item 3: per-ray region entries
    vectorised) are the same at K = 2, 4 and 8 regions, on the CPU's and the CUDA paths' slab test."""
    from distnerf.host_buffers import sync_free_paths
    from distnerf.observe.ops import OpCounter
    from distnerf.renderer.segments import segment_entries

    def slabs(k):  # x split in k equal slabs of [-1, 1], full in y and z
        edges = torch.linspace(-1.0, 1.0, k + 1, dtype=torch.float64)
        lo = torch.tensor([[e, -1.0, -1.0] for e in edges[:-1].tolist()], dtype=torch.float64)
        hi = torch.tensor([[e, 1.0, 1.0] for e in edges[1:].tolist()], dtype=torch.float64)
        return torch.stack([lo, hi], dim=1), edges

    origins = torch.tensor([[-3.0, 0.0, 0.0], [0.1, 0.2, 0.0], [-3.0, 5.0, 0.0], [-3.0, 0.0, 0.0]], dtype=torch.float64)
    directions = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [2.0, 0.0, 0.0]], dtype=torch.float64)
    near = torch.tensor([0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    far = torch.tensor([10.0, 10.0, 10.0, 1.5], dtype=torch.float64)  # ray 3 (|d| = 2) ends at x = 0
    inf = float("inf")
    counts = []
    with sync_free_paths(cuda_paths):
        for k in (2, 4, 8):
            boxes, edges = slabs(k)
            entry = segment_entries(origins, directions, near, far, boxes)
            want = torch.full((4, k), inf, dtype=torch.float64)
            want[0] = edges[:-1] + 3.0
            want[1] = torch.where(edges[1:] <= 0.1, inf, (edges[:-1] - 0.1).clamp(min=0.0))
            want[3] = torch.where(edges[:-1] < 0.0, (edges[:-1] + 3.0) / 2.0, inf)  # far at x = 0
            assert torch.equal(entry, want), (k, entry, want)
            values = torch.rand(4, k, 5, dtype=torch.float64)
            with OpCounter() as ops:
                entry = segment_entries(origins, directions, near, far, boxes)
                composite_segments(values[..., :3], values[..., 3], values[..., 4], entry, None)
            counts.append(ops.total)
    assert counts[0] == counts[1] == counts[2] > 0, counts


def test_composite_segments_order_by_entry():
    # two segments given back to front must be composited front to back
    rgb = torch.tensor([[[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]], dtype=torch.float64)  # far blue, near red
    trans = torch.tensor([[0.5, 0.25]], dtype=torch.float64)
    entry = torch.tensor([[2.0, 1.0]], dtype=torch.float64)
    out, _, opacity = composite_segments(rgb, trans, torch.zeros_like(trans), entry, None)
    assert torch.allclose(out, torch.tensor([[1.0, 0.0, 0.25]], dtype=torch.float64))  # red + 0.25 x blue
    assert torch.allclose(opacity, torch.tensor([1 - 0.125], dtype=torch.float64))
    # with a background, and a ray missing region 1 (+inf entry, T = 1, no colour)
    bg = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    rgb = torch.tensor([[[0.0, 0.0, 0.5], [0.0, 0.0, 0.0]]], dtype=torch.float64)
    entry = torch.tensor([[2.0, float("inf")]], dtype=torch.float64)
    out, _, opacity = composite_segments(rgb, torch.tensor([[0.5, 1.0]], dtype=torch.float64),
                                         torch.zeros(1, 2, dtype=torch.float64), entry, bg)
    assert torch.allclose(out, torch.tensor([[0.0, 0.5, 0.5]], dtype=torch.float64))  # blue + 0.5 x green
    assert torch.allclose(opacity, torch.tensor([0.5], dtype=torch.float64))


def test_one_region_fusion_equals_the_model():
    """FusedRenderer with ONE region is the model itself (the schema's colour threshold 1e-3 and
    termination 1e-4, evaluation): same samples, same cut, same colours."""
    torch.manual_seed(0)
    model = GridModel(AABB.float(), BG.float(), resolutions=[16], upsample_steps=[], color="sh").double()
    with torch.no_grad():
        dens = torch.randn(16, 16, 16, dtype=torch.float64) * 2.0 - 8.0  # mostly empty cells
        dens[2:7, 3:10, 4:12] = torch.rand(5, 7, 8, dtype=torch.float64) * 12.0  # from clear to opaque
        dens[9:14, 8:13, 2:7] = 8.0
        model.density.copy_(dens.reshape(-1, 1))
        model.features.copy_(torch.randn_like(model.features))
    model.update_occupancy()
    model.eval()
    assert 0.0 < model.occupancy.binary.float().mean() < 1.0
    part = grid_partition(AABB, 1, [1, 1, 1])
    assert torch.equal(part.bounds, model.grid_aabb.double())
    fused = fused_renderer(part, {0: model}, "segment", background=BG)
    assert fused.color_threshold == model.color_threshold == 1e-3 and model.termination == 1e-4
    rays = random_rays(300, 2)
    with torch.no_grad():
        out, ref = fused(rays), model(rays)
    assert float(ref["opacity"].max()) > 0.999 and float(ref["opacity"].min()) < 0.5
    for key in ("rgb", "depth", "opacity"):
        assert torch.allclose(out[key], ref[key], atol=1e-12, rtol=0), key


def test_regions_tile_the_ray_like_one_march():
    """Random rays through a 2x2x2 grid of regions (crossing up to 3 region boundaries):
    the union of the regions' own marches (no occupancy, one step, the same jittered
    anchor) covers exactly the t-range of one march of the whole box, with no gap and no
    overlap, and its interval edges are that march's edges plus exactly the points where
    the ray crosses a region boundary."""
    f64 = torch.float64
    part = grid_partition(AABB, 8, [2, 2, 2])
    g = torch.Generator().manual_seed(0)
    n, step = 300, 0.043
    rays = random_rays(n, 3)
    inside = torch.rand(n // 3, 3, generator=g, dtype=f64) * 1.8 - 0.9  # a third start inside the box
    origins = torch.cat([inside, rays.origins[n // 3:]])
    dirs = torch.nn.functional.normalize(torch.randn(n, 3, generator=g, dtype=f64), dim=-1)
    dirs = torch.cat([dirs[: n // 3], rays.directions[n // 3:]])
    dirs = dirs * (0.5 + torch.rand(n, 1, generator=g, dtype=f64))  # not unit
    near = torch.cat([torch.zeros(n // 3, dtype=f64), rays.near[n // 3:]])
    far = torch.full((n,), 8.0, dtype=f64)
    anchor = near + torch.rand(n, generator=g, dtype=f64) * step / dirs.norm(dim=-1)
    t_in, t_out = clip_to_box(origins, dirs, near, far, part.bounds)
    single = march(origins, dirs, anchor, t_in, t_out, step, None)
    parts = []
    for box in part.boxes:
        lo, hi = clip_to_box(origins, dirs, near, far, box)
        parts.append(march(origins, dirs, anchor, lo, hi, step, None))
    union = PackedSamples.cat(parts)
    crossings_seen = []
    for r in range(n):
        s0, s1 = single.t_starts[single.ray_indices == r], single.t_ends[single.ray_indices == r]
        u0, u1 = union.t_starts[union.ray_indices == r], union.t_ends[union.ray_indices == r]
        assert s0.numel() > 0
        # same range, no gap, no overlap
        assert u0[0] == s0[0] and u1[-1] == s1[-1]
        assert torch.allclose(u0[1:], u1[:-1], atol=1e-12, rtol=0) and (u1 > u0).all()
        # the boundary crossings: the planes x, y or z = 0 strictly inside the ray's box range
        o, d = origins[r], dirs[r]
        cross = [float(-o[a] / d[a]) for a in range(3) if d[a] != 0]
        cross = [t for t in cross if float(t_in[r]) < t < float(t_out[r])]
        crossings_seen.append(len(cross))
        expected = sorted(set(torch.cat([s0, s1[-1:]]).tolist()) | set(cross))
        merged = [expected[0]]
        for t in expected[1:]:  # a crossing that falls on a grid edge is one edge
            if t - merged[-1] > 1e-12:
                merged.append(t)
        edges = torch.cat([u0, u1[-1:]])
        assert edges.numel() == len(merged), r
        assert torch.allclose(edges, torch.tensor(merged, dtype=f64), atol=1e-12, rtol=0), r
    assert max(crossings_seen) == 3 and sum(c >= 2 for c in crossings_seen) > 30


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
    out = fused_renderer(part, models, "segment", background=BG, color_threshold=0.0)(rays)

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
        fused_renderer(part, {0: models[0]}, "segment")
    with pytest.raises(ValueError, match="one process"):
        fused_renderer(part, models, "blend", distributed=True)
    with pytest.raises(ValueError, match="fusion="):
        fused_renderer(part, models, "average")


def test_region_models_train_only_on_rays_crossing_their_region():
    from distnerf.components.loss import photometric_sse
    from distnerf.strategy.regions import RegionModels

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
    from distnerf.strategy.regions import JointRegionModels

    joint = JointRegionModels(dict(enumerate(nerfs(21))), part, BG, DistEnv()).eval()
    out = joint(rays)
    assert "rgb_coarse" in out and out["rgb_coarse"].shape == (64, 3)


@pytest.mark.cuda
@pytest.mark.parametrize("timed", [False, True])
def test_fusion_synchronises_a_cuda_device_only_when_timing_is_asked(monkeypatch, timed):
    """Issue 26 item 10: on CUDA each timed phase synchronises the device (about four per chunk),
    so segment fusion times its phases there only with ``timed`` (``eval.fusion_timing``). The
    CUDA branch, exercised on the CPU: the renderer told it is on CUDA, the synchronisations
    counted. The image is the same either way."""
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    part = grid_partition(AABB, 2, [2, 1, 1], overlap=0.15)
    models = grid_submodels(part, 0)
    rays = random_rays(64, 1)
    reference = fused_renderer(part, models, "segment", background=BG)(rays)
    monkeypatch.setattr(FusedRenderer, "_on_cuda", property(lambda self: True))
    fused = fused_renderer(part, models, "segment", background=BG)
    fused.timed = timed
    assert fused.keeps_timing is timed  # what evaluation reports (None where not kept)
    out = fused(rays)
    assert torch.equal(out["rgb"], reference["rgb"])
    if timed:
        assert len(calls) == 2 * 3  # total, the two exchange + composite phases: a clock at each end
        assert set(fused.timing) == {"total_s", "exchange_composite_s"}
    else:
        assert calls == [] and not fused.timing
