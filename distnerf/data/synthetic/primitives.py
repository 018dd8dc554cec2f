"""Analytic primitives of the procedural scenes: shape, exact ray intersection, texture.

Legend: N rays or surface points.

Every primitive is a dataclass with a world ``center``, a local-to-world ``rotation`` and
two albedos (``colour``, ``alt_colour``) that its procedural texture alternates between.
It answers :meth:`~Primitive.intersect` (nearest hit and outward normal, closed form in
numpy), :meth:`~Primitive.albedo` (texture at surface points), bounds for culling and
layout, and :meth:`~Primitive.to_json` (its entry in ``scene.json``).

Conventions: world right-handed, +Y up, arbitrary world units; all arrays float64.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Tuple

import numpy as np

# Smallest accepted hit distance (world units): hits closer to the origin are ignored.
_EPS = 1e-6


@dataclass
class Primitive:
    """Base of the analytic primitives.

    Attributes:
        center: (3,) float64 world position of the primitive's centre.
        rotation: (3, 3) float64 local-to-world rotation; its columns are the local
            axes in world coordinates. World point ``p`` has local coordinates
            ``R^T (p - center)``.
        colour: (3,) float64 base albedo in [0, 1].
        alt_colour: (3,) float64 second albedo of the texture (same hue as ``colour``).
    """

    center: np.ndarray
    rotation: np.ndarray
    colour: np.ndarray
    alt_colour: np.ndarray

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
        """JSON description (type, geometry, colours); written to ``scene.json``.

        The colours are written under the keys ``"color"`` and ``"alt_color"`` (the file
        format's spelling, kept so that existing scenes and readers stay valid).
        """
        return {"type": self.type_name, "center": self.center.tolist(),
                "rotation": self.rotation.tolist(), "color": self.colour.tolist(),
                "alt_color": self.alt_colour.tolist()}

    def _pick(self, odd: np.ndarray) -> np.ndarray:
        return np.where(odd[:, None], self.alt_colour, self.colour)


@dataclass
class Sphere(Primitive):
    """Sphere with latitude stripes (about its local +Y axis).

    Attributes:
        radius: world units.
        num_stripes: stripes from pole to pole, alternating ``colour``/``alt_colour``.
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

    The tiles alternate ``colour``/``alt_colour``; blocks of 4x4 tiles get a deterministic
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
