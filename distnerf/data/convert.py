"""Convert any dataset distnerf loads into a COLMAP text model or a nerfstudio ``transforms.json``.

    python -m distnerf.data.convert --to colmap|nerfstudio --out DIR [--link copy|symlink] [--overwrite] \\
        [dataset overrides, as for training]
    python -m distnerf.data.convert --to colmap --out /tmp/lego_colmap \\
        dataset=blender dataset.root=../shared/data/nerf_synthetic_half/lego

Legend: N images (every split's, each file once), C distinct cameras.

Every split (train, val when the dataset has one, test) is loaded as training would load
it (``load_scene``, so ``dataset.*`` overrides apply) without decoding pixels; an image
in several splits is written once. Output::

    DIR/images/<name>                    the image files as they are (alpha kept), copied
                                         (--link copy, the default) or absolute symlinks;
                                         <name> is the path below the images' common folder
    --to colmap:
    DIR/sparse/0/cameras.txt images.txt  written by pycolmap (also rigs.txt, frames.txt: COLMAP
                 points3D.txt             >= 3.12's trivial rigs, ignored by older readers);
                                         points3D.txt is empty: a conversion has no points
    DIR/test_list.txt val_list.txt       the test / val image names, for dataset.test_list= /
                                         dataset.val_list= of distnerf's COLMAP importer
    --to nerfstudio:
    DIR/transforms.json                  OpenGL c2w, intrinsics at the top level when every
                                         frame shares them (else per frame), train/val/test_filenames
    DIR/conversion.json                  what was converted: the dataset config, the splits,
                                         the scene transform, how the images were written

Conventions
-----------
* Poses are the loaded scene's: distnerf's scene frame, i.e. after a COLMAP/nerfstudio
  importer's normalisation (``dataset.normalize=false`` keeps the source's frame; the
  transform is in ``conversion.json``), LLFF's recentred poses. COLMAP gets
  ``cam_from_world`` (:func:`distnerf.data.normalize.cam_from_world_from_c2w`, the inverse
  of the COLMAP importer's ``c2w_from_cam_from_world``); nerfstudio the OpenGL c2w.
* Intrinsics in pixels with pixel centres at +0.5 in all three (distnerf, COLMAP,
  nerfstudio): ``fx fy cx cy`` are written unchanged. COLMAP camera model: ``PINHOLE``
  without distortion, ``OPENCV`` (k1 k2 p1 p2) when k3 = 0, else ``FULL_OPENCV`` (k3, with
  k4..k6 = 0; distnerf's importer does not read it). Images that share size, intrinsics
  and distortion share one COLMAP camera.
* The files must be the images the cameras describe: a ``dataset.downscale`` that
  shrinks images while decoding is refused (LLFF's ``dataset.factor`` reads shrunk files,
  which works). Near/far and the scene box are not written (neither format has them).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from distnerf.data import load_scene
from distnerf.data.images import read_image_size, undecoded
from distnerf.data.poses import cam_from_world_from_c2w

FORMATS = ("colmap", "nerfstudio")
LINKS = ("copy", "symlink")
SPLITS = ("train", "val", "test")
DISTORTION_KEYS = ("k1", "k2", "p1", "p2", "k3")   # Cameras.distortion's order
CONF = Path(__file__).resolve().parents[2] / "conf"


@dataclass
class Capture:
    """Every image of a dataset, once, with its camera.

    Attributes:
        names: (N,) image names (posix paths below ``DIR/images``).
        files: (N,) source image files.
        c2w: (N, 3, 4) float64 camera-to-world, OpenGL, scene frame.
        intrinsics: (N, 4) float64 ``fx, fy, cx, cy`` in pixels.
        distortion: (N, 5) float64 ``k1, k2, p1, p2, k3`` (zeros: none).
        sizes: (N, 2) int64 ``(height, width)``.
        splits: split name -> sorted indices into the above.
        transform: the scene's ``SceneData.transform`` (None: the dataset's own frame).
    """

    names: list
    files: list
    c2w: np.ndarray
    intrinsics: np.ndarray
    distortion: np.ndarray
    sizes: np.ndarray
    splits: dict = field(default_factory=dict)
    transform: Optional[dict] = None


def read_capture(cfg_dataset) -> Capture:
    """Every split of ``cfg_dataset`` (a ``load_scene`` mapping), images deduplicated by file.

    Raises:
        ValueError: an image file whose size differs from its camera's (a decoding
            ``downscale``), or one file with two different cameras.
        FileNotFoundError, DatasetError: from the parsers (a missing val split is skipped).
    """
    rows: dict = {}   # resolved file -> [file, c2w, intrinsics, distortion, size], in first-seen order
    position: dict = {}  # resolved file -> its index in rows
    splits: dict = {}
    transform = None
    for split in SPLITS:
        try:
            scene = load_scene(cfg_dataset, split, pixels=undecoded)
        except FileNotFoundError:
            if split == "val":  # e.g. a Blender scene without transforms_val.json
                continue
            raise
        cams = scene.cameras
        transform = scene.transform
        dist = np.zeros((len(cams), 5)) if cams.distortion is None else cams.distortion.double().numpy()
        splits[split] = []
        for i, path in enumerate(scene.image_paths):
            key = str(Path(path).resolve())
            row = [Path(os.path.abspath(path)), cams.c2w[i].double().numpy(),
                   np.array([cams.fx[i], cams.fy[i], cams.cx[i], cams.cy[i]], dtype=np.float64), dist[i],
                   np.array(cams.size(i), dtype=np.int64)]
            if key in rows:
                if not all(np.allclose(a, b, atol=1e-6) for a, b in zip(rows[key][1:], row[1:])):
                    raise ValueError(f"{path} is in several splits with different cameras")
            else:
                position[key], rows[key] = len(rows), row
            splits[split].append(position[key])
    files = [row[0] for row in rows.values()]
    for path, row in zip(files, rows.values()):
        stored = read_image_size(path)
        if stored != tuple(int(x) for x in row[4]):
            raise ValueError(f"{path} is {stored[1]}x{stored[0]} (WxH) but its camera is {row[4][1]}x{row[4][0]}: "
                             f"the dataset shrinks images while decoding (dataset.downscale); convert with "
                             f"dataset.downscale=1")
    common = Path(os.path.commonpath([str(p.parent) for p in files]))
    stack = lambda k: np.stack([row[k] for row in rows.values()])  # noqa: E731
    return Capture(names=[p.relative_to(common).as_posix() for p in files], files=files, c2w=stack(1),
                   intrinsics=stack(2), distortion=stack(3), sizes=stack(4),
                   splits={k: sorted(set(v)) for k, v in splits.items()}, transform=transform)


def write_images(capture: Capture, out: Path, link: str) -> None:
    """``out/images/<name>`` for every image: a copy or an absolute symlink."""
    for name, source in zip(capture.names, capture.files):
        target = out / "images" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.exists():
            target.unlink()
        if link == "symlink":
            target.symlink_to(source.resolve())
        else:
            shutil.copyfile(source, target)


def colmap_camera(intrinsics, distortion) -> tuple:
    """``(model, params)`` of one COLMAP camera (see the module docstring)."""
    k1, k2, p1, p2, k3 = (float(x) for x in distortion)
    pinhole = [float(x) for x in intrinsics]
    if not any((k1, k2, p1, p2, k3)):
        return "PINHOLE", pinhole
    if k3 == 0.0:
        return "OPENCV", pinhole + [k1, k2, p1, p2]
    return "FULL_OPENCV", pinhole + [k1, k2, p1, p2, k3, 0.0, 0.0, 0.0]


def write_colmap(capture: Capture, out: Path) -> None:
    """``out/sparse/0/*.txt`` through pycolmap, and the split lists."""
    try:
        import pycolmap
    except ImportError as err:
        raise ImportError("--to colmap needs pycolmap: pip install 'distnerf[colmap]' (or pip install pycolmap)") \
            from err
    rec = pycolmap.Reconstruction()
    camera_ids: dict = {}
    poses = cam_from_world_from_c2w(capture.c2w)
    for i, name in enumerate(capture.names):
        model, params = colmap_camera(capture.intrinsics[i], capture.distortion[i])
        height, width = (int(x) for x in capture.sizes[i])
        key = (model, width, height, tuple(params))
        if key not in camera_ids:
            camera_ids[key] = len(camera_ids) + 1
            rec.add_camera_with_trivial_rig(pycolmap.Camera(model=model, width=width, height=height, params=params,
                                                            camera_id=camera_ids[key]))
        rec.add_image_with_trivial_frame(pycolmap.Image(name=name, camera_id=camera_ids[key], image_id=i + 1),
                                         pycolmap.Rigid3d(poses[i]))
    model_dir = out / "sparse" / "0"
    model_dir.mkdir(parents=True, exist_ok=True)
    rec.write_text(str(model_dir))
    for split in ("test", "val"):
        if split in capture.splits:
            (out / f"{split}_list.txt").write_text("".join(f"{capture.names[i]}\n" for i in capture.splits[split]))


def nerfstudio_meta(capture: Capture) -> dict:
    """The ``transforms.json`` content (see the module docstring)."""
    def camera(i: int) -> dict:
        fx, fy, cx, cy = (float(x) for x in capture.intrinsics[i])
        values = {"fl_x": fx, "fl_y": fy, "cx": cx, "cy": cy, "w": int(capture.sizes[i][1]),
                  "h": int(capture.sizes[i][0])}
        if np.any(capture.distortion != 0):
            values.update({k: float(v) for k, v in zip(DISTORTION_KEYS, capture.distortion[i])})
        return values

    cameras = [camera(i) for i in range(len(capture.names))]
    shared = all(c == cameras[0] for c in cameras)
    file_paths = [f"images/{name}" for name in capture.names]
    frames = []
    for i, path in enumerate(file_paths):
        c2w = np.concatenate([capture.c2w[i], [[0.0, 0.0, 0.0, 1.0]]])
        frames.append({"file_path": path, "transform_matrix": c2w.tolist(), **({} if shared else cameras[i])})
    return {"camera_model": "OPENCV", **(cameras[0] if shared else {}), "frames": frames,
            **{f"{split}_filenames": [file_paths[i] for i in index] for split, index in capture.splits.items()}}


def convert(cfg_dataset, to: str, out, link: str = "copy", overwrite: bool = False) -> Capture:
    """Writes ``cfg_dataset``'s images and cameras into ``out`` in format ``to``.

    Args:
        cfg_dataset: a ``load_scene`` mapping (``name``, ``root``, ...).
        to: ``"colmap"`` or ``"nerfstudio"``.
        out: the output folder (created).
        link: ``"copy"`` or ``"symlink"`` (absolute) for the image files.
        overwrite: write into a non-empty ``out`` (files of the same names are replaced).

    Returns:
        The capture written.

    Raises:
        ValueError: bad ``to``/``link``, a non-empty ``out`` without ``overwrite``; and
            see :func:`read_capture`.
    """
    if to not in FORMATS or link not in LINKS:
        raise ValueError(f"--to must be one of {list(FORMATS)} and --link one of {list(LINKS)}, got "
                         f"{to!r}, {link!r}")
    out = Path(out)
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"{out} is not empty (pass --overwrite to write into it)")
    capture = read_capture(cfg_dataset)
    out.mkdir(parents=True, exist_ok=True)
    write_images(capture, out, link)
    if to == "colmap":
        write_colmap(capture, out)
    else:
        (out / "transforms.json").write_text(json.dumps(nerfstudio_meta(capture), indent=1))
    from omegaconf import OmegaConf

    source = OmegaConf.to_container(OmegaConf.create(cfg_dataset), resolve=True)
    if source.get("root"):
        source["root"] = os.path.abspath(source["root"])
    (out / "conversion.json").write_text(json.dumps({
        "to": to, "dataset": source, "images": {"copy": "copied", "symlink": "symlinked"}[link],
        "num_images": len(capture.names), "splits": {k: len(v) for k, v in capture.splits.items()},
        "points3D": "none (a conversion has no sparse points)" if to == "colmap" else None,
        "frame": "the loaded scene's (distnerf's scene frame); scene_transform maps the dataset's into it",
        "scene_transform": capture.transform}, indent=1))
    return capture


def compose_dataset(overrides: Sequence[str]):
    """The validated ``dataset`` config of ``conf/`` with ``overrides`` (``dataset=...``, ``dataset.KEY=...``).

    Raises:
        ValueError: an override of another group.
    """
    from hydra import compose, initialize_config_dir

    from distnerf.config_check import section

    others = [o for o in overrides if not o.lstrip("+~").startswith("dataset")]
    if others:
        raise ValueError(f"only dataset overrides are read (dataset=NAME, dataset.KEY=VALUE), got "
                         f"{' '.join(others)}")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return section("dataset", compose("train", overrides=list(overrides)).dataset)


def main(argv: Sequence[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m distnerf.data.convert", description=__doc__.split("\n")[0])
    parser.add_argument("--to", required=True, choices=FORMATS)
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--link", default="copy", choices=LINKS, help="copy the images (default) or symlink them")
    parser.add_argument("--overwrite", action="store_true", help="write into a non-empty --out")
    parser.add_argument("overrides", nargs="*", help="dataset overrides, e.g. dataset=blender dataset.root=PATH")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    capture = convert(compose_dataset(args.overrides), args.to, args.out, args.link, args.overwrite)
    print(f"{args.out}: {len(capture.names)} images ({', '.join(f'{k} {len(v)}' for k, v in capture.splits.items())})"
          f" as {args.to}")
    return args.out


if __name__ == "__main__":
    try:
        main()
    except ValueError as err:
        raise SystemExit(f"distnerf.data.convert: {err}") from None
