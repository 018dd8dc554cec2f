"""Scene contraction (mip-NeRF 360 Eq. 10, infinity norm) and the contracted ray spacing.

Checked against analytic values: the identity inside the box, radius 2 at infinity,
mip-NeRF 360's closed form outside, a spacing whose steps span a constant contracted
length along rays from the box centre, and the models' fields read at the same
contracted coordinates as their occupancy grids.
"""
from __future__ import annotations

import pytest
import torch

from distnerf.data.rays import RayBundle
from distnerf.model import build_model
from distnerf.renderer.contraction import (contract, contracted_box, from_spacing, ray_breaks, to_spacing,
                                           uncontract, world_step_scale)
from distnerf.renderer.occupancy import OccupancyGrid, march

BOX = torch.tensor([[-1.0, 1.0, 2.0], [3.0, 2.0, 3.0]], dtype=torch.float64)  # centre (1, 1.5, 2.5), half (2, .5, .5)
CENTRE, HALF = BOX.mean(0), 0.5 * (BOX[1] - BOX[0])


def _unit_dirs(n: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    d = torch.randn(n, 3, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return d / d.norm(dim=-1, keepdim=True)


def test_identity_inside_the_box():
    u = torch.rand(1000, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2 - 1
    x = CENTRE + HALF * u
    assert torch.equal(contract(x, BOX), x)


def test_outside_matches_the_closed_form_and_stays_in_the_doubled_box():
    # u = (3, 0, 0) in box units: ||u||_inf = 3 -> (2 - 1/3) along x
    x = CENTRE + HALF * torch.tensor([[3.0, 0.0, 0.0], [0.0, -10.0, 4.0], [2.0, 2.0, -2.0]], dtype=torch.float64)
    expected = torch.tensor([[5 / 3, 0.0, 0.0], [0.0, -1.9, 0.76], [1.5, 1.5, -1.5]], dtype=torch.float64)
    assert torch.allclose(contract(x, BOX), CENTRE + HALF * expected, atol=1e-12)
    far = CENTRE + HALF * torch.randn(10000, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 50
    q = (contract(far, BOX) - CENTRE) / HALF
    assert q.abs().amax(-1).max() <= 2.0
    box = contracted_box(BOX)
    assert torch.allclose(box, torch.stack([CENTRE - 2 * HALF, CENTRE + 2 * HALF]))


def test_infinite_and_huge_points_map_onto_the_boundary_never_nan():
    inf = float("inf")
    x = torch.tensor([[inf, 0.0, 0.0], [-inf, inf, 5.0], [1e6, 3.0, -2.0], [0.0, -1e30, 0.0]], dtype=torch.float32)
    q = contract(x, BOX.float())
    assert torch.isfinite(q).all()
    v = (q.double() - CENTRE) / HALF
    assert torch.allclose(v.abs().amax(-1), torch.full((4,), 2.0, dtype=torch.float64), atol=1e-5)
    assert v[0, 0] == pytest.approx(2.0) and v[1, 0] == pytest.approx(-2.0) and v[1, 1] == pytest.approx(2.0)


def test_uncontract_inverts_contract():
    x = CENTRE + HALF * torch.randn(5000, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 20
    assert torch.allclose(uncontract(contract(x, BOX), BOX), x, rtol=1e-9, atol=1e-9)


def test_contraction_is_monotone_along_rays():
    """Along every ray the contracted radius rises and falls with the world radius (the
    map keeps the order of distances from the centre), and the spacing parameter rises
    strictly with the ray parameter, to 2 b at infinity."""
    o = CENTRE + HALF * (torch.rand(200, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 4 - 2)
    d = _unit_dirs(200, 4)
    t = torch.logspace(-3, 6, 400, dtype=torch.float64)
    pts = o[:, None] + d[:, None] * t[None, :, None]  # (R, T, 3)
    r = ((pts - CENTRE) / HALF).abs().amax(-1)
    rho = ((contract(pts.reshape(-1, 3), BOX) - CENTRE) / HALF).abs().amax(-1).view(200, 400)
    rising = r[:, 1:] > r[:, :-1]
    assert ((rho[:, 1:] >= rho[:, :-1] - 1e-12) == rising | (rho[:, 1:] == rho[:, :-1])).all()
    assert (rho[:, -1] > 1.99).all()
    b = ray_breaks(o, d, torch.zeros(200, dtype=torch.float64), BOX)
    s = to_spacing(t[None].expand(200, -1), b[:, None].expand(-1, 400))
    assert (s[:, 1:] > s[:, :-1]).all() and (s[:, -1] < 2 * b).all()


def test_spacing_is_continuous_invertible_and_ends_at_twice_the_break():
    b = torch.tensor([0.5, 2.0, 7.0], dtype=torch.float64)
    t = torch.tensor([0.25, 3.0, 7.0], dtype=torch.float64)
    s = to_spacing(t, b)
    assert torch.allclose(s, torch.tensor([0.25, 4.0 - 4.0 / 3.0, 7.0], dtype=torch.float64))
    assert torch.allclose(from_spacing(s, b), t)
    assert torch.equal(to_spacing(torch.full((3,), float("inf"), dtype=torch.float64), b), 2 * b)
    assert torch.isinf(from_spacing(2 * b, b)).all()
    eps = 1e-7  # ds/dt = 1 on both sides of the break
    assert torch.allclose((to_spacing(b + eps, b) - to_spacing(b - eps, b)) / (2 * eps), torch.ones(3, dtype=torch.float64))


def test_steps_span_one_contracted_step_along_rays_from_the_centre():
    """The spacing's Jacobian matches the contraction's: every full interval of a ray from
    the centre of a cube box spans the step size of contracted distance, in the box and in
    the shell, up to the last (cut) interval, and the ray reaches thousands of box sizes."""
    cube = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]], dtype=torch.float64) * 2.0 + 0.5
    d = _unit_dirs(64, 5)
    o = cube.mean(0).expand(64, 3).clone()
    zero, inf = torch.zeros(64, dtype=torch.float64), torch.full((64,), float("inf"), dtype=torch.float64)
    step = 0.01
    s = march(o, d, zero, zero, inf, step, None, spacing_aabb=cube)
    q0 = contract(o[s.ray_indices] + d[s.ray_indices] * s.t_starts[:, None], cube)
    q1 = contract(o[s.ray_indices] + d[s.ray_indices] * s.t_ends[:, None], cube)
    length = (q1 - q0).norm(dim=-1)
    last = torch.ones_like(length, dtype=torch.bool)
    last[:-1] = s.ray_indices[1:] != s.ray_indices[:-1]
    assert torch.allclose(length[~last], torch.full_like(length[~last], step), rtol=1e-6)
    b = ray_breaks(o, d, zero, cube)
    shell = s.t_starts > b[s.ray_indices]
    assert shell.sum() > 0.4 * len(s)  # the shell gets about as many steps as the box
    world = s.t_ends - s.t_starts
    assert world[shell & ~last].max() > 100 * step  # steps grow with distance in the world
    assert torch.isfinite(s.t_ends).all() and (s.t_ends[last] > 100 * 2.0).all()


def test_contracted_step_stays_bounded_for_rays_from_anywhere_in_the_box():
    """Off the centre the spacing still follows the contraction's Jacobian: each step spans
    about one contracted step (within a factor of 4.5 either way), in the box and the shell."""
    o = CENTRE + HALF * (torch.rand(256, 3, generator=torch.Generator().manual_seed(6), dtype=torch.float64) * 1.8 - 0.9)
    d = _unit_dirs(256, 7)
    zero, inf = torch.zeros(256, dtype=torch.float64), torch.full((256,), float("inf"), dtype=torch.float64)
    s = march(o, d, zero, zero, inf, 0.01, None, spacing_aabb=BOX)
    q0 = contract(o[s.ray_indices] + d[s.ray_indices] * s.t_starts[:, None], BOX)
    q1 = contract(o[s.ray_indices] + d[s.ray_indices] * s.t_ends[:, None], BOX)
    full = torch.ones(len(s), dtype=torch.bool)
    full[:-1] = s.ray_indices[1:] == s.ray_indices[:-1]
    ratio = (q1 - q0).norm(dim=-1)[full] / 0.01
    # measured on this box: 0.17 to 3.9, median 0.97 (a flat box, rays leaving through any side)
    assert 0.1 < ratio.min() and ratio.max() < 4.5 and 0.8 < ratio.median() < 1.2


def test_segments_of_a_ray_tile_its_whole_march():
    o = CENTRE + torch.tensor([[0.3, 0.1, -0.2]], dtype=torch.float64).expand(32, 3)
    d = _unit_dirs(32, 8)
    anchor = torch.rand(32, generator=torch.Generator().manual_seed(9), dtype=torch.float64) * 0.01
    inf = torch.full((32,), float("inf"), dtype=torch.float64)
    whole = march(o, d, anchor, anchor * 0, inf, 0.01, None, spacing_aabb=BOX)
    cut = torch.rand(32, generator=torch.Generator().manual_seed(10), dtype=torch.float64) * 30
    a = march(o, d, anchor, anchor * 0, cut, 0.01, None, spacing_aabb=BOX)
    b = march(o, d, anchor, cut, inf, 0.01, None, spacing_aabb=BOX)
    edges = lambda p: sorted(zip(p.ray_indices.tolist(), p.t_starts.tolist()))  # noqa: E731
    joined = sorted(edges(a) + edges(b))
    starts = edges(whole)
    # the whole march's edges, plus each ray's cut where it splits an interval
    assert set(starts) <= set(joined) and len(joined) - len(starts) <= 32
    assert torch.isclose(a.deltas.sum() + b.deltas.sum(), whole.deltas.sum(), rtol=1e-12)


def test_world_step_scale_inverts_the_radial_jacobian():
    q = CENTRE + HALF * torch.tensor([[0.5, 0.0, 0.0], [1.5, 0.0, 0.0], [0.0, 1.9, 0.0]], dtype=torch.float64)
    expected = torch.tensor([1.0, 4.0, 100.0], dtype=torch.float64)  # r = 1 / (2 - rho): 2 and 10
    assert torch.allclose(world_step_scale(q, BOX), expected)


def test_contracted_occupancy_grid_covers_the_doubled_box_and_queries_world_points():
    grid = OccupancyGrid(torch.zeros(2, 3), 8, contraction_aabb=BOX.float())
    assert torch.equal(grid.aabb, contracted_box(BOX.float()))
    grid.binary.zero_()
    grid.binary[7, :, :] = True  # the outermost slab in +x: world x beyond ~7 box half-widths
    far_x = CENTRE.float() + HALF.float() * torch.tensor([[1e5, 0.0, 0.0], [float("inf"), 0.0, 0.0], [0.5, 0, 0]])
    assert grid.query(far_x).tolist() == [True, True, False]
    centres = grid.cell_centers()
    assert ((centres >= grid.aabb[0]) & (centres <= grid.aabb[1])).all()


@pytest.mark.parametrize("name", ["grid", "ngp"])
def test_models_render_rays_to_the_sky_finitely(name):
    """A contracted model marches to infinity: finite colour, the shell sampled, the
    occupancy grid and the tables on one contracted range, inf-distant points readable."""
    cfg = {"name": name, "contraction": "mipnerf360", "occupancy_every": 4}
    if name == "grid":
        cfg.update(resolutions=[24], upsample_steps=[])
    else:
        cfg.update(num_levels=4, log2_table_size=12, max_resolution=64, num_steps=64, occupancy_resolution=16)
    box = BOX.float()
    model = build_model(cfg, box, torch.zeros(3))
    assert torch.equal(model.occupancy.contraction_aabb, box)
    n = 64
    o = CENTRE.float().expand(n, 3).clone()
    d = _unit_dirs(n, 11, torch.float32)
    rays = RayBundle(o, d, d, torch.zeros(n), torch.full((n,), 2.0))  # far is not a limit when contracted
    model.train()
    out = model(rays, torch.Generator().manual_seed(0))
    assert torch.isfinite(out["rgb"]).all() and out["num_samples"] > 0
    out["rgb"].sum().backward()
    assert model.update_state(4) in (True, False)  # a refresh step
    sigma = model.field_density(torch.tensor([[float("inf"), 0.0, 0.0], [1e6, 1e6, 0.0]]))
    assert torch.isfinite(sigma).all()


def test_an_unknown_contraction_is_refused():
    with pytest.raises(ValueError, match="contraction"):
        build_model({"name": "grid", "contraction": "sphere"}, BOX.float(), torch.zeros(3))
