"""Workers and reference of the joint-training exactness test (float64, gloo)."""
from __future__ import annotations

import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from distnerf.distributed import DistEnv
from distnerf.model.grid import GridModel
from distnerf.strategy.partition import region_owner
from distnerf.strategy.partition import grid_partition
from tests.dist.workers import make_problem, set_env

AABB = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
BG = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)
COUNTS = {2: [2, 1, 1], 4: [2, 2, 1]}
JITTER_SEED = 1234  # seed of the step's generator: the per-ray jitter u is its first draw


def region_models(num_regions: int, regions: list[int]) -> dict:
    """Sub-models of ``regions`` with random tables (identical wherever they are built)."""
    part = grid_partition(AABB, num_regions, COUNTS[num_regions])
    models = {}
    for k in regions:
        torch.manual_seed(100 + k)
        # default colour threshold (1e-3) and termination (1e-4): the reference applies them per segment
        m = GridModel(part.boxes[k].float(), torch.zeros(3), resolutions=[8], upsample_steps=[], color="sh",
                      tighten_aabb=False, train_termination=True).double()  # the cut in training (opt-in)
        with torch.no_grad():
            m.density.copy_(torch.randn_like(m.density) * 3.0 + 9.0)  # dense enough for termination to cut
            m.features.copy_(torch.randn_like(m.features))
            m.occupancy.binary.copy_(torch.rand(m.occupancy.binary.shape) > 0.2)
        models[k] = m
    return part, models


def joint_worker(rank: int, world_size: int, port: int, num_regions: int, out_dir: str, routed: bool = False) -> None:
    """Gathered: every rank renders all 48 rays. Routed (``strategy.joint_exchange=route``): rank r owns rays
    [24 r, 24 r + 24) and draws their jitter as the reference's draws (the generator advanced past the
    rays before them); its loss is its rays' share of the 48-ray mean (the strategy's divisor W B)."""
    try:
        from distnerf.strategy.regions import JointRegionModels

        set_env(rank, world_size, port)
        dist.init_process_group("gloo")
        owners = region_owner(num_regions, world_size)
        part, models = region_models(num_regions, [k for k, r in enumerate(owners) if r == rank])
        joint = JointRegionModels(models, part, BG, DistEnv(rank=rank, world_size=world_size, backend="gloo"),
                                  routed=routed)
        rays, target = make_problem(48, seed=3)
        generator = torch.Generator().manual_seed(JITTER_SEED)
        if routed:
            per = len(target) // world_size
            torch.rand(rank * per, generator=generator, dtype=torch.float64)  # the jitter of the rays before
            mine = slice(rank * per, (rank + 1) * per)
            rays, target = rays.map(lambda t: t[mine]), target[mine]
        out = joint(rays, generator)
        # the photometric loss of components/loss.py, kept in float64 here (it casts to float32)
        loss = ((out["rgb"] - target) ** 2).mean(dim=-1).sum() / (len(target) * (world_size if routed else 1))
        loss.backward()
        torch.save({"loss": loss.detach(), "rgb": out["rgb"].detach(),
                    "grads": {k: {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
                              for k, m in models.items()}}, Path(out_dir) / f"rank_{rank}.pt")
        dist.destroy_process_group()
    except Exception:
        traceback.print_exc()
        raise
