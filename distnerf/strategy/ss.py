"""Spatial segmentation (``strategy=ss``): one sub-scene model per region, no all-reduce.

Legend: R rays, K regions, W world size.

The scene box is split into K regions (:mod:`.partition`; K = W by default, or a
multiple of it); each rank owns K / W regions, assigned by their measured training cost
(:func:`.partition.assign_regions`; joint training: contiguous blocks). Each region has its
own sub-model and each rank its own optimizer: training needs no gradient all-reduce
(Mega-NeRF, Turki et al. 2022). A rank draws its rays from its own stream through the
sampler's ray-filter hook, keeping the rays whose segment crosses one of its enlarged
regions, and each of its sub-models trains on the rays crossing its enlarged region.
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
one small all-reduce per step). Checkpoints are sharded: ``region_KKK.pt`` (the
sub-model, written by its owner) and ``optimizer_rank_R.pt``; the manifest, written
last, records the partition and the owner of every region. ``RUN/partition.json``
holds the partition for the whole run (resume and rendering reuse it).
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from .. import checkpoint as ckpt
from .. import dist as D
from ..model import build_model, contracted
from ..model.base import RadianceModel
from .base import StepAgreement, StepStats, Strategy
from .density import estimate_density
from .fusion import FusedRenderer
from .partition import (Partition, assign_regions, balanced_partition, empty_region_error, grid_partition,
                        ray_points, region_load, region_owner)
from .regions import JointRegionModels, RegionModels, RegionRayFilter

log = logging.getLogger("distnerf")

SHARED_STREAM = 1 << 30  # the ray stream every rank draws under joint training
PARTITIONS = ("grid", "balanced")
LOAD_STREAM = 1 << 21  # the ray stream of the start-up load estimate (never a rank's training stream)


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


class SSStrategy(Strategy):
    """``strategy=ss``.

    Config: :class:`distnerf.schema.SSStrategyConfig` (partition, regions, overlap, the
    balanced partition's density fit, ``training`` independent | joint, ``fusion``).
    """

    name = "ss"

    def __init__(self, cfg, env):
        super().__init__(cfg, env)
        self.partition: Partition | None = None
        self.owner: list[int] = []
        self.training = self.cfg.training
        self.joint = self.training == "joint"

    # -- set-up -----------------------------------------------------------------
    def prepare(self, scene, run_dir: Path, seed: int, model_cfg: dict) -> None:
        """Build (rank 0, broadcast) or reload ``RUN/partition.json``; report routing."""
        num = self.cfg.num_regions or self.env.world_size
        path = Path(run_dir) / "partition.json"
        if path.exists():
            part = Partition.load(path)
            if len(part) != num:
                raise ValueError(f"{path}: {len(part)} regions but strategy.num_regions={num}: resume with the "
                                 f"original settings or start a new run directory")
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
                "miss_every_region": float((~crossing.any(1)).float().mean())}

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

    def sampler_stream(self) -> int:
        return SHARED_STREAM if self.joint else self.env.rank  # joint: every rank the same rays

    def ray_filter(self, scene):
        return None if self.joint else RegionRayFilter(self.partition.extents(enlarged=True)[self.my_regions],
                                                       to_infinity=self.partition.unbounded)

    def rays_per_rank(self, global_rays: int) -> int:
        return global_rays if self.joint else super().rays_per_rank(global_rays)

    def describe_batch(self, global_rays: int) -> str:
        if self.joint:
            return (f"the same {global_rays} rays on each of {self.env.world_size} ranks, each rendering the segments "
                    f"of its {len(self.my_regions)} region(s)")
        return (f"{self.env.world_size} ranks x {self.rays_per_rank(global_rays)} drawn rays (those crossing the "
                f"rank's enlarged regions count)")

    # -- model --------------------------------------------------------------------
    def build_model(self, model_cfg: dict, scene) -> RadianceModel:
        models = {k: self.build_region_model(model_cfg, scene.aabb, scene.background, k, len(scene))
                  for k in self.my_regions}
        if self.joint:
            return JointRegionModels(models, self.partition, scene.background, self.env.distributed)
        return RegionModels(models, self.partition)

    def build_region_model(self, model_cfg: dict, aabb, background, region: int,
                           num_images: int = 0) -> RadianceModel:
        """Sub-model of ``region``. Independent: the whole scene box, a grid holding the
        enlarged region at full resolution; joint: the region's box only, black background.
        ``num_images``: rows of its own appearance table (all training images; 0 when a
        checkpoint's table is loaded into it)."""
        cfg = dict(model_cfg)
        if cfg["max_params"] is not None:  # a per-rank budget: each of the rank's K / W regions (training W) a share
            world_size = self.partition.world_size or self.env.world_size
            cfg["max_params"] = cfg["max_params"] * world_size // len(self.partition)
        if self.joint:  # contracted: around its own region (its column to infinity sampled in the shell)
            return build_model(cfg, self.partition.boxes[region].float(), torch.zeros(3), num_images=num_images)
        if self.partition.unbounded:  # contracted around its enlarged region: its resolution where its content is
            return build_model(cfg, self.partition.enlarged()[region].float(), background, num_images=num_images)
        if cfg["name"] == "grid":
            return build_model(cfg, aabb, background, focus_aabb=self.partition.enlarged()[region].float().tolist(),
                               context_resolution=self.cfg.context_resolution, num_images=num_images)
        return build_model(cfg, aabb, background, num_images=num_images)

    def parameter_report(self, model: RegionModels) -> dict:
        """Per region of this rank: its owner, parameters (context tables included; ``context_parameters``
        of them) and what ``model.max_params`` derived for it."""
        regions = {}
        for k, sub in zip(model.regions, model.models):
            context = sum(p.numel() for n, p in sub.named_parameters() if n.startswith("context_"))
            regions[str(k)] = {"owner": self.env.rank, "parameters": sum(p.numel() for p in sub.parameters()),
                               "context_parameters": context, **super().parameter_report(sub)}
        return {"regions": regions}

    def wrap(self, model: nn.Module) -> nn.Module:
        self.model = self.wrapped = model.to(self.env.device)  # no DDP: nothing is all-reduced
        return self.wrapped

    def reduce_step_stats(self, local: StepStats) -> StepAgreement:
        """The flags summed over ranks, and this rank's own valid rays as the loss normaliser:
        the sub-models are independent (no averaging). Joint: every rank holds the same
        rays, so they are counted once."""
        mine, total = self._reduce(local)
        if self.joint:
            total.valid_rays = mine.valid_rays
        return StepAgreement(total, mine, max(mine.valid_rays, 1.0))

    def comm_stats(self) -> dict:
        """Joint training: the segment exchange since the last call (seconds include waiting)."""
        ex = getattr(self.model, "exchange", None)
        if not ex:
            return {}
        # on CUDA the host clock around an NCCL all-gather measures its launch only: named so
        seconds_key = "exchange_launch_s" if self.env.device.type == "cuda" else "exchange_s"
        out = {seconds_key: ex["seconds"], "exchange_bytes": ex["bytes"], "exchange_calls": ex["calls"]}
        ex.update(seconds=0.0, bytes=0, calls=0)
        return out

    # -- checkpoint ------------------------------------------------------------------
    def save_model_state(self, ckpt_dir: Path, model: RegionModels, optimizer, meta: dict) -> None:
        for k, sub in zip(model.regions, model.models):
            ckpt.atomic_torch_save({"model": sub.state_dict(), "region": k, **meta},
                                   Path(ckpt_dir) / ckpt.region_file(k))
        ckpt.atomic_torch_save({"optimizer": optimizer.state_dict(), **meta},
                               Path(ckpt_dir) / ckpt.optimizer_file(self.env.rank))

    def load_model_state(self, ckpt_dir: Path, model: RegionModels) -> dict:
        manifest = ckpt.read_manifest(ckpt_dir)
        if manifest.get("region_owner") != self.owner:
            raise ckpt.CheckpointError(f"{ckpt_dir}: regions owned {manifest.get('region_owner')} at world size "
                                       f"{manifest.get('world_size')}, now {self.owner}: an ss run resumes at "
                                       f"its original world size and number of regions")
        for k, sub in zip(model.regions, model.models):
            sub.load_state_dict(ckpt.load_file(Path(ckpt_dir) / ckpt.region_file(k))["model"])
        return ckpt.load_file(Path(ckpt_dir) / ckpt.optimizer_file(self.env.rank))

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

    def fuse(self, models: dict, fusion: str) -> FusedRenderer:
        """The fusion stage over ``models`` (region -> sub-model: all of them on one process,
        this rank's under torchrun) with this strategy's partition and fusion settings."""
        return FusedRenderer(self.partition, models, fusion, color_threshold=self.cfg.color_threshold,
                             blend_power=self.cfg.blend_power, distributed=self.env.distributed)

    def eval_views(self, num_views: int) -> list[int]:
        return list(range(num_views))  # collective rendering: all ranks take part in every view

    @property
    def writes_renders(self) -> bool:
        return self.env.is_main

    def gather_rows(self, rows: list) -> list:
        return sorted(rows, key=lambda r: r["view"])  # identical on every rank


__all__ = ["SSStrategy", "SHARED_STREAM"]
