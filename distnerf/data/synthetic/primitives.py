"""Procedural default scenes, rendered analytically and written in Blender format.

Legend: N rays (one per sub-pixel sample), H, W image size in pixels, V views of a split,
K primitives of a scene.

With no dataset given, distnerf trains on a small scene that it generates itself:
:func:`ensure_scene` renders it once into a cache directory, in the nerf_synthetic
("Blender") layout, and every later call (from any rank) reuses it::

    <root>/transforms_{train,val,test}.json
    <root>/{train,val,test}/r_<i>.png      RGBA, 8 bit, straight (not premultiplied) alpha
    <root>/scene.json                      the primitives, light and cameras' generator
    <root>/.complete                       completion marker, written last

Two kinds of scene:

* ``"objects"`` (the default, object-centred like lego): five textured primitives on a
  checkered platform inside [-1.2, 1.2]^3, transparent background, cameras on the upper
  hemisphere of radius 4 looking at the origin.
* ``"wide"`` (large, for spatial segmentation): 18-24 objects scattered over a tiled
  ground plane spanning [-8, 8] in x and z, seen by low cameras (height 1.5-3) that look
  outward and 20-35 degrees down; sky is transparent.

The renderer here is deliberately independent of distnerf's camera and ray code (it
imports nothing from distnerf): rays and ray-primitive intersections are written
separately with numpy, so that a convention bug in distnerf's rays cannot hide by being
consistent on both sides.

Conventions
-----------
* World: right-handed, **+Y up** (unlike Blender's Z-up scenes); the ground of ``"wide"``
  is the plane y = 0. Units are arbitrary world units.
* ``c2w`` is camera-to-world, OpenGL convention: the camera looks down its local -Z, +Y
  is up, +X is right (the ``transform_matrix`` of the Blender format).
* Pixel ``(u, v)`` (column, row) has its centre at ``(u + 0.5, v + 0.5)``; the camera
  direction of image point ``(x, y)`` is ``((x - cx) / f, -(y - cy) / f, -1)`` with
  ``cx = W / 2``, ``cy = H / 2``, ``f = 0.5 * W / tan(0.5 * camera_angle_x)``.
* Each pixel averages 2x2 sub-pixel rays at offsets 0.25 and 0.75 (anti-aliasing), so
  alpha is fractional on silhouettes. RGB is the mean colour of the sub-rays that hit,
  alpha the fraction that hit; where alpha is 0, RGB is 0.
* Shading is Lambertian and view-independent: ``albedo * (ambient + (1 - ambient) *
  max(0, n . l))`` with a fixed directional light ``l``; no shadows. Values are written
  as stored display values (no gamma conversion).

Command line::

    python -m distnerf.data.synthetic --kind wide --resolution 200 --out DIR
"""
from __future__ import annotations

import argparse
import colorsys
import json
import math
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import imageio.v3 as iio
import numpy as np

#: Bumped whenever the generated content changes; part of the scene root name.
VERSION = "v1"
#: Completion marker inside a finished scene root.
MARKER = ".complete"
KINDS = ("objects", "wide")
SPLITS = ("train", "val", "test")

_EPS = 1e-6
_SUPERSAMPLE = 2
# Temp dirs of crashed generators older than this are removed (seconds).
_STALE_TEMP_AGE = 3600.0


# --------------------------------------------------------------------------------------
# Geometry: primitives with explicit ray intersection.
# --------------------------------------------------------------------------------------
def _rotation_y(angle: float) -> np.ndarray:
    """(3, 3) float64 rotation by ``angle`` radians about +Y (right-handed)."""
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def _random_rotation(rng: np.random.Generator) -> np.ndarray:
    """(3, 3) float64 uniformly random rotation (QR of a Gaussian matrix, det +1)."""
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def _tilt(rng: np.random.Generator, max_angle: float) -> np.ndarray:
    """(3, 3) rotation tilting +Y by up to ``max_angle`` radians about a random horizontal axis."""
    axis_angle = rng.uniform(0.0, 2.0 * math.pi)
    axis = np.array([math.cos(axis_angle), 0.0, math.sin(axis_angle)])
    angle = rng.uniform(0.0, max_angle)
    k = np.array([[0.0, -axis[2], axis[1]], [axis[2], 0.0, -axis[0]], [-axis[1], axis[0], 0.0]])
    return np.eye(3) + math.sin(angle) * k + (1.0 - math.cos(angle)) * (k @ k)


@dataclass
class Primitive:
    """Base of the analytic primitives.

    Attributes:
        center: (3,) float64 world position of the primitive's centre.
        rotation: (3, 3) float64 local-to-world rotation; its columns are the local
            axes in world coordinates. World point ``p`` has local coordinates
            ``R^T (p - center)``.
        color: (3,) float64 base albedo in [0, 1].
        alt_color: (3,) float64 second albedo of the texture (same hue as ``color``).
    """

    center: np.ndarray
    rotation: np.ndarray
    color: np.ndarray
    alt_color: np.ndarray

    type_name = "primitive"

    def _to_local(self, origins: np.ndarray, dirs: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        # Row-vector form of R^T (p - c): (p - c) @ R.
        return (origins - self.center) @ self.rotation, dirs @ self.rotation

    def bounding_sphere(self) -> Tuple[np.ndarray, float]:
        """Centre (3,) and radius of a sphere holding the primitive (world units)."""
        raise NotImplementedError

    def bounds(self) -> np.ndarray:
        """(2, 3) float64 [min, max] axis-aligned box holding the primitive."""
        raise NotImplementedError

    def intersect(self, origins: np.ndarray, dirs: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Nearest intersection in front of the origins.

        Args:
            origins: (N, 3) float64 ray origins, world units.
            dirs: (N, 3) float64 unit ray directions.

        Returns:
            t: (N,) float64 distance to the first hit with ``t > 1e-6``, ``inf`` on a miss.
            normals: (N, 3) float64 outward unit normals at the hits (undefined on misses).
        """
        raise NotImplementedError

    def albedo(self, points: np.ndarray) -> np.ndarray:
        """Textured albedo at surface points.

        Args:
            points: (N, 3) float64 world points on the surface.

        Returns:
            (N, 3) float64 albedo in [0, 1].
        """
        raise NotImplementedError

    def to_json(self) -> dict:
        """JSON description (type, geometry, colours); written to ``scene.json``."""
        return {"type": self.type_name, "center": self.center.tolist(),
                "rotation": self.rotation.tolist(), "color": self.color.tolist(),
                "alt_color": self.alt_color.tolist()}

    def _pick(self, odd: np.ndarray) -> np.ndarray:
        return np.where(odd[:, None], self.alt_color, self.color)


@dataclass
class Sphere(Primitive):
    """Sphere with latitude stripes (about its local +Y axis).

    Attributes:
        radius: world units.
        num_stripes: stripes from pole to pole, alternating ``color``/``alt_color``.
    """

    radius: float = 0.5
    num_stripes: int = 8
    type_name = "sphere"

    def bounding_sphere(self):
        return self.center, self.radius

    def bounds(self):
        return np.stack([self.center - self.radius, self.center + self.radius])

    def intersect(self, origins, dirs):
        oc = origins - self.center
        b = np.einsum("ij,ij->i", oc, dirs)
        c = np.einsum("ij,ij->i", oc, oc) - self.radius ** 2
        disc = b * b - c
        root = np.sqrt(np.maximum(disc, 0.0))
        t_near, t_far = -b - root, -b + root
        t = np.where(t_near > _EPS, t_near, t_far)
        t = np.where((disc >= 0.0) & (t > _EPS), t, np.inf)
        safe_t = np.where(np.isfinite(t), t, 0.0)
        normals = (oc + safe_t[:, None] * dirs) / self.radius
        return t, normals

    def albedo(self, points):
        local_y = ((points - self.center) @ self.rotation)[:, 1] / self.radius
        latitude = np.arcsin(np.clip(local_y, -1.0, 1.0))  # [-pi/2, pi/2]
        band = np.floor((latitude + 0.5 * math.pi) / (math.pi / self.num_stripes)).astype(np.int64)
        return self._pick(band % 2 == 1)

    def to_json(self):
        return {**super().to_json(), "radius": self.radius, "num_stripes": self.num_stripes}


@dataclass
class Box(Primitive):
    """Oriented box with a checkerboard on every face.

    Attributes:
        half_extents: (3,) float64 half sizes along the local axes, world units.
        checks_per_unit: checkerboard squares per world unit.
    """

    half_extents: np.ndarray = field(default_factory=lambda: np.full(3, 0.5))
    checks_per_unit: float = 4.0
    type_name = "box"

    def bounding_sphere(self):
        return self.center, float(np.linalg.norm(self.half_extents))

    def bounds(self):
        reach = np.abs(self.rotation) @ self.half_extents
        return np.stack([self.center - reach, self.center + reach])

    def intersect(self, origins, dirs):
        o, d = self._to_local(origins, dirs)
        d = np.where(np.abs(d) < 1e-12, 1e-12, d)
        t1 = (-self.half_extents - o) / d
        t2 = (self.half_extents - o) / d
        t_enter = np.minimum(t1, t2).max(axis=1)
        t_exit = np.maximum(t1, t2).min(axis=1)
        t = np.where(t_enter > _EPS, t_enter, t_exit)
        t = np.where((t_exit >= t_enter) & (t > _EPS), t, np.inf)
        safe_t = np.where(np.isfinite(t), t, 0.0)
        local = o + safe_t[:, None] * d
        axis = np.argmax(np.abs(local) / self.half_extents, axis=1)
        normal_local = np.zeros_like(local)
        rows = np.arange(local.shape[0])
        normal_local[rows, axis] = np.sign(local[rows, axis])
        return t, normal_local @ self.rotation.T

    def albedo(self, points):
        local = (points - self.center) @ self.rotation
        axis = np.argmax(np.abs(local) / self.half_extents, axis=1)
        # Checker in the face's two tangent coordinates, counted from the box corner.
        cells = np.floor((local + self.half_extents) * self.checks_per_unit).astype(np.int64)
        parity = cells.sum(axis=1) - cells[np.arange(local.shape[0]), axis]
        return self._pick(parity % 2 == 1)

    def to_json(self):
        return {**super().to_json(), "half_extents": self.half_extents.tolist(),
                "checks_per_unit": self.checks_per_unit}


@dataclass
class Cylinder(Primitive):
    """Capped cylinder along its local +Y axis; vertical stripes on the side, rings on the caps.

    Attributes:
        radius: world units.
        half_height: half length along the axis, world units.
        num_stripes: stripes around the side.
    """

    radius: float = 0.25
    half_height: float = 0.5
    num_stripes: int = 12
    type_name = "cylinder"

    def bounding_sphere(self):
        return self.center, math.hypot(self.radius, self.half_height)

    def bounds(self):
        axis = self.rotation[:, 1]
        reach = np.abs(axis) * self.half_height + self.radius * np.sqrt(np.maximum(1.0 - axis ** 2, 0.0))
        return np.stack([self.center - reach, self.center + reach])

    def intersect(self, origins, dirs):
        o, d = self._to_local(origins, dirs)
        n = o.shape[0]
        # Side: (ox + t dx)^2 + (oz + t dz)^2 = r^2 with |y| <= h.
        a = d[:, 0] ** 2 + d[:, 2] ** 2
        b = o[:, 0] * d[:, 0] + o[:, 2] * d[:, 2]
        c = o[:, 0] ** 2 + o[:, 2] ** 2 - self.radius ** 2
        disc = b * b - a * c
        safe_a = np.where(a > 1e-12, a, 1.0)
        root = np.sqrt(np.maximum(disc, 0.0))
        t_side = np.full(n, np.inf)
        for t_cand in ((-b - root) / safe_a, (-b + root) / safe_a):
            y = o[:, 1] + t_cand * d[:, 1]
            ok = (a > 1e-12) & (disc >= 0.0) & (t_cand > _EPS) & (np.abs(y) <= self.half_height)
            t_side = np.where(ok & (t_cand < t_side), t_cand, t_side)
        # Caps: y = +-h with x^2 + z^2 <= r^2.
        t_cap = np.full(n, np.inf)
        cap_sign = np.zeros(n)
        safe_dy = np.where(np.abs(d[:, 1]) > 1e-12, d[:, 1], 1e-12)
        for sign in (1.0, -1.0):
            t_cand = (sign * self.half_height - o[:, 1]) / safe_dy
            x = o[:, 0] + t_cand * d[:, 0]
            z = o[:, 2] + t_cand * d[:, 2]
            ok = (t_cand > _EPS) & (x * x + z * z <= self.radius ** 2) & (t_cand < t_cap)
            t_cap = np.where(ok, t_cand, t_cap)
            cap_sign = np.where(ok, sign, cap_sign)
        t = np.minimum(t_side, t_cap)
        safe_t = np.where(np.isfinite(t), t, 0.0)
        local = o + safe_t[:, None] * d
        side_normal = np.stack([local[:, 0], np.zeros(n), local[:, 2]], axis=1) / self.radius
        cap_normal = np.stack([np.zeros(n), cap_sign, np.zeros(n)], axis=1)
        normal_local = np.where((t_side <= t_cap)[:, None], side_normal, cap_normal)
        return t, normal_local @ self.rotation.T

    def albedo(self, points):
        local = (points - self.center) @ self.rotation
        on_side = np.abs(local[:, 1]) < self.half_height - 1e-7
        phi = np.arctan2(local[:, 2], local[:, 0])  # [-pi, pi]
        stripe = np.floor((phi + math.pi) / (2.0 * math.pi / self.num_stripes)).astype(np.int64)
        rho = np.hypot(local[:, 0], local[:, 2])
        ring = np.floor(rho / (self.radius / 3.0)).astype(np.int64)
        return self._pick(np.where(on_side, stripe, ring) % 2 == 1)

    def to_json(self):
        return {**super().to_json(), "radius": self.radius, "half_height": self.half_height,
                "num_stripes": self.num_stripes}


@dataclass
class GroundPlane(Primitive):
    """Square patch of the plane y = ``center[1]``, tiled, seen from above.

    The tiles alternate ``color``/``alt_color``; blocks of 4x4 tiles get a deterministic
    brightness factor in [0.85, 1.15] so that the pattern is not periodic.

    Attributes:
        extent: the patch spans ``center +- extent`` in x and z, world units.
        tile: tile size, world units.
    """

    extent: float = 8.0
    tile: float = 1.0
    type_name = "ground"

    def bounding_sphere(self):
        return self.center, self.extent * math.sqrt(2.0)

    def bounds(self):
        reach = np.array([self.extent, 0.0, self.extent])
        return np.stack([self.center - reach, self.center + reach])

    def intersect(self, origins, dirs):
        dy = np.where(np.abs(dirs[:, 1]) > 1e-12, dirs[:, 1], 1e-12)
        t = (self.center[1] - origins[:, 1]) / dy
        x = origins[:, 0] + t * dirs[:, 0] - self.center[0]
        z = origins[:, 2] + t * dirs[:, 2] - self.center[2]
        inside = (np.abs(x) <= self.extent) & (np.abs(z) <= self.extent)
        t = np.where(inside & (t > _EPS), t, np.inf)
        normals = np.zeros_like(dirs)
        normals[:, 1] = 1.0
        return t, normals

    def albedo(self, points):
        x = (points[:, 0] - self.center[0]) / self.tile
        z = (points[:, 2] - self.center[2]) / self.tile
        ix, iz = np.floor(x).astype(np.int64), np.floor(z).astype(np.int64)
        base = self._pick((ix + iz) % 2 == 1)
        bx, bz = np.floor_divide(ix, 4), np.floor_divide(iz, 4)
        noise = np.sin(bx * 12.9898 + bz * 78.233) * 43758.5453
        factor = 0.85 + 0.3 * (noise - np.floor(noise))
        return np.clip(base * factor[:, None], 0.0, 1.0)

    def to_json(self):
        return {**super().to_json(), "extent": self.extent, "tile": self.tile}


# --------------------------------------------------------------------------------------
# Rendering.
# --------------------------------------------------------------------------------------
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
               supersample: int = 1) -> Tuple[np.ndarray, np.ndarray]:
    """World rays through sub-pixel centres, row-major.

    Sub-pixel ``(i, j)`` of pixel ``(u, v)`` sits at ``(u + (j + 0.5) / s, v + (i + 0.5) / s)``
    with ``s = supersample`` (``s = 1``: the pixel centre). Its camera-space direction is
    ``((x - W/2) / f, -(y - H/2) / f, -1)``, rotated into the world by ``c2w``.

    Args:
        c2w: (4, 4) or (3, 4) camera-to-world, OpenGL convention.
        width, height: image size in pixels.
        focal: focal length in pixels.
        supersample: sub-pixels per pixel side.

    Returns:
        origins: (H*s * W*s, 3) float64 world units.
        dirs: (H*s * W*s, 3) float64 unit directions; index ``y * (W*s) + x`` over the
            sub-pixel grid.
    """
    c2w = np.asarray(c2w, dtype=np.float64)
    xs = (np.arange(width * supersample) + 0.5) / supersample
    ys = (np.arange(height * supersample) + 0.5) / supersample
    x, y = np.meshgrid(xs, ys, indexing="xy")
    cam = np.stack([(x - 0.5 * width) / focal, -(y - 0.5 * height) / focal,
                    -np.ones_like(x)], axis=-1).reshape(-1, 3)
    dirs = cam @ c2w[:3, :3].T
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    origins = np.broadcast_to(c2w[:3, 3], dirs.shape).copy()
    return origins, dirs


def trace(primitives: Sequence[Primitive], origins: np.ndarray, dirs: np.ndarray,
          light_dir: np.ndarray, ambient: float) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nearest hit over all primitives and its Lambertian colour.

    Each primitive is first culled with its bounding sphere, then intersected exactly on
    the remaining rays.

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
    hit = best_id >= 0
    rgb = np.zeros((n, 3))
    points = origins + np.where(hit, best_t, 0.0)[:, None] * dirs
    lambert = np.clip(np.einsum("ij,j->i", best_normal, light_dir), 0.0, 1.0)
    shade = ambient + (1.0 - ambient) * lambert
    for k, prim in enumerate(primitives):
        idx = np.flatnonzero(best_id == k)
        if idx.size:
            rgb[idx] = prim.albedo(points[idx]) * shade[idx, None]
    return np.clip(rgb, 0.0, 1.0), hit, best_t


def render_view(spec: "SceneSpec", c2w: np.ndarray, width: int, height: int,
                supersample: int = _SUPERSAMPLE) -> np.ndarray:
    """Renders one view of a scene with ``supersample`` x ``supersample`` anti-aliasing.

    Args:
        spec: the scene.
        c2w: (4, 4) camera-to-world, OpenGL convention.
        width, height: image size in pixels; the focal length follows from
            ``spec.camera_angle_x`` and ``width``.
        supersample: sub-pixels per pixel side.

    Returns:
        (H, W, 4) float32 RGBA in [0, 1], straight alpha (RGB 0 where alpha is 0).
    """
    focal = focal_from_angle(width, spec.camera_angle_x)
    origins, dirs = pixel_rays(c2w, width, height, focal, supersample)
    rgb, hit, _ = trace(spec.primitives, origins, dirs, spec.light_dir, spec.ambient)
    s = supersample
    rgb = rgb.reshape(height, s, width, s, 3).sum(axis=(1, 3))
    count = hit.reshape(height, s, width, s).sum(axis=(1, 3)).astype(np.float64)
    alpha = count / (s * s)
    rgb = rgb / np.maximum(count, 1.0)[..., None]
    return np.concatenate([rgb, alpha[..., None]], axis=-1).astype(np.float32)


# --------------------------------------------------------------------------------------
# Scenes.
# --------------------------------------------------------------------------------------
@dataclass
class SceneSpec:
    """A procedural scene: geometry, light and cameras.

    Attributes:
        kind: ``"objects"`` or ``"wide"``.
        primitives: the K primitives.
        light_dir: (3,) float64 unit vector towards the directional light.
        ambient: ambient fraction of the shading.
        camera_angle_x: horizontal field of view in radians.
        near, far: ray bounds in world units, written to the JSON.
        aabb: (2, 3) float64 [min, max] box holding all visible content.
        c2w: split name -> (V, 4, 4) float64 camera-to-world, OpenGL convention.
    """

    kind: str
    primitives: List[Primitive]
    light_dir: np.ndarray
    ambient: float
    camera_angle_x: float
    near: float
    far: float
    aabb: np.ndarray
    c2w: Dict[str, np.ndarray]


def _light() -> np.ndarray:
    light = np.array([0.45, 1.0, 0.3])
    return light / np.linalg.norm(light)


def _objects_cameras(rng: np.random.Generator, num: int, ring: bool) -> np.ndarray:
    """(num, 4, 4) cameras at radius 4 looking at the origin: random on the upper
    hemisphere (elevation 5-75 degrees, uniform in area) or a ring at 30 degrees."""
    radius = 4.0
    if ring:
        azimuth = np.linspace(0.0, 2.0 * math.pi, num, endpoint=False)
        elevation = np.full(num, math.radians(30.0))
    else:
        azimuth = rng.uniform(0.0, 2.0 * math.pi, num)
        sin_el = rng.uniform(math.sin(math.radians(5.0)), math.sin(math.radians(75.0)), num)
        elevation = np.arcsin(sin_el)
    eyes = radius * np.stack([np.cos(elevation) * np.cos(azimuth), np.sin(elevation),
                              np.cos(elevation) * np.sin(azimuth)], axis=1)
    return np.stack([look_at(e, (0.0, 0.0, 0.0)) for e in eyes]) if num else np.zeros((0, 4, 4))


def _objects_scene(seed: int, num_train: int, num_val: int, num_test: int) -> SceneSpec:
    """Object-centred scene: a checkered platform carrying four textured primitives.

    The big striped sphere contains the origin, so every ray towards the origin hits.
    """
    rng = np.random.default_rng([seed, 0])
    jitter = lambda: rng.uniform(-0.05, 0.05)  # noqa: E731
    top = -0.55  # platform top surface
    tint = lambda c: 0.35 * np.asarray(c) + 0.65  # noqa: E731  (same hue, lighter)
    dark = lambda c: 0.45 * np.asarray(c)  # noqa: E731  (same hue, darker)
    red, blue = np.array([0.80, 0.22, 0.18]), np.array([0.18, 0.40, 0.88])
    green, yellow = np.array([0.22, 0.70, 0.30]), np.array([0.92, 0.78, 0.15])
    magenta = np.array([0.78, 0.25, 0.75])
    cyl_xz = (-0.50 + jitter(), -0.45 + jitter())
    cyl_half = 0.40
    prims: List[Primitive] = [
        Box(np.array([0.0, top - 0.25, 0.0]), _rotation_y(rng.uniform(0, 2 * math.pi)), red,
            tint(red), half_extents=np.array([0.8, 0.25, 0.8]), checks_per_unit=5.0),
        Sphere(np.array([0.15 + jitter(), top + 0.45, 0.10 + jitter()]), _tilt(rng, 0.6), blue,
               dark(blue), radius=0.45, num_stripes=9),
        Cylinder(np.array([cyl_xz[0], top + cyl_half, cyl_xz[1]]), np.eye(3), green, dark(green),
                 radius=0.22, half_height=cyl_half, num_stripes=12),
        Box(np.array([-0.50 + jitter(), top + 0.25, 0.55 + jitter()]), _random_rotation(rng),
            yellow, dark(yellow), half_extents=np.full(3, 0.18), checks_per_unit=8.0),
        Sphere(np.array([cyl_xz[0], top + 2 * cyl_half + 0.2, cyl_xz[1]]), _tilt(rng, 1.2),
               magenta, tint(magenta), radius=0.2, num_stripes=6),
    ]
    for prim in prims:
        lo, hi = prim.bounds()
        assert lo.min() >= -1.2 and hi.max() <= 1.2, (prim, lo, hi)
    c2w = {"train": _objects_cameras(np.random.default_rng([seed, 1]), num_train, False),
           "val": _objects_cameras(np.random.default_rng([seed, 2]), num_val, False),
           "test": _objects_cameras(np.random.default_rng([seed, 3]), num_test, True)}
    return SceneSpec("objects", prims, _light(), 0.35, 0.6911112070083618, 2.0, 6.0,
                     np.array([[-1.5] * 3, [1.5] * 3]), c2w)


_WIDE_EXTENT = 8.0
_WIDE_CELLS = 5  # objects are placed on a jittered 5x5 grid of cells, at most one per cell


def _footprint(prim: Primitive) -> float:
    """Radius in the xz plane of a vertical cylinder holding ``prim``."""
    lo, hi = prim.bounds()
    return float(np.linalg.norm(0.5 * (hi - lo)[[0, 2]]))


def _wide_objects(rng: np.random.Generator) -> List[Primitive]:
    cell = 2.0 * _WIDE_EXTENT / _WIDE_CELLS
    cells = rng.permutation(_WIDE_CELLS * _WIDE_CELLS)[: int(rng.integers(18, 25))]
    prims: List[Primitive] = []
    for index in sorted(cells):
        i, j = divmod(int(index), _WIDE_CELLS)
        hue = rng.uniform(0.0, 1.0)
        color = np.array(colorsys.hsv_to_rgb(hue, rng.uniform(0.45, 0.8), rng.uniform(0.65, 0.92)))
        alt = 0.45 * color
        shape = rng.choice(["box", "sphere", "cylinder"], p=[0.45, 0.25, 0.3])
        if shape == "box":
            half = np.array([rng.uniform(0.3, 0.9), rng.uniform(0.3, 1.25), rng.uniform(0.3, 0.9)])
            prim: Primitive = Box(np.array([0.0, half[1], 0.0]),
                                  _rotation_y(rng.uniform(0, 2 * math.pi)), color,
                                  0.35 * color + 0.65, half_extents=half, checks_per_unit=2.5)
        elif shape == "sphere":
            radius = rng.uniform(0.4, 0.9)
            prim = Sphere(np.array([0.0, radius, 0.0]), _tilt(rng, 0.8), color, alt,
                          radius=radius, num_stripes=int(rng.integers(5, 10)))
        else:
            radius, half_height = rng.uniform(0.25, 0.6), rng.uniform(0.4, 1.2)
            prim = Cylinder(np.array([0.0, half_height, 0.0]), np.eye(3), color, alt,
                            radius=radius, half_height=half_height,
                            num_stripes=int(rng.integers(8, 16)))
        margin = max(0.5 * cell - _footprint(prim) - 0.05, 0.0)
        x = -_WIDE_EXTENT + (j + 0.5) * cell + rng.uniform(-margin, margin)
        z = -_WIDE_EXTENT + (i + 0.5) * cell + rng.uniform(-margin, margin)
        prim.center = prim.center + np.array([x, 0.0, z])
        prims.append(prim)
    return prims


def _wide_camera(position_xz: np.ndarray, height: float, yaw: float, pitch: float) -> np.ndarray:
    """(4, 4) c2w at ``(x, height, z)`` looking along azimuth ``yaw`` (radians, from +X
    towards +Z) and ``pitch`` radians below the horizon, no roll."""
    eye = np.array([position_xz[0], height, position_xz[1]])
    forward = np.array([math.cos(pitch) * math.cos(yaw), -math.sin(pitch),
                        math.cos(pitch) * math.sin(yaw)])
    return look_at(eye, eye + forward)


def _clear_of(objects: Sequence[Primitive], xz: np.ndarray, clearance: float = 0.4) -> bool:
    return all(np.linalg.norm(xz - p.center[[0, 2]]) > _footprint(p) + clearance for p in objects)


def _wide_cameras(rng: np.random.Generator, objects: Sequence[Primitive], num: int,
                  ring: bool) -> np.ndarray:
    """(num, 4, 4) low cameras looking outward and down.

    Random: distance from the centre uniform in 0.3-4 (denser near the centre, which only
    nearby cameras see), height 1.5-3, yaw within +-45 degrees of the outward radial
    direction, pitch 20-35 degrees down.
    Ring: radius 3 (moved in or out where an object stands), height 2.2, radial yaw,
    pitch 27.5 degrees. Positions closer than 0.4 to an object's footprint are avoided.
    """
    out = []
    for k in range(num):
        if ring:
            angle = 2.0 * math.pi * k / num
            direction = np.array([math.cos(angle), math.sin(angle)])
            radius = next((r for r in (3.0, 2.5, 3.5, 2.0, 4.0, 1.5, 4.5, 1.0)
                           if _clear_of(objects, r * direction)), 0.5)
            out.append(_wide_camera(radius * direction, 2.2, angle, math.radians(27.5)))
            continue
        while True:
            radius = rng.uniform(0.3, 4.0)
            angle = rng.uniform(0.0, 2.0 * math.pi)
            xz = radius * np.array([math.cos(angle), math.sin(angle)])
            if _clear_of(objects, xz):
                break
        yaw = angle + math.radians(rng.uniform(-45.0, 45.0))
        out.append(_wide_camera(xz, rng.uniform(1.5, 3.0), yaw,
                                math.radians(rng.uniform(20.0, 35.0))))
    return np.stack(out) if out else np.zeros((0, 4, 4))


def _wide_scene(seed: int, num_train: int, num_val: int, num_test: int) -> SceneSpec:
    """Large scene: objects scattered over a tiled ground, low outward-looking cameras."""
    rng = np.random.default_rng([seed, 100])
    objects = _wide_objects(rng)
    ground = GroundPlane(np.zeros(3), np.eye(3), np.array([0.62, 0.60, 0.52]),
                         np.array([0.40, 0.44, 0.36]), extent=_WIDE_EXTENT, tile=1.0)
    top = max(p.bounds()[1, 1] for p in objects)
    aabb = np.array([[-_WIDE_EXTENT, -0.5, -_WIDE_EXTENT],
                     [_WIDE_EXTENT, max(top, 3.0) + 0.5, _WIDE_EXTENT]])
    c2w = {"train": _wide_cameras(np.random.default_rng([seed, 101]), objects, num_train, False),
           "val": _wide_cameras(np.random.default_rng([seed, 102]), objects, num_val, False),
           "test": _wide_cameras(np.random.default_rng([seed, 103]), objects, num_test, True)}
    return SceneSpec("wide", [ground, *objects], _light(), 0.35, 0.9, 0.1, 25.0, aabb, c2w)


def build_scene(kind: str = "objects", num_train: int = 60, num_val: int = 8,
                num_test: int = 20, seed: int = 0) -> SceneSpec:
    """Builds (without rendering) the procedural scene ``kind``.

    Args:
        kind: ``"objects"`` or ``"wide"``.
        num_train, num_val, num_test: views per split.
        seed: layout and camera seed; the same arguments always give the same scene.

    Returns:
        The scene's geometry, light, bounds and cameras.

    Raises:
        ValueError: unknown ``kind`` or negative view counts.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown synthetic scene kind {kind!r}; expected one of {KINDS}")
    for name, value in (("num_train", num_train), ("num_val", num_val), ("num_test", num_test)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    builder = _objects_scene if kind == "objects" else _wide_scene
    return builder(int(seed), int(num_train), int(num_val), int(num_test))


# --------------------------------------------------------------------------------------
# Writing and caching.
# --------------------------------------------------------------------------------------
def scene_name(kind: str, resolution: int, seed: int, num_train: int, num_val: int,
               num_test: int) -> str:
    """Directory name of a generated scene; includes :data:`VERSION` and every parameter,
    e.g. ``objects_r100_s0_n60-8-20_v1``."""
    return f"{kind}_r{resolution}_s{seed}_n{num_train}-{num_val}-{num_test}_{VERSION}"


def write_scene(spec: SceneSpec, out_dir: Path, resolution: int) -> None:
    """Renders every view of ``spec`` and writes the Blender-format files into ``out_dir``.

    Args:
        spec: the scene.
        out_dir: existing directory to write into (not the marker; the caller adds it).
        resolution: image width and height in pixels.
    """
    out_dir = Path(out_dir)
    for split in SPLITS:
        (out_dir / split).mkdir(exist_ok=True)
        frames = []
        for i, c2w in enumerate(spec.c2w[split]):
            rgba = render_view(spec, c2w, resolution, resolution)
            iio.imwrite(out_dir / split / f"r_{i}.png",
                        np.round(np.clip(rgba, 0.0, 1.0) * 255.0).astype(np.uint8))
            frames.append({"file_path": f"./{split}/r_{i}", "rotation": 0.0,
                           "transform_matrix": c2w.tolist()})
        meta = {"camera_angle_x": spec.camera_angle_x, "near": spec.near, "far": spec.far,
                "aabb": spec.aabb.tolist(), "world_up": [0.0, 1.0, 0.0], "frames": frames}
        (out_dir / f"transforms_{split}.json").write_text(json.dumps(meta, indent=1))
    description = {"kind": spec.kind, "version": VERSION, "resolution": resolution,
                   "light_dir": spec.light_dir.tolist(), "ambient": spec.ambient,
                   "primitives": [p.to_json() for p in spec.primitives]}
    (out_dir / "scene.json").write_text(json.dumps(description, indent=1))


def _remove_stale_temps(cache_dir: Path) -> None:
    """Best effort: deletes temp dirs of crashed generators older than an hour."""
    now = time.time()
    for path in cache_dir.glob(".tmp-*"):
        try:
            if path.is_dir() and now - path.stat().st_mtime > _STALE_TEMP_AGE:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def ensure_scene(cache_dir: str | os.PathLike, kind: str = "objects", resolution: int = 100,
                 num_train: int = 60, num_val: int = 8, num_test: int = 20,
                 seed: int = 0) -> Path:
    """Returns the root of a generated scene, generating it on first use.

    The scene is rendered into a fresh temp dir inside ``cache_dir``, the completion
    marker is written last, and the dir is renamed to its final name in one atomic
    ``os.rename``; concurrent callers (several ranks) therefore never see a half-written
    scene. A caller that loses the rename race uses the winner's copy. A root without the
    marker (not made by this function) is replaced.

    Args:
        cache_dir: directory holding generated scenes (created if missing).
        kind: ``"objects"`` (default, object-centred) or ``"wide"`` (large ground scene).
        resolution: image width and height in pixels.
        num_train, num_val, num_test: views per split.
        seed: layout and camera seed.

    Returns:
        ``cache_dir / scene_name(...)``, holding ``transforms_{train,val,test}.json``,
        ``{train,val,test}/r_<i>.png`` and ``scene.json``.

    Raises:
        ValueError: unknown ``kind``, ``resolution < 1`` or negative view counts.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown synthetic scene kind {kind!r}; expected one of {KINDS}")
    if int(resolution) < 1:
        raise ValueError(f"resolution must be >= 1, got {resolution}")
    cache_dir = Path(cache_dir)
    root = cache_dir / scene_name(kind, int(resolution), int(seed), num_train, num_val, num_test)
    if (root / MARKER).is_file():
        return root
    spec = build_scene(kind, num_train, num_val, num_test, seed)
    cache_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(cache_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{root.name}-", dir=cache_dir))
    try:
        os.chmod(tmp, 0o755)
        write_scene(spec, tmp, int(resolution))
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


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: generates a scene (if needed) and prints its root."""
    parser = argparse.ArgumentParser(prog="python -m distnerf.data.synthetic",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=KINDS, default="objects")
    parser.add_argument("--resolution", type=int, default=100)
    parser.add_argument("--out", required=True, help="cache directory")
    parser.add_argument("--num-train", type=int, default=60)
    parser.add_argument("--num-val", type=int, default=8)
    parser.add_argument("--num-test", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    root = ensure_scene(args.out, args.kind, args.resolution, args.num_train, args.num_val,
                        args.num_test, args.seed)
    print(root)
    print(f"ready in {time.perf_counter() - start:.2f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
