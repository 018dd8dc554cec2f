"""COLMAP sparse-model importer (``dataset=colmap dataset.root=PATH``).

Legend: N registered images of the model, M images of the split, P sparse points.

Layout::

    ROOT/sparse/0/{cameras,images,points3D}.{bin,txt}   (or ROOT/sparse/ directly)
    ROOT/images/<name>                                  (the model's image names)
    ROOT/images_<N>/<name>                              (optional, shrunk by N)

The model is read with ``pycolmap`` (binary or text; the ``colmap`` extra), never parsed
by hand.

Conventions
-----------
* Poses: COLMAP's ``cam_from_world`` (world-to-camera, OpenCV camera axes x right,
  y down, z forward) becomes distnerf's OpenGL ``c2w`` by
  :func:`distnerf.data.normalize.c2w_from_cam_from_world`.
* Pixels: COLMAP puts the image's top-left corner at (0, 0) and pixel centres at
  +0.5 (the top-left pixel's centre is (0.5, 0.5)), as distnerf does (``base.py``:
  pixel (u, v) has its centre at (u + 0.5, v + 0.5), ``cx, cy`` from the top-left
  corner), so ``cx, cy`` are used unchanged.
* Camera models: ``SIMPLE_PINHOLE`` (f, cx, cy), ``PINHOLE`` (fx, fy, cx, cy),
  ``SIMPLE_RADIAL`` (f, cx, cy, k), ``RADIAL`` (f, cx, cy, k1, k2) and ``OPENCV``
  (fx, fy, cx, cy, k1, k2, p1, p2) map onto ``Cameras.distortion`` = (k1, k2, p1, p2,
  k3) with the unused ones 0 (k3 is always 0: none of these models has it); COLMAP's
  radial-tangential formula is the one of ``Cameras``. All zero in a split: None.
* Downscale N: images from ``images_N/`` when that folder exists (within one pixel of
  ``size / N``), else ``images/`` area-shrunk to ``size // N``; intrinsics are scaled by
  the actual ratio of the sizes, per axis (distortion acts on normalised coordinates
  and is unchanged).
* Scene frame, box and ray bounds: :func:`distnerf.data.normalize.place_capture` with
  the sparse points (per image: the points its POINTS2D observe); a model without points
  (``distnerf.data.convert``'s) gets them from the cameras alone, as the nerfstudio
  importer does.
* Split: test = every ``holdout``-th image sorted by name (0, N, 2N, ...: the LLFF
  protocol) or the names of ``test_list``; val = the names of ``val_list``, else test;
  train = every other image.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from distnerf.data.base import DatasetError, SceneData
from distnerf.data.capture import (CaptureImages, NameLabel, capture_scene, downscale_folder, every_nth,
                                   read_name_list, scaled_size, split_indices)
from distnerf.data.images import ImageList, read_image_size
from distnerf.data.llff import IMAGE_SUFFIXES
from distnerf.data.normalize import MIN_POINTS, half_fov, place_capture
from distnerf.data.poses import c2w_from_cam_from_world

log = logging.getLogger("distnerf")

SUPPORTED_MODELS = ("SIMPLE_PINHOLE", "PINHOLE", "SIMPLE_RADIAL", "RADIAL", "OPENCV")


def camera_intrinsics(model: str, params: Sequence[float]) -> tuple:
    """``(fx, fy, cx, cy, (k1, k2, p1, p2, k3))`` of a COLMAP camera in pixels.

    Args:
        model: COLMAP model name, one of ``SUPPORTED_MODELS``.
        params: the model's parameter list in COLMAP's order.

    Raises:
        KeyError: an unsupported model.
    """
    p = [float(x) for x in params]
    if model == "SIMPLE_PINHOLE":
        return p[0], p[0], p[1], p[2], (0.0,) * 5
    if model == "PINHOLE":
        return p[0], p[1], p[2], p[3], (0.0,) * 5
    if model == "SIMPLE_RADIAL":
        return p[0], p[0], p[1], p[2], (p[3], 0.0, 0.0, 0.0, 0.0)
    if model == "RADIAL":
        return p[0], p[0], p[1], p[2], (p[3], p[4], 0.0, 0.0, 0.0)
    if model == "OPENCV":
        return p[0], p[1], p[2], p[3], (p[4], p[5], p[6], p[7], 0.0)
    raise KeyError(model)


def find_model(root: Path) -> Path:
    """``ROOT/sparse/0`` or ``ROOT/sparse``: the first holding a ``cameras`` file.

    Raises:
        DatasetError: neither (names both places).
    """
    candidates = [root / "sparse" / "0", root / "sparse"]
    for folder in candidates:
        if any((folder / f"cameras.{ext}").is_file() for ext in ("bin", "txt")):
            return folder
    raise DatasetError(f"COLMAP scene {root}: no sparse model (cameras.bin or cameras.txt) in "
                            f"{candidates[0]} or {candidates[1]}; dataset.root must be the folder holding sparse/")


def _model_file(model_dir: Path, stem: str) -> Path:
    binary = model_dir / f"{stem}.bin"
    return binary if binary.is_file() else model_dir / f"{stem}.txt"


def read_reconstruction(model_dir: Path):
    """The ``pycolmap.Reconstruction`` of a model folder.

    Raises:
        ImportError: pycolmap missing (names the extra to install).
        DatasetError: pycolmap cannot read it (names the folder and its message).
    """
    try:
        import pycolmap
    except ImportError as err:
        raise ImportError("dataset=colmap needs pycolmap: pip install 'distnerf[colmap]' (or pip install "
                          "pycolmap)") from err
    try:
        return pycolmap.Reconstruction(str(model_dir))
    except Exception as err:  # pycolmap raises ValueError/RuntimeError with COLMAP's check message
        raise DatasetError(f"cannot read the COLMAP model in {model_dir}: {err}") from err


@dataclass
class ColmapModel:
    """The registered images of a COLMAP model, sorted by name, in COLMAP's world frame.

    Attributes:
        model_dir: the model folder.
        names: (N,) image names (paths relative to the image folder).
        c2w: (N, 3, 4) float64 camera-to-world, OpenGL, COLMAP world units.
        intrinsics: (N, 4) float64 fx, fy, cx, cy at the camera's full size.
        distortion: (N, 5) float64 (k1, k2, p1, p2, k3).
        sizes: (N, 2) int64 (height, width) of each image's camera.
        camera_ids: (N,) COLMAP camera id of each image.
        points: (P, 3) float64 sparse points.
        observed: N arrays (P_i, 3), the points each image's POINTS2D observe.
    """

    model_dir: Path
    names: list
    c2w: np.ndarray
    intrinsics: np.ndarray
    distortion: np.ndarray
    sizes: np.ndarray
    camera_ids: list
    points: np.ndarray
    observed: list


def read_model(root) -> ColmapModel:
    """Reads and checks ``ROOT``'s sparse model.

    Raises:
        DatasetError: no sparse model (names where it looked), unreadable, no registered
            images, an unsupported camera model (names it, the camera id and the cameras
            file), a non-finite pose (names the image and the images file).
    """
    model_dir = find_model(Path(root))
    rec = read_reconstruction(model_dir)
    cameras_file, images_file = _model_file(model_dir, "cameras"), _model_file(model_dir, "images")
    images = sorted((im for im in rec.images.values() if _registered(im)), key=lambda im: im.name)
    if not images:
        raise DatasetError(f"COLMAP model {model_dir} has no registered images ({rec.num_images()} images in "
                           f"{images_file}, none with a pose): run the mapper again, or point dataset.root at "
                           f"another reconstruction")
    unposed = rec.num_images() - len(images)
    if unposed:
        log.info("colmap %s: %d image(s) of the model are not registered (no pose), not used", model_dir, unposed)

    cams = {}
    for camera_id, cam in rec.cameras.items():
        model = cam.model.name
        if model not in SUPPORTED_MODELS:
            raise DatasetError(f"{cameras_file}: camera {camera_id} has model {model}, not supported (supported: "
                               f"{', '.join(SUPPORTED_MODELS)}); undistort the images first (colmap "
                               f"image_undistorter) or calibrate with OPENCV")
        fx, fy, cx, cy, dist = camera_intrinsics(model, cam.params)
        if not (np.isfinite([fx, fy, cx, cy, *dist]).all() and fx > 0 and fy > 0):
            raise DatasetError(f"{cameras_file}: camera {camera_id} has bad parameters {list(cam.params)}")
        cams[camera_id] = ((fx, fy, cx, cy), dist, (int(cam.height), int(cam.width)))

    w2c = np.stack([_cam_from_world(im).matrix() for im in images])
    for im, pose in zip(images, w2c):
        if not np.isfinite(pose).all():
            raise DatasetError(f"{images_file}: image {im.name} (id {im.image_id}) has a non-finite pose "
                               f"{pose.tolist()}; remove it from the model")

    point_ids = np.array(sorted(rec.points3D.keys()), dtype=np.int64)
    points = np.array([rec.points3D[int(i)].xyz for i in point_ids], dtype=np.float64).reshape(-1, 3)
    observed = []
    for im in images:
        ids = np.array([p.point3D_id for p in _observations(im)], dtype=np.int64)
        rows = np.searchsorted(point_ids, ids)
        rows = rows[(rows < len(point_ids)) & (point_ids[np.minimum(rows, len(point_ids) - 1)] == ids)]
        observed.append(points[rows])

    return ColmapModel(model_dir=model_dir, names=[im.name for im in images], c2w=c2w_from_cam_from_world(w2c),
                       intrinsics=np.array([cams[im.camera_id][0] for im in images], dtype=np.float64),
                       distortion=np.array([cams[im.camera_id][1] for im in images], dtype=np.float64),
                       sizes=np.array([cams[im.camera_id][2] for im in images], dtype=np.int64),
                       camera_ids=[int(im.camera_id) for im in images], points=points, observed=observed)


# pycolmap 3.11 (the oldest the colmap extra allows) and 3.12+ spell a few things differently.
def _registered(image) -> bool:
    return image.has_pose if hasattr(image, "has_pose") else bool(image.registered)


def _cam_from_world(image):
    pose = image.cam_from_world
    return pose() if callable(pose) else pose  # a method from pycolmap 3.12


def _observations(image):
    if hasattr(image, "get_observation_points2D"):
        return image.get_observation_points2D()
    return [p for p in image.points2D if p.has_point3D()]


def check_image_folder(model: ColmapModel, image_dir: Path, strict: bool) -> None:
    """Every model image is on disk; images on disk but not in the model are logged
    (a DatasetError with ``strict``).

    Raises:
        DatasetError: no image folder, model images missing from ``image_dir`` (names them and the folder);
            with ``strict``, files in ``image_dir`` that the model does not have.
    """
    if not image_dir.is_dir():
        raise DatasetError(f"COLMAP scene: image folder {image_dir} not found (the model is {model.model_dir}; "
                                f"set dataset.images to the folder's name)")
    missing = [name for name in model.names if not (image_dir / name).is_file()]
    if missing:
        shown = ", ".join(missing[:10]) + (", ..." if len(missing) > 10 else "")
        raise DatasetError(f"{len(missing)} image(s) of the model {model.model_dir} are missing from {image_dir}: "
                           f"{shown} (copy them there, or point dataset.images at the folder the model was built from)")
    known = set(model.names)
    extra = sorted(p.relative_to(image_dir).as_posix() for p in image_dir.rglob("*")
                   if p.suffix.lower() in IMAGE_SUFFIXES and p.relative_to(image_dir).as_posix() not in known)
    if extra:
        shown = ", ".join(extra[:10]) + (", ..." if len(extra) > 10 else "")
        message = f"{len(extra)} image(s) in {image_dir} are not registered in the model {model.model_dir}: {shown}"
        if strict:
            raise DatasetError(f"{message} (dataset.strict=true; remove them or set dataset.strict=false)")
        log.warning("colmap: %s (not used)", message)


def _in_root(path, root) -> Path:
    """A list file: relative names are looked up in the dataset root first (where
    ``distnerf.data.convert`` writes ``test_list.txt``), then in the current directory."""
    path = Path(path)
    if not path.is_absolute() and root is not None and (Path(root) / path).is_file():
        return Path(root) / path
    return path


def split_of(names: Sequence[str], split: str, holdout: int, test_list=None, val_list=None,
             where: str = "", root=None) -> list:
    """Indices of ``split`` among the sorted ``names`` (see the module docstring); relative
    list files are looked up in ``root`` first."""
    what = f"registered images of {where}"
    test = read_name_list(_in_root(test_list, root), names, what) if test_list else every_nth(len(names), holdout)
    val = read_name_list(_in_root(val_list, root), names, what) if val_list else None
    return split_indices(split, len(names), test, val, where=where)


def split_images(model: ColmapModel, index: Sequence[int], image_dir: Path, downscale: int,
                 prescaled: bool) -> CaptureImages:
    """The files, sizes and downscale factors of the images ``index``.

    ``image_dir`` is the folder read: with ``prescaled``, ``images_N/`` (shrunk copies,
    used as they are), else ``images/`` (full size, shrunk after decoding).

    Raises:
        DatasetError: an image's stored size differs from its camera's width/height
            (names both sizes and the camera), a wrong-sized pre-shrunk copy.
    """
    files = CaptureImages([], [], [], [], [])
    for i in index:
        name, full = model.names[i], tuple(int(x) for x in model.sizes[i])
        camera = f"camera {model.camera_ids[i]} of {_model_file(model.model_dir, 'cameras')}"
        path = image_dir / name
        size = scaled_size(path, full, downscale, prescaled, f"image {name}")
        if not prescaled:
            stored = read_image_size(path)
            if stored != full:
                raise DatasetError(f"image {path} is {stored[1]}x{stored[0]} (WxH) but its {camera} is "
                                   f"{full[1]}x{full[0]}; {image_dir.name}/ must hold the full-size images the "
                                   f"model was built from (shrunk copies go to {image_dir.name}_<N>/, selected "
                                   f"by dataset.downscale=N)")
        files.paths.append(path)
        files.read_sizes.append(size if prescaled else full)
        files.sizes.append(size)
        files.factors.append(1 if prescaled else downscale)
        files.expected.append(f"its size in {image_dir.name}/ (a shrunk copy checked against {camera})"
                              if prescaled else camera)
    return files


def load_colmap(root, split: str, downscale: int = 1, holdout: int = 8, test_list: Optional[str] = None,
                val_list: Optional[str] = None, normalize: bool = True, orient: str = "vertical",
                strict: bool = False, images: str = "images", background: Sequence[float] = (0.0, 0.0, 0.0),
                near: Optional[float] = None, far: Optional[float] = None, aabb=None,
                min_points: int = MIN_POINTS,
                pixels: Optional[Callable[[ImageList], torch.Tensor]] = None) -> SceneData:
    """Loads one split of a COLMAP capture (conventions: the module docstring).

    Args:
        root: the scene folder holding ``sparse/`` and the image folder.
        split: ``"train"``, ``"val"`` or ``"test"``.
        downscale: positive integer image shrink factor.
        holdout: test-view stride when there is no ``test_list``.
        test_list, val_list: optional text files of image names (one per line).
        normalize: move the scene into distnerf's frame (+Y up, centred, extent 1);
            False keeps COLMAP's frame.
        orient: up-axis estimate, ``"vertical"``, ``"up"`` or ``"none"``
            (:func:`distnerf.data.normalize.estimate_up`).
        strict: images on disk that the model lacks are an error (else a log line).
        images: name of the image folder under ``root``.
        background: (3,) RGB that RGBA images are composited onto.
        near, far: ray bounds replacing every camera's (scene units).
        aabb: (2, 3) scene box replacing the one from the points (scene frame).
        min_points: the fewest observed points for a camera's own bounds.
        pixels: where the decoded images go (see ``load_scene``); default: RAM.

    Returns:
        SceneData: images (M, H, W, 3) padded top-left to the largest size, ``cameras``
        with ``distortion``/``sizes``/``bounds``, ``mask`` (None without padding) and
        ``transform`` (None with ``normalize=False``).

    Raises:
        FileNotFoundError, DatasetError: see :func:`read_model`, :func:`check_image_folder`,
            :func:`split_images` and the split lists.
        ValueError: bad arguments.
    """
    root = Path(root)
    if not isinstance(downscale, (int, np.integer)) or downscale < 1:
        raise ValueError(f"downscale must be a positive integer, got {downscale!r}")
    model = read_model(root)
    shrunk = downscale_folder(root / images, downscale)
    image_dir = shrunk or root / images
    check_image_folder(model, image_dir, strict)
    where = f"COLMAP model {model.model_dir}"
    placed = place_capture(model.c2w, model.points, model.observed, source="colmap", normalize=normalize,
                           orient=orient, near=near, far=far, aabb=aabb, min_points=min_points,
                           half_angles=half_fov(model.intrinsics, model.sizes), where=where,
                           model=str(model.model_dir))
    index = split_of(model.names, split, holdout, test_list, val_list, where, root=root)
    files = split_images(model, index, image_dir, downscale, prescaled=shrunk is not None)
    return capture_scene(split, files, index, placed, model.intrinsics[index], model.sizes[index],
                         model.distortion[index], label=NameLabel(f"{where} image ", [model.names[i] for i in index]),
                         recipe="colmap v1", background=background, source=str(root), pixels=pixels)
