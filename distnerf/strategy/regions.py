"""A rank's regions under ``strategy=ss``: the ray filter that routes rays to them and the
containers of their sub-models (independent and joint training).

Legend: R rays, K regions.
"""
from __future__ import annotations

import dataclasses
import time

import torch
from torch import nn

from .. import distributed as D
from ..distributed import DistEnv
from ..data.rays import RayBundle
from ..host_buffers import sync_free
from ..model.base import RadianceModel
from ..model.grid import GridModel
from ..renderer.output import RenderOutput
from ..sampler.policy import BoxFilter
from ..renderer.segments import segment_entries
from .floor import floor_holders, floored_rays, region_floor_colours
from .joint import GatherSegments, RouteValues, composite_all, region_generator, render_segments
from .partition import Partition, to_infinity


class RegionRayFilter:
    """Keeps the rays that cross any of some boxes (picklable: runs in sampler workers).

    Args:
        boxes: (B, 2, 3) region boxes in the rays' space (faces may be +-inf).
        to_infinity: test the rays from ``near`` to infinity (contracted sub-models ignore ``far``).
        min_altitude: with ``to_infinity``, the rays end where they go below it (the sub-models'
            ``model.min_altitude``), or None.
    """

    def __init__(self, boxes, to_infinity: bool = False, min_altitude: float | None = None):
        self.filters = [BoxFilter(b) for b in torch.as_tensor(boxes, dtype=torch.float32).reshape(-1, 2, 3)]
        self.to_infinity, self.min_altitude = to_infinity, min_altitude

    def __call__(self, rays: RayBundle) -> torch.Tensor:
        """(R,) bool."""
        if self.to_infinity:
            rays = to_infinity(rays, self.min_altitude)
        keep = self.filters[0](rays)
        for f in self.filters[1:]:
            keep = keep | f(rays)
        return keep

    def __repr__(self) -> str:
        return f"RegionRayFilter({[f.aabb.tolist() for f in self.filters]})"


class RegionModels(RadianceModel):
    """A rank's sub-scene models, trained on the rays that cross their enlarged regions.

    ``forward`` renders, for every sub-model, the rays crossing its enlarged region and
    returns the concatenated outputs with ``ray_index`` (the batch row of each output
    row) and ``loss_weight`` (1 / the rays its sub-model rendered), so one photometric
    loss is the sum over sub-models of each one's own mean error.

    With ``blocks`` (training: the sampler's block batch, one block of R / m rays per
    region of ``regions`` in that order, each from the region's own ray stream) the
    sub-model of block b renders only block b's rays, and its sample jitter comes from a
    generator keyed by its region (:func:`.joint.region_generator`): what a sub-model
    trains on depends on its region and the step only, not on which rank holds it or
    which other regions that rank holds (elastic resume, ``ss.py``). Without (a batch of
    arbitrary rays), every sub-model renders the batch's rays that cross its region.

    Args:
        models: region index -> sub-model. partition: the run's partition.
        background: (3,) scene background (default: the first sub-model's).
        blocks: read the batch as one block per region (see above).
    """

    def __init__(self, models: dict[int, RadianceModel], partition: Partition, background=None,
                 blocks: bool = False):
        first = next(iter(models.values()))
        super().__init__(first.aabb, first.background if background is None else background)
        self.regions = sorted(models)
        self.models = nn.ModuleList([models[k] for k in self.regions])
        self.partition = partition  # the regions (the fused field's owners: distnerf.engine.surface)
        self.register_buffer("boxes", partition.extents(enlarged=True)[self.regions].float())
        self.unbounded = partition.unbounded
        self.blocks = blocks

    @property
    def resolution(self) -> int | None:
        return self.models[0].resolution

    def forward(self, rays: RayBundle, generator=None) -> RenderOutput:
        """Each region's sub-model renders the rays that cross its box: one output row per (ray,
        region) pair, with ``ray_index`` and ``loss_weight`` (1 / the region's rows).

        Selecting those rays reads their number (a host sync per region). Where that stalls the
        device (:func:`~distnerf.host_buffers.sync_free`: CUDA) every ray of the region's block
        (of the batch, without blocks) is rendered instead: the others get an empty segment
        (``far = near``, empty for a contracted sub-model too) and a zero ``loss_weight``, the crossing ones ``1 / their count`` (a device division): the same
        loss, no size read, other sample jitter (each ray's draw depends on the rays before it).
        """
        keys = ("rgb", "depth", "opacity", "rgb_coarse", "distortion_loss")
        parts: dict[str, list] = {k: [] for k in keys + ("ray_index", "loss_weight")}
        num_samples = 0
        routed = to_infinity(rays, self.models[0].min_altitude) if self.unbounded else rays
        if self.blocks and len(rays) % len(self.models):
            raise ValueError(f"a block batch of {len(rays)} rays does not split into {len(self.models)} region blocks")
        size = len(rays) // len(self.models) if self.blocks else len(rays)
        masked = sync_free(rays.origins.device)
        for i, (k, box, model) in enumerate(zip(self.regions, self.boxes, self.models)):
            lo = i * size if self.blocks else 0
            crosses = BoxFilter(box)(routed.map(lambda t: t[lo:lo + size]))
            gen = region_generator(generator, k, rays.origins.device) if self.blocks else generator
            if masked:  # no size read: every ray rendered, the others with an empty segment and no weight
                sel = torch.arange(lo, lo + size, device=rays.origins.device)
                mine = rays.map(lambda t: t[lo:lo + size])
                mine = dataclasses.replace(mine, far=torch.where(crosses, mine.far, mine.near))
                weight = crosses.to(mine.far.dtype) / crosses.sum().clamp(min=1)
            else:
                sel = crosses.nonzero().view(-1) + lo  # host sync: the rays crossing the region
                if sel.numel() == 0:
                    continue
                mine = rays.map(lambda t: t[sel])
                weight = torch.full(sel.shape, 1.0 / sel.numel(), device=sel.device)
            out = model(mine, gen)
            for key in keys:
                if getattr(out, key) is not None:
                    parts[key].append(getattr(out, key))
            parts["ray_index"].append(sel)
            parts["loss_weight"].append(weight)
            num_samples += int(out.num_samples)
        if not parts["ray_index"]:  # no ray crosses this rank's regions: a zero loss that still has a graph
            zero = sum(p.sum() for p in self.parameters()) * 0.0
            return RenderOutput(rgb=rays.origins.new_zeros(0, 3) + zero, depth=rays.origins.new_zeros(0),
                                opacity=rays.origins.new_zeros(0), loss_weight=rays.origins.new_zeros(0),
                                ray_index=torch.zeros(0, dtype=torch.long, device=rays.origins.device))
        return RenderOutput(**{k: torch.cat(v) for k, v in parts.items() if v}, num_samples=num_samples)

    def update_state(self, step: int, stage_step: int | None = None) -> bool:
        return any([m.update_state(step, stage_step) for m in self.models])  # a list: every sub-model updates

    def collapsed(self) -> list[str]:
        """Every sub-model's emptied parts when *all* of them emptied; empty otherwise (one region
        may hold nothing, e.g. air above a corner of a bounded scene, and stay empty by right)."""
        parts = [[f"region {k}'s {part}" for part in m.collapsed()] for k, m in zip(self.regions, self.models)]
        return [p for ps in parts for p in ps] if parts and all(parts) else []

    def regularized_tables(self) -> list[tuple[nn.Parameter, tuple[int, int, int], float]]:
        return [t for m in self.models for t in m.regularized_tables()]

    def param_groups(self, lr: float) -> list[dict]:
        groups = []
        for k, m in zip(self.regions, self.models):
            for g in m.param_groups(lr):
                groups.append({**g, "name": f"region{k}/{g.get('name', 'params')}"})
        return groups


class JointRegionModels(RegionModels):
    """``training=joint``: this rank's sub-models render their segments of every ray; the
    segments of all regions are exchanged and composited exactly (:mod:`.joint`), with an
    opaque floor over the floor's colour where the floor ends a ray (:mod:`.floor`).

    The sharded joint model (``strategy.joint_model=sharded``: the sub-models are shards of one
    :class:`~distnerf.model.grid.GridModel`, ``shard_aabb``) is one model sharded: what one model holds
    once is held once here. Its per-image ``appearance`` lives in this container, not in the shards,
    and transforms the composite (background and floor colour included), which for ``affine`` is
    exactly the one model's per-sample transform (:mod:`distnerf.model.appearance`); every rank
    composites the same rays identically, so each rank's replica gets the same gradient and stays
    equal with no all-reduce. The occupancy grid is one grid: after a refresh the shards' cells are
    merged (:func:`~distnerf.model.grid_occupancy.merged_occupancy`; one all-gather of the M^3 cells bit-packed,
    W x M^3 / 8 bytes, :func:`~distnerf.distributed.all_reduce_or`) and dilated, and every shard takes the merged grid, so a sample near a region face is
    skipped or kept as the one model would.

    Args:
        models: region index -> sub-model (its box only, or a shard of one model; black background).
        partition: the run's partition. background: (3,) scene background.
        env: this process's :class:`~distnerf.distributed.DistEnv`: under torchrun (``env.distributed``) segments
            are exchanged with the other ranks, each holding its regions; else all K regions are here.
        routed: training only, ``strategy.joint_exchange=route`` (:meth:`forward_routed`): each rank draws
            its own rays and sends each only to the ranks whose regions it crosses; else every rank holds
            the same rays and all-gathers its segments of all of them.
        appearance: the sharded model's one per-image appearance (:class:`~distnerf.model.appearance.Appearance`,
            ``affine``), or None.
    """

    def __init__(self, models: dict[int, RadianceModel], partition: Partition, background, env: DistEnv,
                 routed: bool = False, appearance: nn.Module | None = None):
        super().__init__(models, partition, background)
        self.register_buffer("all_boxes", partition.extents().float())
        self.env = env
        distributed = self.distributed = env.distributed
        self.rank, self.world_size = env.rank, env.world_size
        self.routed = routed and distributed
        self.exchange = {"seconds": 0.0, "bytes": 0, "calls": 0}
        self.appearance = appearance
        self.sharded = all(getattr(m, "shard", None) is not None for m in self.models)
        if appearance is not None and not self.sharded:
            raise ValueError("JointRegionModels: one appearance for the composite needs shards of one model")
        if not distributed and self.regions != list(range(len(partition))):
            raise ValueError(f"one process needs all {len(partition)} regions, got {self.regions}")

    def update_state(self, step: int, stage_step: int | None = None) -> bool:
        """Every sub-model's schedule; the shards' occupancy refreshes merged into one grid (class docstring).
        Every rank refreshes at the same steps (one schedule), so the merge's all-reduce is matched."""
        if not self.sharded:
            return super().update_state(step, stage_step)
        before = [m.occupancy_refreshes for m in self.models]
        changed = super().update_state(step, stage_step)
        if [m.occupancy_refreshes for m in self.models] != before:
            self.merge_occupancy()
        return changed

    @torch.no_grad()
    def merge_occupancy(self) -> None:
        """Set every shard's occupancy grid to the whole model's (the union of the shards' own cells, dilated)."""
        from ..model.grid_occupancy import merged_occupancy

        def across_ranks(t: torch.Tensor) -> torch.Tensor:
            merged = D.all_reduce_or(self.env, t)  # collective: the other ranks' shards' cells, bit-packed
            self.exchange["occupancy_bytes"] = (self.exchange.get("occupancy_bytes", 0)
                                                + D.all_reduce_or_bytes(self.world_size, t.numel()))
            return merged

        merged = merged_occupancy([m.occupancy_evidence for m in self.models],
                                  across_ranks if self.distributed else None)
        for m in self.models:
            m.occupancy.set_binary(merged)

    @torch.no_grad()
    def tie_faces(self) -> None:
        """Sum the gradients of every face vertex's copies (the shards beside a cut plane both hold its
        vertices), so the copies, equal at the start and resampled alike at an upsampling, take the same
        optimizer steps and stay the one model's vertex, whose gradient is that sum.

        Per cut plane (axis by axis, so a vertex on two planes sums its four copies): each shard here adds
        its face's (density, features) gradients into a (plane vertices, 1 + C) buffer of the whole lattice,
        one all-reduce (sum) across ranks, and the face takes the sum. Dense gradients only
        (:meth:`~distnerf.strategy.ss.SSStrategy.build_shard` turns the sparse rows off).
        """
        if not self.sharded:
            return
        lattice, _ = self.models[0].lattice
        for axis in range(3):
            for plane in self._cuts(axis):  # every rank the same planes (matched all-reduces)
                self._tie_plane(axis, plane, lattice)

    def _cuts(self, axis: int) -> list[int]:
        """The lattice's vertex planes cut by the partition on ``axis`` (shard boxes' inner faces): its cells on
        the axis are the shards' ``model.lattice_multiple`` (:func:`~distnerf.strategy.ss.shard_layout`)."""
        lattice, _ = self.models[0].lattice
        cells = self.models[0].multiple[axis]
        return [i * (lattice[axis] - 1) // cells for i in range(1, cells)]

    @staticmethod
    def _faces(model, axis: int) -> list[int]:
        (lattice, first), shape = model.lattice, model.shape
        return [p for p in (first[axis], first[axis] + shape[axis] - 1) if 0 < p < lattice[axis] - 1]

    def _tie_plane(self, axis: int, plane: int, lattice: tuple[int, int, int]) -> None:
        """Sum the face copies on ``plane`` of ``axis`` of the shards on either side. The buffer spans the plane
        with each other axis' face planes doubled (a shard's window: its first vertex + the cuts at or below
        it), so shards beside each other along another axis stay apart (their copies are summed there)."""
        others = [a for a in range(3) if a != axis]
        cuts = {b: self._cuts(b) for b in others}
        width = self.models[0].density.shape[1] + self.models[0].features.shape[1]
        total = self.models[0].density.new_zeros(*(lattice[b] + len(cuts[b]) for b in others), width)
        views = []
        for m in self.models:
            if plane not in self._faces(m, axis):
                continue
            (_, first), shape = m.lattice, m.shape
            grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in (m.density, m.features)]
            face = [g.view(*shape, -1).select(axis, plane - first[axis]) for g in grads]
            start = [first[b] + sum(1 for p in cuts[b] if p <= first[b]) for b in others]
            window = tuple(slice(o, o + shape[b]) for o, b in zip(start, others))
            total[window] += torch.cat(face, dim=-1)
            views.append((m, face, window))
        if self.distributed:
            D.all_reduce_(total)  # the copies held by other ranks
            self.exchange["face_bytes"] = self.exchange.get("face_bytes", 0) + total.numel() * total.element_size()
        for m, face, window in views:
            for t, f, lo, hi in ((m.density, face[0], 0, 1), (m.features, face[1], 1, width)):
                if t.grad is None:
                    t.grad = torch.zeros_like(t)
                    f = t.grad.view(*m.shape, -1).select(axis, plane - m.lattice[1][axis])
                f.copy_(total[window][..., lo:hi])

    def param_groups(self, lr: float) -> list[dict]:
        """The regions' groups, then the shared appearance's (``shared/appearance``)."""
        groups = super().param_groups(lr)
        if self.appearance is not None:
            groups.append(self.appearance.param_group(lr, "shared/appearance"))
        return groups

    def _appearance(self, out: RenderOutput, rays: RayBundle) -> RenderOutput:
        """The one appearance transform of the composite (class docstring)."""
        if self.appearance is not None:
            out.rgb = self.appearance.transform(out.rgb, self.appearance.codes(rays.image_ids, len(rays)), None)
        return out

    def forward(self, rays: RayBundle, generator=None) -> RenderOutput:
        if self.routed and self.training:
            return self.forward_routed(rays, generator)
        # the outer regions' segments of an unbounded partition reach the sky; every ray ends at the floor
        rays, floored = floored_rays(rays, self.unbounded, self.models[0].min_altitude)
        floored = floored if self.models[0].opaque_floor else None
        seg = render_segments(self.models, self.regions, self.all_boxes, rays, generator)
        values = seg["values"]
        if floored is not None:  # the floor colours this rank's regions hold, exchanged with the segments
            values = torch.cat([values, region_floor_colours(self.models, self.regions, self.partition, rays,
                                                             floored).to(values.dtype)], dim=2)
        if self.distributed:  # the one exchange of a step: C floats per ray and region
            sent = values.numel() * values.element_size()
            start = time.perf_counter()
            marks = D.timing_event() if D.device_timed(values.device) else None  # on the device: the all-gather's span
            values = GatherSegments.apply(values, self.rank)
            if marks is not None:  # NCCL: the current stream waited on the collective
                self.exchange.setdefault("events", []).append((marks, D.timing_event()))
            self.exchange["seconds"] += time.perf_counter() - start
            self.exchange["bytes"] += sent
            self.exchange["calls"] += 1
        out = composite_all(values, rays, self.all_boxes, self.background, floored)
        out.num_samples, out.samples_per_region = seg["num_samples"], seg["samples_per_region"]
        return self._appearance(out, rays)

    def forward_routed(self, rays: RayBundle, generator=None) -> RenderOutput:
        """This rank's own rays rendered by the regions they cross, wherever those are held.

        Legend: R this rank's rays, K regions, m = K / W regions per rank (contiguous blocks), C values per
        segment (5, + 3 floor colours with an opaque floor). Steps: (1) which ranks each ray needs: the
        owners of the regions its segment crosses (one slab test over all K boxes) or whose box holds its
        floor point; (2) one all-to-all of the counts (a host read: the next one's sizes), one of the
        needed rays (origin, direction, view direction, near, far, sample-grid jitter, image, floored: 14
        floats each); (3) each rank renders its m regions' segments of the rays it received, exactly as
        the gathered path renders them (the jitter comes from the ray's owner); (4) one all-to-all sends
        the (rays x m x C) values back to the owners, whose rays' (R, K, C) tables hold them and, elsewhere,
        an empty segment (colour 0, transmittance 1: what a region the ray misses renders); (5) the owner
        composites (:func:`~.joint.composite_all`). The backward of (4) sends the values' gradients to
        the ranks that rendered them (:class:`~.joint.RouteValues`). A rank's bytes per step grow with
        its rays times the ranks they cross, not with W x R x K.

        Returns:
            the composite of this rank's R rays (``num_samples``: samples this rank marched, for the rays
            it received).
        """
        world, m = self.world_size, len(self.regions)
        rays, floored = floored_rays(rays, self.unbounded, self.models[0].min_altitude)
        floored = floored if self.models[0].opaque_floor else None
        crosses = torch.isfinite(segment_entries(rays.origins, rays.directions, rays.near, rays.far, self.all_boxes))
        if floored is not None:
            crosses = crosses | floor_holders(self.partition, rays, floored)
        need = crosses.view(len(rays), world, m).any(dim=2)  # (R, W): region k is rank k // m's
        dtype, device = rays.origins.dtype, rays.origins.device
        jitter = (torch.rand(rays.near.shape, generator=generator, device=device, dtype=dtype)
                  if generator is not None else torch.zeros_like(rays.near))
        image = rays.image_ids.to(dtype) if rays.image_ids is not None else torch.full_like(rays.near, -1.0)
        flag = floored.to(dtype) if floored is not None else torch.zeros_like(rays.near)
        table = torch.cat([rays.origins, rays.directions, rays.viewdirs, rays.near[:, None], rays.far[:, None],
                           jitter[:, None], image[:, None], flag[:, None]], dim=1)  # (R, 14)
        rank_of, ray_of = need.t().nonzero(as_tuple=True)  # grouped by destination rank, rays in order
        send_counts = torch.bincount(rank_of, minlength=world).tolist()
        recv_counts = D.exchange_counts(send_counts)
        start = time.perf_counter()
        got = D.all_to_all_rows(table[ray_of], send_counts, recv_counts)
        ids = got[:, 12].round().long() if rays.image_ids is not None else None
        theirs = RayBundle(got[:, 0:3], got[:, 3:6], got[:, 6:9], got[:, 9], got[:, 10], ids)
        seg = render_segments(self.models, self.regions, self.all_boxes, theirs, jitter=got[:, 11])
        values = seg["values"]
        if floored is not None:
            values = torch.cat([values, region_floor_colours(self.models, self.regions, self.partition, theirs,
                                                             got[:, 13] > 0.5).to(values.dtype)], dim=2)
        width = values.shape[2]
        back = RouteValues.apply(values.reshape(len(theirs), m * width), recv_counts, send_counts)
        self.exchange["seconds"] += time.perf_counter() - start
        # what leaves this rank: its rays for the others (14 floats) and their values' gradients in the backward,
        # and the others' rays' values (m x C floats each way)
        me = self.rank
        out_rows, in_rows = sum(send_counts) - send_counts[me], sum(recv_counts) - recv_counts[me]
        self.exchange["bytes"] += table.element_size() * (14 * out_rows + m * width * (in_rows + out_rows))
        self.exchange["calls"] += 1
        empty = values.new_zeros(width)
        empty[3] = 1.0  # a region the ray misses: no colour, all light through
        full = empty.repeat(len(rays), world * m, 1)  # (R, K, C)
        slots = (rank_of * m)[:, None] + torch.arange(m, device=device)  # (sent, m): the sender's regions
        full = full.index_put((ray_of[:, None], slots), back.view(-1, m, width))
        out = composite_all(full, rays, self.all_boxes, self.background, floored)
        out.num_samples, out.samples_per_region = seg["num_samples"], seg["samples_per_region"]
        return self._appearance(out, rays)


def context_memory_share(model: RadianceModel) -> float:
    """Share of a grid sub-model's table entries held by its context tables (0 otherwise)."""
    if not isinstance(model, GridModel) or model.focus is None:
        return 0.0
    ctx = model.context_density.numel() + model.context_features.numel()
    return ctx / (ctx + model.density.numel() + model.features.numel())
