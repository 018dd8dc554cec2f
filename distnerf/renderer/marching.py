"""Rendering a ray segment of a marched field: packed samples, early ray termination,
the colour threshold (pure math over callables; no model, no distributed code).

Legend: R rays, P packed samples, Q samples that get a colour.

One function, :func:`render_segment`, serves a whole ray (the segment ``[near, far]``
clipped to the model's box, with the background) and one region's segment of a ray
(no background; ``ss`` fusion and joint training), in three regimes:

* **training** (autograd on): one no-grad pass evaluates the density at every marched
  sample and finds, per ray, the samples whose transmittance (times ``in_front``)
  exceeds ``termination``; only those run again with gradients. Samples behind them
  carry at most ``termination`` of the ray's weight. With ``round_steps`` the no-grad
  pass runs in rounds like evaluation (below): the same samples, none evaluated behind
  a cut.
* **evaluation** (autograd off): the segment is marched in rounds of ``round_steps``
  grid intervals; after each round the rays whose transmittance fell below
  ``termination`` stop and the others are compacted and marched further, so the
  density behind opaque surfaces is never evaluated.
* both: a sample gets a colour only where its weight ``in_front * T_i alpha_i`` exceeds
  ``colour_threshold`` (DVGO's fast colour threshold); it still attenuates the ray, and
  the background receives exactly the transmittance behind the last evaluated sample.

Error bound of termination (``eps = termination``): a ray stops only once its
transmittance ``T`` is below ``eps``; every later sample has weight below ``eps`` (so,
with ``eps <= colour_threshold``, no colour) and the only change is the background term,
``T bg`` instead of ``T_R bg`` with ``0 <= T_R <= T < eps``: each channel changes by less
than ``eps``. The gradient of a channel of C w.r.t. a kept sample's density is
``delta_i (T_{i+1} c_i - sum_{j>i} w_j c_j - T_R bg)`` (NeRF Eq. 3 differentiated); the
terms of the samples after the cut sum to weight ``T_cut < eps``, so termination changes
it by less than ``|d| delta_i eps`` (the interval measured in distance); colour gradients ``dC/dc_i = w_i`` are unchanged.

Host syncs (:mod:`distnerf.observe.syncs`): evaluation rounds on the sync-free paths read the
device once per call whatever the number of rounds (:mod:`~distnerf.renderer.rounds`), the
colour pass once more. A training render reads four sizes from the
device, each the length of a packed tensor, and nothing else: the march's candidate
intervals and samples (:func:`~distnerf.renderer.occupancy.march`), the samples in
front of the termination cut and the coloured samples. The counts it returns are
Python ints taken from those shapes (no further reads).
"""
from __future__ import annotations

from typing import Callable

import torch

from ..host_buffers import sync_free
from .contraction import ray_breaks
from .occupancy import grid_edges, grid_index
from .output import RenderOutput
from .packed import PackedSamples, accumulate, ray_offsets, render_transmittance
from .rounds import march_rounds_fixed

#: ``(origins, directions, anchor, t_lo, t_hi, max_intervals=None) -> PackedSamples``, e.g.
#: :meth:`~distnerf.model.marched.MarchingModel.marcher` (``max_intervals``: see
#: :func:`~distnerf.renderer.occupancy.march`)
Marcher = Callable[..., PackedSamples]


def along_ray(sigmas: torch.Tensor, samples: PackedSamples, directions: torch.Tensor,
              norms: torch.Tensor | None = None) -> torch.Tensor:
    """Densities per distance -> per unit of the ray parameter: ``sigma |d|`` ((P,) float); ``norms``:
    the (R,) ``|d|`` when the caller has them (one operator fewer).

    A marched field's density is per unit of distance in the scene's space (world, or NDC
    for LLFF), like its marching step; the quadrature runs on ray-parameter intervals
    ``t_end - t_start``, which span ``|d|`` times that in distance (NeRF's reference code
    multiplies its intervals by ``|rays_d|`` alike). A no-op for unit directions.
    """
    if sigmas.numel() == 0:
        return sigmas
    norms = directions.norm(dim=-1) if norms is None else norms
    return sigmas * norms.to(sigmas.dtype).index_select(0, samples.ray_indices)


def shade(density_fn, colour_fn, samples: PackedSamples, origins, directions, viewdirs, in_front,
           background, colour_threshold: float, sigmas: torch.Tensor | None = None,
           transmittance: tuple[torch.Tensor, torch.Tensor] | None = None, field_fn=None) -> RenderOutput:
    """Weights, colours and accumulation of packed samples.

    Args:
        density_fn, colour_fn, field_fn: see :func:`render_segment`.
        samples: P packed samples of R rays. origins, directions, viewdirs: (R, 3) float.
        in_front: (R,) float transmittance in front of the segment, or None (1).
        background: (3,) or (R, 3) float, or None. colour_threshold: float.
        sigmas: (P,) float densities (per distance, as ``density_fn`` returns them), or None to
            evaluate them (with autograd if enabled).
        transmittance: ``(weights, remaining)``, (P,) and (R,) float, the samples' weights and the
            transmittance behind each ray's last evaluated sample when the caller has them
            (:func:`march_alive` in rounds, no autograd), or None to compute them from ``sigmas``.
    Returns:
        :func:`~distnerf.renderer.packed.accumulate`'s :class:`~distnerf.renderer.output.RenderOutput`
        with ``num_colour_samples``, ``weights`` (P,) (differentiable) and ``samples`` (the P
        PackedSamples).
    """
    points = None  # only the coloured samples' points are needed when the weights are given
    colour_at = None  # field_fn's colours of the samples at an index
    if transmittance is not None:
        weights, remaining = transmittance
    else:
        if sigmas is None:
            points = samples.points(origins, directions)
            if field_fn is not None:
                sigmas, colour_at = field_fn(points)
            else:
                sigmas = density_fn(points)
        weights, _, remaining = render_transmittance(along_ray(sigmas, samples, directions), samples)
    global_w = weights.detach()
    if in_front is not None:
        global_w = global_w * in_front.index_select(0, samples.ray_indices)
    # host sync: the number of coloured samples (only they run the colour field)
    colour_index = (global_w > colour_threshold).nonzero().view(-1)
    colour_rays = samples.ray_indices.index_select(0, colour_index)
    if colour_at is not None:
        rgbs = colour_at(colour_index, viewdirs, colour_rays)
    elif points is not None:
        rgbs = colour_fn(points.index_select(0, colour_index), viewdirs, colour_rays)
    else:
        rgbs = colour_fn(samples.select(colour_index).points(origins, directions), viewdirs, colour_rays)
    out = accumulate(weights, rgbs.to(weights.dtype), samples, remaining, background, colour_index, colour_rays)
    out.num_colour_samples, out.weights, out.samples = colour_index.shape[0], weights, samples
    return out


def march_alive(density_fn, marcher: Marcher, origins, directions, anchor, t_lo, t_hi, *, termination: float,
                in_front: torch.Tensor | None = None, step_size: float = 0.0, round_steps: int | None = None):
    """The marched samples in front of each ray's termination point.

    With ``round_steps``, the segments are marched ``round_steps`` grid intervals at a
    time (no grad); after each round the rays whose transmittance (times ``in_front``)
    fell below ``termination`` stop, and only the others are marched on, so the density
    behind an opaque surface is never evaluated (training and evaluation alike: an aerial
    ray that hits the ground in its first round costs that round, not the whole ray).
    Otherwise one no-grad pass over all marched samples finds the cut. Both keep the same
    samples (those whose transmittance in front exceeds ``termination``). On the sync-free paths
    (:func:`~distnerf.host_buffers.sync_free`: CUDA), a marcher with ``clip`` and ``occupancy``
    marches its rounds in a fixed layout instead (:func:`~distnerf.renderer.rounds.march_rounds_fixed`:
    a fixed number of rounds, stopped rays masked, one host read per call, not several per round).

    Returns:
        samples: the kept PackedSamples (a prefix of each ray's marched samples);
        sigmas: (P,) their densities, or None when autograd is on (the caller evaluates
        them with gradients); num_marched: int, samples marched (density evaluated);
        transmittance: ``(weights, remaining)``, (P,) the kept samples' weights ``T_i alpha_i``
        in the segment and (R,) the transmittance behind each ray's last kept sample, as the
        rounds computed them (what :func:`shade` would compute from the kept samples'
        densities), or None (no rounds, or autograd on).
    """
    grad = torch.is_grad_enabled()
    with torch.no_grad():
        if round_steps:
            samples, sigmas, num_marched, trans = _march_rounds(density_fn, marcher, origins, directions, anchor,
                                                                t_lo, t_hi, termination, in_front, step_size,
                                                                round_steps)
            return samples, (None if grad else sigmas), num_marched, (None if grad else trans)
        samples = marcher(origins, directions, anchor, t_lo, t_hi)
        num_marched = len(samples)
        if termination <= 0 or not num_marched:
            return samples, None, num_marched, None
        sigmas = density_fn(samples.points(origins, directions))
        _, trans, _ = render_transmittance(along_ray(sigmas, samples, directions), samples)
        if in_front is not None:
            trans = trans * in_front.index_select(0, samples.ray_indices)
        keep = (trans > termination).nonzero().view(-1)  # host sync: the samples in front of the cut
        samples = samples.select(keep)
        return samples, (None if grad else sigmas.index_select(0, keep)), num_marched, None


def _march_rounds(density_fn, marcher: Marcher, origins, directions, anchor, t_lo, t_hi, termination: float,
                  in_front: torch.Tensor | None, step_size: float, round_steps: int):
    """:func:`march_alive` in rounds of ``round_steps`` grid intervals (call under no_grad);
    returns ``(samples, sigmas, num_marched, (weights, remaining))``."""
    num_rays = origins.shape[0]
    clip = getattr(marcher, "clip", None)  # the segments' part that can hold samples: no round marches air
    if clip is not None:
        t_lo, t_hi = clip(origins, directions, t_lo, t_hi)
        occupancy = getattr(marcher, "occupancy", None)
        if occupancy is not None and sync_free(origins.device):  # a fixed number of rounds, no read per round
            return march_rounds_fixed(density_fn, occupancy, origins, directions, anchor, t_lo, t_hi, termination,
                                      in_front, step_size, round_steps)
        marcher = getattr(marcher, "inside", marcher)  # the rounds lie inside the clipped segments
    local = torch.ones(num_rays, dtype=origins.dtype, device=origins.device)  # transmittance so far
    alive = (t_hi > t_lo).nonzero().view(-1)
    lo = t_lo.clone()
    dt = step_size / directions.norm(dim=-1)
    spacing = getattr(marcher, "spacing_aabb", None)  # a contracted field's spacing (rounds end on its edges)
    breaks = None if spacing is None else ray_breaks(origins, directions, anchor, spacing)
    # grid edge where each ray's next round starts, counted in integers: recomputing it from
    # ``lo`` by floor((lo - a) / dt) can land one edge short and, with round_steps = 1, never advance
    j_next = grid_index(t_lo, anchor, dt, breaks)
    parts, sigma_parts, weight_parts, num_marched = [], [], [], 0
    while alive.numel():  # per round: the march's two sizes, the kept samples, the rays still alive
        o, d, a = (t.index_select(0, alive) for t in (origins, directions, anchor))
        # each round ends on an edge of the sample grid, so rounds split no interval
        j_end = j_next[alive] + round_steps
        j_next[alive] = j_end
        hi = torch.minimum(grid_edges(a, dt[alive], j_end, None if breaks is None else breaks[alive]), t_hi[alive])
        # a round touches at most round_steps grid intervals, + 1 at either end from rounding
        samples = marcher(o, d, a, lo[alive], hi, max_intervals=round_steps + 2)
        sigmas = density_fn(samples.points(o, d))
        weights, trans, remaining = render_transmittance(along_ray(sigmas, samples, d), samples)
        local_alive = local[alive]
        before = local_alive if in_front is None else local_alive * in_front[alive]
        kept_mask = trans * before.index_select(0, samples.ray_indices) > termination
        keep = kept_mask.nonzero().view(-1)
        # the transmittance behind each ray's last kept sample: the cut keeps a prefix of the ray, so
        # it is the transmittance in front of its first dropped sample, the largest over the dropped
        # ones and at least the transmittance behind them all (``remaining``: no sample dropped)
        remaining = remaining.scatter_reduce(0, samples.ray_indices,
                                             torch.where(kept_mask, 0.0, trans).to(remaining.dtype), "amax")
        kept = samples.select(keep)
        parts.append(PackedSamples(alive.index_select(0, kept.ray_indices), kept.t_starts, kept.t_ends, num_rays))
        sigma_parts.append(sigmas.index_select(0, keep))
        # the weight in the segment: the transmittance of the earlier rounds times the round's own
        weight_parts.append(weights.index_select(0, keep)
                            * local_alive.index_select(0, kept.ray_indices).to(weights.dtype))
        num_marched += len(samples)
        local[alive] = local_alive * remaining
        lo[alive] = hi
        alive = alive[(hi < t_hi[alive]) & (before * remaining > termination)]
    if not parts:  # no ray crosses its segment
        empty = origins.new_zeros(0)
        return PackedSamples(empty.long(), empty, empty, num_rays), empty, 0, (empty, local)
    # order by ray, then round (rounds are in order along every ray): each round's samples are sorted
    # by ray, so a sample's place is its ray's start, plus its ray's samples in earlier rounds, plus
    # its rank in its round (no sort)
    offsets = [ray_offsets(p.ray_indices, num_rays) for p in parts]
    counts = torch.stack([c for _, c in offsets])  # (rounds, R)
    earlier = torch.cumsum(counts, 0) - counts
    total = counts.sum(0)
    ray_start = torch.cumsum(total, 0) - total
    place = torch.cat([(ray_start + earlier[r] - starts).index_select(0, p.ray_indices)
                       + torch.arange(len(p), device=origins.device)
                       for r, (p, (starts, _)) in enumerate(zip(parts, offsets))])
    order = torch.empty_like(place)
    order[place] = torch.arange(place.shape[0], device=place.device)  # index_put: deterministic everywhere
    samples = PackedSamples(torch.cat([p.ray_indices for p in parts]), torch.cat([p.t_starts for p in parts]),
                            torch.cat([p.t_ends for p in parts]), num_rays).select(order)
    return (samples, torch.cat(sigma_parts).index_select(0, order), num_marched,
            (torch.cat(weight_parts).index_select(0, order), local))


def render_segment(density_fn: Callable[[torch.Tensor], torch.Tensor],
                   colour_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                   marcher: Marcher, origins: torch.Tensor, directions: torch.Tensor, viewdirs: torch.Tensor,
                   anchor: torch.Tensor, t_lo: torch.Tensor, t_hi: torch.Tensor, *,
                   background: torch.Tensor | None, colour_threshold: float, termination: float,
                   in_front: torch.Tensor | None = None, step_size: float = 0.0,
                   round_steps: int | None = None, field_fn=None) -> RenderOutput:
    """Render the segments ``[t_lo, t_hi]`` of R rays (module docstring).

    Args:
        density_fn: (P, 3) points -> (P,) float sigma (1 / distance unit; see :func:`along_ray`).
        colour_fn: (Q, 3) points, (R, 3) viewdirs, (Q,) int64 ray indices -> (Q, 3) rgb.
        field_fn: optional, for the pass that renders (not the no-grad march): (P, 3) points ->
            ``(sigmas, colour_at)``, density_fn's (P,) sigmas and ``colour_at(index, viewdirs,
            ray_indices)``, the colours of the samples at ``index`` ((Q,) int64; None: every sample, in
            order, with no gather), equal to colour_fn's of their points: a field that shares work between the two (a grid's corner rows and weights,
            found once) returns both from one pass. None: density_fn, then colour_fn.
        marcher: ``(origins, directions, anchor, t_lo, t_hi, max_intervals=None) -> PackedSamples``,
            e.g. :func:`~distnerf.renderer.occupancy.march` bound to a step and a grid; an
            attribute ``spacing_aabb`` (a contracted field's unit region) makes evaluation
            rounds end on the edges of the contracted spacing; an attribute ``clip``
            (``(origins, directions, t_lo, t_hi) -> (t_lo, t_hi)``, the part of each segment
            where the marcher can place a sample) makes the rounds start and end there instead
            of marching empty rounds through the air in front of and behind the occupied box; with
            it, an attribute ``inside`` (the marcher for segments already inside ``clip``'s part)
            marches the rounds, and an attribute ``occupancy`` (the marcher's
            :class:`~distnerf.renderer.occupancy.OccupancyGrid`) lets the sync-free paths march them
            in a fixed layout (:mod:`~distnerf.renderer.rounds`).
        origins, directions: (R, 3) float. viewdirs: (R, 3) float unit, for colour.
        anchor: (R,) float sample-grid anchor. t_lo, t_hi: (R,) float segment bounds.
        background: (3,) or (R, 3) float RGB, or None (a segment: no background term).
        colour_threshold: weight below which a sample gets no colour (0: every sample).
        termination: transmittance below which a ray stops (0: never).
        in_front: (R,) float transmittance in front of the segment (1 when None); the
            colour threshold and termination apply to ``in_front * T``.
        step_size: the marcher's step (distance), to end evaluation rounds on grid edges.
        round_steps: grid intervals per marching round (:func:`march_alive`), or None /
            0 (one pass over the whole segment).
    Returns:
        :class:`~distnerf.renderer.output.RenderOutput` with ``rgb`` (R, 3), ``depth`` (R,), ``opacity`` (R,) = 1 - ``transmittance``
        (R,), int counts ``num_samples`` (marched), ``num_density_samples`` (density
        evaluations, both passes) and ``num_colour_samples``, and the rendered packed
        ``samples`` with their ``weights`` (P,) (for a loss on the weights, e.g.
        :func:`~distnerf.renderer.packed.distortion_loss`).
    """
    samples, sigmas, num_marched, trans = march_alive(density_fn, marcher, origins, directions, anchor, t_lo, t_hi,
                                                      termination=termination, in_front=in_front,
                                                      step_size=step_size, round_steps=round_steps)
    out = shade(density_fn, colour_fn, samples, origins, directions, viewdirs, in_front, background,
                 colour_threshold, sigmas, trans, field_fn)
    extra = len(samples) if (sigmas is None and termination > 0) else 0
    out.num_samples, out.num_density_samples = num_marched, num_marched + extra
    return out
