"""nerfstudio ``transforms.json`` importer (``dataset=nerfstudio dataset.root=PATH``).

Legend: N frames of the capture, M frames of the split.

Format (nerfstudio's ``ns-process-data`` output; keys at the top level apply to every
frame, a frame's own keys override them)::

    {"camera_model": "OPENCV",                  # or PINHOLE; absent: OPENCV
     "fl_x", "fl_y", "cx", "cy", "w", "h",      # pixels; fl_y: fl_x, cx, cy: w/2, h/2 when absent
     "k1", "k2", "p1", "p2", "k3",              # optional OpenCV distortion (absent: 0)
     "applied_transform": 3x4 or 4x4,           # optional, see below
     "ply_file_path": "sparse_pc.ply",          # optional sparse points, see below
     "train_filenames", "val_filenames", "test_filenames": [file_path, ...],  # optional split
     "frames": [{"file_path": "images/frame_00001.png", "transform_matrix": 4x4 c2w,
                 "mask_path": "masks/frame_00001.png", ...}]}

Conventions
-----------
* ``transform_matrix`` is a 4x4 rigid camera-to-world in the OpenGL convention, used as
  is (then normalised). ``file_path``/``mask_path`` are relative to the json's folder.
* ``applied_transform`` (absent: identity) is what ``ns-process-data`` applied to the
  COLMAP poses before writing them: ``p_file = applied_transform @ [p_colmap, 1]``
  (its default swaps y and z and negates the new z: COLMAP's -y "gravity guess" becomes
  +z); nerfstudio's dataparser composes it into its ``dataparser_transform`` so that
  exports can go back to COLMAP's frame. The poses here are used as written; the
  transform record keeps it (``applied_transform``) and adds ``original_matrix``,
  ``p_scene = original_matrix @ [p_colmap, 1]``. ``applied_scale``, when present,
  multiplies it (``p_file = applied_scale * applied_transform @ [p, 1]``).
* ``ply_file_path`` (optional; ``ns-process-data`` writes COLMAP's sparse points to
  ``sparse_pc.ply``, already through ``applied_transform``, i.e. in the poses' frame, as
  nerfstudio's ``create_ply_from_colmap`` does and its dataparser reads them): read with
  ``plyfile`` (vertex x, y, z); scene frame, box and ray bounds as the COLMAP importer
  derives them from its points (:func:`distnerf.data.normalize.place_capture` with the
  points), each camera's points being those its image holds
  (:func:`distnerf.data.normalize.points_in_view`: COLMAP's per-image observations are
  not in the file; occluded points count, so far bounds come out a little looser).
* Without points: from the cameras alone (``place_capture`` with their
  :func:`~distnerf.data.normalize.half_fov`): cameras converging on an object give the
  ball their images frame (:func:`distnerf.data.normalize.framed_sphere`), its cube as
  the box and per-camera near/far where their rays can meet it; other captures (aerial,
  forward-facing) get the box [-1, 1]^3 around the cameras' centre and bounds from it.
* Camera models: ``OPENCV`` and ``PINHOLE`` (nerfstudio treats both as perspective
  cameras and applies k1 k2 k3 p1 p2 whenever present; so does this importer);
  others (fisheye, equirectangular) are refused.
* Masks: ``mask_path`` per frame, 0 = never sampled (``SceneData.mask``); a mask file
  shared by many frames is decoded once.
* Downscale N: images from ``images_N/<file name>`` beside the json when that folder
  exists (masks from ``masks_N/``), else the full images area-shrunk to ``size // N``;
  intrinsics scaled by the actual size ratio per axis.
* Split: frames sorted by file path; with any of ``train/val/test_filenames``: test =
  test_filenames, else val_filenames, else the frames not in train_filenames; val =
  val_filenames, else test; train = train_filenames, else the frames in neither. Without
  them: test = every ``holdout``-th frame (0, N, 2N, ...), val = test, train = the rest.
"""
from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from distnerf.data.base import DatasetError, MissingDatasetFile, SceneData
from distnerf.data.blender import _lookup, _number, _pose, _read_json
from distnerf.data.capture import (CaptureImages, NameLabel, capture_scene, every_nth, indices_of, read_mask,
                                   scaled_size, split_indices)
from distnerf.data.images import ImageList, read_image_size
from distnerf.data.normalize import half_fov, place_capture, points_in_view

SUPPORTED_MODELS = ("OPENCV", "PINHOLE")
DISTORTION_KEYS = ("k1", "k2", "p1", "p2", "k3")


def transforms_file(root) -> Path:
    """``root`` if it is a ``.json`` file, else ``root/transforms.json``.

    Raises:
        MissingDatasetFile (a DatasetError and a FileNotFoundError): no such file (names it).
    """
    root = Path(root)
    path = root if root.suffix == ".json" else root / "transforms.json"
    if not path.is_file():
        raise MissingDatasetFile(f"nerfstudio scene: {path} not found (dataset.root must be the folder holding "
                                f"transforms.json, or the json file)")
    return path


def relative_name(value: str) -> str:
    """A json path as a key: posix, normalised (``./images/a.png`` -> ``images/a.png``)."""
    return posixpath.normpath(str(value).replace("\\", "/"))


def frame_camera(json_path: Path, index: int, meta: dict, frame: dict) -> tuple:
    """``(model, (fx, fy, cx, cy), (k1, k2, p1, p2, k3), (h, w) or None)`` of one frame.

    Raises:
        DatasetError: an unsupported camera model (names it and the file), missing or
            non-finite intrinsics, a non-zero k4.
    """
    where = f"{json_path} frame {index}"
    model = _lookup(frame, meta, "camera_model")[1] or "OPENCV"
    if model not in SUPPORTED_MODELS:
        raise DatasetError(f"{where}: camera_model {model!r} is not supported (supported: "
                           f"{', '.join(SUPPORTED_MODELS)}); undistort the images to a pinhole camera first")
    value = lambda key: _lookup(frame, meta, key)[1]  # noqa: E731
    if value("fl_x") is None:
        raise DatasetError(f"{where}: no focal length (fl_x, at the top level or in the frame)")
    width, height = value("w"), value("h")
    size = None if width is None or height is None else (int(_number(where, "h", height)),
                                                         int(_number(where, "w", width)))
    fx = _number(where, "fl_x", value("fl_x"))
    fy = _number(where, "fl_y", value("fl_y")) if value("fl_y") is not None else fx
    cx = _number(where, "cx", value("cx")) if value("cx") is not None else None
    cy = _number(where, "cy", value("cy")) if value("cy") is not None else None
    if fx <= 0 or fy <= 0:
        raise DatasetError(f"{where}: focal lengths must be positive, got fl_x={fx}, fl_y={fy}")
    if value("k4") is not None and _number(where, "k4", value("k4")) != 0.0:
        raise DatasetError(f"{where}: k4 is not supported (a fisheye or rational model); only k1 k2 p1 p2 k3")
    dist = tuple(_number(where, key, value(key)) if value(key) is not None else 0.0 for key in DISTORTION_KEYS)
    return model, (fx, fy, cx, cy), dist, size


def capture_cameras(json_path: Path, data_dir: Path, meta: dict, frames: list,
                    order: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Every frame's ``fx, fy, cx, cy`` (N, 4) and ``(h, w)`` (N, 2) at its full size, in
    ``order``; a frame without ``w``/``h`` is sized from its image's header.

    Raises:
        DatasetError, MissingDatasetFile: see :func:`frame_camera`; a frame without
            ``w``/``h`` whose image is missing.
    """
    intrinsics, sizes = [], []
    for i in order:
        _, (fx, fy, cx, cy), _, size = frame_camera(json_path, i, meta, frames[i])
        if size is None:
            size = read_image_size(data_dir / frames[i]["file_path"])
        intrinsics.append((fx, fy, size[1] / 2.0 if cx is None else cx, size[0] / 2.0 if cy is None else cy))
        sizes.append(size)
    return np.array(intrinsics, dtype=np.float64), np.array(sizes, dtype=np.float64)


def read_ply_points(path: Path, what: str) -> np.ndarray:
    """The vertex positions of a PLY file (ascii or binary), read with ``plyfile``.

    Args:
        path: the ``.ply`` file.
        what: who names it, for error messages.

    Returns:
        (P, 3) float64 ``x, y, z`` of the ``vertex`` element, finite rows only.

    Raises:
        ImportError: plyfile missing (names the extra to install).
        MissingDatasetFile (a DatasetError and a FileNotFoundError): no such file (names it).
        DatasetError: not a PLY file, no ``vertex`` element with ``x``, ``y``, ``z`` (names the file).
    """
    try:
        from plyfile import PlyData
    except ImportError as err:
        raise ImportError(f"{what} {path} needs plyfile: pip install 'distnerf[colmap]' (or pip install "
                          f"plyfile)") from err
    if not path.is_file():
        raise MissingDatasetFile(f"{what}: point cloud not found: {path} (remove ply_file_path from the json to "
                                 f"derive the bounds from the cameras alone)")
    try:
        vertex = PlyData.read(str(path))["vertex"]
        xyz = np.stack([np.asarray(vertex[key], dtype=np.float64) for key in ("x", "y", "z")], 1)
    except Exception as err:  # plyfile raises PlyParseError, KeyError, ValueError on malformed files
        raise DatasetError(f"{what}: cannot read the point cloud {path} (a PLY file with a vertex element "
                           f"holding x, y, z): {type(err).__name__}: {err}") from err
    return xyz[np.isfinite(xyz).all(1)]


def applied_matrix(json_path: Path, meta: dict) -> Optional[np.ndarray]:
    """``applied_transform`` (times ``applied_scale``) as 4x4, or None when both are absent."""
    if meta.get("applied_transform") is None and meta.get("applied_scale") is None:
        return None
    out = np.eye(4)
    if meta.get("applied_transform") is not None:
        try:
            matrix = np.asarray(meta["applied_transform"], dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise DatasetError(f"{json_path}: applied_transform is not numeric") from err
        if matrix.shape not in ((3, 4), (4, 4)) or not np.isfinite(matrix).all():
            raise DatasetError(f"{json_path}: applied_transform must be a finite 3x4 or 4x4 matrix, got shape "
                               f"{matrix.shape}")
        out[:3] = matrix[:3]
    if meta.get("applied_scale") is not None:
        out[:3] *= _number(json_path, "applied_scale", meta["applied_scale"])
    return out


def split_of(json_path: Path, meta: dict, names: Sequence[str], split: str, holdout: int) -> list:
    """Indices of ``split`` among the sorted frame names (see the module docstring)."""
    lists = {}
    for key in ("train", "val", "test"):
        value = meta.get(f"{key}_filenames")
        if value is not None:
            if not isinstance(value, list):
                raise DatasetError(f"{json_path}: {key}_filenames must be a list of file paths")
            lists[key] = indices_of([relative_name(v) for v in value], names, f"{json_path} {key}_filenames",
                                    "frames' file_path")
    if not lists:
        return split_indices(split, len(names), every_nth(len(names), holdout), where=str(json_path))
    test = lists.get("test", lists.get("val"))
    if test is None:
        test = [i for i in range(len(names)) if i not in set(lists["train"])]
    return split_indices(split, len(names), test, lists.get("val"), lists.get("train"), where=str(json_path))


def load_nerfstudio(root, split: str, downscale: int = 1, holdout: int = 8, normalize: bool = True,
                    orient: str = "vertical", background: Sequence[float] = (0.0, 0.0, 0.0),
                    near: Optional[float] = None, far: Optional[float] = None, aabb=None,
                    pixels: Optional[Callable[[ImageList], torch.Tensor]] = None) -> SceneData:
    """Loads one split of a nerfstudio capture (conventions: the module docstring).

    Args:
        root: the folder holding ``transforms.json``, or the json file.
        split: ``"train"``, ``"val"`` or ``"test"``.
        downscale: positive integer image shrink factor.
        holdout: test-frame stride without split lists.
        normalize: move the scene into distnerf's frame (+Y up, centred, extent 1).
        orient: up-axis estimate (:func:`distnerf.data.normalize.estimate_up`).
        background: (3,) RGB that RGBA images are composited onto.
        near, far: ray bounds replacing every camera's (scene units).
        aabb: (2, 3) scene box (scene frame) replacing [-1, 1]^3.
        pixels: where the decoded images go (see ``load_scene``); default: RAM.

    Returns:
        SceneData with ``distortion`` (None when all zero), ``sizes`` (images of several
        sizes), ``bounds``, ``mask`` (padding and mask files) and ``transform``.

    Raises:
        MissingDatasetFile (a DatasetError and a FileNotFoundError): the json, an image or a mask is missing (names it and the frame).
        DatasetError: bad json, unsupported camera model, bad intrinsics or pose, an
            image or mask whose size differs from what it should be (names both), a
            split list naming unknown files, an empty split.
        ValueError: bad arguments.
    """
    if not isinstance(downscale, (int, np.integer)) or downscale < 1:
        raise ValueError(f"downscale must be a positive integer, got {downscale!r}")
    json_path = transforms_file(root)
    data_dir = json_path.parent
    meta = _read_json(json_path)
    frames = meta.get("frames")
    if not isinstance(frames, list) or not frames:
        raise DatasetError(f"{json_path}: 'frames' must be a non-empty list")
    for i, frame in enumerate(frames):
        if not isinstance(frame, dict) or not isinstance(frame.get("file_path"), str):
            raise DatasetError(f"{json_path} frame {i}: missing 'file_path'")
    order = sorted(range(len(frames)), key=lambda i: relative_name(frames[i]["file_path"]))
    names = [relative_name(frames[i]["file_path"]) for i in order]
    c2w = np.stack([_pose(json_path, i, frames[i])[:3] for i in order])  # 4x4, finite, rigid
    applied = applied_matrix(json_path, meta)
    extra = {} if applied is None else {"applied_transform": applied.tolist()}
    intrinsics_all, sizes_all = capture_cameras(json_path, data_dir, meta, frames, order)
    points = observed = half_angles = None
    if meta.get("ply_file_path") is not None:
        ply = data_dir / str(meta["ply_file_path"])
        points = read_ply_points(ply, f"{json_path}'s ply_file_path")
        observed = points_in_view(c2w, intrinsics_all, sizes_all, points)
        extra["sparse_points"] = len(points)
    else:
        half_angles = half_fov(intrinsics_all, sizes_all)
    placed = place_capture(c2w, points, observed, source="nerfstudio", normalize=normalize, orient=orient,
                           near=near, far=far, aabb=aabb, half_angles=half_angles, where=str(json_path), **extra)
    if placed.transform is not None and applied is not None:
        placed.transform["original_matrix"] = (np.asarray(placed.transform["matrix"]) @ applied).tolist()

    index = split_of(json_path, meta, names, split, holdout)
    shrunk_images = data_dir / f"images_{downscale}" if downscale > 1 else None
    shrunk_masks = data_dir / f"masks_{downscale}" if downscale > 1 else None
    prescaled = shrunk_images is not None and shrunk_images.is_dir()
    files = CaptureImages([], [], [], [], [])
    intrinsics, full_sizes, distortion, masks, decoded = [], [], [], [], {}
    for j in index:
        i = order[j]
        frame, where = frames[i], f"{json_path} frame {i}"
        _, (fx, fy, cx, cy), dist, declared = frame_camera(json_path, i, meta, frame)
        full_path = data_dir / frame["file_path"]
        if not full_path.is_file() and not prescaled:
            raise MissingDatasetFile(f"{where}: image not found: {full_path}")
        path = shrunk_images / full_path.name if prescaled else full_path
        if not path.is_file():
            raise MissingDatasetFile(f"{where}: image not found: {path} ({shrunk_images} exists, so "
                                    f"dataset.downscale={downscale} reads every image from it)")
        if declared is None:
            declared = read_image_size(full_path)
        elif not prescaled and read_image_size(full_path) != declared:
            stored = read_image_size(full_path)
            raise DatasetError(f"{where}: image {full_path} is {stored[1]}x{stored[0]} (WxH) but the json's w/h "
                               f"is {declared[1]}x{declared[0]}")
        size = scaled_size(path, declared, downscale, prescaled, where)
        files.paths.append(path)
        files.read_sizes.append(size if prescaled else declared)
        files.sizes.append(size)
        files.factors.append(1 if prescaled else downscale)
        files.expected.append(f"its size in {shrunk_images.name}/" if prescaled else f"{where}'s w/h")
        intrinsics.append((fx, fy, declared[1] / 2.0 if cx is None else cx, declared[0] / 2.0 if cy is None else cy))
        full_sizes.append(declared)
        distortion.append(dist)
        masks.append(_frame_mask(json_path, i, frame, data_dir, shrunk_masks, path, declared, size, decoded))
    return capture_scene(split, files, index, placed, np.array(intrinsics), np.array(full_sizes), np.array(distortion),
                         label=NameLabel(f"{json_path} ", [names[j] for j in index]), recipe="nerfstudio v1",
                         background=background, source=str(json_path), masks=masks, pixels=pixels)


def _frame_mask(json_path: Path, index: int, frame: dict, data_dir: Path, shrunk_masks: Optional[Path],
                image_path: Path, declared: tuple, size: tuple, decoded: dict) -> Optional[np.ndarray]:
    """The frame's mask at the image's final size, or None; ``decoded`` caches shared files."""
    if frame.get("mask_path") is None:
        return None
    path = data_dir / str(frame["mask_path"])
    stored = declared
    if shrunk_masks is not None and (shrunk_masks / path.name).is_file():
        path, stored = shrunk_masks / path.name, size
    if not path.is_file():
        raise MissingDatasetFile(f"{json_path} frame {index}: mask not found: {path}")
    key = (str(path), tuple(stored), tuple(size))
    if key not in decoded:
        decoded[key] = read_mask(path, stored, size, image_path)
    return decoded[key]
