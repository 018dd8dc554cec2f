"""Tests of the aerial city scenes (``city_small`` / ``city``) and their three formats.

A tiny city_small (the first 10 views of the flight, 32 x 24 pixels) is generated once.
The geometry checks use their own pinhole model and ray-box test, written here from the
documented conventions, not the generator's ray code:

    OpenGL c2w; d_cam = ((x - cx) / fx, -(y - cy) / fy, -1); OpenCV = OpenGL * diag(1, -1, -1)
    COLMAP: x_cam = R X_colmap + t (OpenCV), X_colmap = M [X_scene, 1]
"""
from __future__ import annotations

import json

import imageio.v3 as iio
import numpy as np
import pycolmap
import pytest

from distnerf.data.synthetic import SceneSpec, ensure_scene, scene_name
from distnerf.data.synthetic.formats import observe
from distnerf.data.synthetic.primitives import Building, CityGround
from distnerf.data.synthetic.scenes import (build_scene, city_num_views, image_size,
                                            split_counts)
from distnerf.data.synthetic.tracer import Sky
from distnerf.config_check import ConfigError, section

TINY = dict(kind="city_small", resolution=32, num_views=10, seed=0)
W, H = 32, 24
FLIP = np.diag([1.0, -1.0, -1.0])


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return ensure_scene(tmp_path_factory.mktemp("cache"), **TINY)


@pytest.fixture(scope="module")
def model(root):
    return pycolmap.Reconstruction(str(root / "sparse" / "0"))


def _json(path):
    return json.loads(path.read_text())


def _blender_frames(root):
    """image name -> Blender frame, over the three splits."""
    out = {}
    for split in ("train", "val", "test"):
        for frame in _json(root / f"transforms_{split}.json")["frames"]:
            out[frame["file_path"].split("/")[-1]] = frame
    return out


def _cam_from_world(image):
    pose = image.cam_from_world
    return pose() if callable(pose) else pose  # a method in pycolmap >= 3.12


def _slab(origin, dirs, lo, hi):
    """Entry distance of rays into the box [lo, hi] (inf on a miss), rays (N, 3)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t1, t2 = (lo - origin) / dirs, (hi - origin) / dirs
    t_in = np.nanmax(np.minimum(t1, t2), axis=1)
    t_out = np.nanmin(np.maximum(t1, t2), axis=1)
    return np.where((t_out >= t_in) & (t_out > 0), np.maximum(t_in, 0.0), np.inf)


def _first_hit(scene, origin, dirs):
    """Distance to the nearest building or ground hit (scene.json geometry), rays (N, 3)."""
    best = np.full(len(dirs), np.inf)
    for p in scene["primitives"]:
        centre = np.array(p["center"])
        if p["type"] == "building":
            half = np.array(p["half_extents"])
            best = np.minimum(best, _slab(origin, dirs, centre - half, centre + half))
        else:
            with np.errstate(divide="ignore"):
                t = -origin[1] / dirs[:, 1]
            hit = origin + t[:, None] * dirs
            inside = (np.abs(hit[:, [0, 2]] - centre[[0, 2]]) <= p["extent"]).all(axis=1) & (t > 0)
            best = np.minimum(best, np.where(inside, t, np.inf))
    return best


# ---------------------------------------------------------------------------- sizes
def test_kinds_sizes_and_counts():
    assert image_size("city_small") == (100, 75) and image_size("city") == (160, 120)
    assert image_size("city", 96) == (96, 72) and image_size("objects") == (100, 100)
    assert (city_num_views("city_small"), city_num_views("city")) == (60, 245)
    assert split_counts("city_small") == (52, 3, 8, 60)
    assert split_counts("city") == (214, 3, 31, 245)
    assert split_counts("city_small", num_views=9, num_val=2) == (7, 2, 2, 9)
    assert split_counts("objects") == (60, 8, 20, 0)
    with pytest.raises(ValueError, match="num_train"):
        split_counts("city_small", num_train=40)
    with pytest.raises(ValueError, match="num_views"):
        split_counts("city_small", num_views=61)
    with pytest.raises(ValueError, match="num_val"):
        split_counts("city_small", num_views=9, num_val=3)
    with pytest.raises(ValueError, match="num_views"):
        split_counts("objects", num_views=3)
    big = build_scene("city")  # layout and cameras only, no rendering
    buildings = [p for p in big.primitives if isinstance(p, Building)]
    assert len(buildings) > 100 and max(b.bounds()[1, 1] for b in buildings) > 6.0
    assert big.survey.c2w.shape == (245, 4, 4)


def test_schema_kinds_and_keys():
    cfg = section("dataset", {"name": "synthetic", "kind": "city", "appearance_jitter": False})
    assert cfg.resolution is None and cfg.appearance_jitter is False
    with pytest.raises(ConfigError, match="kind"):
        section("dataset", {"name": "synthetic", "kind": "wide"})


def test_first_views_do_not_depend_on_num_views():
    full, part = build_scene("city_small"), build_scene("city_small", num_views=10)
    np.testing.assert_array_equal(part.survey.c2w, full.survey.c2w[:10])
    np.testing.assert_array_equal(part.survey.gains, full.survey.gains[:10])
    np.testing.assert_array_equal(part.survey.colmap_from_scene, full.survey.colmap_from_scene)


# ---------------------------------------------------------------------------- formats
def test_files_and_splits(root):
    for name in ("transforms_train.json", "transforms_val.json", "transforms_test.json",
                 "transforms.json", "appearance.json", "colmap_from_scene.json", "scene.json",
                 "sparse/0/cameras.txt", "sparse/0/images.txt", "sparse/0/points3D.txt"):
        assert (root / name).is_file(), name
    studio = _json(root / "transforms.json")
    assert studio["camera_model"] == "PINHOLE" and "applied_transform" not in studio
    paths = [f["file_path"] for f in studio["frames"]]
    assert paths == [f"images/img_{i:04d}.png" for i in range(10)]
    assert studio["test_filenames"] == [paths[0], paths[8]]
    assert studio["val_filenames"] == [paths[0], paths[8]]  # first 3 test views: only 2 here
    assert studio["train_filenames"] == [p for i, p in enumerate(paths) if i % 8]
    for split in ("train", "val", "test"):
        meta = _json(root / f"transforms_{split}.json")
        assert [f["file_path"] for f in meta["frames"]] == studio[f"{split}_filenames"]
        assert meta["near"] > 0 and meta["far"] > meta["near"]
        lo, hi = np.array(meta["aabb"])
        assert lo[1] < 0.0 < hi[1] and (lo[[0, 2]] < -10).all() and (hi[[0, 2]] > 10).all()
        for frame in meta["frames"]:
            eye = np.array(frame["transform_matrix"])[:3, 3]
            corners = np.array([[x, y, z] for x in (lo[0], hi[0]) for y in (lo[1], hi[1])
                                for z in (lo[2], hi[2])])
            assert np.linalg.norm(corners - eye, axis=1).max() <= meta["far"]
            assert eye[1] - hi[1] >= meta["near"]  # cameras above the box
    for path in paths:
        assert (root / path).is_file()


def test_three_formats_agree(root, model):
    """Same c2w (after the similarity and the OpenCV/OpenGL flip) and intrinsics in the
    Blender, nerfstudio and COLMAP files."""
    blender = _blender_frames(root)
    studio = {f["file_path"].split("/")[-1]: f for f in _json(root / "transforms.json")["frames"]}
    sim = _json(root / "colmap_from_scene.json")
    matrix, scale = np.array(sim["matrix"]), sim["scale"]
    rot = matrix[:3, :3] / scale
    np.testing.assert_allclose(rot @ rot.T, np.eye(3), atol=1e-9)
    assert np.linalg.det(rot) == pytest.approx(1.0) and 0.3 <= scale <= 3.0
    assert set(blender) == set(studio) == {img.name for img in model.images.values()}
    assert sorted(model.cameras) == [1, 2]
    focal = {}
    for image in model.images.values():
        b, s = blender[image.name], studio[image.name]
        np.testing.assert_array_equal(b["transform_matrix"], s["transform_matrix"])
        for key in ("fl_x", "fl_y", "cx", "cy", "w", "h"):
            assert b[key] == s[key], key
        assert s["colmap_im_id"] == image.image_id == int(image.name[4:8]) + 1
        camera = model.cameras[image.camera_id]
        assert camera.model.name == "PINHOLE" and (camera.width, camera.height) == (W, H)
        np.testing.assert_allclose(camera.params, [b["fl_x"], b["fl_y"], b["cx"], b["cy"]], rtol=1e-12)
        focal[image.camera_id] = b["fl_x"]
        assert image.camera_id == (1 if (image.image_id - 1) % 5 == 0 else 2)  # nadir, obliques
        # COLMAP world-to-camera (OpenCV) in its frame -> scene c2w (OpenGL).
        w2c = _cam_from_world(image).matrix()
        centre_colmap = -w2c[:, :3].T @ w2c[:, 3]
        centre = rot.T @ (centre_colmap - matrix[:3, 3]) / scale
        c2w_rot = rot.T @ w2c[:, :3].T @ FLIP
        c2w = np.array(b["transform_matrix"])
        np.testing.assert_allclose(centre, c2w[:3, 3], atol=1e-8)
        np.testing.assert_allclose(c2w_rot, c2w[:3, :3], atol=1e-9)
    assert focal[2] > focal[1]  # obliques: the longer lens
    nadir, oblique = blender["img_0000.png"], blender["img_0001.png"]
    assert (nadir["cx"], nadir["cy"]) == (W / 2, H / 2) and oblique["cx"] != W / 2


def test_points2d_reproject_through_pycolmap(model):
    assert 100 < len(model.points3D)
    worst, count = 0.0, 0
    for image in model.images.values():
        camera, pose = model.cameras[image.camera_id], _cam_from_world(image)
        for k, p2 in enumerate(image.points2D):
            assert p2.has_point3D()
            point = model.points3D[p2.point3D_id]
            assert (image.image_id, k) in {(e.image_id, e.point2D_idx) for e in point.track.elements}
            uv = camera.img_from_cam(pose * point.xyz)
            worst, count = max(worst, float(np.abs(uv - p2.xy).max())), count + 1
            assert 0 <= p2.xy[0] < W and 0 <= p2.xy[1] < H
    assert count > 1000 and worst < 1e-3, worst
    assert min(len(p.track.elements) for p in model.points3D.values()) >= 2


def test_observations_are_exactly_the_unoccluded_points_in_view(root, model):
    """Independent check: a point is listed for an image iff it projects inside the image,
    in front, and the test's own ray-box tracing reaches it first."""
    scene = _json(root / "scene.json")
    sim = _json(root / "colmap_from_scene.json")
    matrix, scale = np.array(sim["matrix"]), sim["scale"]
    ids = np.array(sorted(model.points3D))
    xyz = np.array([model.points3D[i].xyz for i in ids])
    points = (xyz - matrix[:3, 3]) @ (matrix[:3, :3] / scale) / scale  # back to the scene frame
    blender = _blender_frames(root)
    occluded_total = 0
    for image in model.images.values():
        frame = blender[image.name]
        c2w = np.array(frame["transform_matrix"])
        cam = (points - c2w[:3, 3]) @ c2w[:3, :3]
        depth = -cam[:, 2]
        u = frame["cx"] + frame["fl_x"] * cam[:, 0] / depth
        v = frame["cy"] - frame["fl_y"] * cam[:, 1] / depth
        inside = (depth > 0) & (u >= 0) & (u < W) & (v >= 0) & (v < H)
        ray = points - c2w[:3, 3]
        dist = np.linalg.norm(ray, axis=1)
        first = _first_hit(scene, c2w[:3, 3], ray / dist[:, None])
        clear = first > dist - 1e-6
        listed = np.isin(ids, [p.point3D_id for p in image.points2D])
        # Margins keep the check away from float ties at a box edge or the image border.
        assert not (listed & ~(inside & clear)).any()
        sure = inside & (first > dist - 1e-9) & (u > 1e-6) & (v > 1e-6)
        assert (listed[sure]).all()
        occluded_total += int((inside & (first < dist - 1e-3)).sum())
    assert occluded_total > 0  # the check did meet occluded points


def test_an_occluded_point_is_not_observed():
    """Ground points behind a building, on its far facade and under it are not seen; points
    in the open and on the roof and near facade are."""
    ground = CityGround(np.zeros(3), np.eye(3), np.full(3, 0.5), np.full(3, 0.5), extent=10.0,
                        num_blocks=1)
    house = Building(np.array([0.0, 2.0, 0.0]), np.eye(3), np.full(3, 0.7), np.full(3, 0.5),
                     half_extents=np.array([1.0, 2.0, 1.0]))
    spec = SceneSpec("city_small", [ground, house], np.array([0.0, 1.0, 0.0]), 0.35, 1.0, 0.1,
                     50.0, np.array([[-10, -1, -10], [10, 5, 10]]), {})
    eye = np.array([-8.0, 6.0, 0.0])  # west of the house, looking east and down at it
    forward = np.array([8.0, -3.0, 0.0]) / np.linalg.norm([8.0, -3.0, 0.0])
    right = np.cross(forward, [0.0, 1.0, 0.0])
    right /= np.linalg.norm(right)
    c2w = np.eye(4)
    c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3] = right, np.cross(right, forward), -forward, eye
    behind = eye + (np.array([0.0, 3.0, 0.0]) - eye) * (6.0 / 3.0)  # the ray via (0, 3, 0) to y = 0
    assert behind[1] == pytest.approx(0.0) and behind[0] > 1.0
    points = np.array([behind, [1.0, 2.0, 0.3], [0.2, 0.0, 0.2],  # behind, far facade, under
                       [-4.0, 0.0, 1.0], [0.0, 4.0, 0.5], [-1.0, 1.5, -0.4]])  # open, roof, near facade
    (seen, uv), = observe(spec, points, c2w[None], np.array([[30.0, 30.0, 32.0, 24.0]]), 64, 48)
    cam = (points - eye) @ c2w[:3, :3]
    assert (cam[:, 2] < 0).all()  # all in front ...
    u, v = 32.0 + 30.0 * cam[:, 0] / -cam[:, 2], 24.0 - 30.0 * cam[:, 1] / -cam[:, 2]
    assert ((u >= 0) & (u < 64) & (v >= 0) & (v < 48)).all()  # ... and inside the image
    assert seen.tolist() == [3, 4, 5]
    np.testing.assert_allclose(uv, np.stack([u, v], axis=1)[3:], atol=1e-9)


# ---------------------------------------------------------------------------- images
def _sky(scene, dirs):
    """The documented gradient: w = 1 - (1 - |e|)^2, e = dir_y."""
    sky = {k: np.array(v) for k, v in scene["sky"].items()}
    e = dirs[..., 1:2]
    w = 1.0 - (1.0 - np.abs(e)) ** 2
    return np.where(e >= 0, sky["horizon"] + w * (sky["zenith"] - sky["horizon"]),
                    sky["horizon"] + w * (sky["nadir"] - sky["horizon"]))


def test_sky_pixels_equal_the_gradient(root):
    """Pixels whose four sub-rays all miss the scene box show the gradient times the gain."""
    scene = _json(root / "scene.json")
    gains = _json(root / "appearance.json")
    lo, hi = np.array(_json(root / "transforms_test.json")["aabb"])
    num_sky = 0
    for name, frame in _blender_frames(root).items():
        c2w = np.array(frame["transform_matrix"])
        v, u = np.mgrid[0:H, 0:W]
        colour, miss = np.zeros((H, W, 3)), np.ones((H, W), dtype=bool)
        for oy in (0.25, 0.75):
            for ox in (0.25, 0.75):
                d = np.stack([(u + ox - frame["cx"]) / frame["fl_x"],
                              -(v + oy - frame["cy"]) / frame["fl_y"], -np.ones((H, W))], -1)
                d = d @ c2w[:3, :3].T
                d /= np.linalg.norm(d, axis=-1, keepdims=True)
                miss &= np.isinf(_slab(c2w[:3, 3], d.reshape(-1, 3), lo, hi)).reshape(H, W)
                colour += 0.25 * _sky(scene, d)
        expected = np.round(255 * np.clip(colour * np.array(gains[name]), 0, 1))
        image = iio.imread(root / "images" / name).astype(np.float64)
        assert np.abs(image[miss] - expected[miss]).max(initial=0) <= 1.0, name
        num_sky += int(miss.sum())
    assert num_sky > 20  # the outward obliques of the corner station see past the ground


def test_sky_colour_is_continuous_and_elevation_only():
    sky = Sky(np.array([0.3, 0.5, 0.9]), np.array([0.8, 0.85, 0.9]), np.array([0.5, 0.6, 0.6]))
    dirs = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.0, -1.0, 0.0]])
    out = sky.colour(dirs)
    np.testing.assert_allclose(out[:2], [sky.horizon] * 2)
    np.testing.assert_allclose(out[2:], [sky.zenith, sky.nadir])
    tiny = np.array([[0.0, 1e-9, 1.0], [0.0, -1e-9, 1.0]])
    np.testing.assert_allclose(sky.colour(tiny), [sky.horizon] * 2, atol=1e-8)


def test_appearance_gains_bounded_and_off_without_jitter(root, tmp_path):
    gains = _json(root / "appearance.json")
    assert sorted(gains) == [f"img_{i:04d}.png" for i in range(10)]
    g = np.array(list(gains.values()))
    assert g.shape == (10, 3)
    assert (g >= 0.85 * 0.95 - 1e-12).all() and (g <= 1.15 * 1.05 + 1e-12).all()
    assert (g.max(axis=1) / g.min(axis=1) <= 1.05 / 0.95 + 1e-12).all()  # white balance +-5%
    assert g.std() > 0.01 and np.ptp(g.mean(axis=1)) > 0.05
    plain = ensure_scene(tmp_path, **TINY, appearance_jitter=False)
    assert plain.name == scene_name("city_small", 32, 0, 8, 2, 2, False) != root.name
    assert all(v == [1.0, 1.0, 1.0] for v in _json(plain / "appearance.json").values())
    # The jittered image is the plain one times its gain (8-bit rounding, clipping aside).
    for name, gain in gains.items():
        a = iio.imread(root / "images" / name).astype(np.float64)
        b = iio.imread(plain / "images" / name).astype(np.float64)
        ok = (a < 254) & (b < 254)
        assert np.abs(a - b * np.array(gain))[ok].max() <= 1.5, name
    assert _json(plain / "transforms.json") == _json(root / "transforms.json")
