"""Image reading shared by the dataset parsers.

Legend: H, W image size in pixels, C channels (1 grey, 3 RGB, 4 RGBA).

Every reader returns float32 arrays in [0, 1], values as stored in the file (sRGB-encoded,
no gamma conversion). Pillow does the decoding; it releases the GIL while decoding, so
the parsers decode many images at once with a thread pool (``read_images``).
"""
from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from distnerf.data.base import DatasetError, MissingDatasetFile

_EXIF_ORIENTATION = 0x0112
# Pillow modes with 8-bit channels that need a conversion to L, RGB or RGBA.
_TO_RGB = {"CMYK", "YCbCr", "LAB", "HSV", "RGBX"}
_TO_RGBA = {"LA", "La", "RGBa", "PA"}
_SIXTEEN_BIT = {"I;16", "I;16L", "I;16B", "I;16N", "I"}


def read_image(path) -> np.ndarray:
    """Reads an image file as floats, upright.

    The EXIF orientation tag is applied (``PIL.ImageOps.exif_transpose``). Modes are
    normalised: 1-bit and 8-bit grey -> C=1; 16-bit grey (``I;16*``, and ``I``, which
    Pillow uses for 16-bit PNGs) is divided by 65535; grey+alpha -> RGBA; palette -> RGB,
    or RGBA when the palette has transparency; CMYK/YCbCr/... -> RGB; 32-bit float ``F``
    is kept as is. 16-bit colour PNGs are reduced to 8 bits by Pillow (high byte), so
    they are read with 1/255 precision, correctly scaled.

    Args:
        path: image file (PNG, JPEG or anything Pillow reads).

    Returns:
        (H, W, C) float32 in [0, 1], C in {1, 3, 4}; alpha is straight (not premultiplied).

    Raises:
        MissingDatasetFile (a DatasetError and a FileNotFoundError): ``path`` does not exist (the message names it).
        DatasetError: the file cannot be decoded (the message names it and the cause).
    """
    path = Path(path)
    if not path.is_file():
        raise MissingDatasetFile(f"image not found: {path}")
    try:
        with Image.open(path) as im:
            im = ImageOps.exif_transpose(im)
            mode = im.mode
            if mode == "1":
                im = im.convert("L")
            elif mode == "P":
                im = im.convert("RGBA" if "transparency" in im.info else "RGB")
            elif mode in _TO_RGBA:
                im = im.convert("RGBA")
            elif mode in _TO_RGB:
                im = im.convert("RGB")
            array = np.asarray(im)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise DatasetError(f"cannot read image {path}: {err}") from err
    if array.ndim == 2:
        array = array[..., None]
    if im.mode in _SIXTEEN_BIT:
        out = array.astype(np.float32) / 65535.0
    elif im.mode == "F":
        out = array.astype(np.float32)
    elif array.dtype == np.uint8:
        out = array.astype(np.float32) / 255.0
    else:
        raise DatasetError(f"cannot read image {path}: unsupported mode {im.mode!r}")
    if out.shape[-1] not in (1, 3, 4):
        raise DatasetError(f"cannot read image {path}: {out.shape[-1]} channels")
    return np.clip(out, 0.0, 1.0, out=out)


def read_image_size(path) -> tuple[int, int]:
    """Size ``(H, W)`` of an image as ``read_image`` returns it, from the header only.

    Raises:
        MissingDatasetFile (a DatasetError and a FileNotFoundError): ``path`` does not exist.
        DatasetError: the header cannot be parsed.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingDatasetFile(f"image not found: {path}")
    try:
        with Image.open(path) as im:
            width, height = im.size
            orientation = im.getexif().get(_EXIF_ORIENTATION, 1)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise DatasetError(f"cannot read image {path}: {err}") from err
    # Orientations 5-8 include a 90-degree rotation (transpose of the stored array).
    return (width, height) if orientation in (5, 6, 7, 8) else (height, width)


def composite(rgba: np.ndarray, background) -> np.ndarray:
    """Composites straight alpha onto a constant background: ``rgb * a + bg * (1 - a)``.

    Args:
        rgba: (..., C) float in [0, 1], C in {1, 2, 3, 4} (grey, grey+alpha, RGB, RGBA).
        background: (3,) RGB in [0, 1].

    Returns:
        (..., 3) float32 RGB; grey is repeated over the three channels, images without
        alpha are returned unchanged (as float32).
    """
    rgba = np.asarray(rgba, dtype=np.float32)
    channels = rgba.shape[-1]
    if channels in (1, 2):
        color = np.repeat(rgba[..., :1], 3, axis=-1)
    elif channels in (3, 4):
        color = rgba[..., :3]
    else:
        raise ValueError(f"composite expects 1-4 channels, got {channels}")
    if channels in (1, 3):
        return np.ascontiguousarray(color)
    alpha = rgba[..., -1:]
    bg = np.asarray(background, dtype=np.float32).reshape(3)
    return color * alpha + bg * (1.0 - alpha)


def downscale_image(img: np.ndarray, factor: int) -> np.ndarray:
    """Shrinks an image by an integer factor with area (box) averaging.

    If ``factor`` divides H and W every output pixel is the exact mean of a
    ``factor x factor`` block. Otherwise the output is ``(H // factor, W // factor)`` and
    Pillow's BOX filter is applied per channel on float data (each output pixel averages
    the input area it covers, with fractional weights at the borders).

    Args:
        img: (H, W, C) float32.
        factor: positive integer; 1 returns ``img`` unchanged.

    Returns:
        (H // factor, W // factor, C) float32.
    """
    if not isinstance(factor, (int, np.integer)) or factor < 1:
        raise ValueError(f"downscale factor must be a positive integer, got {factor!r}")
    if factor == 1:
        return img
    height, width, channels = img.shape
    out_h, out_w = height // factor, width // factor
    if out_h < 1 or out_w < 1:
        raise ValueError(f"cannot downscale a {height}x{width} image by {factor}")
    if height % factor == 0 and width % factor == 0:
        blocks = img.reshape(out_h, factor, out_w, factor, channels)
        return blocks.mean(axis=(1, 3), dtype=np.float32)
    planes = [np.asarray(Image.fromarray(np.ascontiguousarray(img[..., c], dtype=np.float32),
                                         mode="F").resize((out_w, out_h), Image.BOX))
              for c in range(channels)]
    return np.stack(planes, axis=-1).astype(np.float32)


def read_images(paths: Sequence, transform: Callable[[np.ndarray, int], np.ndarray],
                label: Callable[[int], str] = lambda index: f"image {index}",
                num_threads: int | None = None) -> np.ndarray:
    """Decodes many images with a thread pool into one preallocated array.

    Args:
        paths: image files.
        transform: ``transform(image, index) -> (H', W', 3) float32`` applied to each
            decoded image (checks, compositing, downscaling).
        label: ``label(index)`` names an image in error messages (e.g. file and frame).
        num_threads: worker threads (default ``min(16, cpu count)``).

    Returns:
        (N, H', W', 3) float32.

    Raises:
        FileNotFoundError, DatasetError: from ``read_image`` or ``transform``, prefixed
            with ``label(index)``; DatasetError too when a transformed image differs in
            shape from the first one.
    """
    return ImageList(list(paths), transform, label).decode_all(num_threads)


class IndexLabel:
    """``label(index)``: ``prefix`` followed by the image's number (picklable).

    Args:
        prefix: e.g. ``"transforms_train.json frame "``.
        numbers: number shown for each index (default: the index itself).
    """

    def __init__(self, prefix: str, numbers: Sequence[int] | None = None):
        self.prefix, self.numbers = str(prefix), None if numbers is None else list(numbers)

    def __call__(self, index: int) -> str:
        return f"{self.prefix}{index if self.numbers is None else self.numbers[index]}"


class Composite:
    """``transform(image, index)`` compositing straight alpha onto ``background`` (picklable)."""

    def __init__(self, background):
        self.background = tuple(float(c) for c in background)

    def __call__(self, image: np.ndarray, index: int) -> np.ndarray:
        return composite(image, self.background)


@dataclass
class ImageList:
    """The images of one split, not decoded yet: files plus the per-image transform.

    Parsers hand this to a ``pixels`` hook (see ``load_blender``/``load_llff``), which
    decides where the decoded pixels live: in RAM (:meth:`decode_all`, the default) or
    streamed image by image into a preallocated array such as a memory-mapped file
    (:meth:`first` then :meth:`decode_into`), so that all decoded pixels are never held
    in RAM at once.

    Attributes:
        paths: image files, in split order.
        transform: ``transform(image, index) -> (H', W', 3) float32`` applied to each
            decoded (H, W, C) image (checks, compositing, downscaling). Picklable
            (a module-level class) when sampler workers decode (``sampler.source=files``).
        label: ``label(index)`` names an image in error messages (e.g. file and frame);
            picklable likewise (:class:`IndexLabel`).
        recipe: everything ``transform`` does to the pixels, as text (parser, background,
            downscale factor, ...): with the files' identity it keys on-disk caches.
    """

    paths: list
    transform: Callable[[np.ndarray, int], np.ndarray]
    label: Callable[[int], str] = field(default=lambda index: f"image {index}")
    recipe: str = ""

    def __len__(self) -> int:
        return len(self.paths)

    def decode(self, index: int) -> np.ndarray:
        """Image ``index`` decoded and transformed: (H', W', 3) float32 in [0, 1].

        Raises:
            FileNotFoundError, DatasetError: prefixed with ``label(index)``.
        """
        try:
            return self.transform(read_image(self.paths[index]), index)
        except FileNotFoundError as err:
            raise MissingDatasetFile(f"{self.label(index)}: {err}") from err
        except DatasetError as err:
            raise DatasetError(f"{self.label(index)}: {err}") from err

    def first(self) -> tuple[tuple, np.ndarray]:
        """``(shape, image 0)``: the (N, H', W', 3) shape of the decoded split and its first image."""
        image = self.decode(0)
        return (len(self),) + image.shape, image

    def decode_into(self, out, first: np.ndarray | None = None, num_threads: int | None = None,
                    progress: Callable[[int], None] | None = None) -> None:
        """Decodes every image into ``out[index]``; at most ``num_threads`` decoded images in RAM.

        Args:
            out: (N, H', W', 3) destination with ``shape`` and ``out[index] = image``
                (a numpy array, a ``numpy.memmap``, a file writer).
            first: image 0 when already decoded (from :meth:`first`).
            num_threads: decoding threads (default ``min(16, cpu count)``); Pillow
                releases the GIL while decoding.
            progress: called with the number of images decoded so far (1 .. N, in order), from
                this thread (e.g. a progress bar); None: silent.

        Raises:
            FileNotFoundError, DatasetError: from :meth:`decode`; DatasetError when an
                image's shape differs from ``out[index]``'s (names both files).
        """
        out[0] = self.decode(0) if first is None else first

        def load_into(index: int) -> None:
            image = self.decode(index)
            if image.shape != tuple(out.shape[1:]):
                raise DatasetError(f"{self.label(index)}: image {self.paths[index]} gives shape "
                                   f"{image.shape} but {self.paths[0]} gives {tuple(out.shape[1:])}")
            out[index] = image

        num_threads = num_threads or min(16, os.cpu_count() or 1)
        progress = progress or (lambda done: None)
        progress(1)
        with ThreadPoolExecutor(max_workers=num_threads) as pool:
            for done, _ in enumerate(pool.map(load_into, range(1, len(self))), start=2):  # re-raises a worker's exception
                progress(done)

    def verify(self, num_threads: int | None = None) -> None:
        """Check every file without decoding its pixels (``sampler.source=files`` decodes them only when
        a batch draws them): it exists, Pillow reads its header, its chunks are whole (``Image.verify``:
        a truncated PNG or JPEG fails here) and its size is image 0's. A damaged file is named before
        training instead of at the step that first draws it.

        Raises:
            MissingDatasetFile, DatasetError: prefixed with ``label(index)``.
        """
        def check(index: int):
            path = self.paths[index]
            try:
                with Image.open(path) as im:
                    size = im.size
                    im.verify()
                return size
            except FileNotFoundError as err:
                raise MissingDatasetFile(f"{self.label(index)}: {err}") from err
            except (OSError, SyntaxError, ValueError) as err:  # Pillow's errors for a damaged file
                raise DatasetError(f"{self.label(index)}: cannot read image {path}: {err}") from err

        num_threads = num_threads or min(16, os.cpu_count() or 1)
        with ThreadPoolExecutor(max_workers=num_threads) as pool:
            sizes = list(pool.map(check, range(len(self))))
        for index, size in enumerate(sizes):
            if size != sizes[0]:
                raise DatasetError(f"{self.label(index)}: image {self.paths[index]} is {size[0]}x{size[1]} but "
                                   f"{self.paths[0]} is {sizes[0][0]}x{sizes[0][1]}")

    def decode_all(self, num_threads: int | None = None) -> np.ndarray:
        """All images in one (N, H', W', 3) float32 array in RAM (see :meth:`decode_into`)."""
        shape, first = self.first()
        out = np.empty(shape, dtype=np.float32)
        self.decode_into(out, first, num_threads)
        return out

    def fingerprint(self) -> str:
        """sha256 (hex, 16 chars) of ``recipe`` and each file's resolved path, size and mtime.

        Cheap (one ``stat`` per file, no decoding); changes when a file is replaced or
        the transform's recipe changes.

        Raises:
            MissingDatasetFile (a DatasetError and a FileNotFoundError): an image file is missing (names it and its label).
        """
        h = hashlib.sha256(self.recipe.encode())
        for index, path in enumerate(self.paths):
            try:
                st = os.stat(path)
            except FileNotFoundError as err:
                raise MissingDatasetFile(f"{self.label(index)}: image not found: {path}") from err
            h.update(f"\n{Path(path).resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
        return h.hexdigest()[:16]


def undecoded(image_list: ImageList):
    """A ``pixels`` hook (see ``load_scene``) for callers that need a split's cameras and
    files but not its pixels (camera paths, dataset conversion): only image 0 is decoded,
    for the split's shape.

    Returns:
        (N, H', W', 3) float32 zeros, a broadcast view of one value (no memory per pixel).
    """
    import torch

    shape, _ = image_list.first()
    return torch.zeros(()).expand(shape)
