"""Volume rendering, along-ray sampling and ray marching (distnerf.renderer.*).

References are closed forms computed by hand, float64 naive loops, or geometry of
hand-placed rays and boxes.
"""
from __future__ import annotations

import math

import pytest
import torch

from distnerf.renderer.occupancy import OccupancyGrid, march
from distnerf.renderer.samples import (clip_to_box, intervals_from_points, ray_aabb, sample_pdf,
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
    assert torch.equal(s[:, 0], near) and torch.equal(e[:, -1], far)  # exactly [near, far]


def test_stratified_samples_perturbed_stay_in_their_bins():
    num = 8
    near, far = torch.full((500,), 2.0), torch.full((500,), 6.0)
    gen = torch.Generator().manual_seed(0)
    s, e = stratified_samples(near, far, num, perturb=True, generator=gen)
    width = 4.0 / num
    centres = 2.0 + width * (torch.arange(num) + 0.5)
    assert torch.equal(s[:, 1:], e[:, :-1])  # contiguous intervals
    # they cover exactly [near, far]: the outer edges are not jittered
    assert torch.equal(s[:, 0], near) and torch.equal(e[:, -1], far)
    assert (s >= 2.0).all() and (e <= 6.0).all() and (e >= s).all()
    # every interval contains the centre of its bin and stays inside its neighbouring half bins
    assert ((s <= centres) & (e >= centres)).all()
    assert ((s >= centres - width) & (e <= centres + width)).all()
    # jitter is really random: the edges vary across rays
    assert s[:, 3].std() > 0.05 * width
    # per-ray bounds: still exactly [near, far] on every ray
    near_r = torch.rand(500, generator=gen) * 2.0
    far_r = near_r + 0.1 + torch.rand(500, generator=gen) * 5.0
    s_r, e_r = stratified_samples(near_r, far_r, num, perturb=True, generator=gen)
    assert torch.equal(s_r[:, 0], near_r) and torch.equal(e_r[:, -1], far_r)
    assert torch.equal(s_r[:, 1:], e_r[:, :-1]) and (e_r > s_r).all()
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
def _rays_of(samples, r):
    sel = samples.ray_indices == r
    return samples.t_starts[sel], samples.t_ends[sel]


def test_march_without_occupancy_tiles_the_segment_by_hand():
    f64 = torch.float64
    origins = torch.tensor([[-2.0, 0.1, 0.2], [0.0, 0.0, 5.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=f64)
    dirs = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, -2.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]], dtype=f64)
    anchor = torch.tensor([0.0, 0.5, 0.0, 0.0], dtype=f64)
    t_lo = torch.tensor([1.0, 0.5, 2.0, 1.0], dtype=f64)
    t_hi = torch.tensor([3.0, 1.0, 1.0, 1.0], dtype=f64)  # rays 2 (t_lo > t_hi) and 3 (empty) get nothing
    s = march(origins, dirs, anchor, t_lo, t_hi, 0.3, None)
    assert s.num_rays == 4 and s.ray_indices.tolist() == [0] * 7 + [1] * 4
    # ray 0: grid 0, 0.3, 0.6, ... (unit direction: dt = step) clipped to [1, 3]
    t0, t1 = _rays_of(s, 0)
    assert torch.allclose(t0, torch.tensor([1.0, 1.2, 1.5, 1.8, 2.1, 2.4, 2.7], dtype=f64), atol=1e-12, rtol=0)
    assert torch.allclose(t1, torch.tensor([1.2, 1.5, 1.8, 2.1, 2.4, 2.7, 3.0], dtype=f64), atol=1e-12, rtol=0)
    # ray 1: |d| = 2, so dt = 0.15 in the ray parameter (0.3 in space), anchored at 0.5
    t0, t1 = _rays_of(s, 1)
    assert torch.allclose(t0, torch.tensor([0.5, 0.65, 0.8, 0.95], dtype=f64), atol=1e-12, rtol=0)
    assert torch.allclose(t1, torch.tensor([0.65, 0.8, 0.95, 1.0], dtype=f64), atol=1e-12, rtol=0)
    # exact tiling: first start is t_lo, last end is t_hi, no gap, no overlap
    for r in (0, 1):
        t0, t1 = _rays_of(s, r)
        assert t0[0] == t_lo[r] and t1[-1] == t_hi[r] and torch.equal(t0[1:], t1[:-1])


def test_march_jittered_anchor_keeps_the_ray_grid():
    f64 = torch.float64
    g = torch.Generator().manual_seed(0)
    n, step = 200, 0.07
    origins = torch.randn(n, 3, generator=g, dtype=f64)
    dirs = torch.randn(n, 3, generator=g, dtype=f64)
    dirs = dirs / dirs.norm(dim=-1, keepdim=True) * (0.5 + 1.5 * torch.rand(n, 1, generator=g, dtype=f64))
    near = torch.rand(n, generator=g, dtype=f64)
    far = near + 0.5 + 2.5 * torch.rand(n, generator=g, dtype=f64)
    u = torch.rand(n, generator=g, dtype=f64)
    dt = step / dirs.norm(dim=-1)
    anchor = near + u * dt
    mid = near + 0.37 * (far - near)  # a segment that starts inside the ray (a later region)
    for t_lo in (near, mid):
        s = march(origins, dirs, anchor, t_lo, far, step, None)
        for r in range(n):
            t0, t1 = _rays_of(s, r)
            a, d, lo, hi = float(anchor[r]), float(dt[r]), float(t_lo[r]), float(far[r])
            assert float(t0[0]) == lo and float(t1[-1]) == hi and torch.equal(t0[1:], t1[:-1])
            # the inner edges are exactly the grid points anchor + j dt strictly inside (lo, hi)
            j = torch.arange(math.floor((lo - a) / d) - 1, math.ceil((hi - a) / d) + 2, dtype=f64)
            grid = a + j * d
            inner = grid[(grid > lo + 1e-12) & (grid < hi - 1e-12)]
            assert t0.shape[0] == inner.shape[0] + 1
            assert torch.allclose(t0[1:], inner, atol=1e-12, rtol=0)
            # spatial length: step for every full interval, at most step for the two partial ones
            length = (t1 - t0) * float(dirs[r].norm())
            assert torch.allclose(length[1:-1], torch.full_like(length[1:-1], step), atol=1e-12, rtol=0)
            assert (length <= step + 1e-12).all() and (length > 0).all()
            if t_lo is near:  # the first interval ends at the anchor: its length is the jitter u dt
                assert abs(float(t1[0]) - a) < 1e-12 or u[r] < 1e-9
    # the jitter is really random across rays: the first interval's length u dt varies
    s = march(origins, dirs, anchor, near, far, step, None)
    first = torch.stack([_rays_of(s, r)[1][0] - near[r] for r in range(n)])
    assert torch.allclose(first, u * dt, atol=1e-12, rtol=0) and (first / dt).std() > 0.2


def test_march_single_occupied_cell_by_hand():
    f64 = torch.float64
    box = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    grid = OccupancyGrid(box, 4)
    grid.binary.zero_()
    grid.binary[2, 1, 3] = True  # x in [0.5, 0.75], y in [0.25, 0.5], z in [0.75, 1]
    origins = torch.tensor([[-0.5, 0.375, 0.875],   # through the cell centre along +x
                            [-0.5, 0.625, 0.875],   # one cell higher in y: all empty
                            [0.6, 0.375, 0.875]], dtype=f64)  # starts inside the cell
    dirs = torch.tensor([[1.0, 0.0, 0.0]] * 3, dtype=f64)
    near, far = torch.zeros(3, dtype=f64), torch.full((3,), 5.0, dtype=f64)
    t_lo, t_hi = clip_to_box(origins, dirs, near, far, box.double())
    s = march(origins, dirs, near, t_lo, t_hi, 0.05, grid)
    # ray 0 enters at t = 0.5; interval j = [0.05 j, 0.05 (j + 1)] has midpoint x = 0.05 j - 0.475,
    # inside [0.5, 0.75] for j = 20..24
    t0, t1 = _rays_of(s, 0)
    assert torch.allclose(t0, torch.tensor([1.0, 1.05, 1.1, 1.15, 1.2], dtype=f64), atol=1e-12, rtol=0)
    assert torch.allclose(t1, t0 + 0.05, atol=1e-12, rtol=0)
    assert _rays_of(s, 1)[0].numel() == 0
    # ray 2 starts at x = 0.6: midpoints 0.625, 0.675, 0.725 are in the cell
    t0, t1 = _rays_of(s, 2)
    assert torch.allclose(t0, torch.tensor([0.0, 0.05, 0.1], dtype=f64), atol=1e-12, rtol=0)


def _sparse_grid(box, m: int, seed: int, faces: bool = True) -> OccupancyGrid:
    """A few isolated cells, two small blobs and (``faces``) some cells on the box faces."""
    g = torch.Generator().manual_seed(seed)
    grid = OccupancyGrid(box, m)
    grid.binary.zero_()
    for _ in range(6):
        i = torch.randint(0, m, (3,), generator=g)
        grid.binary[i[0], i[1], i[2]] = True
    for _ in range(2):
        lo = torch.randint(0, m - 3, (3,), generator=g)
        size = torch.randint(1, 4, (3,), generator=g)
        grid.binary[lo[0]:lo[0] + size[0], lo[1]:lo[1] + size[1], lo[2]:lo[2] + size[2]] = True
    for axis in range(3 if faces else 0):  # face cells: the occupied cells' box is the whole box
        for side in (0, m - 1):
            for _ in range(3):
                i = torch.randint(0, m, (3,), generator=g)
                i[axis] = side
                grid.binary[i[0], i[1], i[2]] = True
    return grid


def _test_rays(grid: OccupancyGrid, n: int, seed: int, dtype):
    """Rays from outside aimed at occupied cells, rays starting inside the box (next to
    occupied cells), and rays grazing the box's faces (nearly parallel to a face, within a
    hair of its plane, a quarter exactly in it) through occupied face cells."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = grid.aabb[0].double(), grid.aabb[1].double()
    size, m = hi - lo, grid.resolution
    cell = size / m
    occ = grid.binary.nonzero().double()  # (N, 3) occupied cells

    def in_cells(cells):  # a random point in each of the given cells
        return lo + (cells + torch.rand(cells.shape, generator=g, dtype=torch.float64)) * cell

    def pick(cells, k):
        return cells[torch.randint(0, cells.shape[0], (k,), generator=g)]

    # from outside, through a random point of an occupied cell
    o1 = torch.randn(n, 3, generator=g, dtype=torch.float64)
    o1 = 0.5 * (lo + hi) + 2.0 * size.norm() * o1 / o1.norm(dim=-1, keepdim=True)
    d1 = in_cells(pick(occ, n)) - o1
    # from inside: half in an occupied cell, half a few cells away from one; random direction
    o2 = (in_cells(pick(occ, n)) + (torch.rand(n, 3, generator=g, dtype=torch.float64) - 0.5) * 6 * cell)
    o2[: n // 2] = in_cells(pick(occ, n // 2))
    o2 = torch.minimum(torch.maximum(o2, lo), hi)
    d2 = torch.randn(n, 3, generator=g, dtype=torch.float64)
    # grazing: through an occupied cell on a face of the occupied cells' box, in (or a hair
    # off) the face's plane
    idx = torch.arange(n)
    axis = torch.randint(0, 3, (n,), generator=g)
    first, last = occ.min(dim=0).values, occ.max(dim=0).values
    face_cells = [occ[(occ[:, a] == first[a]) | (occ[:, a] == last[a])] for a in range(3)]
    cells = torch.stack([pick(face_cells[int(a)], 1)[0] for a in axis])
    p = in_cells(cells)
    top = cells[idx, axis] == last[axis]
    hair = (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * 1e-4 * cell.min()
    hair[: n // 4] = 0.0  # exactly in the face plane
    p[idx, axis] = torch.where(top, lo[axis] + (last[axis] + 1) * cell[axis], lo[axis] + first[axis] * cell[axis]) + hair
    d3 = torch.randn(n, 3, generator=g, dtype=torch.float64)
    d3[idx, axis] = (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * 1e-4
    d3[idx[: n // 4], axis[: n // 4]] = 0.0
    o3 = p - 2.0 * size.norm() * d3 / d3.norm(dim=-1, keepdim=True)
    origins = torch.cat([o1, o2, o3])
    dirs = torch.cat([d1, d2, d3])
    dirs = dirs / dirs.norm(dim=-1, keepdim=True) * (0.5 + torch.rand(3 * n, 1, generator=g, dtype=torch.float64))
    near = torch.cat([torch.full((n,), 0.1), torch.zeros(n), torch.full((n,), 0.2)]).double()
    far = near + 4.0 * size.norm()
    u = torch.rand(3 * n, generator=g, dtype=torch.float64)
    return origins.to(dtype), dirs.to(dtype), near.to(dtype), far.to(dtype), u.to(dtype)


def _occupied_box(grid: OccupancyGrid) -> torch.Tensor:
    """(2, 3) float32 bounding box of the occupied cells, from the cell indices."""
    idx = grid.binary.nonzero()
    cell = (grid.aabb[1] - grid.aabb[0]) / grid.resolution
    return torch.stack([grid.aabb[0] + idx.min(dim=0).values * cell, grid.aabb[0] + (idx.max(dim=0).values + 1) * cell])


@pytest.mark.parametrize("m,step_cells,dtype,faces", [(37, 0.3, torch.float64, True), (64, 2.7, torch.float64, True),
                                                      (64, 0.45, torch.float32, True),
                                                      (100, 7.9, torch.float64, True),
                                                      (40, 8.5, torch.float32, True),
                                                      (48, 0.7, torch.float64, False),
                                                      (48, 3.3, torch.float32, False)],
                         ids=["M37-groups13", "M64-groups1", "M64-f32", "M100-step>coarse", "M40-f32-step>coarse",
                              "M48-inner-box", "M48-inner-box-f32"])
def test_march_two_level_walk_keeps_every_occupied_midpoint(m, step_cells, dtype, faces):
    """The coarse walk must never drop a sample whose midpoint is occupied: marching with the
    grid equals marching without it, filtered by the grid's occupancy at each midpoint.

    The marcher samples nothing outside the box of the occupied cells (commit fa63d0d):
    the segment is first clipped to that box, so the reference clips it too (the interval
    edges stay on the ray's sample grid; only the two end intervals are cut at the box).
    """
    box = torch.tensor([[-1.0, -2.0, 0.0], [1.0, 0.0, 3.0]])
    grid = _sparse_grid(box, m, seed=m, faces=faces)
    occupied_box = _occupied_box(grid)
    assert faces == bool(torch.allclose(occupied_box, box, atol=1e-6, rtol=0))
    cell = float(((box[1] - box[0]) / m).min())
    step = step_cells * cell
    n = 400 if step_cells < 1 else 1500  # rays of each kind
    origins, dirs, near, far, u = _test_rays(grid, n, seed=m + 1, dtype=dtype)
    anchor = near + u * step / dirs.norm(dim=-1)
    t_in, t_out = clip_to_box(origins, dirs, near, far, box.to(dtype))
    half = origins.shape[0] // 2
    # half the rays with the segment clipped to the box, half with the whole [near, far]
    t_lo = torch.cat([t_in[:half], near[half:]])
    t_hi = torch.cat([t_out[:half], far[half:]])
    got = march(origins, dirs, anchor, t_lo, t_hi, step, grid)
    lo, hi = clip_to_box(origins, dirs, t_lo, t_hi, occupied_box.to(dtype))
    full = march(origins, dirs, anchor, lo, hi, step, None)
    ref = full.select(grid.query(full.points(origins, dirs)))
    assert len(ref) > 300  # many occupied samples to check
    if dtype == torch.float64:
        assert torch.equal(got.ray_indices, ref.ray_indices)
        assert torch.equal(got.t_starts, ref.t_starts) and torch.equal(got.t_ends, ref.t_ends)
    else:  # float32: a midpoint within rounding of a cell face may be read on either side
        def keys(s):
            return set(zip(s.ray_indices.tolist(), s.t_starts.tolist(), s.t_ends.tolist()))

        differ = keys(got) ^ keys(ref)
        assert len(differ) <= 0.01 * len(ref)
        for r, a, b in differ:
            mid = origins[r].double() + dirs[r].double() * (0.5 * (a + b))
            cells = (mid - box[0].double()) / (box[1] - box[0]).double() * m
            assert float((cells - cells.round()).abs().min()) < 1e-4, (r, a, b)
    # every kind of ray (outside, inside, grazing) contributes occupied samples
    for kind in range(3):
        assert ((ref.ray_indices // n) == kind).sum() > 20


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
