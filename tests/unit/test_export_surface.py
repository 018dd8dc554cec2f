"""Point clouds and meshes of a field (``distnerf.export format=ply|mesh``, :mod:`distnerf.engine.surface`),
read back with standard readers (plyfile, trimesh).

The field is a ball of known radius: a grid model's density table set from the ball's signed distance.
Its mesh must be one closed surface of the ball's size; split into two ``ss`` regions across the ball's
middle, the fused field's mesh must still be one closed surface (a seam would leave holes or duplicate
vertices on the split plane) that matches the one-model mesh within a lattice cell.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

trimesh = pytest.importorskip("trimesh")
plyfile = pytest.importorskip("plyfile")
pytest.importorskip("skimage")
from scipy.spatial import cKDTree  # noqa: E402  (scikit-image's dependency)

from distnerf.distributed import DistEnv  # noqa: E402
from distnerf.engine import surface  # noqa: E402
from distnerf.export import write_ply  # noqa: E402
from distnerf.model import build_model  # noqa: E402
from distnerf.strategy.partition import grid_partition  # noqa: E402
from distnerf.strategy.ss import SSStrategy  # noqa: E402

BOUNDS = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])
CENTRE, RADIUS = np.array([0.05, 0.1, -0.05]), 0.55  # straddles the split plane x = 0
LATTICE = 48
CELL = 2.0 / (LATTICE - 1)
GRID = {"name": "grid", "resolutions": [40], "upsample_steps": [], "cubic_voxels": True, "tighten_aabb": False}


def _ball(model) -> None:
    """Raw density 40 * (RADIUS - distance to CENTRE): raw 0 (density :func:`_level`) on the sphere."""
    density, features = model._tables()[0][:2]
    vertices = model.table_vertices(model.resolution).double()  # a joint region's: its slice of one lattice
    distance = (vertices - torch.as_tensor(CENTRE)).norm(dim=-1)
    with torch.no_grad():
        density.copy_((40.0 * (RADIUS - distance)).float()[:, None])
        features.zero_()
        k = features.shape[1] // 3  # sh coefficients per channel, (r, g, b) major
        features[:, k + 0] = 2.0    # green: degree 0 only, one value
        features[:, 3] = 4.0        # red: 4 x the basis -0.489 d_x, bright looking along -x
        model.occupancy.binary.fill_(True)


def _one_model():
    model = build_model(GRID, BOUNDS, torch.ones(3)).eval()
    _ball(model)
    return surface.model_field(model)


def _level() -> float:
    """The density of raw value 0: the ball's surface."""
    return float(build_model(GRID, BOUNDS, torch.ones(3)).densities(torch.zeros(1)))


def _two_regions():
    strategy = SSStrategy({"training": "joint"}, DistEnv(rank=0, world_size=1))
    strategy.partition = grid_partition(BOUNDS.double(), 2)
    models = {}
    for k in range(2):
        models[k] = strategy.build_region_model(GRID, BOUNDS, torch.ones(3), k).eval()
        _ball(models[k])
    return surface.region_field(models, strategy.partition), strategy.partition


def _mesh_file(field, tmp_path, name):
    verts, faces, normals, colours = surface.extract_mesh(field, BOUNDS.numpy(), LATTICE, threshold=_level())
    path = tmp_path / f"{name}.ply"
    write_ply(path, verts, normals, colours, faces)
    return path


def test_ball_mesh_reads_back_closed_and_sized(tmp_path):
    path = _mesh_file(_one_model(), tmp_path, "one")
    ply = plyfile.PlyData.read(str(path))
    assert {"x", "red", "nx"} <= {p.name for p in ply["vertex"].properties}
    mesh = trimesh.load(str(path), process=False)
    assert mesh.is_watertight and mesh.body_count == 1
    assert np.allclose(mesh.bounds, [CENTRE - RADIUS, CENTRE + RADIUS], atol=CELL)
    assert mesh.volume == pytest.approx(4 / 3 * np.pi * RADIUS ** 3, rel=0.05)
    radial = mesh.vertices - CENTRE
    assert (np.einsum("ij,ij->i", radial, mesh.vertex_normals) > 0).mean() > 0.99  # normals point outward
    colours = np.stack([ply["vertex"][c] for c in ("red", "green", "blue")], -1).astype(float)
    assert (colours[:, 1] == round(255 / (1 + np.exp(-2.0 * 0.28209479)))).all()  # sigmoid(2 Y00)
    # looking inward (along -normal): red = sigmoid(4 * 0.489 * n_x), bright where the normal points to +x
    expected = 255 / (1 + np.exp(-4.0 * 0.48860251 * mesh.vertex_normals[:, 0]))
    assert np.abs(colours[:, 0] - expected).max() < 20


def test_ss_fused_mesh_has_no_seam_and_equals_the_one_model_mesh(tmp_path):
    field, partition = _two_regions()
    split = float(partition.boxes[0, 1, 0])
    assert split == pytest.approx(0.0) and partition.boxes[0, 1, 1] == 1.0  # split across x
    ss = trimesh.load(str(_mesh_file(field, tmp_path, "ss")), process=False)
    one = trimesh.load(str(_mesh_file(_one_model(), tmp_path, "one")), process=False)
    assert ss.is_watertight and ss.body_count == 1  # a seam: open edges or a second body at x = 0
    assert len(np.unique(ss.vertices.round(6), axis=0)) == len(ss.vertices)  # no duplicated vertex
    near_plane = [int((abs(m.vertices[:, 0] - split) < CELL).sum()) for m in (ss, one)]
    assert near_plane[0] == pytest.approx(near_plane[1], rel=0.05)
    assert len(ss.vertices) == pytest.approx(len(one.vertices), rel=0.02)
    # every vertex of each lies within a lattice cell of one of the other's vertices
    for a, b in ((ss, one), (one, ss)):
        assert cKDTree(b.vertices).query(a.vertices)[0].max() < CELL


def test_point_cloud_is_the_ball_in_the_capture_frame(tmp_path):
    # a capture frame scaled by 2, rotated 90 degrees about z and shifted: p_scene = M p_source
    rot = np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    matrix = np.eye(4)
    matrix[:3, :3], matrix[:3, 3] = 0.5 * rot, [0.3, -0.2, 0.1]
    points, normals, colours = surface.point_cloud(_one_model(), BOUNDS.numpy(), LATTICE, threshold=_level())
    source, source_normals = surface.to_capture_frame(points, normals, {"matrix": matrix.tolist()})
    path = tmp_path / "points.ply"
    write_ply(path, source, source_normals, colours)
    cloud = trimesh.load(str(path), process=False)
    centre_source = rot.T @ (CENTRE - matrix[:3, 3]) / 0.5
    distance = np.linalg.norm(cloud.vertices - centre_source, axis=-1)
    # the lattice points inside the ball, in source units (twice the scene's)
    assert distance.max() < 2 * RADIUS and distance.max() > 2 * (RADIUS - 2 * CELL)
    assert len(cloud.vertices) == pytest.approx(4 / 3 * np.pi * RADIUS ** 3 / CELL ** 3, rel=0.2)
    outward = np.einsum("ij,ij->i", cloud.vertices - centre_source, source_normals) > 0
    assert outward[distance > RADIUS].mean() > 0.95  # normals rotate with the frame
