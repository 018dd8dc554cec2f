"""Pinhole ray generation and the NDC warp.

Legend: R rays, N cameras, H, W image size in pixels.

Conventions: ``c2w`` is OpenGL camera-to-world (camera looks down -Z, +Y up).
Pixel ``(u, v)`` = (column, row) has its centre at ``(u + 0.5, v + 0.5)`` measured
from the top-left image corner, so the camera-space direction of pixel (u, v) is
``((u + 0.5 - cx) / fx, -(v + 0.5 - cy) / fy, -1)``.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

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
    """

    origins: torch.Tensor
    directions: torch.Tensor
    viewdirs: torch.Tensor
    near: torch.Tensor
    far: torch.Tensor

    def __len__(self) -> int:
        return self.origins.shape[0]

    def map(self, fn) -> "RayBundle":
        """A bundle with ``fn`` applied to every tensor (e.g. slicing or ``.to``)."""
        return RayBundle(**{f.name: fn(getattr(self, f.name)) for f in fields(self)})


def camera_directions(u: torch.Tensor, v: torch.Tensor, fx, fy, cx, cy) -> torch.Tensor:
    """Camera-space directions (z = -1) through pixel centres.

    Args:
        u, v: (R,) pixel column and row indices (integer-valued, any dtype).
        fx, fy, cx, cy: (R,) or scalar intrinsics in pixels.
    Returns:
        (R, 3) float32 directions with z = -1 (OpenGL camera).
    """
    x = (u.float() + 0.5 - cx) / fx
    y = -(v.float() + 0.5 - cy) / fy
    return torch.stack([x, y, -torch.ones_like(x)], dim=-1)


def generate_rays(cameras: Cameras, image_index: torch.Tensor, u: torch.Tensor, v: torch.Tensor,
                  near: float, far: float, ndc: NDCParams | None = None) -> RayBundle:
    """Rays through pixel centres of the given cameras.

    Args:
        cameras: cameras of a split.
        image_index: (R,) long camera index per ray.
        u, v: (R,) long pixel column / row per ray.
        near, far: ray bounds (world units along unit directions, or NDC parameters).
        ndc: when given, rays are warped into normalised device coordinates.
    Returns:
        The ray bundle (see :class:`RayBundle`).
    """
    c2w = cameras.c2w[image_index]  # (R, 3, 4)
    dirs_cam = camera_directions(u, v, cameras.fx[image_index], cameras.fy[image_index],
                                 cameras.cx[image_index], cameras.cy[image_index])
    dirs = torch.einsum("rij,rj->ri", c2w[:, :, :3], dirs_cam)  # (R, 3), z-length 1 in camera
    origins = c2w[:, :, 3].contiguous()
    viewdirs = dirs / dirs.norm(dim=-1, keepdim=True)
    num = origins.shape[0]
    if ndc is not None:
        origins, directions = ndc_rays(origins, dirs, ndc)
    else:
        directions = viewdirs
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
    """All H*W rays of camera ``index`` in row-major pixel order (row v, then column u)."""
    h, w = cameras.height, cameras.width
    v, u = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    idx = torch.full((h * w,), index, dtype=torch.long)
    return generate_rays(cameras, idx, u.reshape(-1), v.reshape(-1), near, far, ndc)
