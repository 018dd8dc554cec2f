"""The opaque floor under ``strategy=ss`` (``model.opaque_floor`` with ``model.min_altitude``).

Legend: R rays, K regions, m regions of this rank.

One model with an opaque floor ends a ray where it goes below ``min_altitude`` and composites
the light left there, ``1 - opacity``, over its colour field's value at the floor point instead
of the background (:meth:`~distnerf.model.marched.MarchingModel._absorb_at_floor`). Under ``ss``
a ray's segments are rendered by the regions it crosses and composited front to back
(:mod:`distnerf.renderer.segments`); the light left after all of them is ``prod_k T_k``, and the
floor's colour comes from the region that holds the floor point: its sub-model's colour field
there (:func:`region_floor_colours`). Each rank computes the floor colours of the floor points
its own regions hold, zero elsewhere; summed over regions after the exchange, every floored ray
gets exactly one (:func:`~distnerf.renderer.segments.floor_behind`). With the regions' fields
equal to one model's, the composite equals that model's render (``tests/unit/test_ss_floor.py``).

Where each part runs: joint training composites this way (:class:`.regions.JointRegionModels`, the
floor colours exchanged with the segment values), and so does fusion (:class:`.fusion.FusedRenderer`,
``segment`` and ``blend``). Independent training needs nothing here: a sub-model renders its rays
whole with its own opaque floor (the model's ``forward``), and a ray whose floor point lies in a
region's box crosses that region, so the region's sub-model trains on it and learns the floor
colour that fusion takes from it.
"""
from __future__ import annotations

import dataclasses

import torch

from ..data.rays import RayBundle
from ..renderer.samples import far_above_altitude
from .partition import Partition


def floored_rays(rays: RayBundle, unbounded: bool, min_altitude: float | None):
    """The rays as the sub-models end them, and which of them the floor ends.

    Args:
        rays: R rays. unbounded: contracted sub-models (an :attr:`Partition.unbounded` partition):
            the field reaches infinity, so ``far`` is not a limit. min_altitude: the sub-models'
            floor (``model.min_altitude``), or None.
    Returns:
        rays with ``far``: ``rays.far`` (``inf`` when unbounded), cut where a ray goes below the
        floor (:func:`~distnerf.renderer.samples.far_above_altitude`); floored: (R,) bool, the floor
        ended the ray inside its non-empty segment (where one model with that floor composites the
        floor's colour), or None without a floor.
    """
    free = torch.full_like(rays.far, float("inf")) if unbounded else rays.far
    if min_altitude is None:
        return dataclasses.replace(rays, far=free), None
    far = far_above_altitude(rays.origins, rays.directions, free, min_altitude)
    floored = (far < free) & (far > rays.near) & (rays.far > rays.near)  # an empty ray (masked out) stays so
    return dataclasses.replace(rays, far=far), floored


def _floor_points(partition: Partition, rays: RayBundle, floored: torch.Tensor):
    """Each ray's floor parameter (``far`` where floored, else 0: (R,)) and the region holding its floor point
    ((R, K) bool, one True per row: the point clamped to the scene box, as :meth:`Partition.region_of`)."""
    t = torch.where(floored, rays.far, torch.zeros_like(rays.far))
    points = rays.origins + rays.directions * t[:, None]
    lo, hi = partition.bounds.to(points.device, points.dtype)
    return t, partition.contains(torch.maximum(torch.minimum(points, hi), lo))


def floor_holders(partition: Partition, rays: RayBundle, floored: torch.Tensor) -> torch.Tensor:
    """(R, K) bool: region k holds ray r's floor point and the floor ends the ray (``floored``): the region
    whose sub-model gives the ray its floor colour (:func:`region_floor_colours`)."""
    return _floor_points(partition, rays, floored)[1] & floored[:, None]


def region_floor_colours(models, regions: list[int], partition: Partition, rays: RayBundle,
                         floored: torch.Tensor) -> torch.Tensor:
    """Each of ``regions``' share of the floor colour: its sub-model's colour field at the floor
    points it holds (``rays.far`` of the floored rays: :func:`floored_rays`), zero elsewhere.

    Every ray's floor colour is evaluated by each sub-model (m R colour evaluations, no size read:
    the joint training step stays free of host syncs); the points the region does not hold are
    masked out. A floor point is held by the region whose box (clamped to the scene box, as
    :meth:`Partition.region_of`; the outer regions of an unbounded partition reach infinity)
    contains it.

    Args:
        models: sub-models (:class:`~distnerf.model.marched.MarchingModel`), one per entry of ``regions``.
        partition: the K regions. rays: R rays, ``far`` at the floor where ``floored``.
        floored: (R,) bool.
    Returns:
        (R, m, 3) float: summed over all K regions, the floor colour of every floored ray, 0 elsewhere.
    """
    t, holds = _floor_points(partition, rays, floored)
    out = []
    for k, model in zip(regions, models):
        mine = (floored & holds[:, k]).to(rays.origins.dtype)
        out.append(model.floor_colour(rays, t).to(rays.origins.dtype) * mine[:, None])
    return torch.stack(out, dim=1)
