"""Pixels decoded from the image files for every batch (``sampler.source=files``).

Legend: R rays per batch, N images, H, W image size.

The input pipeline of datasets kept only as compressed files (what nerfstudio calls
``cache_images=disk``): nothing is decoded at load, and each batch decodes the images
it draws rays from (with ``policy=per_image``, ``images_per_step`` images per batch)
and gathers its colours from them. The decoded values are those of a load into RAM
(same reader and transform), so batches stay bitwise those of ``source=memory``.
This is the heavy per-step input work the pipelined sampler exists to hide; workers
decode in their own processes.

The scene's ``images`` is then a ``meta`` tensor: it has the (N, H, W, 3) shape but no
data, so code that tries to read pixels fails loudly instead of reading garbage.
"""
from __future__ import annotations

import weakref

import numpy as np
import torch

from ..data.base import DatasetError, SceneData
from ..data.images import ImageList

_SOURCES: dict[int, tuple] = {}  # id(meta tensor) -> (weakref to it, ImageList)


class FileSource:
    """The ``pixels`` hook of ``load_scene`` for ``sampler.source=files``.

    Checks every file (:meth:`~distnerf.data.images.ImageList.verify`: present, whole, one size),
    decodes image 0 once (to learn the decoded size) and returns a (N, H, W, 3) float32
    ``meta`` tensor that :func:`flat_pixels` maps back to the image list.
    """

    def __call__(self, images: ImageList) -> torch.Tensor:
        images.verify()  # a damaged file is named now, not at the step that first draws it
        shape, _ = images.first()
        tensor = torch.empty(shape, dtype=torch.float32, device="meta")
        _SOURCES[id(tensor)] = (weakref.ref(tensor, lambda _, key=id(tensor): _SOURCES.pop(key, None)), images)
        return tensor

    def __repr__(self) -> str:
        return "FileSource()"


def image_files(images: torch.Tensor) -> ImageList | None:
    """The image list behind ``images`` when it is a tensor returned by :class:`FileSource`."""
    entry = _SOURCES.get(id(images))
    return entry[1] if entry is not None and entry[0]() is images else None


class FilePixels:
    """Stands in for the flat (N * H * W, 3) pixel tensor: :meth:`gather` decodes on demand.

    Args:
        images: the split's image list (picklable: it travels to sampler workers).
        height, width: decoded image size H, W.
    """

    def __init__(self, images: ImageList, height: int, width: int):
        self.images, self.height, self.width = images, int(height), int(width)
        self.shape = (len(images) * self.height * self.width, 3)

    def gather(self, flat: torch.Tensor) -> torch.Tensor:
        """Colours of the flat pixel indices ``flat`` ((R,) int64, CPU): (R, 3) float32.

        Each distinct image among the indices is decoded once.

        Raises:
            FileNotFoundError, DatasetError: an image is missing, unreadable, or decodes
                to another size than the split's (names the file).
        """
        flat = flat.numpy()
        per_image = self.height * self.width
        image, pixel = flat // per_image, flat % per_image
        out = np.empty((len(flat), 3), dtype=np.float32)
        for index in np.unique(image):
            decoded = self.images.decode(int(index))
            if decoded.shape != (self.height, self.width, 3):
                raise DatasetError(f"{self.images.label(int(index))}: image {self.images.paths[index]} decodes to "
                                   f"{decoded.shape}, the split is {(self.height, self.width, 3)}")
            chosen = image == index
            out[chosen] = decoded.reshape(-1, 3)[pixel[chosen]]
        return torch.from_numpy(out)


def flat_pixels(scene: SceneData) -> torch.Tensor | FilePixels:
    """What batches gather colours from: ``scene.images`` as (N * H * W, 3), or a
    :class:`FilePixels` when the scene was loaded with :class:`FileSource`."""
    files = image_files(scene.images)
    if files is not None:
        return FilePixels(files, scene.height, scene.width)
    return scene.images.reshape(-1, 3)
