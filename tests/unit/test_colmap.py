"""COLMAP importer and scene normalisation: pose conversion, orientation, similarity, camera
models, several cameras, per-image near/far, splits and every bad-input error (tiny models
written from code)."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from distnerf.data import DatasetError, load_colmap, load_scene
from distnerf.data.normalize import (UP, bounds_from_box, c2w_from_cam_from_world, estimate_up, fit_similarity,
                                     rotation_between)
from tests.fixtures.captures import (assert_city_cameras, city_frames, distorted_pixels, look_at, object_capture,
                                     project, ring, tiny_city, to_colmap, write_colmap_text, write_image)

pycolmap = pytest.importorskip("pycolmap")


def axis_angle(axis, degrees) -> np.ndarray:
    axis = np.asarray(axis, dtype=np.float64) / np.linalg.norm(axis)
    k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    a = np.radians(degrees)
    return np.eye(3) + np.sin(a) * k + (1 - np.cos(a)) * k @ k


def similar(c2w, rotation, scale, translation) -> np.ndarray:
    """Cameras moved by ``p -> scale * rotation @ p + translation`` (written independently of Similarity)."""
    return np.stack([np.concatenate([rotation @ c[:, :3], (scale * rotation @ c[:, 3] + translation)[:, None]], 1)
                     for c in c2w])


# ----------------------------------------------------------------------------- poses and normalisation
def test_pose_conversion_analytic():
    """A COLMAP camera at C = (1, 2, 3) looking along world +x, image y down = world -y: OpenCV
    axes right = +z, down = -y, forward = +x; OpenGL c2w: right +z, up +y, back -x, centre C."""
    centre = np.array([1.0, 2.0, 3.0])
    cv_axes = np.array([[0.0, 0.0, 1.0], [0.0, -1.0, 0.0], [1.0, 0.0, 0.0]]).T  # columns x, y, z in world
    w2c = np.concatenate([cv_axes.T, (-cv_axes.T @ centre)[:, None]], 1)
    c2w = c2w_from_cam_from_world(w2c)
    expected = np.array([[0.0, 0.0, -1.0, 1.0], [0.0, 1.0, 0.0, 2.0], [1.0, 0.0, 0.0, 3.0]])
    np.testing.assert_allclose(c2w, expected, atol=1e-12)
    # a point 2 units ahead lies on the OpenGL camera's -z axis; batched input works alike
    ahead = centre + 2 * np.array([1.0, 0.0, 0.0])
    np.testing.assert_allclose(c2w[:, :3].T @ (ahead - c2w[:, 3]), [0, 0, -2], atol=1e-12)
    np.testing.assert_allclose(c2w_from_cam_from_world(np.stack([w2c, w2c]))[1], expected, atol=1e-12)


def test_pose_conversion_matches_pycolmap_projection(tmp_path):
    """Cameras read from a model project the model's points where pycolmap does."""
    capture = object_capture(tmp_path, num=3, points=5)
    rec = pycolmap.Reconstruction(str(tmp_path / "sparse" / "0"))
    for image in rec.images.values():
        c2w = c2w_from_cam_from_world(image.cam_from_world().matrix())
        for point in rec.points3D.values():
            ours = project(c2w, *capture["intrinsics"], point.xyz)
            theirs = image.project_point(point.xyz)
            np.testing.assert_allclose(ours, theirs, atol=1e-9)


def test_rotation_between_is_a_rotation_taking_a_to_b():
    rng = np.random.default_rng(1)
    for a, b in [rng.normal(size=(2, 3)) for _ in range(5)] + [(np.array([0, 1.0, 0]), np.array([0, -2.0, 0])),
                                                                (np.array([1.0, 0, 0]), np.array([3.0, 0, 0]))]:
        rot = rotation_between(a, b)
        np.testing.assert_allclose(rot.T @ rot, np.eye(3), atol=1e-12)
        assert np.linalg.det(rot) == pytest.approx(1.0)
        np.testing.assert_allclose(rot @ (a / np.linalg.norm(a)), b / np.linalg.norm(b), atol=1e-12)


@pytest.mark.parametrize("method", ["up", "vertical"])
def test_up_axis_recovered_from_tilted_cameras(method):
    tilt = axis_angle([1.0, 0.3, 1.0], 35.0)
    cams = similar(ring(8), tilt, 1.0, np.zeros(3))
    np.testing.assert_allclose(estimate_up(cams, method), tilt @ UP, atol=1e-9)
    sim = fit_similarity(cams, orient=method)
    np.testing.assert_allclose(sim.rotation @ tilt @ UP, UP, atol=1e-9)
    np.testing.assert_allclose(sim.c2w(cams)[:, :, 1].mean(0) / np.linalg.norm(sim.c2w(cams)[:, :, 1].mean(0)),
                               UP, atol=1e-9)


def test_rolled_cameras_fall_back_to_the_mean_up_vector(caplog):
    """Portrait and landscape shots mixed: the right vectors fill space, no plane to take the normal of."""
    cams = ring(8)
    roll = axis_angle([0.0, 0.0, 1.0], 90.0)
    cams[::2, :, :3] = cams[::2, :, :3] @ roll
    with caplog.at_level(logging.WARNING, logger="distnerf"):
        up = estimate_up(cams, "vertical")
    assert "not near one plane" in caplog.text
    np.testing.assert_allclose(up, estimate_up(cams, "up"), atol=1e-12)


def test_vertical_handles_nadir_cameras_that_up_cannot():
    """Cameras looking straight down at several headings: their up vectors are horizontal (the
    mean cancels), their right vectors span the ground plane."""
    nadir = np.stack([look_at((x, 10.0, z), (x, 0.0, z), up=(np.cos(a), 0.0, np.sin(a)))
                      for x, z, a in [(0, 0, 0.1), (3, 0, 1.2), (0, 3, 2.3), (3, 3, 4.0), (1, 2, 5.1)]])
    tilt = axis_angle([0.2, 0.0, 1.0], 20.0)
    np.testing.assert_allclose(estimate_up(similar(nadir, tilt, 1.0, np.zeros(3)), "vertical"), tilt @ UP,
                               atol=1e-9)
    assert estimate_up(nadir, "none") is None


def test_known_similarity_is_undone():
    """The fixture moved by a known similarity (tilt, scale, shift) normalises to the same
    cameras (c2w to 1e-5); a similarity with yaw too gives +Y up, and the recorded matrix maps
    the source cameras onto the scene ones."""
    rng = np.random.default_rng(3)
    cams = ring(8, radius=4.0, height=1.5)
    points = rng.uniform(-1.0, 1.0, (200, 3)) * [1.0, 0.5, 1.5] + [0.3, 0.0, -0.2]
    base = fit_similarity(cams, points)
    tilt, scale, shift = axis_angle([1.0, 0.0, 0.4], 25.0), 3.7, np.array([5.0, -2.0, 7.0])
    moved_cams, moved_points = similar(cams, tilt, scale, shift), scale * points @ tilt.T + shift
    moved = fit_similarity(moved_cams, moved_points)
    np.testing.assert_allclose(moved.c2w(moved_cams), base.c2w(cams), atol=1e-5)
    np.testing.assert_allclose(moved.points(moved_points), base.points(points), atol=1e-5)
    assert moved.scale * scale == pytest.approx(base.scale)

    general = axis_angle([0.3, 1.0, -0.5], 70.0)
    cams_g, points_g = similar(cams, general, 0.2, shift), 0.2 * points @ general.T + shift
    sim = fit_similarity(cams_g, points_g)
    scene = sim.c2w(cams_g)
    np.testing.assert_allclose(scene[:, :, 1].mean(0) / np.linalg.norm(scene[:, :, 1].mean(0)), UP, atol=1e-9)
    matrix = np.asarray(sim.as_transform("colmap")["matrix"])
    homogeneous = np.concatenate([cams_g, np.broadcast_to([0, 0, 0, 1.0], (8, 1, 4))], 1)
    undone = matrix @ homogeneous
    np.testing.assert_allclose(undone[:, :3, :3] / sim.scale, scene[:, :, :3], atol=1e-9)
    np.testing.assert_allclose(undone[:, :3, 3], scene[:, :, 3], atol=1e-9)
    # robust extent: the points' 2-98 percentile box fits [-1, 1]^3, one side touching
    box = np.percentile(sim.points(points_g), [2, 98], axis=0)
    assert np.abs(box).max() <= 1.0 + 1e-9


def test_bounds_from_box_far_corner_and_outside_distance():
    box = np.array([[-1.0, -1, -1], [1, 1, 1]])
    cams = np.stack([look_at((0, 0, 5.0), (0, 0, 0)), look_at((0, 0, 0.5), (0, 0, 0))])
    bounds = bounds_from_box(cams, box)
    np.testing.assert_allclose(bounds[0], [4.0, np.sqrt(1 + 1 + 36)])
    np.testing.assert_allclose(bounds[1], [0.01 * np.sqrt(12), np.sqrt(1 + 1 + 1.5 ** 2)])


# ----------------------------------------------------------------------------- camera models
def test_distortion_coefficients_agree_with_pycolmap_projection(tmp_path):
    """Cameras.distortion applied with base.py's formula projects like pycolmap's own camera
    (img_from_cam) to 1e-6 pixels, for OPENCV, RADIAL, SIMPLE_RADIAL and SIMPLE_PINHOLE."""
    w, h = 40, 30
    cameras = [(1, "OPENCV", w, h, (50.0, 52.0, 20.5, 15.25, 0.125, -0.03125, 2 ** -10, -2 ** -9)),
               (2, "RADIAL", w, h, (48.0, 19.5, 14.5, -0.0625, 0.015625)),
               (3, "SIMPLE_RADIAL", w, h, (45.0, 20.0, 15.0, 0.09375)),
               (4, "SIMPLE_PINHOLE", w, h, (40.0, 20.0, 15.0))]
    cams = ring(5)
    images = [(i + 1, cams[i], [4, 1, 2, 3, 4][i], f"v{i}.png", []) for i in range(5)]
    write_colmap_text(tmp_path / "sparse" / "0", cameras, images, {})
    for i in range(5):
        write_image(tmp_path / "images" / f"v{i}.png", h, w, seed=i)
    scene = load_colmap(tmp_path, "train", holdout=5)  # test = v0; train = v1..v4 (cameras 1, 2, 3, 4)
    rec = pycolmap.Reconstruction(str(tmp_path / "sparse" / "0"))
    assert scene.cameras.distortion.shape == (4, 5)
    rng = np.random.default_rng(0)
    xy = rng.uniform(-0.4, 0.4, (50, 2))
    for i, camera_id in enumerate([1, 2, 3, 4]):
        cams_i = [getattr(scene.cameras, key)[i].item() for key in ("fx", "fy", "cx", "cy")]
        ours = distorted_pixels(xy, *cams_i, scene.cameras.distortion[i].double().tolist())
        theirs = rec.cameras[camera_id].img_from_cam(np.concatenate([xy, np.ones((50, 1))], 1))
        np.testing.assert_allclose(ours, theirs, atol=1e-6, err_msg=rec.cameras[camera_id].model.name)
    # a split whose cameras are all undistorted has no distortion tensor
    assert load_colmap(tmp_path, "test", holdout=5).cameras.distortion is None


def test_unsupported_camera_model_names_model_camera_and_file(tmp_path):
    write_colmap_text(tmp_path / "sparse" / "0", [(7, "OPENCV_FISHEYE", 8, 6, (5, 5, 4, 3, 0.1, 0, 0, 0))],
                      [(1, ring(1)[0], 7, "a.png", [])], {})
    write_image(tmp_path / "images" / "a.png", 6, 8)
    with pytest.raises(DatasetError, match=r"cameras\.txt: camera 7 has model OPENCV_FISHEYE, not supported"):
        load_colmap(tmp_path, "train")


# ----------------------------------------------------------------------------- several cameras, sizes, downscale
def two_camera_scene(root: Path, prescaled=None) -> list:
    """4 images alternating between camera 1 (16x12) and camera 2 (10x8 WxH)."""
    cams = ring(4)
    cameras = [(1, "PINHOLE", 16, 12, (20.0, 21.0, 8.0, 6.0)), (2, "SIMPLE_PINHOLE", 10, 8, (12.0, 5.0, 4.0))]
    write_colmap_text(root / "sparse" / "0", cameras, [(i + 1, cams[i], 1 + i % 2, f"v{i}.png", []) for i in range(4)],
                      {})
    pixels = [write_image(root / "images" / f"v{i}.png", *((12, 16) if i % 2 == 0 else (8, 10)), seed=i)
              for i in range(4)]
    if prescaled:
        for i in range(4):
            write_image(root / f"images_{prescaled[0]}" / f"v{i}.png", *prescaled[1 + i % 2], seed=10 + i)
    return pixels


def test_several_cameras_padded_with_sizes_and_mask(tmp_path):
    pixels = two_camera_scene(tmp_path)
    scene = load_colmap(tmp_path, "train", holdout=4)  # train = v1 (camera 2), v2 (camera 1), v3 (camera 2)
    assert scene.images.shape == (3, 12, 16, 3) and (scene.height, scene.width) == (12, 16)
    assert scene.cameras.sizes.tolist() == [[8, 10], [12, 16], [8, 10]]
    assert scene.cameras.fx.tolist() == [12.0, 20.0, 12.0] and scene.cameras.fy.tolist() == [12.0, 21.0, 12.0]
    assert scene.cameras.cx.tolist() == [5.0, 8.0, 5.0] and scene.cameras.cy.tolist() == [4.0, 6.0, 4.0]
    for j, i in enumerate([1, 2, 3]):
        np.testing.assert_allclose(scene.image(j).numpy(), pixels[i], atol=1e-6)
    assert scene.mask is not None and scene.mask.shape == (3, 12, 16)
    assert scene.mask[0, :8, :10].all() and not scene.mask[0, 8:].any() and not scene.mask[0, :, 10:].any()
    assert scene.mask[1].all()
    assert (scene.images[0, 8:] == 0).all() and (scene.images[0, :, 10:] == 0).all()
    # one camera size only: neither sizes nor mask
    single = load_colmap(tmp_path, "test", test_list=_write(tmp_path / "t.txt", "v0.png\nv2.png\n"))
    assert single.cameras.sizes is None and single.mask is None and single.images.shape == (2, 12, 16, 3)


def test_downscale_shrinks_images_or_reads_images_n(tmp_path):
    two_camera_scene(tmp_path)
    shrunk = load_colmap(tmp_path, "train", holdout=4, downscale=2)
    assert shrunk.images.shape == (3, 6, 8, 3) and shrunk.cameras.sizes.tolist() == [[4, 5], [6, 8], [4, 5]]
    assert shrunk.cameras.fx.tolist() == [6.0, 10.0, 6.0] and shrunk.cameras.cy.tolist() == [2.0, 3.0, 2.0]
    full = load_colmap(tmp_path, "train", holdout=4)
    np.testing.assert_allclose(shrunk.image(1).numpy(), full.image(1).reshape(6, 2, 8, 2, 3).mean((1, 3)).numpy(),
                               atol=1e-6)

    # images_3 with rounded sizes (16x12 -> 5x4, 10x8 -> 3x3): intrinsics scaled by the actual ratios
    other = tmp_path / "other"
    two_camera_scene(other, prescaled=(3, (4, 5), (3, 3)))
    scene = load_colmap(other, "train", holdout=4, downscale=3)
    assert scene.cameras.sizes.tolist() == [[3, 3], [4, 5], [3, 3]]
    np.testing.assert_allclose(scene.cameras.fx.numpy(), [12 * 3 / 10, 20 * 5 / 16, 12 * 3 / 10], rtol=1e-6)
    np.testing.assert_allclose(scene.cameras.fy.numpy(), [12 * 3 / 8, 21 * 4 / 12, 12 * 3 / 8], rtol=1e-6)
    assert scene.image_paths[0].endswith("images_3/v1.png")

    bad = tmp_path / "bad"
    two_camera_scene(bad, prescaled=(2, (4, 5), (4, 5)))  # camera 1's copies should be 8x6
    with pytest.raises(DatasetError, match=r"images_2/v0\.png is 5x4 \(WxH\) but its camera is 16x12: not a "
                                           r"downscale by 2"):
        load_colmap(bad, "test", holdout=4, downscale=2)


# ----------------------------------------------------------------------------- near / far
def test_per_image_near_far_against_hand_computed_values(tmp_path):
    """3 images: two see 5 and 4 points, the third 1 (< min_points = 3: the global bounds).
    Expected: 0.9 x 2nd and 1.1 x 98th percentile of the Euclidean distances from the camera
    centres, computed here with numpy from the fixture's own centres and points."""
    centres = np.array([[0.0, 0.0, 6.0], [6.0, 0.5, 0.0], [-4.0, 1.0, 4.0]])
    cams = np.stack([look_at(c, (0, 0, 0)) for c in centres])
    points = {1: (0.0, 0.0, 0.0), 2: (1.0, 0.5, -1.0), 3: (-1.0, -0.5, 0.5), 4: (0.5, 1.0, 1.0), 5: (-0.8, 0.2, -0.9),
              6: (0.2, -1.0, 0.3)}
    seen = {1: [1, 2, 3, 4, 5], 2: [1, 2, 4, 6], 3: [3]}
    images = []
    for i, pose in enumerate(cams):
        obs = [(*project(pose, 10.0, 10.0, 8.0, 6.0, points[p]), p) for p in seen[i + 1]] + [(1.0, 1.0, -1)]
        images.append((i + 1, pose, 1, f"v{i}.png", obs))
    write_colmap_text(tmp_path / "sparse" / "0", [(1, "PINHOLE", 16, 12, (10.0, 10.0, 8.0, 6.0))], images, points)
    for i in range(3):
        write_image(tmp_path / "images" / f"v{i}.png", 12, 16, seed=i)

    def expected(distances):
        low, high = np.percentile(distances, [2, 98])
        return 0.9 * low, 1.1 * high

    dist = {i: [np.linalg.norm(np.array(points[p]) - centres[i - 1]) for p in seen[i]] for i in seen}
    pooled = expected(np.concatenate(list(dist.values())))
    want = np.array([expected(dist[1]), expected(dist[2]), pooled])
    kw = dict(test_list=_write(tmp_path / "t.txt", "v0.png\nv1.png\nv2.png\n"), min_points=3)
    raw = load_colmap(tmp_path, "test", normalize=False, **kw)
    np.testing.assert_allclose(raw.cameras.bounds.numpy(), want, rtol=1e-6)
    assert raw.near == pytest.approx(want[:, 0].min(), rel=1e-6) and raw.far == pytest.approx(want[:, 1].max(),
                                                                                              rel=1e-6)
    assert raw.transform is None
    np.testing.assert_allclose(raw.cameras.c2w.numpy(), cams, atol=1e-6)
    # normalised: the same bounds in scene units (times the scale), the same cameras after undoing the matrix
    scene = load_colmap(tmp_path, "test", **kw)
    scale = scene.transform["scale"]
    np.testing.assert_allclose(scene.cameras.bounds.numpy(), want * scale, rtol=1e-5)
    matrix = np.asarray(scene.transform["matrix"])
    assert scene.transform["source"] == "colmap" and scene.transform["convention"] == "p_scene = matrix @ [p_source, 1]"
    inverse = np.linalg.inv(matrix)
    back_centres = scene.cameras.c2w[:, :, 3].double().numpy() @ inverse[:3, :3].T + inverse[:3, 3]
    np.testing.assert_allclose(back_centres, centres, atol=1e-5)
    np.testing.assert_allclose(inverse[:3, :3] @ scene.cameras.c2w[:, :, :3].double().numpy() * scale, cams[:, :, :3],
                               atol=1e-5)
    # overrides replace every camera's value
    fixed = load_colmap(tmp_path, "test", near=0.05, far=9.0, **kw)
    assert fixed.cameras.bounds[:, 0].tolist() == pytest.approx([0.05] * 3) and fixed.far == pytest.approx(9.0)


def test_scene_box_from_points_and_override(tmp_path):
    capture = object_capture(tmp_path, num=6, points=200, seed=4)
    scene = load_colmap(tmp_path, "train", normalize=False)
    box = np.percentile(capture["points"], [2, 98], axis=0)
    pad = 0.1 * (box[1] - box[0]).max()
    np.testing.assert_allclose(scene.aabb.numpy(), box + [[-pad], [pad]], atol=1e-5)
    normalised = load_colmap(tmp_path, "train")
    assert normalised.aabb.abs().max() <= 1.0 + 0.2 + 1e-5  # points box in [-1, 1] + 10% of its side
    fixed = load_scene({"name": "colmap", "root": str(tmp_path), "aabb": [[-2, -2, -1], [2, 2, 1]]}, "train")
    assert fixed.aabb.tolist() == [[-2, -2, -1], [2, 2, 1]]


# ----------------------------------------------------------------------------- splits and formats
def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_holdout_and_list_splits(tmp_path):
    object_capture(tmp_path, num=10)
    names = lambda scene: [Path(p).name for p in scene.image_paths]  # noqa: E731
    assert names(load_colmap(tmp_path, "test", holdout=4)) == ["img_000.png", "img_004.png", "img_008.png"]
    assert len(load_colmap(tmp_path, "train", holdout=4)) == 7
    assert names(load_colmap(tmp_path, "val", holdout=4)) == names(load_colmap(tmp_path, "test", holdout=4))
    lists = dict(test_list=_write(tmp_path / "test.txt", "# held out\nimg_003.png\n\nimg_001.png\n"),
                 val_list=_write(tmp_path / "val.txt", "img_005.png\n"))
    assert names(load_colmap(tmp_path, "test", **lists)) == ["img_001.png", "img_003.png"]
    assert names(load_colmap(tmp_path, "val", **lists)) == ["img_005.png"]
    assert "img_005.png" not in names(load_colmap(tmp_path, "train", **lists))
    with pytest.raises(DatasetError, match=r"bad\.txt: 2 name\(s\) not among the 10 registered images.*: nope\.png, "
                                           r"img_999\.png"):
        load_colmap(tmp_path, "test", test_list=_write(tmp_path / "bad.txt", "img_001.png\nnope.png\nimg_999.png\n"))


def test_binary_model_and_sparse_without_0_and_load_scene(tmp_path):
    capture = object_capture(tmp_path, num=5)
    text = load_colmap(tmp_path, "train")
    rec = pycolmap.Reconstruction(str(tmp_path / "sparse" / "0"))
    shutil.rmtree(tmp_path / "sparse")
    (tmp_path / "sparse").mkdir()
    rec.write_binary(str(tmp_path / "sparse"))
    assert (tmp_path / "sparse" / "cameras.bin").is_file()
    binary = load_scene({"name": "colmap", "root": str(tmp_path)}, "train")
    torch.testing.assert_close(binary.cameras.c2w, text.cameras.c2w)
    torch.testing.assert_close(binary.cameras.bounds, text.cameras.bounds)
    assert binary.cameras.distortion is None and binary.mask is None and binary.background.tolist() == [0, 0, 0]
    assert binary.cameras.fx.tolist() == [capture["intrinsics"][0]] * 4


# ----------------------------------------------------------------------------- bad input
def test_missing_sparse_model_names_where_it_looked(tmp_path):
    with pytest.raises(DatasetError, match=r"no sparse model .* in .*sparse/0 or .*sparse;"):
        load_colmap(tmp_path, "train")


def test_no_registered_images(tmp_path):
    write_colmap_text(tmp_path / "sparse" / "0", [(1, "PINHOLE", 8, 6, (5, 5, 4, 3))], [], {})
    with pytest.raises(DatasetError, match=r"sparse/0 has no registered images"):
        load_colmap(tmp_path, "train")


def test_image_missing_on_disk_and_images_not_in_model(tmp_path, caplog):
    object_capture(tmp_path, num=4)
    write_image(tmp_path / "images" / "stray.png", 12, 16)
    with caplog.at_level(logging.WARNING, logger="distnerf"):
        load_colmap(tmp_path, "train")
    assert "1 image(s) in" in caplog.text and "not registered in the model" in caplog.text
    assert "stray.png" in caplog.text
    with pytest.raises(DatasetError, match=r"stray\.png \(dataset\.strict=true"):
        load_colmap(tmp_path, "train", strict=True)
    (tmp_path / "images" / "img_002.png").unlink()
    with pytest.raises(DatasetError, match=r"1 image\(s\) of the model .* are missing from .*images: img_002\.png"):
        load_colmap(tmp_path, "train")


def test_image_size_differs_from_its_camera(tmp_path):
    object_capture(tmp_path, num=4)
    write_image(tmp_path / "images" / "img_001.png", 10, 16)
    with pytest.raises(DatasetError, match=r"img_001\.png is 16x10 \(WxH\) but its camera 1 of .*cameras\.txt is "
                                           r"16x12"):
        load_colmap(tmp_path, "train")


def test_non_finite_pose(tmp_path):
    object_capture(tmp_path, num=3)
    rec = pycolmap.Reconstruction(str(tmp_path / "sparse" / "0"))
    image = rec.find_image_with_name("img_001.png")
    rec.frames[image.frame_id].rig_from_world = pycolmap.Rigid3d(pycolmap.Rotation3d(np.eye(3)),
                                                                 np.array([np.nan, 0.0, 1.0]))
    shutil.rmtree(tmp_path / "sparse" / "0")
    (tmp_path / "sparse" / "0").mkdir()
    rec.write_binary(str(tmp_path / "sparse" / "0"))
    with pytest.raises(DatasetError, match=r"images\.bin: image img_001\.png \(id \d+\) has a non-finite pose"):
        load_colmap(tmp_path, "train")


def test_unreadable_model(tmp_path):
    (tmp_path / "sparse" / "0").mkdir(parents=True)
    (tmp_path / "sparse" / "0" / "cameras.txt").write_text("1 PINHOLE eight 6 5 5 4 3\n")
    with pytest.raises(DatasetError, match=r"cannot read the COLMAP model in .*sparse/0"):
        load_colmap(tmp_path, "train")


def test_to_colmap_fixture_round_trip():
    """The fixtures' own conversion inverts the importer's (both written independently)."""
    cams = ring(3)
    for c2w in cams:
        q, t = to_colmap(c2w)
        w, x, y, z = q
        rot = np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])
        np.testing.assert_allclose(c2w_from_cam_from_world(np.concatenate([rot, t[:, None]], 1)), c2w, atol=1e-12)


# ----------------------------------------------------------------------------- the built-in city's COLMAP copy
@pytest.fixture(scope="module")
def city(tmp_path_factory):
    return tiny_city(tmp_path_factory.mktemp("city"))


def test_city_colmap_copy_reads_back_the_generators_cameras(city):
    """The city's COLMAP model (a known similarity away from the scene frame) read back gives
    the generator's cameras once the normalisation and that similarity are undone; its up axis
    becomes +Y again."""
    colmap_from_scene = np.asarray(json.loads((city / "colmap_from_scene.json").read_text())["matrix"])
    frames = city_frames(city)
    seen = []
    for split in ("train", "test"):
        scene = load_colmap(city, split)
        matrix = np.asarray(scene.transform["matrix"]) @ colmap_from_scene   # generator frame -> scene
        assert_city_cameras(scene, frames, matrix)
        up = matrix[:3, :3] @ UP
        assert np.degrees(np.arccos(up[1] / np.linalg.norm(up))) < 1.0
        assert (scene.cameras.bounds[:, 0] > 0).all() and (scene.cameras.bounds[:, 1] > scene.cameras.bounds[:, 0]).all()
        seen += [Path(p).name for p in scene.image_paths]
    assert sorted(seen) == sorted(frames)
