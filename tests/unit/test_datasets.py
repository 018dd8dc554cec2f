"""Dataset parsers: real lego / fern scenes (skipped when absent) and tiny generated fixtures."""
from __future__ import annotations

import json
import math
import struct
import sys
import types
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from distnerf.data import DatasetError, load_blender, load_llff, load_scene
from distnerf.data.images import composite, downscale_image, read_image, read_image_size

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
LEGO = DATA / "nerf_synthetic_half" / "lego"
FERN = DATA / "nerf_llff_data" / "fern"
needs_lego = pytest.mark.skipif(not LEGO.is_dir(), reason=f"lego scene not found at {LEGO}")
needs_fern = pytest.mark.skipif(not FERN.is_dir(), reason=f"fern scene not found at {FERN}")


def assert_rigid(c2w: torch.Tensor) -> None:
    rot = c2w[:, :, :3].double()
    eye = torch.eye(3, dtype=torch.float64).expand_as(rot)
    assert torch.allclose(rot.transpose(1, 2) @ rot, eye, atol=1e-5)
    assert torch.allclose(torch.linalg.det(rot), torch.ones(len(rot), dtype=torch.float64),
                          atol=1e-5)


# ----------------------------------------------------------------------------- real scenes
@pytest.fixture(scope="module")
def lego_train():
    return load_blender(LEGO, "train")


@needs_lego
def test_lego_train(lego_train):
    scene = lego_train
    assert len(scene) == 100 and scene.images.shape == (100, 400, 400, 3)
    assert scene.images.dtype == torch.float32
    assert torch.allclose(scene.cameras.fx, torch.full((100,), 555.555), atol=1e-2)
    assert torch.allclose(scene.cameras.fy, scene.cameras.fx)
    assert scene.cameras.cx[0] == 200 and scene.cameras.cy[0] == 200
    assert scene.cameras.c2w.shape == (100, 3, 4)
    assert_rigid(scene.cameras.c2w)
    assert torch.equal(scene.images[:, 0, 0], torch.ones(100, 3))  # white background
    assert 0 <= scene.images.min() and scene.images.max() <= 1
    assert (scene.near, scene.far) == (2.0, 6.0) and scene.ndc is None
    assert scene.aabb.tolist() == [[-1.5] * 3, [1.5] * 3]
    assert scene.image_paths[0].endswith("r_0.png")


@needs_lego
def test_lego_downscale(lego_train):
    scene = load_blender(LEGO, "val", downscale=4)
    assert scene.images.shape == (25, 100, 100, 3)
    assert (scene.width, scene.height) == (100, 100)
    assert torch.allclose(scene.cameras.fx, torch.full((25,), 555.555 / 4), atol=1e-2)
    assert scene.cameras.cx[0] == 50
    # area averaging of 4x4 blocks
    small = downscale_image(lego_train.images[0].numpy(), 4)
    assert np.allclose(small, lego_train.images[0].numpy().reshape(100, 4, 100, 4, 3)
                       .mean((1, 3)), atol=1e-6)


@needs_fern
def test_fern_splits_intrinsics_ndc():
    raw = np.load(FERN / "poses_bounds.npy")
    focal = raw[0, 14] / (raw[0, 4] / 378)  # original focal / (original H / image H)
    train, test = load_llff(FERN, "train"), load_llff(FERN, "test")
    val = load_llff(FERN, "val")
    assert (len(train), len(test), len(val)) == (17, 3, 3)
    assert [Path(p).name for p in test.image_paths] == [
        "image000.png", "image008.png", "image016.png"]
    assert val.image_paths == test.image_paths
    assert "image000.png" not in {Path(p).name for p in train.image_paths}
    assert train.images.shape == (17, 378, 504, 3)
    assert (train.height, train.width) == (378, 504)
    assert math.isclose(focal, 407.5658, rel_tol=1e-5)
    assert torch.allclose(train.cameras.fx, torch.full((17,), focal, dtype=torch.float32))
    assert train.ndc is not None and math.isclose(train.ndc.focal, focal, rel_tol=1e-6)
    assert (train.ndc.width, train.ndc.height, train.ndc.near_plane) == (504, 378, 1.0)
    assert (train.near, train.far) == (0.0, 1.0)
    assert torch.equal(train.aabb, test.aabb)
    assert (train.aabb[0] <= -1).all() and (train.aabb[1] >= 1).all()
    assert_rigid(torch.cat([train.cameras.c2w, test.cameras.c2w]))
    # recentred: the mean camera centre of the whole scene is the origin
    centres = torch.cat([train.cameras.c2w, test.cameras.c2w])[:, :, 3]
    assert centres.mean(0).abs().max() < 1e-5


@needs_fern
def test_fern_without_ndc():
    bounds = np.load(FERN / "poses_bounds.npy")[:, 15:]
    scene = load_llff(FERN, "test", ndc=False)
    assert scene.ndc is None
    assert math.isclose(scene.near, 0.9 / 0.75, rel_tol=1e-6)
    assert math.isclose(scene.far, bounds.max() / (0.75 * bounds.min()), rel_tol=1e-6)
    # the box holds every frustum between near and far, e.g. the optical axes
    c2w = scene.cameras.c2w
    for depth in (scene.near, scene.far):
        points = c2w[:, :, 3] - depth * c2w[:, :, 2]
        assert ((scene.aabb[0] <= points + 1e-5) & (points <= scene.aabb[1] + 1e-5)).all()


# ------------------------------------------------------------------------------- images
def write_png16_rgb(path: Path, array: np.ndarray) -> None:
    """Writes an (H, W, 3) uint16 array as a 16-bit RGB PNG (Pillow cannot)."""
    height, width, _ = array.shape
    raw = b"".join(b"\x00" + row.astype(">u2").tobytes() for row in array)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    path.write_bytes(b"\x89PNG\r\n\x1a\n"
                     + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def test_read_16bit_and_grey(tmp_path):
    Image.fromarray(np.array([[65535, 32768]], dtype=np.uint16)).save(tmp_path / "g16.png")
    grey16 = read_image(tmp_path / "g16.png")
    assert grey16.shape == (1, 2, 1) and grey16.dtype == np.float32
    assert grey16[0, 0, 0] == 1.0 and abs(grey16[0, 1, 0] - 0.5) < 1e-4

    Image.fromarray(np.array([[255, 51]], dtype=np.uint8), mode="L").save(tmp_path / "g8.png")
    assert np.allclose(read_image(tmp_path / "g8.png")[0, :, 0], [1.0, 0.2])

    Image.fromarray(np.array([[[255, 128]]], dtype=np.uint8), mode="LA").save(tmp_path / "la.png")
    assert np.allclose(read_image(tmp_path / "la.png"), [[[1, 1, 1, 128 / 255]]])

    values = np.array([[[65535, 32768, 1000]]], dtype=np.uint16)
    write_png16_rgb(tmp_path / "rgb16.png", values)
    rgb16 = read_image(tmp_path / "rgb16.png")
    assert rgb16.shape == (1, 1, 3)
    assert np.abs(rgb16 - values / 65535).max() <= 1 / 255 + 1e-6  # 8-bit precision


def test_read_palette_and_errors(tmp_path):
    Image.fromarray(np.full((2, 3, 3), [255, 0, 0], np.uint8)).convert("P").save(tmp_path / "p.png")
    palette = read_image(tmp_path / "p.png")
    assert palette.shape == (2, 3, 3) and np.allclose(palette, [1, 0, 0])
    with pytest.raises(FileNotFoundError, match="nothere.png"):
        read_image(tmp_path / "nothere.png")
    (tmp_path / "bad.png").write_bytes(b"not a png")
    with pytest.raises(DatasetError, match="bad.png"):
        read_image(tmp_path / "bad.png")


def test_exif_orientation(tmp_path):
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    Image.new("RGB", (8, 4), (10, 200, 30)).save(tmp_path / "rot.jpg", exif=exif)
    assert read_image(tmp_path / "rot.jpg").shape == (8, 4, 3)
    assert read_image_size(tmp_path / "rot.jpg") == (8, 4)


def test_composite_and_downscale():
    rgba = np.array([[[1.0, 0.0, 0.0, 0.25], [0.0, 0.0, 1.0, 0.0]]], np.float32)
    out = composite(rgba, (0.0, 1.0, 0.0))
    assert np.allclose(out, [[[0.25, 0.75, 0.0], [0.0, 1.0, 0.0]]])
    assert composite(np.full((1, 1, 1), 0.5), (0, 0, 0)).shape == (1, 1, 3)
    img = np.arange(16, dtype=np.float32).reshape(4, 4, 1)
    assert np.allclose(downscale_image(img, 2)[..., 0], [[2.5, 4.5], [10.5, 12.5]])
    odd = downscale_image(np.ones((5, 7, 3), np.float32), 2)
    assert odd.shape == (2, 3, 3) and np.allclose(odd, 1.0)
    with pytest.raises(ValueError):
        downscale_image(img, 0)


# -------------------------------------------------------------------- blender fixtures
POSE = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 4], [0, 0, 0, 1]]


def write_rgba(path: Path, height=6, width=8, alpha=255) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    array = np.zeros((height, width, 4), np.uint8)
    array[..., 0], array[..., 3] = 255, alpha
    Image.fromarray(array, mode="RGBA").save(path)


def make_blender(root: Path, frames=None, split="train", **top) -> Path:
    """Two 8x6 RGBA frames (``./train/r_0``, ``./train/r_1``) unless ``frames`` is given."""
    if frames is None:
        frames = []
        for i in range(2):
            write_rgba(root / "train" / f"r_{i}.png")
            frames.append({"file_path": f"./train/r_{i}", "transform_matrix": POSE})
    meta = {"camera_angle_x": 2 * math.atan(0.5), **top, "frames": frames}
    (root / f"transforms_{split}.json").write_text(json.dumps(meta))
    return root


def test_blender_fixture_defaults(tmp_path):
    scene = load_blender(make_blender(tmp_path), "train", background=(0.0, 0.0, 1.0))
    assert scene.images.shape == (2, 6, 8, 3)
    assert torch.allclose(scene.cameras.fx, torch.tensor([8.0, 8.0]))  # 0.5 * 8 / tan(atan(.5))
    assert torch.allclose(scene.cameras.fy, scene.cameras.fx)
    assert scene.cameras.cx.tolist() == [4.0, 4.0] and scene.cameras.cy.tolist() == [3.0, 3.0]
    assert torch.equal(scene.cameras.c2w[0], torch.tensor(POSE, dtype=torch.float32)[:3])
    assert torch.allclose(scene.images, torch.tensor([1.0, 0.0, 0.0]))  # opaque red


def test_blender_per_frame_intrinsics_and_paths(tmp_path):
    write_rgba(tmp_path / "img" / "a.png", alpha=0)
    write_rgba(tmp_path / "img" / "b.png", alpha=0)
    frames = [{"file_path": "img/a.png", "transform_matrix": POSE,
               "fl_x": 10.0, "fl_y": 12.0, "cx": 3.0, "cy": 2.5, "w": 8, "h": 6},
              {"file_path": "img/b", "transform_matrix": POSE}]
    make_blender(tmp_path, frames, fl_x=20.0, cx=4.5, w=8, h=6, near=0.5, far=3.0,
                 aabb=[[-1, -2, -3], [1, 2, 3]])
    scene = load_blender(tmp_path, "train")
    assert scene.cameras.fx.tolist() == [10.0, 20.0]  # frame keys win; fl_x before angle
    assert scene.cameras.fy.tolist() == [12.0, 20.0]
    assert scene.cameras.cx.tolist() == [3.0, 4.5] and scene.cameras.cy.tolist() == [2.5, 3.0]
    assert [Path(p).name for p in scene.image_paths] == ["a.png", "b.png"]
    assert torch.equal(scene.images, torch.ones(2, 6, 8, 3))  # transparent -> white
    assert (scene.near, scene.far) == (0.5, 3.0)
    assert scene.aabb.tolist() == [[-1, -2, -3], [1, 2, 3]]
    half = load_blender(tmp_path, "train", downscale=2, near=1.0, far=2.0, aabb=[[0] * 3, [1] * 3])
    assert half.images.shape == (2, 3, 4, 3) and half.cameras.fx.tolist() == [5.0, 10.0]
    assert half.cameras.cy.tolist() == [1.25, 1.5]
    assert (half.near, half.far, half.aabb.tolist()) == (1.0, 2.0, [[0] * 3, [1] * 3])


def test_blender_grey_and_16bit_frames(tmp_path):
    (tmp_path / "f").mkdir()
    Image.fromarray(np.full((6, 8), 32768, np.uint16)).save(tmp_path / "f" / "g16.png")
    Image.fromarray(np.full((6, 8), 255, np.uint8), mode="L").save(tmp_path / "f" / "g8.png")
    frames = [{"file_path": f"./f/{name}", "transform_matrix": POSE} for name in ("g16", "g8")]
    scene = load_blender(make_blender(tmp_path, frames), "train")
    assert torch.allclose(scene.images[0], torch.tensor(0.5), atol=1e-4)
    assert torch.equal(scene.images[1], torch.ones(6, 8, 3))


def bad_frames(tmp_path, case):
    """Two frames, the second one broken according to ``case``."""
    make_blender(tmp_path)
    meta = json.loads((tmp_path / "transforms_train.json").read_text())
    frame = meta["frames"][1]
    if case == "missing":
        (tmp_path / "train" / "r_1.png").unlink()
    elif case == "size":
        write_rgba(tmp_path / "train" / "r_1.png", height=5)
    elif case == "declared":
        frame["w"], frame["h"] = 16, 12
    elif case == "scaled":
        frame["transform_matrix"] = (np.array(POSE) * [[2], [2], [2], [1]]).tolist()
    elif case == "nan":
        frame["transform_matrix"] = [[float("nan")] * 4] + POSE[1:]
    elif case == "bottom":
        frame["transform_matrix"] = POSE[:3] + [[0, 0, 1, 1]]
    (tmp_path / "transforms_train.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("case, error, pattern", [
    ("missing", FileNotFoundError, r"frame 1.*r_1"),
    ("size", DatasetError, r"frame 1.*r_1\.png is 8x5.*frame 0.*8x6"),
    ("declared", DatasetError, r"frame 1.*r_1\.png is 8x6.*declared w/h is 16x12"),
    ("scaled", DatasetError, r"transforms_train\.json frame 1.*not rigid"),
    ("nan", DatasetError, r"transforms_train\.json frame 1.*non-finite"),
    ("bottom", DatasetError, r"transforms_train\.json frame 1.*bottom row"),
])
def test_blender_bad_frames(tmp_path, case, error, pattern):
    bad_frames(tmp_path, case)
    with pytest.raises(error, match=pattern):
        load_blender(tmp_path, "train")


def test_blender_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="transforms_test.json"):
        load_blender(tmp_path, "test")
    (tmp_path / "transforms_val.json").write_text('{"frames": [')
    with pytest.raises(DatasetError, match="transforms_val.json"):
        load_blender(tmp_path, "val")
    make_blender(tmp_path, frames=[], split="test")
    with pytest.raises(DatasetError, match="split 'test' has no frames"):
        load_blender(tmp_path, "test")


# ----------------------------------------------------------------------- llff fixtures
def make_llff(root: Path, num=4, height=6, width=8, factor=2, focal=5.0) -> np.ndarray:
    """``num`` RGB images in ``images_{factor}`` and their poses_bounds.npy rows."""
    image_dir = root / f"images_{factor}"
    image_dir.mkdir(parents=True)
    rows = []
    for i in range(num):
        suffix = ".PNG" if i == 1 else ".png"
        Image.new("RGB", (width, height), (i * 50, 0, 0)).save(image_dir / f"im{i}{suffix}")
        angle = 0.1 * i
        rot = np.array([[math.cos(angle), 0, math.sin(angle)], [0, 1, 0],
                        [-math.sin(angle), 0, math.cos(angle)]])  # OpenGL c2w rotation
        llff = np.stack([-rot[:, 1], rot[:, 0], rot[:, 2]], 1)  # [down, right, back]
        hwf = [height * factor, width * factor, focal * factor]
        pose = np.concatenate([llff, [[0.1 * i], [0.0], [0.0]], np.array(hwf)[:, None]], 1)
        rows.append(np.concatenate([pose.ravel(), [2.0 + i, 10.0]]))
    (image_dir / "notes.txt").write_text("ignored")
    array = np.array(rows)
    np.save(root / "poses_bounds.npy", array)
    return array


def test_llff_fixture(tmp_path):
    make_llff(tmp_path)
    test = load_llff(tmp_path, "test", factor=2, holdout=2)
    train = load_llff(tmp_path, "train", factor=2, holdout=2)
    assert [Path(p).name for p in test.image_paths] == ["im0.png", "im2.png"]
    assert [Path(p).name for p in train.image_paths] == ["im1.PNG", "im3.png"]
    assert test.images.shape == (2, 6, 8, 3)
    assert torch.allclose(test.images[1, ..., 0], torch.tensor(100 / 255))
    assert test.cameras.fx.tolist() == [5.0, 5.0] and test.cameras.cx.tolist() == [4.0, 4.0]
    assert_rigid(torch.cat([train.cameras.c2w, test.cameras.c2w]))
    # relative rotation between views 0 and 2 survives recentering (0.2 rad about y)
    rot0, rot2 = test.cameras.c2w[0, :, :3].double(), test.cameras.c2w[1, :, :3].double()
    assert math.isclose(float((rot0.T @ rot2)[0, 2]), math.sin(0.2), abs_tol=1e-6)
    # scale: the camera baseline 0.1 becomes 0.1 / (0.75 * 2)
    baseline = float(torch.linalg.norm(test.cameras.c2w[1, :, 3] - test.cameras.c2w[0, :, 3]))
    assert math.isclose(baseline, 0.2 / 1.5, rel_tol=1e-5)
    assert test.ndc.focal == 5.0 and (test.ndc.width, test.ndc.height) == (8, 6)


@pytest.mark.parametrize("case, error, pattern", [
    ("count", DatasetError, r"3 images in .*images_2.*im0\.png.*but 4 rows in .*poses_bounds"),
    ("size", DatasetError, r"im3\.png is 8x5"),
    ("bounds", DatasetError, r"poses_bounds\.npy: row 2 has non-finite"),
    ("pose", DatasetError, r"row 1 has non-finite"),
    ("no_dir", FileNotFoundError, r"images_4"),
    ("no_poses", FileNotFoundError, r"poses_bounds\.npy"),
    ("factor", DatasetError, r"not a factor 2"),
    ("empty", DatasetError, r"split 'train' is empty"),
])
def test_llff_errors(tmp_path, case, error, pattern):
    array = make_llff(tmp_path)
    kwargs = {"factor": 2, "holdout": 2}
    if case == "count":
        (tmp_path / "images_2" / "im3.png").unlink()
    elif case == "size":
        Image.new("RGB", (8, 5)).save(tmp_path / "images_2" / "im3.png")
    elif case in ("bounds", "pose"):
        array[2 if case == "bounds" else 1, 16 if case == "bounds" else 3] = np.inf
        np.save(tmp_path / "poses_bounds.npy", array)
    elif case == "no_dir":
        kwargs["factor"] = 4
    elif case == "no_poses":
        (tmp_path / "poses_bounds.npy").unlink()
    elif case == "factor":
        array[:, [4, 9]] *= 2
        np.save(tmp_path / "poses_bounds.npy", array)
    elif case == "empty":
        kwargs["holdout"] = 1
    with pytest.raises(error, match=pattern):
        load_llff(tmp_path, "train", **kwargs)


# ---------------------------------------------------------------------------- registry
def test_load_scene_registry(tmp_path, monkeypatch):
    make_blender(tmp_path / "b")
    scene = load_scene({"name": "blender", "root": str(tmp_path / "b"), "downscale": 2,
                        "background": [0, 0, 0], "near": 1, "far": 5}, "train")
    assert scene.images.shape == (2, 3, 4, 3) and (scene.near, scene.far) == (1.0, 5.0)
    assert scene.background.tolist() == [0, 0, 0]

    make_llff(tmp_path / "l")
    llff = load_scene({"name": "llff", "root": str(tmp_path / "l"), "factor": 2, "holdout": 2,
                       "aabb": [[-2, -2, -1], [2, 2, 1]]}, "test")
    assert llff.split == "test" and len(llff) == 2
    assert llff.aabb.tolist() == [[-2, -2, -1], [2, 2, 1]]

    calls = []

    def ensure_scene(cache_dir, kind="objects", resolution=100, **kw):
        calls.append((cache_dir, kind, resolution))
        return tmp_path / "b"

    fake = types.ModuleType("distnerf.data.synthetic")
    fake.ensure_scene = ensure_scene
    monkeypatch.setitem(sys.modules, "distnerf.data.synthetic", fake)
    synth = load_scene({"name": "synthetic", "cache_dir": str(tmp_path / "c"), "kind": "city_small",
                        "resolution": 8}, "train")
    assert calls == [(str(tmp_path / "c"), "city_small", 8)] and len(synth) == 2

    with pytest.raises(ValueError, match=r"dataset.name='tanks' is not one of \['blender', 'colmap', 'llff', "
                                         r"'nerfstudio', 'synthetic'\]"):
        load_scene({"name": "tanks", "root": "x"}, "train")
    with pytest.raises(ValueError, match="dataset.root is required"):
        load_scene({"name": "llff"}, "train")


@pytest.mark.parametrize("damage, pattern", [
    ("truncate", r"frame 1: cannot read image .*r_1\.png"),
    ("garbage", r"frame 1: cannot read image .*r_1\.png"),
    ("size", r"frame 1: image .*r_1\.png is 8x5 but .*r_0\.png is 8x6"),
])
def test_file_backed_sampling_names_a_damaged_image_before_training(tmp_path, damage, pattern):
    """sampler.source=files decodes an image only when a batch draws it: the load still checks every
    file, so a damaged one in the middle is named at start, not at the step that first draws it."""
    from distnerf.sampler.files import FileSource

    make_blender(tmp_path)
    bad = tmp_path / "train" / "r_1.png"
    if damage == "truncate":
        bad.write_bytes(bad.read_bytes()[:len(bad.read_bytes()) // 2])
    elif damage == "garbage":
        bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"not a png" * 10)
    else:
        write_rgba(bad, height=5)
    with pytest.raises(DatasetError, match=pattern):
        load_blender(tmp_path, "train", pixels=FileSource())
