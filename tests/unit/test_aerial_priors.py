"""Priors for aerial (large, opaque, unbounded) captures, each against values computed here:

* ``model.min_altitude``: rays end where they go below the floor (Mega-NeRF's ray altitude range,
  lower bound): the ray parameter where ``o_y + t d_y`` reaches the floor, and a field whose only
  content lies under the floor;
* ``model.shell_alpha_init``: a contracted grid starts every marching step at opacity
  ``alpha_init``, in the shell as in the box (``1 - exp(-sigma dt scale)`` from the contraction's
  own step scale);
* ``model.random_background``: training renders unabsorbed light over a random colour per ray.
"""
from __future__ import annotations

import math

import pytest
import torch

from distnerf.data.rays import RayBundle
from distnerf.model.grid import SHELL_SCALE_CAP, GridModel
from distnerf.renderer.contraction import world_step_scale
from distnerf.renderer.samples import far_above_altitude
from distnerf.strategy.partition import grid_partition, to_infinity
from distnerf.strategy.regions import RegionRayFilter

AABB = torch.tensor([[-4.0, 0.0, -4.0], [4.0, 2.0, 4.0]])
BG = torch.tensor([0.25, 0.5, 0.875])


def _rays(origins, directions) -> RayBundle:
    o = torch.tensor(origins, dtype=torch.float32)
    d = torch.tensor(directions, dtype=torch.float32)
    n = o.shape[0]
    return RayBundle(origins=o, directions=d, viewdirs=d / d.norm(dim=-1, keepdim=True),
                     near=torch.full((n,), 0.1), far=torch.full((n,), 50.0))


def test_far_is_where_a_ray_going_down_crosses_the_floor():
    o = torch.tensor([[0.0, 10.0, 0.0], [1.0, 10.0, 2.0], [0.0, 10.0, 0.0], [0.0, 10.0, 0.0], [0.0, -1.0, 0.0]])
    d = torch.tensor([[0.0, -1.0, 0.0], [2.0, -4.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])
    far = torch.tensor([math.inf, math.inf, 7.0, math.inf, 5.0])
    out = far_above_altitude(o, d, far, 0.5)
    assert out[0] == pytest.approx(9.5)  # 10 - 9.5 = 0.5
    assert out[1] == pytest.approx(9.5 / 4)  # directions need not be unit: t in their units
    assert out[2] == 7.0 and math.isinf(out[3])  # up, level: unchanged
    assert out[4] < 0  # starts under the floor going down: an empty segment
    assert far_above_altitude(o[:1], d[:1], torch.tensor([3.0]), 0.5) == pytest.approx(3.0)  # far first


def test_with_a_footprint_the_floor_ends_only_rays_that_reach_it_above_the_box():
    """``model.floor_footprint``: the floor cuts a ray only where it reaches the floor above the
    box's x/z range; past the box's edge the ray keeps its far bound. Crossings worked out here."""
    o = torch.tensor([[0.0, 10.0, 0.0], [0.0, 10.0, 0.0], [0.0, 10.0, 0.0], [3.0, 10.0, 3.0]])
    #                 straight down;  x = 0 + 8 * 9.5/10 = 7.6 (outside x <= 4);  z = 3.8 (inside);  at (4, 4)
    d = torch.tensor([[0.0, -1.0, 0.0], [8.0, -10.0, 0.0], [0.0, -10.0, 4.0], [1.0, -9.5, 1.0]])
    far = torch.full((4,), math.inf)
    out = far_above_altitude(o, d, far, 0.5, AABB)
    assert out[0] == pytest.approx(9.5) and math.isinf(out[1])
    assert out[2] == pytest.approx(0.95) and out[3] == pytest.approx(1.0)  # an edge counts as inside
    everywhere = far_above_altitude(o, d, far, 0.5)
    assert everywhere[1] == pytest.approx(0.95)  # without the footprint it is cut too
    model = GridModel(AABB, BG, resolutions=[8], upsample_steps=[], contraction="mipnerf360", min_altitude=0.5,
                      floor_footprint=True)
    rays = _rays(o.tolist(), d.tolist())
    assert torch.equal(model.ray_far(rays), out)


def test_ss_refuses_a_floor_it_does_not_route():
    """(``model.opaque_floor`` is supported under ``ss``: tests/unit/test_ss_floor.py.)"""
    from distnerf.distributed import DistEnv
    from distnerf.strategy import build_strategy

    strategy = build_strategy({"name": "ss"}, DistEnv())
    with pytest.raises(ValueError, match="model.floor_footprint=true is not supported with strategy=ss"):
        strategy.prepare(None, "/nonexistent", 0, {"min_altitude": -0.5, "floor_footprint": True})


def _ground_model(min_altitude):
    """A contracted 16^3 grid, opaque under y = 0.5 (in the box and the shell), clear above."""
    torch.manual_seed(0)
    model = GridModel(AABB, BG, resolutions=[16], upsample_steps=[], color="sh", contraction="mipnerf360",
                      min_altitude=min_altitude, tv_weight=0.0)
    with torch.no_grad():
        n = model.resolution
        ys = torch.linspace(float(model.grid_aabb[0, 1]), float(model.grid_aabb[1, 1]), n)
        # the tables' y coordinate of each vertex (x-major: index = (x n + y) n + z), in contracted space
        y = ys.view(1, n, 1).expand(n, n, n).reshape(-1)
        model.density.copy_(torch.where(y < 0.5, 20.0, -20.0).view_as(model.density))
        model.update_occupancy()
    return model.eval()


def test_a_floor_hides_what_is_under_it_and_leaves_rays_going_up_alone():
    rays = _rays([[0.3, 6.0, 0.2], [0.3, 6.0, 0.2], [-1.0, 1.5, 0.5]],
                 [[0.1, -1.0, 0.05], [0.6, -0.5, -0.3], [0.2, 0.7, 0.1]])
    with torch.no_grad():
        free, floored = _ground_model(None)(rays), _ground_model(-0.5)(rays)
        above = _ground_model(0.6)(rays)
    assert (free["opacity"][:2] > 0.99).all()  # without a floor the rays going down meet the content
    assert (above["opacity"][:2] < 1e-3).all()  # ended at y = 0.6, above all of it: the background shows
    assert torch.allclose(above["rgb"][:2], BG.expand(2, 3), atol=1e-3)
    assert above["num_samples"] < free["num_samples"]
    # rays going up never cross the floor: the same render with or without one
    assert torch.equal(free["rgb"][2], above["rgb"][2]) and torch.equal(free["rgb"][2], floored["rgb"][2])


def test_an_opaque_floor_shows_the_colour_field_at_the_floor_instead_of_the_background():
    """``model.opaque_floor``: a ray the floor ends composites its leftover light over the colour
    field's value at the floor point (evaluated here directly), a ray going up over the background."""
    rays = _rays([[0.3, 6.0, 0.2], [0.3, 6.0, 0.2], [-1.0, 1.5, 0.5]],
                 [[0.1, -1.0, 0.05], [0.6, -0.5, -0.3], [0.2, 0.7, 0.1]])
    torch.manual_seed(0)
    model = GridModel(AABB, BG, resolutions=[16], upsample_steps=[], color="sh", contraction="mipnerf360",
                      min_altitude=0.6, opaque_floor=True, tv_weight=0.0)
    plain = GridModel(AABB, BG, resolutions=[16], upsample_steps=[], color="sh", contraction="mipnerf360",
                      min_altitude=0.6, tv_weight=0.0)
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        n = model.resolution
        ys = torch.linspace(float(model.grid_aabb[0, 1]), float(model.grid_aabb[1, 1]), n)
        y = ys.view(1, n, 1).expand(n, n, n).reshape(-1)
        for m in (model, plain):  # content only under y = 0.5, below the floor: nothing is marched
            m.density.copy_(torch.where(y < 0.5, 20.0, -20.0).view_as(m.density))
            m.update_occupancy()
        model.eval(), plain.eval()
        out, ref = model(rays), plain(rays)
        t = (0.6 - rays.origins[:2, 1]) / rays.directions[:2, 1]
        at_floor = model.colours(rays.origins[:2] + rays.directions[:2] * t[:, None], rays.viewdirs[:2],
                                 torch.arange(2))
    assert (ref["opacity"][:2] < 1e-3).all() and torch.allclose(ref["rgb"][:2], BG.expand(2, 3), atol=1e-3)
    left = (1 - out["opacity"][:2])[:, None]
    assert torch.allclose(out["rgb"][:2], ref["rgb"][:2] + left * (at_floor - BG), atol=1e-6)
    assert (at_floor - BG).abs().max() > 0.05  # the floor's colour is not the background's
    assert torch.equal(out["rgb"][2], ref["rgb"][2])  # going up: the background, as without it


def test_ss_routes_rays_where_the_sub_models_end_them():
    part = grid_partition(AABB.double(), 2, [1, 2, 1], overlap=0.0)  # split in y: a low and a high region
    part.unbounded = True
    low = part.extents()[0]
    assert float(low[1, 1]) == pytest.approx(1.0)  # the low region: y < 1 (to -inf: its face is the box's)
    rays = _rays([[0.0, 6.0, 0.0]], [[0.0, -1.0, 0.0]])
    assert math.isinf(float(to_infinity(rays).far[0]))
    assert float(to_infinity(rays, 1.5).far[0]) == pytest.approx(4.5)
    # a ray going straight down crosses the low region unless it ends above it
    assert RegionRayFilter(low, to_infinity=True)(rays).item()
    assert not RegionRayFilter(low, to_infinity=True, min_altitude=1.5)(rays).item()
    assert RegionRayFilter(low, to_infinity=True, min_altitude=0.5)(rays).item()


def _step_opacity(model, n):
    box = model.grid_aabb
    axis = [torch.linspace(float(box[0, a]), float(box[1, a]), n) for a in range(3)]
    vertices = torch.stack(torch.meshgrid(*axis, indexing="ij"), dim=-1).reshape(-1, 3)
    sigma = model.densities(model.density.detach().view(-1))
    scale = world_step_scale(vertices, model.contraction_aabb)
    return 1.0 - torch.exp(-sigma * model.step_size() * scale), scale


def test_every_step_starts_at_alpha_init_up_to_the_cap_and_plain_shells_start_denser():
    even = GridModel(AABB, torch.ones(3), resolutions=[16], upsample_steps=[], color="sh", contraction="mipnerf360",
                     shell_alpha_init=True, alpha_init=1e-3)
    alpha, scale = _step_opacity(even, 16)
    capped = scale <= SHELL_SCALE_CAP
    assert (scale[capped] > 1).any() and (~capped).any()  # the check reaches into the shell and past the cap
    assert torch.allclose(alpha[capped], torch.full_like(alpha[capped], 1e-3), rtol=1e-3)
    assert (alpha[~capped] > 1e-3).all()  # the far shell: a denser start, by scale / cap
    plain = GridModel(AABB, torch.ones(3), resolutions=[16], upsample_steps=[], color="sh", contraction="mipnerf360",
                      alpha_init=1e-3)
    alpha_plain, _ = _step_opacity(plain, 16)
    inner = scale == 1
    assert torch.allclose(alpha_plain[inner], alpha[inner])  # the box is as before
    shell = capped & (scale > 4)
    assert (alpha_plain[shell] > 3.9e-3).all()  # r^2 times as opaque without it


def test_training_renders_unabsorbed_light_over_a_random_colour_per_ray():
    model = _ground_model(0.6)  # the rays going down end above all content: nothing absorbs them
    model.random_background = True
    rays = _rays([[0.3, 6.0, 0.2]] * 64, [[0.1, -1.0, 0.05]] * 64)
    with torch.no_grad():
        evaluated = model(rays)["rgb"]
        model.train()
        first = model(rays, torch.Generator().manual_seed(3))["rgb"]
        again = model(rays, torch.Generator().manual_seed(3))["rgb"]
        other = model(rays, torch.Generator().manual_seed(4))["rgb"]
    assert torch.allclose(evaluated, BG.expand(64, 3), atol=1e-3)  # evaluation: the scene's background
    assert torch.equal(first, again) and not torch.allclose(first, other)  # drawn from the step's generator
    assert first.std(0).min() > 0.2 and ((first >= 0) & (first <= 1)).all()  # uniform colours: sd 0.29
