"""Camera paths (distnerf.data.camera_path): quaternions, the spline, the capture order, the fly-through.

Expected values are hand computations (rotations about one axis, points on a line) or
properties (knots reached, orthonormal rotations), not the module's own output.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from distnerf.data.base import Cameras
from distnerf.data.camera_path import (capture_order, catmull_rom, fly_through, interpolate_poses, knot_times,
                                       matrix_from_quaternion, orbit, path_cameras, quaternion_from_matrix, slerp)


def rot_z(angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def random_rotations(count: int, seed: int = 0) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(count, 3, 3)))
    return q * np.sign(np.linalg.det(q))[:, None, None]  # det +1


def assert_rotations(rot: np.ndarray, atol: float = 1e-6) -> None:
    rot = np.asarray(rot, dtype=np.float64)
    eye = np.broadcast_to(np.eye(3), rot.shape)
    np.testing.assert_allclose(rot @ np.swapaxes(rot, -1, -2), eye, atol=atol)
    np.testing.assert_allclose(np.linalg.det(rot), 1.0, atol=atol)


def look_at(eye, target=(0.0, 0.0, 0.0), up=(0.0, 1.0, 0.0)) -> np.ndarray:
    """(3, 4) OpenGL c2w at ``eye`` looking at ``target`` (-Z towards it)."""
    eye, target, up = (np.asarray(v, dtype=np.float64) for v in (eye, target, up))
    back = (eye - target) / np.linalg.norm(eye - target)
    right = np.cross(up, back)
    right /= np.linalg.norm(right)
    return np.concatenate([np.stack([right, np.cross(back, right), back], axis=1), eye[:, None]], axis=1)


# ----------------------------------------------------------------------------- quaternions
def test_quaternion_of_a_rotation_about_z_by_hand():
    angle = 0.7
    q = quaternion_from_matrix(rot_z(angle))
    np.testing.assert_allclose(q, [math.cos(angle / 2), 0.0, 0.0, math.sin(angle / 2)], atol=1e-12)
    np.testing.assert_allclose(matrix_from_quaternion(q), rot_z(angle), atol=1e-12)


def test_quaternion_round_trip_of_random_rotations_and_half_turns():
    rots = np.concatenate([random_rotations(50), np.diag([1.0, -1.0, -1.0])[None], np.diag([-1.0, -1.0, 1.0])[None]])
    q = quaternion_from_matrix(rots)
    np.testing.assert_allclose(np.linalg.norm(q, axis=-1), 1.0, atol=1e-12)
    assert (q[:, 0] >= 0).all()
    np.testing.assert_allclose(matrix_from_quaternion(q), rots, atol=1e-10)


def test_slerp_about_one_axis_is_the_proportional_angle_and_takes_the_short_arc():
    q0, q1 = quaternion_from_matrix(np.eye(3)), quaternion_from_matrix(rot_z(1.2))
    for u in (0.0, 0.25, 0.5, 1.0):
        np.testing.assert_allclose(matrix_from_quaternion(slerp(q0, q1, u)), rot_z(1.2 * u), atol=1e-12)
        np.testing.assert_allclose(matrix_from_quaternion(slerp(q0, -q1, u)), rot_z(1.2 * u), atol=1e-12)
    np.testing.assert_allclose(slerp(q0, q0, 0.3), q0, atol=1e-12)  # equal ends: no division by sin(0)


# ----------------------------------------------------------------------------- spline
def test_catmull_rom_passes_through_the_knots_and_collinear_knots_give_a_line():
    rng = np.random.default_rng(1)
    points = rng.normal(size=(7, 3))
    times = knot_times(points)
    np.testing.assert_allclose(catmull_rom(points, times, times), points, atol=1e-12)
    # on the line p = a + s d, at uneven spacing and with a step back
    a, d = np.array([1.0, -2.0, 0.5]), np.array([0.3, 0.4, 1.2])
    line = a + np.array([0.0, 0.5, 2.0, 2.1, 1.5, 4.0])[:, None] * d
    lt = knot_times(line)
    curve = catmull_rom(line, lt, np.linspace(lt[0], lt[-1], 500))
    off = (curve - a) - ((curve - a) @ d)[:, None] * d / (d @ d)
    assert np.abs(off).max() < 1e-12


def test_coincident_knots_stay_finite():
    points = np.array([[0.0, 0, 0], [1.0, 0, 0], [1.0, 0, 0], [2.0, 1, 0]])
    times = knot_times(points)
    assert np.all(np.diff(times) > 0)
    curve = catmull_rom(points, times, np.linspace(times[0], times[-1], 200))
    assert np.isfinite(curve).all() and np.abs(curve).max() < 3


# ----------------------------------------------------------------------------- order
def test_capture_order_keeps_split_order_unless_a_chain_is_shorter():
    line = np.array([[float(i), 0.0, 0.0] for i in range(6)])
    assert capture_order(line).tolist() == list(range(6))
    shuffled = line[[3, 0, 5, 1, 4, 2]]
    order = capture_order(shuffled)
    assert sorted(order.tolist()) == list(range(6))
    assert shuffled[order][:, 0].tolist() in (list(range(6)), list(range(5, -1, -1)))


# ----------------------------------------------------------------------------- fly-through
def test_fly_through_reaches_every_camera_at_its_knot():
    rng = np.random.default_rng(2)
    angles = np.sort(rng.uniform(0, 1.5 * np.pi, 9))
    c2w = np.stack([look_at([4 * math.cos(a), 1.0 + 0.3 * math.sin(3 * a), 4 * math.sin(a)]) for a in angles])
    centres, quats = c2w[:, :, 3], quaternion_from_matrix(c2w[:, :, :3])
    from distnerf.data.camera_path import pose_at

    at_knots = pose_at(centres, quats, knot_times(centres), knot_times(centres))
    np.testing.assert_allclose(at_knots, c2w, atol=1e-5)
    frames = interpolate_poses(c2w, 60)
    assert frames.shape == (60, 3, 4)
    np.testing.assert_allclose(frames[[0, -1]], c2w[[0, -1]], atol=1e-5)
    assert_rotations(frames[:, :, :3])
    # constant speed: equal chords between frames (to the curve's bending within a step)
    chords = np.linalg.norm(np.diff(frames[:, :, 3], axis=0), axis=-1)
    assert chords.max() / chords.min() < 1.05


def test_fly_through_of_collinear_cameras_is_a_straight_line():
    eyes = np.array([[0.0, 0.0, 0.0], [1.0, 0.5, 0.0], [3.0, 1.5, 0.0], [3.5, 1.75, 0.0]])
    c2w = np.stack([np.concatenate([random_rotations(1, seed=i)[0], e[:, None]], axis=1) for i, e in enumerate(eyes)])
    frames = fly_through(torch.from_numpy(c2w).float(), 40).double().numpy()
    d = eyes[-1] - eyes[0]
    rel = frames[:, :, 3] - eyes[0]
    off = rel - (rel @ d)[:, None] * d / (d @ d)
    assert np.abs(off).max() < 1e-5
    s = rel @ d / (d @ d)
    assert np.all(np.diff(s) > 0) and s[0] == pytest.approx(0, abs=1e-6) and s[-1] == pytest.approx(1, abs=1e-6)
    assert_rotations(frames[:, :, :3], atol=1e-5)


def test_fly_through_of_shuffled_cameras_follows_the_nearest_chain():
    angles = np.linspace(0, np.pi, 8)
    c2w = np.stack([look_at([4 * math.cos(a), 0.5, 4 * math.sin(a)]) for a in angles])
    shuffled = torch.from_numpy(c2w[[5, 2, 7, 0, 3, 6, 1, 4]]).float()
    frames = fly_through(shuffled, 30)
    ends = {tuple(np.round(frames[i, :, 3].numpy(), 4)) for i in (0, -1)}
    assert ends == {tuple(np.round(c2w[i, :, 3], 4)) for i in (0, 7)}  # from one end of the arc to the other
    radius = np.linalg.norm(frames[:, [0, 2], 3].numpy(), axis=-1)
    assert np.abs(radius - 4).max() < 0.1  # stays near the arc (the end segments straighten), no jumps across it


def test_one_camera_and_one_frame():
    c2w = look_at([0.0, 0.0, 3.0])
    np.testing.assert_allclose(interpolate_poses(c2w[None], 5), np.repeat(c2w[None], 5, axis=0), atol=1e-12)
    np.testing.assert_allclose(interpolate_poses(np.stack([c2w, look_at([1.0, 0, 3])]), 1)[0], c2w, atol=1e-12)
    with pytest.raises(ValueError, match="num_frames"):
        interpolate_poses(c2w[None], 0)


def test_orbit_turns_about_world_y():
    c2w0 = torch.from_numpy(look_at([0.0, 1.0, 4.0])).float()
    frames = orbit(c2w0, 4)
    assert torch.allclose(frames[0], c2w0, atol=1e-6)
    assert torch.allclose(frames[1, :, 3], torch.tensor([4.0, 1.0, 0.0]), atol=1e-5)  # a quarter turn: +Z -> +X
    assert_rotations(frames[:, :, :3].double().numpy(), atol=1e-5)


def test_path_cameras_take_the_first_cameras_intrinsics():
    n = 3
    cams = Cameras(torch.eye(3, 4).repeat(n, 1, 1), torch.tensor([10.0, 11, 12]), torch.tensor([20.0, 21, 22]),
                   torch.tensor([5.0, 6, 7]), torch.tensor([4.0, 5, 6]), 16, 12,
                   distortion=torch.ones(n, 5), sizes=torch.tensor([[8, 10], [12, 16], [12, 16]]))
    path = path_cameras(cams, torch.eye(3, 4).repeat(5, 1, 1))
    assert len(path) == 5 and (path.height, path.width) == (8, 10)
    assert path.fx.tolist() == [10.0] * 5 and path.cy.tolist() == [4.0] * 5
    assert path.distortion is None and path.sizes is None and path.bounds is None
