"""The static training render of a marched model: fixed shapes within a grid stage, no host read.

Legend: R rays (the batch: the ray capacity), P sample slots (``step.samples_per_step``), K
candidate intervals per ray.

:func:`static_render` is :meth:`~distnerf.model.marched.MarchingModel.forward` in training (one
marching pass, no termination cut: ``model.train_termination=false`` and ``train_round_steps=0``)
on :mod:`distnerf.renderer.static`'s fixed-capacity layout, with a **sample budget**: the first
``active`` rays of the batch are marched, the others get empty segments; a ray whose samples did
not all fit (overflow) and an inactive ray weigh 0 in the loss, and the counted rays' weights make
the summed error their mean (:func:`static_render`'s ``loss_weight``), so the learning rate needs no
change as the active count adapts. Every argument that sets a shape is a Python number fixed for the
stage, every data-dependent value stays on the device: the function compiles with
``torch.compile(fullgraph=True)`` (:class:`~distnerf.components.sample_budget.SampleBudget`).
"""
from __future__ import annotations

import torch

from ..data.rays import RayBundle
from ..renderer.output import RenderOutput
from ..renderer.samples import clip_to_box
from ..renderer.static import march_static, next_active_rays, render_static


def static_problems(marched: bool, contracted: bool, opaque_floor: bool, round_steps: int, termination: bool,
                    focus: bool) -> list[str]:
    """The options of a model the static render does not cover, named as config keys ([] when it covers
    them): the one rule behind :func:`check_static` (a built model) and the entry point's batch default
    (a config, before any model: :func:`distnerf.components.sample_budget.static_by_default`)."""
    if not marched:
        return ["a model that is not marched (model=grid or ngp)"]
    return [key for key, bad in (("model.contraction=mipnerf360", contracted),
                                 ("model.opaque_floor=true", opaque_floor),
                                 ("model.train_round_steps>0", bool(round_steps)),
                                 ("model.train_termination=true", termination),
                                 ("a focus box (strategy=ss)", focus)) if bad]


def check_static(model) -> None:
    """Raise ValueError where the static render does not cover ``model``'s options: a marched
    model (``model=grid`` or ``ngp``), bounded (``model.contraction=none``), without
    ``model.opaque_floor``, rendered in one pass (``model.train_round_steps=0``,
    ``model.train_termination=false``), without a focus box (``strategy=ss``'s sub-models: untried)."""
    if not hasattr(model, "occupancy") or not hasattr(model, "field_query"):
        raise ValueError(f"step.samples_per_step needs a marched model (grid, ngp), not {type(model).__name__}")
    problems = static_problems(True, model.contraction_aabb is not None, model.opaque_floor,
                               model.train_round_steps, model.train_termination, getattr(model, "focus", None) is not None)
    if problems:
        raise ValueError(f"step.samples_per_step: the static step does not cover {', '.join(problems)}")


def field_fn_of(model, image_ids: torch.Tensor | None):
    """The model's one-pass ``field_fn`` (:meth:`~distnerf.model.marched.MarchingModel.field_query`),
    or one made of :meth:`field_density` and :meth:`colours` where it has none."""
    field_fn = model.field_query(image_ids)
    if field_fn is not None:
        return field_fn

    def both(points: torch.Tensor):
        def colour_at(index, viewdirs, ray_indices):
            at = points if index is None else points.index_select(0, index)
            return model.colours(at, viewdirs, ray_indices, image_ids=image_ids)

        return model.field_density(points), colour_at

    return both


def static_render(model, rays: RayBundle, u: torch.Tensor, background: torch.Tensor | None, clip_box: torch.Tensor,
                  active_rays: torch.Tensor, field_fn, step_size: float, num_slots: int, capacity: int,
                  headroom: float, ranges: tuple[torch.Tensor, torch.Tensor] | None = None,
                  any_occupied: torch.Tensor | None = None):
    """One training render in P fixed slots (module docstring).

    Args:
        model: a :class:`~distnerf.model.marched.MarchingModel` that :func:`check_static` accepts.
        rays: R rays. u: (R,) float in [0, 1) the sample-grid jitter (:meth:`sample_anchor`'s draw).
        background: (3,) or (R, 3) float, or None (the model's or the random background).
        clip_box: (2, 3) float32 the part of the marching box that can hold a sample (the occupied
            cells' box within it, :meth:`~distnerf.renderer.occupancy.OccupancyGrid.occupied_aabb`).
        active_rays: 0-dim int64 rays marched this step (the first ones of the batch; 1 to R).
        field_fn: :func:`field_fn_of` the model and the rays' images. step_size: :meth:`step_size`
            (both found by the caller: the model's caches compare data pointers, which a graph cannot).
        num_slots: K (:func:`~distnerf.renderer.static.interval_slots`). capacity: P.
        headroom: :func:`~distnerf.renderer.static.next_active_rays`'s.
        ranges: ``(arange(R), arange(P))`` int64 on the device when the caller keeps them (fixed buffers,
            two operators fewer a step), else made here.
        any_occupied: 0-dim bool whether any occupancy cell is set, when the caller keeps it (it changes
            only on a refresh), else computed here.
    Returns:
        out: :class:`~distnerf.renderer.output.RenderOutput` with ``loss_weight`` (R,) float32
            ``counted_r * R / num_counted`` (counted: active and not overflowed; the summed error over
            R is then the counted rays' mean), ``num_samples`` P, and ``distortion_loss`` as
            :meth:`forward`'s;
        next_active: 0-dim int64 the next step's active rays;
        stats: (4,) int64 [counted rays, active rays, samples needed, any cell occupied].
    """
    num_rays = len(rays)
    ray_range, slot_range = ranges if ranges is not None else (torch.arange(num_rays, device=u.device), None)
    norms = rays.directions.norm(dim=-1)  # once: the anchor, the intervals and the densities' scale
    dt = step_size / norms  # the interval in ray parameter, as the dynamic march's
    anchor = rays.near + u * dt  # sample_anchor's jitter (its ``u * step_size / |d|``, to rounding)
    active = ray_range < active_rays
    t_lo, t_hi = clip_to_box(rays.origins, rays.directions, rays.near, model.ray_far(rays),
                             clip_box.to(rays.origins.dtype))
    t_hi = torch.where(active, t_hi, t_lo)  # an inactive ray: an empty segment, no slot
    cell_origins, cell_directions = model.occupancy.ray_cells(rays.origins, rays.directions)
    samples, filled, fits, needed = march_static(rays.origins, rays.directions, anchor, t_lo, t_hi,
                                                 dt, model.occupancy.binary, cell_origins, cell_directions,
                                                 num_slots, capacity, slot_range)
    out = render_static(field_fn, samples, rays.origins, rays.directions, rays.viewdirs,
                        model.appearance_background(background, rays), model.color_threshold, norms)
    if model.distortion_loss_weight > 0:
        out.distortion_loss = model.distortion_loss_weight * model.ray_distortion(rays, anchor, samples, out.weights)
    counted = active & fits
    num_counted = counted.sum()  # (active_rays <= R: the active count itself)
    out.loss_weight = counted * num_rays / num_counted.clamp(min=1)
    out.num_samples = capacity  # the field runs on every slot
    out.samples = out.weights = None  # as forward: the packed samples stay here
    any_occupied = model.occupancy.binary.any() if any_occupied is None else any_occupied
    stats = torch.stack([num_counted, active_rays, needed, any_occupied])
    return out, next_active_rays(needed, active_rays, num_rays, capacity, headroom), stats
