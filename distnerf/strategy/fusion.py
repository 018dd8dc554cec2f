"""The fusion stage of spatially segmented scenes: K sub-models rendered as one.

Legend: R rays, S samples per ray, K regions, P evaluated samples.

Every fused render draws **one set of samples per ray, independent of the regions**,
so that fusion is exact for that set:

* marching models (``grid``, ``ngp``): uniform intervals through the scene box with
  the smallest marching step of the sub-models, starting at the ray's entry into the
  box (deterministic at inference). A sample is evaluated by the sub-model(s) it is
  routed to and skipped where that sub-model's occupancy grid is empty.
* ``nerf``: the coarse pass is composited across **all** regions first (each coarse
  sample's density comes from its owner's coarse network; under distributed fusion the
  per-sample opacities are summed over ranks, a second exchange), then the fine samples
  are drawn from that global coarse distribution (NeRF Sec. 5.2) and rendered by their
  owners' fine networks. Sampling each segment on its own would be a different estimator.

Two fusions:

* ``segment``: each sample belongs to exactly one region (:meth:`Partition.region_of`).
  Each region renders its own segment of every ray, giving the segment's colour
  ``C_k = sum_i T^k_i alpha_i c_i``, transmittance ``T_k = prod_i (1 - alpha_i)`` and depth
  (``T^k_i`` is the transmittance *inside* the segment). Axis-aligned boxes are convex,
  so a ray crosses each in one interval; segments sorted by their entry distance are
  composited front to back (Max 1995; NeRF-XL, Li et al. 2024, Eq. 4)::

      C = sum_k (prod_{j<k} T_j) C_k + (prod_k T_k) * background

  which equals rendering one model whose field is the union of the sub-fields. It runs
  in two phases with two exchanges: (1) each region's densities give its segment
  transmittance ``T_k``, and the (R, K) transmittances are exchanged, so each region
  knows the transmittance ``prod_{j<k} T_j`` in front of its segment; (2) colours are
  evaluated only where a sample's *global* weight exceeds ``color_threshold`` (the
  early termination a single model applies, here on exchanged values only), and the
  (R, K, 4) segment colours and depths are exchanged and composited identically on
  every rank. Under torchrun each rank renders its own regions' segments for all rays.
* ``blend`` (one process): a sample's density and colour are the inverse-distance
  weighted mean (weights ``1 / d_k^power`` to region centres, normalised) of the
  sub-models whose *enlarged* regions contain it (Mega-NeRF, Turki et al. 2022,
  Sec. 3.3), then one volume rendering pass. With ``overlap = 0`` it equals
  ``segment``. It mixes densities per sample, so it cannot be split by segment.
"""
from __future__ import annotations

import time
from collections import defaultdict

import torch
import torch.distributed as dist
from torch import nn

from ..data.rays import RayBundle
from ..model.base import RadianceModel
from ..renderer.occupancy import OccupancyGrid, march_rays
from ..renderer.samples import clip_to_box, intervals_from_points, sample_pdf, stratified_samples
from ..renderer.volume import alphas_from_densities, composite, render_weights
from .partition import Partition

FUSIONS = ("segment", "blend")


def segment_entries(rays: RayBundle, boxes: torch.Tensor) -> torch.Tensor:
    """(R, K) ray parameter where each ray segment enters each of the (K, 2, 3) boxes
    (+inf where it misses the box): the front-to-back order of the segments."""
    out = []
    for box in boxes.to(rays.origins.device, rays.origins.dtype):
        t_in, t_out = clip_to_box(rays.origins, rays.directions, rays.near, rays.far, box)
        out.append(torch.where(t_in <= t_out, t_in, torch.full_like(t_in, float("inf"))))
    return torch.stack(out, dim=1)


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
    """Front-to-back compositing of per-region ray segments.

    Args:
        seg_rgb: (R, K, 3) float segment colours ``sum_i T^k_i alpha_i c_i``.
        seg_transmittance: (R, K) float ``prod_i (1 - alpha_i)`` over the segment's samples.
        seg_depth: (R, K) float ``sum_i T^k_i alpha_i t_i``.
        entry: (R, K) float ray parameter where the ray enters region k (+inf if it misses).
        background: (3,) float or None.
    Returns:
        rgb (R, 3), depth (R,), opacity (R,) = 1 - prod_k T_k.
    """
    before, remaining = transmittance_in_front(seg_transmittance, entry)
    rgb = (before[..., None] * seg_rgb).sum(dim=1)
    depth = (before * seg_depth).sum(dim=1)
    if background is not None:
        rgb = rgb + remaining[:, None] * background
    return rgb, depth, 1.0 - remaining


class FusedRenderer(nn.Module):
    """Renders rays with the sub-models of a partition, like one model.

    Args:
        partition: the K regions.
        models: region index -> sub-model. All K for one-process fusion; this rank's
            regions for distributed ``segment`` fusion (then ``distributed=True``).
        fusion: ``segment`` or ``blend``.
        background: (3,) float RGB.
        color_threshold: global compositing weight below which a sample gets no colour.
        blend_power: exponent of the inverse-distance weights of ``blend``.
        distributed: every rank holds its regions and takes part in every forward
            (collectives: all ranks must render the same rays in the same order).
    Raises:
        ValueError: unknown fusion, ``blend`` with ``distributed``, missing regions.
    """

    def __init__(self, partition: Partition, models: dict[int, RadianceModel], fusion: str = "segment",
                 background: torch.Tensor | None = None, color_threshold: float = 1e-3, blend_power: float = 2.0,
                 distributed: bool = False):
        super().__init__()
        if fusion not in FUSIONS:
            raise ValueError(f"fusion={fusion!r} is not one of {FUSIONS}")
        if fusion == "blend" and distributed:
            raise ValueError("fusion=blend mixes densities per sample and runs on one process "
                             "(python -m distnerf.render ... fusion=blend); use fusion=segment under torchrun")
        if not distributed and sorted(models) != list(range(len(partition))):
            raise ValueError(f"one-process fusion needs all {len(partition)} regions, got {sorted(models)}")
        self.partition, self.fusion, self.distributed = partition, fusion, distributed
        self.regions = sorted(models)
        self.models = nn.ModuleList([models[k] for k in self.regions])
        first = self.models[0]
        self.register_buffer("background", (first.background if background is None else background).clone().float())
        self.color_threshold, self.blend_power = color_threshold, blend_power
        step = first.march_step()
        self.hierarchical = step is None
        if not self.hierarchical:
            step = min(m.march_step() for m in self.models)
            if distributed:
                t = torch.tensor([step], dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MIN)
                step = float(t)
        self.step = step
        self.prefilter = None if self.hierarchical else self._occupancy_prefilter()
        # seconds spent in what fusion adds to rendering (routing samples to regions, the exchange,
        # compositing) and in total, accumulated over forwards (benchmarks read and reset it)
        self.timing: dict[str, float] = defaultdict(float)

    def _occupancy_prefilter(self) -> OccupancyGrid | None:
        """A conservative empty-space filter for the shared samples, or None.

        When every sub-model's occupancy grid has the same resolution over the scene box
        (``grid`` and ``ngp`` sub-models do), a cell is kept if the occupancy grid of any
        region whose box (``blend``: enlarged box) touches the cell marks it occupied. A
        sample it drops is empty for every sub-model it is routed to, so results are
        unchanged and only the routing of empty samples is saved. Under torchrun each
        rank contributes its regions and the grids are combined with an all-reduce.
        """
        bounds = self.partition.bounds.float()
        grids = [getattr(m, "occupancy", None) for m in self.models]
        res = grids[0].resolution if grids[0] is not None else 0
        usable = all(g is not None and g.resolution == res and torch.allclose(g.aabb.float().cpu(), bounds)
                     for g in grids)
        if self.distributed:  # every rank must take the same branch
            flag = torch.tensor([int(usable), res], dtype=torch.long)
            low, high = flag.clone(), flag.clone()
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            dist.all_reduce(high, op=dist.ReduceOp.MAX)
            usable = bool(low[0]) and int(low[1]) == int(high[1])
        if not usable:
            return None
        boxes = (self.partition.enlarged() if self.fusion == "blend" else self.partition.boxes).float()
        edges = [torch.linspace(float(bounds[0, a]), float(bounds[1, a]), res + 1) for a in range(3)]
        binary = torch.zeros((res,) * 3, dtype=torch.uint8)
        for k, grid in zip(self.regions, grids):
            axes = [(edges[a][:-1] <= boxes[k, 1, a]) & (edges[a][1:] >= boxes[k, 0, a]) for a in range(3)]
            touches = axes[0][:, None, None] & axes[1][None, :, None] & axes[2][None, None, :]
            binary |= (touches & grid.binary.cpu()).to(torch.uint8)
        if self.distributed:
            dist.all_reduce(binary, op=dist.ReduceOp.MAX)
        prefilter = OccupancyGrid(bounds, res)
        prefilter.binary.copy_(binary.bool())
        return prefilter.to(self.background.device)

    # ------------------------------------------------------------------ samples
    def _march(self, rays: RayBundle):
        bounds = self.partition.bounds.to(rays.origins.device, rays.origins.dtype)
        if self.prefilter is not None and self.prefilter.aabb.dtype != rays.origins.dtype:
            self.prefilter.aabb = self.prefilter.aabb.to(rays.origins.dtype)
        return march_rays(rays.origins, rays.directions, rays.near, rays.far, bounds, self.step, self.prefilter,
                          False)

    def _points(self, rays, t_starts, t_ends, mask):
        ray_idx, sample_idx = mask.nonzero(as_tuple=True)
        t_mid = 0.5 * (t_starts + t_ends)[ray_idx, sample_idx]
        return ray_idx, sample_idx, rays.origins[ray_idx] + rays.directions[ray_idx] * t_mid[:, None]

    # ------------------------------------------------------------------ forward
    @torch.no_grad()
    def forward(self, rays: RayBundle, generator=None) -> dict:
        start = time.perf_counter()
        out = self._blend(rays) if self.fusion == "blend" else self._segment(rays)
        self.timing["total_s"] += time.perf_counter() - start
        return out

    def _region_density(self, model: RadianceModel, rays, t_starts, t_ends, mask, level: str = "fine") -> dict:
        """Phase 1 of one region's segment: opacities of its samples (``mask``: (R, S)).

        Returns a dict with ``alphas`` (R, S), ``transmittance`` (R,) = prod (1 - alpha)
        over the segment, the evaluated samples' indices and points, and (NeRF) their colours.
        """
        ray_idx, sample_idx, points = self._points(rays, t_starts, t_ends, mask)
        rgb = None
        if not self.hierarchical:
            keep = model.occupied(points)
            ray_idx, sample_idx, points = ray_idx[keep], sample_idx[keep], points[keep]
            sigma = model.field_density(points)
        else:
            sigma, rgb = model.field(points, rays.viewdirs[ray_idx], level=level)
        sigmas = torch.zeros(mask.shape, dtype=sigma.dtype, device=sigma.device)
        sigmas[ray_idx, sample_idx] = sigma
        alphas = alphas_from_densities(sigmas, t_ends - t_starts)
        transmittance = torch.exp(torch.log1p(-alphas.clamp(max=1.0 - 1e-7)).sum(dim=1))
        return {"alphas": alphas, "transmittance": transmittance, "ray_idx": ray_idx, "sample_idx": sample_idx,
                "points": points, "rgb": rgb}

    def _region_colour(self, model: RadianceModel, rays, t_starts, t_ends, seg: dict, before: torch.Tensor):
        """Phase 2: segment colour (R, 3) and depth (R,), composited with segment-local weights.

        Colours are evaluated where the sample's *global* weight ``before[r] * T^k_i alpha_i``
        exceeds ``color_threshold`` (``before``: (R,) transmittance of the segments in
        front, exchanged), the rule a single model applies along the whole ray.
        """
        weights, _ = render_weights(seg["alphas"])
        ray_idx, sample_idx = seg["ray_idx"], seg["sample_idx"]
        rgbs = torch.zeros(weights.shape + (3,), dtype=weights.dtype, device=weights.device)
        if seg["rgb"] is not None:
            rgbs[ray_idx, sample_idx] = seg["rgb"]
        else:
            colour = before[ray_idx] * weights[ray_idx, sample_idx] > self.color_threshold
            rgbs[ray_idx[colour], sample_idx[colour]] = model.field_rgb(seg["points"][colour],
                                                                         rays.viewdirs[ray_idx[colour]])
        rgb, depth, _ = composite(weights, rgbs, 0.5 * (t_starts + t_ends), None)
        return rgb, depth

    def _owned(self, rays, t_starts, t_ends, mask) -> torch.Tensor:
        """(R, S) int64 owning region of every sample (-1 where masked out)."""
        start = time.perf_counter()
        ray_idx, sample_idx, points = self._points(rays, t_starts, t_ends, mask)
        owner = torch.full(mask.shape, -1, dtype=torch.long, device=mask.device)
        owner[ray_idx, sample_idx] = self.partition.region_of(points)
        self.timing["routing_s"] += time.perf_counter() - start
        return owner

    def _all_regions(self, local: torch.Tensor) -> torch.Tensor:
        """(R, m, C) values of this rank's regions -> (R, K, C) of every region (all-gather)."""
        if not self.distributed:
            return local
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, local.contiguous())
        gathered_regions = [r for rank_regions in dist_regions(self.partition) for r in rank_regions]
        return torch.cat(parts, dim=1)[:, torch.argsort(torch.tensor(gathered_regions))]

    def _samples(self, rays: RayBundle):
        """The shared samples of every fused render: (R, S) t_starts, t_ends and mask."""
        if self.hierarchical:
            t_starts, t_ends = self._hierarchical_samples(rays)
            return t_starts, t_ends, torch.ones_like(t_starts, dtype=torch.bool)
        return self._march(rays)

    def _segment(self, rays: RayBundle) -> dict:
        t_starts, t_ends, mask = self._samples(rays)
        owner = self._owned(rays, t_starts, t_ends, mask)
        segs = [self._region_density(m, rays, t_starts, t_ends, owner == k) for k, m in zip(self.regions, self.models)]
        start = time.perf_counter()
        # exchange 1: every segment's transmittance, so each rank knows what lies in front of its segments
        transmittance = self._all_regions(torch.stack([s["transmittance"] for s in segs], dim=1)[..., None])[..., 0]
        entry = segment_entries(rays, self.partition.boxes)
        before, _ = transmittance_in_front(transmittance, entry)
        self.timing["exchange_composite_s"] += time.perf_counter() - start
        local = torch.zeros(len(rays), len(self.regions), 4, dtype=rays.origins.dtype, device=rays.origins.device)
        for j, (k, model, seg) in enumerate(zip(self.regions, self.models, segs)):
            rgb, depth = self._region_colour(model, rays, t_starts, t_ends, seg, before[:, k])
            local[:, j, :3], local[:, j, 3] = rgb, depth
        start = time.perf_counter()
        values = self._all_regions(local)  # exchange 2: segment colour and depth (4 floats per ray and region)
        num_samples = torch.tensor([sum(int(s["ray_idx"].numel()) for s in segs)], dtype=torch.long)
        if self.distributed:
            dist.all_reduce(num_samples)
        rgb, depth, opacity = composite_segments(values[..., :3], transmittance, values[..., 3], entry,
                                                 self.background)
        self.timing["exchange_composite_s"] += time.perf_counter() - start
        return {"rgb": rgb, "depth": depth, "opacity": opacity, "num_samples": int(num_samples)}

    def _hierarchical_samples(self, rays: RayBundle):
        """NeRF's coarse pass composited across all regions, then fine samples (see module doc)."""
        first = self.models[0]
        t_starts, t_ends = stratified_samples(rays.near, rays.far, first.num_coarse, False)
        mask = torch.ones_like(t_starts, dtype=torch.bool)
        owner = self._owned(rays, t_starts, t_ends, mask)
        alphas = torch.zeros_like(t_starts)
        for j, k in enumerate(self.regions):
            alphas = alphas + self._region_density(self.models[j], rays, t_starts, t_ends, owner == k,
                                                   level="coarse")["alphas"]
        if self.distributed:  # second exchange: every rank needs the whole coarse distribution
            dist.all_reduce(alphas)
        weights, _ = render_weights(alphas)
        if first.fine is None:
            return t_starts, t_ends
        bins = torch.cat([t_starts, t_ends[:, -1:]], dim=-1)
        t_fine = sample_pdf(bins, weights, first.num_fine, False)
        t_all = torch.sort(torch.cat([t_starts, t_fine], dim=-1), dim=-1).values
        return intervals_from_points(t_all, rays.far)

    def _blend(self, rays: RayBundle) -> dict:
        t_starts, t_ends, mask = self._samples(rays)
        ray_idx, sample_idx, points = self._points(rays, t_starts, t_ends, mask)
        member = self.partition.contains(points.clamp(self.partition.bounds[0].to(points),
                                                      self.partition.bounds[1].to(points)), enlarged=True)
        dist_k = torch.cdist(points.double(), self.partition.centers.to(points.device))
        inv = torch.where(member, 1.0 / dist_k.clamp(min=1e-9) ** self.blend_power, torch.zeros_like(dist_k))
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
        sigmas = torch.zeros(mask.shape, dtype=points.dtype, device=points.device)
        rgbs = torch.zeros(mask.shape + (3,), dtype=points.dtype, device=points.device)
        sigmas[ray_idx, sample_idx], rgbs[ray_idx, sample_idx] = sigma, rgb
        weights, _ = render_weights(alphas_from_densities(sigmas, t_ends - t_starts))
        rgb_out, depth, opacity = composite(weights, rgbs, 0.5 * (t_starts + t_ends), self.background)
        return {"rgb": rgb_out, "depth": depth, "opacity": opacity, "num_samples": int(member.sum())}


def region_owner(num_regions: int, world_size: int) -> list[int]:
    """Owning rank of each region: contiguous blocks of ``num_regions / world_size``.

    Raises:
        ValueError: when the number of regions is not a multiple of the world size.
    """
    if num_regions % world_size:
        raise ValueError(f"strategy.num_regions={num_regions} must be a multiple of the world size {world_size}")
    per_rank = num_regions // world_size
    return [k // per_rank for k in range(num_regions)]


def dist_regions(partition: Partition) -> list[list[int]]:
    """Regions of every rank of the current process group, in rank order."""
    world = dist.get_world_size()
    owners = region_owner(len(partition), world)
    return [[k for k, r in enumerate(owners) if r == rank] for rank in range(world)]
