"""Pinhole ray generation and the NDC warp.

Legend: R rays, N cameras, H, W image size in pixels.

Conventions: ``c2w`` is OpenGL camera-to-world (camera looks down -Z, +Y up).
Pixel ``(u, v)`` = (column, row) has its centre at ``(u + 0.5, v + 0.5)`` measured
from the top-left image corner, so the camera-space direction of pixel (u, v) is
``((u + 0.5 - cx) / fx, -(v + 0.5 - cy) / fy, -1)``.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

import torch
import torch.nn.functional as F

from .base import Cameras, NDCParams


@dataclass
class RayBundle:
    """A batch of rays.

    Attributes:
        origins: (R, 3) float32 world (or NDC) positions.
        directions: (R, 3) float32; unit length in world scenes, NDC direction
            (not unit) in NDC scenes, such that ``origins + t * directions`` for
            ``t`` in ``[near, far]`` covers the ray.
        viewdirs: (R, 3) float32 unit world-space viewing directions (for colour).
        near, far: (R,) float32 ray parameter bounds.
        image_ids: (R,) int64 index of each ray's image in the *training* split (the row of a
            per-image appearance table, :mod:`distnerf.model.appearance`), or None: set by the
            samplers only, never for evaluation rays, so a test view never indexes the table.
    """

    origins: torch.Tensor
    directions: torch.Tensor
    viewdirs: torch.Tensor
    near: torch.Tensor
    far: torch.Tensor
    image_ids: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return self.origins.shape[0]

    def map(self, fn) -> "RayBundle":
        """A bundle with ``fn`` applied to every tensor (e.g. slicing or ``.to``; None stays None)."""
        return RayBundle(**{f.name: None if getattr(self, f.name) is None else fn(getattr(self, f.name))
                            for f in fields(self)})


def camera_directions(u: torch.Tensor, v: torch.Tensor, fx, fy, cx, cy,
                      distortion: torch.Tensor | None = None) -> torch.Tensor:
    """Camera-space directions (z = -1) through pixel centres, lens distortion removed.

    Args:
        u, v: (R,) pixel column and row indices (integer-valued, any dtype).
        fx, fy, cx, cy: (R,) or scalar intrinsics in pixels.
        distortion: optional (R, 5) float32 OpenCV coefficients ``(k1, k2, p1, p2, k3)``
            (see :class:`~distnerf.data.base.Cameras`); the pixel's normalised coordinates
            are then undistorted by :func:`undistort` before the direction is formed.
    Returns:
        (R, 3) float32 directions with z = -1 (OpenGL camera).
    """
    x = (u.float() + 0.5 - cx) / fx
    y = (v.float() + 0.5 - cy) / fy  # image y (down)
    if distortion is not None:
        x, y = undistort(x, y, distortion)
    return torch.stack([x, -y, -torch.ones_like(x)], dim=-1)


def pinhole_directions(u: torch.Tensor, v: torch.Tensor, intrinsics: torch.Tensor) -> torch.Tensor:
    """:func:`camera_directions` without distortion, the same bits in fewer operators (both pixel axes at
    once; a GPU step is paced by its operator count).

    Args:
        u, v: (R,) pixel column and row indices (integer-valued, any dtype).
        intrinsics: (R, 4) float32 ``(cx, cy, fx, fy)`` in pixels per ray
            (:meth:`~distnerf.data.base.Cameras.intrinsics`).
    Returns:
        (R, 3) float32 directions ``((u + 0.5 - cx) / fx, -(v + 0.5 - cy) / fy, -1)`` (OpenGL camera).
    """
    xy = (torch.stack([u, v], dim=-1).float() + 0.5 - intrinsics[:, :2]) / intrinsics[:, 2:]
    dirs = F.pad(xy, (0, 1), value=-1.0)
    dirs[:, 1].neg_()  # image y (down) to camera y (up)
    return dirs


def distort(x: torch.Tensor, y: torch.Tensor, coeffs: torch.Tensor):
    """OpenCV radial-tangential distortion of normalised image coordinates (y down).

    ``x_d = x (1 + k1 r^2 + k2 r^4 + k3 r^6) + 2 p1 x y + p2 (r^2 + 2 x^2)`` and
    ``y_d = y (1 + k1 r^2 + k2 r^4 + k3 r^6) + p1 (r^2 + 2 y^2) + 2 p2 x y`` (Brown-Conrady;
    OpenCV's ``projectPoints``, COLMAP's ``OpenCVCameraModel``).

    Args:
        x, y: (R,) normalised coordinates. coeffs: (R, 5) ``(k1, k2, p1, p2, k3)``.
    Returns:
        ``(x_d, y_d)``, each (R,), same dtype as ``x``.
    """
    k1, k2, p1, p2, k3 = coeffs.to(x.dtype).unbind(-1)
    r2 = x * x + y * y
    radial = 1.0 + r2 * (k1 + r2 * (k2 + r2 * k3))
    return (x * radial + 2.0 * p1 * x * y + p2 * (r2 + 2.0 * x * x),
            y * radial + p1 * (r2 + 2.0 * y * y) + 2.0 * p2 * x * y)


def undistort(x_d: torch.Tensor, y_d: torch.Tensor, coeffs: torch.Tensor, iterations: int = 10):
    """Inverts :func:`distort` per pixel by Newton's method on the 2x2 system.

    Computed in float64 (the result is returned in the input's dtype), from ``x = x_d``;
    10 iterations converge to machine precision for the distortion of real lenses
    (|distortion displacement| well below the radius). No table: each ray is undistorted
    where it is generated (sampler workers, the device sampler, evaluation).

    Args:
        x_d, y_d: (R,) distorted normalised coordinates (y down). coeffs: (R, 5).
    Returns:
        ``(x, y)``: (R,) undistorted normalised coordinates.
    """
    dtype = x_d.dtype
    xd, yd, c = x_d.double(), y_d.double(), coeffs.double()
    k1, k2, p1, p2, k3 = c.unbind(-1)
    x, y = xd.clone(), yd.clone()
    for _ in range(iterations):
        r2 = x * x + y * y
        radial = 1.0 + r2 * (k1 + r2 * (k2 + r2 * k3))
        d_radial = 2.0 * (k1 + r2 * (2.0 * k2 + 3.0 * k3 * r2))  # d radial / d(x or y), over x or y
        fx_ = x * radial + 2.0 * p1 * x * y + p2 * (r2 + 2.0 * x * x) - xd
        fy_ = y * radial + p1 * (r2 + 2.0 * y * y) + 2.0 * p2 * x * y - yd
        j00 = radial + x * x * d_radial + 2.0 * p1 * y + 6.0 * p2 * x
        j01 = x * y * d_radial + 2.0 * p1 * x + 2.0 * p2 * y  # = d x_d / d y = d y_d / d x (symmetric Jacobian)
        j11 = radial + y * y * d_radial + 6.0 * p1 * y + 2.0 * p2 * x
        det = j00 * j11 - j01 * j01
        x = x - (j11 * fx_ - j01 * fy_) / det
        y = y - (j00 * fy_ - j01 * fx_) / det
    return x.to(dtype), y.to(dtype)


def generate_rays(cameras: Cameras, image_index: torch.Tensor, u: torch.Tensor, v: torch.Tensor,
                  near: float, far: float, ndc: NDCParams | None = None) -> RayBundle:
    """Rays through pixel centres of the given cameras.

    Args:
        cameras: cameras of a split (their distortion, when set, is removed).
        image_index: (R,) long camera index per ray.
        u, v: (R,) long pixel column / row per ray.
        near, far: ray bounds (world units along unit directions, or NDC parameters);
            replaced per ray by ``cameras.bounds`` when the cameras have their own.
        ndc: when given, rays are warped into normalised device coordinates.
    Returns:
        The ray bundle (see :class:`RayBundle`).
    """
    c2w = cameras.c2w[image_index]  # (R, 3, 4)
    if cameras.distortion is None:
        dirs_cam = pinhole_directions(u, v, cameras.intrinsics().index_select(0, image_index))
    else:
        dirs_cam = camera_directions(u, v, cameras.fx[image_index], cameras.fy[image_index],
                                     cameras.cx[image_index], cameras.cy[image_index], cameras.distortion[image_index])
    dirs = torch.einsum("rij,rj->ri", c2w[:, :, :3], dirs_cam)  # (R, 3), z-length 1 in camera
    origins = c2w[:, :, 3].contiguous()
    viewdirs = dirs / dirs.norm(dim=-1, keepdim=True)
    num = origins.shape[0]
    if ndc is not None:
        origins, directions = ndc_rays(origins, dirs, ndc)
    else:
        directions = viewdirs
    if cameras.bounds is not None:
        bounds = cameras.bounds[image_index].to(origins.dtype)
        return RayBundle(origins, directions, viewdirs, bounds[:, 0].contiguous(), bounds[:, 1].contiguous())
    return RayBundle(origins, directions, viewdirs,
                     torch.full((num,), float(near), device=origins.device),
                     torch.full((num,), float(far), device=origins.device))


def ndc_rays(origins: torch.Tensor, directions: torch.Tensor, ndc: NDCParams):
    """Warp world rays into normalised device coordinates.

    NeRF (Mildenhall et al. 2020), Appendix C, Eq. 25-26: the origin is first moved
    to the near plane ``z = -n``; then with ``a_x = -2 f / W``, ``a_y = -2 f / H``::

        o' = (a_x o_x / o_z, a_y o_y / o_z, 1 + 2 n / o_z)
        d' = (a_x (d_x/d_z - o_x/o_z), a_y (d_y/d_z - o_y/o_z), -2 n / o_z)

    so ``t' in [0, 1]`` spans the near plane to infinity.

    Args:
        origins: (R, 3) float32 world origins (recentered LLFF frame, camera ~ at z=0
            looking down -Z).
        directions: (R, 3) float32 world directions with camera-space z = -1.
        ndc: NDC parameters.
    Returns:
        (origins, directions), each (R, 3) float32 in NDC space.
    """
    n = ndc.near_plane
    t = -(n + origins[:, 2]) / directions[:, 2]
    o = origins + t[:, None] * directions
    ax, ay = -2.0 * ndc.focal / ndc.width, -2.0 * ndc.focal / ndc.height
    ox, oy, oz = o[:, 0], o[:, 1], o[:, 2]
    dx, dy, dz = directions[:, 0], directions[:, 1], directions[:, 2]
    o_ndc = torch.stack([ax * ox / oz, ay * oy / oz, 1.0 + 2.0 * n / oz], dim=-1)
    d_ndc = torch.stack([ax * (dx / dz - ox / oz), ay * (dy / dz - oy / oz), -2.0 * n / oz], dim=-1)
    return o_ndc, d_ndc


def image_rays(cameras: Cameras, index: int, near: float, far: float,
               ndc: NDCParams | None = None) -> RayBundle:
    """All h*w rays of camera ``index`` (its own image size, :meth:`Cameras.size`) in
    row-major pixel order (row v, then column u)."""
    h, w = cameras.size(index)
    v, u = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    idx = torch.full((h * w,), index, dtype=torch.long)
    return generate_rays(cameras, idx, u.reshape(-1), v.reshape(-1), near, far, ndc)
