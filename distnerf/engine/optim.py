"""Adam with per-group learning rates and an exponential-decay schedule.

The schedule is a pure function of the step, so it needs no state of its own to
resume: ``lr(step) = base * decay ** (step / decay_steps)`` after a linear warm-up
(NeRF uses 5e-4 decayed by 0.1 over 250k steps).
"""
from __future__ import annotations

from typing import Mapping

import torch

from ..model.base import RadianceModel


def lr_factor(step: int, cfg: Mapping) -> float:
    """Multiplier of every group's base learning rate at ``step``."""
    warmup = int(cfg.get("warmup_steps", 0))
    factor = float(cfg.get("decay", 0.1)) ** (step / float(cfg.get("decay_steps", 250_000)))
    if warmup > 0 and step < warmup:
        factor *= (step + 1) / warmup
    return factor


def build_optimizer(model: RadianceModel, cfg: Mapping) -> torch.optim.Optimizer:
    """Adam over ``model.param_groups(cfg.lr)``; each group remembers its base lr."""
    groups = model.param_groups(float(cfg["lr"]))
    for g in groups:
        g["base_lr"] = g["lr"]
    kwargs = {"betas": tuple(cfg.get("betas", (0.9, 0.999))), "eps": float(cfg.get("eps", 1e-15))}
    if cfg.get("fused") and all(p.is_floating_point() for g in groups for p in g["params"]):
        kwargs["fused"] = True
    return torch.optim.Adam(groups, **kwargs)


def rebuild_optimizer(old: torch.optim.Optimizer, model: RadianceModel, cfg: Mapping) -> torch.optim.Optimizer:
    """A new optimizer for ``model`` after it replaced parameter tensors.

    State of parameters that still exist (same tensor object) is carried over;
    replaced tensors start with fresh Adam moments.
    """
    new = build_optimizer(model, cfg)
    for group in new.param_groups:
        for p in group["params"]:
            if p in old.state:
                new.state[p] = old.state[p]
    for g_new, g_old in zip(new.param_groups, old.param_groups):
        g_new["lr"] = g_old["lr"]
    return new


def set_lr(optimizer: torch.optim.Optimizer, step: int, cfg: Mapping) -> float:
    """Apply the schedule for ``step``; returns the factor."""
    factor = lr_factor(step, cfg)
    for g in optimizer.param_groups:
        g["lr"] = g["base_lr"] * factor
    return factor
