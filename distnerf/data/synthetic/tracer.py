"""Ray tracer of the procedural scenes: cameras, pixel rays, nearest hit, shading.

Legend: N rays (one per sub-pixel sample), H, W image size in pixels, K primitives.

Written with numpy and independently of distnerf's camera and ray code, so that a
convention bug there cannot hide by being consistent on both sides.

Conventions
-----------
* ``c2w`` is camera-to-world, OpenGL convention: the camera looks down its local -Z, +Y
  is up, +X is right (the ``transform_matrix`` of the Blender format).
* Pixel ``(u, v)`` (column, row) has its centre at ``(u + 0.5, v + 0.5)``; the camera
  direction of image point ``(x, y)`` is ``((x - cx) / fx, -(y - cy) / fy, -1)``. By
  default ``cx = W / 2``, ``cy = H / 2`` and ``fx = fy = 0.5 * W / tan(0.5 *
  camera_angle_x)``; the city's views pass their own ``(fx, fy, cx, cy)``.
* Each pixel averages 2x2 sub-pixel rays at offsets 0.25 and 0.75 (anti-aliasing).
  Without a sky, alpha is the fraction of sub-rays that hit (fractional on silhouettes),
  RGB the mean colour of those that hit, and RGB is 0 where alpha is 0. With a sky
  (:class:`Sky`), the sub-rays that hit nothing take the sky's colour and every pixel is
  opaque (alpha 1).
* Shading is Lambertian and view-independent: ``albedo * (ambient + (1 - ambient) *
  max(0, n . l))`` with a fixed directional light ``l``; no shadows. Values are
  stored display values (no gamma conversion), treated as linear by the city's
  appearance gains.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence, Tuple

import numpy as np

from distnerf.data.synthetic.primitives import Primitive

if TYPE_CHECKING:
    from distnerf.data.synthetic.scenes import SceneSpec

# Sub-pixels per pixel side of the written images.
_SUPERSAMPLE = 2


@dataclass
class Sky:
    """Background at infinity: a colour that depends only on the ray direction's elevation.

    With ``e = dir_y`` (sine of the elevation, unit directions) and ``w = 1 - (1 - |e|)^2``::

        colour = horizon + w * (zenith - horizon)   for e >= 0
        colour = horizon + w * (nadir - horizon)    for e < 0

    continuous (``horizon`` at e = 0), ``zenith`` straight up and ``nadir`` straight down
    (seen below the horizon where a ray passes beyond the ground's edge).

    Attributes:
        zenith, horizon, nadir: (3,) float64 RGB in [0, 1].
    """

    zenith: np.ndarray
    horizon: np.ndarray
    nadir: np.ndarray

    def colour(self, dirs: np.ndarray) -> np.ndarray:
        """Sky colour of unit directions ``dirs`` (N, 3): (N, 3) float64 in [0, 1]."""
        e = np.clip(dirs[:, 1], -1.0, 1.0)
        w = (1.0 - (1.0 - np.abs(e)) ** 2)[:, None]
        end = np.where((e >= 0.0)[:, None], self.zenith, self.nadir)
        return self.horizon + w * (end - self.horizon)

    def to_json(self) -> dict:
        return {"zenith": self.zenith.tolist(), "horizon": self.horizon.tolist(),
                "nadir": self.nadir.tolist()}


def look_at(eye: Sequence[float], target: Sequence[float],
            up: Sequence[float] = (0.0, 1.0, 0.0)) -> np.ndarray:
    """Camera-to-world matrix of a camera at ``eye`` looking at ``target``.

    Args:
        eye: (3,) camera position, world units.
        target: (3,) point on the optical axis, world units (not equal to ``eye``).
        up: (3,) world up; must not be parallel to ``target - eye``.

    Returns:
        (4, 4) float64 c2w, OpenGL convention: columns are the camera's +X (right),
        +Y (up), +Z (backward, opposite the viewing direction) and position.
    """
    eye = np.asarray(eye, dtype=np.float64)
    forward = np.asarray(target, dtype=np.float64) - eye
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, np.asarray(up, dtype=np.float64))
    norm = np.linalg.norm(right)
    assert norm > 1e-6, "look_at: viewing direction parallel to up"
    right /= norm
    cam_up = np.cross(right, forward)
    c2w = np.eye(4)
    c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3] = right, cam_up, -forward, eye
    return c2w


def focal_from_angle(width: int, camera_angle_x: float) -> float:
    """Focal length in pixels of an image ``width`` pixels wide with horizontal FOV
    ``camera_angle_x`` radians: ``f = 0.5 * W / tan(0.5 * camera_angle_x)``."""
    return 0.5 * width / math.tan(0.5 * camera_angle_x)


def pixel_rays(c2w: np.ndarray, width: int, height: int, focal: float,
               supersample: int = 1, fy: Optional[float] = None, cx: Optional[float] = None,
               cy: Optional[float] = None) -> Tuple[np.ndarray, np.ndarray]:
    """World rays through sub-pixel centres, row-major.

    Sub-pixel ``(i, j)`` of pixel ``(u, v)`` sits at ``(u + (j + 0.5) / s, v + (i + 0.5) / s)``
    with ``s = supersample`` (``s = 1``: the pixel centre). Its camera-space direction is
    ``((x - cx) / fx, -(y - cy) / fy, -1)``, rotated into the world by ``c2w``.

    Args:
        c2w: (4, 4) or (3, 4) camera-to-world, OpenGL convention.
        width, height: image size in pixels.
        focal: horizontal focal length ``fx`` in pixels.
        supersample: sub-pixels per pixel side.
        fy: vertical focal length in pixels; default ``focal``.
        cx, cy: principal point in pixels; default ``W / 2``, ``H / 2``.

    Returns:
        origins: (H*s * W*s, 3) float64 world units.
        dirs: (H*s * W*s, 3) float64 unit directions; index ``y * (W*s) + x`` over the
            sub-pixel grid.
    """
    c2w = np.asarray(c2w, dtype=np.float64)
    xs = (np.arange(width * supersample) + 0.5) / supersample
    ys = (np.arange(height * supersample) + 0.5) / supersample
    x, y = np.meshgrid(xs, ys, indexing="xy")
    fy = focal if fy is None else fy
    cx = 0.5 * width if cx is None else cx
    cy = 0.5 * height if cy is None else cy
    cam = np.stack([(x - cx) / focal, -(y - cy) / fy, -np.ones_like(x)], axis=-1).reshape(-1, 3)
    dirs = cam @ c2w[:3, :3].T
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    origins = np.broadcast_to(c2w[:3, 3], dirs.shape).copy()
    return origins, dirs


def nearest_hit(primitives: Sequence[Primitive], origins: np.ndarray,
                dirs: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nearest hit over all primitives.

    Each primitive is first culled with its bounding sphere, then intersected exactly on
    the remaining rays.

    Args:
        primitives: the scene.
        origins: (N, 3) float64 world units.
        dirs: (N, 3) float64 unit directions.

    Returns:
        t: (N,) float64 distance to the hit along the ray, ``inf`` on misses.
        index: (N,) int64 index of the primitive hit, -1 on misses.
        normals: (N, 3) float64 outward unit normals at the hits (0 on misses).
    """
    n = origins.shape[0]
    best_t = np.full(n, np.inf)
    best_id = np.full(n, -1, dtype=np.int64)
    best_normal = np.zeros((n, 3))
    # Pinhole views share one origin: the culling test is then one mat-vec per primitive.
    shared_origin = bool(n) and bool(np.all(origins == origins[0]))
    for k, prim in enumerate(primitives):
        centre, radius = prim.bounding_sphere()
        if shared_origin:
            oc0 = origins[0] - centre
            b = np.einsum("ij,j->i", dirs, oc0)  # faster than BLAS for 3-vectors
            c = oc0 @ oc0 - (radius * 1.001 + 1e-6) ** 2
        else:
            oc = origins - centre
            b = np.einsum("ij,ij->i", oc, dirs)
            c = np.einsum("ij,ij->i", oc, oc) - (radius * 1.001 + 1e-6) ** 2
        candidate = np.flatnonzero((b * b - c >= 0.0) & ((b < 0.0) | (c < 0.0)))
        if candidate.size == 0:
            continue
        t, normal = prim.intersect(origins[candidate], dirs[candidate])
        closer = t < best_t[candidate]
        idx = candidate[closer]
        best_t[idx], best_id[idx], best_normal[idx] = t[closer], k, normal[closer]
    return best_t, best_id, best_normal


def shade(primitives: Sequence[Primitive], index: np.ndarray, points: np.ndarray,
          normals: np.ndarray, light_dir: np.ndarray, ambient: float) -> np.ndarray:
    """Lambertian colour of surface points: ``albedo * (ambient + (1 - ambient) * max(0, n . l))``.

    Args:
        primitives: the scene.
        index: (N,) int64 primitive of each point (-1: none, colour 0).
        points: (N, 3) float64 world points on those primitives.
        normals: (N, 3) float64 outward unit normals.
        light_dir: (3,) float64 unit vector towards the light.
        ambient: ambient fraction in [0, 1].

    Returns:
        (N, 3) float64 RGB in [0, 1].
    """
    lambert = np.clip(np.einsum("ij,j->i", normals, light_dir), 0.0, 1.0)
    factor = ambient + (1.0 - ambient) * lambert
    rgb = np.zeros((points.shape[0], 3))
    for k, prim in enumerate(primitives):
        idx = np.flatnonzero(index == k)
        if idx.size:
            rgb[idx] = prim.albedo(points[idx]) * factor[idx, None]
    return np.clip(rgb, 0.0, 1.0)


def trace(primitives: Sequence[Primitive], origins: np.ndarray, dirs: np.ndarray,
          light_dir: np.ndarray, ambient: float) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nearest hit over all primitives (:func:`nearest_hit`) and its Lambertian colour.

    Args:
        primitives: the scene.
        origins: (N, 3) float64 world units.
        dirs: (N, 3) float64 unit directions.
        light_dir: (3,) float64 unit vector towards the light.
        ambient: ambient fraction in [0, 1].

    Returns:
        rgb: (N, 3) float64 in [0, 1]; 0 on misses.
        hit: (N,) bool.
        depth: (N,) float64 distance to the hit along the ray, ``inf`` on misses.
    """
    t, index, normals = nearest_hit(primitives, origins, dirs)
    hit = index >= 0
    points = origins + np.where(hit, t, 0.0)[:, None] * dirs
    return shade(primitives, index, points, normals, light_dir, ambient), hit, t


def render_view(spec: SceneSpec, c2w: np.ndarray, width: int, height: int,
                supersample: int = _SUPERSAMPLE,
                intrinsics: Optional[Sequence[float]] = None) -> np.ndarray:
    """Renders one view of a scene with ``supersample`` x ``supersample`` anti-aliasing.

    Args:
        spec: the scene; with ``spec.sky`` set, rays that hit nothing take the sky colour.
        c2w: (4, 4) camera-to-world, OpenGL convention.
        width, height: image size in pixels.
        supersample: sub-pixels per pixel side.
        intrinsics: ``(fx, fy, cx, cy)`` in pixels; default: ``fx = fy`` from
            ``spec.camera_angle_x`` and ``width``, principal point at the image centre.

    Returns:
        (H, W, 4) float32 RGBA in [0, 1], straight alpha (RGB 0 where alpha is 0); with a
        sky, alpha is 1 everywhere.
    """
    if intrinsics is None:
        fx = focal_from_angle(width, spec.camera_angle_x)
        fy, cx, cy = fx, 0.5 * width, 0.5 * height
    else:
        fx, fy, cx, cy = (float(v) for v in intrinsics)
    origins, dirs = pixel_rays(c2w, width, height, fx, supersample, fy=fy, cx=cx, cy=cy)
    rgb, hit, _ = trace(spec.primitives, origins, dirs, spec.light_dir, spec.ambient)
    if spec.sky is not None:
        rgb[~hit] = spec.sky.colour(dirs[~hit])
        hit = np.ones_like(hit)
    s = supersample
    rgb = rgb.reshape(height, s, width, s, 3).sum(axis=(1, 3))
    count = hit.reshape(height, s, width, s).sum(axis=(1, 3)).astype(np.float64)
    alpha = count / (s * s)
    rgb = rgb / np.maximum(count, 1.0)[..., None]
    return np.concatenate([rgb, alpha[..., None]], axis=-1).astype(np.float32)
