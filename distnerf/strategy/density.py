"""The coarse density fit behind ``strategy.partition=balanced``: a short voxel-grid
training run, the same optimisation step as the trainer's (:func:`~distnerf.components.step_path.build_step`),
on one process before the partition is broadcast."""
from __future__ import annotations

import dataclasses

import torch

from ..components.step_path import build_step
from ..model import build_model
from ..sampler import build_sampler
from ..config_check import section
from ..schema import GridModelConfig, OptimConfig, StepConfig, TrainLoopConfig


def estimate_density(scene, model_cfg: dict, steps: int, resolution: int, rays_per_step: int, seed: int,
                     device, at: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A coarse density estimate for the balanced partition: a short ``grid`` fit.

    Trains a ``resolution``^3 voxel grid for ``steps`` steps (sync sampler, Adam at a constant
    lr of 1e-3; the run's model settings that a grid also takes) and
    returns its opacities (one marching step) at its occupancy-cell centres or at ``at``.

    Args:
        at: (P, 3) float points to evaluate the fit at, or None: the M^3 cell centres.
    Returns:
        points: (P, 3) or (M^3, 3) float32; weights: the same count, float32 opacity in [0, 1].
    """
    grid_keys = {f.name for f in dataclasses.fields(GridModelConfig)}  # the run's settings a grid also takes
    cfg = {**{k: v for k, v in dict(model_cfg).items() if k in grid_keys}, "name": "grid",
           "resolutions": [resolution], "upsample_steps": [], "max_params": None}
    model = build_model(cfg, scene.aabb, scene.background, num_images=len(scene)).to(device)
    optim = section(OptimConfig, lr=1e-3, decay=1.0, fused=False)  # a constant learning rate (decay 1)
    train_step = build_step(model, section(StepConfig), device, optim_cfg=optim, train_cfg=section(TrainLoopConfig))
    sampler = build_sampler({"name": "sync"}, scene, rays_per_step, seed, 1 << 20, device)
    sampler.start(0)
    for step in range(steps):
        train_step.prepare(step)
        batch = sampler.to_device(sampler.host_batch(step))
        _, error = train_step.forward(model, batch)
        train_step.update(error.sse / max(int(batch.valid.sum()), 1))
    sampler.close()
    with torch.no_grad():
        points = model.occupancy.cell_centers() if at is None else at.to(device, torch.float32)
        alpha = torch.cat([1.0 - torch.exp(-model.field_density(p) * model.step_size()) for p in points.split(65536)])
    return points.cpu(), alpha.cpu()
