"""Analytic primitives of the procedural scenes: shape, exact ray intersection, texture.

(Over 500 lines on purpose: one small dataclass per primitive kind, each with its closed-form intersection and
normal; splitting them would scatter one concern, the analytic geometry the tracer relies on, over files.)

Legend: N rays or surface points.

Every primitive is a dataclass with a world ``center``, a local-to-world ``rotation`` and
two albedos (``colour``, ``alt_colour``) that its procedural texture alternates between.
It answers :meth:`~Primitive.intersect` (nearest hit and outward normal, closed form in
numpy), :meth:`~Primitive.albedo` (texture at surface points), bounds for culling and
layout, and :meth:`~Primitive.to_json` (its entry in ``scene.json``). The city's
primitives (:class:`Building`, :class:`CityGround`) also answer
:meth:`~Primitive.sample_surface` (the candidate points of the COLMAP model).

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

    def sample_surface(self, rng: np.random.Generator, num: int) -> Tuple[np.ndarray, np.ndarray]:
        """``num`` points uniform (by area) on the surface that can be seen from outside.

        Returns:
            points: (num, 3) float64 world points on the surface.
            normals: (num, 3) float64 outward unit normals there.
        """
        raise NotImplementedError

    def _pick(self, odd: np.ndarray) -> np.ndarray:
        return np.where(odd[:, None], self.alt_colour, self.colour)


def hash01(*keys: np.ndarray) -> np.ndarray:
    """Deterministic pseudo-random numbers in [0, 1) from integer keys (texture noise).

    Args:
        keys: integer arrays of one broadcast shape (cell indices, face ids, salts).

    Returns:
        float64 array of that shape; the same keys always give the same value.
    """
    mixed = np.zeros(np.broadcast(*keys).shape, dtype=np.uint64)
    for i, key in enumerate(keys):
        # int64 -> uint64 wraps negative keys (two's complement): distinct keys stay distinct.
        word = np.asarray(key, dtype=np.int64).astype(np.uint64) + np.uint64((i * 0x632BE59BD9B4E019) % (1 << 64))
        mixed = (mixed ^ word) * np.uint64(0x9E3779B97F4A7C15)
        mixed ^= mixed >> np.uint64(29)
    mixed = (mixed ^ (mixed >> np.uint64(32))) * np.uint64(0xD6E8FEB86659FD93)
    mixed ^= mixed >> np.uint64(32)
    return (mixed >> np.uint64(11)).astype(np.float64) / float(1 << 53)


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
class TexturedSphere(Sphere):
    """Sphere with a band-limited solid texture: smooth detail everywhere, no edges.

    The albedo at a surface point ``p`` (local frame ``x = R^T (p - c)``) is
    ``clip(colour + sum_k a_k sin(2 pi f_k . x + phi_k), 0, 1)``, a sum of K plane waves
    of 3-D frequencies ``f_k`` (cycles per world unit) with RGB amplitudes ``a_k``: a
    "solid texture" (Perlin, SIGGRAPH 1985) with a known spectrum. The scene ``"detail"``
    spreads the waves' energy evenly over octaves of frequency, so a grid of voxel edge
    ``h`` can hold the waves below its Nyquist frequency ``1 / (2 h)`` and loses the
    others: the information in the pixels grows with the model's resolution, unlike a
    checkerboard's, whose error sits at its edges.

    Attributes:
        frequencies: (K, 3) float64 wave vectors, cycles per world unit (local frame).
        phases: (K,) float64 radians.
        amplitudes: (K, 3) float64 RGB amplitude of each wave.
    """

    frequencies: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    phases: np.ndarray = field(default_factory=lambda: np.zeros(0))
    amplitudes: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    type_name = "textured_sphere"

    def albedo(self, points):
        local = (points - self.center) @ self.rotation
        waves = np.sin(2.0 * math.pi * (local @ self.frequencies.T) + self.phases)  # (N, K)
        return np.clip(self.colour + waves @ self.amplitudes, 0.0, 1.0)

    def to_json(self):
        return {**super().to_json(), "frequencies": self.frequencies.tolist(),
                "phases": self.phases.tolist(), "amplitudes": self.amplitudes.tolist()}


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


@dataclass
class Building(Box):
    """Box building standing on its base: window grids on the facades, a textured roof.

    The facades (the four vertical faces) are divided into floors of ``floor_height`` and
    an equal number of bays per face (about ``bay_width`` wide); each bay of each floor
    holds one window (``window_colour`` times a per-window brightness in [0.55, 1.45],
    clipped: lit and dark windows), the ground floor a wider shop window. Wall colour
    ``colour``, with an ``alt_colour`` band under each floor's windows and a plain band of
    0.12 at the top (the parapet). The roof is ``roof_colour`` times a noise in [0.8, 1.2]
    on 0.3-unit cells inside a parapet rim 0.1 wide (wall colour). The bottom face is plain
    wall colour (it lies on the ground and is never seen).

    Attributes:
        floor_height: world units.
        bay_width: approximate window spacing along a facade, world units.
        window_colour: (3,) float64 glass albedo.
        roof_colour: (3,) float64 roof albedo.
        salt: integer making this building's window and roof noise its own.
    """

    floor_height: float = 0.5
    bay_width: float = 0.4
    window_colour: np.ndarray = field(default_factory=lambda: np.array([0.18, 0.24, 0.34]))
    roof_colour: np.ndarray = field(default_factory=lambda: np.array([0.45, 0.45, 0.43]))
    salt: int = 0
    type_name = "building"

    def albedo(self, points):
        local = (points - self.center) @ self.rotation
        axis = np.argmax(np.abs(local) / self.half_extents, axis=1)
        out = np.empty((local.shape[0], 3))
        roof = axis == 1
        out[roof] = self._roof(local[roof])
        facade = ~roof
        out[facade] = self._facade(local[facade], axis[facade])
        return out

    def _facade(self, local: np.ndarray, axis: np.ndarray) -> np.ndarray:
        height = local[:, 1] + self.half_extents[1]  # above the base
        # Horizontal coordinate along the face: local z on the +-x faces, local x on +-z.
        along = np.where(axis == 0, local[:, 2] + self.half_extents[2], local[:, 0] + self.half_extents[0])
        length = np.where(axis == 0, 2.0 * self.half_extents[2], 2.0 * self.half_extents[0])
        bays = np.maximum(np.round(length / self.bay_width), 1.0)
        s = along / (length / bays)
        column = np.floor(s).astype(np.int64)
        fs = s - column
        f = height / self.floor_height
        floor = np.floor(f).astype(np.int64)
        fy = f - floor
        parapet = height > 2.0 * self.half_extents[1] - 0.12
        upper = (floor >= 1) & (fs > 0.2) & (fs < 0.8) & (fy > 0.3) & (fy < 0.85)
        shop = (floor == 0) & (fs > 0.08) & (fs < 0.92) & (fy > 0.1) & (fy < 0.8)
        window = (upper | shop) & ~parapet
        face = 2 * axis + (local[np.arange(local.shape[0]), axis] > 0)
        lit = 0.55 + 0.9 * hash01(floor, column, face, np.int64(self.salt))
        glass = np.clip(self.window_colour * lit[:, None], 0.0, 1.0)
        wall = np.where(((fy < 0.12) & ~parapet)[:, None], self.alt_colour, self.colour)
        return np.where(window[:, None], glass, wall)

    def _roof(self, local: np.ndarray) -> np.ndarray:
        top = local[:, 1] > 0.0
        rim = np.minimum(self.half_extents[0] - np.abs(local[:, 0]),
                         self.half_extents[2] - np.abs(local[:, 2])) < 0.1
        ix = np.floor((local[:, 0] + self.half_extents[0]) / 0.3).astype(np.int64)
        iz = np.floor((local[:, 2] + self.half_extents[2]) / 0.3).astype(np.int64)
        noise = 0.8 + 0.4 * hash01(ix, iz, np.int64(self.salt))
        roof = np.clip(self.roof_colour * noise[:, None], 0.0, 1.0)
        return np.where((top & ~rim)[:, None], roof, self.colour)

    def sample_surface(self, rng, num):
        """Points on the roof and the four facades (not the bottom), uniform by area."""
        hx, hy, hz = self.half_extents
        # Faces: +x, -x, +z, -z (facades), +y (roof); (normal axis, sign, area).
        faces = [(0, 1.0, 4 * hy * hz), (0, -1.0, 4 * hy * hz), (2, 1.0, 4 * hx * hy),
                 (2, -1.0, 4 * hx * hy), (1, 1.0, 4 * hx * hz)]
        area = np.array([f[2] for f in faces])
        which = rng.choice(len(faces), size=num, p=area / area.sum())
        local = rng.uniform(-1.0, 1.0, size=(num, 3)) * self.half_extents
        normal_local = np.zeros((num, 3))
        for k, (axis, sign, _) in enumerate(faces):
            rows = which == k
            local[rows, axis] = sign * self.half_extents[axis]
            normal_local[rows, axis] = sign
        return self.center + local @ self.rotation.T, normal_local @ self.rotation.T

    def to_json(self):
        return {**super().to_json(), "floor_height": self.floor_height, "bay_width": self.bay_width,
                "window_color": self.window_colour.tolist(), "roof_color": self.roof_colour.tolist(),
                "salt": self.salt}


# Ground albedos of the city (see CityGround).
_ASPHALT = np.array([0.24, 0.24, 0.26])
_MARKING = np.array([0.88, 0.84, 0.55])
_SIDEWALK = np.array([0.62, 0.60, 0.56])
_PLAZA = np.array([0.56, 0.53, 0.47])
_GRASS = np.array([0.30, 0.50, 0.22])
_FIELDS = np.array([[0.42, 0.52, 0.25], [0.55, 0.50, 0.30], [0.35, 0.45, 0.22], [0.60, 0.56, 0.38]])


@dataclass
class CityGround(GroundPlane):
    """The city's ground: the square patch ``center +- extent`` of the plane y = ``center[1]``.

    A grid of ``num_blocks`` x ``num_blocks`` blocks of side ``pitch`` (road centre line to
    road centre line) centred on ``center``: roads ``road_width`` wide (asphalt, dashed
    centre lines 0.1 wide, dashes 0.45 of every 0.8), sidewalks ``sidewalk_width`` wide
    (paving with joints every 0.25), block interiors either plaza (paving noise on 0.5
    cells) or, for the blocks listed in ``parks``, grass (noise on 0.4 cells). Outside the
    outer roads and sidewalks: fields (strips 1.5 wide, colours by strip). ``colour`` and
    ``alt_colour`` are not used by the texture (kept for the JSON of every primitive).

    Attributes:
        pitch: block spacing, world units.
        num_blocks: blocks per side.
        road_width, sidewalk_width: world units.
        parks: flat indices ``i * num_blocks + j`` (i along x, j along z) of the park blocks.
    """

    pitch: float = 5.0
    num_blocks: int = 3
    road_width: float = 1.0
    sidewalk_width: float = 0.3
    parks: Tuple[int, ...] = ()
    type_name = "city_ground"

    def albedo(self, points):
        half = 0.5 * self.num_blocks * self.pitch
        gx = points[:, 0] - self.center[0] + half  # 0 at the first road's centre line
        gz = points[:, 2] - self.center[2] + half
        r = 0.5 * self.road_width
        # Distance to the nearest road centre line, in x and in z.
        dx = np.abs(gx - self.pitch * np.clip(np.round(gx / self.pitch), 0, self.num_blocks))
        dz = np.abs(gz - self.pitch * np.clip(np.round(gz / self.pitch), 0, self.num_blocks))
        span = self.num_blocks * self.pitch
        reach = r + self.sidewalk_width
        in_city = (gx > -reach) & (gx < span + reach) & (gz > -reach) & (gz < span + reach)
        road = in_city & ((dx < r) | (dz < r))
        sidewalk = in_city & ~road & (np.minimum(dx, dz) < reach)
        interior = in_city & ~road & ~sidewalk
        n = points.shape[0]
        out = np.empty((n, 3))
        # Fields outside the city.
        strip = np.floor((points[:, 0] + 0.6 * points[:, 2]) / 1.5).astype(np.int64)
        out[:] = _FIELDS[np.floor(4 * hash01(strip, np.int64(7))).astype(np.int64)]
        # Roads: asphalt noise on 0.5 cells, dashed centre lines away from crossings.
        cell_x = np.floor(gx / 0.5).astype(np.int64)
        cell_z = np.floor(gz / 0.5).astype(np.int64)
        asphalt = _ASPHALT * (0.9 + 0.2 * hash01(cell_x, cell_z, np.int64(1)))[:, None]
        along_x = (dz < 0.05) & (dx >= r) & (np.mod(gx, 0.8) < 0.45)
        along_z = (dx < 0.05) & (dz >= r) & (np.mod(gz, 0.8) < 0.45)
        out[road] = np.where((along_x | along_z)[road, None], _MARKING, asphalt[road])
        joint = (np.mod(gx, 0.25) < 0.03) | (np.mod(gz, 0.25) < 0.03)
        out[sidewalk] = np.where(joint[sidewalk, None], 0.8 * _SIDEWALK, _SIDEWALK)
        block = (np.clip(np.floor(gx / self.pitch), 0, self.num_blocks - 1) * self.num_blocks
                 + np.clip(np.floor(gz / self.pitch), 0, self.num_blocks - 1)).astype(np.int64)
        park = interior & np.isin(block, np.asarray(self.parks, dtype=np.int64))
        plaza = interior & ~park
        grass = _GRASS * (0.8 + 0.4 * hash01(np.floor(gx / 0.4).astype(np.int64),
                                              np.floor(gz / 0.4).astype(np.int64), np.int64(2)))[:, None]
        out[park] = grass[park]
        paving = _PLAZA * (0.85 + 0.3 * hash01(np.floor(gx / 0.5).astype(np.int64),
                                                np.floor(gz / 0.5).astype(np.int64), np.int64(3)))[:, None]
        out[plaza] = paving[plaza]
        return np.clip(out, 0.0, 1.0)

    def sample_surface(self, rng, num):
        """Points uniform on the square patch; normals +Y."""
        xz = rng.uniform(-self.extent, self.extent, size=(num, 2))
        points = np.stack([xz[:, 0], np.zeros(num), xz[:, 1]], axis=1) + self.center
        return points, np.tile([0.0, 1.0, 0.0], (num, 1))

    def to_json(self):
        return {**super().to_json(), "pitch": self.pitch, "num_blocks": self.num_blocks,
                "road_width": self.road_width, "sidewalk_width": self.sidewalk_width,
                "parks": list(self.parks)}
