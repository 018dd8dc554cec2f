"""Volume rendering, along-ray sampling and ray marching (distnerf.renderer.*).

References are closed forms computed by hand, float64 naive loops, or geometry of
hand-placed rays and boxes.
"""
from __future__ import annotations

import math

import pytest
import torch

from distnerf.renderer.occupancy import OccupancyGrid, march_rays
from distnerf.renderer.samples import (intervals_from_points, ray_aabb, sample_pdf,
                                     stratified_samples)
from distnerf.renderer.volume import (alphas_from_densities, composite, render_weights,
                                    volume_render)


def _slab(sigma: float, length: float, num: int, rays: int = 1):
    edges = torch.linspace(0.0, length, num + 1, dtype=torch.float64)
    t_starts = edges[:-1].expand(rays, num).clone()
    t_ends = edges[1:].expand(rays, num).clone()
    sigmas = torch.full((rays, num), sigma, dtype=torch.float64)
    return sigmas, t_starts, t_ends


# ----------------------------------------------------------------------------- volume
@pytest.mark.parametrize("sigma,length,num", [(0.7, 3.0, 16), (5.0, 1.0, 5), (0.05, 10.0, 40)])
def test_constant_density_slab(sigma, length, num):
    sigmas, t_starts, t_ends = _slab(sigma, length, num)
    colour = torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64)
    rgbs = colour.expand(1, num, 3)
    bg = torch.tensor([1.0, 0.0, 0.25], dtype=torch.float64)
    out = volume_render(sigmas, rgbs, t_starts, t_ends, bg)

    alphas = alphas_from_densities(sigmas, t_ends - t_starts)
    _, trans = render_weights(alphas)
    # transmittance at interval starts is exp(-sigma * t)
    assert torch.allclose(trans[0], torch.exp(-sigma * t_starts[0]), rtol=1e-9, atol=1e-12)

    absorbed = 1.0 - math.exp(-sigma * length)
    assert out["weights"].shape == (1, num)
    assert out["opacity"].item() == pytest.approx(absorbed, rel=1e-9)
    assert out["weights"].sum().item() == pytest.approx(absorbed, rel=1e-9)

    # depth = sum_i q^i (1 - q) (i + 1/2) delta with q = exp(-sigma delta), closed form
    delta = length / num
    q = math.exp(-sigma * delta)
    geo = (1 - q ** num) / (1 - q)
    arith_geo = q * (1 - num * q ** (num - 1) + (num - 1) * q ** num) / (1 - q) ** 2
    depth = delta * (1 - q) * (arith_geo + 0.5 * geo)
    assert out["depth"].item() == pytest.approx(depth, rel=1e-9)

    # colour: constant colour over the absorbed part, background behind it
    expected_rgb = absorbed * colour + (1 - absorbed) * bg
    assert torch.allclose(out["rgb"][0], expected_rgb, rtol=1e-9, atol=1e-12)


def test_opacity_independent_of_subdivision():
    # constant density: the quadrature is exact, so splitting every interval in two
    # leaves the opacity unchanged; with no background the colour is sum w_i c_i only
    def render(num):
        sigmas, t_starts, t_ends = _slab(1.3, 2.0, num)
        return volume_render(sigmas, torch.zeros(1, num, 3, dtype=torch.float64), t_starts, t_ends,
                             None)

    a, b = render(7), render(14)
    assert a["opacity"].item() == pytest.approx(b["opacity"].item(), rel=1e-12)
    assert a["opacity"].item() == pytest.approx(1 - math.exp(-2.6), rel=1e-12)
    assert torch.equal(a["rgb"], torch.zeros(1, 3, dtype=torch.float64))


def test_zero_density_gives_background():
    sigmas, t_starts, t_ends = _slab(0.0, 2.0, 8, rays=3)
    rgbs = torch.rand(3, 8, 3, dtype=torch.float64)
    bg = torch.tensor([0.3, 0.6, 0.1], dtype=torch.float64)
    out = volume_render(sigmas, rgbs, t_starts, t_ends, bg)
    assert torch.allclose(out["rgb"], bg.expand(3, 3))
    assert torch.equal(out["opacity"], torch.zeros(3, dtype=torch.float64))
    assert torch.equal(out["depth"], torch.zeros(3, dtype=torch.float64))


def test_composite_with_background_by_hand():
    weights = torch.tensor([[0.25, 0.5]])
    rgbs = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    t_mids = torch.tensor([[1.0, 3.0]])
    bg = torch.tensor([0.0, 0.0, 1.0])
    rgb, depth, opacity = composite(weights, rgbs, t_mids, bg)
    assert torch.allclose(rgb, torch.tensor([[0.25, 0.5, 0.25]]))
    assert torch.allclose(depth, torch.tensor([0.25 * 1.0 + 0.5 * 3.0]))
    assert torch.allclose(opacity, torch.tensor([0.75]))
    rgb_nobg, _, _ = composite(weights, rgbs, t_mids, None)
    assert torch.allclose(rgb_nobg, torch.tensor([[0.25, 0.5, 0.0]]))


def test_render_weights_matches_naive_loop():
    gen = torch.Generator().manual_seed(0)
    alphas = torch.rand(6, 20, generator=gen, dtype=torch.float64) ** 3  # mix of small and large
    alphas[0, 5] = 0.0
    weights, trans = render_weights(alphas)
    ref_w = torch.zeros_like(alphas)
    ref_t = torch.zeros_like(alphas)
    for r in range(alphas.shape[0]):
        t = 1.0
        for s in range(alphas.shape[1]):
            a = float(alphas[r, s])
            ref_t[r, s] = t
            ref_w[r, s] = t * a
            t *= 1.0 - a
    assert torch.allclose(trans, ref_t, rtol=1e-9, atol=1e-12)
    assert torch.allclose(weights, ref_w, rtol=1e-9, atol=1e-12)
    # float32 agrees too
    w32, _ = render_weights(alphas.float())
    assert torch.allclose(w32.double(), ref_w, atol=1e-5)


def test_render_weights_opaque_sample_blocks_the_rest():
    alphas = torch.tensor([[0.5, 1.0, 0.7, 0.9]])
    weights, trans = render_weights(alphas)
    assert torch.allclose(weights[0, :2], torch.tensor([0.5, 0.5]))
    assert (weights[0, 2:] < 1e-6).all() and (trans[0, 2:] < 1e-6).all()


def test_volume_render_gradcheck():
    gen = torch.Generator().manual_seed(1)
    sigmas = (torch.rand(2, 5, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    rgbs = torch.rand(2, 5, 3, generator=gen, dtype=torch.float64).requires_grad_()
    t = torch.sort(torch.rand(2, 6, generator=gen, dtype=torch.float64) * 3, dim=-1).values
    bg = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)

    def fn(s, c):
        out = volume_render(s, c, t[:, :-1], t[:, 1:], bg)
        return out["rgb"], out["depth"], out["opacity"]

    assert torch.autograd.gradcheck(fn, (sigmas, rgbs))


# ----------------------------------------------------------------------------- sampling
def test_sample_pdf_single_bin():
    bins = torch.linspace(2.0, 6.0, 9).expand(3, 9).contiguous()  # 8 bins of width 0.5
    weights = torch.zeros(3, 8)
    weights[0, 3] = 1.0  # bin [3.5, 4.0]
    weights[1, 0] = 0.7  # bin [2.0, 2.5]
    weights[2, 7] = 2.0  # bin [5.5, 6.0]
    lo = torch.tensor([3.5, 2.0, 5.5])[:, None]
    hi = lo + 0.5
    # deterministic: u = linspace(0, 1); the interior CDF values all map into the bin
    # (u = 0 and u = 1 map to the ends of the whole range, as in the reference NeRF code)
    t = sample_pdf(bins, weights, 64, perturb=False)
    assert t.shape == (3, 64)
    inner = t[:, 1:-1]
    assert ((inner >= lo - 1e-6) & (inner <= hi + 1e-6)).all()
    assert torch.all(t[:, 1:] >= t[:, :-1])  # sorted
    # evenly spaced CDF values in one bin are evenly spaced in that bin
    steps = inner[:, 1:] - inner[:, :-1]
    assert torch.allclose(steps, torch.full_like(steps, 0.5 / 63), atol=1e-4)
    # random: all but a ~1e-5 fraction of samples in the bin
    gen = torch.Generator().manual_seed(0)
    t = sample_pdf(bins, weights, 2000, perturb=True, generator=gen)
    inside = ((t >= lo - 1e-6) & (t <= hi + 1e-6)).float().mean()
    assert inside > 0.995
    assert torch.all(t[:, 1:] >= t[:, :-1])


def test_sample_pdf_uniform_weights_invert_the_cdf():
    # uniform weights: the PDF is uniform on [near, far], so sample k = near + u_k (far - near)
    bins = torch.tensor([[0.0, 1.0, 3.0, 4.0]], dtype=torch.float64)  # unequal bin widths
    widths = bins[:, 1:] - bins[:, :-1]
    t = sample_pdf(bins, widths * 10.0, 9, perturb=False)  # weight proportional to width
    expected = torch.linspace(0.0, 4.0, 9, dtype=torch.float64)[None]
    assert torch.allclose(t, expected, atol=1e-4)


def test_sample_pdf_matches_inverse_cdf_reference():
    # piecewise-constant PDF with distinct weights, random u: compare to an explicit
    # float64 inverse CDF written here
    gen = torch.Generator().manual_seed(3)
    bins = torch.tensor([[0.0, 1.0, 2.0, 4.0, 5.0]], dtype=torch.float64)
    weights = torch.tensor([[0.1, 0.4, 0.2, 0.3]], dtype=torch.float64)
    t = sample_pdf(bins, weights, 50, perturb=True, generator=torch.Generator().manual_seed(3))
    u = torch.rand((1, 50), generator=gen).double()  # the same (float32) draws
    w = weights[0] + 1e-5
    cdf = [0.0]
    for x in (w / w.sum()).tolist():
        cdf.append(cdf[-1] + x)
    ref = []
    for uu in u[0].tolist():
        b = max(i for i in range(4) if cdf[i] <= uu)
        frac = (uu - cdf[b]) / (cdf[b + 1] - cdf[b])
        ref.append(bins[0, b].item() + frac * (bins[0, b + 1] - bins[0, b]).item())
    assert torch.allclose(t[0], torch.tensor(sorted(ref), dtype=torch.float64), atol=1e-6)


def test_stratified_samples_deterministic_cover():
    near, far = torch.tensor([1.0, 0.0]), torch.tensor([3.0, 0.5])
    s, e = stratified_samples(near, far, 4, perturb=False)
    assert s.shape == (2, 4) and e.shape == (2, 4)
    assert torch.allclose(s[0], torch.tensor([1.0, 1.5, 2.0, 2.5]))
    assert torch.allclose(e[0], torch.tensor([1.5, 2.0, 2.5, 3.0]))
    assert torch.allclose(s[1], torch.tensor([0.0, 0.125, 0.25, 0.375]))
    assert torch.equal(s[:, 1:], e[:, :-1])  # contiguous


def test_stratified_samples_perturbed_stay_in_their_bins():
    num = 8
    near, far = torch.full((500,), 2.0), torch.full((500,), 6.0)
    gen = torch.Generator().manual_seed(0)
    s, e = stratified_samples(near, far, num, perturb=True, generator=gen)
    width = 4.0 / num
    centres = 2.0 + width * (torch.arange(num) + 0.5)
    assert torch.equal(s[:, 1:], e[:, :-1])  # contiguous intervals
    assert (s >= 2.0).all() and (e <= 6.0).all() and (e >= s).all()
    # every interval contains the centre of its bin and stays inside its neighbouring half bins
    assert ((s <= centres) & (e >= centres)).all()
    assert ((s >= centres - width) & (e <= centres + width)).all()
    # jitter is really random: the edges vary across rays
    assert s[:, 3].std() > 0.05 * width
    # same generator seed -> same samples
    s2, _ = stratified_samples(near, far, num, perturb=True, generator=torch.Generator().manual_seed(0))
    assert torch.equal(s, s2)


def test_intervals_from_points():
    t = torch.tensor([[1.0, 2.0, 4.0]])
    s, e = intervals_from_points(t, torch.tensor([5.0]))
    assert torch.equal(s, t)
    assert torch.equal(e, torch.tensor([[2.0, 4.0, 5.0]]))


# ----------------------------------------------------------------------------- box
UNIT_BOX = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])


def test_ray_aabb_hand_cases():
    origins = torch.tensor([[-3.0, 0.0, 0.0],    # along +x through the box
                            [3.0, 0.5, -0.5],    # along -x
                            [0.0, 0.0, 0.0],     # from inside along +y
                            [-3.0, 2.0, 0.0],    # parallel to x, above the box: miss
                            [-3.0, -3.0, 0.0],   # diagonal (1, 1, 0) through the corner region
                            [0.0, 0.0, 5.0]])    # along -z, unnormalised direction (0, 0, -2)
    dirs = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0],
                         [1.0, 1.0, 0.0], [0.0, 0.0, -2.0]])
    t_min, t_max = ray_aabb(origins, dirs, UNIT_BOX)
    assert torch.allclose(t_min[[0, 1, 2, 4, 5]], torch.tensor([2.0, 2.0, -1.0, 2.0, 2.0]))
    assert torch.allclose(t_max[[0, 1, 2, 4, 5]], torch.tensor([4.0, 4.0, 1.0, 4.0, 3.0]))
    assert t_min[3] > t_max[3]


def test_ray_aabb_misses_and_random_consistency():
    gen = torch.Generator().manual_seed(0)
    o = torch.randn(200, 3, generator=gen) * 3
    d = torch.randn(200, 3, generator=gen)
    box = torch.tensor([[-0.5, -1.0, 0.0], [1.0, 0.5, 2.0]])
    t_min, t_max = ray_aabb(o, d, box)
    hit = t_min <= t_max
    assert hit.any() and (~hit).any()
    # a hit: the points at t_min / t_max lie on the box boundary
    for t in (t_min[hit], t_max[hit]):
        p = o[hit] + t[:, None] * d[hit]
        assert ((p >= box[0] - 1e-4) & (p <= box[1] + 1e-4)).all()
        on_face = ((p - box[0]).abs() < 1e-4) | ((p - box[1]).abs() < 1e-4)
        assert on_face.any(dim=-1).all()
    # a miss: no point on the line is inside (check a dense set of parameters)
    ts = torch.linspace(-20, 20, 4001)
    p = o[~hit][:, None] + ts[:, None] * d[~hit][:, None]
    inside = ((p > box[0]) & (p < box[1])).all(-1)
    assert not inside.any()


# ----------------------------------------------------------------------------- marching
def test_march_rays_without_occupancy():
    origins = torch.tensor([[-2.0, 0.1, 0.2],    # enters at t=1, exits at t=3
                            [0.5, 0.0, 0.0],     # starts inside, exits at t=0.5
                            [-2.0, 3.0, 0.0]])   # misses
    dirs = torch.tensor([[1.0, 0.0, 0.0]] * 3)
    near, far = torch.zeros(3), torch.full((3,), 10.0)
    s, e, mask = march_rays(origins, dirs, near, far, UNIT_BOX, 0.3, None, perturb=False)
    assert s.shape == e.shape == mask.shape == (3, 7)  # ceil(2 / 0.3) = 7 for the longest ray
    assert torch.allclose(e - s, torch.full_like(s, 0.3))
    assert torch.allclose(s[0], 1.0 + 0.3 * torch.arange(7.0))
    # samples are valid while their interval ends inside the box: 1.3 + 0.3k <= 3 -> k <= 5
    assert mask[0].tolist() == [True] * 6 + [False]
    # ray 1 starts at near = 0 (inside), length 0.5: one full step
    assert torch.allclose(s[1, 0], torch.tensor(0.0)) and mask[1].tolist() == [True] + [False] * 6
    assert not mask[2].any()
    # every valid interval lies in the box and in [near, far]
    t_mids = 0.5 * (s + e)
    pts = origins[:, None] + dirs[:, None] * t_mids[..., None]
    assert ((pts[mask] >= -1) & (pts[mask] <= 1)).all()


def test_march_rays_near_far_clip_and_perturb():
    origins = torch.tensor([[-2.0, 0.0, 0.0]] * 50)
    dirs = torch.tensor([[1.0, 0.0, 0.0]] * 50)
    near, far = torch.full((50,), 1.5), torch.full((50,), 2.5)
    gen = torch.Generator().manual_seed(0)
    s, e, mask = march_rays(origins, dirs, near, far, UNIT_BOX, 0.1, None, perturb=True, generator=gen)
    offset = s[:, 0] - 1.5
    assert (offset >= 0).all() and (offset < 0.1).all() and offset.std() > 0.01
    assert (s[mask] >= 1.5 - 1e-6).all() and (e[mask] <= 2.5 + 1e-5).all()
    assert mask.sum(dim=1).min() >= 9  # at least floor((1 - 0.1) / 0.1) samples per ray
    s0, _, m0 = march_rays(origins, dirs, near, far, UNIT_BOX, 0.1, None, perturb=False)
    assert torch.allclose(s0[0, :10], 1.5 + 0.1 * torch.arange(10.0)) and m0[0, :10].all()


def test_march_rays_single_occupied_cell_by_hand():
    box = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    grid = OccupancyGrid(box, 4)
    grid.binary.zero_()
    grid.binary[2, 1, 3] = True  # x in [0.5, 0.75], y in [0.25, 0.5], z in [0.75, 1]
    origins = torch.tensor([[-0.5, 0.375, 0.875],   # through the cell centre along +x
                            [-0.5, 0.625, 0.875]])  # one cell higher in y: all empty
    dirs = torch.tensor([[1.0, 0.0, 0.0]] * 2)
    near, far = torch.zeros(2), torch.full((2,), 5.0)
    s, e, mask = march_rays(origins, dirs, near, far, box, 0.05, grid, perturb=False)
    # entry at t = 0.5; sample k has midpoint x = 0.05 k + 0.025 -> inside [0.5, 0.75] for k = 10..14
    assert mask[0].nonzero().flatten().tolist() == [10, 11, 12, 13, 14]
    assert not mask[1].any()


def test_march_rays_single_occupied_cell_random_rays():
    box = torch.tensor([[-1.0, -2.0, 0.0], [1.0, 0.0, 2.0]])
    m, cell = 5, (1, 3, 2)
    grid = OccupancyGrid(box, m)
    grid.binary.zero_()
    grid.binary[cell] = True
    gen = torch.Generator().manual_seed(0)
    centre = box[0] + (torch.tensor(cell) + 0.5) / m * (box[1] - box[0])
    origins = centre + torch.randn(300, 3, generator=gen) * 2.0
    dirs = centre + torch.randn(300, 3, generator=gen) * 0.2 - origins  # aim near the cell
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)
    near, far = torch.zeros(300), torch.full((300,), 20.0)
    s, e, mask = march_rays(origins, dirs, near, far, box, 0.02, grid, perturb=False)
    s_all, e_all, mask_all = march_rays(origins, dirs, near, far, box, 0.02, None, perturb=False)
    assert torch.equal(s, s_all) and torch.equal(e, e_all)
    pts = origins[:, None] + dirs[:, None] * (0.5 * (s + e))[..., None]
    ijk = ((pts - box[0]) / (box[1] - box[0]) * m).floor().long()
    in_cell = (ijk == torch.tensor(cell)).all(dim=-1)
    assert torch.equal(mask, mask_all & in_cell)
    assert mask.sum() > 100


def test_occupancy_query_and_cell_centres():
    box = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])
    grid = OccupancyGrid(box, 2)
    grid.binary.zero_()
    grid.binary[1, 0, 1] = True
    pts = torch.tensor([[0.5, -0.5, 0.5], [0.5, 0.5, 0.5], [1.5, -0.5, 0.5], [0.99, -0.01, 0.01]])
    assert grid.query(pts).tolist() == [True, False, False, True]
    centres = grid.cell_centers()
    # x-major: row (i * 2 + j) * 2 + k is the centre of cell (i, j, k)
    assert torch.allclose(centres[(1 * 2 + 0) * 2 + 1], torch.tensor([0.5, -0.5, 0.5]))
    assert torch.equal(grid.query(centres), grid.binary.reshape(-1))
    lo_hi = grid.occupied_aabb()
    assert torch.allclose(lo_hi, torch.tensor([[0.0, -1.0, 0.0], [1.0, 0.0, 1.0]]))
