"""What the viewer shows, without a server: camera conversions between distnerf and viser, frame
sizes, the colouring of a rendered frame, thumbnails, and the frame records.

Legend: H, W image size in pixels; K regions.

Camera conventions. distnerf's ``c2w`` is camera-to-world in the OpenGL convention (the
camera looks down -Z, +Y up, +X right). viser reports and sets a client's camera as
``wxyz`` (the rotation R of ``p_world = R p_camera + t``) and ``position`` (t) in the
OpenCV convention (looks down +Z, +Y down, +X right). The two differ by flipping the
camera's Y and Z axes: ``R_gl = R_cv @ diag(1, -1, -1)`` (:func:`c2w_from_viser`,
:func:`viser_from_c2w`); positions are the same. viser's ``fov`` is the vertical field of
view in radians; frames are pinhole with the principal point at the image centre.

Resolution. As in nerfstudio's viewer: while the camera moves a frame has as many pixels as
the measured render speed allows in :data:`MOVING_FRAME_S` seconds (:func:`frame_pixels`); once
still, a full frame (``max_resolution`` on its longest side, at most the browser canvas) follows.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..data.base import Cameras, SceneData
from ..data.rays import image_rays

MOVING_FRAME_S = 0.08   # target render time of a frame while the camera moves
MIN_PIXELS = 48 * 64    # the smallest moving frame
THUMBNAIL = 48          # longest side of a frustum's thumbnail, pixels
OUTPUTS = ("rgb", "depth", "opacity")
# K region colours (uint8 RGB), repeated for K > 10: matplotlib's tab10
REGION_COLOURS = np.array([[31, 119, 180], [255, 127, 14], [44, 160, 44], [214, 39, 40], [148, 103, 189],
                           [140, 86, 75], [227, 119, 194], [127, 127, 127], [188, 189, 34], [23, 190, 207]],
                          dtype=np.uint8)
_FLIP_YZ = np.diag([1.0, -1.0, -1.0])


def c2w_from_viser(wxyz, position) -> np.ndarray:
    """A viser camera pose as distnerf's ``c2w``.

    Args:
        wxyz: (4,) unit quaternion, camera-to-world rotation, OpenCV camera axes.
        position: (3,) camera centre, world units.
    Returns:
        (3, 4) float64 camera-to-world, OpenGL convention.
    """
    import viser.transforms as tf

    rot = tf.SO3(np.asarray(wxyz, dtype=np.float64)).as_matrix() @ _FLIP_YZ
    return np.concatenate([rot, np.asarray(position, dtype=np.float64).reshape(3, 1)], axis=1)


def viser_from_c2w(c2w) -> tuple[np.ndarray, np.ndarray]:
    """distnerf's ``c2w`` as a viser pose: ``(wxyz (4,), position (3,))``, OpenCV axes.

    Args:
        c2w: (3, 4) or (4, 4) camera-to-world, OpenGL convention.
    """
    import viser.transforms as tf

    c2w = np.asarray(c2w, dtype=np.float64)
    return tf.SO3.from_matrix(c2w[:3, :3] @ _FLIP_YZ).wxyz, c2w[:3, 3].copy()


def pinhole(c2w, fov_y: float, height: int, width: int) -> Cameras:
    """One pinhole camera of ``height`` x ``width`` pixels, vertical field of view ``fov_y``
    (radians), principal point at the centre, at pose ``c2w`` ((3, 4), OpenGL)."""
    focal = torch.tensor([0.5 * height / np.tan(0.5 * fov_y)], dtype=torch.float32)
    return Cameras(torch.as_tensor(np.asarray(c2w)[None, :3, :4], dtype=torch.float32), focal, focal.clone(),
                   torch.tensor([width / 2.0]), torch.tensor([height / 2.0]), int(width), int(height))


def frame_size(aspect: float, max_side: int, pixels: float | None = None) -> tuple[int, int]:
    """``(H, W)`` of a frame of ``aspect`` = W / H with longest side at most ``max_side`` and,
    when ``pixels`` is given, at most about that many pixels (never below :data:`MIN_PIXELS`)."""
    h, w = (max_side / aspect, max_side) if aspect >= 1 else (max_side, max_side * aspect)
    if pixels is not None and h * w > pixels:
        scale = np.sqrt(max(pixels, MIN_PIXELS) / (h * w))
        h, w = h * scale, w * scale
    return max(int(round(h)), 1), max(int(round(w)), 1)


def frame_pixels(moving: bool, rays_per_s: float, max_pixels: float | None = None) -> float | None:
    """The pixel budget of a frame: what ``rays_per_s`` renders in :data:`MOVING_FRAME_S` while the
    camera moves, else none (a full frame), capped at ``max_pixels`` when given."""
    pixels = rays_per_s * MOVING_FRAME_S if moving else None
    if max_pixels is not None:
        pixels = max_pixels if pixels is None else min(pixels, max_pixels)
    return pixels



def single_view(scene: SceneData, cameras: Cameras) -> SceneData:
    """``scene`` with camera 0 of ``cameras`` as its one view: its frame, near/far, NDC and box kept,
    no pixels (what the viewer renders with :func:`~distnerf.engine.evaluate.render_image`, index 0,
    as ``distnerf.render`` renders a view)."""
    return dataclasses.replace(scene, cameras=cameras, images=scene.images[:1], image_paths=[], mask=None)


def region_of_pixels(out: dict, scene: SceneData, cameras: Cameras, partition) -> torch.Tensor:
    """(H, W) int64: for each pixel the region holding its ray's expected termination point
    ``origin + depth * direction`` (the region that contributed most for a ray ending on a
    surface; a semi-transparent ray's colour may mix several). ``partition``: the run's
    :class:`~distnerf.strategy.partition.Partition` (points outside the box are clamped)."""
    rays = image_rays(cameras, 0, scene.near, scene.far, scene.ndc)
    points = rays.origins + out["depth"].reshape(-1, 1) * rays.directions
    return partition.region_of(points.double()).view(out["depth"].shape)


def colourise(out: dict, output: str, regions: torch.Tensor | None = None) -> np.ndarray:
    """The (H, W, 3) uint8 image shown for ``output`` (``rgb``; ``depth``: turbo colour map over
    the 1st-99th percentile of the covered pixels; ``opacity``: grey). ``regions`` (H, W): tint
    each covered pixel half-way towards its region's colour (:data:`REGION_COLOURS`)."""
    if output == "rgb":
        img = out["rgb"].numpy()
    else:
        value = out[output].numpy()
        if output == "depth":
            covered = value[out["opacity"].numpy() > 0.5]
            lo, hi = (np.percentile(covered, 1), np.percentile(covered, 99)) if covered.size else (0.0, 1.0)
            import matplotlib

            img = matplotlib.colormaps["turbo"](np.clip((value - lo) / max(hi - lo, 1e-8), 0, 1))[..., :3]
        else:
            img = np.repeat(np.clip(value, 0, 1)[..., None], 3, axis=-1)
    img = (np.clip(img, 0, 1) * 255).round().astype(np.uint8)
    if regions is not None:
        colours = REGION_COLOURS[regions.numpy() % len(REGION_COLOURS)]
        weight = 0.5 * np.clip(out["opacity"].numpy(), 0, 1)[..., None]
        img = ((1 - weight) * img + weight * colours).round().astype(np.uint8)
    return img


@dataclasses.dataclass
class Frame:
    """A frame pushed to one client.

    Attributes:
        image: (H, W, 3) uint8, what was sent.
        c2w: (3, 4) float64 camera-to-world, OpenGL. fov_y: vertical field of view, radians.
        full: a still (full-resolution) frame. step: the model's step. seconds: render time.
    """
    image: np.ndarray
    c2w: np.ndarray
    fov_y: float
    full: bool
    step: int
    seconds: float


@dataclasses.dataclass
class FrameRequest:
    """One frame to render: a pinhole camera (``c2w`` (4, 4) float64 camera-to-world, OpenGL
    convention; ``fov`` vertical field of view, radians; ``height`` x ``width`` pixels), whether
    it is the client's full-size still frame, the camera update it answers (``stamp``) and the
    browser's camera it was made from (``view``: ``(wxyz, position, fov, (canvas H, W))``, viser's
    axes; None when not from a browser)."""

    c2w: np.ndarray
    fov: float
    height: int
    width: int
    full: bool
    stamp: float
    view: tuple | None = None

    @property
    def cameras(self) -> Cameras:
        return pinhole(self.c2w, self.fov, self.height, self.width)


def thumbnail(image) -> np.ndarray:
    """(h, w, 3) uint8, ``image`` ((H, W, 3) float in [0, 1]) subsampled to at most :data:`THUMBNAIL` px a side."""
    image = np.asarray(image)
    step = max(1, int(np.ceil(max(image.shape[:2]) / THUMBNAIL)))
    return (np.clip(image[::step, ::step, :3], 0, 1) * 255).round().astype(np.uint8)
