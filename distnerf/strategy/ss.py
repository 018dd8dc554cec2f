"""Spatial segmentation (``strategy=ss``): one sub-scene model per region, no all-reduce.

Legend: R rays, K regions, W world size.

The scene box is split into K regions (:mod:`.partition`; K = W by default, or a
multiple of it); each rank owns K / W regions, assigned by their measured training cost
(:func:`.partition.assign_regions`; joint training: contiguous blocks). Each region has its
own sub-model and its own optimizer state: training needs no gradient all-reduce
(Mega-NeRF, Turki et al. 2022). Every region draws its own block of ``B / K`` rays per step
(``B`` the global batch: the world size times ``train.rays_per_rank``, or ``train.global_rays``)
from its own ray stream (the stream is the region index; the sampler's
block batch), keeping through the ray-filter hook the rays whose segment crosses its
enlarged region; its sub-model trains on those with their mean squared error, and its
sample jitter comes from a generator keyed by the region. So what a region trains on
depends on the region and the step only, never on its owner.
A sub-model renders the whole ray inside the scene box, because it must explain the
whole pixel colour; it therefore also learns content outside its region, which the
fusion stage (:mod:`.fusion`) discards. A ``grid`` sub-model holds its enlarged region
at full resolution and the rest of the scene at ``context_resolution``. With
``model.max_params`` (a per-rank budget) each sub-model gets ``max_params / (K / W)``,
context tables included: K regions hold K / W times the parameters of one ``ddp`` replica.

At start, a sample of training rays (deterministic by seed, drawn on rank 0 and
broadcast) gives each region's rays, cameras and cost (rays x their marched length,
:func:`.partition.region_load`); a region no sampled ray crosses is refused.

Ranks still agree on the step count, stop flags and checkpoint cadence (the trainer's
one small all-reduce per step, read after the optimizer step). Checkpoints are sharded: ``region_KKK.pt`` holds a
sub-model and its optimizer state (written by its owner); the manifest, written last,
records the partition and the owner of every region. ``RUN/partition.json`` holds the
partition for the whole run (resume and rendering reuse it).

Elastic resume: a run may resume at another world size W' that divides K (torchrun
``--nnodes=MIN:MAX`` coming back smaller or larger). The regions are reassigned to the
ranks present (independent: :func:`.partition.assign_regions` on the same measured costs;
joint: contiguous blocks) and each rank loads its new regions' sub-models and optimizer
states. Sub-models are initialised from a seed keyed by (run seed, region), batches and
jitter are keyed by (region, step) (independent) or shared by every rank (joint), and a
region's update reads nothing of another region's, so the continuation is bit-exact to
the uninterrupted run (``tests/dist/test_ss.py``). ``ddp`` still warns that its
continuation differs (its ray streams are per rank).
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from .. import checkpoint as ckpt
from ..fileio import atomic_torch_save
from .. import distributed as D
from ..model import build_model, contracted
from ..components.optim import merge_optimizer_states, split_optimizer_state
from ..config_check import derive, section
from ..model.base import RadianceModel
from ..seeds import LOAD_STREAM, SHARED_STREAM, region_seed
from .base import LossNormalizer, Sampling, StepAgreement, StepStats, Strategy
from .density import estimate_density
from .fusion import FusedRenderer
from .partition import (Partition, assign_regions, balanced_partition, empty_region_error, grid_partition,
                        ray_points, region_load, region_owner)
from .regions import JointRegionModels, RegionModels, RegionRayFilter

log = logging.getLogger("distnerf")

PARTITIONS = ("grid", "balanced")


def training_ray_sample(scene, num_rays: int, seed: int):
    """A uniform sample of the training split's rays (deterministic by ``seed``): ((R,) rays, (R,) image ids)."""
    from ..data.rays import generate_rays
    from ..sampler.base import BatchSpec, draw_indices
    from ..sampler.policy import pixel_table

    h, w = scene.height, scene.width
    flat, _ = draw_indices(BatchSpec(num_rays, seed, LOAD_STREAM), len(scene), h, w, 0,
                           pixel_table(scene.mask, scene.source))
    flat = torch.from_numpy(flat)
    image, pixel = flat // (h * w), flat % (h * w)
    rays = generate_rays(scene.cameras, image, pixel % w, pixel // w, scene.near, scene.far, scene.ndc)
    return rays, image


def _group_region(group: dict) -> int | str:
    """The region of an optimizer group of :meth:`.regions.RegionModels.param_groups` (``regionK/...``;
    the name, since a loaded state dict replaces a group's other keys with the saved ones), or ``shared``
    (``shared/...``: the sharded joint model's appearance, :class:`.regions.JointRegionModels`)."""
    head = group["name"].split("/", 1)[0]
    return head if head == "shared" else int(head[len("region"):])


def shard_layout(partition: Partition) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """The shards of one model that a partition's regions hold (``strategy.joint_model=sharded``).

    A bounded partition's regions are a regular grid of the scene box (c_a cells on axis a); a contracted
    (:attr:`Partition.unbounded`) one's are cut through the box's centre planes only, at most 2 per axis:
    a centre plane of the scene box is one of the contracted cube too, and of the world, so each region is
    convex and a ray enters it once; an off-centre plane of the contracted cube is a curved surface in the
    world (a ray could enter its region twice).

    Returns:
        boxes: (K, 2, 3) float32 each region's shard box in field coordinates (a contracted partition's
        outer faces moved to the contracted cube's, :func:`~distnerf.renderer.contraction.contracted_box`);
        multiple: (c_x, c_y, c_z) the cells per axis (``model.lattice_multiple``: the cut planes are
        vertex planes of the lattice).
    Raises:
        ValueError: regions that are not such a grid (a ``balanced`` partition, off-centre planes when
            contracted), naming ``strategy.joint_model=per_region``.
    """
    from ..renderer.contraction import contracted_box

    lo, hi = partition.bounds[0], partition.bounds[1]
    counts = []
    for a in range(3):
        starts = sorted({round(float(v), 9) for v in partition.boxes[:, 0, a]})
        c = len(starts)
        even = all(abs(s - (float(lo[a]) + i * float(hi[a] - lo[a]) / c)) <= 1e-6 * float(hi[a] - lo[a])
                   for i, s in enumerate(starts))
        if not even or (partition.unbounded and c > 2):
            raise ValueError(f"strategy.joint_model=sharded needs regions that {'cut the scene box through its centre planes (at most 2 per axis: a contracted scene)' if partition.unbounded else 'form a regular grid of the scene box'}; "
                             f"the {partition.kind} partition cuts axis {a} at {starts[1:]}: use strategy.partition=grid "
                             f"with strategy.grid (e.g. [2,1,2]), or strategy.joint_model=per_region")
        counts.append(c)
    boxes = partition.boxes.clone()
    if partition.unbounded:
        outer = contracted_box(partition.bounds)
        boxes[:, 0] = torch.where(boxes[:, 0] <= lo, outer[0], boxes[:, 0])
        boxes[:, 1] = torch.where(boxes[:, 1] >= hi, outer[1], boxes[:, 1])
    return boxes.float(), tuple(counts)


def regions_crossed(crossing: torch.Tensor) -> dict:
    """How many regions a ray crosses (what segment fusion composites per ray).

    Args:
        crossing: (R, K) bool, ray r crosses region k (the regions' own boxes, not enlarged).
    Returns:
        ``regions_crossed_mean``: the mean count over rays crossing at least one region;
        ``regions_crossed_share``: {count: share of those rays} for counts 1..K.
    """
    counts = crossing.sum(1)
    hit = counts[counts > 0]
    if hit.numel() == 0:
        return {"regions_crossed_mean": None, "regions_crossed_share": {}}
    shares = torch.bincount(hit, minlength=crossing.shape[1] + 1)[1:].double() / hit.numel()
    return {"regions_crossed_mean": float(hit.double().mean()),
            "regions_crossed_share": {str(k + 1): float(v) for k, v in enumerate(shares.tolist())}}


def read_shared(ckpt_dir: Path) -> dict | None:
    """The sharded joint model's shared state (``{"model": appearance state, "optimizer": its part}``), kept
    in region 0's file, or None (a checkpoint of per-region sub-models, or of a model without appearance)."""
    return ckpt.load_file(Path(ckpt_dir) / ckpt.region_file(0)).get("shared")


def load_shared(ckpt_dir: Path) -> dict:
    """:func:`read_shared`, required.

    Raises:
        CheckpointError: a checkpoint without it (saved by per-region sub-models).
    """
    shared = read_shared(ckpt_dir)
    if shared is None:
        raise ckpt.CheckpointError(f"{ckpt_dir}: {ckpt.region_file(0)} holds no shared appearance: a checkpoint of "
                                   f"per-region sub-models; resume or render it with strategy.joint_model=per_region")
    return shared


class SSStrategy(Strategy):
    """``strategy=ss``.

    Config: :class:`distnerf.schema.SSStrategyConfig` (partition, regions, overlap, the
    balanced partition's density fit, ``training`` independent | joint, ``fusion``).
    """

    name = "ss"
    elastic = True  # resumes at another world size, bit-exact (module docstring)

    def __init__(self, cfg, env):
        super().__init__(cfg, env)
        self.partition: Partition | None = None
        self.owner: list[int] = []
        self.training = self.cfg.training
        self.joint = self.training == "joint"
        # joint, route: each rank's own rays, sent to the regions they cross (regions.JointRegionModels.forward_routed)
        self.routed = self.joint and self.cfg.joint_exchange == "route"
        if self.routed:
            self.elastic = False  # per-rank ray streams: another world size draws other rays
        self.seed = 0
        self.min_altitude: float | None = None

    # -- set-up -----------------------------------------------------------------
    def prepare(self, scene, run_dir: Path, seed: int, model_cfg: dict) -> None:
        """Build (rank 0, broadcast) or reload ``RUN/partition.json``; assign the regions to the
        ranks present; report routing.

        Raises:
            ValueError: a saved partition with another ``strategy.num_regions`` or contraction, or
                whose K regions do not split evenly over the world size; ``model.floor_footprint``
                (a sub-model's box is its region's, not the scene's: its floor would end rays at
                other footprints than the routing's) with a floor set. ``model.opaque_floor`` is
                supported: the floor's colour is composited behind a floored ray's segments, from
                the region holding the floor point (:mod:`.floor`).
        """
        self.seed = int(seed)
        if model_cfg.get("floor_footprint") and model_cfg.get("min_altitude") is not None:
            raise ValueError("model.floor_footprint=true is not supported with strategy=ss (each sub-model's box is "
                             "its region's, so its floor would not match the rays' routing); use it with "
                             "strategy=ddp, or model.floor_footprint=false")
        self.min_altitude = model_cfg.get("min_altitude")  # the sub-models' floor: rays are routed to it
        num = self.cfg.num_regions or self.env.world_size
        path = Path(run_dir) / "partition.json"
        if path.exists():
            part = Partition.load(path)
            if self.cfg.num_regions is not None and len(part) != num:
                raise ValueError(f"{path}: {len(part)} regions but strategy.num_regions={num}: resume with the "
                                 f"original settings or start a new run directory")
            if len(part) % self.env.world_size:
                raise ValueError(f"{path}: {len(part)} regions cannot be spread evenly over world size "
                                 f"{self.env.world_size}: resume on a world size that divides {len(part)}")
            if part.unbounded != contracted(model_cfg):
                raise ValueError(f"{path}: a partition for {'un' if part.unbounded else ''}bounded sub-models but "
                                 f"model.contraction={model_cfg['contraction']!r}: resume with the original settings")
            self.partition = part
        else:
            built = None
            if self.env.is_main:
                built = self._build_partition(scene, num, seed, model_cfg)
                built.world_size = self.env.world_size  # the sub-models' share of max_params, for rendering too
                built.unbounded = contracted(model_cfg)  # the outer regions reach infinity
                built = built.to_dict()
            self.partition = Partition.from_dict(D.broadcast_object(self.env, built))
            if self.env.is_main:
                self.partition.save(path)
        stats = self._region_stats(scene, seed) if self.env.is_main else None
        self.region_stats = D.broadcast_object(self.env, stats)  # every rank: the same owners (and errors)
        for k, n in enumerate(self.region_stats["rays"]):
            if n == 0:
                raise empty_region_error(k, self.partition.boxes[k].tolist(), self.region_stats["num_rays"])
        # joint: the segment exchange orders regions by contiguous rank blocks
        self.owner = (region_owner(len(self.partition), self.env.world_size) if self.joint else
                      assign_regions(self.region_stats["cost"], self.env.world_size))
        if self.env.is_main:
            self._log_regions()

    def _build_partition(self, scene, num: int, seed: int, model_cfg: dict) -> Partition:
        kind, overlap = self.cfg.partition, self.cfg.overlap
        if kind == "grid":
            return grid_partition(scene.aabb, num, self.cfg.grid, overlap)
        if kind == "balanced":
            steps, res = self.cfg.balance_steps, self.cfg.balance_resolution
            rays, _ = training_ray_sample(scene, 8192, seed)
            points = ray_points(rays, scene.aabb, 32)
            _, alpha = estimate_density(scene, model_cfg, steps, res, self.cfg.balance_rays, seed, self.env.device,
                                        at=points)
            # the samples of training rays, by the fitted content there; the floor keeps empty space worth a
            # little (rays are marched through it until the occupancy grid learns to skip it)
            weights = alpha.double() + 0.01
            part = balanced_partition(scene.aabb, num, points, weights, overlap)
            log.info("balanced partition: training-ray samples (%d) weighted by a %d^3 density fit (%d steps); "
                     "share per region: %s", len(points), res, steps,
                     [round(float(weights[part.region_of(points) == k].sum() / weights.sum()), 3)
                      for k in range(num)])
            return part
        raise ValueError(f"strategy.partition={kind!r} is not one of {PARTITIONS}")

    def _region_stats(self, scene, seed: int, num_rays: int = 65536) -> dict:
        """Rays, cameras and cost of each region from a sample of training rays (:func:`region_load`)."""
        rays, images = training_ray_sample(scene, num_rays, seed)
        stats = region_load(self.partition, rays.origins, rays.directions, rays.near, rays.far, images,
                            None if self.joint else scene.aabb)  # independent: the whole ray in the box
        crossing = self.partition.ray_crossings(rays.origins, rays.directions, rays.near, rays.far)
        return {**stats, "num_rays": num_rays, "num_cameras": len(scene),
                "miss_every_region": float((~crossing.any(1)).float().mean()),
                **regions_crossed(self.partition.ray_crossings(rays.origins, rays.directions, rays.near, rays.far,
                                                               enlarged=False))}

    def _log_regions(self) -> None:
        """The start-up table: per region, sampled rays crossing it, cameras seeing it, cost, owner."""
        st, total = self.region_stats, max(sum(self.region_stats["cost"]), 1e-30)
        lines = [f"{'region':>6} {'rays':>8} {'share':>6} {'cameras':>8} {'cost':>6} {'owner':>5}"]
        for k in range(len(self.partition)):
            lines.append(f"{k:>6} {st['rays'][k]:>8} {st['rays'][k] / st['num_rays']:>6.3f} "
                         f"{st['cameras'][k]:>4}/{st['num_cameras']:<3} {st['cost'][k] / total:>6.3f} "
                         f"{self.owner[k]:>5}")
        load = [sum(c for c, r in zip(st["cost"], self.owner) if r == rank) / total
                for rank in range(self.env.world_size)]
        log.info("ss: %d regions (%s), overlap %.2f; training rays crossing each enlarged region (of %d sampled; "
                 "crossing none: %.3f), cost = rays x marched length (share):\n%s\ncost per rank: %s",
                 len(self.partition), self.partition.kind, self.partition.overlap, st["num_rays"],
                 st["miss_every_region"], "\n".join(lines), [round(x, 3) for x in load])

    @property
    def my_regions(self) -> list[int]:
        return [k for k, r in enumerate(self.owner) if r == self.env.rank]

    def sampling(self, scene, global_rays: int) -> Sampling:
        """Joint: the shared stream (every rank the same rays; routed: each rank its own, as ddp), every ray
        counting; independent: one block per region of this rank, each region's own stream (the region
        index), the rays crossing its enlarged region counting. Rays: :meth:`rays_per_rank`."""
        rays = self.rays_per_rank(global_rays)
        if self.routed:  # joint, routed: each rank its own rays, as ddp
            return Sampling(self.env.rank, None, rays,
                            f"{self.env.world_size} ranks x {rays} rays from each rank's own stream, each ray sent "
                            f"to the ranks whose regions it crosses (strategy.joint_exchange=route)")
        if self.joint:
            return Sampling(SHARED_STREAM, None, rays,
                            f"{global_rays} rays drawn once (one shared stream, {global_rays / self.env.world_size:g} "
                            f"per rank), each rendered by the regions it crosses: each of {self.env.world_size} ranks "
                            f"renders the segments of its {len(self.my_regions)} region(s) of all {global_rays}")
        boxes = self.partition.extents(enlarged=True)
        filters = tuple(RegionRayFilter(boxes[k], to_infinity=self.partition.unbounded, min_altitude=self.min_altitude)
                        for k in self.my_regions)
        return Sampling(tuple(self.my_regions), filters, rays,
                        f"{self.env.world_size} ranks x {len(self.my_regions)} region(s) x "
                        f"{global_rays // len(self.partition)} rays drawn from each region's own stream (those "
                        f"crossing its enlarged region count)")

    def rays_per_rank(self, global_rays: int) -> int:
        """This rank's sampler batch for a global batch of ``global_rays`` = B
        (:func:`distnerf.config_check.global_batch`: W x ``train.rays_per_rank`` by default).

        Joint: B, the same rays on every rank (one shared stream). "Per rank" then counts the rays
        each rank adds to the batch (B = W x ``rays_per_rank``), not the rays it renders: the batch
        is drawn once and every ray is rendered by the regions it crosses, each rank rendering its
        regions' segments of all B rays (about B x regions crossed / K segments per region, so a
        rank's samples stay about ``rays_per_rank`` rays' worth as W = K grows; the all-gather of
        segment colours still carries all B rays, so it grows with W).
        Independent: B / K rays per region of this rank, each region from its own stream (those
        crossing its enlarged region count), i.e. ``rays_per_rank`` over the rank's K / W regions.

        Raises:
            ValueError: independent training with B not divisible by K.
        """
        if self.routed:  # each rank draws B / W of its own (Strategy.rays_per_rank)
            return super().rays_per_rank(global_rays)
        if self.joint:
            return global_rays
        num = len(self.partition)
        if global_rays % num:
            raise ValueError(f"the global batch of {global_rays} rays (train.global_rays, or the world size x "
                             f"train.rays_per_rank) is not divisible by the {num} regions (strategy=ss "
                             f"training=independent draws B / K rays per region)")
        return global_rays // num * len(self.my_regions)

    # -- model --------------------------------------------------------------------
    def build_model(self, model_cfg: dict, scene) -> RadianceModel:
        """This rank's regions' sub-models (:meth:`build_region_model`), joint or independent.

        Raises:
            ValueError: ``joint_exchange=route`` with a model that is not marched (``grid``, ``ngp``): the
                routed rays carry one sample-grid jitter each, which ``nerf``'s stratified sampling has no use for.
        """
        name = section("model", model_cfg).get("name")
        if self.routed and name not in ("grid", "ngp"):
            raise ValueError(f"strategy.joint_exchange=route needs a marched model (model=grid or ngp), got "
                             f"model={name}: use strategy.joint_exchange=gather")
        models = {}
        for k in self.my_regions:  # initialised from (seed, region): the same on whichever rank holds it
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(region_seed(self.seed, k + 1))
                models[k] = self.build_region_model(model_cfg, scene.aabb, scene.background, k, len(scene))
        if self.joint:
            return JointRegionModels(models, self.partition, scene.background, self.env, self.routed,
                                     self.shared_appearance(model_cfg, len(scene)))
        return RegionModels(models, self.partition, blocks=True)

    def sharded(self, model_cfg) -> bool:
        """Whether the joint sub-models are shards of one model (``strategy.joint_model``: ``auto`` picks
        them for ``model=grid`` with ``color=sh``; a colour network or another model would be one per region).

        Raises:
            ValueError: ``sharded`` asked of a model that cannot be sharded.
        """
        cfg = section("model", model_cfg)
        if not self.joint or self.cfg.joint_model == "per_region":
            return False
        able = cfg.name == "grid" and cfg.get("color") == "sh"
        if self.cfg.joint_model == "sharded" and not able:
            raise ValueError(f"strategy.joint_model=sharded shards one model=grid with model.color=sh (got "
                             f"model={cfg.name}{', color=' + str(cfg.get('color')) if cfg.name == 'grid' else ''}: "
                             f"a colour network would be one per region); use strategy.joint_model=per_region")
        return able

    def shared_appearance(self, model_cfg, num_images: int):
        """The sharded joint model's one appearance table (None without ``model.appearance``, or per region)."""
        cfg = section("model", model_cfg)
        if not self.sharded(cfg):
            return None
        from ..model.appearance import build_appearance

        return build_appearance(cfg.appearance, num_images, cfg.appearance_dim, False)

    def build_region_model(self, model_cfg: dict, aabb, background, region: int,
                           num_images: int = 0) -> RadianceModel:
        """Sub-model of ``region``. Independent: the whole scene box, a grid holding the
        enlarged region at full resolution; joint: the region's box only, black background,
        and ``model.tv_weight`` / K: a grid's total variation is a mean over its own vertex
        pairs, so K joint sub-models (one scene, one loss, equal budgets) at the full weight
        would regularise each vertex K times as hard as one model holding their vertices (two
        regions on one process lost 1.7 dB to it on the capacity study's scene, one model 1.0 dB;
        bench/scaling/capacity.md). Independent sub-models are models of the whole scene each and
        keep the weight.
        ``num_images``: rows of its own appearance table (all training images; 0 when a
        checkpoint's table is loaded into it)."""
        cfg = section("model", model_cfg)  # the run's typed node passes through
        if self.sharded(cfg):
            return self.build_shard(cfg, aabb, region, num_images)
        if cfg.max_params is not None:  # a per-rank budget: each of the rank's K / W regions (training W) a share
            world_size = self.partition.world_size or self.env.world_size
            cfg = derive(cfg, max_params=cfg.max_params * world_size // len(self.partition))
        if self.joint:  # contracted: around its own region (its column to infinity sampled in the shell)
            if cfg.get("tv_weight"):  # one scene, one regulariser: see the docstring
                cfg = derive(cfg, tv_weight=cfg.tv_weight / len(self.partition))
            return build_model(cfg, self.partition.boxes[region].float(), torch.zeros(3), num_images=num_images)
        if self.partition.unbounded:  # contracted around its enlarged region: its resolution where its content is
            return build_model(cfg, self.partition.enlarged()[region].float(), background, num_images=num_images)
        focus = (self.partition.enlarged()[region].float().tolist(), self.cfg.context_resolution)
        return build_model(cfg, aabb, background, focus=focus, num_images=num_images)

    def build_shard(self, cfg, aabb, region: int, num_images: int = 0) -> RadianceModel:
        """Region ``region``'s shard of one model (``strategy.joint_model=sharded``): the one model is ``cfg``
        on the scene box (its contraction, lattice and step), with ``model.lattice_multiple`` the partition's
        cells per axis (:func:`shard_layout`) and, with ``model.max_params`` (a per-rank budget), sized for
        W x that budget in all (W the training world size: the one model that W ranks hold, its appearance
        counted once); the shard holds that lattice's vertices in its region's box (a face plane in both
        regions beside it, its copies' gradients summed: :meth:`finish_gradients`), dense gradients (no
        sparse rows, so the face sums are plain adds), no appearance (the container's,
        :meth:`shared_appearance`), and ``model.tv_weight`` / K (each shard's total variation is a mean over its own vertex pairs; the
        pairs across a face are in no shard, those inside a face plane in two)."""
        boxes, multiple = shard_layout(self.partition)
        whole = derive(cfg, lattice_multiple=list(multiple), tighten_aabb=False)
        budget = None
        if cfg.max_params is not None:
            from ..model.budget import fit_budget
            from ..model.grid import GridModel

            world_size = self.partition.world_size or self.env.world_size
            whole, _, budget = fit_budget(GridModel, derive(whole, max_params=cfg.max_params * world_size), aabb,
                                          torch.zeros(3), {"num_images": num_images})
        shard = derive(whole, max_params=None, appearance="none", sparse_grad=False,
                       tv_weight=cfg.tv_weight / len(self.partition) if cfg.get("tv_weight") else cfg.get("tv_weight"))
        model = build_model(shard, aabb.float(), torch.zeros(3), shard_aabb=boxes[region])
        if budget is not None:  # its share of the budget and what it holds at the final stage; the whole model's
            per_vertex = model.density.shape[1] + model.features.shape[1]
            model.budget = {**budget, "max_params": budget["max_params"] // len(self.partition),
                            "whole_model_max_params": budget["max_params"],
                            "whole_model_parameters": budget["final_parameters"],
                            "final_parameters": model.num_vertices(budget["resolutions"][-1]) * per_vertex}
        return model

    def finish_gradients(self) -> None:
        """The sharded joint model: its face copies' gradients summed (:meth:`.regions.JointRegionModels.tie_faces`)."""
        if isinstance(self.model, JointRegionModels):
            self.model.tie_faces()

    def parameter_report(self, model: RegionModels) -> dict:
        """Per region of this rank: its owner, parameters (context tables included; ``context_parameters``
        of them) and what ``model.max_params`` derived for it."""
        regions = {}
        for k, sub in zip(model.regions, model.models):
            context = sum(p.numel() for n, p in sub.named_parameters() if n.startswith("context_"))
            regions[str(k)] = {"owner": self.env.rank, "parameters": sum(p.numel() for p in sub.parameters()),
                               "context_parameters": context, **super().parameter_report(sub)}
        crossed = {k: self.region_stats[k] for k in ("regions_crossed_mean", "regions_crossed_share")
                   if self.region_stats and k in self.region_stats}
        return {"regions": regions, **crossed}

    def wrap(self, model: nn.Module) -> nn.Module:
        self.model = self.wrapped = model.to(self.env.device)  # no DDP: nothing is all-reduced
        return self.wrapped

    def _finish_step_stats(self, mine: StepStats, total: StepStats) -> StepAgreement:
        """Joint: every rank holds the same rays, so they are counted once."""
        if self.joint and not self.routed:  # routed: each rank its own rays, summed as ddp's
            total.valid_rays = mine.valid_rays
        return StepAgreement(total, mine)

    def loss_normalizer(self, valid, batch_rays: int) -> LossNormalizer:
        """Independent: 1, since the sub-models are independent and each one's rows carry 1 / its own
        rays as ``loss_weight`` (:class:`.regions.RegionModels`). Joint: every rank holds the same rays,
        so the composite's mean error over this rank's valid rays is the loss (``valid`` None: all B of
        them; else a host number or a 0-dim device tensor, never read). Neither needs another rank's
        count: no collective, no correction after the backward. Joint with ``joint_exchange=route``: each
        rank's own rays, the divisor W times ddp's (below)."""
        if not self.joint:
            return LossNormalizer(1.0)
        if self.routed and self.env.has_peers:  # each rank its own B rays, as ddp, but nothing averages the
            # gradients: the owners' losses sum into each sub-model through the routed values' backward, so the
            # divisor is ddp's times W (W B, the global count when every ray counts; else corrected after the
            # backward by W B / N, N's all-reduce in flight: Strategy.loss_normalizer)
            return super().loss_normalizer(valid, batch_rays).with_divisor_times(self.env.world_size)
        if valid is None:
            return LossNormalizer(float(max(batch_rays, 1)))
        return LossNormalizer(valid.clamp(min=1) if torch.is_tensor(valid) else max(float(valid), 1.0))

    def comm_stats(self) -> dict:
        """Joint training: the segment exchange since the last call (seconds include waiting)."""
        ex = self.model.exchange if isinstance(self.model, JointRegionModels) else None
        if not ex:
            return {}
        # on CUDA the host clock around an NCCL all-gather measures its launch only: named so; the
        # device's span comes from the CUDA events around it (resolved here, after the steps' syncs)
        seconds_key = "exchange_launch_s" if D.device_timed(self.env.device) else "exchange_s"
        out = {seconds_key: ex["seconds"], "exchange_bytes": ex["bytes"], "exchange_calls": ex["calls"]}
        for key in ("face_bytes", "occupancy_bytes"):  # the sharded model's face-gradient all-reduces, occupancy merges
            if key in ex:
                out[key] = ex[key]
        events = ex.pop("events", None)
        if events:
            out["exchange_s"] = sum(D.event_seconds(a, b) for a, b in events)
        ex.update(seconds=0.0, bytes=0, calls=0, face_bytes=0, occupancy_bytes=0)
        return out

    # -- checkpoint ------------------------------------------------------------------
    def save_model_state(self, ckpt_dir: Path, model: RegionModels, optimizer, meta: dict,
                         write=atomic_torch_save) -> None:
        """One ``region_KKK.pt`` per region of this rank: its sub-model and its part of the
        optimizer state (the groups named ``regionK/...``), so any rank can take it over
        (``write(state, path)``: as :meth:`Strategy.save_model_state`)."""
        parts = split_optimizer_state(optimizer.state_dict(), _group_region)
        shared = getattr(model, "appearance", None)
        for k, sub in zip(model.regions, model.models):
            extra = {}
            if k == 0 and shared is not None:  # the sharded joint model's one appearance, with region 0
                extra["shared"] = {"model": shared.state_dict(),
                                   "optimizer": parts.get("shared", {"state": {}, "param_groups": []})}
            write({"model": sub.state_dict(), "optimizer": parts.get(k, {"state": {}, "param_groups": []}),
                   "region": k, **extra, **meta}, Path(ckpt_dir) / ckpt.region_file(k))

    def load_model_state(self, ckpt_dir: Path, model: RegionModels) -> dict:
        """Load this rank's regions (wherever they were trained) and merge their optimizer states.

        Raises:
            CheckpointError: a checkpoint of another partition, or a format-3 one whose optimizer
                states are per rank (``optimizer_rank_R.pt``; :func:`~distnerf.checkpoint.upgrade_from_3`)
                resumed with other owners.
        """
        manifest = ckpt.read_manifest(ckpt_dir)
        if manifest.get("partition") is not None and manifest["partition"] != self.partition.to_dict():
            raise ckpt.CheckpointError(f"{ckpt_dir}: its partition differs from the {self.partition.kind} partition "
                                       f"in this run's partition.json: resume with the run's own partition")
        states = [ckpt.load_file(Path(ckpt_dir) / ckpt.region_file(k)) for k in model.regions]
        for sub, state in zip(model.models, states):
            sub.load_state_dict(state["model"])
        saved_owner = manifest.get("region_owner")
        if manifest.get("optimizer_layout") == "per_rank":  # format 3: one optimizer file per rank
            if saved_owner != self.owner:
                raise ckpt.CheckpointError(f"{ckpt_dir}: optimizer states per rank (an older checkpoint), regions "
                                           f"owned {saved_owner}, now {self.owner}: resume it at its original "
                                           f"world size {manifest.get('world_size')}")
            return ckpt.load_file(Path(ckpt_dir) / ckpt.optimizer_file(self.env.rank))
        if saved_owner != self.owner and self.env.is_main:
            log.info("ss: regions reassigned from owners %s (world size %s) to %s (world size %d)", saved_owner,
                     manifest.get("world_size"), self.owner, self.env.world_size)
        step, seconds = {int(st["step"]) for st in states}, {float(st["train_seconds"]) for st in states}
        if len(step) != 1:
            raise ckpt.CheckpointError(f"{ckpt_dir}: region files of different steps {sorted(step)}")
        fractions = [st["budget_fraction"] for st in states if st.get("budget_fraction") is not None]
        optimizer = [st["optimizer"] for st in states]
        if getattr(model, "appearance", None) is not None:  # every rank's replica of the one appearance
            shared = load_shared(ckpt_dir)
            model.appearance.load_state_dict(shared["model"])
            optimizer.append(shared["optimizer"])
        return {"optimizer": merge_optimizer_states(optimizer), "step": step.pop(),
                "train_seconds": max(seconds), "budget_fraction": max(fractions) if fractions else None,
                "budget_minutes": states[0].get("budget_minutes")}

    def manifest_extra(self) -> dict:
        return {"strategy": self.name, "training": self.training, "partition": self.partition.to_dict(),
                "region_owner": self.owner}

    # -- evaluation: distributed segment fusion, every rank renders every view ----------
    def inference_model(self, model: RegionModels | FusedRenderer) -> nn.Module:
        if isinstance(model, (FusedRenderer, JointRegionModels)):  # joint: its forward composites the segments
            return model
        fusion = self.cfg.fusion
        if self.env.distributed and fusion == "blend":
            log.warning("strategy.fusion=blend needs one process: evaluating with segment fusion; render the "
                        "run with `python -m distnerf.render run_dir=... fusion=blend` for blend")
            fusion = "segment"
        return self.fuse(dict(zip(model.regions, model.models)), fusion)

    @property
    def renders_collectively(self) -> bool:
        return self.env.distributed

    def fuse(self, models: dict, fusion: str) -> FusedRenderer:
        """The fusion stage over ``models`` (region -> sub-model: all of them on one process,
        this rank's under torchrun) with this strategy's partition and fusion settings."""
        return FusedRenderer(self.partition, models, fusion, color_threshold=self.cfg.color_threshold,
                             blend_power=self.cfg.blend_power, distributed=self.env.distributed)


__all__ = ["SSStrategy", "SHARED_STREAM"]
