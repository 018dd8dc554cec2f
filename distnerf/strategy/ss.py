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

import inspect
import logging
import time
from pathlib import Path

import torch
from torch import nn

from .. import checkpoint as ckpt
from .. import dist as D
from ..data.rays import RayBundle
from ..model import build_model
from ..model.base import RadianceModel
from ..model.grid import GridModel
from ..sampler.policy import BoxFilter
from .base import Strategy
from .fusion import FusedRenderer, region_owner
from .joint import GatherSegments, composite_all, render_segments
from .partition import Partition, balanced_partition, grid_partition

log = logging.getLogger("distnerf")

PARTITIONS = ("grid", "balanced")
TRAININGS = ("independent", "joint")
SHARED_STREAM = 1 << 30  # the ray stream every rank draws under joint training


class RegionRayFilter:
    """Keeps the rays that cross any of some boxes (picklable: runs in sampler workers).

    Args:
        boxes: (B, 2, 3) region boxes in the rays' space.
    """

    def __init__(self, boxes):
        self.filters = [BoxFilter(b) for b in torch.as_tensor(boxes, dtype=torch.float32).reshape(-1, 2, 3)]

    def __call__(self, rays: RayBundle) -> torch.Tensor:
        """(R,) bool."""
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
    row), so one photometric loss covers every (ray, sub-model) pair.

    Args:
        models: region index -> sub-model. partition: the run's partition.
        background: (3,) scene background (default: the first sub-model's).
    """

    def __init__(self, models: dict[int, RadianceModel], partition: Partition, background=None):
        first = next(iter(models.values()))
        super().__init__(first.aabb, first.background if background is None else background)
        self.regions = sorted(models)
        self.models = nn.ModuleList([models[k] for k in self.regions])
        self.register_buffer("boxes", partition.enlarged()[self.regions].float())

    @property
    def resolution(self):
        return getattr(self.models[0], "resolution", None)

    def forward(self, rays: RayBundle, generator=None) -> dict:
        keys = ("rgb", "depth", "opacity", "rgb_coarse")
        parts: dict[str, list] = {k: [] for k in keys + ("ray_index",)}
        num_samples = 0
        for box, model in zip(self.boxes, self.models):
            sel = BoxFilter(box)(rays).nonzero().view(-1)
            if sel.numel() == 0:
                continue
            out = model(rays.map(lambda t: t[sel]), generator)
            for k in keys:
                if k in out:
                    parts[k].append(out[k])
            parts["ray_index"].append(sel)
            num_samples += int(out.get("num_samples", 0))
        if not parts["ray_index"]:  # no ray crosses this rank's regions: a zero loss that still has a graph
            zero = sum(p.sum() for p in self.parameters()) * 0.0
            return {"rgb": rays.origins.new_zeros(0, 3) + zero, "depth": rays.origins.new_zeros(0),
                    "opacity": rays.origins.new_zeros(0), "ray_index": torch.zeros(0, dtype=torch.long,
                                                                                   device=rays.origins.device),
                    "num_samples": 0}
        out = {k: torch.cat(v) for k, v in parts.items() if v}
        out["num_samples"] = num_samples
        return out

    def update_state(self, step: int) -> bool:
        return any([m.update_state(step) for m in self.models])  # a list: every sub-model updates

    def add_regularizer_grads_(self) -> float:
        return sum(m.add_regularizer_grads_() for m in self.models)

    def param_groups(self, lr: float) -> list[dict]:
        groups = []
        for k, m in zip(self.regions, self.models):
            for g in m.param_groups(lr):
                groups.append({**g, "name": f"region{k}/{g.get('name', 'params')}"})
        return groups


class JointRegionModels(RegionModels):
    """``training=joint``: this rank's sub-models render their segments of every ray; the
    segments of all regions are exchanged and composited exactly (:mod:`.joint`).

    Args:
        models: region index -> sub-model (its box only, black background).
        partition: the run's partition. background: (3,) scene background.
        distributed: exchange segments with the other ranks (else all K regions are here).
    """

    def __init__(self, models: dict[int, RadianceModel], partition: Partition, background, distributed: bool):
        super().__init__(models, partition, background)
        self.register_buffer("all_boxes", partition.boxes.float())
        self.distributed = distributed
        self.exchange = {"seconds": 0.0, "bytes": 0, "calls": 0}
        if not distributed and self.regions != list(range(len(partition))):
            raise ValueError(f"one process needs all {len(partition)} regions, got {self.regions}")

    def forward(self, rays: RayBundle, generator=None) -> dict:
        seg = render_segments(self.models, self.regions, self.all_boxes, rays, generator)
        values = seg["values"]
        if self.distributed:  # the one exchange of a step: C floats per ray and region
            start = time.perf_counter()
            values = GatherSegments.apply(values)
            self.exchange["seconds"] += time.perf_counter() - start
            self.exchange["bytes"] += seg["values"].numel() * seg["values"].element_size()
            self.exchange["calls"] += 1
        out = composite_all(values, rays, self.all_boxes, self.background)
        out["num_samples"] = seg["num_samples"]
        out["samples_per_region"] = seg["samples_per_region"]
        return out


def estimate_density(scene, model_cfg: dict, steps: int, resolution: int, rays_per_step: int, seed: int,
                     device) -> tuple[torch.Tensor, torch.Tensor]:
    """A coarse density estimate for the balanced partition: a short ``grid`` fit.

    Trains a ``resolution``^3 voxel grid for ``steps`` steps (sync sampler, Adam) and
    returns its occupancy-cell centres and opacities (one marching step at each).

    Returns:
        points: (M^3, 3) float32 cell centres; weights: (M^3,) float32 opacity in [0, 1].
    """
    from ..engine.loss import photometric_sse
    from ..engine.optim import build_optimizer
    from ..sampler import build_sampler

    grid_options = inspect.signature(GridModel).parameters  # the run's model settings that a grid also takes
    cfg = {**{k: v for k, v in model_cfg.items() if k in grid_options and k not in ("focus_aabb", "context_resolution")},
           "name": "grid", "resolutions": [resolution], "upsample_steps": []}
    model = build_model(cfg, scene.aabb, scene.background).to(device)
    optimizer = build_optimizer(model, {"lr": 1e-3, "fused": False})
    sampler = build_sampler({"name": "sync"}, scene, rays_per_step, seed, 1 << 20, device)
    sampler.start(0)
    for step in range(steps):
        model.update_state(step)
        batch = sampler.to_device(sampler.host_batch(step))
        out = model(batch.rays, torch.Generator(device).manual_seed(batch.jitter_seed))
        (photometric_sse(out, batch.rgb, batch.valid) / max(int(batch.valid.sum()), 1)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sampler.close()
    with torch.no_grad():
        points = model.occupancy.cell_centers()
        alpha = 1.0 - torch.exp(-model.field_density(points) * model.step_size())
    return points.cpu(), alpha.cpu()


class SSStrategy(Strategy):
    """``strategy=ss``.

    Config keys: ``partition`` (grid | balanced), ``num_regions`` (null: the world
    size; else a multiple of it), ``grid`` (cells per axis for ``grid``, or null),
    ``overlap`` (0.15), ``context_resolution`` (grid sub-models), ``balance_steps``,
    ``balance_resolution``, ``balance_rays`` (the coarse fit of ``balanced``),
    ``fusion`` (segment | blend: how training-time evaluation renders),
    ``color_threshold``, ``blend_power``, ``training`` (independent | joint, see :mod:`.joint`).
    """

    name = "ss"

    def __init__(self, cfg, env):
        super().__init__(cfg, env)
        self.partition: Partition | None = None
        self.owner: list[int] = []
        self._local_valid = 0.0
        self.training = cfg.get("training", "independent")
        if self.training not in TRAININGS:
            raise ValueError(f"strategy.training={self.training!r} is not one of {TRAININGS}")
        self.joint = self.training == "joint"

    # -- set-up -----------------------------------------------------------------
    def prepare(self, scene, run_dir: Path, seed: int, model_cfg: dict) -> None:
        """Build (rank 0, broadcast) or reload ``RUN/partition.json``; report routing."""
        num = self.cfg.get("num_regions") or self.env.world_size
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
        kind, overlap = self.cfg.get("partition", "grid"), float(self.cfg.get("overlap", 0.15))
        if kind == "grid":
            return grid_partition(scene.aabb, num, self.cfg.get("grid"), overlap)
        if kind == "balanced":
            steps, res = int(self.cfg.get("balance_steps", 100)), int(self.cfg.get("balance_resolution", 32))
            points, weights = estimate_density(scene, model_cfg, steps, res, int(self.cfg.get("balance_rays", 2048)),
                                               seed, self.env.device)
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
            cfg["focus_aabb"] = self.partition.enlarged()[region].float().tolist()
            cfg["context_resolution"] = int(self.cfg.get("context_resolution", 32))
        return build_model(cfg, aabb, background)

    def wrap(self, model: nn.Module) -> nn.Module:
        self.model = self.wrapped = model.to(self.env.device)  # no DDP: nothing is all-reduced
        return self.wrapped

    def reduce_step_stats(self, stats: torch.Tensor) -> torch.Tensor:
        self._local_valid = float(stats[0])
        out = super().reduce_step_stats(stats)
        if self.joint:  # every rank holds the same rays: count them once
            out[0] = stats[0]
        return out

    def comm_stats(self) -> dict:
        """Joint training: the segment exchange since the last call (seconds include waiting)."""
        ex = getattr(self.model, "exchange", None)
        if not ex:
            return {}
        out = {"exchange_s": ex["seconds"], "exchange_bytes": ex["bytes"], "exchange_calls": ex["calls"]}
        ex.update(seconds=0.0, bytes=0, calls=0)
        return out

    def loss_normalizer(self, global_valid: float) -> float:
        """This rank's own valid rays: the sub-models are independent (no averaging)."""
        return max(self._local_valid, 1.0)

    # -- checkpoint ------------------------------------------------------------------
    def save_model_state(self, ckpt_dir: Path, model: RegionModels, optimizer, meta: dict) -> None:
        for k, sub in zip(model.regions, model.models):
            ckpt.atomic_torch_save({"model": sub.state_dict(), "region": k, **meta},
                                   Path(ckpt_dir) / f"region_{k:03d}.pt")
        ckpt.atomic_torch_save({"optimizer": optimizer.state_dict(), **meta},
                               Path(ckpt_dir) / f"optimizer_rank_{self.env.rank}.pt")

    def load_model_state(self, ckpt_dir: Path, model: RegionModels) -> dict:
        manifest = ckpt.read_manifest(ckpt_dir)
        if manifest.get("region_owner") != self.owner:
            raise ckpt.CheckpointError(f"{ckpt_dir}: regions owned {manifest.get('region_owner')} at world size "
                                       f"{manifest.get('world_size')}, now {self.owner}: an ss run resumes at "
                                       f"its original world size and number of regions")
        for k, sub in zip(model.regions, model.models):
            sub.load_state_dict(torch.load(Path(ckpt_dir) / f"region_{k:03d}.pt", map_location="cpu",
                                           weights_only=False)["model"])
        return torch.load(Path(ckpt_dir) / f"optimizer_rank_{self.env.rank}.pt", map_location="cpu",
                          weights_only=False)

    def manifest_extra(self) -> dict:
        return {"strategy": self.name, "training": self.training, "partition": self.partition.to_dict(),
                "region_owner": self.owner}

    # -- evaluation: distributed segment fusion, every rank renders every view ----------
    def inference_model(self, model: RegionModels | FusedRenderer) -> nn.Module:
        if isinstance(model, (FusedRenderer, JointRegionModels)):  # joint: its forward composites the segments
            return model
        fusion = self.cfg.get("fusion", "segment")
        if self.env.distributed and fusion == "blend":
            log.warning("strategy.fusion=blend needs one process: evaluating with segment fusion; render the "
                        "run with `python -m distnerf.render run_dir=... fusion=blend` for blend")
            fusion = "segment"
        return FusedRenderer(self.partition, dict(zip(model.regions, model.models)), fusion,
                             color_threshold=float(self.cfg.get("color_threshold", 1e-3)),
                             blend_power=float(self.cfg.get("blend_power", 2.0)),
                             distributed=self.env.distributed)

    def eval_views(self, num_views: int) -> list[int]:
        return list(range(num_views))  # collective rendering: all ranks take part in every view

    @property
    def writes_renders(self) -> bool:
        return self.env.is_main

    def gather_rows(self, rows: list) -> list:
        return sorted(rows, key=lambda r: r["view"])  # identical on every rank


def load_fused(manifest: dict, ckpt_dir: Path, model_cfg: dict, strategy_cfg: dict, aabb, background, fusion: str,
               env: "D.DistEnv") -> FusedRenderer:
    """A fused renderer from a committed ``ss`` checkpoint.

    One process: every region's sub-model is loaded (one after another) and fused.
    Under torchrun (``env.distributed``): each rank loads the regions it owns at the
    current world size and ``segment`` fusion runs across ranks.

    Raises:
        ValueError: a world size that does not divide the number of regions, or blend across ranks.
    """
    partition = Partition.from_dict(manifest["partition"])
    owner = region_owner(len(partition), env.world_size)
    strategy = SSStrategy(strategy_cfg, env)
    strategy.partition = partition
    if strategy.joint and fusion != "segment":
        raise ValueError(f"fusion={fusion!r}: a joint ss run has no overlapping regions to blend; it renders with "
                         f"fusion=segment (its sub-models' own segment sampling, exchanged across ranks under torchrun)")
    models = {}
    for k in range(len(partition)):
        if env.distributed and owner[k] != env.rank:
            continue
        sub = strategy.build_region_model(model_cfg, aabb, background, k)
        sub.load_state_dict(torch.load(Path(ckpt_dir) / f"region_{k:03d}.pt", map_location="cpu",
                                       weights_only=False)["model"])
        models[k] = sub.to(env.device).eval()
    if strategy.joint:  # the same segments and compositing as training
        return JointRegionModels(models, partition, torch.as_tensor(background).float(),
                                 env.distributed).to(env.device).eval()
    return FusedRenderer(partition, models, fusion, color_threshold=float(strategy_cfg.get("color_threshold", 1e-3)),
                         blend_power=float(strategy_cfg.get("blend_power", 2.0)),
                         distributed=env.distributed).to(env.device)


def context_memory_share(model: RadianceModel) -> float:
    """Share of a grid sub-model's table entries held by its context tables (0 otherwise)."""
    if getattr(model, "focus", None) is None:
        return 0.0
    ctx = model.context_density.numel() + model.context_features.numel()
    return ctx / (ctx + model.density.numel() + model.features.numel())


__all__ = ["SSStrategy", "RegionModels", "RegionRayFilter", "estimate_density", "load_fused", "context_memory_share"]
