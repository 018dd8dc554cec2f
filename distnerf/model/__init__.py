"""Radiance models: rays in, pixels out. No distributed code lives here."""
from __future__ import annotations

from typing import Mapping

import torch

from ..config_check import section
from .base import RadianceModel
from .budget import fit_budget
from .grid import GridModel
from .nerf import NeRFModel
from .ngp import NGPModel

MODELS = {"grid": GridModel, "nerf": NeRFModel, "ngp": NGPModel}


def build_model(cfg: Mapping, aabb: torch.Tensor, background: torch.Tensor, *, focus: tuple | None = None,
                **extra) -> RadianceModel:
    """The model named ``cfg['name']``, built from its validated config.

    Args:
        cfg: model config (``conf/model/*.yaml``; keys and defaults: :mod:`distnerf.schema`).
            ``compile`` / ``compile_mode`` say how the model runs (the trainer handles them).
        aabb: (2, 3) float32 scene box. background: (3,) float32 RGB.
        focus: ``(focus_aabb, context_resolution)``, a sub-scene to hold at full resolution
            inside the scene box (``ss``'s independent sub-models), taken by a model that
            :attr:`~distnerf.model.base.RadianceModel.holds_focus` and ignored by the others
            (they cover the whole box alike); None: no focus.
        extra: constructor arguments that are not config keys (``num_images``: training
            images, the rows of a ``model.appearance`` table, 0 when a checkpoint's table is
            loaded into the model).

    With ``model.max_params`` the tables are sized to that budget (:mod:`.budget`) and
    the model's ``budget`` attribute holds what was derived.

    Raises:
        ValueError: unknown model name, unknown key or a bad value (naming it).
    """
    cfg = section("model", cfg)
    if focus is not None and MODELS[cfg.name].holds_focus:
        extra = {**extra, "focus_aabb": focus[0], "context_resolution": focus[1]}
    if cfg.max_params is None:
        return MODELS[cfg.name](aabb, background, cfg, **extra)
    cfg, sized, report = fit_budget(MODELS[cfg.name], cfg, aabb, background, extra)  # model.max_params
    model = MODELS[cfg.name](aabb, background, cfg, **sized, **extra)
    model.budget = report  # what max_params derived (the trainer logs it)
    return model


def contracted(cfg: Mapping) -> bool:
    """Whether a model config contracts unbounded space (``model.contraction`` of ``grid`` and
    ``ngp``; ``nerf`` has no such key and is bounded)."""
    return "contraction" in cfg and cfg["contraction"] != "none"
