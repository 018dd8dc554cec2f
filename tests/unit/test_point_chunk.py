"""``eval.point_chunk``: no-grad NeRF evaluation calls its MLPs on at most that many points,
with the same result as one call (distnerf.model.nerf, distnerf.engine.evaluate)."""
from __future__ import annotations

import pytest
import torch

from distnerf.data.base import Cameras, SceneData
from distnerf.data.rays import RayBundle
from distnerf.engine.evaluate import point_chunk_set, render_image
from distnerf.model import NeRFModel

AABB = torch.tensor([[-1.0] * 3, [1.0] * 3])
WHITE = torch.ones(3)
TOL = {"rtol": 1e-5, "atol": 1e-6}


def small_nerf(seed: int = 0) -> NeRFModel:
    torch.manual_seed(seed)
    return NeRFModel(AABB, WHITE, num_coarse=8, num_fine=16, width=32, depth=8).eval()


def random_rays(n: int, seed: int = 1) -> RayBundle:
    g = torch.Generator().manual_seed(seed)
    origins = torch.randn(n, 3, generator=g) * 0.1 + torch.tensor([0.0, 0.0, 3.0])
    directions = torch.nn.functional.normalize(torch.tensor([0.0, 0.0, -1.0]) + 0.3 * torch.randn(n, 3, generator=g),
                                               dim=-1)
    return RayBundle(origins, directions, directions, torch.full((n,), 2.0), torch.full((n,), 4.0))


def call_sizes(model: NeRFModel) -> list[int]:
    """Records the number of points of every MLP call (coarse and fine)."""
    sizes: list[int] = []
    for mlp in (model.coarse, model.fine):
        mlp.register_forward_pre_hook(lambda _m, args: sizes.append(args[0].shape[0]))
    return sizes


@pytest.mark.parametrize("point_chunk", [1, 37, 160, 10_000])
def test_chunked_forward_equals_one_call(point_chunk):
    model, rays = small_nerf(), random_rays(20)  # 20 x 8 coarse, 20 x 24 fine points
    sizes = call_sizes(model)
    with torch.no_grad():
        whole = model(rays)
        assert sizes == [160, 480]
        sizes.clear()
        model.point_chunk = point_chunk
        parts = model(rays)
    assert max(sizes) == min(point_chunk, 480) and sum(sizes) == 640
    for key in ("rgb", "depth", "opacity", "rgb_coarse", "weights"):
        # each point is computed on its own, but a matrix product of a few rows may take another
        # kernel (other summation order): equal to float rounding (bitwise here from ~1000 rows on)
        torch.testing.assert_close(parts[key], whole[key], **TOL)
    assert parts["num_samples"] == whole["num_samples"]


def test_field_queries_are_chunked_too():
    model = small_nerf()
    points, dirs = torch.rand(100, 3) * 2 - 1, torch.nn.functional.normalize(torch.randn(100, 3), dim=-1)
    sizes = call_sizes(model)
    with torch.no_grad():
        sigma, rgb = model.field(points, dirs)
        model.point_chunk = 30
        sigma_c, rgb_c = model.field(points, dirs)
    assert sizes == [100, 30, 30, 30, 10]
    torch.testing.assert_close(sigma_c, sigma, **TOL)
    torch.testing.assert_close(rgb_c, rgb, **TOL)


def test_training_with_gradients_is_one_call():
    model = small_nerf().train()
    model.point_chunk = 16
    sizes = call_sizes(model)
    out = model(random_rays(10), torch.Generator().manual_seed(0))
    out["rgb"].sum().backward()
    assert sizes == [80, 240]  # gradients recorded: never chunked (the training batch is the memory bound)


def one_view_scene(height: int = 6, width: int = 7) -> SceneData:
    c2w = torch.tensor([[[1.0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 3]]])
    cams = Cameras(c2w, torch.tensor([8.0]), torch.tensor([8.0]), torch.tensor([width / 2]),
                   torch.tensor([height / 2]), width, height)
    return SceneData("test", torch.rand(1, height, width, 3), cams, 2.0, 4.0, AABB, WHITE, source="one view")


def test_render_image_sets_point_chunk_for_the_render_only():
    model, scene = small_nerf(), one_view_scene()
    sizes = call_sizes(model)
    whole = render_image(model, scene, 0, 16, "cpu")  # 42 rays in chunks of 16 rays
    assert sizes == [128, 384, 128, 384, 80, 240]
    sizes.clear()
    parts = render_image(model, scene, 0, 16, "cpu", point_chunk=100)
    assert max(sizes) == 100 and sum(sizes) == 42 * (8 + 24)
    assert model.point_chunk == 0  # restored afterwards
    for key in ("rgb", "depth", "opacity"):
        torch.testing.assert_close(parts[key], whole[key], **TOL)


def test_point_chunk_set_reaches_nested_models_and_restores():
    outer = torch.nn.ModuleDict({"a": small_nerf(), "b": small_nerf(1), "other": torch.nn.Linear(2, 2)})
    outer["b"].point_chunk = 5
    with point_chunk_set(outer, 1000):
        assert outer["a"].point_chunk == outer["b"].point_chunk == 1000
    assert (outer["a"].point_chunk, outer["b"].point_chunk) == (0, 5)
    with point_chunk_set(outer, None):  # None: leave as is
        assert outer["b"].point_chunk == 5


def test_eval_config_declares_point_chunk():
    from distnerf.schema import EvalConfig

    assert EvalConfig.point_chunk > 0
