"""Marching rounds in a fixed layout: evaluation's march with no host read per round.

Legend: R rays, K grid-interval slots per round, N rounds, C density evaluations per round,
P kept samples.

:func:`~distnerf.renderer.marching.march_alive` marches a segment in rounds of ``round_steps``
grid intervals and stops a ray once its transmittance falls below ``termination``. Its dynamic
form compacts the alive rays after every round and packs each round's samples with ``nonzero``:
several host reads per round, each a wait for the device on CUDA. :func:`march_rounds_fixed`
marches the same samples in shapes that never depend on the data:

* the number of rounds N is a Python number: a segment clipped to the occupied cells' box is no
  longer than that box's diagonal ``D`` (:meth:`~distnerf.renderer.occupancy.OccupancyGrid.occupied_diagonal`),
  so it touches at most ``D / step + 2`` grid intervals, and ``N = ceil((D / step + 3) / round_steps)``
  rounds cover it (one interval of margin for rounding; checked on the device, ``_assert_async``);
* every round covers all R rays in an (R, K) layout, ``K = round_steps + 3`` slots (a round touches at
  most ``round_steps`` intervals, + 1 at either end from rounding, as
  :func:`~distnerf.renderer.occupancy.march` bounds it); a ray that terminated or crossed its segment
  gets an empty segment (masked, not compacted);
* the densities are evaluated at the round's occupied slots packed into C rows with
  ``torch.nonzero_static`` (fixed size, padded); with the default ``C = R K`` no round overflows; a
  smaller C is counted on the device, and a chunk whose rounds overflowed is marched again at
  ``C = R K`` (a second pass, found in the one read below);
* transmittance within a round is a row ``cumsum`` of the (R, K) layout (float64, like
  :func:`~distnerf.renderer.packed.render_transmittance`);
* the kept samples of all rounds, (R, N K) in order along each ray, are packed once per chunk: one
  host read gives their count, the marched count and the overflow flag together.

So a chunk reads the device once here whatever N is (the renderer's colour pass adds its own read:
:func:`~distnerf.renderer.marching.shade`). The samples, their densities, weights and each ray's
remaining transmittance are those of the dynamic rounds (same grid edges, same occupancy test in cell
units, same cut), up to float rounding of the transmittance sums. The work is that of all R rays in
every round, terminated or not: on a CPU, where a size costs nothing, the dynamic rounds do less and
stay its default (:func:`~distnerf.host_buffers.sync_free`).
"""
from __future__ import annotations

import math

import torch

from .occupancy import OccupancyGrid, grid_edges, grid_index, interval_bounds, occupied_intervals
from .packed import PackedSamples


def num_rounds(occupancy: OccupancyGrid, step_size: float, round_steps: int) -> int:
    """Rounds of ``round_steps`` intervals that cover any segment inside the occupied cells' box:
    ``ceil((D / step_size + 3) / round_steps)``, D its diagonal (a Python float; module docstring)."""
    return max(1, math.ceil((occupancy.occupied_diagonal() / step_size + 3) / round_steps))


def march_rounds_fixed(density_fn, occupancy: OccupancyGrid, origins: torch.Tensor, directions: torch.Tensor,
                       anchor: torch.Tensor, t_lo: torch.Tensor, t_hi: torch.Tensor, termination: float,
                       in_front: torch.Tensor | None, step_size: float, round_steps: int,
                       capacity: float = 1.0):
    """:func:`~distnerf.renderer.marching.march_alive`'s rounds in fixed shapes (module docstring; call
    under no_grad).

    Args:
        density_fn: (C, 3) points -> (C,) float sigma per distance.
        occupancy: the grid the marcher tests (not contracted).
        origins, directions: (R, 3) float. anchor: (R,) float sample-grid anchor.
        t_lo, t_hi: (R,) float segments already clipped to the marcher's box and the occupied cells'
            box (the marcher's ``clip``); empty where ``t_lo >= t_hi``.
        termination: transmittance (times ``in_front``) below which a ray stops.
        in_front: (R,) float transmittance in front of the segments, or None (1).
        step_size: the sample grid's step (distance). round_steps: grid intervals per round.
        capacity: density evaluations per round as a fraction of the R K slots, in (0, 1]; below 1 a
            chunk whose rounds overflow is marched again at 1.
    Returns:
        ``(samples, sigmas, num_marched, (weights, remaining))`` as the dynamic rounds: the kept
        PackedSamples (P), their (P,) densities, the int count of densities evaluated at marched
        samples, their (P,) weights in the segment and (R,) transmittance behind each ray's last
        kept sample.
    Raises:
        ValueError: ``capacity`` outside (0, 1].
    """
    if not 0.0 < capacity <= 1.0:
        raise ValueError(f"march_rounds_fixed: capacity {capacity} outside (0, 1]")
    num_rays, dtype, device = origins.shape[0], origins.dtype, origins.device
    num_slots = round_steps + 3  # as march's layout for max_intervals = round_steps + 2
    slots = num_rays * num_slots
    cap = slots if capacity >= 1.0 else max(1, math.ceil(capacity * slots))
    norm = directions.norm(dim=-1)
    dt = step_size / norm
    cell_origins, cell_directions = occupancy.ray_cells(origins, directions)
    before_front = 1.0 if in_front is None else in_front
    local = torch.ones(num_rays, dtype=dtype, device=device)  # transmittance of the earlier rounds
    alive = t_hi > t_lo
    lo = t_lo
    j_next = grid_index(t_lo, anchor, dt)  # in integers, as the dynamic rounds count them
    num_marched = torch.zeros((), dtype=torch.int64, device=device)
    overflow = torch.zeros((), dtype=torch.bool, device=device)
    kept_parts, t0_parts, t1_parts, sigma_parts, weight_parts = [], [], [], [], []
    for _ in range(num_rounds(occupancy, step_size, round_steps)):
        j_end = j_next + round_steps
        hi = torch.minimum(grid_edges(anchor, dt, j_end), t_hi)
        # this round's segment [lo, hi], empty for a ray that stopped: march's interval layout, (R, K)
        valid = alive & (hi > lo)
        lo_j, hi_j = interval_bounds(lo, hi, anchor, dt, valid=valid)
        edges, occupied, t_mids = occupied_intervals(anchor, dt, lo, hi, lo_j, hi_j - lo_j, num_slots,
                                                     cell_origins, cell_directions, occupancy.binary)
        t0, t1 = edges[:, :-1], edges[:, 1:]
        # the occupied slots packed into ``cap`` rows (padded with ``slots``: a row written past the end)
        flat = occupied.view(-1)
        index = torch.nonzero_static(flat, size=cap, fill_value=slots).view(-1)
        count = flat.sum()
        if cap < slots:
            overflow |= count > cap
        num_marched += count
        row = index.clamp(max=slots - 1)  # a padded row evaluates the last slot again (written past the end)
        ray = torch.div(row, num_slots, rounding_mode="floor")
        points = torch.addcmul(origins.index_select(0, ray), directions.index_select(0, ray),
                               t_mids.reshape(-1).index_select(0, row)[:, None])
        sigma = torch.zeros(slots + 1, dtype=dtype, device=device)
        sigma.index_put_((index,), density_fn(points).to(dtype))
        sigma = sigma[:slots].view(num_rays, num_slots)
        # transmittance within the round (NeRF Eq. 3 on the row; empty slots have tau = 0)
        tau = sigma * norm[:, None] * (t1 - t0)
        inclusive = torch.cumsum(tau.double(), 1)
        trans = torch.exp(tau.double() - inclusive).to(dtype)  # T_i: exp(-exclusive sum)
        weights = trans * (1.0 - torch.exp(-tau))
        remaining = torch.exp(-inclusive[:, -1]).to(dtype)
        before = local * before_front
        kept = occupied & (trans * before[:, None] > termination)
        # the transmittance behind each ray's last kept sample: in front of its first dropped one
        remaining = torch.maximum(remaining, torch.where(occupied & ~kept, trans, 0.0).amax(1))
        kept_parts.append(kept)
        t0_parts.append(t0)
        t1_parts.append(t1)
        sigma_parts.append(sigma)
        weight_parts.append(weights * local[:, None])
        local = local * remaining
        lo, j_next = torch.where(valid, hi, lo), j_end
        alive = valid & (hi < t_hi) & (before * remaining > termination)
    torch._assert_async(~alive.any(), "march_rounds_fixed: a ray is longer than the rounds")
    kept = torch.cat(kept_parts, 1).view(-1)  # (R N K), by ray, then round, then slot: along each ray
    # host sync, once per chunk: the kept samples, the marched ones, whether a round overflowed
    num_kept, marched, overflowed = torch.stack([kept.sum(), num_marched, overflow.long()]).tolist()
    if overflowed:  # a second pass that cannot overflow
        return march_rounds_fixed(density_fn, occupancy, origins, directions, anchor, t_lo, t_hi, termination,
                                  in_front, step_size, round_steps, 1.0)
    index = torch.nonzero_static(kept, size=num_kept).view(-1)
    ray = torch.div(index, kept_parts[0].shape[1] * len(kept_parts), rounding_mode="floor")
    samples = PackedSamples(ray, torch.cat(t0_parts, 1).view(-1).index_select(0, index),
                            torch.cat(t1_parts, 1).view(-1).index_select(0, index), num_rays)
    return (samples, torch.cat(sigma_parts, 1).view(-1).index_select(0, index), marched,
            (torch.cat(weight_parts, 1).view(-1).index_select(0, index), local))
