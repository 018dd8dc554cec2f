"""Scene specs of the procedural scenes: layout, light, bounds and cameras.

Legend: V views of a split, K primitives of a scene.

Two kinds of scene (:data:`KINDS`), built by :func:`build_scene`:

* ``"objects"`` (the default, object-centred like lego): a checkered platform carrying
  four textured primitives (five primitives in all) inside [-1.2, 1.2]^3, transparent
  background, cameras on the upper hemisphere of radius 4 looking at the origin.
* ``"wide"`` (large, for spatial segmentation): 18-24 objects scattered over a tiled
  ground plane spanning [-8, 8] in x and z, seen by low cameras (height 1.5-3) that look
  outward and 20-35 degrees down; sky is transparent.

Conventions: world right-handed, **+Y up** (unlike Blender's Z-up scenes); the ground of
``"wide"`` is the plane y = 0; arbitrary world units. Cameras are (4, 4) float64 ``c2w``
(camera-to-world), OpenGL convention (see :mod:`distnerf.data.synthetic.tracer`). The
same arguments always give the same scene (seeded numpy generators).
"""
from __future__ import annotations

import colorsys
import math
from dataclasses import dataclass
from typing import Dict, List, Sequence

import numpy as np

from distnerf.data.synthetic.primitives import Box, Cylinder, GroundPlane, Primitive, Sphere
from distnerf.data.synthetic.tracer import look_at

KINDS = ("objects", "wide")


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
        colour = np.array(colorsys.hsv_to_rgb(hue, rng.uniform(0.45, 0.8), rng.uniform(0.65, 0.92)))
        alt = 0.45 * colour
        shape = rng.choice(["box", "sphere", "cylinder"], p=[0.45, 0.25, 0.3])
        if shape == "box":
            half = np.array([rng.uniform(0.3, 0.9), rng.uniform(0.3, 1.25), rng.uniform(0.3, 0.9)])
            prim: Primitive = Box(np.array([0.0, half[1], 0.0]),
                                  _rotation_y(rng.uniform(0, 2 * math.pi)), colour,
                                  0.35 * colour + 0.65, half_extents=half, checks_per_unit=2.5)
        elif shape == "sphere":
            radius = rng.uniform(0.4, 0.9)
            prim = Sphere(np.array([0.0, radius, 0.0]), _tilt(rng, 0.8), colour, alt,
                          radius=radius, num_stripes=int(rng.integers(5, 10)))
        else:
            radius, half_height = rng.uniform(0.25, 0.6), rng.uniform(0.4, 1.2)
            prim = Cylinder(np.array([0.0, half_height, 0.0]), np.eye(3), colour, alt,
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
