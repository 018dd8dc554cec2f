"""The opaque floor under ``strategy=ss`` (``model.opaque_floor`` with ``model.min_altitude``),
against ONE model holding the whole scene.

The reference is :class:`~distnerf.model.grid.GridModel`'s own render with its opaque floor (its
``forward``: the light a floored ray has left takes its colour field's value at the floor point).
Each region's sub-model is a copy of that model whose tables are then scrambled at every vertex
outside the region (beyond the split planes, which lie on vertex planes): inside its region a
sub-model's field equals the single model's, outside it is garbage. So ``ss`` equals the single
model only if every segment is rendered by its own region and every floor colour comes from the
region holding the floor point; taking the floor's colour from another region, or compositing the
leftover light over the background, changes the image. Segment fusion (evaluation) and joint
training's exact compositing (loss and gradients: the regions' gradients sum to the single
model's) are both checked, on a bounded and a contracted (unbounded partition) scene; ``blend``
fusion on the bounded one (it shares samples inside the box only).
"""
from __future__ import annotations

import copy

import pytest
import torch

from distnerf.distributed import DistEnv
from distnerf.data.rays import RayBundle
from distnerf.model.grid import GridModel
from distnerf.strategy.partition import grid_partition
from distnerf.strategy.regions import JointRegionModels
from tests.sharded_case import aerial_rays
from tests.unit.test_fusion import fused_renderer

AABB = torch.tensor([[-4.0, 0.0, -4.0], [4.0, 2.0, 4.0]], dtype=torch.float64)  # y up; split on x = 0, z = 0
BG = torch.tensor([0.25, 0.5, 0.875], dtype=torch.float64)
FLOOR = 0.5  # inside the box: the floor ends rays in every region
N = 17  # vertices per axis: x = 0 and z = 0 (box centre) are vertex planes, bounded and contracted alike


def vertices(model: GridModel) -> torch.Tensor:
    """(N^3, 3) float64 the tables' vertex coordinates (contracted space for a contracted model)."""
    box = model.grid_aabb.double()
    axes = [torch.linspace(float(box[0, a]), float(box[1, a]), N, dtype=torch.float64) for a in range(3)]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3)  # row (x N + y) N + z


def near_split(model: GridModel) -> torch.Tensor:
    """(N^3,) bool the vertices of the cells along the split planes x = 0 and z = 0."""
    v, centre = vertices(model), AABB.mean(0)  # contraction keeps each coordinate's side of the box centre
    cell = (model.grid_aabb[1] - model.grid_aabb[0]).double() / (N - 1)
    return ((v[:, 0] - centre[0]).abs() <= cell[0] * 1.001) | ((v[:, 2] - centre[2]).abs() <= cell[2] * 1.001)


def single_model(contraction: str) -> GridModel:
    """A random field, uniform in the cells along the split planes: a sample the regions split
    there composites as the whole sample does (the segments' samples are the single model's
    split at the region boundaries), so the two renders agree to rounding."""
    torch.manual_seed(0)
    m = GridModel(AABB.float(), BG.float(), resolutions=[N], upsample_steps=[], color="sh", contraction=contraction,
                  min_altitude=FLOOR, opaque_floor=True, tv_weight=0.0).double()
    split = near_split(m)
    with torch.no_grad():
        m.density.copy_(torch.randn_like(m.density) * 2.0 - 1.5)  # enough light reaches the floor
        m.features.copy_(torch.randn_like(m.features))
        m.density[split] = -1.0
        m.features[split] = torch.randn(m.features.shape[1], dtype=torch.float64)
        m.occupancy.binary.fill_(True)
    m.termination, m.color_threshold = 0.0, 0.0
    assert m.opaque_floor
    return m


def scrambled_copies(model: GridModel, part) -> dict:
    """Region k -> a copy of ``model`` with its tables scrambled at the vertices outside region k."""
    vertices_ = vertices(model)
    centre = AABB.mean(0)  # contraction keeps each coordinate's side of the box centre
    g = torch.Generator().manual_seed(7)
    models = {}
    for k, region in enumerate(part.boxes):
        outside = torch.zeros(len(vertices_), dtype=torch.bool)
        for a in (0, 2):
            if region[0, a] >= centre[a]:  # the region lies on the high side of the split plane
                outside |= vertices_[:, a] < centre[a]
            else:
                outside |= vertices_[:, a] > centre[a]
        sub = copy.deepcopy(model)
        with torch.no_grad():
            sub.density[outside] = torch.randn(int(outside.sum()), 1, generator=g, dtype=torch.float64) * 3
            sub.features[outside] = torch.randn(int(outside.sum()), sub.features.shape[1], generator=g,
                                                dtype=torch.float64) * 3
        models[k] = sub
    return models


def problem(contraction: str):
    part = grid_partition(AABB, 4, [2, 1, 2], overlap=0.0)
    part.unbounded = contraction == "mipnerf360"
    single = single_model(contraction)
    return part, single, scrambled_copies(single, part), aerial_rays(192, 1)


def check_floor_in_view(single: GridModel, rays: RayBundle, rgb: torch.Tensor, seed: int | None = None) -> None:
    """The floor decides the image: rays reach it with light left, and compositing that light over
    the background instead would be far off. ``rgb``: (R, 3) float64 ``single``'s render in its
    current mode (in training, with a generator seeded ``seed``: the same jitter)."""
    far = single.ray_far(rays)
    floored = far < single.ray_far_without_floor(rays)
    assert 0.6 < float(floored.double().mean()) < 0.95
    single.opaque_floor = False
    with torch.no_grad():
        over_background = single(rays, None if seed is None else torch.Generator().manual_seed(seed)).rgb
    single.opaque_floor = True
    assert float((rgb - over_background)[floored].abs().max()) > 0.1
    assert float((rgb - over_background)[~floored].abs().max()) < 1e-12


@pytest.mark.parametrize("contraction,fusion", [("none", "segment"), ("mipnerf360", "segment"), ("none", "blend")])
def test_fusion_composites_the_floor_of_the_region_holding_it(contraction, fusion):
    """(``blend`` with no overlap: each shared sample is rendered by the region holding it; bounded only.)"""
    part, single, models, rays = problem(contraction)
    single.eval()
    with torch.no_grad():
        ref = single(rays)
        fused = fused_renderer(part, {k: m.eval() for k, m in models.items()}, fusion, background=BG,
                               color_threshold=0.0)
        out = fused(rays)
    check_floor_in_view(single, rays, ref.rgb)
    assert torch.allclose(out.rgb, ref.rgb, atol=1e-9, rtol=0)
    assert torch.allclose(out.opacity, ref.opacity, atol=1e-9, rtol=0)
    models[0].opaque_floor = False  # (the sub-models decide: fusion reads the first one's setting)
    with torch.no_grad():
        plain = fused_renderer(part, models, fusion, background=BG, color_threshold=0.0)(rays)
    assert (plain.rgb - ref.rgb).abs().max() > 0.1


@pytest.mark.parametrize("contraction", ["none", "mipnerf360"])
def test_joint_training_has_the_single_models_loss_and_gradients_with_an_opaque_floor(contraction):
    part, single, models, rays = problem(contraction)
    target = torch.rand(len(rays), 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    single.train()
    ref = single(rays, torch.Generator().manual_seed(11))
    ref_loss = ((ref.rgb - target) ** 2).mean()
    ref_loss.backward()
    joint = JointRegionModels(models, part, BG, DistEnv()).train()
    out = joint(rays, torch.Generator().manual_seed(11))
    loss = ((out.rgb - target) ** 2).mean()
    loss.backward()
    check_floor_in_view(single, rays, ref.rgb.detach(), seed=11)
    assert torch.allclose(out.rgb, ref.rgb, atol=1e-9, rtol=0)
    assert abs(loss.item() - ref_loss.item()) < 1e-12
    # a sample the regions split at a boundary is two half samples at other points of the uniform
    # cells there: the same values, but its gradient is spread over those cells' vertices otherwise
    # (their sum is the same); everywhere else each vertex's gradient is the single model's
    split = near_split(single)
    for name in ("density", "features"):
        summed = sum(getattr(m, name).grad for m in models.values())
        want = getattr(single, name).grad
        assert float(want.abs().max()) > 1e-6 and int((want != 0).sum()) > 100  # the step trains the field
        assert torch.allclose(summed[~split], want[~split], atol=1e-12, rtol=1e-9), name
        assert torch.allclose(summed[split].sum(0), want[split].sum(0), atol=1e-12, rtol=1e-9), name
