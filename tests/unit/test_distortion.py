"""Lens distortion in ray generation, checked against pycolmap's own projection.

Independent reference: COLMAP's camera models (``pycolmap.Camera.img_from_cam``) project the
undistorted camera-space direction back onto the image; it must land on the pixel centre
the ray was generated for. distnerf's forward model (``distort``) is not used on that side.
"""
import numpy as np
import pytest
import torch

from distnerf.data.base import Cameras
from distnerf.data.rays import generate_rays, image_rays

pycolmap = pytest.importorskip("pycolmap")

W, H = 160, 120
# model name, COLMAP params, distnerf (fx, fy, cx, cy), (k1, k2, p1, p2, k3)
CASES = {
    "OPENCV": ([150.0, 155.0, 81.0, 58.5, -0.28, 0.09, 0.0015, -0.0022],
               (150.0, 155.0, 81.0, 58.5), (-0.28, 0.09, 0.0015, -0.0022, 0.0)),
    "RADIAL": ([140.0, 79.0, 61.0, 0.12, -0.04], (140.0, 140.0, 79.0, 61.0), (0.12, -0.04, 0.0, 0.0, 0.0)),
    "SIMPLE_RADIAL": ([145.0, 80.0, 60.0, -0.15], (145.0, 145.0, 80.0, 60.0), (-0.15, 0.0, 0.0, 0.0, 0.0)),
}


def _cameras(intr, coeffs, c2w):
    n = c2w.shape[0]
    fx, fy, cx, cy = (torch.full((n,), v) for v in intr)
    return Cameras(c2w, fx, fy, cx, cy, W, H, distortion=torch.tensor([coeffs] * n, dtype=torch.float32))


@pytest.mark.parametrize("model", sorted(CASES))
def test_undistorted_rays_reproject_to_pixel_centres(model):
    params, intr, coeffs = CASES[model]
    camera = pycolmap.Camera.create_from_model_name(1, model, 100.0, W, H)
    camera.params = params
    c2w = torch.eye(4)[:3].unsqueeze(0)  # identity: camera frame = world frame (OpenGL)
    rays = image_rays(_cameras(intr, coeffs, c2w), 0, 0.1, 10.0)
    d = rays.directions.double().numpy()
    cam_opencv = np.stack([d[:, 0], -d[:, 1], -d[:, 2]], axis=-1)  # OpenGL -> OpenCV camera frame
    uv = camera.img_from_cam(cam_opencv)
    v, u = np.meshgrid(np.arange(H), np.arange(W), indexing="ij")
    expected = np.stack([u.reshape(-1) + 0.5, v.reshape(-1) + 0.5], axis=-1)
    err = np.abs(uv - expected).max()
    assert err < 1e-4, f"{model}: max reprojection error {err:.2e} px"
    # and the distortion is not a no-op: a pinhole direction lands elsewhere
    pinhole = image_rays(Cameras(c2w, *(torch.full((1,), x) for x in intr), W, H), 0, 0.1, 10.0)
    assert (pinhole.directions - rays.directions).abs().max() > 1e-3


def test_per_camera_bounds_replace_the_global_ones():
    c2w = torch.eye(4)[:3].unsqueeze(0).repeat(2, 1, 1)
    cams = Cameras(c2w, torch.full((2,), 50.0), torch.full((2,), 50.0), torch.full((2,), 8.0),
                   torch.full((2,), 8.0), 16, 16, bounds=torch.tensor([[0.5, 3.0], [1.5, 9.0]]))
    rays = generate_rays(cams, torch.tensor([1, 0, 1]), torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5]), 0.1, 100.0)
    assert rays.near.tolist() == [1.5, 0.5, 1.5] and rays.far.tolist() == [9.0, 3.0, 9.0]
