"""Joint training of segmented scenes (``strategy=ss strategy.training=joint``).

Legend: R rays, K regions, m regions of this rank, C values per segment.

Every rank draws the same ray batch (the sampler's shared stream). Each region's
sub-model covers only its own (non-enlarged) region box and renders only its own
segment of every ray: the ray is clipped to the box, and the sub-model renders it
without background (:meth:`~distnerf.model.marched.MarchingModel.render_segment`),
returning the segment's colour ``C_k = sum_i T^k_i alpha_i c_i``, transmittance
``T_k = prod_i (1 - alpha_i)`` (the transmittance behind its last sample, whatever the
colour threshold dropped) and depth. The per-ray
segment values are all-gathered (C = 5 floats per ray and region, 9 with NeRF's coarse
pass) and composited exactly, front to back by entry distance (NeRF-XL, Li et al.
ECCV 2024, Eq. 4; :func:`composite_segments`)::

    C = sum_k (prod_{j<k} T_j) C_k + (prod_k T_k) * background

With an opaque floor (``model.opaque_floor``) a floored ray's ``background`` is the colour field
at its floor point, evaluated by the region holding that point and exchanged with its segment
values (3 more floats per ray and region: :mod:`.floor`).

The loss is computed on the composite, identically on every rank. Its gradient with
respect to this rank's segment values, computed locally, is therefore already exact,
so the backward of the exchange is a slice (no communication) and gradients flow
only into this rank's sub-models: there is no gradient all-reduce (no parameter is
shared between regions). A sub-model never terminates a ray early on another
segment's transmittance (its colour threshold sees only its own segment).

Sampling: ``grid`` and ``ngp`` sub-models march their segment on the ray's one sample
grid, anchored at ``near`` and jittered by one offset per ray drawn from the step's
generator (the same on every rank, since every rank draws the same batch), so the
segments of a ray tile it with no gap and no overlap. The shards of the sharded joint model
(``strategy.joint_model=sharded``: one model's contraction, lattice and spacing, each region a
slice of its tables) take the one model's march of the whole ray and keep the intervals whose
midpoints lie in their segment (:func:`~distnerf.renderer.occupancy.owned_window`): every sample
is one model's, whole, rendered by the region holding its midpoint, so the composite is the one
model's render (``tests/unit/test_ss_sharded.py``). Per-region sub-models (``per_region``) clip
their segments at the region boundaries instead: an interval straddling a boundary becomes two
pieces, each evaluated at its own midpoint. ``nerf`` draws stratified coarse samples in the segment and fine samples
from the segment's own coarse weights, and its coarse pass is composited across regions
for the coarse loss; this is a different estimator from one NeRF sampling the whole
ray. Its jitter of region k comes from a generator seeded by (step seed, k). Either way
the result does not depend on which rank holds which region: one process holding all K
sub-models renders (and trains) exactly what K ranks do.
"""
from __future__ import annotations

import torch

from .. import distributed as D
from ..data.rays import RayBundle
from ..model.marched import MarchingModel
from ..renderer import samples
from ..renderer.output import RenderOutput
from ..renderer.segments import composite_segments, floor_behind, segment_entries
from ..seeds import region_seed


class GatherSegments(torch.autograd.Function):
    """All-gather of (R, m, C) segment values into (R, W*m, C); backward: own slice.

    Every rank composites the gathered values identically and computes the same loss,
    so the gradient with respect to its own slice is exact without communication.
    """

    @staticmethod
    def forward(ctx, local: torch.Tensor, rank: int) -> torch.Tensor:
        """``rank``: this process's rank (its slice of the result)."""
        parts = D.all_gather(local)
        ctx.lo, ctx.hi = rank * local.shape[1], (rank + 1) * local.shape[1]
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad[:, ctx.lo:ctx.hi].contiguous(), None


class RouteValues(torch.autograd.Function):
    """Segment values rendered for the rays other ranks routed here, sent back to the rays' owners (one
    all-to-all); backward: the owners' gradients with respect to them, sent back the other way (the reverse
    all-to-all), so a sub-model's gradient sums every owner's loss (its rays' share of the global mean).

    Forward args: values (sum(recv_counts), D) in the order the rays arrived; recv_counts, send_counts: W
    row counts (rows this rank received from / sent to each rank). Returns (sum(send_counts), D): the
    values of this rank's sent rays, in the order it sent them.
    """

    @staticmethod
    def forward(ctx, values: torch.Tensor, recv_counts: list[int], send_counts: list[int]) -> torch.Tensor:
        ctx.counts = (recv_counts, send_counts)
        return D.all_to_all_rows(values, recv_counts, send_counts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        recv_counts, send_counts = ctx.counts
        return D.all_to_all_rows(grad.contiguous(), send_counts, recv_counts), None, None


def clip_to_box(rays: RayBundle, box: torch.Tensor):
    """Entry and exit of each ray segment ``[near, far]`` in ``box``.

    Returns:
        t_in, t_out: (R,) float; hit: (R,) bool where ``t_in < t_out``.
    """
    t_in, t_out = samples.clip_to_box(rays.origins, rays.directions, rays.near, rays.far, box.to(rays.origins))
    return t_in, t_out, t_in < t_out


def region_generator(generator: torch.Generator | None, region: int, device) -> torch.Generator | None:
    """A jitter generator of region ``region`` derived from the step's generator."""
    if generator is None:
        return None
    return torch.Generator(device).manual_seed(region_seed(generator.initial_seed(), region))


def render_segments(models, regions: list[int], boxes: torch.Tensor, rays: RayBundle, generator=None,
                    jitter: torch.Tensor | None = None, keep_samples: bool = False) -> dict:
    """Each sub-model renders its region's segment of every ray.

    Args:
        models: sub-models (black background), one per entry of ``regions``.
        boxes: (K, 2, 3) every region's box (K regions in all).
        jitter: (R,) float in [0, 1), each ray's offset of its sample grid (in steps), drawn by the ray's
            owner (:class:`RouteValues`' callers); None: drawn here from ``generator`` when training.
    Returns:
        dict with ``values`` (R, m, C) [colour (3), transmittance, depth, (coarse colour (3),
        coarse transmittance)], ``num_samples`` and per-region sample counts.
    """
    num_rays = len(rays)
    segs, counts, kept = [], [], []
    u = jitter  # one jitter per ray for every marched segment: the ray's sample grid
    if u is None and generator is not None and any(m.training for m in models):
        u = torch.rand(rays.near.shape, generator=generator, device=rays.near.device, dtype=rays.near.dtype)
    for k, model in zip(regions, models):
        t_in, t_out, hit = clip_to_box(rays, boxes[k])
        if isinstance(model, MarchingModel):
            step_size = model.step_size()
            anchor = rays.near if u is None else rays.near + u * step_size / rays.directions.norm(dim=-1)
            if getattr(model, "shard", None) is not None:  # one model's march of the ray, its samples by midpoint
                out = model.render_segment(rays, rays.near, rays.far, anchor, None, step_size, owned=(t_in, t_out))
            else:
                out = model.render_segment(rays, t_in, t_out, anchor, None, step_size)
            segs.append(torch.cat([out.rgb, out.transmittance[:, None], out.depth[:, None]], dim=1))
            counts.append(int(out.num_samples))
            kept.append((out.samples, out.weights))
            continue
        if keep_samples:
            raise ValueError(f"keep_samples: region {k}'s {type(model).__name__} does not march packed samples")
        idx = hit.nonzero().view(-1)
        clipped = RayBundle(rays.origins[idx], rays.directions[idx], rays.viewdirs[idx], t_in[idx], t_out[idx],
                            None if rays.image_ids is None else rays.image_ids[idx])
        out = model(clipped, region_generator(generator, k, rays.origins.device)) if len(idx) else None
        coarse = out is not None and out.rgb_coarse is not None
        width = 9 if (coarse or model.renders_coarse) else 5
        seg = rays.origins.new_zeros(num_rays, width)
        seg[:, 3] = 1.0
        if width == 9:
            seg[:, 8] = 1.0
        if out is not None:  # nerf's batched rendering has no colour threshold: 1 - opacity = prod (1 - alpha)
            cols = [out.rgb, (1.0 - out.opacity)[:, None], out.depth[:, None]]
            if width == 9:
                cols += [out.rgb_coarse, (1.0 - out.opacity_coarse)[:, None]]
            seg = seg.index_put((idx,), torch.cat(cols, dim=1).to(seg.dtype))
        segs.append(seg)
        counts.append(int(out.num_samples) if out is not None else 0)
    result = {"values": torch.stack(segs, dim=1), "num_samples": sum(counts), "samples_per_region": counts}
    if keep_samples:
        result["samples"] = kept
    return result


def composite_all(values: torch.Tensor, rays: RayBundle, boxes: torch.Tensor,
                  background: torch.Tensor, floored: torch.Tensor | None = None) -> RenderOutput:
    """Composite (R, K, C) segment values of every region front to back.

    Args:
        values: (R, K, C) :func:`render_segments`' values, with an opaque floor followed by each
            region's floor colours (3: :func:`.floor.region_floor_colours`).
        boxes: (K, 2, 3) every region's box. background: (3,) float.
        floored: (R,) bool rays ended at an opaque floor (their light left takes the floor's colour),
            or None (no opaque floor: ``values`` hold no floor colours).
    """
    if floored is not None:
        background = floor_behind(background, values[..., -3:].sum(dim=1), floored)
        values = values[..., :-3]
    entry = segment_entries(rays.origins, rays.directions, rays.near, rays.far, boxes)
    rgb, depth, opacity = composite_segments(values[..., :3], values[..., 3], values[..., 4], entry, background)
    out = RenderOutput(rgb=rgb, depth=depth, opacity=opacity)
    if values.shape[-1] == 9:
        out.rgb_coarse = composite_segments(values[..., 5:8], values[..., 8], values[..., 4], entry,
                                               background)[0]
    return out
