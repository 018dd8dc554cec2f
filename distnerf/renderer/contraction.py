"""Scene contraction of unbounded space and the ray spacing that goes with it (pure math).

Legend: R rays, P points.

**Contraction** (mip-NeRF 360, Barron et al. 2022, Eq. 10, with the infinity norm as in
nerfstudio's ``SceneContraction(order=inf)`` and MERF's cube grids). With the scene box
``[c - h, c + h]`` (the *unit region*) and box coordinates ``u = (x - c) / h`` (per axis)::

    contract(u) = u                              if ||u||_inf <= 1
                = (2 - 1 / ||u||_inf) u / ||u||_inf   otherwise

so the box is kept as it is and all of space, up to infinity, lands in the doubled box
``[c - 2h, c + 2h]``. Points are returned in the world's units (``q = c + h contract(u)``):
inside the box ``q = x``, so a model's tables, step and density units inside the box are
those of the bounded model. The infinity norm is chosen because distnerf's grids are
cubes: its image is the whole doubled box, where the L2 ball of radius 2 would leave
1 - pi/6 = 48% of a cubic grid's cells (its corners) unused.

**Ray spacing** (the sample grid of :func:`~distnerf.renderer.occupancy.march`): samples are
spaced evenly in a ray parameter ``s`` that is the distance ``t`` up to a per-ray break
``b`` and linear in disparity beyond it (mip-NeRF 360's "s-space" with ``g(t) = 1/t``
beyond the break; nerfstudio's ``UniformLinDispPiecewiseSampler``)::

    s(t) = t                  for t <= b
         = 2 b - b^2 / t      for t >  b         (s -> 2 b as t -> inf)

continuous with ``ds/dt = 1`` at ``b``; a step ``ds`` covers ``ds t^2 / b^2`` of world
distance, growing with distance. The break is where the ray leaves the box (or its
distance to the box centre, or its anchor, or the box's exit from its centre, whichever
is largest; :func:`ray_breaks`): for a ray from the box
centre ``b = h / ||d||_inf`` (a cube) and each step ``ds`` then spans exactly ``ds`` of
contracted distance, in the box and in the shell (the Jacobian of the contraction
along the ray is ``b^2 / t^2``, the spacing's ``ds/dt``). The whole shell, up to the sky,
gets as many steps as the ray's first ``b`` of distance.
"""
from __future__ import annotations

import torch

from .samples import ray_aabb

#: Radius of the contracted space in box units (the infinity norm of every contracted point
#: is at most this); the occupancy grid and the model tables of a contracted field cover
#: ``[c - CONTRACTED_RADIUS h, c + CONTRACTED_RADIUS h]`` (:func:`contracted_box`).
CONTRACTED_RADIUS = 2.0


def _centre_half(aabb: torch.Tensor, dtype: torch.dtype):
    box = aabb.to(dtype)
    return 0.5 * (box[0] + box[1]), 0.5 * (box[1] - box[0])


def contracted_box(aabb: torch.Tensor) -> torch.Tensor:
    """(2, 3) float box holding every contracted point of the unit region ``aabb`` ((2, 3)):
    the box doubled about its centre."""
    centre, half = _centre_half(aabb, aabb.dtype)
    return torch.stack([centre - CONTRACTED_RADIUS * half, centre + CONTRACTED_RADIUS * half])


def contract(points: torch.Tensor, aabb: torch.Tensor) -> torch.Tensor:
    """Contract world points into the doubled box (module docstring).

    Args:
        points: (P, 3) float world positions; any finite value, or +-inf (a point at
            infinity in that axis' direction).
        aabb: (2, 3) float unit region (the scene box).
    Returns:
        (P, 3) float (dtype of ``points``) in ``[c - 2h, c + 2h]``; the identity inside
        ``aabb``; never NaN for inf or huge inputs (a point with infinite coordinates maps
        onto the outer boundary, in the direction of its infinite axes).
    """
    centre, half = _centre_half(aabb, points.dtype)
    u = (points - centre) / half
    r = u.abs().amax(dim=-1, keepdim=True)
    infinite = torch.isinf(r)
    # u / r, the point's direction in the infinity norm; at infinity the infinite axes' signs
    unit = torch.where(infinite, torch.where(torch.isinf(u), torch.sign(u), torch.zeros_like(u)),
                       u / r.clamp(min=1.0))
    outer = (CONTRACTED_RADIUS - 1.0 / r.clamp(min=1.0)) * unit
    return centre + half * torch.where(r <= 1.0, u, outer)


def uncontract(q: torch.Tensor, aabb: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`contract` on the open doubled box.

    Args:
        q: (P, 3) float contracted points with box-unit infinity norm below 2.
        aabb: (2, 3) float unit region.
    Returns:
        (P, 3) float world points (inf where the norm reaches 2).
    """
    centre, half = _centre_half(aabb, q.dtype)
    v = (q - centre) / half
    rho = v.abs().amax(dim=-1, keepdim=True)
    r = 1.0 / (CONTRACTED_RADIUS - rho.clamp(1.0, CONTRACTED_RADIUS))  # ||u||_inf of the world point
    return centre + half * torch.where(rho <= 1.0, v, v * (r / rho.clamp(min=1.0)))


def world_step_scale(q: torch.Tensor, aabb: torch.Tensor) -> torch.Tensor:
    """(P,) float world length of a unit step of the ray spacing at contracted points ``q``
    ((P, 3)): 1 inside the box, ``r^2`` in the shell (``r`` the world point's box-unit
    infinity norm, ``1 / (2 - ||v||_inf)``), the inverse of the contraction's radial
    Jacobian; used to turn a marching step into an opacity per contracted cell."""
    centre, half = _centre_half(aabb, q.dtype)
    rho = ((q - centre) / half).abs().amax(dim=-1).clamp(max=CONTRACTED_RADIUS - 1e-6)
    r = 1.0 / (CONTRACTED_RADIUS - rho)
    return torch.where(rho <= 1.0, torch.ones_like(r), r * r)


def ray_breaks(origins: torch.Tensor, directions: torch.Tensor, anchor: torch.Tensor,
               aabb: torch.Tensor) -> torch.Tensor:
    """Break ``b`` of each ray's spacing (module docstring).

    ``b = max(anchor, t_exit, |o - c| / |d|, 1 / ||d / h||_inf)``: where the ray leaves the
    box (-inf when it misses it), its distance to the box centre in ray parameter, where
    the ray would leave the box from its centre (what makes the steps span one contracted
    step on rays from the centre, and bounds them on a flat box) and its sample-grid
    anchor, so that ``s = t`` up to the anchor (an anchor ``near + u ds`` is then a valid
    ``s``) and every ray gets a shell of at least its distance to the scene.

    Args:
        origins, directions: (R, 3) float rays. anchor: (R,) float sample-grid anchor.
        aabb: (2, 3) float unit region.
    Returns:
        (R,) float, > 0 where the anchor is.
    """
    t_min, t_max = ray_aabb(origins, directions, aabb.to(origins.dtype))
    exit_t = torch.where(t_max >= t_min, t_max, torch.full_like(t_max, -float("inf")))
    centre, half = _centre_half(aabb, origins.dtype)
    distance = (origins - centre).norm(dim=-1) / directions.norm(dim=-1)
    # where the same ray from the centre would leave the box: 1 / ||d / h||_inf, so that a ray
    # leaving a flat box early through its thin side does not start its shell too soon
    from_centre = 1.0 / (directions / half).abs().amax(dim=-1)
    return torch.maximum(torch.maximum(anchor, exit_t), torch.maximum(distance, from_centre))


def to_spacing(t: torch.Tensor, breaks: torch.Tensor) -> torch.Tensor:
    """Ray parameter ``t`` -> spacing parameter ``s`` (all (N,); ``t = inf`` gives ``2 b``)."""
    b = breaks
    return torch.where(t <= b, t, 2.0 * b - b * b / t)


def from_spacing(s: torch.Tensor, breaks: torch.Tensor) -> torch.Tensor:
    """Spacing parameter ``s`` -> ray parameter ``t`` (all (N,); ``s >= 2 b`` gives inf)."""
    b = breaks
    shell = b * b / (2.0 * b - s).clamp(min=0.0)
    return torch.where(s <= b, s, shell)
