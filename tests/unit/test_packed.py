"""Packed-sample rendering (distnerf.renderer.packed / marching) against independent values.

References: NeRF's quadrature (Eq. 3) as a float64 per-ray Python loop
(:func:`tests.reference.render_loop`), per-ray float64 cumulative sums, analytic
error bounds of early ray termination, and the geometry of the sample grid.
"""
from __future__ import annotations

import math

import pytest
import torch

from distnerf.data.rays import RayBundle, generate_rays
from distnerf.model.grid import GridModel
from distnerf.model.ngp import NGPModel
from distnerf.renderer.marching import render_segment, shade
from distnerf.renderer.packed import PackedSamples, exclusive_sum, render_packed
from tests.conftest import FERN
from tests.reference import render_loop

F64 = torch.float64
AABB = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])
WHITE = torch.ones(3, dtype=F64)


def random_packed(num_rays: int, max_count: int, seed: int, gaps: bool = True):
    """Random packed samples: random counts per ray (some rays with none), increasing
    intervals with random lengths and (optionally) gaps of skipped space; densities from
    empty to opaque; random colours; rays for the points."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, max_count + 1, (num_rays,), generator=g)
    counts[::7] = 0  # rays without samples
    counts[1] = max(int(counts[1]), 1)
    ray = torch.repeat_interleave(torch.arange(num_rays), counts)
    p = ray.shape[0]
    lengths = 0.02 + 0.3 * torch.rand(p, generator=g, dtype=F64)
    gap = 0.5 * torch.rand(p, generator=g, dtype=F64) * (torch.rand(p, generator=g) < 0.3) if gaps else 0 * lengths
    step = lengths + gap
    first = torch.cumsum(counts, 0) - counts
    csum = torch.cumsum(step, 0)
    start_of_ray = (csum - step)[first.clamp(max=max(p - 1, 0))] if p else csum
    near = 0.5 + torch.rand(num_rays, generator=g, dtype=F64)
    t_ends = near[ray] + csum - start_of_ray[ray]
    t_starts = t_ends - lengths
    # sigma up to 100 (tau up to ~30: opaque). The engine's float64 exclusive sums are one
    # global cumsum, whose absolute error grows with the batch's total tau (~1e-16 x total).
    sigmas = torch.exp(2.5 * torch.randn(p, generator=g, dtype=F64)).clamp(max=100.0)
    sigmas = sigmas * (torch.rand(p, generator=g) > 0.2)
    rgbs = torch.rand(p, 3, generator=g, dtype=F64)
    origins = torch.randn(num_rays, 3, generator=g, dtype=F64)
    dirs = torch.randn(num_rays, 3, generator=g, dtype=F64)
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)
    return PackedSamples(ray, t_starts, t_ends, num_rays), sigmas, rgbs, origins, dirs


def assert_matches_loop(out, ref, atol=1e-12):
    for key in ("rgb", "depth", "opacity"):
        assert torch.allclose(out[key], ref[key], atol=atol, rtol=0), key


# ----------------------------------------------------------------------------- render_packed
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_render_packed_equals_per_ray_loop(seed):
    samples, sigmas, rgbs, _, _ = random_packed(60, 40, seed)
    out = render_packed(sigmas, rgbs, samples, WHITE)
    ref = render_loop(samples.ray_indices, samples.t_starts, samples.t_ends, sigmas, rgbs, 60, WHITE)
    assert torch.allclose(out["weights"], ref["weights"], atol=1e-12, rtol=0)
    assert_matches_loop(out, ref)
    assert torch.allclose(out["transmittance"], ref["transmittance"], atol=1e-12, rtol=0)
    # a non-trivial batch: some opaque rays, some transparent, rays without samples get the background
    assert float(ref["opacity"].max()) > 0.99 and float(ref["opacity"].min()) == 0.0
    empty = torch.bincount(samples.ray_indices, minlength=60) == 0
    assert empty.any() and torch.equal(out["rgb"][empty], WHITE.expand(int(empty.sum()), 3))


def test_render_packed_zero_samples():
    e = torch.zeros(0, dtype=F64)
    samples = PackedSamples(torch.zeros(0, dtype=torch.long), e, e, 5)
    bg = torch.tensor([0.2, 0.4, 0.6], dtype=F64)
    out = render_packed(e, torch.zeros(0, 3, dtype=F64), samples, bg)
    assert torch.equal(out["rgb"], bg.expand(5, 3)) and out["weights"].shape == (0,)
    zeros = torch.zeros(5, dtype=F64)
    assert torch.equal(out["opacity"], zeros) and torch.equal(out["depth"], zeros)
    assert torch.equal(out["transmittance"], torch.ones(5, dtype=F64))


# ----------------------------------------------------------------------------- colour threshold
def _colour_fn(a: torch.Tensor, b: torch.Tensor):
    """An analytic colour field of position and view direction (for shade and the loop)."""
    def fn(points, viewdirs, ray_indices):
        return torch.sigmoid(points @ a + viewdirs[ray_indices] @ b)
    return fn


@pytest.mark.parametrize("threshold", [1e-3, 2e-2])
def test_shade_colour_threshold_equals_loop(threshold):
    samples, sigmas, _, origins, dirs = random_packed(80, 40, seed=3)
    g = torch.Generator().manual_seed(4)
    colour_fn = _colour_fn(torch.randn(3, 3, generator=g, dtype=F64), torch.randn(3, 3, generator=g, dtype=F64))
    rgbs = colour_fn(samples.points(origins, dirs), dirs, samples.ray_indices)  # every sample's colour
    out = shade(None, colour_fn, samples, origins, dirs, dirs, None, WHITE, threshold, sigmas)
    ref = render_loop(samples.ray_indices, samples.t_starts, samples.t_ends, sigmas, rgbs, 80, WHITE,
                      colour_threshold=threshold)
    assert_matches_loop(out, ref)
    assert out["num_colour_samples"] == ref["num_colour"] < len(samples)  # the threshold dropped samples
    exact = render_loop(samples.ray_indices, samples.t_starts, samples.t_ends, sigmas, rgbs, 80, WHITE)
    assert float((exact["rgb"] - ref["rgb"]).abs().max()) > 1e-4  # ... and that changed the colour
    assert torch.allclose(out["opacity"], exact["opacity"], atol=1e-12, rtol=0)  # but not the opacity
    # a segment (no background) behind a random transmittance in_front: the threshold sees in_front * w
    in_front = torch.rand(80, generator=g, dtype=F64)
    seg = shade(None, colour_fn, samples, origins, dirs, dirs, in_front, None, threshold, sigmas)
    ref_seg = render_loop(samples.ray_indices, samples.t_starts, samples.t_ends, sigmas, rgbs, 80, None,
                          colour_threshold=threshold, in_front=in_front)
    assert_matches_loop(seg, ref_seg)
    assert seg["num_colour_samples"] == ref_seg["num_colour"] < out["num_colour_samples"]


def test_background_weight_is_the_product_of_one_minus_alpha():
    """Opacity is ``1 - prod(1 - alpha)`` whatever the colour threshold dropped (the
    background gets exactly ``T_R``, not ``1 - sum of the kept weights``)."""
    samples, sigmas, _, origins, dirs = random_packed(80, 40, seed=5)
    black = lambda p, v, r: torch.zeros(p.shape[0], 3, dtype=F64)  # noqa: E731
    bg = torch.tensor([0.3, 0.6, 0.9], dtype=F64)
    out = shade(None, black, samples, origins, dirs, dirs, None, bg, 5e-2, sigmas)
    prod = torch.ones(80, dtype=F64)
    kept = torch.zeros(80, dtype=F64)
    for i, (r, t0, t1, s) in enumerate(zip(samples.ray_indices.tolist(), samples.t_starts.tolist(),
                                           samples.t_ends.tolist(), sigmas.tolist())):
        alpha = 1.0 - math.exp(-s * (t1 - t0))
        if prod[r] * alpha > 5e-2:
            kept[r] += prod[r] * alpha
        prod[r] *= 1.0 - alpha
    assert torch.allclose(out["transmittance"], prod, atol=1e-12, rtol=0)
    assert torch.allclose(out["opacity"], 1.0 - prod, atol=1e-12, rtol=0)
    assert torch.allclose(out["rgb"], prod[:, None] * bg, atol=1e-12, rtol=0)
    assert float(((1.0 - kept) - prod).abs().max()) > 1e-3  # 1 - sum(kept w) would be wrong


# ----------------------------------------------------------------------------- exclusive sums
def test_exclusive_sum_float32_precision():
    g = torch.Generator().manual_seed(6)
    counts = torch.randint(0, 650, (700,), generator=g)
    counts[::11] = 0
    ray = torch.repeat_interleave(torch.arange(700), counts)
    assert ray.shape[0] > 200_000
    values = torch.rand(ray.shape[0], generator=g)  # float32, like tau of a float32 model
    out = exclusive_sum(values, ray, 700)
    assert out.dtype == torch.float32
    ref = torch.empty(ray.shape[0], dtype=F64)
    start = 0
    for c in counts.tolist():  # per ray, in float64
        v = values[start:start + c].double()
        ref[start:start + c] = torch.cumsum(v, 0) - v
        start += c
    err = (out.double() - ref).abs()
    assert (err <= 1e-6 * ref).all()  # relative; the first sample of each ray is exactly 0
    # the precision is not free: a float32 global cumsum minus each ray's start loses it
    incl = torch.cumsum(values, 0)
    excl = incl - values
    first = (torch.cumsum(counts, 0) - counts).clamp(max=ray.shape[0] - 1)
    naive = excl - excl[first][ray]
    assert float(((naive.double() - ref).abs() / ref.clamp(min=1e-30)).max()) > 1e-6
    # differentiable
    small = torch.rand(12, generator=g, dtype=F64).requires_grad_()
    small_ray = torch.tensor([0, 0, 0, 2, 2, 3, 3, 3, 3, 4, 4, 4])
    assert torch.autograd.gradcheck(lambda v: exclusive_sum(v, small_ray, 6), (small,))


# ----------------------------------------------------------------------------- marched models
def grid_model(seed: int = 0, resolution: int = 16) -> GridModel:
    """A float64 grid model with random density: mostly semi-transparent, some opaque blobs."""
    torch.manual_seed(seed)
    model = GridModel(AABB, torch.ones(3), resolutions=[resolution], upsample_steps=[], color="sh",
                      tv_weight=0.0).double()
    n = resolution
    with torch.no_grad():
        dens = torch.randn(n, n, n, dtype=F64) * 2.0 - 3.0
        dens[2:6, 3:9, 4:10] = 9.0  # opaque blobs
        dens[9:14, 8:13, 2:7] = 7.0
        model.density.copy_(dens.reshape(-1, 1))
        model.features.copy_(torch.randn_like(model.features))
    model.update_occupancy()
    return model


def sphere_rays(n: int, seed: int) -> RayBundle:
    g = torch.Generator().manual_seed(seed)
    origins = torch.randn(n, 3, generator=g, dtype=F64)
    origins = 3.0 * origins / origins.norm(dim=-1, keepdim=True)
    d = (torch.rand(n, 3, generator=g, dtype=F64) - 0.5) * 1.6 - origins
    d = d / d.norm(dim=-1, keepdim=True)
    return RayBundle(origins, d, d.clone(), torch.full((n,), 0.5, dtype=F64), torch.full((n,), 6.0, dtype=F64))


def test_early_termination_bound_on_colour():
    """Early ray termination changes each channel by less than ``eps = termination``.

    A ray stops once its transmittance ``T_cut`` is below eps. The kept samples keep their
    weights; what lies behind (dropped samples' colours plus ``T_R bg``) is a mix of
    colours in [0, 1] of total weight ``T_cut``, replaced by ``T_cut bg``: both lie in
    [0, T_cut], so ``|C_eps - C_0| <= T_cut < eps`` per channel (module docstring of
    distnerf/renderer/marching.py), in evaluation (rounds) and training (one cut pass).
    """
    model = grid_model()
    model.train_termination = True  # training cuts too (opt-in: model.train_termination)
    rays = sphere_rays(300, 1)

    def render(eps, train):
        model.termination = eps
        model.train(train)
        with torch.set_grad_enabled(train):
            return model(rays, torch.Generator().manual_seed(7) if train else None)

    for train in (False, True):
        exact = render(0.0, train)
        opacity = exact["opacity"].detach()
        assert float(opacity.max()) > 1 - 1e-6 and float(opacity.min()) < 0.5
        for eps in (1e-4, 1e-2):
            out = render(eps, train)
            diff = (out["rgb"] - exact["rgb"]).detach().abs()
            assert float(diff.max()) < eps, (train, eps)
            assert float(diff.max()) > 0.0  # termination did drop something
        # evaluation (in rounds shorter than the rays) skips the density far behind opaque surfaces
        if not train:
            model.eval_round_steps = 8
            assert render(1e-4, False)["num_samples"] < render(0.0, False)["num_samples"]
            model.eval_round_steps = 64
    assert float((render(1e-2, False)["rgb"] - render(0.0, False)["rgb"]).abs().max()) > 1e-4


def test_early_termination_bound_on_density_gradients():
    """Training (autograd on, same anchor): for a kept sample i,
    ``dC/dsigma_i = delta_i (T_{i+1} c_i - sum_{j>i} w_j c_j - T_R bg)`` (Eq. 3
    differentiated). Termination truncates the sum at the cut and replaces ``T_R`` by
    ``T_cut``; the dropped part ``sum_{j>=cut} w_j c_j + T_R bg`` and its replacement
    ``T_cut bg`` both lie in [0, T_cut], so the gradient changes by at most
    ``delta_i T_cut < delta_i eps``. A dropped sample (``T_i <= eps``) has gradient 0 with
    termination and ``|dC/dsigma_i| <= delta_i T_i <= delta_i eps`` without: the same bound.
    Checked per channel on the gradients w.r.t. a leaf tensor of per-sample densities."""
    model = grid_model(seed=1)
    model.train()
    rays = sphere_rays(200, 2)
    step = model.step_size()
    u = torch.rand(200, generator=torch.Generator().manual_seed(3), dtype=F64)
    anchor = rays.near + u * step / rays.directions.norm(dim=-1)
    marcher = model.marcher()
    full = marcher(rays.origins, rays.directions, anchor, rays.near, rays.far)
    points = full.points(rays.origins, rays.directions)
    with torch.no_grad():
        leaf = model.field_density(points).clone().requires_grad_()
    lookup = {tuple(p): i for i, p in enumerate(points.tolist())}

    def density_fn(p):  # the leaf's entry of each queried sample (exact same points)
        return leaf[torch.tensor([lookup[tuple(q)] for q in p.tolist()], dtype=torch.long)]

    def grads(eps):
        out = render_segment(density_fn, model.colours, marcher, rays.origins, rays.directions, rays.viewdirs,
                             anchor, rays.near, rays.far, background=WHITE, colour_threshold=1e-3,
                             termination=eps, step_size=step)
        return torch.stack([torch.autograd.grad(out["rgb"][:, c].sum(), leaf, retain_graph=True,
                                                allow_unused=True)[0] for c in range(3)])

    eps = 1e-4
    g0, g_eps = grads(0.0), grads(eps)
    bound = full.deltas * eps
    assert ((g_eps - g0).abs() <= bound + 1e-15).all()
    dropped = (g_eps == 0).all(dim=0) & (g0 != 0).any(dim=0)
    assert dropped.sum() > 100  # many samples behind the cuts
    kept = ~dropped & (g0 != 0).any(dim=0)
    assert float(((g_eps - g0).abs()[:, kept]).max()) > 0  # the kept samples' gradients did change
    assert float(g0.abs().max()) > 100 * float(bound.max())  # the bound is far below the gradients


@pytest.mark.parametrize("round_steps", [1, 3, 64])
def test_evaluation_rounds_equal_one_pass(round_steps):
    """Evaluation in rounds of ``round_steps`` grid intervals (termination 0) evaluates the
    same samples as one pass. (Rounds used to restart from floor((lo - anchor) / dt), which
    can land one edge short: with round_steps = 1 a ray never advanced; a 60 s alarm turns
    such a hang into a failure.)"""
    import signal

    def hang(*_):
        raise TimeoutError("evaluation rounds did not finish (a ray stopped advancing)")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(60)
    try:
        _rounds_equal_one_pass(round_steps)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _rounds_equal_one_pass(round_steps):
    model = grid_model(seed=2).eval()
    model.termination = 0.0
    rays = sphere_rays(300, 3)
    with torch.no_grad():
        model.eval_round_steps = 0  # one pass
        single = model(rays)
        model.eval_round_steps = round_steps
        rounds = model(rays)
    assert rounds["num_samples"] == single["num_samples"] > 1000
    for key in ("rgb", "depth", "opacity"):
        assert torch.allclose(rounds[key], single[key], atol=1e-12, rtol=0), key


def test_evaluation_rounds_start_and_end_at_the_occupied_box():
    """The marcher's ``clip`` (the part of a segment inside the model's box and its occupied
    cells' box) starts and ends the evaluation rounds there: a ray that misses the occupied box
    costs no round, one that crosses it costs the rounds of that part only (front to back over
    [near, far] it would march every 8 intervals of air), and the samples, pixels and counts
    are those of the rounds over the whole segment (termination 0: with termination the samples
    marched past a cut in the round that makes it, counted but not rendered, depend on where the
    rounds end)."""
    model = grid_model(seed=2)
    with torch.no_grad():  # one opaque blob in empty space: its occupied box is a fraction of the box
        model.density.fill_(-20.0)
        model.density.view(16, 16, 16)[6:10, 6:10, 6:10] = 9.0
    model.update_occupancy()
    model.eval()
    rays = sphere_rays(300, 3)
    step = model.step_size()
    full_marcher = model.marcher()
    calls = {"clipped": 0, "whole": 0}

    def counted(name, clip):
        def fn(*args, **kwargs):
            calls[name] += 1
            return full_marcher(*args, **kwargs)
        if clip:
            fn.clip = full_marcher.clip
        return fn

    outs = {}
    with torch.no_grad():
        for name in calls:
            outs[name] = render_segment(model.field_density, model.colours, counted(name, name == "clipped"),
                                        rays.origins, rays.directions, rays.viewdirs, rays.near, rays.near,
                                        rays.far, background=WHITE, colour_threshold=1e-3, termination=0.0,
                                        step_size=step, round_steps=8)
    clipped, whole = outs["clipped"], outs["whole"]
    assert clipped["num_samples"] == whole["num_samples"] > 100
    for key in ("rgb", "depth", "opacity"):
        assert torch.allclose(clipped[key], whole[key], atol=1e-12, rtol=0), key
    box = model.occupancy.occupied_box()
    assert float((box[1] - box[0]).max()) < 0.5 * float((AABB[1] - AABB[0]).min())  # the blob's box is small
    assert 0 < calls["clipped"] < calls["whole"] / 2, calls


def test_training_rounds_keep_the_one_pass_samples_and_gradients():
    """Training in rounds (``train_round_steps``) cuts each ray where its transmittance falls
    below ``termination`` like the one no-grad pass over the whole ray, so the rendered
    samples, colours and gradients are those of the one pass (float64, equal to rounding),
    while the density behind the cut is not evaluated (fewer marched samples: sphere rays
    ending on an opaque surface)."""
    model = grid_model(seed=1)
    model.train()
    model.train_termination = True  # the one pass cuts too (opt-in: model.train_termination)
    rays = sphere_rays(300, 1)

    def render(round_steps):
        model.train_round_steps = round_steps
        model.zero_grad(set_to_none=True)
        out = model(rays, torch.Generator().manual_seed(7))
        out["rgb"].square().sum().backward()
        return out, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    single, g_single = render(0)
    rounds, g_rounds = render(8)
    assert float(single["opacity"].detach().max()) > 0.999  # some rays do end on the surface
    assert rounds["num_density_samples"] - rounds["num_samples"] == single["num_density_samples"] - \
        single["num_samples"] > 1000  # the same samples rendered with gradients
    assert rounds["num_samples"] < single["num_samples"]  # ... but fewer marched (none behind a cut)
    for key in ("rgb", "depth", "opacity"):
        assert torch.allclose(rounds[key], single[key], atol=1e-10, rtol=0), key
    assert len(g_rounds) == len(g_single) > 0
    for a, b in zip(g_rounds, g_single):
        assert torch.allclose(a, b, atol=1e-9, rtol=1e-7)


def test_distortion_matches_the_double_sum_and_prefers_a_surface_to_fog():
    """The O(P) distortion loss equals mip-NeRF 360's Eq. 15 summed directly (float64,
    every pair of samples of a ray), 0 for a ray without samples; and of two rays of equal
    opacity, weight spread along the ray (fog) costs more than weight in one interval."""
    from distnerf.renderer.packed import distortion_loss

    g = torch.Generator().manual_seed(5)
    counts = [3, 0, 7, 1, 5]
    ray = torch.repeat_interleave(torch.arange(5), torch.tensor(counts))
    gaps = torch.rand(len(ray), generator=g, dtype=F64)
    s0 = torch.cat([torch.cumsum(gaps[ray == r], 0) for r in range(5)])
    s1 = s0 + 0.5 * torch.rand(len(ray), generator=g, dtype=F64)
    w = torch.rand(len(ray), generator=g, dtype=F64)
    expected = torch.zeros(5, dtype=F64)
    mids = 0.5 * (s0 + s1)
    for i in range(len(ray)):
        for j in range(len(ray)):
            if ray[i] == ray[j]:
                expected[ray[i]] += w[i] * w[j] * (mids[i] - mids[j]).abs()
        expected[ray[i]] += w[i] ** 2 * (s1[i] - s0[i]) / 3
    got = distortion_loss(w, s0, s1, ray, 5)
    assert torch.allclose(got, expected, atol=1e-12, rtol=0) and got[1] == 0
    # 10 intervals of 0.1 on [0, 1]: fog (0.09 on each) against a surface (0.9 on one)
    edges = torch.linspace(0, 1, 11, dtype=F64)
    ray2 = torch.zeros(10, dtype=torch.long)
    fog = distortion_loss(torch.full((10,), 0.09, dtype=F64), edges[:-1], edges[1:], ray2, 1)
    surface = distortion_loss(torch.zeros(10, dtype=F64).index_fill(0, torch.tensor([4]), 0.9), edges[:-1], edges[1:],
                         ray2, 1)
    assert float(surface) == pytest.approx(0.81 * 0.1 / 3) and float(fog) == pytest.approx(0.27)  # 0.0081 * 0.1 * 330 + 0.0027


# ----------------------------------------------------------------------------- NDC
@pytest.mark.skipif(not FERN.is_dir(), reason=f"fern scene not found at {FERN}")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ndc_samples_are_spaced_by_the_step_on_fern(dtype):
    from distnerf.data import load_llff

    scene = load_llff(FERN, "test")  # 3 images at factor 8, NDC
    g = torch.Generator().manual_seed(0)
    n = 96
    idx = torch.randint(0, len(scene), (n,), generator=g)
    u = torch.randint(0, scene.width, (n,), generator=g)
    v = torch.randint(0, scene.height, (n,), generator=g)
    rays = generate_rays(scene.cameras, idx, u, v, scene.near, scene.far, scene.ndc).map(lambda t: t.to(dtype))
    model = GridModel(scene.aabb, torch.ones(3), resolutions=[48], upsample_steps=[], step_ratio=0.5).to(dtype)
    # the step is step_ratio x the smallest voxel edge of the grid box (N vertices: N - 1 voxels per axis)
    box = scene.aabb.double()
    voxel = ((box[1] - box[0]) / 47).min().item()
    assert model.step_size() == pytest.approx(0.5 * voxel, rel=1e-6)
    step = model.step_size()
    jitter = torch.rand(n, generator=g, dtype=dtype) * step / rays.directions.norm(dim=-1)
    for anchor in (rays.near, rays.near + jitter):  # evaluation and training anchors
        s = model.marcher()(rays.origins, rays.directions, anchor, rays.near, rays.far)
        pts = s.points(rays.origins, rays.directions).double()
        o, d = rays.origins.double()[s.ray_indices], rays.directions.double()[s.ray_indices]
        p0, p1 = o + d * s.t_starts.double()[:, None], o + d * s.t_ends.double()[:, None]
        length = (p1 - p0).norm(dim=-1)
        for r in range(n):
            sel = (s.ray_indices == r).nonzero().view(-1)
            assert sel.numel() > 20
            full = sel[1:-1]  # the first and last intervals are clipped to the box or [near, far]
            assert torch.allclose(length[full], torch.full_like(length[full], step), atol=1e-6, rtol=0)
            gaps = (pts[full[1:]] - pts[full[:-1]]).norm(dim=-1)  # consecutive midpoints
            assert torch.allclose(gaps, torch.full_like(gaps, step), atol=1e-6, rtol=0)
            assert (length[sel] <= step + 1e-6).all()
            assert torch.equal(s.t_starts[sel[1:]], s.t_ends[sel[:-1]])  # contiguous (all cells occupied)


# ----------------------------------------------------------------------------- zero samples
def _models():
    grid = GridModel(AABB, torch.tensor([0.2, 0.4, 0.6]), resolutions=[8], upsample_steps=[], tv_weight=0.0)
    ngp = NGPModel(AABB, torch.tensor([0.2, 0.4, 0.6]), num_levels=4, log2_table_size=10, base_resolution=4,
                   max_resolution=32, hidden_width=16, num_steps=64, occupancy_resolution=16)
    return {"grid": grid, "ngp": ngp}


@pytest.mark.parametrize("name", ["grid", "ngp"])
@pytest.mark.parametrize("case", ["miss", "empty-occupancy"])
@pytest.mark.parametrize("mode", ["train", "eval", "eval-no-grad"])
def test_zero_sample_batch(name, case, mode):
    model = _models()[name]
    g = torch.Generator().manual_seed(0)
    n = 16
    if case == "miss":  # every ray points away from the box
        origins = torch.full((n, 3), 3.0) + torch.rand(n, 3, generator=g)
        dirs = torch.nn.functional.normalize(torch.rand(n, 3, generator=g) + 0.1, dim=-1)
    else:  # every ray crosses the box, but no cell is occupied
        model.occupancy.binary.zero_()
        origins = torch.tensor([[0.0, 0.0, -3.0]]).expand(n, 3) + 0.3 * torch.rand(n, 3, generator=g)
        dirs = torch.tensor([[0.0, 0.0, 1.0]]).expand(n, 3).contiguous()
    rays = RayBundle(origins, dirs, dirs.clone(), torch.zeros(n), torch.full((n,), 8.0))
    model.train(mode == "train")
    with torch.set_grad_enabled(mode != "eval-no-grad"):
        out = model(rays, torch.Generator().manual_seed(1) if mode == "train" else None)
    assert out["num_samples"] == 0
    assert torch.equal(out["rgb"], model.background.expand(n, 3))
    assert torch.equal(out["opacity"], torch.zeros(n)) and torch.equal(out["depth"], torch.zeros(n))
    if mode != "eval-no-grad":
        loss = ((out["rgb"] - torch.rand(n, 3, generator=g)) ** 2).sum()
        loss.backward()  # legal: an empty graph through the parameters
        assert all(p.grad is None or float(p.grad.abs().sum()) == 0.0 for p in model.parameters())
