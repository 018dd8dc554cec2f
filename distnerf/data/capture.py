"""Pieces shared by the importers of real captures (COLMAP, nerfstudio): the train/val/test
split, images of several sizes in one padded pixel store, sampling masks, downscaled
image folders.

Legend: N images of the capture, M images of the split, H, W the split's largest image
size (the padded store), h, w one image's size.

Images of different sizes go top-left into an (M, H, W, 3) store (zeros elsewhere);
``Cameras.sizes`` holds each image's (h, w) and ``SceneData.mask`` is False on the
padding (and wherever a dataset mask excludes a pixel), so the sampler never draws a
padding pixel and evaluation crops each view to its own size.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from PIL import Image

from distnerf.data.base import Cameras, DatasetError, SceneData
from distnerf.data.images import ImageList, composite, downscale_image, read_image, read_image_size
from distnerf.data.normalize import Placement


# ----------------------------------------------------------------------------- split
def every_nth(count: int, holdout: int) -> list:
    """LLFF protocol: indices ``0, holdout, 2 * holdout, ...`` of ``count`` items (sorted by name)."""
    return list(range(0, count, int(holdout)))


def indices_of(wanted: Sequence[str], names: Sequence[str], where: str, what: str = "images") -> list:
    """Indices of ``wanted`` in ``names`` (sorted, duplicates once).

    Raises:
        DatasetError: names of ``wanted`` missing from ``names``, naming ``where`` and them.
    """
    position = {name: i for i, name in enumerate(names)}
    missing = [name for name in wanted if name not in position]
    if missing:
        shown = ", ".join(missing[:10]) + (f", ... ({len(missing)} in all)" if len(missing) > 10 else "")
        raise DatasetError(f"{where}: {len(missing)} name(s) not among the {len(names)} {what}: {shown}")
    return sorted({position[name] for name in wanted})


def read_name_list(path, names: Sequence[str], what: str) -> list:
    """Indices of the names listed in a text file (one per line; blank lines and ``#``
    comments skipped) among ``names``.

    Raises:
        DatasetError: no such file, or a listed name is not in ``names`` (names the file and them).
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"image list not found: {path} (a relative dataset.test_list / val_list is looked up "
                           f"in dataset.root, then in the current directory)")
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return indices_of([line for line in lines if line and not line.startswith("#")], names, str(path), what)


def split_indices(split: str, count: int, test: Sequence[int], val: Optional[Sequence[int]] = None,
                  train: Optional[Sequence[int]] = None, where: str = "") -> list:
    """The indices of ``split``: ``test``; ``val`` (``test`` when None); ``train`` (the
    images in neither test nor val when None).

    Raises:
        ValueError: an unknown split.
        DatasetError: the split is empty (names ``where``).
    """
    if split not in ("train", "val", "test"):
        raise ValueError(f"{where}: split must be train, val or test, got {split!r}")
    val = test if val is None else val
    if train is None:
        held = set(test) | set(val)
        train = [i for i in range(count) if i not in held]
    index = sorted(set({"train": train, "val": val, "test": test}[split]))
    if not index:
        raise DatasetError(f"{where}: split {split!r} is empty ({count} images; check holdout and the "
                           f"split lists)")
    return index


# ----------------------------------------------------------------------------- images
def downscale_folder(folder: Path, factor: int) -> Optional[Path]:
    """``<folder>_<factor>`` beside ``folder`` when ``factor > 1`` and it exists (COLMAP /
    nerfstudio / LLFF convention: pre-shrunk copies with the same file names), else None."""
    if factor == 1:
        return None
    candidate = folder.with_name(f"{folder.name}_{factor}")
    return candidate if candidate.is_dir() else None


def scaled_size(path: Path, full: tuple, factor: int, prescaled: bool, where: str) -> tuple:
    """The (h, w) an image has after downscaling by ``factor``.

    Args:
        path: the file read (in the ``_<factor>`` folder when ``prescaled``).
        full: (H, W) of the full-size image (its camera's size).
        factor: downscale factor.
        prescaled: ``path`` is an already shrunk copy: its header gives the size, which
            must be within one pixel of ``full / factor`` (tools round differently);
            else ``full // factor`` (what :func:`downscale_image` makes).

    Raises:
        DatasetError: a pre-shrunk copy of the wrong size (names it, both sizes, factor).
    """
    if not prescaled:
        return full[0] // factor, full[1] // factor
    size = read_image_size(path)
    if any(abs(s - f / factor) > 1.0 for s, f in zip(size, full)):
        raise DatasetError(f"{where}: {path} is {size[1]}x{size[0]} (WxH) but its camera is "
                           f"{full[1]}x{full[0]}: not a downscale by {factor} (remove {path.parent} "
                           f"to downscale the full-size images instead)")
    return size


class NameLabel:
    """``label(index)``: ``prefix`` followed by the image's name (picklable)."""

    def __init__(self, prefix: str, names: Sequence[str]):
        self.prefix, self.names = str(prefix), list(names)

    def __call__(self, index: int) -> str:
        return f"{self.prefix}{self.names[index]}"


class PadPrepare:
    """The per-image transform of a capture (picklable: sampler workers may decode).

    Checks the decoded size, composites onto ``background``, area-downscales by the
    image's factor and pads top-left into the (H, W) canvas with zeros.

    Args:
        read_sizes: per image, the (h, w) the file must have as decoded.
        factors: per image, the downscale applied after decoding (1: none).
        canvas: (H, W) of the padded store.
        background: (3,) RGB.
        expected: per image, text naming where its expected size comes from.
    """

    def __init__(self, read_sizes, factors, canvas, background, expected):
        self.read_sizes = [tuple(int(x) for x in s) for s in read_sizes]
        self.factors, self.canvas = [int(f) for f in factors], tuple(int(x) for x in canvas)
        self.background, self.expected = tuple(float(c) for c in background), list(expected)

    def __call__(self, image: np.ndarray, index: int) -> np.ndarray:
        want = self.read_sizes[index]
        if image.shape[:2] != want:
            raise DatasetError(f"image is {image.shape[1]}x{image.shape[0]} (WxH) but {self.expected[index]} "
                               f"is {want[1]}x{want[0]}")
        image = downscale_image(composite(image, self.background), self.factors[index])
        if image.shape[:2] == self.canvas:
            return image
        out = np.zeros(self.canvas + (3,), dtype=np.float32)
        out[:image.shape[0], :image.shape[1]] = image
        return out


@dataclass
class CaptureImages:
    """One split's image files and what their decoding needs.

    Attributes:
        paths: files to decode, split order.
        read_sizes: (h, w) of each file as stored (checked on decoding).
        sizes: (h, w) of each image after downscaling.
        factors: the downscale applied after decoding (1 for pre-shrunk copies).
        expected: per image, what its stored size is compared with (error messages).
    """

    paths: list
    read_sizes: list
    sizes: list
    factors: list
    expected: list

    @property
    def canvas(self) -> tuple:
        """(H, W): the largest height and width."""
        return tuple(int(x) for x in np.max(np.array(self.sizes), axis=0))

    def image_list(self, label, background, recipe: str) -> ImageList:
        prepare = PadPrepare(self.read_sizes, self.factors, self.canvas, background, self.expected)
        return ImageList(list(self.paths), prepare, label=label,
                         recipe=f"{recipe} background={prepare.background} factors={sorted(set(self.factors))} "
                                f"canvas={self.canvas}")

    def sizes_tensor(self) -> Optional[torch.Tensor]:
        """(M, 2) int64 (h, w) when sizes differ, else None."""
        sizes = np.array(self.sizes, dtype=np.int64)
        return None if (sizes == sizes[0]).all() else torch.from_numpy(sizes)


def padding_mask(sizes: Sequence, canvas: tuple, masks: Optional[Sequence] = None) -> Optional[torch.Tensor]:
    """(M, H, W) bool sampling mask: True inside each image's own (h, w) and, where
    ``masks[i]`` is given ((h, w) bool), where it is True. None when all are True."""
    height, width = canvas
    if masks is None and all(tuple(s) == (height, width) for s in sizes):
        return None
    out = torch.zeros((len(sizes), height, width), dtype=torch.bool)
    for i, (h, w) in enumerate(sizes):
        m = None if masks is None else masks[i]
        out[i, :h, :w] = True if m is None else torch.from_numpy(np.asarray(m, dtype=bool))
    return out


def read_mask(path: Path, stored: tuple, size: tuple, image_path) -> np.ndarray:
    """A dataset mask as (h, w) bool: True where the pixel may be sampled.

    A pixel is excluded where the mask is 0 (all channels; nerfstudio's convention:
    non-zero pixels are kept). A mask larger than its image (the full-size mask of a
    downscaled image) is area-shrunk to the image's size and a pixel is kept only when
    all the mask pixels it covers were.

    Args:
        path: mask file (PNG; grey, RGB or RGBA).
        stored: (h, w) the file must have: its image's size as stored.
        size: (h, w) of the image after downscaling.
        image_path: the image's file (error messages).

    Raises:
        DatasetError: the mask's size differs from its image's (names both files and sizes).
    """
    keep = (read_image(path).max(axis=-1) > 0).astype(np.float32)
    if keep.shape != tuple(stored):
        raise DatasetError(f"mask {path} is {keep.shape[1]}x{keep.shape[0]} (WxH) but its image {image_path} "
                           f"is {stored[1]}x{stored[0]}")
    if keep.shape == tuple(size):
        return keep > 0.5
    shrunk = np.asarray(Image.fromarray(keep, mode="F").resize((size[1], size[0]), Image.BOX))
    return shrunk >= 1.0 - 1e-6


def capture_scene(split: str, files: CaptureImages, index: Sequence[int], placed: Placement,
                  intrinsics: np.ndarray, full_sizes: np.ndarray, distortion: np.ndarray, *, label, recipe: str,
                  background: Sequence[float], source: str, masks: Optional[Sequence] = None,
                  pixels: Optional[Callable[[ImageList], torch.Tensor]] = None) -> SceneData:
    """Decodes a split's images and assembles its SceneData (the importers' last step).

    Args:
        split: the split's name.
        files: the split's images.
        index: (M,) the split's images among the capture's (rows of ``placed``).
        placed: every camera of the capture in the scene frame.
        intrinsics: (M, 4) fx, fy, cx, cy at each image's full size (``full_sizes``);
            scaled here per axis by the ratio of the decoded size to it.
        full_sizes: (M, 2) (h, w) the intrinsics refer to.
        distortion: (M, 5) (k1, k2, p1, p2, k3); all zero gives ``distortion=None``.
        label, recipe: of the ImageList (error messages, cache keys).
        background: (3,) RGB.
        source: the dataset's path.
        masks: optional per-image (h, w) bool dataset masks (None entries: no mask).
        pixels: the ``load_scene`` hook; default: decoded into RAM.
    """
    image_list = files.image_list(label, background, recipe)
    images = torch.from_numpy(image_list.decode_all()) if pixels is None else pixels(image_list)
    ratio = np.array(files.sizes, dtype=np.float64) / np.asarray(full_sizes, dtype=np.float64)  # (M, 2) h, w
    intr = np.asarray(intrinsics, dtype=np.float64) * ratio[:, [1, 0, 1, 0]]
    dist = np.asarray(distortion, dtype=np.float64)
    f32 = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))  # noqa: E731
    height, width = files.canvas
    cameras = Cameras(c2w=f32(placed.c2w[index]), fx=f32(intr[:, 0]), fy=f32(intr[:, 1]), cx=f32(intr[:, 2]),
                      cy=f32(intr[:, 3]), width=width, height=height,
                      distortion=f32(dist) if np.any(dist != 0) else None, sizes=files.sizes_tensor(),
                      bounds=f32(placed.bounds[index]))
    if masks is not None and all(m is None for m in masks):
        masks = None
    return SceneData(split=split, images=images, cameras=cameras, near=placed.near, far=placed.far,
                     aabb=f32(placed.aabb), background=torch.tensor(background, dtype=torch.float32).reshape(3),
                     image_paths=[str(p) for p in files.paths], source=source,
                     mask=padding_mask(files.sizes, files.canvas, masks), transform=placed.transform)
