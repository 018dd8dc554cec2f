"""Scene normalisation shared by the importers of real captures (COLMAP, nerfstudio).

Legend: N cameras, P points, O observations (image, point) pairs.

A capture comes in its own world frame (COLMAP's: arbitrary orientation and scale). The
importers express it in a *scene* frame that the rest of distnerf expects: +Y up (the
orbit video turns about +Y), the content around the origin, roughly within [-1, 1]^3.
The change of frame is one similarity ``p_scene = s R p + t`` (:class:`Similarity`),
fitted once over all images of the capture (so every split shares it) and stored in
``SceneData.transform`` as a 4x4 ``matrix`` with ``p_scene = matrix @ [p_source, 1]``.

Robust statistics: extents are per-axis percentiles (``PERCENTILES``, 2nd to 98th), not
min/max, so a few stray triangulated points or a lost camera do not blow up the box.

Ray bounds are distances along unit ray directions (distnerf's ``near``/``far``), so the
per-camera bounds use the Euclidean distance of each observed point from the camera
centre, not its z-depth (which underestimates the distance for off-axis pixels).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from distnerf.data.blender import as_aabb
from distnerf.data.poses import c2w_from_cam_from_world, cam_from_world_from_c2w, rotation_between  # noqa: F401 (re-exported)

log = logging.getLogger("distnerf")

PERCENTILES = (2.0, 98.0)   # robust extent of points and cameras
AABB_MARGIN = 0.1           # box padding, a fraction of the box's largest side, on every side
NEAR_MARGIN, FAR_MARGIN = 0.9, 1.1   # per-camera near = 0.9 x 2nd-percentile distance, far = 1.1 x 98th
MIN_POINTS = 16             # fewer observed points than this: the camera gets the global bounds
NEAR_FRACTION = 0.01        # without points: near of a camera inside the box, a fraction of its diagonal
FOCUS_IN_VIEW = 0.9         # without points: the cameras' images frame one object if this many hold their focus point
FOCUS_MAX_ELEVATION = 45.0  # ... and the cameras' median elevation over it is below this (degrees; above: a ground)
UP = np.array([0.0, 1.0, 0.0])
ORIENT_METHODS = ("up", "vertical", "none")


def estimate_up(c2w: np.ndarray, method: str = "vertical") -> Optional[np.ndarray]:
    """The world's up direction seen from the cameras.

    * ``"up"``: the mean of the cameras' up vectors (c2w column 1), as nerfstudio's
      ``auto_orient_and_center_poses(method="up")``: right for cameras held upright at
      every heading (hand-held, turntable), but biased wherever the up vectors share a
      horizontal direction: the nadir views of an aerial flight all point theirs along
      the flight, and tilt the estimate (21 degrees on the built-in ``city_small``).
    * ``"vertical"`` (the default): the normal of the plane spanned by the cameras'
      right vectors (c2w column 0; cameras with little roll keep them horizontal, nadir
      ones too), on the side of the mean of the up and back vectors (c2w columns 1 and 2;
      both skywards for cameras looking less than 45 degrees up); 0.2 degrees on
      ``city_small``. Two fallbacks to the mean up vector: right vectors nearly parallel
      (one flight line, a forward-facing capture: no plane; the mean up vector loses its
      component along the common right vector), and right vectors that are not near a
      plane (rolled cameras: portrait and landscape shots mixed).
    * ``"none"``: no orientation (returns None).

    Args:
        c2w: (N, 3, 4) camera-to-world, OpenGL.
        method: one of ``ORIENT_METHODS``.

    Returns:
        (3,) float64 unit vector, or None (``"none"``, or up vectors cancelling out).
    """
    if method not in ORIENT_METHODS:
        raise ValueError(f"orientation method must be one of {ORIENT_METHODS}, got {method!r}")
    if method == "none":
        return None
    up = c2w[:, :, 1].mean(0)
    if method == "vertical":
        right = c2w[:, :, 0]
        _, sing, vh = np.linalg.svd(right, full_matrices=False)
        # sing[1] / sqrt(N): RMS cosine between the right vectors and the plane's second axis;
        # below ~0.17 (10 degrees) the right vectors are too close to parallel to span a plane.
        # sing[2] / sqrt(N): RMS cosine between the right vectors and the normal; above ~0.26
        # (15 degrees) they are not near one plane and its normal means nothing.
        if len(right) >= 3 and sing[2] > 0.26 * np.sqrt(len(right)):
            log.warning("normalisation: the cameras' right vectors are not near one plane (rolled cameras?); "
                        "up axis from the mean up vector instead")
        elif len(right) >= 2 and sing[1] > 0.17 * np.sqrt(len(right)):
            normal = vh[2]
            reference = up + c2w[:, :, 2].mean(0)  # up and back vectors: both point skywards unless a
            up = normal if normal @ reference >= 0 else -normal  # camera looks up more than 45 degrees
        else:
            up = up - vh[0] * (up @ vh[0])
    norm = np.linalg.norm(up)
    if norm < 1e-6:
        log.warning("normalisation: the cameras' up vectors cancel out, orientation left unchanged")
        return None
    return up / norm


def robust_box(values: np.ndarray, percentiles: Sequence[float] = PERCENTILES) -> np.ndarray:
    """Per-axis percentile box of a point set: (2, 3) float64 [low, high]."""
    return np.percentile(np.asarray(values, dtype=np.float64), list(percentiles), axis=0)


def focus_point(c2w: np.ndarray) -> Optional[np.ndarray]:
    """The point nearest (least squares) to every camera's optical axis, if well defined.

    Solves ``sum_i (I - d_i d_i^T)(p - o_i) = 0`` over camera centres ``o_i`` and viewing
    directions ``d_i`` (c2w's -z). None when the axes are nearly parallel (the system is
    ill-conditioned) or the point is behind most cameras.
    """
    origins, dirs = c2w[:, :, 3], -c2w[:, :, 2]
    dirs = dirs / np.linalg.norm(dirs, axis=1, keepdims=True)
    proj = np.eye(3)[None] - dirs[:, :, None] * dirs[:, None, :]
    lhs, rhs = proj.sum(0), (proj @ origins[:, :, None]).sum(0)[:, 0]
    if len(c2w) < 2 or np.linalg.cond(lhs) > 1e4:
        return None
    point = np.linalg.solve(lhs, rhs)
    if np.mean(np.einsum("ij,ij->i", point - origins, dirs) > 0) < 0.5:
        return None
    return point


@dataclass
class Similarity:
    """``p_scene = scale * rotation @ p + translation``.

    Attributes:
        rotation: (3, 3) float64 rotation.
        scale: positive float.
        translation: (3,) float64, scene units.
    """

    rotation: np.ndarray
    scale: float
    translation: np.ndarray

    @classmethod
    def identity(cls) -> "Similarity":
        return cls(np.eye(3), 1.0, np.zeros(3))

    @property
    def matrix(self) -> np.ndarray:
        """(4, 4) float64 ``[[s R, t], [0, 1]]``."""
        out = np.eye(4)
        out[:3, :3] = self.scale * self.rotation
        out[:3, 3] = self.translation
        return out

    def points(self, points: np.ndarray) -> np.ndarray:
        """(..., 3) source points -> (..., 3) scene points."""
        return self.scale * np.asarray(points, dtype=np.float64) @ self.rotation.T + self.translation

    def c2w(self, c2w: np.ndarray) -> np.ndarray:
        """(..., 3, 4) source camera-to-world -> scene camera-to-world (rotation stays orthonormal)."""
        c2w = np.asarray(c2w, dtype=np.float64)
        return np.concatenate([self.rotation @ c2w[..., :3, :3], self.points(c2w[..., :3, 3])[..., None]], -1)

    def as_transform(self, source: str, **extra) -> dict:
        """The JSON-able ``SceneData.transform`` record."""
        return {"matrix": self.matrix.tolist(), "scale": float(self.scale), "source": source,
                "convention": "p_scene = matrix @ [p_source, 1]", **extra}


def fit_similarity(c2w: np.ndarray, points: Optional[np.ndarray] = None, orient: str = "vertical") -> Similarity:
    """The similarity into the scene frame: up to +Y, content centred, robust extent 1.

    1. Rotation: the smallest rotation taking :func:`estimate_up`'s direction to +Y
       (the rotation about +Y is left as it is).
    2. Centre (after rotating): with at least ``MIN_POINTS`` points, the centre of the
       points' percentile box (the content, not the cameras: an aerial capture's cameras
       are far above it); without, :func:`focus_point` of the cameras, else the centre
       of the cameras' percentile box.
    3. Scale: the percentile boxes of the camera centres and of the points (when given)
       fit in [-1, 1]^3 around the centre: ``s = 1 / max |corner - centre|``.

    Args:
        c2w: (N, 3, 4) camera-to-world in the source frame, OpenGL.
        points: optional (P, 3) sparse points in the source frame.
        orient: ``"up"``, ``"vertical"`` or ``"none"`` (see :func:`estimate_up`).

    Returns:
        The Similarity (identity scale when every extent is zero).
    """
    c2w = np.asarray(c2w, dtype=np.float64)
    up = estimate_up(c2w, orient)
    rotation = np.eye(3) if up is None else rotation_between(up, UP)
    centres = c2w[:, :, 3] @ rotation.T
    boxes = [robust_box(centres)]
    if points is not None and len(points) >= MIN_POINTS:
        box = robust_box(np.asarray(points, dtype=np.float64) @ rotation.T)
        boxes.append(box)
        centre = box.mean(0)
    else:
        focus = focus_point(c2w)
        centre = boxes[0].mean(0) if focus is None else rotation @ focus
    extent = max(float(np.abs(box - centre).max()) for box in boxes)
    scale = 1.0 / extent if extent > 1e-12 else 1.0
    return Similarity(rotation, scale, -scale * centre)


def points_box(points: np.ndarray, margin: float = AABB_MARGIN) -> np.ndarray:
    """Scene box of sparse points: their percentile box padded by ``margin`` times its
    largest side on every side (a flat scene keeps room above and below).

    Returns:
        (2, 3) float64 [min, max].
    """
    box = robust_box(points)
    pad = margin * max(float((box[1] - box[0]).max()), 1e-6)
    return box + np.array([[-pad], [pad]])


def cameras_box(c2w: np.ndarray) -> np.ndarray:
    """Scene box without points, after :func:`fit_similarity`: [-1, 1]^3, the box that
    holds the cameras' robust extent around the centre (the content is assumed within
    the cameras' hull around their focus point, as nerfstudio's default scene box).

    Extended to hold every camera centre, so no camera sits outside it by accident.
    """
    box = np.array([[-1.0] * 3, [1.0] * 3])
    centres = c2w[:, :, 3]
    return np.stack([np.minimum(box[0], centres.min(0)), np.maximum(box[1], centres.max(0))])


def bounds_from_points(c2w: np.ndarray, observed: Sequence[np.ndarray],
                       min_points: int = MIN_POINTS) -> tuple[np.ndarray, tuple[float, float]]:
    """Per-camera ray bounds from the sparse points each camera observes.

    For camera i with centre o_i and observed points p: distances ``|p - o_i|`` (the ray
    parameter along the unit direction of the pixel that sees p), ``near_i = NEAR_MARGIN *
    percentile(d, 2)``, ``far_i = FAR_MARGIN * percentile(d, 98)``. The global bounds are
    the same statistics over every observation of every camera; a camera seeing fewer
    than ``min_points`` points gets them.

    Args:
        c2w: (N, 3, 4) camera-to-world (scene frame).
        observed: N arrays (P_i, 3) of the points each camera observes (scene frame).
        min_points: the fewest points for bounds of a camera's own.

    Returns:
        (bounds (N, 2) float64 [near, far], (global near, global far)).

    Raises:
        ValueError: no observations at all.
    """
    distances = [np.linalg.norm(np.asarray(p, dtype=np.float64).reshape(-1, 3) - pose[:, 3], axis=1)
                 for pose, p in zip(c2w, observed)]
    pooled = np.concatenate(distances) if distances else np.zeros(0)
    if len(pooled) == 0:
        raise ValueError("no observed points to compute ray bounds from")

    def near_far(d):
        low, high = np.percentile(d, list(PERCENTILES))
        return NEAR_MARGIN * low, max(FAR_MARGIN * high, NEAR_MARGIN * low * 1.01)

    fallback = near_far(pooled)
    bounds = np.array([near_far(d) if len(d) >= min_points else fallback for d in distances])
    return bounds, (float(fallback[0]), float(fallback[1]))


def bounds_from_box(c2w: np.ndarray, aabb: np.ndarray) -> np.ndarray:
    """Per-camera ray bounds from the scene box alone (no points).

    ``far_i``: the distance from the camera centre to the box's farthest corner (no ray
    stays in the box longer); ``near_i``: the distance to the box (0 inside it), at least
    ``NEAR_FRACTION`` of the box's diagonal.

    Args:
        c2w: (N, 3, 4) camera-to-world (scene frame).
        aabb: (2, 3) [min, max].

    Returns:
        (N, 2) float64 [near, far].
    """
    aabb = np.asarray(aabb, dtype=np.float64)
    centres = c2w[:, :, 3]
    corners = np.stack(np.meshgrid(*aabb.T, indexing="ij"), -1).reshape(-1, 3)
    far = np.linalg.norm(centres[:, None] - corners[None], axis=-1).max(1)
    outside = np.maximum(np.maximum(aabb[0] - centres, centres - aabb[1]), 0.0)
    near = np.maximum(np.linalg.norm(outside, axis=1), NEAR_FRACTION * np.linalg.norm(aabb[1] - aabb[0]))
    return np.stack([near, far], 1)


def points_in_view(c2w: np.ndarray, intrinsics: np.ndarray, sizes: np.ndarray, points: np.ndarray,
                   chunk: int = 65536) -> list:
    """The sparse points each camera's image holds: in front of it and projecting inside
    its image rectangle (pinhole projection: lens distortion and occlusion are ignored).

    Stands in for COLMAP's per-image observations (``POINTS2D``) where only the point
    cloud is known (nerfstudio's ``sparse_pc.ply``); occluded points count too, so the
    far bounds come out a little looser than from the observations.

    Args:
        c2w: (N, 3, 4) camera-to-world, OpenGL (looking down -z), same frame as ``points``.
        intrinsics: (N, 4) ``fx, fy, cx, cy`` in pixels (top-left corner at (0, 0)).
        sizes: (N, 2) ``(height, width)`` in pixels, the size ``intrinsics`` refer to.
        points: (P, 3) points.
        chunk: points projected at once (memory: N x chunk x 3 float64).

    Returns:
        N arrays (P_i, 3) float64, the points in view of camera i.
    """
    c2w = np.asarray(c2w, dtype=np.float64)
    points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    fx, fy, cx, cy = (np.asarray(intrinsics, dtype=np.float64)[:, k, None] for k in range(4))
    height, width = (np.asarray(sizes, dtype=np.float64)[:, k, None] for k in range(2))
    keep = []
    for start in range(0, len(points), chunk):
        # camera coordinates: local = R^T (p - o); OpenGL looks down -z
        local = np.einsum("nji,npj->npi", c2w[:, :, :3], points[None, start:start + chunk] - c2w[:, None, :, 3])
        depth = -local[..., 2]
        with np.errstate(divide="ignore", invalid="ignore"):
            u = fx * local[..., 0] / depth + cx
            v = -fy * local[..., 1] / depth + cy
        keep.append((depth > 0) & (u >= 0) & (u <= width) & (v >= 0) & (v <= height))
    inside = np.concatenate(keep, 1) if keep else np.zeros((len(c2w), 0), dtype=bool)
    return [points[row] for row in inside]


def half_fov(intrinsics: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Per camera, the angle between the optical axis and the nearest side of the image's
    pyramid of view (pinhole): the half-angle of the largest cone around the axis that the
    image holds, ``min(atan(cx / fx), atan((w - cx) / fx), atan(cy / fy), atan((h - cy) / fy))``.

    Args:
        intrinsics: (N, 4) ``fx, fy, cx, cy`` in pixels.
        sizes: (N, 2) ``(height, width)`` in pixels.

    Returns:
        (N,) float64 radians.
    """
    fx, fy, cx, cy = np.asarray(intrinsics, dtype=np.float64).T
    height, width = np.asarray(sizes, dtype=np.float64).T
    return np.arctan(np.minimum(np.minimum(cx, width - cx) / fx, np.minimum(cy, height - cy) / fy))


def framed_sphere(c2w: np.ndarray, half_angles: np.ndarray, up: Optional[np.ndarray],
                  min_in_view: float = FOCUS_IN_VIEW,
                  max_elevation: float = FOCUS_MAX_ELEVATION) -> Optional[tuple[np.ndarray, float]]:
    """The content of a capture whose cameras converge on one object, from the cameras alone:
    the ball around their :func:`focus_point` that the images frame.

    Camera i at distance ``D_i`` from the focus point, its axis ``phi_i`` off it, holds in
    its image the ball of radius ``r_i = D_i sin(theta_i - phi_i)`` around it (``theta_i``:
    :func:`half_fov`; the ball tangent to the cone of half-angle ``theta_i``): the largest
    ball around the focus point that the image shows whole. An object captured from all
    sides with each image showing all of it (the usual orbit or hemisphere capture, e.g.
    the NeRF synthetic scenes, or a hand-held walk around an object) is taken to lie in it;
    the radius is the robust upper extent of the ``r_i`` (``PERCENTILES[1]``-th percentile:
    a few close-ups that show only a part do not shrink it). On lego (100 views, its
    sparse points as reference) the ball holds 99% of the points and gives near/far within
    3% of the COLMAP importer's (``bench/quality/ns_vs_colmap.py``). This is the
    convergence that instant-ngp's ``colmap2nerf.py`` uses (the "center of attention" of the
    optical axes, the cameras then scaled to a mean distance of 4 with the object assumed
    within radius ~1.5 of it), with the radius taken from the field of view instead of fixed.

    Defined only for such captures: a :func:`focus_point` (the axes converge, in front of
    most cameras) that at least ``min_in_view`` of the cameras hold in their image
    (``phi_i < theta_i``), seen from the side more than from above (the median elevation of
    the cameras over it, relative to ``up``, below ``max_elevation`` degrees: lego's
    hemisphere 32, a ring 1.5 above a radius of 4 21). Cameras looking down at their focus
    point see a ground that goes on past every frame (an aerial orbit: the built-in
    ``city_small``'s first 10 views converge at a median elevation of 50 degrees), where the
    ball would cut the scene; they, aerial and forward-facing captures (parallel axes),
    outward panoramas and a capture without ``up`` get None.

    Args:
        c2w: (N, 3, 4) camera-to-world, OpenGL.
        half_angles: (N,) :func:`half_fov` of each camera, radians.
        up: (3,) unit up direction (:func:`estimate_up`), or None.
        min_in_view: the fewest cameras, a fraction, whose image holds the focus point.
        max_elevation: degrees, see above.

    Returns:
        (centre (3,) float64, radius float) in ``c2w``'s frame and units, or None.
    """
    c2w = np.asarray(c2w, dtype=np.float64)
    focus = None if up is None else focus_point(c2w)
    if focus is None:
        return None
    offset = focus - c2w[:, :, 3]
    distance = np.linalg.norm(offset, axis=1)
    elevation = np.degrees(np.arcsin(np.clip(-offset @ up / np.maximum(distance, 1e-12), -1.0, 1.0)))
    if np.median(elevation) >= max_elevation:
        return None
    axes = -c2w[:, :, 2] / np.linalg.norm(c2w[:, :, 2], axis=1, keepdims=True)
    off_axis = np.arccos(np.clip(np.einsum("ij,ij->i", offset, axes) / np.maximum(distance, 1e-12), -1.0, 1.0))
    framed = off_axis < np.asarray(half_angles, dtype=np.float64)
    if framed.mean() < min_in_view:
        return None
    radii = distance[framed] * np.sin(np.asarray(half_angles, dtype=np.float64)[framed] - off_axis[framed])
    radius = float(np.percentile(radii, PERCENTILES[1]))
    return (focus, radius) if radius > 0 else None


def bounds_from_sphere(c2w: np.ndarray, centre: np.ndarray, radius: float) -> np.ndarray:
    """Per-camera ray bounds of a ball: ``near_i = |o_i - c| - r`` (at least ``NEAR_FRACTION``
    of the diameter: a camera inside the ball), ``far_i = |o_i - c| + r`` (no ray of camera i
    meets the ball outside that range).

    Args:
        c2w: (N, 3, 4) camera-to-world.
        centre: (3,) the ball's centre, same frame.
        radius: its radius, same units.

    Returns:
        (N, 2) float64 [near, far].
    """
    distance = np.linalg.norm(np.asarray(c2w, dtype=np.float64)[:, :, 3] - centre, axis=1)
    near = np.maximum(distance - radius, NEAR_FRACTION * 2.0 * radius)
    return np.stack([near, distance + radius], 1)


@dataclass
class Placement:
    """Every camera of a capture placed in the scene frame, with its ray bounds and the box.

    Attributes:
        c2w: (N, 3, 4) float64 camera-to-world, OpenGL, scene frame.
        bounds: (N, 2) float64 per-camera [near, far], scene units along unit directions.
        near, far: bounds holding every camera's (the scene's global ones).
        aabb: (2, 3) float64 scene box.
        transform: the ``SceneData.transform`` record, or None (not normalised).
    """

    c2w: np.ndarray
    bounds: np.ndarray
    near: float
    far: float
    aabb: np.ndarray
    transform: Optional[dict]


def place_capture(c2w: np.ndarray, points: Optional[np.ndarray] = None,
                  observed: Optional[Sequence[np.ndarray]] = None, *, source: str, normalize: bool = True,
                  orient: str = "vertical", near: Optional[float] = None, far: Optional[float] = None,
                  aabb=None, min_points: int = MIN_POINTS, half_angles: Optional[np.ndarray] = None,
                  where: str = "", **transform_extra) -> Placement:
    """Normalises a capture and derives its box and ray bounds (the importers' one path).

    * Frame: :func:`fit_similarity` (``normalize=False``: the source frame; the box and
      bounds are then found in an unrotated fitted frame and mapped back).
    * Box: ``aabb`` if given (scene frame), else :func:`points_box` of the points (at
      least ``min_points``), else, with ``half_angles``, the cube around the ball of
      :func:`framed_sphere` (cameras converging on an object), else :func:`cameras_box`.
    * Bounds: :func:`bounds_from_points` with ``observed`` (per-camera points), else
      :func:`bounds_from_sphere` of that ball (no ``aabb`` given), else
      :func:`bounds_from_box`; ``near``/``far`` replace every camera's value when given.

    Args:
        c2w: (N, 3, 4) camera-to-world in the source frame, OpenGL.
        points: optional (P, 3) sparse points, source frame.
        observed: optional N arrays (P_i, 3): the points camera i observes, source frame.
        source: the importer's name, recorded in the transform.
        normalize: express everything in the scene frame.
        orient: :func:`estimate_up`'s method.
        near, far, aabb: overrides, in the output frame.
        min_points: see :func:`bounds_from_points`.
        half_angles: optional (N,) :func:`half_fov` of each camera, radians: without
            points, box and bounds from :func:`framed_sphere` where it is defined.
        where: the dataset, for error messages.
        **transform_extra: more entries of the transform record.

    Raises:
        ValueError: bad overrides (``near >= far``, a malformed box), naming ``where``.
    """
    c2w = np.asarray(c2w, dtype=np.float64)
    fit = fit_similarity(c2w, points, orient if normalize else "none")
    c2w_fit = fit.c2w(c2w)
    has_points = points is not None and len(points) >= min_points
    sphere = None
    if aabb is None and not has_points and half_angles is not None:
        sphere = framed_sphere(c2w_fit, half_angles, estimate_up(c2w_fit, orient))
    if aabb is not None:
        box = as_aabb(aabb, where).double().numpy()
        box_fit = box if normalize else fit.points(box)
    elif has_points:
        box_fit = points_box(fit.points(points))
    elif sphere is not None:
        box_fit = sphere[0] + np.array([[-1.0], [1.0]]) * sphere[1]
    else:
        box_fit = cameras_box(c2w_fit)
    if observed is not None and sum(len(p) for p in observed) > 0:
        bounds, _ = bounds_from_points(c2w_fit, [fit.points(np.asarray(p).reshape(-1, 3)) for p in observed],
                                       min_points)
    elif sphere is not None:
        bounds = bounds_from_sphere(c2w_fit, *sphere)
    else:
        bounds = bounds_from_box(c2w_fit, box_fit)
    if not normalize:  # back to source units: the fit was a scale and a translation
        bounds, box_fit = bounds / fit.scale, (box_fit - fit.translation) / fit.scale
    for column, value in ((0, near), (1, far)):
        if value is not None:
            bounds[:, column] = float(value)
    near_all, far_all = float(bounds[:, 0].min()), float(bounds[:, 1].max())
    if not 0.0 <= near_all < far_all or (bounds[:, 0] >= bounds[:, 1]).any():
        raise ValueError(f"{where}: need 0 <= near < far for every camera, got near={near_all}, far={far_all} "
                         f"(check dataset.near and dataset.far)")
    return Placement(c2w=c2w_fit if normalize else c2w, bounds=bounds, near=near_all, far=far_all,
                     aabb=box if aabb is not None else box_fit,
                     transform=fit.as_transform(source, **transform_extra) if normalize else None)
