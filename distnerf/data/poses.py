"""Camera pose conventions: COLMAP's world-to-camera ``cam_from_world`` and distnerf's camera-to-world
``c2w`` (OpenGL: x right, y up, looking down -z), and the rotation between two directions. Pure numpy
geometry shared by the importers (:mod:`.normalize`, :mod:`.colmap`) and the converter (:mod:`.convert`).
"""
from __future__ import annotations

import numpy as np


def c2w_from_cam_from_world(cam_from_world: np.ndarray) -> np.ndarray:
    """COLMAP world-to-camera poses as distnerf camera-to-world poses.

    COLMAP's ``cam_from_world`` maps world points into an OpenCV camera frame (x right,
    y down, z forward): ``p_cam = R p_world + t``. distnerf's ``c2w`` is OpenGL (x right,
    y up, looking down -z): ``c2w = inverse([R | t])`` with the camera's y and z axes
    (columns 1 and 2) negated. The camera centre is ``-R^T t``.

    Args:
        cam_from_world: (..., 3, 4) float, rigid world-to-camera ``[R | t]``.

    Returns:
        (..., 3, 4) float64 camera-to-world, OpenGL convention, same world units.
    """
    w2c = np.asarray(cam_from_world, dtype=np.float64)
    rot_t = np.swapaxes(w2c[..., :3, :3], -1, -2)
    centre = -(rot_t @ w2c[..., :3, 3:4])
    c2w = np.concatenate([rot_t, centre], axis=-1)
    c2w[..., :, 1:3] *= -1.0
    return c2w


def cam_from_world_from_c2w(c2w) -> np.ndarray:
    """distnerf camera-to-world poses as COLMAP world-to-camera poses (the inverse of
    :func:`c2w_from_cam_from_world`; written by ``distnerf.data.convert``).

    ``c2w`` is OpenGL (x right, y up, looking down -z); COLMAP's camera is OpenCV (x
    right, y down, z forward): negate the camera's y and z axes (columns 1 and 2), then
    invert the rigid transform: ``R = (R_c2w F)^T``, ``t = -R c`` with ``F = diag(1, -1, -1)``
    and ``c`` the camera centre.

    Args:
        c2w: (..., 3, 4) rigid camera-to-world, OpenGL, world units.

    Returns:
        (..., 3, 4) float64 ``cam_from_world = [R | t]`` (``p_cam = R p_world + t``).
    """
    c2w = np.asarray(c2w, dtype=np.float64)
    rot = np.swapaxes(c2w[..., :3, :3] * np.array([1.0, -1.0, -1.0]), -1, -2)
    return np.concatenate([rot, -(rot @ c2w[..., :3, 3:4])], axis=-1)


def rotation_between(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The smallest rotation taking direction ``a`` to direction ``b`` (Rodrigues).

    Rotates about ``a x b`` by the angle between them; opposite directions turn by 180
    degrees about an axis perpendicular to ``a`` (the one nearest to x, else z).

    Args:
        a, b: (3,) non-zero vectors (any length).

    Returns:
        (3, 3) float64 rotation ``R`` with ``R a / |a| = b / |b|``.
    """
    a = np.asarray(a, dtype=np.float64) / np.linalg.norm(a)
    b = np.asarray(b, dtype=np.float64) / np.linalg.norm(b)
    axis = np.cross(a, b)
    sin, cos = np.linalg.norm(axis), float(a @ b)
    if sin < 1e-12:
        if cos > 0:
            return np.eye(3)
        helper = np.array([1.0, 0.0, 0.0]) if abs(a[0]) < 0.9 else np.array([0.0, 0.0, 1.0])
        axis = np.cross(a, helper)
        axis /= np.linalg.norm(axis)
        return 2.0 * np.outer(axis, axis) - np.eye(3)  # 180 degrees about ``axis``
    k = axis / sin
    skew = np.array([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]])
    return np.eye(3) + sin * skew + (1.0 - cos) * skew @ skew
