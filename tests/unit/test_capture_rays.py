"""The city's COLMAP and nerfstudio copies give the same rays as its Blender copy (issue 15's
round trip): for every pixel of every test frame, the importers' rays taken back to the
generator's frame through ``SceneData.transform`` and the known COLMAP similarity equal the
Blender loader's rays, and the pixels are the same."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from distnerf.data import load_scene
from distnerf.data.rays import image_rays
from tests.fixtures.captures import tiny_city

pytest.importorskip("pycolmap")


@pytest.fixture(scope="module")
def city(tmp_path_factory):
    return tiny_city(tmp_path_factory.mktemp("city"))


def _to_generator(matrix: np.ndarray, origins: torch.Tensor, directions: torch.Tensor):
    """Points and unit directions of a similarity's target frame taken back to its source frame."""
    inverse = np.linalg.inv(matrix)
    rot = inverse[:3, :3] / np.cbrt(np.linalg.det(inverse[:3, :3]))
    o = origins.double().numpy() @ inverse[:3, :3].T + inverse[:3, 3]
    return o, directions.double().numpy() @ rot.T


@pytest.mark.parametrize("fmt", ["colmap", "nerfstudio"])
def test_importer_rays_equal_the_blender_loaders(city, fmt):
    blender = load_scene({"name": "blender", "root": str(city)}, "test")
    scene = load_scene({"name": fmt, "root": str(city)}, "test")
    matrix = np.asarray(scene.transform["matrix"], dtype=np.float64)  # source frame -> scene frame
    if fmt == "colmap":  # the COLMAP copy lives in a known random similarity of the generator's frame
        matrix = matrix @ np.asarray(json.loads((city / "colmap_from_scene.json").read_text())["matrix"])
    by_name = {Path(p).name: i for i, p in enumerate(scene.image_paths)}
    assert sorted(by_name) == sorted(Path(p).name for p in blender.image_paths)
    for j, path in enumerate(blender.image_paths):
        i = by_name[Path(path).name]
        ref = image_rays(blender.cameras, j, blender.near, blender.far)
        rays = image_rays(scene.cameras, i, scene.near, scene.far)
        origins, directions = _to_generator(matrix, rays.origins, rays.directions)
        np.testing.assert_allclose(origins, ref.origins.double().numpy(), atol=1e-5, err_msg=path)
        np.testing.assert_allclose(directions, ref.directions.double().numpy(), atol=1e-5, err_msg=path)
        np.testing.assert_array_equal(scene.image(i).numpy(), blender.image(j).numpy(), err_msg=path)
