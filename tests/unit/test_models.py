"""Encodings, the voxel-grid field and the three radiance models (distnerf.model.*).

References: autograd gradcheck in float64, hand-computed table indices (tcnn's
uint32 spatial hash, x-fastest dense layout), torch.nn.functional.grid_sample, a
spherical 5-design (the icosahedron) for exact sphere integrals.
"""
from __future__ import annotations

import math
from decimal import Decimal, getcontext

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from distnerf.components.regularizer import add_regularizer_grads_
from distnerf.data.rays import RayBundle
from distnerf.model import NeRFModel, NGPModel, build_model
from distnerf.model.encoding import HashEncoding, PositionalEncoding
from distnerf.model.grid import GridModel, interpolate, spherical_harmonics, trilinear_corners

AABB = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])
WHITE = torch.ones(3)


def _rays(num: int = 16, seed: int = 1) -> RayBundle:
    """Rays from (0, 0, 3) towards random points of the z = 0 plane inside the box."""
    gen = torch.Generator().manual_seed(seed)
    origins = torch.tensor([0.0, 0.0, 3.0]).expand(num, 3).clone()
    target = torch.rand(num, 3, generator=gen) * 1.2 - 0.6
    target[:, 2] = 0.0
    dirs = target - origins
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)
    return RayBundle(origins, dirs, dirs, torch.zeros(num), torch.full((num,), 10.0))


# ----------------------------------------------------------------------------- positional
def test_positional_encoding_formula():
    enc = PositionalEncoding(3, include_input=True)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(7, 3, generator=gen, dtype=torch.float64)
    out = enc(x.float()).double()
    assert out.shape == (7, 3 * 7) and enc.output_dim(3) == 21
    assert torch.allclose(out[:, :3], x, atol=1e-6)  # p itself first
    # gamma(p) = (p, sin(2^l p), cos(2^l p)) for l < L (no pi, like the reference code);
    # every expected column must appear exactly once among the remaining columns
    expected = [fn(2.0 ** l * x[:, d]) for l in range(3) for fn in (torch.sin, torch.cos) for d in range(3)]
    rest = out[:, 3:]
    used = set()
    for col in expected:
        match = [c for c in range(rest.shape[1]) if torch.allclose(rest[:, c], col, atol=1e-5)]
        assert len(match) == 1, "expected column not found exactly once"
        used.add(match[0])
    assert len(used) == rest.shape[1]


def test_positional_encoding_without_input():
    enc = PositionalEncoding(2, include_input=False)
    x = torch.tensor([[0.0, math.pi / 2, 1.0]])
    out = enc(x)
    assert out.shape == (1, 12) and enc.output_dim(3) == 12
    # (the values of sin / cos at 2^l p for p in {0, pi/2, 1}, as a multiset)
    vals = sorted(round(v, 5) for v in out[0].tolist())
    ref = sorted(round(f(2.0 ** l * p), 5) for p in (0.0, math.pi / 2, 1.0) for l in range(2)
                 for f in (math.sin, math.cos))
    assert vals == ref


def test_grid_sh_viewdir_encoding_colour_by_hand():
    """model.viewdir_encoding=sh: the mlp head reads the direction's degree-1 SH basis (c0, -c1 y, c1 z, -c1 x).
    A colour network wired by hand to pass the c1 z column to red gives red = sigmoid(c1 d_z), green and blue
    sigmoid(0) = 0.5."""
    from distnerf.model.grid_color import shade
    model = GridModel(AABB, WHITE, resolutions=[8], upsample_steps=[], color="mlp", num_features=1,
                      hidden_width=2, viewdir_encoding="sh", sh_degree=1)
    first, second, last = (m for m in model.color_net if isinstance(m, torch.nn.Linear))
    assert first.in_features == 1 + 4  # the feature, then 4 basis values (the frequency encoding: 3 x 9)
    with torch.no_grad():
        for layer in (first, second, last):
            layer.weight.zero_(), layer.bias.zero_()
        first.weight[0, 1 + 2] = 1.0  # input column: the feature, then c0, -c1 y, c1 z: c1 z
        second.weight[0, 0] = 1.0
        last.weight[0, 0] = 1.0
    c1 = math.sqrt(3 / (4 * math.pi))
    dirs = torch.tensor([[0.0, 0.0, 1.0], [0.6, 0.0, 0.8], [0.0, 0.0, -1.0]])
    rgb = shade(torch.zeros(3, 1), dirs, None, None, sh_degree=None, color_net=model.color_net,
                dir_encoding=model.dir_encoding, appearance=None)
    sigmoid = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    expected = torch.tensor([[sigmoid(c1 * 1.0), 0.5, 0.5], [sigmoid(c1 * 0.8), 0.5, 0.5],
                             [sigmoid(0.0), 0.5, 0.5]])  # d_z < 0: the ReLU passes nothing
    assert torch.allclose(rgb, expected, atol=1e-6)
    default = GridModel(AABB, WHITE, resolutions=[8], upsample_steps=[], color="mlp", num_features=1)
    assert default.color_net[0].in_features == 1 + 3 * (2 * 4 + 1)  # frequency, viewdir_frequencies=4
    # the SH basis stops at degree 2: the schema refuses 3 at start, for either use of the key
    with pytest.raises(ValueError, match=r"model.sh_degree=3 must be <= 2"):
        GridModel(AABB, WHITE, resolutions=[8], upsample_steps=[], color="mlp", viewdir_encoding="sh", sh_degree=3)
    with pytest.raises(ValueError, match=r"model.viewdir_encoding='?cosine'? "):
        GridModel(AABB, WHITE, resolutions=[8], upsample_steps=[], color="mlp", viewdir_encoding="cosine")


def test_grid_density_activation_trunc_exp_by_hand():
    """model.density_activation=trunc_exp: sigma = exp(raw + shift) / base_voxel with shift = log(-log(1 - alpha_init)
    / step_ratio) (one step of step_ratio voxels starts at opacity alpha_init), the gradient's exponent clamped to
    [-15, 15]; the occupancy's raw threshold and the shell's initial values invert exp, not softplus. The default
    (softplus) keeps DVGO's shift and formula bit for bit."""
    base_voxel = 2.0 / 7  # AABB's edge over 8 - 1 voxels
    default = GridModel(AABB, WHITE, resolutions=[8], upsample_steps=[], color="sh")
    assert default.density_shift == math.log(math.expm1(-math.log(1.0 - 1e-3) / 0.5))
    raw = torch.tensor([-3.0, 0.0, 2.5])
    assert torch.equal(default.densities(raw), F.softplus(raw + default.density_shift) / default.base_voxel)
    model = GridModel(AABB, WHITE, resolutions=[8], upsample_steps=[], color="sh", density_activation="trunc_exp")
    target = 0.0020010006671670670  # -ln(0.999) / 0.5 to 20 digits (decimal.Decimal), exp(shift)
    shift = math.log(target)
    assert model.base_voxel == pytest.approx(base_voxel, rel=1e-12)
    assert model.density_shift == pytest.approx(shift, rel=1e-12)
    sigma = model.densities(torch.tensor([0.0, 1.0, -2.0], dtype=torch.float64))
    expected = torch.tensor([target * math.exp(r) / base_voxel for r in (0.0, 1.0, -2.0)],
                            dtype=torch.float64)
    assert torch.allclose(sigma, expected, rtol=1e-12, atol=0)
    assert 1 - math.exp(-float(sigma[0]) * model.step_size()) == pytest.approx(1e-3, rel=1e-9)  # raw 0: alpha_init
    x = torch.tensor([1.0, 20.0, -20.0], dtype=torch.float64, requires_grad=True)
    model.densities(x - model.density_shift).sum().backward()  # raw + shift = x
    assert torch.allclose(x.grad, torch.tensor([math.e, math.exp(15.0), math.exp(-15.0)], dtype=torch.float64)
                          / model.base_voxel, rtol=1e-12, atol=0)
    threshold = model.raw_threshold(0.01, model.step_size())
    assert threshold == pytest.approx(math.log(-math.log(0.99) * base_voxel / model.step_size()) - shift, rel=1e-12)
    shell = GridModel(AABB, WHITE, resolutions=[8], upsample_steps=[], color="sh", contraction="mipnerf360",
                      shell_alpha_init=True, density_activation="trunc_exp")
    raw = shell.density.detach().view(-1).double()
    assert raw.min() < -1.0  # the shell's vertices start lower: exp(raw) = 1 / scale there, down to 1 / 64
    assert torch.allclose(torch.exp(raw).max(), torch.tensor(1.0, dtype=torch.float64), rtol=1e-6)
    assert torch.exp(raw).min() == pytest.approx(1 / 64, rel=1e-5)  # SHELL_SCALE_CAP
    with pytest.raises(ValueError, match=r"model.density_activation='?relu'? "):
        GridModel(AABB, WHITE, resolutions=[8], upsample_steps=[], density_activation="relu")


# ----------------------------------------------------------------------------- hash grid
def _small_hash(dtype=torch.float64) -> HashEncoding:
    # T = 64 rows per level: level 0 (N = 2, 27 vertices) dense, level 1 (N = 8) hashed
    enc = HashEncoding(num_levels=2, features_per_level=2, log2_table_size=6, base_resolution=2,
                       max_resolution=8, dtype=dtype)
    with torch.no_grad():
        enc.table.copy_(torch.randn(enc.table.shape, generator=torch.Generator().manual_seed(0),
                                    dtype=dtype))
    return enc


def _tcnn_hash(i: int, j: int, k: int, size: int) -> int:
    """Instant-NGP spatial hash (Eq. 4) with uint32 arithmetic, as in tiny-cuda-nn."""
    return ((i * 1) ^ (j * 2654435761) ^ (k * 805459861)) % 2 ** 32 % size


@pytest.mark.parametrize("levels,n_min,n_max", [(16, 16, 1024), (16, 16, 2048), (2, 2, 8), (8, 4, 300)])
def test_hash_resolutions_follow_the_paper(levels, n_min, n_max):
    # N_l = floor(N_min * b^l), b = (N_max / N_min)^(1 / (L - 1)), evaluated in 50-digit decimals
    getcontext().prec = 50
    ratio = Decimal(n_max) / Decimal(n_min)
    expected = [int((Decimal(n_min) * (ratio.ln() * l / (levels - 1)).exp()).to_integral_value(
        rounding="ROUND_FLOOR")) for l in range(levels)]
    if n_max in (1024, 2048, 8):
        assert expected[-1] == n_max
    enc = HashEncoding(levels, 2, 12, n_min, n_max)
    assert enc.resolutions.tolist() == expected
    assert enc.output_dim == 2 * levels


def test_hash_layout_of_small_table():
    enc = _small_hash()
    assert enc.resolutions.tolist() == [2, 8]
    assert enc.hashed == [False, True]
    assert enc.sizes.tolist() == [27, 64] and enc.offsets.tolist() == [0, 27]
    assert enc.table.shape == (27 + 64, 2)


def test_hash_encoding_gradcheck_wrt_table():
    enc = _small_hash()
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(12, 3, generator=gen, dtype=torch.float64)
    table = enc.table.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: functional_call(enc, {"table": t}, (x,)), (table,))


def test_hash_encoding_gradcheck_wrt_points():
    enc = _small_hash()
    gen = torch.Generator().manual_seed(2)
    # keep away from cell boundaries (kinks of trilinear interpolation) of both levels
    cells = torch.randint(0, 8, (6, 3), generator=gen, dtype=torch.float64)
    x = ((cells + 0.2 + 0.6 * torch.rand(6, 3, generator=gen, dtype=torch.float64)) / 8).requires_grad_()
    assert torch.autograd.gradcheck(enc, (x,))


def test_hash_encoding_at_vertices_equals_table_rows():
    enc = _small_hash()
    table = enc.table.detach()
    # dense level 0 (N = 2): vertex (i, j, k) is row i + 3 (j + 3 k)  (x fastest)
    for i, j, k in [(0, 0, 0), (2, 0, 0), (0, 2, 0), (0, 0, 2), (1, 2, 0), (2, 1, 2), (2, 2, 2)]:
        x = torch.tensor([[i, j, k]], dtype=torch.float64) / 2
        out = enc(x)
        assert torch.allclose(out[0, :2], table[i + 3 * (j + 3 * k)], atol=1e-12), (i, j, k)
    # hashed level 1 (N = 8): row offset 27 + hash(i, j, k) mod 64
    for i, j, k in [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (3, 5, 7), (8, 8, 8), (6, 2, 4)]:
        x = torch.tensor([[i, j, k]], dtype=torch.float64) / 8
        out = enc(x)
        assert torch.allclose(out[0, 2:], table[27 + _tcnn_hash(i, j, k, 64)], atol=1e-12), (i, j, k)


def test_hash_encoding_dense_level_reproduces_linear_fields():
    # trilinear interpolation reproduces a linear function of position exactly; fill the
    # dense level from (x, y, z) of each vertex and query arbitrary points
    enc = _small_hash()
    ax = torch.arange(3, dtype=torch.float64) / 2
    z, y, x = torch.meshgrid(ax, ax, ax, indexing="ij")  # row = i + 3 (j + 3 k): x fastest
    verts = torch.stack([x, y, z], dim=-1).reshape(-1, 3)
    with torch.no_grad():
        enc.table[:27, 0] = 1.0 + 2.0 * verts[:, 0] - 3.0 * verts[:, 1] + 0.5 * verts[:, 2]
        enc.table[:27, 1] = verts[:, 2]
    pts = torch.rand(50, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    out = enc(pts)
    assert torch.allclose(out[:, 0], 1.0 + 2.0 * pts[:, 0] - 3.0 * pts[:, 1] + 0.5 * pts[:, 2], atol=1e-12)
    assert torch.allclose(out[:, 1], pts[:, 2], atol=1e-12)


# ----------------------------------------------------------------------------- voxel grid
def _vertex_positions(n: int, dtype=torch.float64) -> torch.Tensor:
    ax = torch.linspace(0, 1, n, dtype=dtype)
    return torch.stack(torch.meshgrid(ax, ax, ax, indexing="ij"), dim=-1).reshape(-1, 3)  # x-major


def test_trilinear_corners_weights_and_exact_vertices():
    n = 5
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(n ** 3, 3, generator=gen, dtype=torch.float64)
    # at vertex (i, j, k), i.e. x = (i, j, k) / (n - 1), the value is row (i n + j) n + k
    for i, j, k in [(0, 0, 0), (4, 0, 0), (0, 4, 0), (0, 0, 4), (1, 2, 3), (4, 4, 4), (3, 0, 4)]:
        x = torch.tensor([[i, j, k]], dtype=torch.float64) / (n - 1)
        index, weights = trilinear_corners(x, n)
        assert torch.allclose(interpolate(table, index, weights)[0], table[(i * n + j) * n + k])
    x = torch.rand(40, 3, generator=gen, dtype=torch.float64)
    index, weights = trilinear_corners(x, n)
    assert index.shape == (40, 8) and weights.shape == (40, 8)
    assert torch.allclose(weights.sum(-1), torch.ones(40, dtype=torch.float64))
    assert (weights >= 0).all() and (index >= 0).all() and (index < n ** 3).all()
    # linear fields are reproduced exactly
    verts = _vertex_positions(n)
    lin = verts @ torch.tensor([[1.0], [-2.0], [0.5]], dtype=torch.float64) + 0.3
    assert torch.allclose(interpolate(lin, index, weights), x @ torch.tensor([[1.0], [-2.0], [0.5]],
                                                                             dtype=torch.float64) + 0.3)


def test_interpolate_equals_grid_sample():
    n, c = 6, 4
    gen = torch.Generator().manual_seed(1)
    table = torch.randn(n ** 3, c, generator=gen, dtype=torch.float64)
    x = torch.rand(100, 3, generator=gen, dtype=torch.float64)
    x[:4] = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.5], [0.2, 1.0, 0.0]],
                         dtype=torch.float64)
    index, weights = trilinear_corners(x, n)
    ours = interpolate(table, index, weights)
    # table row (i N + j) N + k holds vertex (i, j, k) = (x, y, z); grid_sample wants
    # (1, C, D, H, W) indexed [z, y, x] and sample coordinates ordered (x, y, z) in [-1, 1]
    volume = table.view(n, n, n, c).permute(3, 2, 1, 0)[None]
    coords = (2 * x - 1).view(1, 1, 1, -1, 3)
    ref = F.grid_sample(volume, coords, mode="bilinear", align_corners=True)[0, :, 0, 0].T
    assert torch.allclose(ours, ref, atol=1e-12)


def test_interpolate_gradcheck():
    n = 4
    gen = torch.Generator().manual_seed(2)
    table = torch.randn(n ** 3, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    x = torch.rand(9, 3, generator=gen, dtype=torch.float64)
    index, weights = trilinear_corners(x, n)
    assert torch.autograd.gradcheck(lambda t: interpolate(t, index, weights), (table,))
    # the weights are differentiable w.r.t. the positions (away from cell boundaries)
    xg = ((torch.randint(0, 3, (5, 3), generator=gen) + 0.2
           + 0.6 * torch.rand(5, 3, generator=gen, dtype=torch.float64)) / 3).requires_grad_()
    assert torch.autograd.gradcheck(lambda p: trilinear_corners(p, n)[1], (xg,))


def _icosahedron() -> torch.Tensor:
    phi = (1 + math.sqrt(5)) / 2
    pts = []
    for a in (-1.0, 1.0):
        for b in (-phi, phi):
            pts += [(0.0, a, b), (a, b, 0.0), (b, 0.0, a)]
    pts = torch.tensor(pts, dtype=torch.float64)
    return pts / pts.norm(dim=-1, keepdim=True)


def test_spherical_harmonics_orthonormal():
    # the 12 icosahedron vertices form a spherical 5-design: their mean equals the sphere
    # average for polynomials up to degree 5, so products of degree <= 2 SH are exact
    dirs = _icosahedron()
    for degree in (1, 2):
        basis = spherical_harmonics(dirs, degree)
        assert basis.shape == (12, (degree + 1) ** 2)
        gram = 4 * math.pi * basis.T @ basis / len(dirs)
        assert torch.allclose(gram, torch.eye(basis.shape[1], dtype=torch.float64), atol=1e-12)


def test_spherical_harmonics_degree1_at_axes():
    c0, c1 = 0.5 / math.sqrt(math.pi), math.sqrt(3 / (4 * math.pi))
    axes = torch.eye(3, dtype=torch.float64)
    basis = spherical_harmonics(axes, 1)
    # Plenoxels / PlenOctrees ordering and signs: (c0, -c1 y, c1 z, -c1 x)
    expected = torch.tensor([[c0, 0.0, 0.0, -c1], [c0, -c1, 0.0, 0.0], [c0, 0.0, c1, 0.0]],
                            dtype=torch.float64)
    assert torch.allclose(basis, expected, atol=1e-12)
    with pytest.raises(ValueError):
        spherical_harmonics(axes, 3)


def _blob_grid(resolutions=(16, 24), tighten=False, **kw) -> GridModel:
    """Grid model holding an off-centre anisotropic density blob and position-dependent
    features (so a wrong axis order or a shifted resample changes the image)."""
    torch.manual_seed(0)
    model = GridModel(AABB, WHITE, resolutions=resolutions, upsample_steps=list(range(5, 5 + len(resolutions) - 1)),
                      num_features=4, hidden_width=16, tighten_aabb=tighten, color="mlp", **kw)
    n = model.resolution
    p = _vertex_positions(n, torch.float32) * 2 - 1
    centre = torch.tensor([0.3, -0.2, 0.1])
    sigma = 6 * torch.exp(-((p - centre) ** 2 / torch.tensor([0.15, 0.08, 0.1])).sum(-1)) + 1e-6
    raw = torch.log(torch.expm1(sigma * model.base_voxel)) - model.density_shift
    with torch.no_grad():
        model.density.copy_(raw[:, None])
        model.features.copy_(2 * torch.cat([p, p[:, :1] * p[:, 1:2]], dim=-1))
    assert torch.allclose(model.densities(model.density[:, 0]), sigma, rtol=1e-3, atol=1e-4)
    model.update_occupancy()
    return model.eval()


@pytest.mark.parametrize("tighten", [False, True])
def test_grid_upsample_preserves_the_field(tighten):
    model = _blob_grid(tighten=tighten)
    rays = _rays(64)
    with torch.no_grad():
        before = model(rays)
    model.upsample(24)
    assert model.resolution == 24 and model.density.shape == (24 ** 3, 1)
    with torch.no_grad():
        after = model(rays)
    assert before["opacity"].max() > 0.5  # the image is not trivially the background
    assert before["rgb"].std(dim=0).min() > 0.05
    assert (after["rgb"] - before["rgb"]).abs().max() < 0.03
    assert (after["opacity"] - before["opacity"]).abs().max() < 0.05
    if tighten:
        box = model.grid_aabb
        assert ((box[1] - box[0]) < 2.0).any()  # the box shrank around the blob
        assert (box[0] >= -1).all() and (box[1] <= 1).all()


def test_grid_state_dict_round_trip_across_resolutions():
    model = _blob_grid(resolutions=(32, 48), tighten=True)
    assert model.update_state(5) is True
    assert model.resolution == 48
    state = model.state_dict()
    fresh = GridModel(AABB, WHITE, resolutions=(32, 48), upsample_steps=[5], num_features=4,
                      hidden_width=16, tighten_aabb=True, color="mlp").eval()
    rays = _rays(32)
    with torch.no_grad():
        untrained = fresh(rays)
    fresh.load_state_dict(state)
    assert fresh.resolution == 48 and fresh.density.shape == (48 ** 3, 1)
    assert torch.equal(fresh.grid_aabb, model.grid_aabb)
    assert torch.equal(fresh.occupancy.binary, model.occupancy.binary)
    with torch.no_grad():
        a, b = model(rays), fresh(rays)
    for key in ("rgb", "depth", "opacity"):
        assert torch.equal(a[key], b[key]), key
    assert not torch.allclose(untrained["rgb"], a["rgb"])  # loading made the difference


def test_grid_update_state_returns_true_exactly_at_upsample_steps():
    model = GridModel(AABB, WHITE, resolutions=(8, 10, 12), upsample_steps=(2, 4), num_features=2,
                      hidden_width=8, occupancy_every=3)
    replaced, resolutions = [], []
    for step in range(7):
        before = model.density
        r = model.update_state(step)
        replaced.append(r)
        resolutions.append(model.resolution)
        assert r == (model.density is not before)
    assert replaced == [False, False, True, False, True, False, False]
    assert resolutions == [8, 8, 10, 10, 12, 12, 12]
    assert model.features.shape[0] == 12 ** 3
    assert model.update_state(4) is False  # already at that resolution


def test_grid_bad_config_raises():
    with pytest.raises(ValueError):
        GridModel(AABB, WHITE, resolutions=(8, 10), upsample_steps=())
    with pytest.raises(ValueError):
        GridModel(AABB, WHITE, resolutions=(8,), upsample_steps=(), color="rgb")
    with pytest.raises(ValueError):
        build_model({"name": "nope"}, AABB, WHITE)
    with pytest.raises(ValueError):
        build_model({"name": "grid", "no_such_option": 1}, AABB, WHITE)


# ----------------------------------------------------------------------------- models
MODEL_CONFIGS = {
    "grid_mlp": {"name": "grid", "resolutions": [12, 16], "upsample_steps": [3], "num_features": 4,
                 "hidden_width": 16},
    "grid_sh": {"name": "grid", "resolutions": [12], "upsample_steps": [], "color": "sh", "sh_degree": 2},
    "nerf": {"name": "nerf", "num_coarse": 8, "num_fine": 8, "width": 32, "depth": 8},
    "nerf_coarse_only": {"name": "nerf", "num_coarse": 8, "num_fine": 0, "width": 16, "depth": 2},
    "ngp": {"name": "ngp", "num_levels": 4, "log2_table_size": 10, "base_resolution": 4,
            "max_resolution": 32, "hidden_width": 16, "num_steps": 64, "occupancy_resolution": 8},
}


def _perturb_params(model: torch.nn.Module) -> None:
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))


@pytest.mark.parametrize("name", sorted(MODEL_CONFIGS))
def test_model_forward_backward(name):
    torch.manual_seed(0)
    model = build_model(MODEL_CONFIGS[name], AABB, WHITE)
    _perturb_params(model)  # away from all-zero tables
    model.train()
    rays = _rays(6)
    out = model(rays, generator=torch.Generator().manual_seed(0))
    assert out["rgb"].shape == (6, 3) and out["depth"].shape == (6,) and out["opacity"].shape == (6,)
    assert isinstance(out["num_samples"], int) and out["num_samples"] > 0
    for key in ("rgb", "depth", "opacity"):
        assert torch.isfinite(out[key]).all(), key
    assert (out["rgb"] >= 0).all() and (out["rgb"] <= 1 + 1e-6).all()
    assert (out["opacity"] >= 0).all() and (out["opacity"] <= 1 + 1e-6).all()
    loss = ((out["rgb"] - 0.5) ** 2).mean()
    if name == "nerf":
        assert out["rgb_coarse"].shape == (6, 3) and torch.isfinite(out["rgb_coarse"]).all()
        loss = loss + ((out["rgb_coarse"] - 0.5) ** 2).mean()
    loss.backward()
    add_regularizer_grads_(model)
    grads = [p.grad.to_dense() if p.grad.is_sparse else p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    if isinstance(model, NeRFModel) and model.fine is not None:
        assert model.coarse.sigma_head.weight.grad is not None  # both passes in the loss
        assert model.fine.sigma_head.weight.grad is not None
    if isinstance(model, NGPModel):
        assert model.encoding.table.grad.abs().sum() > 0


@pytest.mark.parametrize("name", sorted(MODEL_CONFIGS))
def test_model_eval_is_deterministic(name):
    torch.manual_seed(0)
    model = build_model(MODEL_CONFIGS[name], AABB, WHITE)
    _perturb_params(model)
    model.eval()
    rays = _rays(8, seed=3)
    with torch.no_grad():
        torch.manual_seed(1)
        a = model(rays)
        torch.manual_seed(2)
        b = model(rays)
    for key in ("rgb", "depth", "opacity"):
        assert torch.equal(a[key], b[key]), key
    assert a["num_samples"] == b["num_samples"]


def test_training_mode_jitters_samples():
    # the counterpart of the determinism test: training renders depend on the generator
    torch.manual_seed(0)
    model = build_model(MODEL_CONFIGS["nerf"], AABB, WHITE)
    with torch.no_grad():
        for mlp in (model.coarse, model.fine):
            mlp.sigma_head.bias.fill_(1.0)  # positive density everywhere
    model.train()
    rays = _rays(4)
    with torch.no_grad():
        a = model(rays, generator=torch.Generator().manual_seed(0))
        b = model(rays, generator=torch.Generator().manual_seed(1))
        c = model(rays, generator=torch.Generator().manual_seed(0))
    assert (a["opacity"] > 0.5).all()
    assert not torch.equal(a["depth"], b["depth"])
    assert torch.equal(a["depth"], c["depth"])


def test_nerf_empty_rays_render_background():
    # a NeRF whose density head outputs ReLU(-big) = 0 renders the background exactly
    model = NeRFModel(AABB, torch.tensor([0.2, 0.4, 0.6]), num_coarse=4, num_fine=4, width=16, depth=2)
    with torch.no_grad():
        for mlp in (model.coarse, model.fine):
            mlp.sigma_head.weight.zero_()
            mlp.sigma_head.bias.fill_(-1.0)
    out = model.eval()(_rays(3))
    assert torch.allclose(out["rgb"], torch.tensor([[0.2, 0.4, 0.6]] * 3))
    assert torch.equal(out["opacity"], torch.zeros(3))


def test_grid_tv_regularizer_grads_added_locally_match_reference():
    torch.manual_seed(0)
    n, weight = 6, 0.1
    model = GridModel(AABB, WHITE, resolutions=[n], upsample_steps=[], tv_weight=weight)
    with torch.no_grad():
        model.density.normal_()
    assert add_regularizer_grads_(model) is None  # training asks for no value
    model.density.grad = None
    value = add_regularizer_grads_(model, value=True)
    d = model.density.detach().double().view(n, n, n).requires_grad_()
    ref = weight * sum(torch.diff(d, dim=k).pow(2).mean() for k in range(3))  # independent formula
    ref.backward()
    assert value == pytest.approx(float(ref.detach()), rel=1e-5)
    torch.testing.assert_close(model.density.grad.view(n, n, n).double(), d.grad, rtol=1e-4, atol=1e-8)
    before = model.density.grad.clone()
    add_regularizer_grads_(model)  # accumulates like .backward()
    torch.testing.assert_close(model.density.grad, 2 * before)
