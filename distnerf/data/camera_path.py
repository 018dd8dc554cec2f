"""Camera paths for videos: a fly-through along the training cameras, an orbit.

Legend: N cameras, K knots (the cameras in path order, K = N), F frames.

Conventions: ``c2w`` is camera-to-world in the OpenGL convention (the camera looks down
its local -Z axis, +Y up, +X right), a (3, 4) matrix ``[R | t]`` whose columns are the
camera's axes and centre in world units. Quaternions are ``(w, x, y, z)``, unit length,
``w >= 0`` where a sign is chosen; ``R = matrix_from_quaternion(q)`` maps camera axes to
world axes.

The fly-through (:func:`fly_through`):

* **order**: the cameras in split order, or a greedy nearest-neighbour chain when that
  is strictly shorter (:func:`capture_order`). Captures stored in capture order (LLFF,
  COLMAP sequences) keep it; scenes whose split is shuffled (Blender's random views on a
  sphere) get a chain of neighbours instead of jumps across the scene.
* **positions**: a centripetal Catmull-Rom spline through the camera centres
  (:func:`catmull_rom`: no cusps or self-intersections within a segment, passes through
  every centre), with reflected phantom end points, so that collinear cameras give a
  straight line.
* **orientations**: quaternion slerp between consecutive cameras, on the same knot
  parameter (every knot frame is exactly its camera's rotation).
* **timing**: frames equally spaced in arc length of the position curve (constant
  speed); a segment between two cameras at the same place takes no time (its turn is
  a cut). Cameras that all sit at one place are spaced equally in the knot parameter.

Numerics run in float64 NumPy; the results are float32 torch tensors.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from distnerf.data.base import Cameras

CENTRIPETAL = 0.5       # Catmull-Rom knot exponent: 0 uniform, 0.5 centripetal, 1 chordal
KNOT_FLOOR = 1e-3       # smallest knot interval, relative to the mean one (cameras at one place)
ARC_SAMPLES = 64        # samples per segment to measure arc length


# ----------------------------------------------------------------------------- quaternions
def quaternion_from_matrix(rot) -> np.ndarray:
    """Unit quaternions of rotation matrices (Bar-Itzhack's method: the nearest rotation
    of a slightly non-orthonormal matrix, e.g. a float32 pose from a file).

    Args:
        rot: (..., 3, 3) rotation matrices.

    Returns:
        (..., 4) float64 ``(w, x, y, z)``, unit length, ``w >= 0``.
    """
    m = np.asarray(rot, dtype=np.float64)
    xx, xy, xz = m[..., 0, 0], m[..., 0, 1], m[..., 0, 2]
    yx, yy, yz = m[..., 1, 0], m[..., 1, 1], m[..., 1, 2]
    zx, zy, zz = m[..., 2, 0], m[..., 2, 1], m[..., 2, 2]
    # symmetric 4x4 whose top eigenvector is (x, y, z, w); only its lower triangle is read by eigh
    k = np.zeros(m.shape[:-2] + (4, 4))
    k[..., 0, 0] = xx - yy - zz
    k[..., 1, 0], k[..., 1, 1] = yx + xy, yy - xx - zz
    k[..., 2, 0], k[..., 2, 1], k[..., 2, 2] = zx + xz, zy + yz, zz - xx - yy
    k[..., 3, 0], k[..., 3, 1], k[..., 3, 2], k[..., 3, 3] = zy - yz, xz - zx, yx - xy, xx + yy + zz
    values, vectors = np.linalg.eigh(k / 3.0)
    top = np.take_along_axis(vectors, np.argmax(values, axis=-1)[..., None, None], axis=-1)[..., 0]
    q = top[..., [3, 0, 1, 2]]
    return q * np.where(q[..., :1] < 0, -1.0, 1.0)


def matrix_from_quaternion(q) -> np.ndarray:
    """Rotation matrices of quaternions (normalised first).

    Args:
        q: (..., 4) ``(w, x, y, z)``, non-zero.

    Returns:
        (..., 3, 3) float64, orthonormal with determinant +1.
    """
    q = np.asarray(q, dtype=np.float64)
    w, x, y, z = np.moveaxis(q / np.linalg.norm(q, axis=-1, keepdims=True), -1, 0)
    rows = [[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]]
    return np.stack([np.stack(row, axis=-1) for row in rows], axis=-2)


def slerp(q0, q1, u) -> np.ndarray:
    """Spherical linear interpolation along the shorter arc (``q1`` and ``-q1`` are the same rotation).

    .. math:: q(u) = \\frac{\\sin((1-u)\\theta)}{\\sin\\theta} q_0 + \\frac{\\sin(u\\theta)}{\\sin\\theta} q_1,
              \\quad \\cos\\theta = |q_0 \\cdot q_1|

    Args:
        q0, q1: (..., 4) unit quaternions.
        u: (...) interpolation parameter in [0, 1] (0 gives ``q0``, 1 gives ``±q1``).

    Returns:
        (..., 4) float64 unit quaternions (nearly equal inputs: normalised lerp).
    """
    q0, q1 = np.asarray(q0, dtype=np.float64), np.asarray(q1, dtype=np.float64)
    u = np.asarray(u, dtype=np.float64)[..., None]
    dot = np.sum(q0 * q1, axis=-1, keepdims=True)
    q1 = np.where(dot < 0, -q1, q1)
    dot = np.clip(np.abs(dot), 0.0, 1.0)
    theta = np.arccos(dot)
    small = theta < 1e-6
    sin = np.where(small, 1.0, np.sin(theta))
    w0 = np.where(small, 1.0 - u, np.sin((1.0 - u) * theta) / sin)
    w1 = np.where(small, u, np.sin(u * theta) / sin)
    out = w0 * q0 + w1 * q1
    return out / np.linalg.norm(out, axis=-1, keepdims=True)


# ----------------------------------------------------------------------------- positions
def knot_times(points, alpha: float = CENTRIPETAL) -> np.ndarray:
    """Knot parameters of a Catmull-Rom spline: ``t_{i+1} = t_i + |p_{i+1} - p_i|^alpha``,
    each interval at least ``KNOT_FLOOR`` times the mean (coincident points stay finite).

    Args:
        points: (K, D) knots.
        alpha: 0 uniform, 0.5 centripetal, 1 chordal.

    Returns:
        (K,) float64, ``t_0 = 0``, strictly increasing.
    """
    points = np.asarray(points, dtype=np.float64)
    steps = np.linalg.norm(np.diff(points, axis=0), axis=-1) ** alpha
    mean = steps.mean() if steps.size and steps.mean() > 0 else 1.0
    return np.concatenate([[0.0], np.cumsum(np.maximum(steps, KNOT_FLOOR * mean))])


def catmull_rom(points, times, t) -> np.ndarray:
    """A Catmull-Rom spline through ``points`` at ``times`` (Barry-Goldman's pyramid).

    The end segments use phantom points reflected through the end knots
    (``p_{-1} = 2 p_0 - p_1``), so every value is an affine combination of the knots:
    knots on a line give points on that line. Outside ``[times[0], times[-1]]`` the
    end segments are extrapolated.

    Args:
        points: (K, D) knots, K >= 1.
        times: (K,) strictly increasing knot parameters (:func:`knot_times`).
        t: (F,) parameters to evaluate.

    Returns:
        (F, D) float64; ``catmull_rom(points, times, times) == points``.
    """
    points, times = np.asarray(points, dtype=np.float64), np.asarray(times, dtype=np.float64)
    t = np.asarray(t, dtype=np.float64)
    if len(points) == 1:
        return np.repeat(points, len(t), axis=0)
    p = np.concatenate([2 * points[:1] - points[1:2], points, 2 * points[-1:] - points[-2:-1]])
    s = np.concatenate([[2 * times[0] - times[1]], times, [2 * times[-1] - times[-2]]])
    seg = np.clip(np.searchsorted(times, t, side="right") - 1, 0, len(points) - 2) + 1  # index into p, s
    p0, p1, p2, p3 = (p[seg + k] for k in (-1, 0, 1, 2))
    t0, t1, t2, t3 = (s[seg + k][:, None] for k in (-1, 0, 1, 2))
    x = t[:, None]
    a1 = ((t1 - x) * p0 + (x - t0) * p1) / (t1 - t0)
    a2 = ((t2 - x) * p1 + (x - t1) * p2) / (t2 - t1)
    a3 = ((t3 - x) * p2 + (x - t2) * p3) / (t3 - t2)
    b1 = ((t2 - x) * a1 + (x - t0) * a2) / (t2 - t0)
    b2 = ((t3 - x) * a2 + (x - t1) * a3) / (t3 - t1)
    return ((t2 - x) * b1 + (x - t1) * b2) / (t2 - t1)


# ----------------------------------------------------------------------------- order
def path_length(points) -> float:
    """Length of the polyline through ``points`` (K, D) in order."""
    return float(np.linalg.norm(np.diff(np.asarray(points, dtype=np.float64), axis=0), axis=-1).sum())


def nearest_chain(points, start: int = 0) -> np.ndarray:
    """Greedy nearest-neighbour order: from ``start``, always to the closest unvisited point.

    Args:
        points: (N, D).
        start: first index.

    Returns:
        (N,) int64 permutation (ties: the lowest index). O(N^2) time, O(N) memory.
    """
    points = np.asarray(points, dtype=np.float64)
    left = np.ones(len(points), dtype=bool)
    order = [start]
    left[start] = False
    for _ in range(len(points) - 1):
        dist = np.linalg.norm(points - points[order[-1]], axis=-1)
        dist[~left] = np.inf
        order.append(int(np.argmin(dist)))
        left[order[-1]] = False
    return np.asarray(order, dtype=np.int64)


def capture_order(positions) -> np.ndarray:
    """The order of the fly-through: split order, or a nearest-neighbour chain when that is
    strictly shorter.

    Two chains are tried, from the split's first camera and from the camera farthest
    from the centroid (an end of an elongated capture); the shortest polyline of the
    three wins, split order on a tie.

    Args:
        positions: (N, 3) camera centres.

    Returns:
        (N,) int64 permutation of ``range(N)``.
    """
    positions = np.asarray(positions, dtype=np.float64)
    split = np.arange(len(positions), dtype=np.int64)
    if len(positions) < 3:
        return split
    end = int(np.argmax(np.linalg.norm(positions - positions.mean(axis=0), axis=-1)))
    candidates = [split] + [nearest_chain(positions, start) for start in dict.fromkeys((0, end))]
    return min(candidates, key=lambda order: path_length(positions[order]))  # min keeps the first on ties


# ----------------------------------------------------------------------------- paths
def interpolate_poses(c2w, num_frames: int) -> np.ndarray:
    """Poses along a smooth path through ``c2w`` in the given order (no reordering).

    Positions: centripetal Catmull-Rom; orientations: slerp between consecutive knots on
    the same parameter; frames equally spaced in arc length (see the module docstring).
    The first and last frames are the first and last cameras.

    Args:
        c2w: (K, 3, 4) camera-to-world, OpenGL, world units (numpy or torch).
        num_frames: F >= 1.

    Returns:
        (F, 3, 4) float64 camera-to-world, rotations orthonormal with determinant +1.
    """
    c2w = np.asarray(c2w, dtype=np.float64)
    if num_frames < 1 or c2w.ndim != 3 or c2w.shape[1:] != (3, 4) or len(c2w) == 0:
        raise ValueError(f"need (K >= 1, 3, 4) poses and num_frames >= 1, got {c2w.shape} and {num_frames}")
    centres, quats = c2w[:, :, 3], quaternion_from_matrix(c2w[:, :, :3])
    times = knot_times(centres)
    t = frame_times(centres, times, num_frames)
    return pose_at(centres, quats, times, t)


def frame_times(centres, times, num_frames: int) -> np.ndarray:
    """(F,) knot parameters of frames equally spaced in arc length along
    ``catmull_rom(centres, times, .)``; equally spaced in ``t`` when the path has no length."""
    if len(centres) == 1 or num_frames == 1:
        return np.full(num_frames, times[0])
    dense = np.concatenate([np.linspace(a, b, ARC_SAMPLES, endpoint=False) for a, b in zip(times[:-1], times[1:])]
                           + [times[-1:]])
    arc = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(catmull_rom(centres, times, dense), axis=0),
                                                          axis=-1))])
    scale = np.linalg.norm(np.asarray(centres) - np.asarray(centres).mean(axis=0), axis=-1).max()
    if arc[-1] <= 1e-12 * max(scale, 1.0):
        return np.linspace(times[0], times[-1], num_frames)
    return np.interp(np.linspace(0.0, arc[-1], num_frames), arc, dense)


def pose_at(centres, quats, times, t) -> np.ndarray:
    """Poses of the spline through ``centres`` / slerp of ``quats`` at parameters ``t``.

    Args:
        centres: (K, 3) camera centres; quats: (K, 4) their orientations; times: (K,) knots.
        t: (F,) parameters in ``[times[0], times[-1]]``.

    Returns:
        (F, 3, 4) float64 camera-to-world; at ``t = times[i]`` exactly camera ``i``'s
        rotation (to rounding) and centre.
    """
    t = np.asarray(t, dtype=np.float64)
    position = catmull_rom(centres, times, t)
    if len(centres) == 1:
        rot = np.repeat(matrix_from_quaternion(quats), len(t), axis=0)
    else:
        seg = np.clip(np.searchsorted(times, t, side="right") - 1, 0, len(times) - 2)
        u = np.clip((t - times[seg]) / (times[seg + 1] - times[seg]), 0.0, 1.0)
        rot = matrix_from_quaternion(slerp(quats[seg], quats[seg + 1], u))
    return np.concatenate([rot, position[:, :, None]], axis=-1)


def fly_through(c2w, num_frames: int) -> torch.Tensor:
    """A fly-through along the cameras ``c2w``: :func:`capture_order`, then :func:`interpolate_poses`.

    Args:
        c2w: (N, 3, 4) camera-to-world, OpenGL, world units (e.g. the training cameras).
        num_frames: F >= 1.

    Returns:
        (F, 3, 4) float32 camera-to-world.
    """
    c2w = np.asarray(torch.as_tensor(c2w).double())
    return torch.from_numpy(interpolate_poses(c2w[capture_order(c2w[:, :, 3])], num_frames)).float()


def orbit(c2w0, num_frames: int) -> torch.Tensor:
    """``c2w0`` rotated about the world +Y axis through the origin in ``num_frames`` equal
    steps of one turn (object-centred scenes).

    Args:
        c2w0: (3, 4) camera-to-world, OpenGL.
        num_frames: F >= 1.

    Returns:
        (F, 3, 4) float32; frame 0 is ``c2w0``.
    """
    c2w0 = torch.as_tensor(c2w0, dtype=torch.float64)
    a = 2 * np.pi * np.arange(num_frames) / num_frames
    c, s, zero, one = np.cos(a), np.sin(a), np.zeros_like(a), np.ones_like(a)
    rot = torch.from_numpy(np.stack([np.stack([c, zero, s], -1), np.stack([zero, one, zero], -1),
                                     np.stack([-s, zero, c], -1)], -2))
    return (rot @ c2w0).float()


def path_cameras(cameras: Cameras, c2w) -> Cameras:
    """Cameras at the poses ``c2w`` with camera 0's intrinsics and image size (pinhole:
    no distortion, the split's ray bounds).

    Args:
        cameras: the cameras whose first one lends its intrinsics.
        c2w: (F, 3, 4) camera-to-world, OpenGL.

    Returns:
        Cameras with F entries.
    """
    count = len(c2w)
    height, width = cameras.size(0)
    first = lambda values: values[:1].expand(count).clone()  # noqa: E731
    return replace(cameras, c2w=torch.as_tensor(c2w, dtype=torch.float32), fx=first(cameras.fx),
                   fy=first(cameras.fy), cx=first(cameras.cx), cy=first(cameras.cy), width=width, height=height,
                   distortion=None, sizes=None, bounds=None)


__all__ = ["quaternion_from_matrix", "matrix_from_quaternion", "slerp", "knot_times", "catmull_rom", "path_length",
           "nearest_chain", "capture_order", "interpolate_poses", "frame_times", "pose_at", "fly_through", "orbit",
           "path_cameras"]
