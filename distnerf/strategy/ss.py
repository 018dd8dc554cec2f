"""Spatial segmentation (``strategy=ss``): one sub-scene model per region, no all-reduce.

Legend: R rays, K regions, W world size.

The scene box is split into K regions (:mod:`.partition`; K = W by default, or a
multiple of it); rank r owns a contiguous block of K / W regions. Each region has its
own sub-model and each rank its own optimizer: training needs no gradient all-reduce
(Mega-NeRF, Turki et al. 2022). A rank draws its rays from its own stream through the
sampler's ray-filter hook, keeping the rays whose segment crosses one of its enlarged
regions, and each of its sub-models trains on the rays crossing its enlarged region.
A sub-model renders the whole ray inside the scene box, because it must explain the
whole pixel colour; it therefore also learns content outside its region, which the
fusion stage (:mod:`.fusion`) discards. A ``grid`` sub-model holds its enlarged region
at full resolution and the rest of the scene at ``context_resolution``.

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
from ..model import build_model
from ..model.base import RadianceModel
from .base import StepAgreement, StepStats, Strategy
from .density import estimate_density
from .fusion import FusedRenderer
from .partition import Partition, balanced_partition, grid_partition, region_owner
from .regions import JointRegionModels, RegionModels, RegionRayFilter

log = logging.getLogger("distnerf")

SHARED_STREAM = 1 << 30  # the ray stream every rank draws under joint training


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
            self.partition = part
        else:
            built = self._build_partition(scene, num, seed, model_cfg).to_dict() if self.env.is_main else None
            self.partition = Partition.from_dict(D.broadcast_object(self.env, built))
            if self.env.is_main:
                self.partition.save(path)
        self.owner = region_owner(len(self.partition), self.env.world_size)
        self._report_routing(scene, seed)

    def _build_partition(self, scene, num: int, seed: int, model_cfg: dict) -> Partition:
        kind, overlap = self.cfg.partition, self.cfg.overlap
        if kind == "grid":
            return grid_partition(scene.aabb, num, self.cfg.grid, overlap)
        if kind == "balanced":
            steps, res = self.cfg.balance_steps, self.cfg.balance_resolution
            points, weights = estimate_density(scene, model_cfg, steps, res, self.cfg.balance_rays, seed,
                                               self.env.device)
            part = balanced_partition(scene.aabb, num, points, weights, overlap)
            log.info("balanced partition from a %d^3 density estimate (%d steps); content per region: %s",
                     res, steps, [round(float(weights[part.region_of(points) == k].sum() / weights.sum()), 3)
                                  for k in range(num)])
            return part
        raise ValueError(f"strategy.partition={kind!r} is not one of {PARTITIONS}")

    def _report_routing(self, scene, seed: int, num_rays: int = 65536) -> None:
        """Share of (a uniform sample of) training rays crossing each enlarged region."""
        from ..sampler import SyncSampler

        batch = SyncSampler(scene, num_rays, seed, 1 << 21).host_batch(0)
        rays = batch.rays
        crossing = self.partition.ray_crossings(rays.origins, rays.directions, rays.near, rays.far)
        share = crossing.float().mean(dim=0).tolist()
        self.routing = {"share_per_region": share, "miss_every_region": float((~crossing.any(1)).float().mean())}
        if self.env.is_main:
            log.info("ss: %d regions (%s), overlap %.2f, owners %s; training rays crossing each enlarged region: %s; "
                     "crossing none: %.3f", len(self.partition), self.partition.kind, self.partition.overlap,
                     self.owner, [round(s, 3) for s in share], self.routing["miss_every_region"])
        for k, s in enumerate(share):
            if s == 0 and self.env.is_main:
                log.warning("ss: region %d (%s) is crossed by none of %d sampled training rays: its sub-model "
                            "(rank %d) receives no rays and stays at its initialisation", k,
                            self.partition.boxes[k].tolist(), num_rays, self.owner[k])

    @property
    def my_regions(self) -> list[int]:
        return [k for k, r in enumerate(self.owner) if r == self.env.rank]

    def sampler_stream(self) -> int:
        return SHARED_STREAM if self.joint else self.env.rank  # joint: every rank the same rays

    def ray_filter(self, scene):
        return None if self.joint else RegionRayFilter(self.partition.enlarged()[self.my_regions])

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
        models = {k: self.build_region_model(model_cfg, scene.aabb, scene.background, k) for k in self.my_regions}
        if self.joint:
            return JointRegionModels(models, self.partition, scene.background, self.env.distributed)
        return RegionModels(models, self.partition)

    def build_region_model(self, model_cfg: dict, aabb, background, region: int) -> RadianceModel:
        """Sub-model of ``region``. Independent: the whole scene box, a grid holding the
        enlarged region at full resolution; joint: the region's box only, black background."""
        cfg = dict(model_cfg)
        if self.joint:
            return build_model(cfg, self.partition.boxes[region].float(), torch.zeros(3))
        if cfg["name"] == "grid":
            return build_model(cfg, aabb, background, focus_aabb=self.partition.enlarged()[region].float().tolist(),
                               context_resolution=self.cfg.context_resolution)
        return build_model(cfg, aabb, background)

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
            sub.load_state_dict(torch.load(Path(ckpt_dir) / ckpt.region_file(k), map_location="cpu",
                                           weights_only=False)["model"])
        return torch.load(Path(ckpt_dir) / ckpt.optimizer_file(self.env.rank), map_location="cpu",
                          weights_only=False)

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
