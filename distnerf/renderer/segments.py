"""Compositing of ray segments rendered separately (the regions of a segmented scene).

Legend: R rays, K regions (segments per ray).

A ray crosses each axis-aligned (convex) region box in one interval, its *segment*.
A segment rendered on its own (no background) gives its colour
``C_k = sum_i T^k_i alpha_i c_i``, its transmittance ``T_k = prod_i (1 - alpha_i)`` and
its depth ``D_k = sum_i T^k_i alpha_i t_i`` (``T^k_i``: transmittance *inside* the
segment). Segments sorted by their entry distance composite front to back (Max 1995;
NeRF-XL, Li et al. ECCV 2024, Eq. 4)::

    C = sum_k (prod_{j<k} T_j) C_k + (prod_k T_k) * background

which equals rendering the union of the segments' samples in one pass (NeRF Eq. 3).
With an opaque floor (``model.opaque_floor``) the light a floored ray has left after its last
segment, ``prod_k T_k``, takes the floor's colour instead of the background's
(:func:`floor_behind`), as one model rendering the whole ray does.
"""
from __future__ import annotations

import torch

from .samples import ray_aabb


def segment_entries(origins: torch.Tensor, directions: torch.Tensor, near: torch.Tensor, far: torch.Tensor,
                    boxes: torch.Tensor) -> torch.Tensor:
    """Where each ray segment ``[near, far]`` enters each box.

    Args:
        origins, directions: (R, 3) float. near, far: (R,) float. boxes: (K, 2, 3) float.
    Returns:
        (R, K) float ray parameter of entry, +inf where the ray misses the box: the
        front-to-back order of the segments. All K boxes in one slab test (:func:`~.samples.ray_aabb`):
        the operators do not grow with K, and each entry equals :func:`~.samples.clip_to_box` of its box.
    """
    t_min, t_max = ray_aabb(origins, directions, boxes.to(origins.device, origins.dtype))  # (R, K): one pass
    t_in, t_out = torch.maximum(t_min, near[:, None]), torch.minimum(t_max, far[:, None])  # clip_to_box's
    return torch.where(t_in < t_out, t_in, float("inf"))


def transmittance_in_front(seg_transmittance: torch.Tensor, entry: torch.Tensor):
    """Transmittance of the segments in front of each segment.

    Args:
        seg_transmittance: (R, K) float ``T_k``. entry: (R, K) float entry distances.
    Returns:
        before: (R, K) float ``prod_{j in front of k} T_j`` (region order);
        remaining: (R,) float ``prod_k T_k``.
    """
    order = torch.argsort(entry, dim=1)
    t_sorted = torch.gather(seg_transmittance, 1, order)
    before_sorted = torch.cumprod(torch.cat([torch.ones_like(t_sorted[:, :1]), t_sorted[:, :-1]], dim=1), dim=1)
    before = torch.empty_like(before_sorted).scatter_(1, order, before_sorted)
    return before, before_sorted[:, -1] * t_sorted[:, -1]


def composite_segments(seg_rgb: torch.Tensor, seg_transmittance: torch.Tensor, seg_depth: torch.Tensor,
                       entry: torch.Tensor, background: torch.Tensor | None):
    """Front-to-back compositing of per-region ray segments (module docstring).

    Args:
        seg_rgb: (R, K, 3) float segment colours ``C_k``.
        seg_transmittance: (R, K) float ``T_k`` (1 where the ray misses region k).
        seg_depth: (R, K) float ``D_k``.
        entry: (R, K) float ray parameter where the ray enters region k (+inf if it misses).
        background: (3,) or (R, 3) float, or None.
    Returns:
        rgb (R, 3), depth (R,), opacity (R,) = 1 - prod_k T_k.
    """
    before, remaining = transmittance_in_front(seg_transmittance, entry)
    rgb = (before[..., None] * seg_rgb).sum(dim=1)
    depth = (before * seg_depth).sum(dim=1)
    if background is not None:
        rgb = rgb + remaining[:, None] * background
    return rgb, depth, 1.0 - remaining


def floor_behind(background: torch.Tensor | None, floor_rgb: torch.Tensor, floored: torch.Tensor) -> torch.Tensor:
    """What lies behind a ray's segments with an opaque floor: the floor's colour where the floor
    ended the ray, the background elsewhere (the ``background`` of :func:`composite_segments`).

    Args:
        background: (3,) or (R, 3) float, or None (black).
        floor_rgb: (R, 3) float colour at each ray's floor point (any value where not floored).
        floored: (R,) bool, the floor ended the ray.
    Returns:
        (R, 3) float.
    """
    bg = torch.zeros_like(floor_rgb) if background is None else background.to(floor_rgb).expand_as(floor_rgb)
    return torch.where(floored[:, None], floor_rgb, bg)
