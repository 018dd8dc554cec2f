"""The viewer's camera conversion (OpenGL c2w <-> viser's OpenCV pose), frame sizes and the
region tint's colouring, without a server or a browser (tests/e2e/test_viewer.py has those)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("viser")

from distnerf.viewer.frames import (MIN_PIXELS, MOVING_FRAME_S, REGION_COLOURS, c2w_from_viser, colourise,  # noqa: E402
                                    frame_pixels, frame_size,
                                    pinhole, viser_from_c2w)


def random_c2w(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    q *= np.sign(np.linalg.det(q))
    return np.concatenate([q, rng.normal(size=(3, 1))], axis=1)


@pytest.mark.parametrize("seed", range(4))
def test_pose_round_trip_and_axes(seed):
    c2w = random_c2w(seed)
    wxyz, position = viser_from_c2w(c2w)
    import viser.transforms as tf

    r_cv = tf.SO3(wxyz).as_matrix()
    assert np.allclose(r_cv[:, 2], -c2w[:, 2]) and np.allclose(r_cv[:, 1], -c2w[:, 1])  # looks +Z, +Y down
    assert np.allclose(r_cv[:, 0], c2w[:, 0]) and np.allclose(position, c2w[:, 3])
    assert np.allclose(c2w_from_viser(wxyz, position), c2w, atol=1e-9)


def test_pinhole_focal_from_vertical_fov():
    cams = pinhole(np.eye(4)[:3], np.pi / 2, 40, 60)  # 90 degrees: fy = H / 2
    assert cams.size(0) == (40, 60) and float(cams.fy[0]) == pytest.approx(20.0)
    assert float(cams.cx[0]) == 30.0 and float(cams.cy[0]) == 20.0


def test_frame_size_keeps_aspect_and_pixel_budget():
    assert frame_size(2.0, 512) == (256, 512) and frame_size(0.5, 100) == (100, 50)
    h, w = frame_size(1.5, 512, pixels=10_000)
    assert abs(w / h - 1.5) < 0.05 and h * w <= 10_200
    h, w = frame_size(1.0, 512, pixels=10)
    assert h * w >= MIN_PIXELS * 0.95


def test_tint_moves_covered_pixels_towards_their_region_colour():
    out = {"rgb": torch.full((2, 2, 3), 0.5), "depth": torch.ones(2, 2), "opacity": torch.tensor([[1.0, 0.0],
                                                                                                 [1.0, 1.0]])}
    regions = torch.tensor([[0, 0], [1, 2]])
    img = colourise(out, "rgb", regions).astype(float)
    assert np.allclose(img[0, 1], 128)  # not covered: untinted
    for (y, x), k in zip([(0, 0), (1, 0), (1, 1)], [0, 1, 2]):
        assert np.allclose(img[y, x], 0.5 * 127.5 + 0.5 * REGION_COLOURS[k], atol=1)
    depth = colourise(out, "depth")
    assert depth.shape == (2, 2, 3) and depth.dtype == np.uint8


def test_frame_pixels_budget_and_live_cap():
    """A still frame is full size unless capped (live mode); a moving one gets what the measured
    speed renders in MOVING_FRAME_S; the cap wins when smaller."""
    assert frame_pixels(False, 50_000.0) is None
    assert frame_pixels(True, 50_000.0) == pytest.approx(50_000.0 * MOVING_FRAME_S)
    assert frame_pixels(False, 50_000.0, max_pixels=25_000.0) == 25_000.0
    assert frame_pixels(True, 50_000.0, max_pixels=1_000.0) == 1_000.0
    assert frame_pixels(True, 50_000.0, max_pixels=1e9) == pytest.approx(50_000.0 * MOVING_FRAME_S)
    h, w = frame_size(1.0, 512, frame_pixels(False, 20_000.0, max_pixels=20_000.0 * 0.5))
    assert h * w <= 10_000 * 1.01 and h == w
