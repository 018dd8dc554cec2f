"""Scene specs of the procedural scenes: layout, light, bounds and cameras.

(Over 500 lines on purpose: one declarative spec per built-in scene, kept together so that a scene's layout,
bounds and cameras read in one place; the code that uses them is in the sibling modules.)

Legend: V views of a split (or of a city's flight), K primitives of a scene.

Four kinds of scene (:data:`KINDS`), built by :func:`build_scene`:

* ``"objects"`` (the default, object-centred like lego): a checkered platform carrying
  four textured primitives (five primitives in all) inside [-1.2, 1.2]^3, transparent
  background, cameras on the upper hemisphere of radius 4 looking at the origin; three
  independent camera sets for train, val and test.
* ``"detail"`` (object-centred, capacity-bound): one unit sphere at the origin under a
  band-limited solid texture (:class:`~distnerf.data.synthetic.primitives.TexturedSphere`),
  cameras on the upper hemisphere of radius 3.2, transparent background; 100 / 8 / 25
  views of 200 x 200 by default. Smooth detail everywhere and one silhouette: a model's
  error is the texture it cannot hold, so quality grows with its parameters
  (``conf/study/capacity.yaml``).
* ``"city_small"`` and ``"city"`` (aerial, for spatial segmentation): a grid of blocks
  (3 x 3, resp. 8 x 8, pitch 5 world units, roads 1 wide, sidewalks 0.3) of box
  buildings (:class:`~distnerf.data.synthetic.primitives.Building`: window grids on the
  facades, textured roofs, heights 0.8-5, resp. 0.8-6 with some towers up to 10) on a
  textured ground (:class:`~distnerf.data.synthetic.primitives.CityGround`: roads,
  sidewalks, plazas, parks, fields beyond the outer roads) ending 3 units beyond the outer
  road centre lines, under a sky at infinity (:class:`~distnerf.data.synthetic.tracer.Sky`:
  opaque images). One flight (:class:`Survey`) of 12, resp. 49 stations at altitude 12,
  resp. 14, five views per station (a nadir view with camera 1, four 40-degree obliques
  with camera 2, see :func:`_city_flight`): 60, resp. 245 views, neighbours sharing most
  of their footprint. Split of the flight (LLFF holdout protocol): test = views 0, 8, 16,
  ..., train = the others, val = the first :data:`CITY_NUM_VAL` test views. Each image
  gets an RGB gain: exposure uniform in [0.85, 1.15] times a white balance uniform in
  [0.95, 1.05] per channel (``appearance_jitter``; ones without it).

Image sizes (:func:`image_size`): ``resolution`` is the image width; objects' images are
square, cities' are 4:3 (height ``round(3 W / 4)``). The default resolution is per kind
(:data:`DEFAULT_RESOLUTION`: objects 100 x 100, detail 200 x 200, city_small 100 x 75,
city 160 x 120).

Conventions: world right-handed, **+Y up** (unlike Blender's Z-up scenes); the ground of
the cities is the plane y = 0; arbitrary world units. Cameras are (4, 4) float64 ``c2w``
(camera-to-world), OpenGL convention (see :mod:`~distnerf.data.synthetic.tracer`). The
same arguments always give the same scene (seeded numpy generators), and a city's first
views do not depend on how many views are kept (``num_views``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from distnerf.data.synthetic.primitives import (Box, Building, CityGround, Cylinder, Primitive,
                                                Sphere, TexturedSphere)
from distnerf.data.synthetic.tracer import Sky, focal_from_angle, look_at

KINDS = ("objects", "detail", "city_small", "city")
CITY_KINDS = ("city_small", "city")
#: Image width of each kind when ``resolution`` is not given, pixels.
DEFAULT_RESOLUTION = {"objects": 100, "detail": 200, "city_small": 100, "city": 160}
# Views per split (train, val, test) of the object-centred kinds when not given.
_OBJECT_COUNTS = {"objects": (60, 8, 20), "detail": (100, 8, 25)}


def image_size(kind: str, resolution: Optional[int] = None) -> Tuple[int, int]:
    """(width, height) in pixels of the images of ``kind``.

    ``resolution`` (default :data:`DEFAULT_RESOLUTION` of the kind) is the width; the
    height equals it for the object-centred kinds (``"objects"``, ``"detail"``) and is
    ``round(3 * width / 4)`` (at least 1) for the cities.
    """
    width = DEFAULT_RESOLUTION[kind] if resolution is None else int(resolution)
    return width, (max(1, (3 * width + 2) // 4) if kind in CITY_KINDS else width)


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
        kind: one of :data:`KINDS`.
        primitives: the K primitives.
        light_dir: (3,) float64 unit vector towards the directional light.
        ambient: ambient fraction of the shading.
        camera_angle_x: horizontal field of view in radians.
        near, far: ray bounds in world units, written to the JSON.
        aabb: (2, 3) float64 [min, max] box holding all visible content.
        c2w: split name -> (V, 4, 4) float64 camera-to-world, OpenGL convention.
        sky: background of the rays that hit nothing; None: transparent.
        survey: a city's flight (all views in order, cameras, gains, split indices, the
            COLMAP frame); None for ``"objects"``, whose splits are separate camera sets.
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
    sky: Optional[Sky] = None
    survey: Optional[Survey] = None


def _light() -> np.ndarray:
    light = np.array([0.45, 1.0, 0.3])
    return light / np.linalg.norm(light)


def _objects_cameras(rng: np.random.Generator, num: int, ring: bool, radius: float = 4.0) -> np.ndarray:
    """(num, 4, 4) cameras at ``radius`` looking at the origin: random on the upper
    hemisphere (elevation 5-75 degrees, uniform in area) or a ring at 30 degrees."""
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


# Waves of the detail scene's texture: how many, their frequency band (cycles per world unit,
# log-uniform: the same energy in every octave) and the texture's standard deviation per channel.
_DETAIL_WAVES, _DETAIL_BAND, _DETAIL_STD = 96, (0.5, 6.0), 0.18


def _detail_scene(seed: int, num_train: int, num_val: int, num_test: int) -> SceneSpec:
    """Object-centred scene with smooth detail everywhere: one sphere of radius 1 at the
    origin under a band-limited solid texture (:class:`TexturedSphere`: 96 plane waves,
    0.5-6 cycles per unit, even energy per octave), cameras at radius 3.2 (the sphere
    fills about 90% of the image width), transparent background.

    Its one silhouette is a small share of the pixels, so a model's error is in the
    texture it cannot hold: quality grows with capacity over a wide range of budgets
    (the capacity study, bench/scaling/capacity.md), where lego's error sits at edges.
    """
    rng = np.random.default_rng([seed, 0])
    directions = rng.normal(size=(_DETAIL_WAVES, 3))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    lo, hi = np.log(_DETAIL_BAND[0]), np.log(_DETAIL_BAND[1])
    frequencies = directions * np.exp(rng.uniform(lo, hi, _DETAIL_WAVES))[:, None]
    phases = rng.uniform(0.0, 2.0 * math.pi, _DETAIL_WAVES)
    # each wave's variance is a^2 / 2: the sum has _DETAIL_STD per channel on average
    amplitudes = rng.normal(size=(_DETAIL_WAVES, 3)) * _DETAIL_STD * math.sqrt(2.0 / _DETAIL_WAVES)
    colour = np.array([0.55, 0.50, 0.45])
    sphere = TexturedSphere(np.zeros(3), np.eye(3), colour, colour.copy(), radius=1.0, num_stripes=1,
                            frequencies=frequencies, phases=phases, amplitudes=amplitudes)
    radius = 3.2
    c2w = {"train": _objects_cameras(np.random.default_rng([seed, 1]), num_train, False, radius),
           "val": _objects_cameras(np.random.default_rng([seed, 2]), num_val, False, radius),
           "test": _objects_cameras(np.random.default_rng([seed, 3]), num_test, True, radius)}
    return SceneSpec("detail", [sphere], _light(), 0.35, 0.6911112070083618, radius - 1.2, radius + 1.2,
                     np.array([[-1.1] * 3, [1.1] * 3]), c2w)


# ------------------------------------------------------------------------------ city
# Block pitch (road centre line to road centre line), road and sidewalk widths, and the
# ground beyond the outer road centre lines, world units (both city kinds).
_PITCH, _ROAD, _SIDEWALK, _MARGIN = 5.0, 1.0, 0.3, 3.0
_SIDEWALK_COLOUR = np.array([0.62, 0.60, 0.56])  # the ground's JSON colour (its texture has its own)
# Per kind: blocks per side, flight stations (along x, along z) and their spacing (world
# units), flight altitude, building heights (min, max), share of blocks' buildings with a
# tower on top, park blocks, candidate surface points of the COLMAP model.
_CITY_SIZES = {
    "city_small": dict(num_blocks=3, stations=(4, 3), spacing=(4.0, 4.5), altitude=12.0,
                       heights=(0.8, 5.0), towers=0.0, num_parks=1, num_points=5000),
    "city": dict(num_blocks=8, stations=(7, 7), spacing=(5.5, 5.5), altitude=14.0,
                 heights=(0.8, 6.0), towers=0.15, num_parks=6, num_points=20000),
}
_NADIR_FOV, _OBLIQUE_FOV = math.radians(60.0), math.radians(48.0)  # horizontal, radians
_OBLIQUE_TILT = math.radians(40.0)  # off nadir
_OBLIQUE_PRINCIPAL = (0.5 + 1.0 / 64.0, 0.5 - 1.0 / 48.0)  # (cx / W, cy / H)
_HEADINGS = (0.0, 0.5 * math.pi, math.pi, 1.5 * math.pi)  # azimuth from +X towards +Z
#: Val views of a city kind by default: the first test images.
CITY_NUM_VAL = 3
#: Every HOLDOUT-th image of a city's flight (0, 8, 16, ...) is a test image (LLFF protocol).
HOLDOUT = 8
_WALLS = np.array([[0.78, 0.72, 0.62], [0.70, 0.70, 0.70], [0.86, 0.84, 0.80], [0.62, 0.34, 0.28],
                   [0.80, 0.68, 0.50], [0.48, 0.48, 0.50], [0.62, 0.70, 0.78], [0.74, 0.60, 0.52]])
_ROOFS = np.array([[0.42, 0.42, 0.42], [0.28, 0.28, 0.30], [0.58, 0.55, 0.48], [0.36, 0.48, 0.30],
                   [0.55, 0.30, 0.25]])
_GLASS = np.array([[0.16, 0.22, 0.32], [0.22, 0.28, 0.30], [0.30, 0.36, 0.45]])


@dataclass
class PinholeCamera:
    """One of a city's two cameras (COLMAP ``PINHOLE``), independent of the image size.

    Attributes:
        camera_id: COLMAP camera id (1: nadir, 2: oblique).
        angle_x: horizontal field of view in radians.
        principal: (cx / W, cy / H), the principal point as fractions of the image size.
    """

    camera_id: int
    angle_x: float
    principal: Tuple[float, float] = (0.5, 0.5)

    def intrinsics(self, width: int, height: int) -> np.ndarray:
        """(4,) float64 ``(fx, fy, cx, cy)`` in pixels of a ``width`` x ``height`` image
        (square pixels: ``fx = fy = 0.5 * W / tan(0.5 * angle_x)``)."""
        focal = focal_from_angle(width, self.angle_x)
        return np.array([focal, focal, self.principal[0] * width, self.principal[1] * height])


@dataclass
class Survey:
    """The aerial capture of a city: one flight, every image in flight order.

    Attributes:
        c2w: (V, 4, 4) float64 camera-to-world of the V views, OpenGL convention.
        camera_ids: (V,) int64 camera of each view (a key of ``cameras``).
        cameras: camera id -> camera.
        gains: (V, 3) float64 per-image RGB gain (exposure times white balance), applied
            to the rendered colour before clipping and quantisation; ones without jitter.
        splits: split name -> ascending (n,) int64 view indices; test every
            :data:`HOLDOUT`-th view, train the others, val the first test views.
        colmap_from_scene: (4, 4) float64 similarity ``[[s R, t], [0, 1]]`` taking scene
            points to the COLMAP model's frame.
        num_points: surface points sampled as candidates for the COLMAP model.
        seed: seed of that sampling.
    """

    c2w: np.ndarray
    camera_ids: np.ndarray
    cameras: Dict[int, PinholeCamera]
    gains: np.ndarray
    splits: Dict[str, np.ndarray]
    colmap_from_scene: np.ndarray
    num_points: int
    seed: int

    @property
    def names(self) -> List[str]:
        """Image file names in flight order: ``img_0000.png``, ``img_0001.png``, ..."""
        return [f"img_{i:04d}.png" for i in range(len(self.c2w))]

    def intrinsics(self, width: int, height: int) -> np.ndarray:
        """(V, 4) float64 ``(fx, fy, cx, cy)`` of every view, pixels."""
        return np.stack([self.cameras[int(c)].intrinsics(width, height) for c in self.camera_ids])


def _small_rotation(rng: np.random.Generator, max_angle: float) -> np.ndarray:
    """(3, 3) rotation by up to ``max_angle`` radians about a uniformly random axis."""
    axis = rng.normal(size=3)
    axis /= np.linalg.norm(axis)
    angle = rng.uniform(0.0, max_angle)
    k = np.array([[0.0, -axis[2], axis[1]], [axis[2], 0.0, -axis[0]], [-axis[1], axis[0], 0.0]])
    return np.eye(3) + math.sin(angle) * k + (1.0 - math.cos(angle)) * (k @ k)


def _block_buildings(rng: np.random.Generator, lo: np.ndarray, hi: np.ndarray, size: dict,
                     first_salt: int) -> List[Primitive]:
    """Buildings of one block interior ``[lo, hi]`` (xz): 1 to 6 lots, one building per lot
    (setback 0.1-0.3), some with a narrower tower on top."""
    patterns = [(1, 1), (2, 1), (1, 2), (2, 2), (3, 2), (2, 3)]
    split_x, split_z = patterns[rng.choice(len(patterns), p=[0.1, 0.15, 0.15, 0.3, 0.15, 0.15])]
    lot = (hi - lo) / np.array([split_x, split_z])
    out: List[Primitive] = []
    for i in range(split_x):
        for j in range(split_z):
            lot_lo = lo + lot * np.array([i, j]) + rng.uniform(0.1, 0.3, 2)
            lot_hi = lo + lot * np.array([i + 1, j + 1]) - rng.uniform(0.1, 0.3, 2)
            low, high = size["heights"]
            height = low + (high - low) * rng.uniform() ** 1.5  # mostly low, a few tall
            wall = _WALLS[rng.integers(len(_WALLS))] * rng.uniform(0.9, 1.05)
            common = dict(floor_height=rng.uniform(0.4, 0.55), bay_width=rng.uniform(0.3, 0.5),
                          window_colour=_GLASS[rng.integers(len(_GLASS))],
                          roof_colour=_ROOFS[rng.integers(len(_ROOFS))])
            tiers = [(lot_lo, lot_hi, 0.0, height)]
            if rng.uniform() < size["towers"]:
                centre, half = 0.5 * (lot_lo + lot_hi), 0.3 * (lot_hi - lot_lo)
                tiers.append((centre - half, centre + half, height, height + rng.uniform(2.0, 4.0)))
            for tier_lo, tier_hi, base, top in tiers:
                half_extents = np.array([0.5 * (tier_hi[0] - tier_lo[0]), 0.5 * (top - base),
                                         0.5 * (tier_hi[1] - tier_lo[1])])
                centre = np.array([0.5 * (tier_lo[0] + tier_hi[0]), 0.5 * (base + top),
                                   0.5 * (tier_lo[1] + tier_hi[1])])
                out.append(Building(centre, np.eye(3), np.clip(wall, 0.0, 1.0),
                                    np.clip(0.8 * wall, 0.0, 1.0), half_extents=half_extents,
                                    salt=first_salt + len(out), **common))
    return out


def _city_layout(rng: np.random.Generator, size: dict) -> Tuple[CityGround, List[Primitive]]:
    """The ground and the buildings of a city centred on the origin."""
    n = size["num_blocks"]
    parks = tuple(sorted(int(k) for k in rng.choice(n * n, size["num_parks"], replace=False)))
    ground = CityGround(np.zeros(3), np.eye(3), _SIDEWALK_COLOUR, _SIDEWALK_COLOUR,
                        extent=0.5 * n * _PITCH + _MARGIN, tile=_PITCH, pitch=_PITCH,
                        num_blocks=n, road_width=_ROAD, sidewalk_width=_SIDEWALK, parks=parks)
    inset = 0.5 * _ROAD + _SIDEWALK
    buildings: List[Primitive] = []
    for i in range(n):
        for j in range(n):
            if i * n + j in parks:
                continue
            corner = -0.5 * n * _PITCH + _PITCH * np.array([i, j])
            buildings += _block_buildings(rng, corner + inset, corner + _PITCH - inset, size,
                                          len(buildings))
    return ground, buildings


def _oblique(eye: np.ndarray, heading: float) -> np.ndarray:
    """(4, 4) c2w at ``eye`` looking 40 degrees off nadir towards azimuth ``heading``, no roll."""
    forward = np.array([math.sin(_OBLIQUE_TILT) * math.cos(heading), -math.cos(_OBLIQUE_TILT),
                        math.sin(_OBLIQUE_TILT) * math.sin(heading)])
    return look_at(eye, eye + forward)


def _city_flight(rng: np.random.Generator, size: dict) -> Tuple[np.ndarray, np.ndarray]:
    """Every view of the full flight in order: c2w (V, 4, 4) and camera ids (V,).

    Stations on a serpentine grid (rows along x, alternating direction, rows stepping in
    +z), positions jittered by up to 10% of the spacing and the altitude by 0.3. At each
    station: one nadir view (camera 1, image up = world -Z) from straight above, then
    four obliques (camera 2) tilted 40 degrees off nadir with headings +X, +Z, -X, -Z, each
    placed ``altitude * tan(40 deg)`` back from the station so that all five views aim at
    the station's ground point. Every attitude gets a random rotation of up to 1.5 degrees.
    """
    (nx, nz), (sx, sz), altitude = size["stations"], size["spacing"], size["altitude"]
    nadir = np.eye(4)
    nadir[:3, :3] = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, -1.0, 0.0]])
    c2w, ids = [], []
    for row in range(nz):
        columns = range(nx) if row % 2 == 0 else reversed(range(nx))
        for col in columns:
            ground = np.array([(col - 0.5 * (nx - 1)) * sx, 0.0, (row - 0.5 * (nz - 1)) * sz])
            ground += np.array([rng.uniform(-0.1, 0.1) * sx, 0.0, rng.uniform(-0.1, 0.1) * sz])
            height = altitude + rng.uniform(-0.3, 0.3)
            view = nadir.copy()
            view[:3, 3] = ground + np.array([0.0, height, 0.0])
            views = [view]
            for heading in _HEADINGS:
                back = height * math.tan(_OBLIQUE_TILT) * np.array([math.cos(heading), 0.0,
                                                                     math.sin(heading)])
                views.append(_oblique(ground + np.array([0.0, height, 0.0]) - back, heading))
            for k, view in enumerate(views):
                view[:3, :3] = _small_rotation(rng, math.radians(1.5)) @ view[:3, :3]
                c2w.append(view)
                ids.append(1 if k == 0 else 2)
    return np.stack(c2w), np.array(ids, dtype=np.int64)


def city_num_views(kind: str) -> int:
    """Views of the full flight of city kind ``kind`` (5 per station)."""
    nx, nz = _CITY_SIZES[kind]["stations"]
    return 5 * nx * nz


def _similarity(rng: np.random.Generator) -> np.ndarray:
    """(4, 4) random similarity: uniform rotation, scale log-uniform in [0.3, 3],
    translation uniform in [-5, 5]^3."""
    scale = math.exp(rng.uniform(math.log(0.3), math.log(3.0)))
    out = np.eye(4)
    out[:3, :3] = scale * _random_rotation(rng)
    out[:3, 3] = rng.uniform(-5.0, 5.0, 3)
    return out


def _bounds(c2w: np.ndarray, aabb: np.ndarray) -> Tuple[float, float]:
    """(near, far): 0.9 x the smallest camera-to-box distance (at least 0.05) and 1.02 x
    the largest camera-to-corner distance over the views ``c2w`` (V, 4, 4)."""
    eyes = c2w[:, :3, 3]
    gap = np.maximum(np.maximum(aabb[0] - eyes, eyes - aabb[1]), 0.0)
    corners = np.array([[aabb[i, 0], aabb[j, 1], aabb[k, 2]] for i in (0, 1) for j in (0, 1)
                        for k in (0, 1)])
    reach = np.linalg.norm(eyes[:, None] - corners[None], axis=-1).max()
    return max(0.9 * float(np.linalg.norm(gap, axis=1).min()), 0.05), 1.02 * float(reach)


def _city_scene(kind: str, seed: int, num_val: int, num_views: int,
                appearance_jitter: bool) -> SceneSpec:
    """City scene: blocks of buildings on a textured ground under a sky, flown over."""
    size = _CITY_SIZES[kind]
    ground, buildings = _city_layout(np.random.default_rng([seed, 200]), size)
    c2w, ids = _city_flight(np.random.default_rng([seed, 201]), size)
    full = len(c2w)
    app = np.random.default_rng([seed, 202])  # drawn for the full flight: views keep their gains
    gains = app.uniform(0.85, 1.15, (full, 1)) * app.uniform(0.95, 1.05, (full, 3))
    if not appearance_jitter:
        gains = np.ones((full, 3))
    c2w, ids, gains = c2w[:num_views], ids[:num_views], gains[:num_views]
    index = np.arange(num_views)
    test = index[index % HOLDOUT == 0]
    splits = {"train": index[index % HOLDOUT != 0], "val": test[:num_val], "test": test}
    top = max(float(b.bounds()[1, 1]) for b in buildings)
    extent = ground.extent
    aabb = np.array([[-extent, -0.5, -extent], [extent, top + 0.5, extent]])
    near, far = _bounds(c2w, aabb)
    cameras = {1: PinholeCamera(1, _NADIR_FOV), 2: PinholeCamera(2, _OBLIQUE_FOV, _OBLIQUE_PRINCIPAL)}
    survey = Survey(c2w, ids, cameras, gains, splits, _similarity(np.random.default_rng([seed, 203])),
                    size["num_points"], int(seed))
    sky = Sky(np.array([0.32, 0.52, 0.85]), np.array([0.80, 0.86, 0.92]), np.array([0.55, 0.60, 0.62]))
    return SceneSpec(kind, [ground, *buildings], _light(), 0.35, _NADIR_FOV, near, far, aabb,
                     {name: c2w[idx] for name, idx in splits.items()}, sky=sky, survey=survey)


def split_counts(kind: str, num_train: Optional[int] = None, num_val: Optional[int] = None,
                 num_test: Optional[int] = None,
                 num_views: Optional[int] = None) -> Tuple[int, int, int, int]:
    """Checks the view counts of a scene and fills in the kind's defaults.

    ``"objects"`` and ``"detail"``: ``num_train``, ``num_val``, ``num_test`` (default 60, 8, 20,
    resp. 100, 8, 25); no ``num_views``. Cities: ``num_views`` (default: the full flight, 60 or 245) first views
    of the flight, of which ``ceil(num_views / 8)`` are test views and the rest train;
    ``num_val`` (default :data:`CITY_NUM_VAL`, at most the number of test views) first
    test views are the val split; ``num_train`` and ``num_test`` follow and must be None.

    Returns:
        (num_train, num_val, num_test, num_views); ``num_views`` is 0 for the object-centred kinds.

    Raises:
        ValueError: unknown ``kind``, negative or inconsistent counts, no train or test view of an
            object-centred kind (names the argument).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown synthetic scene kind {kind!r}; expected one of {KINDS}")
    for name, value in (("num_train", num_train), ("num_val", num_val), ("num_test", num_test),
                        ("num_views", num_views)):
        if value is not None and int(value) < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if kind not in CITY_KINDS:
        if num_views is not None:
            raise ValueError(f"num_views is for the city kinds, not {kind!r} (got {num_views})")
        counts = [_OBJECT_COUNTS[kind][i] if v is None else int(v)
                  for i, v in enumerate((num_train, num_val, num_test))]
        for name, value in (("num_train", counts[0]), ("num_test", counts[2])):
            if value < 1:
                raise ValueError(f"{name} of kind {kind!r} must be >= 1 (a split with no view), got {value}")
        return counts[0], counts[1], counts[2], 0
    for name, value in (("num_train", num_train), ("num_test", num_test)):
        if value is not None:
            raise ValueError(f"{name} of kind {kind!r} follows from num_views (every "
                             f"{HOLDOUT}th view is a test view); leave it unset, got {value}")
    full = city_num_views(kind)
    views = full if num_views is None else int(num_views)
    if not 1 <= views <= full:
        raise ValueError(f"num_views of kind {kind!r} must be in [1, {full}], got {num_views}")
    num_test = (views + HOLDOUT - 1) // HOLDOUT
    val = min(CITY_NUM_VAL, num_test) if num_val is None else int(num_val)
    if val > num_test:
        raise ValueError(f"num_val={num_val} exceeds the {num_test} test views of {views} views")
    return views - num_test, val, num_test, views


def build_scene(kind: str = "objects", num_train: Optional[int] = None,
                num_val: Optional[int] = None, num_test: Optional[int] = None, seed: int = 0,
                appearance_jitter: bool = True, num_views: Optional[int] = None) -> SceneSpec:
    """Builds (without rendering) the procedural scene ``kind``.

    Args:
        kind: one of :data:`KINDS`.
        num_train, num_val, num_test, num_views: view counts, see :func:`split_counts`.
        seed: layout and camera seed; the same arguments always give the same scene.
        appearance_jitter: cities: per-image exposure and white-balance gains (else ones);
            ignored by the object-centred kinds.

    Returns:
        The scene's geometry, light, bounds and cameras (and a city's :class:`Survey`).

    Raises:
        ValueError: unknown ``kind``, bad view counts.
    """
    num_train, num_val, num_test, num_views = split_counts(kind, num_train, num_val, num_test,
                                                           num_views)
    if kind == "objects":
        return _objects_scene(int(seed), num_train, num_val, num_test)
    if kind == "detail":
        return _detail_scene(int(seed), num_train, num_val, num_test)
    return _city_scene(kind, int(seed), num_val, num_views, bool(appearance_jitter))
