"""LLFF forward-facing dataset parser (``poses_bounds.npy`` + ``images_{factor}/``).

Legend: N images of the scene, M images of the split, H, W image size in pixels.

Follows the loader of the NeRF reference code (``load_llff.py`` in bmild/nerf and
nerf-pytorch, after LLFF, Mildenhall et al. 2019): axis reorder to OpenGL, rescaling so
that the nearest bound is 1 / 0.75, recentering on the average pose, every
``holdout``-th image held out for testing, and rendering in NDC (NeRF, Appendix C).

``poses_bounds.npy`` is (N, 17) float: a row-major 3x5 matrix per image (columns 0-3:
camera-to-world rotation and translation with camera axes [down, right, back]; column 4:
[H, W, focal] of the original images), then the near and far scene depths.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from distnerf.data.base import Cameras, DatasetError, MissingDatasetFile, NDCParams, SceneData
from distnerf.data.images import Composite, ImageList, IndexLabel, read_image_size

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg"}
BOUND_FACTOR = 0.75  # nearest bound maps to 1 / 0.75 (reference ``bd_factor``)
NDC_NEAR_PLANE = 1.0


def load_llff(root, split: str, factor: int = 8, holdout: int = 8, ndc: bool = True,
              background: Sequence[float] = (0.0, 0.0, 0.0),
              pixels: Optional[Callable[[ImageList], torch.Tensor]] = None) -> SceneData:
    """Loads one split of an LLFF scene.

    Poses are reordered from LLFF [down, right, back] to OpenGL [right, up, back]
    camera axes, translations and bounds are scaled by ``1 / (0.75 * bounds.min())`` and
    all poses (of every split) are expressed in the frame of their average pose
    (``recenter_poses``), so splits share one world frame. The focal of each image is
    its original focal divided by the actual downsampling factor, original H over the
    image height (which must be within 5% of ``factor``).

    Splits: test = indices ``0, holdout, 2 * holdout, ...``, train = the others; ``val``
    is the test set.

    Bounds and box:
      * ``ndc=True``: ``near, far = 0, 1`` (NDC ray parameter), ``ndc`` is set with the
        focal of image 0 and near plane 1, and ``aabb`` is the NDC cube with x, y widened
        to hold every ray of every camera of the scene (``ndc_xy_extent``; z is [-1, 1]
        for every ray). Only the average camera sees exactly [-1, 1]^2: the rays of
        rotated and translated cameras leave it (on fern up to |x| = 1.44, |y| = 1.30,
        giving [-1.45, 1.45] x [-1.3, 1.3] x [-1, 1]), and content there would be lost.
      * ``ndc=False``: ``near = 0.9 * bounds.min()``, ``far = bounds.max()`` (reference
        ``no_ndc`` values, depths after rescaling) and ``aabb`` is the box around the
        view frusta of all cameras between depths ``near * cos(corner angle)`` and
        ``far``, so it holds every sample whether ``near``/``far`` are read as depths or
        as distances along unit directions.

    Args:
        root: scene folder holding ``poses_bounds.npy`` and ``images_{factor}/``
            (``images/`` for factor 1 when ``images_1/`` is absent).
        split: ``"train"``, ``"val"`` or ``"test"``.
        factor: downsampling factor naming the image folder.
        holdout: test-view stride (>= 1).
        ndc: use normalised device coordinates.
        background: (3,) RGB in [0, 1] that RGBA images are composited onto.
        pixels: where the decoded images go: ``pixels(image_list) -> (M, H, W, 3)``
            float32 tensor (e.g. a memory-mapped cache built image by image, see
            ``distnerf.sampler.cache.PixelCache``); default: decoded into RAM.

    Returns:
        SceneData with images (M, H, W, 3) float32 and c2w (M, 3, 4) float32 OpenGL.

    Raises:
        MissingDatasetFile (a DatasetError and a FileNotFoundError): the image folder or ``poses_bounds.npy`` is missing.
        DatasetError: image count differs from the pose rows, images differ in size,
            the factor does not match, non-finite or non-positive values in a row, an
            empty split.
        ValueError: bad ``split``, ``factor`` or ``holdout``.
    """
    root = Path(root)
    if split not in ("train", "val", "test"):
        raise ValueError(f"LLFF split must be train, val or test, got {split!r}")
    if int(factor) != factor or factor < 1 or int(holdout) != holdout or holdout < 1:
        raise ValueError(f"factor and holdout must be positive integers, got {factor}, {holdout}")
    poses_path = root / "poses_bounds.npy"
    image_dir = root / f"images_{factor}"
    if factor == 1 and not image_dir.is_dir():
        image_dir = root / "images"
    for path, is_there in ((poses_path, poses_path.is_file()), (image_dir, image_dir.is_dir())):
        if not is_there:
            raise MissingDatasetFile(f"LLFF scene {root}: {path} not found")
    poses, bounds = _read_poses_bounds(poses_path)
    paths = sorted(p for p in image_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if len(paths) != len(poses):
        names = ", ".join(p.name for p in paths[:5]) + (", ..." if len(paths) > 5 else "")
        raise DatasetError(f"{len(paths)} images in {image_dir} ({names}) but {len(poses)} "
                           f"rows in {poses_path}")
    height, width = read_image_size(paths[0])
    for path in paths[1:]:
        if read_image_size(path) != (height, width):
            size = read_image_size(path)
            raise DatasetError(f"image {path} is {size[1]}x{size[0]} (WxH) but {paths[0]} is "
                               f"{width}x{height}")

    orig_h, orig_w = poses[0, 0, 4], poses[0, 1, 4]
    scale = orig_h / height  # actual downsampling factor
    if abs(scale / factor - 1.0) > 0.05 or abs(orig_w / width / scale - 1.0) > 0.01:
        raise DatasetError(f"{image_dir}: images are {width}x{height} (WxH) but {poses_path} "
                           f"gives originals of {orig_w:g}x{orig_h:g}, not a factor {factor}")
    focal = poses[:, 2, 4] / scale

    # LLFF [down, right, back] -> OpenGL [right, up, back] camera axes.
    c2w = np.concatenate([poses[:, :, 1:2], -poses[:, :, 0:1], poses[:, :, 2:4]], axis=-1)
    sc = 1.0 / (bounds.min() * BOUND_FACTOR)
    c2w[:, :, 3] *= sc
    bounds = bounds * sc
    c2w = recenter_poses(c2w)

    test = np.arange(0, len(c2w), holdout)
    index = test if split in ("test", "val") else np.setdiff1d(np.arange(len(c2w)), test)
    if len(index) == 0:
        raise DatasetError(f"LLFF scene {root}: split {split!r} is empty with {len(c2w)} "
                           f"images and holdout {holdout}")
    background = tuple(float(c) for c in background)
    image_list = ImageList([paths[i] for i in index], Composite(background),
                           label=IndexLabel(f"{image_dir} image ", [int(i) for i in index]),
                           recipe=f"llff v1 background={background}")
    images = torch.from_numpy(image_list.decode_all()) if pixels is None else pixels(image_list)
    full = lambda a: torch.full((len(index),), a, dtype=torch.float32)  # noqa: E731
    cameras = Cameras(c2w=torch.from_numpy(c2w[index].astype(np.float32)),
                      fx=torch.from_numpy(focal[index].astype(np.float32)),
                      fy=torch.from_numpy(focal[index].astype(np.float32)),
                      cx=full(width / 2.0), cy=full(height / 2.0), width=width, height=height)
    if ndc:
        ndc_params = NDCParams(float(focal[0]), width, height, NDC_NEAR_PLANE)
        near, far = 0.0, 1.0
        ext_x, ext_y = ndc_xy_extent(c2w, focal, ndc_params)
        aabb = torch.tensor([[-ext_x, -ext_y, -1.0], [ext_x, ext_y, 1.0]], dtype=torch.float32)
    else:
        ndc_params = None
        near, far = float(bounds.min() * 0.9), float(bounds.max())
        aabb = torch.from_numpy(frustum_box(c2w, focal, width, height, near, far)
                                .astype(np.float32))
    return SceneData(split=split, images=images, cameras=cameras,
                     near=near, far=far, aabb=aabb,
                     background=torch.tensor(background, dtype=torch.float32).reshape(3),
                     ndc=ndc_params, image_paths=[str(paths[i]) for i in index],
                     source=str(root))


def _read_poses_bounds(path: Path):
    """(N, 3, 5) float64 poses and (N, 2) float64 bounds, validated row by row."""
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise DatasetError(f"cannot read {path}: {err}") from err
    if array.ndim != 2 or array.shape[1] != 17 or len(array) == 0:
        raise DatasetError(f"{path}: expected an (N, 17) array, got {array.shape}")
    array = array.astype(np.float64)
    for row, values in enumerate(array):
        if not np.isfinite(values).all():
            raise DatasetError(f"{path}: row {row} has non-finite values")
        if (values[15:] <= 0).any() or (values[[4, 9, 14]] <= 0).any():
            raise DatasetError(f"{path}: row {row} has non-positive bounds or H/W/focal")
    return array[:, :15].reshape(-1, 3, 5), array[:, 15:]


def _normalize(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def average_pose(c2w: np.ndarray) -> np.ndarray:
    """Average camera (reference ``poses_avg``): mean centre, summed back and up axes.

    Args:
        c2w: (N, 3, 4) camera-to-world, OpenGL.

    Returns:
        (3, 4) rigid camera-to-world.
    """
    center = c2w[:, :, 3].mean(0)
    back = _normalize(c2w[:, :, 2].sum(0))
    right = _normalize(np.cross(c2w[:, :, 1].sum(0), back))
    up = _normalize(np.cross(back, right))
    return np.stack([right, up, back, center], axis=1)


def recenter_poses(c2w: np.ndarray) -> np.ndarray:
    """Expresses poses in the frame of their average pose (reference ``recenter_poses``).

    Args:
        c2w: (N, 3, 4) camera-to-world.

    Returns:
        (N, 3, 4) ``inv(average) @ c2w``.
    """
    bottom = np.array([0.0, 0.0, 0.0, 1.0])
    avg = np.concatenate([average_pose(c2w), bottom[None]], 0)
    full = np.concatenate([c2w, np.broadcast_to(bottom, (len(c2w), 1, 4))], 1)
    return (np.linalg.inv(avg) @ full)[:, :3, :]


def frustum_box(c2w: np.ndarray, focal: np.ndarray, width: int, height: int,
                near: float, far: float) -> np.ndarray:
    """Box around the view frusta of all cameras between two depths.

    Corner rays ``d = R [(u - W/2) / f, -(v - H/2) / f, -1]`` at the image corners are cut
    at depths ``near * min cos`` (``cos = 1 / |d|``) and ``far``; the frustum section is
    the convex hull of these points.

    Returns:
        (2, 3) float64 [min, max] in world units.
    """
    corners = np.array([[-width, -height], [width, -height], [-width, height],
                        [width, height]], dtype=np.float64) / 2.0
    points = []
    for pose, f in zip(c2w, focal):
        dirs = np.stack([corners[:, 0] / f, -corners[:, 1] / f, -np.ones(4)], -1)
        near_depth = near / np.linalg.norm(dirs, axis=-1).max()
        world = dirs @ pose[:, :3].T
        points += [pose[:, 3] + world * near_depth, pose[:, 3] + world * far]
    points = np.concatenate(points)
    return np.stack([points.min(0), points.max(0)])


def ndc_xy_extent(c2w: np.ndarray, focal: np.ndarray, ndc: NDCParams,
                  step: float = 0.05) -> tuple[float, float]:
    """Half-extents in NDC x and y of all rays of the given cameras.

    A ray ``o + t d`` is moved to the plane ``z = -near_plane`` and warped (NeRF,
    Appendix C) to ``o' + t' d'``, t' in [0, 1], with ``o'_x = -f / (W / 2) * o_x / o_z``
    and ``o'_x + d'_x = -f / (W / 2) * d_x / d_z`` (y likewise with H). NDC points are
    linear in t' and both endpoints are linear-fractional in the pixel position, so the
    extremes lie at the image corners at t' = 0 or 1.

    Args:
        c2w: (N, 3, 4) camera-to-world, OpenGL, all rays looking forward (d_z < 0).
        focal: (N,) focal lengths in pixels (principal point at the image centre).
        ndc: the NDC warp.
        step: the extents are rounded up to a multiple of ``step``.

    Returns:
        (x, y) half-extents, at least 1.
    """
    half_w, half_h = ndc.width / 2.0, ndc.height / 2.0
    u = np.array([-half_w, half_w, -half_w, half_w])
    v = np.array([-half_h, -half_h, half_h, half_h])
    scale = np.array([ndc.focal / half_w, ndc.focal / half_h])
    extent = np.ones(2)
    for pose, f in zip(c2w, focal):
        dirs = np.stack([u / f, -v / f, -np.ones(4)], -1) @ pose[:, :3].T
        origins = pose[:, 3] + (-(ndc.near_plane + pose[2, 3]) / dirs[:, 2:]) * dirs
        start = np.abs(scale * origins[:, :2] / origins[:, 2:]).max(0)
        end = np.abs(scale * dirs[:, :2] / dirs[:, 2:]).max(0)
        extent = np.maximum(extent, np.maximum(start, end))
    x, y = np.ceil(extent / step - 1e-6) * step
    return float(x), float(y)
