"""Pinhole rays and the NDC warp (distnerf.data.rays).

Expected values come from hand computation with the documented conventions
(OpenGL c2w: camera looks down -Z, +Y up, +X right; pixel centres at +0.5) or from
float64 references written here, not from the module's own code.
"""
from __future__ import annotations

import math

import pytest
import torch

from distnerf.data.base import Cameras, NDCParams
from distnerf.data.rays import camera_directions, generate_rays, image_rays, ndc_rays


def _cameras(c2w: torch.Tensor, f: float = 2.0, cx: float = 1.5, cy: float = 1.5,
             width: int = 3, height: int = 3) -> Cameras:
    c2w = c2w.reshape(-1, 3, 4).float()
    n = c2w.shape[0]
    return Cameras(c2w, torch.full((n,), f), torch.full((n,), f), torch.full((n,), cx),
                   torch.full((n,), cy), width, height)


def _c2w(rot, trans=(0.0, 0.0, 0.0)) -> torch.Tensor:
    rot = torch.as_tensor(rot, dtype=torch.float32)
    return torch.cat([rot, torch.tensor(trans, dtype=torch.float32)[:, None]], dim=1)


EYE = torch.eye(3)
# 90 degrees about +Y: x -> -z, z -> x (columns are the camera axes in world space)
ROT_Y90 = [[0.0, 0.0, 1.0],
           [0.0, 1.0, 0.0],
           [-1.0, 0.0, 0.0]]


# ----------------------------------------------------------------------------- pinhole
def test_camera_directions_hand_values():
    # 3x3 image, f = 2, principal point at the image centre (1.5, 1.5)
    u = torch.tensor([1, 0, 2, 2, 0])
    v = torch.tensor([1, 0, 0, 2, 1])
    d = camera_directions(u, v, 2.0, 2.0, 1.5, 1.5)
    expected = torch.tensor([
        [0.0, 0.0, -1.0],     # centre pixel looks straight down -Z
        [-0.5, 0.5, -1.0],    # top-left: left (-x) and up (+y)
        [0.5, 0.5, -1.0],     # top-right
        [0.5, -0.5, -1.0],    # bottom-right
        [-0.5, 0.0, -1.0],    # middle-left
    ])
    assert d.dtype == torch.float32 and d.shape == (5, 3)
    assert torch.allclose(d, expected, atol=1e-7)


def test_camera_directions_per_ray_intrinsics():
    u, v = torch.tensor([0, 3]), torch.tensor([0, 1])
    fx, fy = torch.tensor([2.0, 4.0]), torch.tensor([1.0, 8.0])
    cx, cy = torch.tensor([0.5, 1.5]), torch.tensor([0.5, 0.5])
    d = camera_directions(u, v, fx, fy, cx, cy)
    # ray 0: pixel centre on the principal point; ray 1: ((3.5-1.5)/4, -(1.5-0.5)/8)
    expected = torch.tensor([[0.0, 0.0, -1.0], [0.5, -0.125, -1.0]])
    assert torch.allclose(d, expected, atol=1e-7)


def test_generate_rays_identity_camera():
    cams = _cameras(_c2w(EYE))
    idx = torch.zeros(2, dtype=torch.long)
    rays = generate_rays(cams, idx, torch.tensor([1, 0]), torch.tensor([1, 0]), 0.5, 4.0)
    assert torch.allclose(rays.origins, torch.zeros(2, 3))
    s = 1.0 / math.sqrt(1.5)  # |(-0.5, 0.5, -1)| = sqrt(1.5)
    expected = torch.tensor([[0.0, 0.0, -1.0], [-0.5 * s, 0.5 * s, -s]])
    assert torch.allclose(rays.directions, expected, atol=1e-6)
    assert torch.allclose(rays.viewdirs, expected, atol=1e-6)
    assert torch.equal(rays.near, torch.full((2,), 0.5))
    assert torch.equal(rays.far, torch.full((2,), 4.0))
    assert len(rays) == 2


def test_generate_rays_rotated_and_translated_camera():
    # camera at (1, 2, 3) rotated 90 degrees about +Y: it looks down world -X, its right
    # axis is world -Z and its up axis world +Y.
    cams = _cameras(torch.stack([_c2w(EYE), _c2w(ROT_Y90, (1.0, 2.0, 3.0))]))
    idx = torch.tensor([1, 1, 1])
    rays = generate_rays(cams, idx, torch.tensor([1, 0, 2]), torch.tensor([1, 0, 1]), 0.0, 1.0)
    assert torch.allclose(rays.origins, torch.tensor([[1.0, 2.0, 3.0]] * 3))
    # centre: forward = -X. top-left: forward + 0.5 up - 0.5 right = (-1, 0.5, 0.5).
    # middle-right: forward + 0.5 right = (-1, 0, -0.5).
    raw = torch.tensor([[-1.0, 0.0, 0.0], [-1.0, 0.5, 0.5], [-1.0, 0.0, -0.5]])
    expected = raw / raw.norm(dim=-1, keepdim=True)
    assert torch.allclose(rays.directions, expected, atol=1e-6)
    assert torch.allclose(rays.viewdirs, expected, atol=1e-6)


def test_viewdirs_unit_length_random_cameras():
    gen = torch.Generator().manual_seed(0)
    q = torch.linalg.qr(torch.randn(4, 3, 3, generator=gen, dtype=torch.float64)).Q
    c2w = torch.cat([q, torch.randn(4, 3, 1, generator=gen, dtype=torch.float64)], dim=2)
    cams = _cameras(c2w, f=7.0, cx=5.0, cy=4.0, width=10, height=8)
    idx = torch.randint(0, 4, (64,), generator=gen)
    u, v = torch.randint(0, 10, (64,), generator=gen), torch.randint(0, 8, (64,), generator=gen)
    rays = generate_rays(cams, idx, u, v, 0.1, 5.0)
    assert torch.allclose(rays.viewdirs.norm(dim=-1), torch.ones(64), atol=1e-6)
    assert torch.allclose(rays.directions.norm(dim=-1), torch.ones(64), atol=1e-6)
    # float64 reference: d = R ((u+.5-cx)/f, -(v+.5-cy)/f, -1)
    d_cam = torch.stack([(u + 0.5 - 5.0) / 7.0, -(v + 0.5 - 4.0) / 7.0,
                         -torch.ones(64, dtype=torch.float64)], dim=-1).double()
    ref = torch.einsum("rij,rj->ri", q[idx], d_cam)
    ref = ref / ref.norm(dim=-1, keepdim=True)
    assert torch.allclose(rays.viewdirs.double(), ref, atol=1e-6)
    assert torch.allclose(rays.origins.double(), c2w[idx, :, 3], atol=1e-6)


def test_image_rays_row_major():
    w, h, f, cx, cy = 4, 3, 3.0, 2.0, 1.5
    cams = _cameras(torch.stack([_c2w(EYE), _c2w(ROT_Y90, (0.0, 1.0, 0.0))]), f=f, cx=cx, cy=cy,
                    width=w, height=h)
    rays = image_rays(cams, 1, 0.2, 3.0)
    assert len(rays) == h * w
    rot = torch.tensor(ROT_Y90, dtype=torch.float64)
    for k in range(h * w):
        row, col = k // w, k % w
        d = rot @ torch.tensor([(col + 0.5 - cx) / f, -(row + 0.5 - cy) / f, -1.0], dtype=torch.float64)
        d = d / d.norm()
        assert torch.allclose(rays.viewdirs[k].double(), d, atol=1e-6), k
    assert torch.allclose(rays.origins, torch.tensor([[0.0, 1.0, 0.0]] * (h * w)))
    assert torch.equal(rays.near, torch.full((h * w,), 0.2))


# ----------------------------------------------------------------------------- NDC
def _ndc_reference(o: torch.Tensor, d: torch.Tensor, focal: float, width: int, height: int,
                   near: float):
    """NeRF Appendix C (Eq. 25-26) in float64, one ray at a time."""
    out_o, out_d = [], []
    for (ox, oy, oz), (dx, dy, dz) in zip(o.double().tolist(), d.double().tolist()):
        tn = -(near + oz) / dz  # shift the origin to the near plane z = -near
        ox, oy, oz = ox + tn * dx, oy + tn * dy, oz + tn * dz
        out_o.append([-focal / (width / 2) * ox / oz, -focal / (height / 2) * oy / oz,
                      1 + 2 * near / oz])
        out_d.append([-focal / (width / 2) * (dx / dz - ox / oz),
                      -focal / (height / 2) * (dy / dz - oy / oz), -2 * near / oz])
    return torch.tensor(out_o, dtype=torch.float64), torch.tensor(out_d, dtype=torch.float64)


def _project(p: torch.Tensor, focal: float, width: int, height: int, near: float) -> torch.Tensor:
    """Perspective projection of world points into NDC (Appendix C, Eq. 19-20)."""
    x, y, z = p.unbind(-1)
    return torch.stack([-focal / (width / 2) * x / z, -focal / (height / 2) * y / z,
                        1 + 2 * near / z], dim=-1)


def _random_forward_rays(n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    o = torch.randn(n, 3, generator=gen, dtype=torch.float64) * 0.3
    d = torch.randn(n, 3, generator=gen, dtype=torch.float64) * 0.3
    d[:, 2] = -1.0  # camera-space z = -1, forward facing
    return o, d


def test_ndc_rays_matches_float64_reference():
    params = NDCParams(focal=40.0, width=64, height=48, near_plane=1.0)
    o, d = _random_forward_rays(50, 1)
    o_ndc, d_ndc = ndc_rays(o.float(), d.float(), params)
    ref_o, ref_d = _ndc_reference(o, d, 40.0, 64, 48, 1.0)
    assert o_ndc.shape == (50, 3) and d_ndc.shape == (50, 3)
    assert torch.allclose(o_ndc.double(), ref_o, rtol=1e-5, atol=1e-5)
    assert torch.allclose(d_ndc.double(), ref_d, rtol=1e-5, atol=1e-5)


def test_ndc_rays_other_near_plane():
    params = NDCParams(focal=30.0, width=40, height=40, near_plane=0.5)
    o, d = _random_forward_rays(20, 2)
    o_ndc, d_ndc = ndc_rays(o.float(), d.float(), params)
    ref_o, ref_d = _ndc_reference(o, d, 30.0, 40, 40, 0.5)
    assert torch.allclose(o_ndc.double(), ref_o, rtol=1e-5, atol=1e-5)
    assert torch.allclose(d_ndc.double(), ref_d, rtol=1e-5, atol=1e-5)


def test_ndc_ray_is_the_projection_of_the_world_ray():
    # Independent of Eq. 25-26: world points o + t d (beyond the near plane) project to
    # o' + t' d' with t' = 1 - o_z / (o_z + t d_z), o taken on the near plane (Eq. 23-24).
    focal, w, h, near = 25.0, 32, 24, 1.0
    o, d = _random_forward_rays(10, 3)
    o_ndc, d_ndc = ndc_rays(o.float(), d.float(), NDCParams(focal, w, h, near))
    tn = -(near + o[:, 2]) / d[:, 2]
    o_near = o + tn[:, None] * d
    for t in (0.0, 0.5, 2.0, 10.0, 100.0):
        world = o_near + t * d
        t_prime = 1 - o_near[:, 2] / (o_near[:, 2] + t * d[:, 2])
        on_line = o_ndc.double() + t_prime[:, None] * d_ndc.double()
        assert torch.allclose(on_line, _project(world, focal, w, h, near), atol=1e-4)


def test_ndc_centre_ray_maps_to_origin_and_infinity_to_one():
    params = NDCParams(focal=2.0, width=3, height=3, near_plane=1.0)
    o_ndc, d_ndc = ndc_rays(torch.zeros(1, 3), torch.tensor([[0.0, 0.0, -1.0]]), params)
    assert torch.allclose(o_ndc, torch.tensor([[0.0, 0.0, -1.0]]))
    assert torch.allclose(d_ndc, torch.tensor([[0.0, 0.0, 2.0]]))
    # the same through generate_rays (centre pixel of a 3x3 identity camera)
    cams = _cameras(_c2w(EYE))
    rays = generate_rays(cams, torch.zeros(1, dtype=torch.long), torch.tensor([1]), torch.tensor([1]),
                         0.0, 1.0, ndc=params)
    assert torch.allclose(rays.origins, torch.tensor([[0.0, 0.0, -1.0]]))
    assert torch.allclose(rays.directions, torch.tensor([[0.0, 0.0, 2.0]]))
    assert torch.allclose(rays.viewdirs, torch.tensor([[0.0, 0.0, -1.0]]))  # world direction kept
    # any forward ray reaches z_ndc = 1 (world infinity) at t' = 1, and z = -1 (near plane) at 0
    o, d = _random_forward_rays(30, 4)
    o_ndc, d_ndc = ndc_rays(o.float(), d.float(), params)
    assert torch.allclose(o_ndc[:, 2], torch.full((30,), -1.0), atol=1e-5)
    assert torch.allclose(o_ndc[:, 2] + d_ndc[:, 2], torch.ones(30), atol=1e-5)
    # and world points far along the ray approach z_ndc -> 1
    far_point = _project(o + 1e6 * d, params.focal, 3, 3, 1.0)
    assert torch.allclose(far_point[:, 2], torch.ones(30, dtype=torch.float64), atol=1e-5)


def test_generate_rays_ndc_matches_reference():
    focal, w, h = 5.0, 6, 4
    rot = torch.tensor([[math.cos(0.1), 0.0, math.sin(0.1)], [0.0, 1.0, 0.0],
                        [-math.sin(0.1), 0.0, math.cos(0.1)]])
    cams = _cameras(_c2w(rot, (0.1, -0.2, 0.05)), f=focal, cx=w / 2, cy=h / 2, width=w, height=h)
    params = NDCParams(focal, w, h, 1.0)
    rays = image_rays(cams, 0, 0.0, 1.0, ndc=params)
    k = torch.arange(w * h)
    d_cam = torch.stack([(k % w + 0.5 - w / 2) / focal, -(k // w + 0.5 - h / 2) / focal,
                         -torch.ones(w * h)], dim=-1).double()
    d = d_cam @ rot.double().T
    o = torch.tensor([[0.1, -0.2, 0.05]], dtype=torch.float64).expand(w * h, 3)
    ref_o, ref_d = _ndc_reference(o, d, focal, w, h, 1.0)
    assert torch.allclose(rays.origins.double(), ref_o, atol=1e-5)
    assert torch.allclose(rays.directions.double(), ref_d, atol=1e-5)
    assert torch.allclose(rays.viewdirs.double(), d / d.norm(dim=-1, keepdim=True), atol=1e-6)


@pytest.mark.parametrize("scale", [0.5, 3.0])
def test_ndc_invariant_to_direction_scale(scale):
    # the warp depends on the ray, not on the length of its direction vector
    params = NDCParams(focal=20.0, width=30, height=20, near_plane=1.0)
    o, d = _random_forward_rays(8, 5)
    a_o, a_d = ndc_rays(o.float(), d.float(), params)
    b_o, b_d = ndc_rays(o.float(), (scale * d).float(), params)
    assert torch.allclose(a_o, b_o, atol=1e-5) and torch.allclose(a_d, b_d, atol=1e-5)


def test_pinhole_directions_equal_camera_directions_bit_for_bit():
    """The few-operator pinhole form used by generate_rays against the per-axis form, and one pixel by hand."""
    import torch

    from distnerf.data.rays import camera_directions, pinhole_directions

    g = torch.Generator().manual_seed(3)
    u, v = torch.randint(0, 400, (500,), generator=g), torch.randint(0, 300, (500,), generator=g)
    fx, fy = 300 + 50 * torch.rand(500, generator=g), 310 + 50 * torch.rand(500, generator=g)
    cx, cy = 200 + torch.rand(500, generator=g), 150 + torch.rand(500, generator=g)
    fast = pinhole_directions(u, v, torch.stack([cx, cy, fx, fy], dim=1))
    assert torch.equal(fast, camera_directions(u, v, fx, fy, cx, cy))
    one = pinhole_directions(torch.tensor([10]), torch.tensor([20]), torch.tensor([[4.5, 8.5, 2.0, 4.0]]))
    assert one.tolist() == [[(10 + 0.5 - 4.5) / 2.0, -(20 + 0.5 - 8.5) / 4.0, -1.0]]
