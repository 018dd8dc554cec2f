"""Blender / NeRF-synthetic (``transforms_{split}.json``) dataset parser.

Legend: N frames, H, W image size in pixels (after downscaling).

Format (NeRF, Mildenhall et al. 2020; instant-ngp extensions)::

    {"camera_angle_x": 0.69,            # horizontal field of view, radians
     "fl_x", "fl_y", "cx", "cy", "w", "h": optional pixel intrinsics
     "near", "far", "aabb": optional scene bounds (distnerf extension)
     "frames": [{"file_path": "./train/r_0", "transform_matrix": 4x4 c2w, ...}]}

Intrinsic keys may also appear in a frame, where they override the top-level ones.
``transform_matrix`` is camera-to-world in the OpenGL convention and is used as is.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from distnerf.data.base import Cameras, DatasetError, MissingDatasetFile, SceneData
from distnerf.data.images import ImageList, IndexLabel, composite, downscale_image, read_image_size

DEFAULT_NEAR, DEFAULT_FAR = 2.0, 6.0
DEFAULT_AABB = ((-1.5, -1.5, -1.5), (1.5, 1.5, 1.5))


def load_blender(root, split: str, downscale: int = 1,
                 background: Sequence[float] = (1.0, 1.0, 1.0),
                 near: Optional[float] = None, far: Optional[float] = None,
                 aabb=None, pixels: Optional[Callable[[ImageList], torch.Tensor]] = None) -> SceneData:
    """Loads one split of a Blender-format scene.

    Intrinsics: per frame, ``fl_x`` else ``camera_angle_x`` (``focal = 0.5 * W /
    tan(0.5 * camera_angle_x)``), frame keys before top-level keys; ``fy`` likewise from
    ``fl_y`` / ``camera_angle_y``, else ``fy = fx``; ``cx, cy`` default to ``W / 2, H / 2``.
    With ``downscale = f`` images become ``(H // f, W // f)`` by area averaging (after
    compositing, which is linear, so this equals averaging premultiplied colours) and
    all intrinsics are divided by ``f``.

    Args:
        root: scene folder holding ``transforms_{split}.json``; ``file_path`` entries
            are relative to it, with or without ``./`` and with or without ``.png``.
        split: ``"train"``, ``"val"``, ``"test"`` or any name with a transforms file.
        downscale: positive integer image shrink factor.
        background: (3,) RGB in [0, 1] that RGBA images are composited onto.
        near, far: ray bounds in world units; default: the JSON's ``near``/``far``,
            else 2 and 6.
        aabb: (2, 3) [min, max] scene box in world units; default: the JSON's ``aabb``,
            else [-1.5, 1.5]^3.
        pixels: where the decoded images go: ``pixels(image_list) -> (N, H, W, 3)``
            float32 tensor (e.g. a memory-mapped cache built image by image, see
            ``distnerf.sampler.cache.PixelCache``); default: decoded into RAM.

    Returns:
        SceneData with images (N, H, W, 3) float32, c2w (N, 3, 4) float32 OpenGL.

    Raises:
        MissingDatasetFile (a DatasetError and a FileNotFoundError): the transforms file or an image is missing (names file, frame).
        DatasetError: invalid JSON, no frames, bad intrinsics, image size mismatch, a
            non-finite or non-rigid pose (the message names the file and the frame).
        ValueError: invalid arguments (downscale, near/far, aabb).
    """
    root = Path(root)
    if not isinstance(downscale, (int, np.integer)) or downscale < 1:
        raise ValueError(f"downscale must be a positive integer, got {downscale!r}")
    json_path = root / f"transforms_{split}.json"
    meta = _read_json(json_path)
    frames = meta.get("frames")
    if not isinstance(frames, list):
        raise DatasetError(f"{json_path}: 'frames' must be a list")
    if not frames:
        raise DatasetError(f"{json_path}: split {split!r} has no frames")

    paths = [_image_path(root, json_path, i, frame) for i, frame in enumerate(frames)]
    c2w = np.stack([_pose(json_path, i, frame) for i, frame in enumerate(frames)])
    height, width = read_image_size(paths[0])
    declared = [_declared_size(f"{json_path} frame {i}", meta, frame)
                for i, frame in enumerate(frames)]
    intrinsics = np.array([_intrinsics(json_path, i, meta, frame, width, height)
                           for i, frame in enumerate(frames)], dtype=np.float64)

    prepare = _Prepare(paths, declared, (height, width), tuple(float(c) for c in background), int(downscale))
    image_list = ImageList(paths, prepare, label=IndexLabel(f"{json_path} frame "),
                           recipe=f"blender v1 background={prepare.background} downscale={prepare.downscale}")
    images = torch.from_numpy(image_list.decode_all()) if pixels is None else pixels(image_list)
    intrinsics /= downscale
    cameras = Cameras(
        c2w=torch.from_numpy(c2w[:, :3, :4].astype(np.float32)),
        fx=torch.from_numpy(intrinsics[:, 0].astype(np.float32)),
        fy=torch.from_numpy(intrinsics[:, 1].astype(np.float32)),
        cx=torch.from_numpy(intrinsics[:, 2].astype(np.float32)),
        cy=torch.from_numpy(intrinsics[:, 3].astype(np.float32)),
        width=images.shape[2], height=images.shape[1])
    near = _number(json_path, "near", near if near is not None else meta.get("near", DEFAULT_NEAR))
    far = _number(json_path, "far", far if far is not None else meta.get("far", DEFAULT_FAR))
    if not 0.0 <= near < far:
        raise ValueError(f"{json_path}: need 0 <= near < far, got near={near}, far={far}")
    return SceneData(
        split=split, images=images, cameras=cameras, near=near, far=far,
        aabb=as_aabb(aabb if aabb is not None else meta.get("aabb", DEFAULT_AABB), json_path),
        background=torch.tensor(background, dtype=torch.float32).reshape(3),
        ndc=None, image_paths=[str(p) for p in paths], source=str(root))


class _Prepare:
    """The per-image transform of a Blender split (picklable: sampler workers may decode).

    Checks the decoded size against the frame's declared ``w``/``h`` and frame 0, then
    composites onto ``background`` and area-downscales by ``downscale``.
    """

    def __init__(self, paths, declared, size, background, downscale):
        self.paths, self.declared, self.size = paths, declared, size
        self.background, self.downscale = background, downscale

    def __call__(self, image: np.ndarray, index: int) -> np.ndarray:
        size = image.shape[:2]
        for want, source in ((self.declared[index], "its declared w/h"),
                             (self.size, f"frame 0 ({self.paths[0]})")):
            if want is not None and size != want:
                raise DatasetError(f"image {self.paths[index]} is "
                                   f"{size[1]}x{size[0]} (WxH) but {source} is "
                                   f"{want[1]}x{want[0]}")
        return downscale_image(composite(image, self.background), self.downscale)


def as_aabb(value, where="aabb") -> torch.Tensor:
    """Validates a scene box ``[[minx, miny, minz], [maxx, maxy, maxz]]``.

    Returns:
        (2, 3) float32 tensor.

    Raises:
        ValueError: wrong shape, non-finite values or min >= max (names ``where``).
    """
    try:
        box = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: aabb must be [[minx,miny,minz],[maxx,maxy,maxz]]") from err
    if box.shape != (2, 3) or not np.isfinite(box).all() or not (box[0] < box[1]).all():
        raise ValueError(f"{where}: aabb must be [[minx,miny,minz],[maxx,maxy,maxz]] with "
                         f"min < max, got {value!r}")
    return torch.from_numpy(box.astype(np.float32))


def _read_json(json_path: Path) -> dict:
    if not json_path.is_file():
        raise MissingDatasetFile(f"transforms file not found: {json_path}")
    try:
        with open(json_path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DatasetError(f"cannot read {json_path}: {err}") from err
    if not isinstance(meta, dict):
        raise DatasetError(f"{json_path}: top level must be a JSON object")
    return meta


def _image_path(root: Path, json_path: Path, index: int, frame) -> Path:
    if not isinstance(frame, dict) or not isinstance(frame.get("file_path"), str):
        raise DatasetError(f"{json_path} frame {index}: missing 'file_path'")
    path = root / frame["file_path"]  # a leading "./" is harmless
    if path.is_file():
        return path
    with_png = path.with_name(path.name + ".png")
    if with_png.is_file():
        return with_png
    raise MissingDatasetFile(f"{json_path} frame {index}: image not found: {path} "
                            f"(also tried {with_png})")


def _pose(json_path: Path, index: int, frame: dict) -> np.ndarray:
    where = f"{json_path} frame {index}"
    try:
        pose = np.asarray(frame["transform_matrix"], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as err:
        raise DatasetError(f"{where}: 'transform_matrix' missing or not numeric") from err
    if pose.shape != (4, 4):
        raise DatasetError(f"{where}: transform_matrix must be 4x4, got {pose.shape}")
    if not np.isfinite(pose).all():
        raise DatasetError(f"{where}: transform_matrix has non-finite values")
    check_rigid(pose, where)
    return pose


def check_rigid(pose: np.ndarray, where: str, tol: float = 1e-3) -> None:
    """Raises DatasetError naming ``where`` unless ``pose`` (4x4 or 3x4) is rigid.

    Rigid: rotation orthonormal (``|R^T R - I| <= tol``), ``det R`` within ``tol`` of +1
    and, for 4x4, bottom row ``[0, 0, 0, 1]``.
    """
    rot = pose[:3, :3]
    ortho = np.abs(rot.T @ rot - np.eye(3)).max()
    det = np.linalg.det(rot)
    if ortho > tol or abs(det - 1.0) > tol:
        raise DatasetError(f"{where}: pose is not rigid (|R^T R - I| = {ortho:.3g}, "
                           f"det R = {det:.6g}); scaled or reflected rotations are not "
                           f"supported")
    if pose.shape[0] == 4 and not np.allclose(pose[3], [0.0, 0.0, 0.0, 1.0], atol=1e-6):
        raise DatasetError(f"{where}: bottom row must be [0, 0, 0, 1], got {pose[3].tolist()}")


def _lookup(frame: dict, meta: dict, *keys: str):
    """First present key, frame before top level, in the order of ``keys`` per level."""
    for source in (frame, meta):
        for key in keys:
            if source.get(key) is not None:
                return key, source[key]
    return None, None


def _intrinsics(json_path, index, meta, frame, width, height) -> tuple:
    """(fx, fy, cx, cy) in pixels at the original image size."""
    where = f"{json_path} frame {index}"

    def focal(fl_key, angle_key, size):
        key, value = _lookup(frame, meta, fl_key, angle_key)
        if key is None:
            return None
        value = _number(where, key, value)
        if key == angle_key:
            if not 0.0 < value < math.pi:
                raise DatasetError(f"{where}: {key} = {value} is not an angle in (0, pi)")
            value = 0.5 * size / math.tan(0.5 * value)
        if value <= 0:
            raise DatasetError(f"{where}: {key} gives a non-positive focal {value}")
        return value

    fx = focal("fl_x", "camera_angle_x", width)
    if fx is None:
        raise DatasetError(f"{where}: no intrinsics (need camera_angle_x or fl_x)")
    fy = focal("fl_y", "camera_angle_y", height) or fx
    cx = _lookup(frame, meta, "cx")[1]
    cy = _lookup(frame, meta, "cy")[1]
    cx = width / 2.0 if cx is None else _number(where, "cx", cx)
    cy = height / 2.0 if cy is None else _number(where, "cy", cy)
    return fx, fy, cx, cy


def _declared_size(where: str, meta: dict, frame: dict):
    """(H, W) declared by ``w``/``h`` (frame before top level), or None."""
    width, height = _lookup(frame, meta, "w")[1], _lookup(frame, meta, "h")[1]
    if width is None or height is None:
        return None
    return int(_number(where, "h", height)), int(_number(where, "w", width))


def _number(where, key: str, value) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not math.isfinite(number):
        raise DatasetError(f"{where}: {key} must be a finite number, got {value!r}")
    return number
