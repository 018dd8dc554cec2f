"""The fusion stage of spatially segmented scenes: K sub-models rendered as one.

Legend: R rays, K regions, P packed samples.

Samples (packed, :mod:`distnerf.renderer.packed`):

* marching models (``grid``, ``ngp``): every region marches **its own segment** of each
  ray (the ray clipped to the region's box) on the ray's one sample grid, anchored at
  ``near`` with the smallest marching step of the sub-models, in the cells its
  sub-model's occupancy grid marks. The segments of a ray tile it with no gap and no
  overlap (:func:`~distnerf.renderer.occupancy.march`), so no sample is routed: a region
  evaluates exactly the samples of its segment.
* ``nerf``: the coarse pass is composited across **all** regions first (each coarse
  sample's density comes from the coarse network of the region holding its midpoint;
  under distributed fusion the per-sample opacities are summed over ranks, a second
  exchange), then the fine samples are drawn from that global coarse distribution (NeRF
  Sec. 5.2) and each is rendered by the fine network of the region holding it (one
  gather per region of the flat samples). Sampling each segment on its own would be a
  different estimator.

Two fusions:

* ``segment``: each region renders its own segment of every ray, giving the segment's
  colour ``C_k``, transmittance ``T_k`` and depth (:mod:`distnerf.renderer.segments`);
  segments sorted by their entry distance are composited front to back (NeRF-XL, Li et
  al. 2024, Eq. 4), which equals rendering the union of the segments' samples in one pass.
  It runs in two phases with two exchanges: (1) each region's densities give ``T_k``
  (marched in rounds; a ray stops inside a segment once its transmittance there is below
  the sub-model's termination threshold, which bounds the global one), and the (R, K)
  transmittances are exchanged, so each region knows ``prod_{j<k} T_j`` in front of its
  segment; (2) colours are evaluated only where a sample's *global* weight exceeds
  ``color_threshold`` (the rule a single model applies, here on exchanged values), and
  the (R, K, 4) segment colours and depths are exchanged and composited identically on
  every rank. Under torchrun each rank renders its own regions' segments for all rays.
* ``blend`` (one process): a sample's density and colour are the inverse-distance
  weighted mean (weights ``1 / d_k^power`` to region centres, normalised) of the
  sub-models whose *enlarged* regions contain it (Mega-NeRF, Turki et al. 2022,
  Sec. 3.3), then one volume rendering pass over samples shared by all regions. With
  ``overlap = 0`` it equals ``segment`` up to the samples split at region boundaries.
  It mixes densities per sample, so it cannot be split by segment.

The floor (``model.min_altitude``): rays end where the sub-models end them
(:func:`.floor.floored_rays`); with ``model.opaque_floor`` the light a floored ray has left after
its samples takes the colour of the floor point's region, not the background's (:mod:`.floor`):
``segment`` exchanges it with the segment colours (3 more floats per ray and region).
"""
from __future__ import annotations

import time
from collections import defaultdict

import torch
from torch import nn

from .. import distributed as D
from ..data.rays import RayBundle
from ..model.base import RadianceModel
from ..model.marched import MarchingModel
from ..renderer.marching import along_ray, march_alive, shade
from ..renderer.occupancy import OccupancyGrid, march
from ..renderer.output import RenderOutput
from ..renderer.packed import PackedSamples, render_packed, render_transmittance
from ..renderer.samples import clip_to_box, intervals_from_points, sample_pdf, stratified_samples
from ..renderer.segments import composite_segments, floor_behind, segment_entries, transmittance_in_front
from ..renderer.volume import render_weights
from .floor import floored_rays, region_floor_colours
from .partition import Partition

FUSIONS = ("segment", "blend")


class FusedRenderer(nn.Module):
    """Renders rays with the sub-models of a partition, like one model.

    Args:
        partition: the K regions.
        models: region index -> sub-model. All K for one-process fusion; this rank's
            regions for distributed ``segment`` fusion (then ``distributed=True``).
        fusion: ``segment`` or ``blend`` (``strategy.fusion``).
        color_threshold: global compositing weight below which a sample gets no colour
            (``strategy.color_threshold``).
        blend_power: exponent of the inverse-distance weights of ``blend`` (``strategy.blend_power``).
        background: (3,) float RGB; None: the first sub-model's.
        distributed: every rank holds its regions and takes part in every forward
            (collectives: all ranks must render the same rays in the same order).

    Attribute ``timed``: whether :attr:`timing` is kept on CUDA, where each phase's time costs a
    synchronisation of the device (about four per chunk); False by default there (evaluation sets
    it from ``eval.fusion_timing``). On the CPU the phases are always timed (the host clock is free).
    Raises:
        ValueError: unknown fusion, ``blend`` with ``distributed``, missing regions.
    """

    def __init__(self, partition: Partition, models: dict[int, RadianceModel], fusion: str, *,
                 color_threshold: float, blend_power: float, background: torch.Tensor | None = None,
                 distributed: bool = False):
        super().__init__()
        if fusion not in FUSIONS:
            raise ValueError(f"fusion={fusion!r} is not one of {FUSIONS}")
        if fusion == "blend" and distributed:
            raise ValueError("fusion=blend mixes densities per sample and runs on one process "
                             "(python -m distnerf.render ... fusion=blend); use fusion=segment under torchrun")
        if fusion == "blend" and partition.unbounded:
            raise ValueError("fusion=blend shares samples inside the scene box; an unbounded (contracted) "
                             "partition renders to the sky with fusion=segment")
        if not distributed and sorted(models) != list(range(len(partition))):
            raise ValueError(f"one-process fusion needs all {len(partition)} regions, got {sorted(models)}")
        self.partition, self.fusion, self.distributed = partition, fusion, distributed
        self.regions = sorted(models)
        self.models = nn.ModuleList([models[k] for k in self.regions])
        self._gathered_order = None  # distributed: the all-gathered regions' order, by region
        self._boxes = {}  # (device, dtype) -> (K, 2, 3) the partition's extents there: copied once, not per chunk
        first = self.models[0]
        self.register_buffer("background", (first.background if background is None else background).clone().float())
        self.color_threshold, self.blend_power = color_threshold, blend_power
        self.min_altitude = first.min_altitude  # rays end at the sub-models' floor
        self.opaque_floor = first.opaque_floor  # ... whose colour shows behind them (module docstring)
        step_size = first.step_size()
        self.hierarchical = step_size is None
        if not self.hierarchical:
            step_size = min(m.step_size() for m in self.models)
            if distributed:  # a host number: a CPU tensor (gloo on CPU and CUDA groups alike)
                t = torch.tensor([step_size], dtype=torch.float64)
                D.all_reduce_(t, "min")
                step_size = float(t)
        self.step_size = step_size
        # only blend shares samples between regions; segment marches each region with its own grid
        self.prefilter = self._occupancy_prefilter() if fusion == "blend" and not self.hierarchical else None
        # seconds spent in what fusion adds to rendering (routing samples to regions, the exchange,
        # compositing) and in total, accumulated over forwards (benchmarks read and reset it);
        # durations on every device (see _clock), never the launch time of an NCCL exchange
        self.timing: dict[str, float] = defaultdict(float)
        self.timed = False

    def _clock(self) -> float | None:
        """Host seconds after this device's queued work, or None when not timed (CUDA without
        :attr:`timed`). On CUDA a synchronisation: an NCCL exchange returns to the host when it is
        queued, not done."""
        if self._on_cuda:
            if not self.timed:
                return None
            torch.cuda.synchronize(self.background.device)
        return time.perf_counter()

    @property
    def _on_cuda(self) -> bool:
        """Whether this renderer's device times on the device (:func:`distnerf.distributed.device_timed`: CUDA), where
        a host clock around a phase needs a synchronisation."""
        return D.device_timed(self.background.device)

    @property
    def keeps_timing(self) -> bool:
        """Whether :attr:`timing` is measured: always where the host clock is free (the CPU), on CUDA only
        with :attr:`timed` (evaluation reports None, never zeros, otherwise)."""
        return self.timed or not self._on_cuda

    def _add_time(self, key: str, start: float | None) -> None:
        """Add the seconds since ``start`` (a :meth:`_clock`) to ``timing[key]``; nothing when not timed."""
        if start is not None:
            self.timing[key] += self._clock() - start

    def _occupancy_prefilter(self) -> OccupancyGrid | None:
        """A conservative empty-space filter for ``blend``'s shared samples, or None.

        When every sub-model's occupancy grid has the same resolution over the scene box
        (``grid`` and ``ngp`` sub-models do), a cell is kept if the occupancy grid of any
        region whose enlarged box touches the cell marks it occupied. A sample it drops is
        empty for every sub-model it is blended from, so results are unchanged and only
        the work on empty samples is saved. ``blend`` runs on one process (all regions
        here); ``segment`` needs no prefilter, each region marching its own grid.
        """
        bounds = self.partition.bounds.float()
        grids = [m.occupancy if isinstance(m, MarchingModel) else None for m in self.models]
        res = grids[0].resolution if grids[0] is not None else 0
        if not all(g is not None and g.resolution == res and torch.allclose(g.aabb.float().cpu(), bounds)
                   for g in grids):
            return None
        boxes = self.partition.enlarged().float()
        edges = [torch.linspace(float(bounds[0, a]), float(bounds[1, a]), res + 1) for a in range(3)]
        binary = torch.zeros((res,) * 3, dtype=torch.bool)
        for k, grid in zip(self.regions, grids):
            axes = [(edges[a][:-1] <= boxes[k, 1, a]) & (edges[a][1:] >= boxes[k, 0, a]) for a in range(3)]
            touches = axes[0][:, None, None] & axes[1][None, :, None] & axes[2][None, None, :]
            binary |= touches & grid.binary.cpu()
        prefilter = OccupancyGrid(bounds, res)
        prefilter.binary.copy_(binary)
        return prefilter.to(self.background.device)

    # ------------------------------------------------------------------ forward
    @torch.no_grad()
    def forward(self, rays: RayBundle, generator=None) -> RenderOutput:
        start = self._clock()
        # the outer regions' segments of an unbounded partition reach the sky; every ray ends at the floor
        rays, floored = floored_rays(rays, self.partition.unbounded, self.min_altitude)
        floored = floored if self.opaque_floor else None
        out = self._blend(rays, floored) if self.fusion == "blend" else self._segment(rays, floored)
        self._add_time("total_s", start)
        return out

    def _all_regions(self, local: torch.Tensor) -> torch.Tensor:
        """(R, m, C) values of this rank's regions -> (R, K, C) of every region (all-gather)."""
        if not self.distributed:
            return local
        if self._gathered_order is None:  # which rank holds which regions, whatever the assignment (once)
            held = torch.cat(D.all_gather(torch.tensor(self.regions, device=local.device)))
            self._gathered_order = torch.argsort(held).to(local.device)
        return torch.cat(D.all_gather(local), dim=1)[:, self._gathered_order]

    def _region_samples(self, rays: RayBundle) -> list[dict]:
        """Phase 1: each own region's packed samples and densities (``sigmas``), NeRF colours (``rgbs``)."""
        if self.hierarchical:
            return self._hierarchical_segments(rays)
        segs = []
        boxes = self._extents_like(rays.origins)
        for k, model in zip(self.regions, self.models):
            t_lo, t_hi = clip_to_box(rays.origins, rays.directions, rays.near, rays.far, boxes[k])
            samples, sigmas, _, trans = march_alive(model.field_density, model.marcher(self.step_size),
                                                    rays.origins, rays.directions, rays.near, t_lo, t_hi,
                                                    termination=model.termination, step_size=self.step_size,
                                                    round_steps=model.eval_round_steps)
            # trans: the rounds' weights and segment transmittance (None without rounds)
            segs.append({"samples": samples, "sigmas": sigmas, "rgbs": None, "model": model, "trans": trans})
        return segs

    def _extents_like(self, like: torch.Tensor) -> torch.Tensor:
        """(K, 2, 3) the partition's extents (float64 on the host) on ``like``'s device and dtype, kept."""
        key = (like.device, like.dtype)
        if key not in self._boxes:
            self._boxes[key] = self.partition.extents().to(like.device, like.dtype)
        return self._boxes[key]

    def _floor_colours(self, rays: RayBundle, floored: torch.Tensor) -> torch.Tensor:
        """(R, m, 3) the floor colours held by this process's regions (:func:`.floor.region_floor_colours`)."""
        return region_floor_colours(self.models, self.regions, self.partition, rays, floored)

    def _segment(self, rays: RayBundle, floored: torch.Tensor | None = None) -> RenderOutput:
        """``segment`` fusion (module docstring); ``floored``: (R,) bool rays ended at an opaque floor, or None."""
        segs = self._region_samples(rays)
        for seg in segs:
            if seg.get("trans") is not None:  # computed by the evaluation rounds
                seg["transmittance"] = seg["trans"][1]
                continue
            sigmas = seg["sigmas"] if seg["rgbs"] is not None else along_ray(seg["sigmas"], seg["samples"],
                                                                              rays.directions)
            seg["transmittance"] = render_transmittance(sigmas, seg["samples"])[2]
        start = self._clock()
        # exchange 1: every segment's transmittance, so each rank knows what lies in front of its segments
        transmittance = self._all_regions(torch.stack([s["transmittance"] for s in segs], dim=1)[..., None])[..., 0]
        entry = segment_entries(rays.origins, rays.directions, rays.near, rays.far, self._extents_like(rays.origins))
        before, _ = transmittance_in_front(transmittance, entry)
        self._add_time("exchange_composite_s", start)
        width = 4 if floored is None else 7  # colour, depth (, the floor's colour where this region holds it)
        local = torch.zeros(len(rays), len(self.regions), width, dtype=rays.origins.dtype, device=rays.origins.device)
        if floored is not None:
            local[:, :, 4:] = self._floor_colours(rays, floored)
        for j, (k, seg) in enumerate(zip(self.regions, segs)):
            model = seg["model"]
            if seg["rgbs"] is not None:  # nerf: colours come with the densities
                out = render_packed(seg["sigmas"], seg["rgbs"], seg["samples"], None)
            else:
                out = shade(model.field_density, model.colours, seg["samples"], rays.origins, rays.directions,
                            rays.viewdirs, before[:, k], None, self.color_threshold, seg["sigmas"],
                            seg.get("trans"))
            local[:, j, :3], local[:, j, 3] = out.rgb, out.depth
        start = self._clock()
        # exchange 2: segment colour and depth (4 floats per ray and region; 7 with an opaque floor)
        values = self._all_regions(local)
        num_samples = torch.tensor([sum(len(s["samples"]) for s in segs)], dtype=torch.long)
        if self.distributed:  # host counts: a CPU tensor
            D.all_reduce_(num_samples)
        background = self.background if floored is None else floor_behind(self.background,
                                                                           values[..., 4:].sum(dim=1), floored)
        rgb, depth, opacity = composite_segments(values[..., :3], transmittance, values[..., 3], entry, background)
        self._add_time("exchange_composite_s", start)
        return RenderOutput(rgb=rgb, depth=depth, opacity=opacity, num_samples=int(num_samples))

    # ------------------------------------------------------------------ nerf
    def _route(self, rays: RayBundle, samples: PackedSamples) -> torch.Tensor:
        """(P,) int64 region holding each sample's midpoint (one pass over the flat samples)."""
        start = self._clock()
        owner = self.partition.region_of(samples.points(rays.origins, rays.directions))
        self._add_time("routing_s", start)
        return owner

    def _hierarchical_samples(self, rays: RayBundle) -> PackedSamples:
        """NeRF's coarse pass composited across all regions, then the fine samples (module doc)."""
        first = self.models[0]
        t_starts, t_ends = stratified_samples(rays.near, rays.far, first.num_coarse, False)
        coarse = batched_to_packed(t_starts, t_ends)
        owner = self._route(rays, coarse)
        alphas = torch.zeros(len(coarse), dtype=rays.origins.dtype, device=rays.origins.device)
        for k, model in zip(self.regions, self.models):
            sel = (owner == k).nonzero().view(-1)
            part = coarse.select(sel)
            sigma, _ = model.field(part.points(rays.origins, rays.directions), rays.viewdirs[part.ray_indices],
                                   level="coarse")
            alphas[sel] = 1.0 - torch.exp(-sigma.to(alphas.dtype) * part.deltas)
        if self.distributed:  # second exchange: every rank needs the whole coarse distribution
            D.all_reduce_(alphas)
        if first.fine is None:
            return coarse
        weights, _ = render_weights(alphas.view(t_starts.shape))
        bins = torch.cat([t_starts, t_ends[:, -1:]], dim=-1)
        t_fine = sample_pdf(bins, weights, first.num_fine, False)
        t_all = torch.sort(torch.cat([t_starts, t_fine], dim=-1), dim=-1).values
        return batched_to_packed(*intervals_from_points(t_all, rays.far))

    def _hierarchical_segments(self, rays: RayBundle) -> list[dict]:
        """Each own region's fine samples (those whose midpoint it holds), densities and colours."""
        samples = self._hierarchical_samples(rays)
        owner = self._route(rays, samples)
        segs = []
        for k, model in zip(self.regions, self.models):
            part = samples.select((owner == k).nonzero().view(-1))
            sigma, rgb = model.field(part.points(rays.origins, rays.directions), rays.viewdirs[part.ray_indices])
            segs.append({"samples": part, "sigmas": sigma, "rgbs": rgb, "model": model})
        return segs

    # ------------------------------------------------------------------ blend
    def _shared_samples(self, rays: RayBundle) -> PackedSamples:
        """Samples shared by every region (``blend``): the scene box marched with the fused step."""
        if self.hierarchical:
            return self._hierarchical_samples(rays)
        bounds = self.partition.bounds.to(rays.origins.device, rays.origins.dtype)
        t_lo, t_hi = clip_to_box(rays.origins, rays.directions, rays.near, rays.far, bounds)
        return march(rays.origins, rays.directions, rays.near, t_lo, t_hi, self.step_size, self.prefilter)

    def _blend(self, rays: RayBundle, floored: torch.Tensor | None = None) -> RenderOutput:
        """``blend`` fusion (module docstring); ``floored``: (R,) bool rays ended at an opaque floor, or None
        (the floor's colour: its region's sub-model's, as in ``segment``)."""
        samples = self._shared_samples(rays)
        points = samples.points(rays.origins, rays.directions)
        ray_idx = samples.ray_indices
        start = self._clock()  # routing: which enlarged regions hold each sample, and their weights
        member = self.partition.contains(points.clamp(self.partition.bounds[0].to(points),
                                                      self.partition.bounds[1].to(points)), enlarged=True)
        dist_k = torch.cdist(points.double(), self.partition.centers.to(points.device))
        inv = torch.where(member, 1.0 / dist_k.clamp(min=1e-9) ** self.blend_power, torch.zeros_like(dist_k))
        self._add_time("routing_s", start)
        occupied = torch.zeros_like(member)
        sigma = torch.zeros(points.shape[0], dtype=torch.float64, device=points.device)
        rgb = torch.zeros(points.shape[0], 3, dtype=torch.float64, device=points.device)
        for k in range(len(self.partition)):
            sel = member[:, k].nonzero().view(-1)
            if sel.numel() == 0:
                continue
            model = self.models[k]
            occ = model.occupied(points[sel]) if not self.hierarchical else torch.ones_like(sel, dtype=torch.bool)
            occupied[sel, k] = occ
            s_k, c_k = model.field(points[sel], rays.viewdirs[ray_idx[sel]])
            sigma[sel] += inv[sel, k] * s_k.double() * occ
            rgb[sel] += inv[sel, k, None] * c_k.double() * occ[:, None]
        norm = (inv * occupied).sum(dim=1).clamp(min=1e-300)
        sigma, rgb = (sigma / norm).to(points.dtype), (rgb / norm[:, None]).to(points.dtype)
        if not self.hierarchical:  # marched fields: density per distance
            sigma = along_ray(sigma, samples, rays.directions)
        background = self.background if floored is None else floor_behind(
            self.background, self._floor_colours(rays, floored).sum(dim=1), floored)
        out = render_packed(sigma, rgb, samples, background)
        return RenderOutput(rgb=out.rgb, depth=out.depth, opacity=out.opacity, num_samples=int(member.sum()))


def batched_to_packed(t_starts: torch.Tensor, t_ends: torch.Tensor) -> PackedSamples:
    """(R, S) batched intervals (NeRF's fixed count per ray) as packed samples."""
    num_rays, num = t_starts.shape
    ray = torch.arange(num_rays, device=t_starts.device).repeat_interleave(num)
    return PackedSamples(ray, t_starts.reshape(-1), t_ends.reshape(-1), num_rays)
