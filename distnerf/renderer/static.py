"""Fixed-capacity packed samples: the march and the render of a static training step.

Legend: R rays (the step's fixed ray capacity), K candidate intervals per ray (a Python number
fixed per grid stage), P the sample capacity (``step.samples_per_step``, fixed for the run).

The dynamic march (:func:`~distnerf.renderer.occupancy.march`) reads the number of samples from
the device (``nonzero``) and the colour threshold reads the number of coloured samples: two host
syncs a step, and shapes that change every step, so neither ``torch.compile(fullgraph=True)`` nor
a CUDA graph can hold the step. Here every shape is fixed within a grid stage (Instant-NGP and
nerfacc keep a fixed sample budget of about 2^18 samples a step, Mueller et al. 2022, Sec. 4):

* :func:`march_static`: the dense walk of
  :func:`~distnerf.renderer.occupancy._march_dense` (every interval of every segment in an
  (R, K) layout tested against the grid, the same samples bit for bit), its mask packed into
  P slots with ``torch.nonzero_static`` (a prefix sum and a scatter where the device has no kernel:
  CUDA before torch 2.6, :func:`~distnerf.host_buffers.compact_nonzeros`). Unused slots are *padding samples* of zero width
  attached to the last ray, so ``ray_indices`` stay non-decreasing and a padding sample adds
  nothing (``tau = sigma * 0``, no weight, no gradient). Rays whose samples do not all fit
  *overflow*: each is flagged (the caller leaves it out of the loss), never dropped silently.
* :func:`render_static`: the colour threshold as a mask (every slot is coloured and its
  weight masked) instead of a ``nonzero``; the compositing of
  :mod:`~distnerf.renderer.packed`.
* :func:`next_active_rays`: the ray budget's rule, on the device.
"""
from __future__ import annotations

import torch

from ..host_buffers import compact_nonzeros
from .marching import along_ray
from .occupancy import interval_bounds, occupied_intervals
from .output import RenderOutput
from .packed import PackedSamples, render_transmittance, sum_along_rays


def interval_slots(box_diagonal: float, step_size: float) -> int:
    """K, the candidate intervals per ray of :func:`march_static`: no segment inside a box of
    diagonal ``box_diagonal`` (world units) touches more than ``diagonal / step_size + 2`` grid
    intervals, + 2 of margin for rounding (:func:`~distnerf.renderer.occupancy._march_dense`'s
    bound, here from a box fixed for the grid stage instead of the occupied box)."""
    return int(box_diagonal / step_size + 4) + 1


def march_static(origins: torch.Tensor, directions: torch.Tensor, anchor: torch.Tensor, t_lo: torch.Tensor,
                 t_hi: torch.Tensor, dt: torch.Tensor, binary: torch.Tensor, cell_origins: torch.Tensor,
                 cell_directions: torch.Tensor, num_slots: int, capacity: int, slot_range: torch.Tensor | None = None):
    """The occupied grid intervals of R segments in P fixed slots, reading no size from the device.

    Args:
        origins, directions: (R, 3) float rays (world units; directions need not be unit).
        anchor: (R,) float ray parameter of sample-grid edge 0 (:func:`~.occupancy.march`).
        t_lo, t_hi: (R,) float segments, already inside the occupancy grid's box (empty where
            ``t_lo >= t_hi``: an inactive ray).
        dt: (R,) float the interval length in ray parameter, ``step_size / |d|`` (world units over
            the directions' norms). binary: (M, M, M) bool occupancy.
        cell_origins, cell_directions: (R, 3) the rays in cell units
            (:meth:`~.occupancy.OccupancyGrid.ray_cells`).
        num_slots: K >= the intervals any segment touches (:func:`interval_slots`).
        capacity: P. slot_range: (P,) int64 ``arange(P)`` when the caller keeps one (else made here).
    Returns:
        samples: :class:`~.packed.PackedSamples` of P slots (the first ``min(needed, P)``
            are real samples, as :func:`~.occupancy.march` would give them, the rest padding),
            its ``t_mids`` set from the march's (the same expression);
        filled: (P,) bool the real slots;
        fits: (R,) bool whether all of a ray's samples got a slot (False: overflow);
        needed: 0-dim int64 the occupied intervals of all segments (the slots they needed).
    """
    num_rays = origins.shape[0]
    lo_j, hi_j = interval_bounds(t_lo, t_hi, anchor, dt)
    edges, keep, t_mids = occupied_intervals(anchor, dt, t_lo, t_hi, lo_j, hi_j - lo_j, num_slots, cell_origins,
                                             cell_directions, binary)  # (R, K): interval lo_j + k
    fits = torch.cumsum(keep.sum(dim=1), 0) <= capacity
    # row-major positions of the kept intervals, padded with the last position (R K - 1): its ray is the
    # last and its first edge the last row's last interval's, so no clamp is needed; no size read
    flat, needed = compact_nonzeros(keep.view(-1), capacity, fill_value=num_rays * num_slots - 1)
    slot_range = torch.arange(capacity, device=flat.device) if slot_range is None else slot_range
    filled = slot_range < needed
    ray = torch.div(flat, num_slots, rounding_mode="floor")
    # (start, end) of each slot's interval in one gather: the overlapping pairs of the flat edges (a view)
    pairs = edges.reshape(-1).unfold(0, 2, 1).index_select(0, flat + ray)  # (P, 2); K + 1 edges a row
    starts = pairs[:, 0]
    ends = torch.where(filled, pairs[:, 1], starts)  # a padding slot: zero width
    samples = PackedSamples(ray, starts, ends, num_rays)
    samples.__dict__["_t_mids"] = t_mids.reshape(-1).index_select(0, flat)  # the property's cache
    return samples, filled, fits, needed


def render_static(field_fn, samples: PackedSamples, origins: torch.Tensor, directions: torch.Tensor,
                  viewdirs: torch.Tensor, background: torch.Tensor | None, colour_threshold: float,
                  norms: torch.Tensor | None = None) -> RenderOutput:
    """Render P fixed slots (:func:`march_static`): :func:`~.marching.shade` without its ``nonzero``.

    Args:
        field_fn: (P, 3) points -> ``(sigmas, colour_at)``, (P,) float densities (per distance) and
            ``colour_at(index, viewdirs, ray_indices)``, the (Q, 3) colours of the samples at ``index``
            (None: all P) (:meth:`~distnerf.model.marched.MarchingModel.field_query`'s contract).
        samples: P slots. origins, directions, viewdirs: (R, 3) float.
        background: (3,) or (R, 3) float RGB, or None. colour_threshold: weight below which a
            sample's colour does not count (every slot is coloured; its weight is masked).
        norms: (R,) float ``|directions|`` when the caller has them (else computed).
    Returns:
        :class:`~.output.RenderOutput`: ``rgb`` (R, 3), ``depth`` (R,), ``opacity``, ``transmittance``
        (R,), ``weights`` (P,) and ``samples`` (no counts: each would be a device value). Equal to
        :func:`~.marching.shade`'s on the same samples (the masked slots add exact zeros), to the colour
        network's float rounding.
    """
    points = samples.points(origins, directions)
    sigmas, colour_at = field_fn(points)
    weights, _, remaining = render_transmittance(along_ray(sigmas, samples, directions, norms), samples)
    coloured = weights.detach() > colour_threshold
    rgbs = colour_at(None, viewdirs, samples.ray_indices).to(weights.dtype)
    rgb = sum_along_rays((weights * coloured)[:, None] * rgbs, samples.ray_indices, samples.num_rays)
    if background is not None:  # (an addcmul: one operator fewer here, one more in the backward)
        rgb = rgb + remaining[:, None] * background
    depth = sum_along_rays(weights * samples.t_mids, samples.ray_indices, samples.num_rays)
    return RenderOutput(rgb=rgb, depth=depth, opacity=1.0 - remaining, transmittance=remaining, weights=weights,
                        samples=samples)


def next_active_rays(needed: torch.Tensor, num_active: torch.Tensor, num_rays: int, capacity: int,
                     headroom: float) -> torch.Tensor:
    """The ray budget's rule (Instant-NGP's): the rays the next step marches, on the device.

    ``floor(floor(headroom * P) / s)`` with ``s`` the samples per active ray this step needed (overflowed
    ones included), clamped to [1, R]; in integers. Used one step late, so no host reads it.

    Args:
        needed: 0-dim int64 samples the active rays needed. num_active: 0-dim int64 active rays.
        num_rays: R. capacity: P. headroom: the fraction of P aimed at (below 1: room for the
            variation between steps, so that few rays overflow).
    Returns:
        0-dim int64 tensor.
    """
    target = num_active * int(headroom * capacity)  # no slot needed: R rays (the clamp)
    return torch.div(target, needed.clamp(min=1), rounding_mode="floor").clamp_(1, num_rays)
