"""``distnerf.data.convert`` (the module run in tests/e2e/test_convert.py): a few lego frames to COLMAP text and to nerfstudio, read back
with pycolmap / as JSON / through distnerf's importers; a distorted capture of two cameras."""
from __future__ import annotations

import json

import imageio.v3 as iio
import numpy as np
import pytest

from distnerf.data import DATASET_NAMES, load_scene
from distnerf.data.convert import colmap_camera, convert, main
from distnerf.data.images import undecoded
from distnerf.data.normalize import c2w_from_cam_from_world, cam_from_world_from_c2w
from tests.conftest import LEGO

needs_lego = pytest.mark.skipif(not LEGO.is_dir(), reason=f"lego scene not found at {LEGO}")
needs_importers = pytest.mark.skipif(not {"colmap", "nerfstudio"} <= set(DATASET_NAMES),
                                     reason="the COLMAP/nerfstudio importers are not there")


def random_c2w(count: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rot, _ = np.linalg.qr(rng.normal(size=(count, 3, 3)))
    rot *= np.sign(np.linalg.det(rot))[:, None, None]
    return np.concatenate([rot, rng.normal(size=(count, 3, 1))], axis=-1)


def c2w_from_colmap(cam_from_world: np.ndarray) -> np.ndarray:
    """Independent reference: invert [R | t], then OpenCV -> OpenGL camera axes."""
    w2c = np.eye(4)
    w2c[:3] = cam_from_world
    return (np.linalg.inv(w2c) @ np.diag([1.0, -1.0, -1.0, 1.0]))[:3]


# ----------------------------------------------------------------------------- pose and camera
def test_cam_from_world_by_hand_and_against_the_importers_inverse():
    # an OpenGL camera at (1, 2, 3) looking down world -Z: COLMAP's looks down +z, y down
    c2w = np.concatenate([np.eye(3), [[1.0], [2.0], [3.0]]], axis=1)
    expected = np.array([[1.0, 0, 0, -1.0], [0, -1.0, 0, 2.0], [0, 0, -1.0, 3.0]])
    np.testing.assert_allclose(cam_from_world_from_c2w(c2w), expected, atol=1e-12)
    poses = random_c2w(20)
    np.testing.assert_allclose(c2w_from_colmap(cam_from_world_from_c2w(poses)[0]), poses[0], atol=1e-12)
    np.testing.assert_allclose(c2w_from_cam_from_world(cam_from_world_from_c2w(poses)), poses, atol=1e-12)


def test_colmap_camera_models():
    intr = [10.0, 11.0, 5.0, 4.0]
    assert colmap_camera(intr, [0.0] * 5) == ("PINHOLE", intr)
    assert colmap_camera(intr, [0.1, 0.2, 0.3, 0.4, 0.0]) == ("OPENCV", intr + [0.1, 0.2, 0.3, 0.4])
    assert colmap_camera(intr, [0.1, 0, 0, 0, 0.5]) == ("FULL_OPENCV", intr + [0.1, 0, 0, 0, 0.5, 0, 0, 0])


# ----------------------------------------------------------------------------- lego
@pytest.fixture
def small_lego(tmp_path):
    """3 train and 2 test frames of lego: the json cut down, the images symlinked."""
    root = tmp_path / "lego3"
    for split, count in (("train", 3), ("test", 2)):
        meta = json.loads((LEGO / f"transforms_{split}.json").read_text())
        meta["frames"] = meta["frames"][:count]
        (root / split).mkdir(parents=True)
        for frame in meta["frames"]:
            name = frame["file_path"].removeprefix("./") + ".png"
            (root / name).symlink_to(LEGO / name)
        (root / f"transforms_{split}.json").write_text(json.dumps(meta))
    return root


def source_cameras(root) -> dict:
    """image name -> (c2w (3, 4), (fx, fy, cx, cy), (h, w)) of every split, from the Blender loader."""
    out = {}
    for split in ("train", "test"):
        scene = load_scene({"name": "blender", "root": str(root)}, split, pixels=undecoded)
        cams = scene.cameras
        for i, path in enumerate(scene.image_paths):
            name = f"{split}/{path.rsplit('/', 1)[-1]}"
            out[name] = (cams.c2w[i].double().numpy(), [float(cams.fx[i]), float(cams.fy[i]), float(cams.cx[i]),
                                                        float(cams.cy[i])], cams.size(i))
    return out


@needs_lego
def test_lego_to_colmap_reads_back_with_pycolmap(small_lego, tmp_path):
    pycolmap = pytest.importorskip("pycolmap")
    out = tmp_path / "colmap"
    main(["--to", "colmap", "--out", str(out), "dataset=blender", f"dataset.root={small_lego}"])
    want = source_cameras(small_lego)
    rec = pycolmap.Reconstruction(str(out / "sparse" / "0"))
    assert rec.num_images() == 5 and rec.num_cameras() == 1 and rec.num_points3D() == 0
    for image in rec.images.values():
        c2w, intrinsics, (height, width) = want[image.name]
        np.testing.assert_allclose(c2w_from_colmap(image.cam_from_world().matrix()), c2w, atol=1e-5)
        camera = rec.cameras[image.camera_id]
        assert camera.model.name == "PINHOLE" and (camera.height, camera.width) == (height, width)
        np.testing.assert_allclose(camera.params, intrinsics, rtol=1e-7)
        copied = out / "images" / image.name
        assert copied.is_file() and not copied.is_symlink() and copied.read_bytes() == (small_lego / image.name).read_bytes()
    assert (out / "test_list.txt").read_text().split() == ["test/r_0.png", "test/r_1.png"]
    assert not (out / "val_list.txt").exists()  # lego3 has no val split
    assert (out / "sparse" / "0" / "points3D.txt").is_file()
    assert json.loads((out / "conversion.json").read_text())["splits"] == {"train": 3, "test": 2}


@needs_lego
def test_lego_to_nerfstudio_gives_the_same_matrices(small_lego, tmp_path):
    out = tmp_path / "ns"
    convert({"name": "blender", "root": str(small_lego)}, "nerfstudio", out, link="symlink")
    meta = json.loads((out / "transforms.json").read_text())
    want = source_cameras(small_lego)
    c2w, intrinsics, (height, width) = want["train/r_0.png"]
    assert [meta[k] for k in ("fl_x", "fl_y", "cx", "cy")] == pytest.approx(intrinsics, rel=1e-7)
    assert (meta["h"], meta["w"]) == (height, width) and "k1" not in meta
    assert meta["train_filenames"] == [f"images/train/r_{i}.png" for i in range(3)]
    assert meta["test_filenames"] == ["images/test/r_0.png", "images/test/r_1.png"]
    for frame in meta["frames"]:
        name = frame["file_path"].removeprefix("images/")
        matrix = np.asarray(frame["transform_matrix"])
        np.testing.assert_allclose(matrix[:3], want[name][0], atol=1e-7)
        np.testing.assert_array_equal(matrix[3], [0, 0, 0, 1])
        assert (out / frame["file_path"]).is_symlink()
    with pytest.raises(ValueError, match="not empty"):
        convert({"name": "blender", "root": str(small_lego)}, "nerfstudio", out)


@needs_lego
@needs_importers
@pytest.mark.parametrize("to", ["colmap", "nerfstudio"])
def test_lego_round_trip_through_the_importers(small_lego, tmp_path, to):
    out = tmp_path / to
    convert({"name": "blender", "root": str(small_lego)}, to, out)
    cfg = {"name": to, "root": str(out), "normalize": False}
    if to == "colmap":
        cfg["test_list"] = str(out / "test_list.txt")
    want = source_cameras(small_lego)
    for split, count in (("train", 3), ("test", 2)):
        scene = load_scene(cfg, split, pixels=undecoded)
        assert len(scene) == count
        for i, path in enumerate(scene.image_paths):
            c2w, intrinsics, _ = want[path.split("/images/", 1)[1]]
            np.testing.assert_allclose(scene.cameras.c2w[i].double().numpy(), c2w, atol=1e-5)
            cams = scene.cameras
            assert [float(cams.fx[i]), float(cams.fy[i]), float(cams.cx[i]), float(cams.cy[i])] == \
                pytest.approx(intrinsics, rel=1e-6)


def test_downscaled_decoding_is_refused(tmp_path, synthetic_cache):
    with pytest.raises(ValueError, match="downscale=1"):
        convert({"name": "synthetic", "cache_dir": str(synthetic_cache), "resolution": 40, "downscale": 2}, "colmap",
                 tmp_path / "out")


def test_only_dataset_overrides(tmp_path):
    with pytest.raises(ValueError, match="model=nerf"):
        main(["--to", "colmap", "--out", str(tmp_path / "o"), "dataset=synthetic", "model=nerf"])


# ----------------------------------------------------------------------------- a distorted capture
@pytest.fixture
def distorted_capture(tmp_path):
    """A nerfstudio capture of 4 frames, 2 cameras of different sizes, OpenCV distortion."""
    root = tmp_path / "capture"
    (root / "images").mkdir(parents=True)
    poses = random_c2w(4, seed=3)
    frames = []
    for i, c2w in enumerate(poses):
        h, w = (6, 8) if i % 2 == 0 else (10, 12)
        iio.imwrite(root / "images" / f"f{i}.png", np.full((h, w, 3), 40 * i, dtype=np.uint8))
        frames.append({"file_path": f"images/f{i}.png", "transform_matrix": np.vstack([c2w, [0, 0, 0, 1]]).tolist(),
                       "fl_x": 9.0 + i % 2, "fl_y": 9.5 + i % 2, "cx": w / 2, "cy": h / 2, "w": w, "h": h,
                       "k1": 0.01 * (1 + i % 2), "k2": -0.002, "p1": 0.001, "p2": 0.0005})
    meta = {"camera_model": "OPENCV", "frames": frames, "train_filenames": [f["file_path"] for f in frames[:3]],
            "test_filenames": [frames[3]["file_path"]]}
    (root / "transforms.json").write_text(json.dumps(meta))
    return root, poses, frames


@needs_importers
def test_distorted_capture_to_colmap_and_nerfstudio(distorted_capture, tmp_path):
    pycolmap = pytest.importorskip("pycolmap")
    root, poses, frames = distorted_capture
    cfg = {"name": "nerfstudio", "root": str(root), "normalize": False}
    convert(cfg, "colmap", tmp_path / "colmap")
    rec = pycolmap.Reconstruction(str(tmp_path / "colmap" / "sparse" / "0"))
    assert rec.num_images() == 4 and rec.num_cameras() == 2
    by_name = {f"f{i}.png": i for i in range(4)}
    for image in rec.images.values():
        i, frame = by_name[image.name], frames[by_name[image.name]]
        camera = rec.cameras[image.camera_id]
        assert camera.model.name == "OPENCV" and (camera.width, camera.height) == (frame["w"], frame["h"])
        np.testing.assert_allclose(camera.params, [frame[k] for k in ("fl_x", "fl_y", "cx", "cy", "k1", "k2", "p1",
                                                                      "p2")], rtol=1e-6)
        np.testing.assert_allclose(c2w_from_colmap(image.cam_from_world().matrix()), poses[i], atol=1e-5)
    convert(cfg, "nerfstudio", tmp_path / "ns")
    meta = json.loads((tmp_path / "ns" / "transforms.json").read_text())
    assert "fl_x" not in meta  # per-frame intrinsics: they differ
    for out in meta["frames"]:
        frame = frames[by_name[out["file_path"].removeprefix("images/")]]
        assert {k: out[k] for k in ("fl_x", "w", "h", "k1", "p2")} == pytest.approx(
            {k: frame[k] for k in ("fl_x", "w", "h", "k1", "p2")}, rel=1e-6)
        assert out["k3"] == 0.0
    again = load_scene({"name": "colmap", "root": str(tmp_path / "colmap"), "normalize": False,
                        "test_list": str(tmp_path / "colmap" / "test_list.txt")}, "train", pixels=undecoded)
    assert len(again) == 3 and again.cameras.distortion is not None
