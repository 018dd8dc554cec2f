"""Writing a procedural scene to disk, and the scene cache.

:func:`ensure_scene` renders a scene once into a cache directory and every later call
(from any rank) reuses it. The ``"objects"`` and ``"detail"`` scenes are written in the nerf_synthetic
("Blender") layout::

    <root>/transforms_{train,val,test}.json
    <root>/{train,val,test}/r_<i>.png      RGBA, 8 bit, straight (not premultiplied) alpha
    <root>/scene.json                      kind, version, light, ambient and primitives
    <root>/.complete                       completion marker (:data:`MARKER`), written last

``transform_matrix`` of each frame is its (4, 4) ``c2w``, OpenGL convention; the
transforms files also carry ``near``, ``far``, ``aabb`` (world units) and ``world_up``
(+Y). PNG values are ``round(255 * clip(rgba, 0, 1))`` of the rendered float RGBA.

The cities (``"city_small"``, ``"city"``) put all their images in ``images/`` and
describe them three times (Blender ``transforms_{train,val,test}.json``, nerfstudio
``transforms.json``, COLMAP ``sparse/0/``), with ``appearance.json``,
``colmap_from_scene.json``, ``scene.json`` (which also holds the sky, the image size and
the cameras) and the marker: see :mod:`~distnerf.data.synthetic.formats`.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Optional

import imageio.v3 as iio
import numpy as np

from distnerf.fileio import exclusive_lock
from distnerf.data.synthetic.formats import write_city
from distnerf.data.synthetic.scenes import CITY_KINDS, SceneSpec, build_scene, image_size, split_counts
from distnerf.data.synthetic.tracer import render_view

#: Bumped whenever the generated content changes; part of the scene root name.
VERSION = "v1"
#: Completion marker inside a finished scene root.
MARKER = ".complete"
SPLITS = ("train", "val", "test")

# Temp dirs of crashed generators older than this are removed (seconds).
_STALE_TEMP_AGE = 3600.0


def scene_name(kind: str, resolution: int, seed: int, num_train: int, num_val: int,
               num_test: int, appearance_jitter: bool = True) -> str:
    """Directory name of a generated scene; includes :data:`VERSION` and every parameter,
    e.g. ``objects_r100_s0_n60-8-20_v1``; cities add the appearance jitter (``j1`` on,
    ``j0`` off), e.g. ``city_small_r100_s0_n52-3-8_j1_v1``."""
    jitter = "" if kind not in CITY_KINDS else f"_j{int(bool(appearance_jitter))}"
    return f"{kind}_r{resolution}_s{seed}_n{num_train}-{num_val}-{num_test}{jitter}_{VERSION}"


def write_scene(spec: SceneSpec, out_dir: Path, resolution: int) -> None:
    """Renders every view of ``spec`` and writes its files into ``out_dir``.

    Args:
        spec: the scene.
        out_dir: existing directory to write into (not the marker; the caller adds it).
        resolution: image width in pixels (the height follows, see
            :func:`~distnerf.data.synthetic.scenes.image_size`).
    """
    out_dir = Path(out_dir)
    width, height = image_size(spec.kind, resolution)
    description = {"kind": spec.kind, "version": VERSION, "resolution": resolution,
                   "light_dir": spec.light_dir.tolist(), "ambient": spec.ambient,
                   "primitives": [p.to_json() for p in spec.primitives]}
    if spec.survey is not None:
        write_city(spec, out_dir, width, height)
        survey = spec.survey
        description.update(
            width=width, height=height, sky=spec.sky.to_json(), num_views=len(survey.c2w),
            cameras={str(k): {"angle_x": c.angle_x, "principal": list(c.principal),
                              "intrinsics": c.intrinsics(width, height).tolist()}
                     for k, c in survey.cameras.items()})
    else:
        _write_blender_splits(spec, out_dir, width, height)
    (out_dir / "scene.json").write_text(json.dumps(description, indent=1))


def _write_blender_splits(spec: SceneSpec, out_dir: Path, width: int, height: int) -> None:
    """The objects scene: one folder of RGBA images and one transforms file per split."""
    for split in SPLITS:
        (out_dir / split).mkdir(exist_ok=True)
        frames = []
        for i, c2w in enumerate(spec.c2w[split]):
            rgba = render_view(spec, c2w, width, height)
            iio.imwrite(out_dir / split / f"r_{i}.png",
                        np.round(np.clip(rgba, 0.0, 1.0) * 255.0).astype(np.uint8))
            frames.append({"file_path": f"./{split}/r_{i}", "rotation": 0.0,
                           "transform_matrix": c2w.tolist()})
        meta = {"camera_angle_x": spec.camera_angle_x, "near": spec.near, "far": spec.far,
                "aabb": spec.aabb.tolist(), "world_up": [0.0, 1.0, 0.0], "frames": frames}
        (out_dir / f"transforms_{split}.json").write_text(json.dumps(meta, indent=1))


def _remove_stale_temps(cache_dir: Path) -> None:
    """Best effort: deletes temp dirs of crashed generators older than an hour."""
    now = time.time()
    for path in cache_dir.glob(".tmp-*"):
        try:
            if path.is_dir() and now - path.stat().st_mtime > _STALE_TEMP_AGE:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def ensure_scene(cache_dir: str | os.PathLike, kind: str = "objects",
                 resolution: Optional[int] = None, num_train: Optional[int] = None,
                 num_val: Optional[int] = None, num_test: Optional[int] = None, seed: int = 0,
                 appearance_jitter: bool = True, num_views: Optional[int] = None) -> Path:
    """Returns the root of a generated scene, generating it on first use.

    The scene is rendered into a fresh temp dir inside ``cache_dir``, the completion
    marker is written last, and the dir is renamed to its final name in one atomic
    ``os.rename``; concurrent callers (several ranks) therefore never see a half-written
    scene, and they serialise on an ``flock`` of ``cache_dir/.<name>.lock``
    (:func:`distnerf.fileio.exclusive_lock`): the first generates, the others wait and
    use its copy, so the scene is rendered once however many ranks start. A root without
    the marker (not made by this function) is replaced.

    Args:
        cache_dir: directory holding generated scenes (created if missing).
        kind: ``"objects"`` (default, object-centred), ``"detail"`` (object-centred, smooth
            texture everywhere), ``"city_small"`` or ``"city"`` (aerial); see :mod:`~distnerf.data.synthetic.scenes`.
        resolution: image width in pixels (objects, detail: also the height; cities: height
            ``round(3 W / 4)``); default: the kind's (100, 200, 100, 160).
        num_train, num_val, num_test: objects, detail: views per split (default 60, 8, 20,
            resp. 100, 8, 25).
            Cities: ``num_val`` first test views are the val split (default 3);
            ``num_train`` and ``num_test`` follow from ``num_views`` and stay None.
        seed: layout and camera seed.
        appearance_jitter: cities: per-image exposure and white-balance gains (part of
            the scene name); ignored by the object-centred kinds.
        num_views: cities: keep the first ``num_views`` views of the flight (default all).

    Returns:
        ``cache_dir / scene_name(...)``, holding the files of the module docstring.

    Raises:
        ValueError: unknown ``kind``, ``resolution < 1``, ``seed < 0`` or bad view counts (see
            :func:`~distnerf.data.synthetic.scenes.split_counts`).
    """
    counts = split_counts(kind, num_train, num_val, num_test, num_views)
    width, _ = image_size(kind, resolution)
    if width < 1:
        raise ValueError(f"resolution must be >= 1, got {resolution}")
    if int(seed) < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    cache_dir = Path(cache_dir)
    root = cache_dir / scene_name(kind, width, int(seed), *counts[:3], appearance_jitter)
    if (root / MARKER).is_file():
        return root
    cache_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(cache_dir / f".{root.name}.lock", f"the built-in scene {root.name}"):
        if (root / MARKER).is_file():  # generated by another process (rank) while this one waited
            return root
        return _generate(cache_dir, root, build_scene(kind, num_train, num_val, num_test, seed, appearance_jitter,
                                                      num_views), width)


def _generate(cache_dir: Path, root: Path, spec: SceneSpec, width: int) -> Path:
    """Render ``spec`` into a temp dir of ``cache_dir`` and rename it to ``root`` (atomic)."""
    _remove_stale_temps(cache_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{root.name}-", dir=cache_dir))
    try:
        os.chmod(tmp, 0o755)
        write_scene(spec, tmp, width)
        (tmp / MARKER).write_text(json.dumps({"version": VERSION, "created": time.time()}))
        for _ in range(3):
            try:
                os.rename(tmp, root)  # atomic; fails if root is a non-empty directory
                return root
            except OSError:
                if (root / MARKER).is_file():  # another process finished first: use theirs
                    shutil.rmtree(tmp, ignore_errors=True)
                    return root
                if root.exists():  # incomplete root not made by us: move it aside
                    stale = cache_dir / f".tmp-stale-{root.name}-{uuid.uuid4().hex}"
                    try:
                        os.rename(root, stale)
                    except OSError:
                        pass
                    shutil.rmtree(stale, ignore_errors=True)
        raise OSError(f"could not move generated scene {tmp} to {root}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
