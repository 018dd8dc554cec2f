"""Along-ray sampling: stratified, hierarchical (inverse-CDF) and box clipping.

Legend: R rays, S samples per ray. Sample layout is batched: ``(R, S)`` with
intervals ``[t_starts, t_ends]`` in world units along each ray direction.
"""
from __future__ import annotations

import torch

from ..host_buffers import sync_free


def ray_aabb(origins: torch.Tensor, directions: torch.Tensor, aabb: torch.Tensor):
    """Slab-test intersection of rays with an axis-aligned box, or with K boxes at once.

    Args:
        origins: (R, 3) float. directions: (R, 3) float (need not be unit).
        aabb: (2, 3) float [min corner, max corner], or (K, 2, 3) float K boxes.
    Returns:
        t_min, t_max: (R,) entry and exit ray parameters, (R, K) for K boxes (the same operators
        whatever K); ``t_min > t_max`` when the ray misses the box. ``t_min`` may be negative
        (origin inside the box).
    """
    safe = directions.masked_fill(directions.abs() < 1e-12, 1e-12)
    inv = safe.reciprocal()
    if aabb.dim() == 3:  # K boxes: (R, 1, 3) against (K, 3), the per-box form's arithmetic elementwise
        origins, inv = origins[:, None], inv[:, None]
    if sync_free(origins.device):  # both faces at once, (R, [K,] 2, 3): fewer operators, ~3x slower on the CPU
        t = (aabb - origins.unsqueeze(-2)) * inv.unsqueeze(-2)
        near_faces, far_faces = torch.aminmax(t, dim=-2)  # (R, [K,] 3) each
        return near_faces.amax(dim=-1), far_faces.amin(dim=-1)
    t0 = (aabb[..., 0, :] - origins) * inv
    t1 = (aabb[..., 1, :] - origins) * inv
    return torch.minimum(t0, t1).amax(dim=-1), torch.maximum(t0, t1).amin(dim=-1)


def clip_to_box(origins: torch.Tensor, directions: torch.Tensor, near: torch.Tensor, far: torch.Tensor,
                aabb: torch.Tensor):
    """The part ``[t_in, t_out]`` of each ray segment ``[near, far]`` inside a box.

    Args:
        origins, directions: (R, 3) float. near, far: (R,) float. aabb: (2, 3) float.
    Returns:
        t_in, t_out: (R,) float; the segment misses the box where ``t_in > t_out``.
    """
    t_min, t_max = ray_aabb(origins, directions, aabb)
    return torch.maximum(t_min, near), torch.minimum(t_max, far)


def far_above_altitude(origins: torch.Tensor, directions: torch.Tensor, far: torch.Tensor,
                       min_altitude: float, footprint: torch.Tensor | None = None) -> torch.Tensor:
    """End each ray where it goes below ``min_altitude`` (Mega-NeRF's ray altitude range, its
    lower bound: in an aerial capture nothing below the ground is visible, so a ray leaves the
    field where it crosses the ground plane instead of marching on under it).

    The scene frame is +y up (:mod:`distnerf.data.normalize`); heights in its units.

    Args:
        origins, directions: (R, 3) float (directions need not be unit). far: (R,) float
            ray-parameter bounds (``inf``: no bound). min_altitude: float height of the floor.
        footprint: optional (2, 3) float box (the scene box): the floor ends a ray only where the
            ray reaches it above the box's footprint (its x and z ranges); a ray that reaches the
            floor past the box's edge keeps ``far`` (the unbounded background beyond the box,
            e.g. the ground a capture sees past the modelled area, stays visible).
    Returns:
        (R,) float ``min(far, t_floor)`` with ``t_floor`` the ray parameter where a ray going
        down reaches ``y = min_altitude``; rays going up or level keep ``far``. A ray that
        starts below the floor going down gets a negative bound (an empty segment).
    """
    dy = directions[:, 1]
    down = dy < 0
    t_floor = (min_altitude - origins[:, 1]) / torch.where(down, dy, torch.ones_like(dy))
    if footprint is not None:
        hit = origins + directions * t_floor[:, None]
        box = footprint.to(hit.dtype)
        inside = ((hit[:, 0] >= box[0, 0]) & (hit[:, 0] <= box[1, 0])
                  & (hit[:, 2] >= box[0, 2]) & (hit[:, 2] <= box[1, 2]))
        down = down & inside
    return torch.where(down, torch.minimum(far, t_floor.to(far.dtype)), far)


def stratified_samples(near: torch.Tensor, far: torch.Tensor, num_samples: int,
                       perturb: bool, generator: torch.Generator | None = None):
    """Stratified samples in ``[near, far]`` (NeRF Eq. 2).

    Args:
        near, far: (R,) float bounds. num_samples: S.
        perturb: jitter each inner edge uniformly between the midpoints of the two bins
            it separates (training); else the S equal bins (deterministic). The outer
            edges stay at ``near`` and ``far`` either way.
        generator: random source for the jitter.
    Returns:
        t_starts, t_ends: (R, S) float contiguous intervals covering exactly [near, far].
    """
    steps = torch.linspace(0.0, 1.0, num_samples + 1, device=near.device, dtype=near.dtype)
    edges = near[:, None] + (far - near)[:, None] * steps  # (R, S+1)
    # near + (far - near) * 1 may miss far by an ulp: pin the outer edges exactly
    edges = torch.cat([near[:, None], edges[:, 1:-1], far[:, None]], dim=-1)
    if perturb and num_samples > 1:
        mids = 0.5 * (edges[:, 1:] + edges[:, :-1])  # (R, S)
        u = torch.rand((edges.shape[0], num_samples - 1), generator=generator, device=near.device,
                       dtype=near.dtype)
        inner = mids[:, :-1] + (mids[:, 1:] - mids[:, :-1]) * u
        edges = torch.cat([edges[:, :1], inner, edges[:, -1:]], dim=-1)
    return edges[:, :-1], edges[:, 1:]


def sample_pdf(bins: torch.Tensor, weights: torch.Tensor, num_samples: int, perturb: bool,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """Inverse-transform sampling of a piecewise-constant PDF (NeRF Sec. 5.2).

    Args:
        bins: (R, B+1) float bin edges along each ray (sorted).
        weights: (R, B) float non-negative weights of each bin (detached by the caller).
        num_samples: samples to draw per ray.
        perturb: uniform random CDF values if True, else evenly spaced.
    Returns:
        (R, num_samples) float sorted ray parameters.
    """
    weights = weights + 1e-5
    pdf = weights / weights.sum(dim=-1, keepdim=True)
    cdf = torch.cat([torch.zeros_like(pdf[:, :1]), torch.cumsum(pdf, dim=-1)], dim=-1)
    if perturb:
        u = torch.rand((cdf.shape[0], num_samples), generator=generator, device=cdf.device)
    else:
        u = torch.linspace(0.0, 1.0, num_samples, device=cdf.device).expand(cdf.shape[0], -1)
    u = u.contiguous()
    idx = torch.searchsorted(cdf, u, right=True)
    below = (idx - 1).clamp(min=0)
    above = idx.clamp(max=cdf.shape[-1] - 1)
    cdf_lo, cdf_hi = torch.gather(cdf, 1, below), torch.gather(cdf, 1, above)
    bin_lo, bin_hi = torch.gather(bins, 1, below), torch.gather(bins, 1, above)
    denom = torch.where(cdf_hi - cdf_lo < 1e-5, torch.ones_like(cdf_lo), cdf_hi - cdf_lo)
    t = (u - cdf_lo) / denom
    return torch.sort(bin_lo + t * (bin_hi - bin_lo), dim=-1).values


def intervals_from_points(t: torch.Tensor, far: torch.Tensor):
    """Intervals around sorted sample positions: each ends where the next begins.

    Args:
        t: (R, S) sorted ray parameters. far: (R,) bound closing the last interval.
    Returns:
        t_starts, t_ends: (R, S).
    """
    t_ends = torch.cat([t[:, 1:], far[:, None].expand(-1, 1)], dim=-1)
    return t, torch.maximum(t_ends, t)
