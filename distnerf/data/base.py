"""Scene containers shared by every dataset parser.

Legend: N images, H, W image size in pixels.

Conventions
-----------
* ``c2w`` is camera-to-world in the OpenGL convention: the camera looks down its
  local -Z axis, +Y is up and +X is right. Translation is in world units.
* Intrinsics are in pixels. Pixel ``(u, v)`` (column, row) has its centre at
  ``(u + 0.5, v + 0.5)``; ``cx, cy`` are measured from the top-left image corner.
* ``images`` are linear-in-file (sRGB-encoded, as stored) RGB values in [0, 1]
  already composited onto ``background``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

import torch


@dataclass
class Cameras:
    """Cameras of one split: pinhole, optionally with lens distortion, per-camera image
    sizes and per-camera ray bounds.

    Attributes:
        c2w: (N, 3, 4) float32, camera-to-world, OpenGL convention, world units.
        fx, fy: (N,) float32 focal lengths in pixels.
        cx, cy: (N,) float32 principal point in pixels from the top-left corner.
        width, height: image size in pixels; with ``sizes`` set, the largest width and
            height (the size of the padded pixel store).
        distortion: optional (N, 5) float32 OpenCV radial-tangential coefficients
            ``(k1, k2, p1, p2, k3)`` acting on normalised image coordinates
            ``x = (u + 0.5 - cx) / fx, y = (v + 0.5 - cy) / fy`` (image y down):
            ``x_d = x (1 + k1 r^2 + k2 r^4 + k3 r^6) + 2 p1 x y + p2 (r^2 + 2 x^2)``,
            ``y_d = y (1 + ...) + p1 (r^2 + 2 y^2) + 2 p2 x y``. COLMAP's ``SIMPLE_RADIAL``
            (k), ``RADIAL`` (k1, k2) and ``OPENCV`` (k1, k2, p1, p2) are special cases.
            ``None``: no distortion.
        sizes: optional (N, 2) int64 ``(height, width)`` of every camera's image (images
            of different sizes); ``None``: all are ``height x width``.
        bounds: optional (N, 2) float32 ``(near, far)`` of every camera's rays (from the
            sparse points it sees); ``None``: the split's global ``near``/``far``.
    """

    c2w: torch.Tensor
    fx: torch.Tensor
    fy: torch.Tensor
    cx: torch.Tensor
    cy: torch.Tensor
    width: int
    height: int
    distortion: Optional[torch.Tensor] = None
    sizes: Optional[torch.Tensor] = None
    bounds: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return self.c2w.shape[0]

    def size(self, index: int) -> tuple[int, int]:
        """``(height, width)`` in pixels of camera ``index``'s image."""
        if self.sizes is None:
            return self.height, self.width
        h, w = self.sizes[index].tolist()
        return int(h), int(w)

    def intrinsics(self) -> torch.Tensor:
        """(N, 4) float32 ``(cx, cy, fx, fy)`` per camera in pixels, stacked once (one gather per ray batch)."""
        stacked = self.__dict__.get("_intrinsics")
        if stacked is None:
            stacked = self.__dict__["_intrinsics"] = torch.stack([self.cx, self.cy, self.fx, self.fy], dim=1)
        return stacked

    def tensors(self) -> list:
        """Every tensor the cameras hold (for moving or sharing them)."""
        return [t for t in (self.c2w, self.fx, self.fy, self.cx, self.cy, self.distortion, self.sizes, self.bounds)
                if t is not None]

    def map(self, fn) -> "Cameras":
        """Cameras with ``fn`` applied to every tensor (e.g. ``.to(device)``)."""
        opt = lambda t: None if t is None else fn(t)  # noqa: E731
        return Cameras(fn(self.c2w), fn(self.fx), fn(self.fy), fn(self.cx), fn(self.cy), self.width, self.height,
                       opt(self.distortion), opt(self.sizes), opt(self.bounds))

    def subset(self, index) -> "Cameras":
        """Cameras selected by ``index`` (slice, list or LongTensor)."""
        return self.map(lambda t: t[index])

    def scaled(self, factor: int) -> "Cameras":
        """The cameras of images downscaled by the integer ``factor`` (sizes floor-divided)."""
        sizes = None if self.sizes is None else self.sizes // factor
        return replace(self, fx=self.fx / factor, fy=self.fy / factor, cx=self.cx / factor, cy=self.cy / factor,
                       width=self.width // factor, height=self.height // factor, sizes=sizes)


@dataclass
class NDCParams:
    """Normalised-device-coordinate warp of forward-facing (LLFF) scenes.

    NeRF (Mildenhall et al. 2020), Appendix C: rays are moved to the near plane
    ``z = -near_plane`` and mapped into the cube [-1, 1]^3 with a shared focal.

    Attributes:
        focal: focal length in pixels of the reference camera.
        width, height: image size in pixels.
        near_plane: world depth of the NDC near plane (1.0 after bound rescaling).
    """

    focal: float
    width: int
    height: int
    near_plane: float = 1.0


@dataclass
class SceneData:
    """One split of a scene, ready for ray generation.

    Attributes:
        split: ``"train"``, ``"val"`` or ``"test"``.
        images: (N, H, W, 3) float32 RGB in [0, 1], composited on ``background``.
        cameras: the split's cameras.
        near, far: ray bounds in world units along the (unnormalised-free) unit
            direction; in NDC scenes they are NDC ray parameters (0 and 1).
        aabb: (2, 3) float32 [min, max] box holding the scene content; every spatial
            structure (grids, occupancy grid, partition) lives in this box. In NDC
            scenes the box is in NDC space.
        background: (3,) float32 RGB background used for compositing and rendering.
        ndc: NDC parameters for forward-facing scenes, else ``None``.
        image_paths: source file of every image (for error messages and outputs).
        source: path of the dataset root.
        mask: optional (N, H, W) bool, the pixels that may be sampled for training
            (False: masked out by the dataset's masks, or padding of an image smaller
            than H x W). ``None``: every pixel. Evaluation ignores it (whole images).
        transform: optional JSON-able dict, the similarity that took the dataset's own
            world coordinates into this scene's normalised ones (COLMAP, nerfstudio):
            ``{"matrix": 4x4 list, "scale": s, ...}`` with ``p_scene = matrix @ [p, 1]``;
            saved beside every run, render and export. ``None``: the dataset's own frame.
    """

    split: str
    images: torch.Tensor
    cameras: Cameras
    near: float
    far: float
    aabb: torch.Tensor
    background: torch.Tensor
    ndc: Optional[NDCParams] = None
    image_paths: list = field(default_factory=list)
    source: str = ""
    mask: Optional[torch.Tensor] = None
    transform: Optional[dict] = None

    def __len__(self) -> int:
        return self.images.shape[0]

    @property
    def height(self) -> int:
        return self.cameras.height

    @property
    def width(self) -> int:
        return self.cameras.width

    def downscaled(self, factor: int) -> "SceneData":
        """The split with images area-averaged by ``factor`` and intrinsics scaled to match
        (a pooled pixel is sampleable only if all its source pixels were)."""
        import torch.nn.functional as F

        images = F.avg_pool2d(self.images.permute(0, 3, 1, 2), factor).permute(0, 2, 3, 1).contiguous()
        height, width = images.shape[1], images.shape[2]
        cams = self.cameras.scaled(factor)
        ndc = None if self.ndc is None else NDCParams(self.ndc.focal / factor, width, height, self.ndc.near_plane)
        mask = None if self.mask is None else \
            -F.max_pool2d(-self.mask[:, None].float(), factor)[:, 0] > 0.5
        return replace(self, images=images, cameras=cams, ndc=ndc, mask=mask)

    def subset(self, index) -> "SceneData":
        """The views selected by ``index`` (list of ints)."""
        index = list(index)
        return replace(self, images=self.images[index], cameras=self.cameras.subset(index),
                       image_paths=[self.image_paths[i] for i in index] if self.image_paths else [],
                       mask=None if self.mask is None else self.mask[index])

    def image(self, index: int) -> torch.Tensor:
        """(h, w, 3) float32 pixels of view ``index`` at its own size (padding cropped)."""
        h, w = self.cameras.size(index)
        return self.images[index, :h, :w]


class DatasetError(ValueError):
    """Bad dataset input; the message names the file, the frame and what is wrong."""


class MissingDatasetFile(DatasetError, FileNotFoundError):
    """A file the dataset needs is missing (names it and what refers to it). Both a
    :class:`DatasetError` (the entry points print its message as one line, no traceback)
    and a ``FileNotFoundError``."""
