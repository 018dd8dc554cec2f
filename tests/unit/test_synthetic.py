"""Tests of the procedural default scenes (distnerf.data.synthetic).

The geometric checks use their own pinhole model, written here from the documented
convention (OpenGL c2w, pixel centres at +0.5), not the module's ray code:

    x_cam = R^T (X - t);  u = cx + f * x / (-z);  v = cy - f * y / (-z)
    d_cam = ((u + 0.5 - cx) / f, -(v + 0.5 - cy) / f, -1);  d_world = R d_cam
"""
from __future__ import annotations

import colorsys
import json
import math
import os
import threading
import time

import imageio.v3 as iio
import numpy as np
import pytest

from distnerf.data import synthetic
from distnerf.data.synthetic import MARKER, ensure_scene

OBJ = dict(kind="objects", resolution=40, num_train=8, num_val=2, num_test=4, seed=0)
CITY = dict(kind="city_small", resolution=48, num_views=10, seed=0)
TINY = dict(kind="objects", resolution=16, num_train=2, num_val=1, num_test=1, seed=3)


@pytest.fixture(scope="module")
def objects_root(tmp_path_factory):
    return ensure_scene(tmp_path_factory.mktemp("cache"), **OBJ)


@pytest.fixture(scope="module")
def city_root(tmp_path_factory):
    return ensure_scene(tmp_path_factory.mktemp("cache"), **CITY)


def _load(root, split):
    meta = json.loads((root / f"transforms_{split}.json").read_text())
    images = [iio.imread(root / (frame["file_path"] + ".png")) for frame in meta["frames"]]
    return meta, images


def _intrinsics(meta, width, height):
    focal = 0.5 * width / math.tan(0.5 * meta["camera_angle_x"])
    return focal, 0.5 * width, 0.5 * height


def _project(c2w, point, focal, cx, cy):
    """Pixel coordinates (u, v) and depth of a world point (independent pinhole)."""
    rot, t = c2w[:3, :3], c2w[:3, 3]
    x, y, z = rot.T @ (np.asarray(point) - t)
    return cx + focal * x / (-z), cy - focal * y / (-z), -z


def _pixel_rays(c2w, width, height, focal, cx, cy):
    """(H, W, 3) unit world directions through pixel centres and the (3,) origin."""
    v, u = np.mgrid[0:height, 0:width]
    d_cam = np.stack([(u + 0.5 - cx) / focal, -(v + 0.5 - cy) / focal,
                      -np.ones(u.shape)], axis=-1)
    d = d_cam @ c2w[:3, :3].T
    return d / np.linalg.norm(d, axis=-1, keepdims=True), c2w[:3, 3]


def _bounding_spheres(scene):
    spheres = []
    for p in scene["primitives"]:
        if p["type"] == "sphere":
            radius = p["radius"]
        elif p["type"] == "box":
            radius = float(np.linalg.norm(p["half_extents"]))
        elif p["type"] == "cylinder":
            radius = math.hypot(p["radius"], p["half_height"])
        else:
            continue
        spheres.append((np.array(p["center"]), radius))
    return spheres


def _ray_sphere_distance(origin, dirs, centre):
    """(H, W) distance from the sphere centre to each ray (the ray's forward half)."""
    oc = centre - origin
    along = np.maximum(dirs @ oc, 0.0)
    closest = origin + along[..., None] * dirs
    return np.linalg.norm(closest - centre, axis=-1)


def _hue(rgb):
    return colorsys.rgb_to_hsv(*(np.asarray(rgb, dtype=float) / 255.0))[0]


def _hue_distance(a, b):
    d = abs(a - b) % 1.0
    return min(d, 1.0 - d)


# ---------------------------------------------------------------------------- structure
def test_files_and_json(objects_root):
    assert objects_root.name == synthetic.scene_name("objects", 40, 0, 8, 2, 4)
    assert (objects_root / MARKER).is_file()
    counts = {"train": OBJ["num_train"], "val": OBJ["num_val"], "test": OBJ["num_test"]}
    for split, count in counts.items():
        meta, images = _load(objects_root, split)
        assert meta["camera_angle_x"] == pytest.approx(0.6911, abs=0.01)
        assert (meta["near"], meta["far"]) == (2.0, 6.0)
        assert meta["aabb"] == [[-1.5, -1.5, -1.5], [1.5, 1.5, 1.5]]
        assert len(meta["frames"]) == count == len(images)
        for i, (frame, image) in enumerate(zip(meta["frames"], images)):
            assert frame["file_path"] == f"./{split}/r_{i}"
            assert image.shape == (40, 40, 4) and image.dtype == np.uint8
            c2w = np.array(frame["transform_matrix"])
            assert c2w.shape == (4, 4)
            np.testing.assert_allclose(c2w[3], [0, 0, 0, 1])
            np.testing.assert_allclose(c2w[:3, :3].T @ c2w[:3, :3], np.eye(3), atol=1e-9)
            assert np.linalg.det(c2w[:3, :3]) == pytest.approx(1.0)
            assert np.linalg.norm(c2w[:3, 3]) == pytest.approx(4.0)
            assert c2w[1, 3] > 0.0  # upper hemisphere (+Y up)


def test_alpha_is_antialiased_and_rgb_zero_on_background(objects_root):
    _, images = _load(objects_root, "train")
    alpha = np.stack(images)[..., 3]
    assert (alpha == 0).any() and (alpha == 255).any()
    partial = (alpha > 0) & (alpha < 255)
    assert partial.any()
    assert set(np.unique(alpha[partial])) <= {64, 128, 191}  # 2x2 supersampling
    rgb = np.stack(images)[..., :3]
    assert (rgb[alpha == 0] == 0).all()


# ------------------------------------------------------------------- analytic geometry
def test_origin_and_sphere_centres_project_onto_opaque_pixels_of_their_hue(objects_root):
    scene = json.loads((objects_root / "scene.json").read_text())
    spheres = [p for p in scene["primitives"] if p["type"] == "sphere"]
    assert spheres
    hue_ok = total = 0
    for split in ("train", "test"):
        meta, images = _load(objects_root, split)
        focal, cx, cy = _intrinsics(meta, 40, 40)
        for frame, image in zip(meta["frames"], images):
            c2w = np.array(frame["transform_matrix"])
            # The camera looks at the origin, which lies inside the big sphere.
            u, v, depth = _project(c2w, (0.0, 0.0, 0.0), focal, cx, cy)
            assert (u, v) == pytest.approx((cx, cy)) and depth == pytest.approx(4.0)
            for du in (-1, 0):
                for dv in (-1, 0):
                    assert image[int(cy) + dv, int(cx) + du, 3] == 255
            for sphere in spheres:
                u, v, depth = _project(c2w, sphere["center"], focal, cx, cy)
                assert depth > 0
                pixel = image[int(math.floor(v)), int(math.floor(u))]
                # The pixel's sub-rays pass within ~1 px of the centre: inside the disc.
                assert pixel[3] == 255, (split, frame["file_path"], sphere["center"])
                total += 1
                hue_ok += _hue_distance(_hue(pixel[:3]), _hue(np.array(sphere["color"]) * 255)) < 0.05
    # Other objects may occlude a sphere from a few views; its own hue must dominate.
    assert hue_ok >= 0.75 * total, (hue_ok, total)


def test_rays_missing_every_object_are_transparent(objects_root):
    scene = json.loads((objects_root / "scene.json").read_text())
    spheres = _bounding_spheres(scene)
    meta, images = _load(objects_root, "train")
    focal, cx, cy = _intrinsics(meta, 40, 40)
    num_sky = 0
    for frame, image in zip(meta["frames"], images):
        c2w = np.array(frame["transform_matrix"])
        dirs, origin = _pixel_rays(c2w, 40, 40, focal, cx, cy)
        pad = 1.5 * 6.0 / focal  # 1.5 pixels at the far bound, world units
        margin = np.min([_ray_sphere_distance(origin, dirs, c) - r for c, r in spheres], axis=0)
        sky = margin > pad
        near_object = margin < -pad
        alpha = image[..., 3]
        assert (alpha[sky] == 0).all()
        assert (alpha[alpha > 0] > 0).all() and (margin[alpha > 0] < pad).all()
        num_sky += sky.sum()
        assert near_object.any()
    assert num_sky > 0.3 * len(images) * 40 * 40


def _sub_rays(c2w, size, focal):
    """(size, size, 4, 3) unit directions of the 2x2 sub-pixel rays (offsets 0.25, 0.75)."""
    c = 0.5 * size
    v, u = np.mgrid[0:size, 0:size]
    dirs = []
    for oy in (0.25, 0.75):
        for ox in (0.25, 0.75):
            d_cam = np.stack([(u + ox - c) / focal, -(v + oy - c) / focal, -np.ones(u.shape)], -1)
            dirs.append(d_cam @ c2w[:3, :3].T)
    dirs = np.stack(dirs, axis=2)
    return dirs / np.linalg.norm(dirs, axis=-1, keepdims=True)


def _render_alpha(prim, c2w, size, angle):
    spec = synthetic.SceneSpec("objects", [prim], np.array([0.0, 1.0, 0.0]), 0.35, angle, 2.0,
                               6.0, np.array([[-1.5] * 3, [1.5] * 3]), {})
    rgba = synthetic.render_view(spec, c2w, size, size)
    assert rgba.shape == (size, size, 4) and rgba.dtype == np.float32
    return rgba[..., 3]


def test_renderer_silhouettes_match_independent_geometry():
    """Exact 2x2-supersampled coverage of a sphere (oblique view) and of a rotated box and a
    cylinder (seen from straight above, where the top face hides the sides)."""
    size, angle = 24, 0.69
    focal = 0.5 * size / math.tan(0.5 * angle)
    red = np.array([0.8, 0.2, 0.2])
    # Oblique camera at (2, 3, 4) looking at the origin, built by hand.
    eye = np.array([2.0, 3.0, 4.0])
    back = eye / np.linalg.norm(eye)
    right = np.cross([0.0, 1.0, 0.0], back)
    right /= np.linalg.norm(right)
    c2w = np.eye(4)
    c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3] = right, np.cross(back, right), back, eye
    centre, radius = np.array([0.3, -0.2, 0.1]), 0.9
    dirs = _sub_rays(c2w, size, focal)
    oc = eye - centre
    b = dirs @ oc
    hits = (b * b - (oc @ oc - radius ** 2) >= 0) & (b < 0)
    alpha = _render_alpha(synthetic.Sphere(centre, np.eye(3), red, red, radius=radius), c2w,
                          size, angle)
    np.testing.assert_array_equal(alpha, hits.mean(axis=-1))
    assert 0 < (alpha == 1).sum() and (alpha == 0).sum() > 0 and ((alpha % 1) != 0).any()

    # Straight down: right = +X, up = -Z, back = +Y.
    height = 5.0
    top_down = np.eye(4)
    top_down[:3, :3] = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, -1.0, 0.0]])
    top_down[:3, 3] = (0.0, height, 0.0)
    dirs = _sub_rays(top_down, size, focal)
    yaw, half = 0.4, np.array([1.1, 0.5, 0.6])
    rot = np.array([[math.cos(yaw), 0.0, math.sin(yaw)], [0.0, 1.0, 0.0],
                    [-math.sin(yaw), 0.0, math.cos(yaw)]])
    box = synthetic.Box(np.zeros(3), rot, red, red, half_extents=half)
    t = (height - half[1]) / -dirs[..., 1]  # ray meets the top face plane y = half_y
    local = (np.array([0.0, height, 0.0]) + t[..., None] * dirs) @ rot
    inside = (np.abs(local[..., 0]) <= half[0]) & (np.abs(local[..., 2]) <= half[2])
    alpha = _render_alpha(box, top_down, size, angle)
    np.testing.assert_array_equal(alpha, inside.mean(axis=-1))
    assert ((alpha % 1) != 0).any()

    cyl = synthetic.Cylinder(np.array([0.2, 0.0, -0.1]), np.eye(3), red, red, radius=0.8,
                             half_height=0.7)
    t = (height - 0.7) / -dirs[..., 1]
    xz = t[..., None] * dirs[..., [0, 2]] - np.array([0.2, -0.1])
    inside = np.linalg.norm(xz, axis=-1) <= 0.8
    alpha = _render_alpha(cyl, top_down, size, angle)
    np.testing.assert_array_equal(alpha, inside.mean(axis=-1))
    assert ((alpha % 1) != 0).any()


# ----------------------------------------------------------------------------- city
def test_city_cameras_nadir_then_four_obliques(city_root):
    """Each station: a nadir view (camera 1), then obliques 40 degrees off nadir towards
    +X, +Z, -X, -Z (camera 2, longer focal), aiming at the nadir view's ground point."""
    meta = json.loads((city_root / "transforms.json").read_text())
    frames = meta["frames"]
    assert len(frames) == CITY["num_views"]
    headings = [(1, 0), (0, 1), (-1, 0), (0, -1)]
    for i, frame in enumerate(frames):
        c2w = np.array(frame["transform_matrix"])
        view = -c2w[:3, 2]  # the camera looks down its -Z axis
        off_nadir = math.degrees(math.acos(-view[1]))
        assert 11.7 - 1e-9 <= c2w[1, 3] <= 12.3 + 1e-9  # altitude 12 +- 0.3
        if i % 5 == 0:
            assert off_nadir < 1.6, off_nadir
            assert abs(c2w[2, 1] + 1.0) < 1e-3  # image up = world -Z
            station = c2w[:3, 3]
        else:
            assert 38.4 <= off_nadir <= 41.6, off_nadir
            heading = np.array(headings[i % 5 - 1])
            assert view[[0, 2]] @ heading > 0.6
            ground = c2w[:3, 3] + view * (c2w[1, 3] / -view[1])  # where the axis meets y = 0
            # The 1.5-degree attitude jitter moves it by at most ~0.45 at this slant range.
            assert np.linalg.norm(ground[[0, 2]] - station[[0, 2]]) < 0.5
        assert frame["fl_x"] == frame["fl_y"] and (frame["w"], frame["h"]) == (48, 36)
    focal = {i % 5 == 0: frames[i]["fl_x"] for i in range(len(frames))}
    assert focal[True] == pytest.approx(0.5 * 48 / math.tan(math.radians(30)))
    assert focal[False] > focal[True]


def test_city_images_are_opaque_rgb_and_split_holdout_8(city_root):
    names = sorted(p.name for p in (city_root / "images").iterdir())
    assert names == [f"img_{i:04d}.png" for i in range(10)]
    for name in names:
        image = iio.imread(city_root / "images" / name)
        assert image.shape == (36, 48, 3) and image.dtype == np.uint8
    splits = {split: [f["file_path"] for f in _load_meta(city_root, split)["frames"]]
              for split in ("train", "val", "test")}
    assert splits["test"] == ["images/img_0000.png", "images/img_0008.png"]
    assert splits["val"] == splits["test"]  # the first 3 test views: there are only 2
    assert splits["train"] == [f"images/{n}" for n in names if n not in ("img_0000.png", "img_0008.png")]
    assert city_root.name == synthetic.scene_name("city_small", 48, 0, 8, 2, 2, True)


def _load_meta(root, split):
    return json.loads((root / f"transforms_{split}.json").read_text())


# ------------------------------------------------------------------------------ cache
def test_second_call_skips_generation(tmp_path):
    root = ensure_scene(tmp_path, **TINY)
    stamp = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    time.sleep(0.01)
    assert ensure_scene(tmp_path, **TINY) == root
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == stamp


def test_leftover_temp_and_incomplete_root_do_not_break_it(tmp_path):
    name = synthetic.scene_name("objects", 16, 3, 2, 1, 1)
    young = tmp_path / f".tmp-{name}-crashed"
    (young / "train").mkdir(parents=True)
    (young / "train" / "r_0.png").write_bytes(b"half a png")
    old = tmp_path / f".tmp-{name}-ancient"
    old.mkdir()
    hour_ago = time.time() - 2 * 3600
    os.utime(old, (hour_ago, hour_ago))
    incomplete = tmp_path / name  # e.g. copied by hand, no marker
    incomplete.mkdir()
    (incomplete / "junk.txt").write_text("x")

    root = ensure_scene(tmp_path, **TINY)
    assert root == incomplete and (root / MARKER).is_file()
    assert not (root / "junk.txt").exists()
    meta, images = _load(root, "train")
    assert len(images) == 2 and images[0].shape == (16, 16, 4)
    assert young.exists()  # may belong to a live generator: left alone
    assert not old.exists()  # stale: cleaned up


def test_concurrent_callers_share_one_complete_scene(tmp_path, monkeypatch):
    """Three callers at once (ranks of one host): one generates, the others wait on its lock and use it."""
    from distnerf.data.synthetic import writer

    barrier = threading.Barrier(3)
    roots, errors, generated = [], [], []
    real = writer._generate
    monkeypatch.setattr(writer, "_generate", lambda *a: generated.append(1) or real(*a))

    def worker():
        try:
            barrier.wait()
            roots.append(ensure_scene(tmp_path, **TINY))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(set(roots)) == 1 and len(generated) == 1
    root = roots[0]
    assert (root / MARKER).is_file()
    assert len(list((root / "train").glob("*.png"))) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([root.name, f".{root.name}.lock"])  # no temp dirs


def test_deterministic_and_seeded(tmp_path):
    a = ensure_scene(tmp_path / "a", **TINY)
    b = ensure_scene(tmp_path / "b", **TINY)
    c = ensure_scene(tmp_path / "c", **{**TINY, "seed": 4})
    assert c.name != a.name
    img = lambda root: iio.imread(root / "train" / "r_0.png")  # noqa: E731
    np.testing.assert_array_equal(img(a), img(b))
    assert not np.array_equal(img(a), img(c))


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="kind"):
        ensure_scene(tmp_path, kind="lego")
    with pytest.raises(ValueError, match="resolution"):
        ensure_scene(tmp_path, resolution=0)
    with pytest.raises(ValueError, match="num_val"):
        ensure_scene(tmp_path, resolution=8, num_val=-1)
    with pytest.raises(ValueError, match="num_train of kind 'detail' must be >= 1"):
        ensure_scene(tmp_path, kind="detail", resolution=8, num_train=0)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        ensure_scene(tmp_path, kind="detail", resolution=8, seed=-1)
    with pytest.raises(SystemExit):  # the command line: a usage error naming it, no traceback
        synthetic.main(["--kind", "detail", "--num-views", "5", "--out", str(tmp_path)])


def test_cli_prints_root(tmp_path, capsys):
    assert synthetic.main(["--kind", "city_small", "--resolution", "12", "--out", str(tmp_path),
                           "--num-views", "2", "--no-appearance-jitter"]) == 0
    root = capsys.readouterr().out.strip()
    assert root == str(tmp_path / synthetic.scene_name("city_small", 12, 0, 1, 1, 1, False))
    assert (tmp_path / root / MARKER).is_file()
    assert synthetic.main(["--kind", "objects", "--resolution", "12", "--out", str(tmp_path),
                           "--num-train", "1", "--num-val", "1", "--num-test", "1"]) == 0
    root = capsys.readouterr().out.strip()
    assert root == str(tmp_path / synthetic.scene_name("objects", 12, 0, 1, 1, 1))


# ---------------------------------------------------------------------------- detail
DETAIL = dict(kind="detail", resolution=48, num_train=3, num_val=1, num_test=2, seed=0)


def test_detail_scene_texture_and_silhouette_against_its_own_formula(tmp_path):
    """The detail kind: one unit sphere at the origin whose albedo is the documented sum of
    plane waves, evaluated here from scene.json's numbers (independent of the module), and a
    silhouette of the disc a unit sphere subtends from the camera's distance."""
    from distnerf.data.synthetic.scenes import build_scene
    from distnerf.data.synthetic.tracer import render_view

    root = ensure_scene(tmp_path, **DETAIL)
    scene = json.loads((root / "scene.json").read_text())
    (prim,) = scene["primitives"]
    assert prim["type"] == "textured_sphere" and prim["radius"] == 1.0 and prim["center"] == [0.0, 0.0, 0.0]
    freqs, phases, amps = (np.array(prim[k]) for k in ("frequencies", "phases", "amplitudes"))
    norms = np.linalg.norm(freqs, axis=1)
    assert norms.min() >= 0.5 and norms.max() <= 6.0 and len(norms) >= 64
    # the same energy per octave: each of the band's octaves holds a share of the waves
    octaves = np.histogram(np.log2(norms), bins=np.linspace(-1.0, np.log2(6.0), 4))[0]
    assert octaves.min() >= 0.1 * len(norms), octaves

    def expected_rgb(point):  # the docstring's formula, Lambertian shading (tracer docstring)
        albedo = np.clip(np.array(prim["color"]) + np.sin(2 * np.pi * freqs @ point + phases) @ amps, 0, 1)
        light = np.array(scene["light_dir"])
        return albedo * (scene["ambient"] + (1 - scene["ambient"]) * max(0.0, float(point @ light)))

    meta, images = _load(root, "train")
    spec = build_scene("detail", 3, 1, 2, seed=0)
    for frame, image in zip(meta["frames"], images):
        c2w = np.array(frame["transform_matrix"])
        eye = c2w[:3, 3]
        # the centre ray of a 1-pixel, 1e-6 rad camera hits the sphere where the eye's direction does
        rgba = render_view(spec, c2w, 1, 1, intrinsics=(1e6, 1e6, 0.5, 0.5))
        np.testing.assert_allclose(rgba[0, 0, :3], expected_rgb(eye / np.linalg.norm(eye)), atol=1e-5)
        # silhouette: the disc of angular radius asin(1 / |eye|), in pixels
        focal, cx, cy = _intrinsics(meta, image.shape[1], image.shape[0])
        disc = math.pi * (focal * math.tan(math.asin(1.0 / np.linalg.norm(eye)))) ** 2
        assert abs(image[..., 3].astype(float).sum() / 255.0 - disc) < 0.03 * disc
        opaque = image[..., 3] == 255
        assert image[opaque][:, :3].std(axis=0).min() > 0.05 * 255  # detail, not a flat colour
