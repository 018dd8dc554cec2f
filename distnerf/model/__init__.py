"""Radiance models: rays in, pixels out. No distributed code lives here."""
from __future__ import annotations

from typing import Mapping

import torch

from .base import RadianceModel
from .grid import GridModel
from .nerf import NeRFModel
from .ngp import NGPModel

MODELS = {"grid": GridModel, "nerf": NeRFModel, "ngp": NGPModel}
# how the model runs, not what it is: handled by the trainer (torch.compile), never constructor arguments
RUNTIME_KEYS = ("compile", "compile_mode")


def build_model(cfg: Mapping, aabb: torch.Tensor, background: torch.Tensor) -> RadianceModel:
    """Instantiate ``cfg['name']`` with the remaining keys as keyword arguments.

    Args:
        cfg: model config (``conf/model/*.yaml``).
        aabb: (2, 3) float32 scene box. background: (3,) float32 RGB.
    Raises:
        ValueError: unknown model name or unknown option.
    """
    cfg = {k: v for k, v in cfg.items() if k not in RUNTIME_KEYS}
    name = cfg.pop("name")
    if name not in MODELS:
        raise ValueError(f"model.name={name!r} is not one of {sorted(MODELS)}")
    try:
        return MODELS[name](aabb, background, **cfg)
    except TypeError as err:
        raise ValueError(f"bad option in model config {cfg}: {err}") from err
