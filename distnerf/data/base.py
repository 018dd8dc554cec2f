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
    """Pinhole cameras of one split.

    Attributes:
        c2w: (N, 3, 4) float32, camera-to-world, OpenGL convention, world units.
        fx, fy: (N,) float32 focal lengths in pixels.
        cx, cy: (N,) float32 principal point in pixels from the top-left corner.
        width, height: image size in pixels (identical for all cameras).
    """

    c2w: torch.Tensor
    fx: torch.Tensor
    fy: torch.Tensor
    cx: torch.Tensor
    cy: torch.Tensor
    width: int
    height: int

    def __len__(self) -> int:
        return self.c2w.shape[0]

    def subset(self, index) -> "Cameras":
        """Cameras selected by ``index`` (slice, list or LongTensor)."""
        return Cameras(self.c2w[index], self.fx[index], self.fy[index], self.cx[index],
                       self.cy[index], self.width, self.height)


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

    def __len__(self) -> int:
        return self.images.shape[0]

    @property
    def height(self) -> int:
        return self.cameras.height

    @property
    def width(self) -> int:
        return self.cameras.width

    def downscaled(self, factor: int) -> "SceneData":
        """The split with images area-averaged by ``factor`` and intrinsics scaled to match."""
        import torch.nn.functional as F

        images = F.avg_pool2d(self.images.permute(0, 3, 1, 2), factor).permute(0, 2, 3, 1).contiguous()
        height, width = images.shape[1], images.shape[2]
        c = self.cameras
        cams = Cameras(c.c2w, c.fx / factor, c.fy / factor, c.cx / factor, c.cy / factor, width, height)
        ndc = None if self.ndc is None else NDCParams(self.ndc.focal / factor, width, height, self.ndc.near_plane)
        return replace(self, images=images, cameras=cams, ndc=ndc)

    def subset(self, index) -> "SceneData":
        """The views selected by ``index`` (list of ints)."""
        index = list(index)
        return SceneData(self.split, self.images[index], self.cameras.subset(index), self.near,
                         self.far, self.aabb, self.background, self.ndc,
                         [self.image_paths[i] for i in index] if self.image_paths else [],
                         self.source)


class DatasetError(ValueError):
    """Bad dataset input; the message names the file, the frame and what is wrong."""
