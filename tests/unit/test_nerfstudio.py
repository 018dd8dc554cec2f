"""nerfstudio transforms.json importer: intrinsics (global / per frame), OPENCV distortion checked
against pycolmap's projection, poses and the normalising transform, applied_transform, masks,
several image sizes, splits, downscale folders and every bad-input error."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

import distnerf.data.capture as capture
from distnerf.data import DatasetError, load_nerfstudio, load_scene
from tests.fixtures.captures import (assert_city_cameras, city_frames, distorted_pixels, ring, tiny_city,
                                     write_image, write_transforms)


def frames_of(c2w, names) -> list:
    return [{"file_path": name, "transform_matrix": np.concatenate([c, [[0, 0, 0, 1.0]]]).tolist()}
            for c, name in zip(c2w, names)]


def capture_dir(root, num=6, size=(12, 16), **meta) -> dict:
    """``num`` ring cameras, images ``images/f_XX.png`` of ``size``, a transforms.json."""
    c2w = ring(num)
    names = [f"images/f_{i:02d}.png" for i in range(num)]
    pixels = [write_image(root / name, *size, seed=i) for i, name in enumerate(names)]
    body = {"camera_model": "OPENCV", "fl_x": 20.0, "fl_y": 22.0, "cx": 8.5, "cy": 6.25, "w": size[1], "h": size[0],
            "frames": frames_of(c2w, names)}
    body.update(meta)
    write_transforms(root, body)
    return {"c2w": c2w, "names": names, "pixels": pixels, "meta": body}


def undo(scene) -> np.ndarray:
    """The scene's cameras mapped back through the inverse of its transform matrix."""
    inverse = np.linalg.inv(np.asarray(scene.transform["matrix"]))
    c2w = scene.cameras.c2w.double().numpy()
    rot = inverse[:3, :3] @ c2w[:, :, :3] * scene.transform["scale"]
    return np.concatenate([rot, (c2w[:, :, 3] @ inverse[:3, :3].T + inverse[:3, 3])[:, :, None]], 2)


def test_poses_intrinsics_and_transform(tmp_path):
    cap = capture_dir(tmp_path, num=6)
    scene = load_nerfstudio(tmp_path, "train", holdout=3)  # test = frames 0, 3
    assert len(scene) == 4 and scene.images.shape == (4, 12, 16, 3)
    np.testing.assert_allclose(undo(scene), cap["c2w"][[1, 2, 4, 5]], atol=1e-5)
    assert scene.cameras.fx.tolist() == [20.0] * 4 and scene.cameras.fy.tolist() == [22.0] * 4
    assert scene.cameras.cx.tolist() == [8.5] * 4 and scene.cameras.cy.tolist() == [6.25] * 4
    assert scene.cameras.distortion is None and scene.cameras.sizes is None and scene.mask is None
    np.testing.assert_allclose(scene.image(0).numpy(), cap["pixels"][1], atol=1e-6)
    assert scene.transform["source"] == "nerfstudio" and "applied_transform" not in scene.transform
    # the scene frame: +Y up, the cameras' robust extent 1 around their focus point (the ring's centre)
    c2w = scene.cameras.c2w.double().numpy()
    np.testing.assert_allclose(c2w[:, :, 1].mean(0) / np.linalg.norm(c2w[:, :, 1].mean(0)), [0, 1, 0], atol=1e-6)
    assert np.abs(c2w[:, :, 3]).max() <= 1.0 + 1e-5
    # no points, cameras converging on the ring's centre: the ball each image holds around it (radius D sin(theta),
    # theta = atan(5.75 / 22) the half-angle to the nearest image side, cy = 6.25 of h = 12 with fy = 22), its cube
    # the box, near/far where the rays meet it
    distance = np.linalg.norm(c2w[:, :, 3], axis=1)
    radius = distance[0] * np.sin(np.arctan(5.75 / 22.0))
    np.testing.assert_allclose(distance, distance[0], rtol=1e-6)
    np.testing.assert_allclose(scene.aabb.numpy(), [[-radius] * 3, [radius] * 3], atol=1e-6)
    np.testing.assert_allclose(scene.cameras.bounds.numpy(), np.stack([distance - radius, distance + radius], 1),
                               rtol=1e-5)
    raw = load_nerfstudio(tmp_path / "transforms.json", "test", holdout=3, normalize=False)
    np.testing.assert_allclose(raw.cameras.c2w.numpy(), cap["c2w"][[0, 3]], atol=1e-6)
    assert raw.transform is None


@pytest.mark.parametrize("layout", ["row", "from_above"])
def test_cameras_framing_no_object_keep_the_box_bounds(tmp_path, layout):
    """Cameras that do not converge (a forward-facing row), or converge from above (a ring 6 over a
    radius of 4: 56 degrees, a ground that goes on past the frames): no ball they frame; the box
    [-1, 1]^3 around the cameras, widened to hold them all, near = distance to it (1% of its diagonal
    from inside), far = to its farthest corner."""
    if layout == "row":
        c2w = np.stack([np.concatenate([np.eye(3), [[x], [0.0], [0.0]]], 1) for x in np.linspace(-1.0, 1.0, 5)])
    else:
        c2w = ring(5, height=6.0)
    names = [f"images/f_{i:02d}.png" for i in range(5)]
    for i, name in enumerate(names):
        write_image(tmp_path / name, 12, 16, seed=i)
    write_transforms(tmp_path, {"fl_x": 20.0, "w": 16, "h": 12, "frames": frames_of(c2w, names)})
    scene = load_nerfstudio(tmp_path, "train", holdout=5)
    c2w = scene.cameras.c2w.double().numpy()
    every = np.concatenate([load_nerfstudio(tmp_path, "test", holdout=5).cameras.c2w.double().numpy(), c2w])[:, :, 3]
    assert np.abs(scene.aabb.numpy()).max() >= 1.0
    box = np.stack([np.minimum(-1.0, every.min(0)), np.maximum(1.0, every.max(0))])
    np.testing.assert_allclose(scene.aabb.numpy(), box, atol=1e-6)
    corners = np.stack(np.meshgrid(*box.T, indexing="ij"), -1).reshape(-1, 3)
    far = np.linalg.norm(c2w[:, None, :, 3] - corners[None], axis=-1).max(1)
    outside = np.linalg.norm(np.maximum(np.maximum(box[0] - c2w[:, :, 3], c2w[:, :, 3] - box[1]), 0.0), axis=1)
    diagonal = np.linalg.norm(box[1] - box[0])
    np.testing.assert_allclose(scene.cameras.bounds.numpy(), np.stack([np.maximum(outside, 0.01 * diagonal), far], 1),
                               rtol=1e-5)


def test_per_frame_intrinsics_defaults_and_opencv_distortion_against_pycolmap(tmp_path):
    pycolmap = pytest.importorskip("pycolmap")
    c2w = ring(3)
    names = [f"images/f_{i}.png" for i in range(3)]
    for i, name in enumerate(names):
        write_image(tmp_path / name, 30, 40, seed=i)
    frames = frames_of(c2w, names)
    frames[1].update({"fl_x": 44.0, "k1": -0.0625, "p2": 2 ** -9})   # overrides the top level
    frames[2].update({"fl_y": 41.0, "camera_model": "PINHOLE", "k1": 0.0, "k2": 0.0, "p1": 0.0})
    write_transforms(tmp_path, {"camera_model": "OPENCV", "fl_x": 50.0, "w": 40, "h": 30, "k1": 0.125,
                                "k2": -0.03125, "p1": 2 ** -10, "k3": 0.015625, "frames": frames})
    scene = load_nerfstudio(tmp_path, "train", holdout=5)  # test = frame 0: train = 1, 2
    scene_all = [load_nerfstudio(tmp_path, s, holdout=5) for s in ("test", "train")]
    fx = [c.cameras.fx.tolist() for c in scene_all]
    assert fx == [[50.0], [44.0, 50.0]]
    assert [c.cameras.fy.tolist() for c in scene_all] == [[50.0], [44.0, 41.0]]   # fl_y defaults to fl_x
    assert scene.cameras.cx.tolist() == [20.0, 20.0] and scene.cameras.cy.tolist() == [15.0, 15.0]  # w/2, h/2
    dist = scene.cameras.distortion
    assert dist.tolist() == [[-0.0625, -0.03125, 2 ** -10, 2 ** -9, 0.015625], [0.0, 0.0, 0.0, 0.0, 0.015625]]

    xy = np.random.default_rng(0).uniform(-0.4, 0.4, (40, 2))
    for i, frame in enumerate(frames[1:]):
        param = lambda key: frame.get(key, json.loads((tmp_path / "transforms.json").read_text()).get(key, 0.0))  # noqa
        fx_i, fy_i = param("fl_x"), frame.get("fl_y", param("fl_x"))
        camera = pycolmap.Camera(model="FULL_OPENCV", width=40, height=30,
                                 params=[fx_i, fy_i, 20.0, 15.0, param("k1"), param("k2"), param("p1"), param("p2"),
                                         param("k3"), 0.0, 0.0, 0.0])
        theirs = camera.img_from_cam(np.concatenate([xy, np.ones((40, 1))], 1))
        cams_i = [getattr(scene.cameras, key)[i].item() for key in ("fx", "fy", "cx", "cy")]
        ours = distorted_pixels(xy, *cams_i, scene.cameras.distortion[i].double().tolist())
        np.testing.assert_allclose(ours, theirs, atol=1e-6)


def test_applied_transform_recorded_not_applied(tmp_path):
    applied = [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, -1.0, 0.0, 0.0]]  # ns-process-data's default
    cap = capture_dir(tmp_path, num=4, applied_transform=applied)
    scene = load_nerfstudio(tmp_path, "test", holdout=2)
    np.testing.assert_allclose(undo(scene), cap["c2w"][[0, 2]], atol=1e-5)  # poses used as written
    full = np.eye(4)
    full[:3] = applied
    assert scene.transform["applied_transform"] == full.tolist()
    np.testing.assert_allclose(scene.transform["original_matrix"], np.asarray(scene.transform["matrix"]) @ full)


def test_masks_and_several_sizes(tmp_path, monkeypatch):
    c2w = ring(4)
    sizes = [(12, 16), (8, 10), (12, 16), (8, 10)]
    names = [f"images/f_{i}.png" for i in range(4)]
    for i, (name, size) in enumerate(zip(names, sizes)):
        write_image(tmp_path / name, *size, seed=i)
    big = np.full((12, 16), 255, np.uint8)
    big[:, :4] = 0
    Image.fromarray(big).save(tmp_path / "big.png")
    small = np.full((8, 10), 255, np.uint8)
    small[0] = 0
    Image.fromarray(small).save(tmp_path / "small.png")
    frames = frames_of(c2w, names)
    for i, frame in enumerate(frames):
        frame.update({"w": sizes[i][1], "h": sizes[i][0]})
    frames[0]["mask_path"] = frames[2]["mask_path"] = "big.png"   # one file, two frames
    frames[1]["mask_path"] = "small.png"                           # frame 3: no mask
    write_transforms(tmp_path, {"fl_x": 10.0, "frames": frames})
    calls = []
    real = capture.read_mask
    monkeypatch.setattr("distnerf.data.nerfstudio.read_mask", lambda *a: calls.append(a[0]) or real(*a))
    scene = load_nerfstudio(tmp_path, "train", holdout=100)  # test = frame 0; train = 1, 2, 3
    assert scene.cameras.sizes.tolist() == [[8, 10], [12, 16], [8, 10]]
    assert scene.cameras.cx.tolist() == [5.0, 8.0, 5.0] and scene.cameras.distortion is None
    mask = scene.mask
    assert mask.shape == (3, 12, 16)
    assert not mask[0, 0].any() and mask[0, 1:8, :10].all() and not mask[0, 8:].any() and not mask[0, :, 10:].any()
    assert not mask[1, :, :4].any() and mask[1, :, 4:].all()
    assert mask[2, :8, :10].all() and not mask[2, 8:].any()
    calls.clear()
    pair = load_nerfstudio(tmp_path, "test", holdout=2)  # frames 0 and 2 share big.png: decoded once
    assert calls == [tmp_path / "big.png"] and pair.cameras.sizes is None
    assert pair.mask[:, :, 4:].all() and not pair.mask[:, :, :4].any()

    # downscale 2: the mask shrunk with the image, a pixel kept only when all four sources are
    shrunk = load_nerfstudio(tmp_path, "train", holdout=100, downscale=2)
    assert shrunk.cameras.sizes.tolist() == [[4, 5], [6, 8], [4, 5]]
    assert not shrunk.mask[0, 0].any() and shrunk.mask[0, 1:4, :5].all()
    assert not shrunk.mask[1, :, :2].any() and shrunk.mask[1, :, 2:].all()

    Image.fromarray(np.zeros((5, 7), np.uint8)).save(tmp_path / "small.png")
    with pytest.raises(DatasetError, match=r"mask .*small\.png is 7x5 \(WxH\) but its image .*f_1\.png is 10x8"):
        load_nerfstudio(tmp_path, "train", holdout=100)


def test_splits_from_filename_lists_and_holdout(tmp_path):
    capture_dir(tmp_path, num=6)
    names = lambda scene: [p.split("/")[-1] for p in scene.image_paths]  # noqa: E731
    assert names(load_nerfstudio(tmp_path, "test", holdout=4)) == ["f_00.png", "f_04.png"]
    assert names(load_nerfstudio(tmp_path, "val", holdout=4)) == ["f_00.png", "f_04.png"]
    meta = json.loads((tmp_path / "transforms.json").read_text())
    meta.update(train_filenames=["images/f_00.png", "./images/f_01.png", "images/f_02.png"],
                test_filenames=["images/f_05.png"], val_filenames=["images/f_03.png"])
    write_transforms(tmp_path, meta)
    assert names(load_nerfstudio(tmp_path, "train")) == ["f_00.png", "f_01.png", "f_02.png"]
    assert names(load_nerfstudio(tmp_path, "test")) == ["f_05.png"]
    assert names(load_nerfstudio(tmp_path, "val")) == ["f_03.png"]
    del meta["test_filenames"], meta["val_filenames"]
    write_transforms(tmp_path, meta)
    assert names(load_nerfstudio(tmp_path, "test")) == ["f_03.png", "f_04.png", "f_05.png"]  # not in train
    meta["val_filenames"] = ["images/f_09.png", "images/nope.png"]
    write_transforms(tmp_path, meta)
    with pytest.raises(DatasetError, match=r"transforms\.json val_filenames: 2 name\(s\) not among the 6 frames' "
                                           r"file_path: images/f_09\.png, images/nope\.png"):
        load_nerfstudio(tmp_path, "val")


def test_downscale_reads_images_n(tmp_path):
    capture_dir(tmp_path, num=4, size=(12, 16))
    for i in range(4):
        write_image(tmp_path / "images_3" / f"f_{i:02d}.png", 4, 5, seed=20 + i)   # rounded 16/3
    scene = load_scene({"name": "nerfstudio", "root": str(tmp_path), "downscale": 3, "holdout": 2}, "train")
    assert scene.images.shape == (2, 4, 5, 3) and scene.image_paths[0].endswith("images_3/f_01.png")
    np.testing.assert_allclose(scene.cameras.fx.numpy(), [20.0 * 5 / 16] * 2, rtol=1e-6)
    np.testing.assert_allclose(scene.cameras.cy.numpy(), [6.25 * 4 / 12] * 2, rtol=1e-6)
    (tmp_path / "images_3" / "f_03.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"images_3/f_03\.png .*images_3 exists"):
        load_nerfstudio(tmp_path, "train", holdout=2, downscale=3)


@pytest.mark.parametrize("change, message", [
    ({"camera_model": "OPENCV_FISHEYE"}, r"transforms\.json frame 0: camera_model 'OPENCV_FISHEYE' is not supported"),
    ({"camera_model": "EQUIRECTANGULAR"}, r"camera_model 'EQUIRECTANGULAR' is not supported"),
    ({"fl_x": None}, r"frame 0: no focal length \(fl_x"),
    ({"k4": 0.1}, r"k4 is not supported"),
    ({"w": 15}, r"frame 0: image .*f_00\.png is 16x12 \(WxH\) but the json's w/h is 15x12"),
    ({"frames": []}, r"'frames' must be a non-empty list"),
])
def test_bad_input(tmp_path, change, message):
    cap = capture_dir(tmp_path, num=2)
    meta = {**cap["meta"], **change}
    write_transforms(tmp_path, {k: v for k, v in meta.items() if v is not None})
    with pytest.raises(DatasetError, match=message):
        load_nerfstudio(tmp_path, "test")


def test_missing_files(tmp_path):
    # a DatasetError (the entry points print it as one line) that is also a FileNotFoundError
    with pytest.raises(DatasetError, match=r"transforms\.json not found") as err:
        load_nerfstudio(tmp_path, "train")
    assert isinstance(err.value, FileNotFoundError)
    capture_dir(tmp_path, num=2)
    (tmp_path / "images" / "f_00.png").unlink()
    with pytest.raises(DatasetError, match=r"frame 0: image not found: .*f_00\.png") as err:
        load_nerfstudio(tmp_path, "test")
    assert isinstance(err.value, FileNotFoundError)


def test_city_nerfstudio_copy_reads_back_the_generators_cameras(tmp_path):
    """The city's transforms.json (scene frame, split lists) read back gives the generator's
    cameras once the normalisation is undone, split by split."""
    city = tiny_city(tmp_path)
    frames = city_frames(city)
    for split in ("train", "val", "test"):
        scene = load_nerfstudio(city, split)
        listed = json.loads((city / "transforms.json").read_text())[f"{split}_filenames"]
        assert [p.split("/")[-1] for p in scene.image_paths] == sorted(p.split("/")[-1] for p in listed)
        assert_city_cameras(scene, frames, np.asarray(scene.transform["matrix"]))
