"""Training strategies: everything distributed lives here (and in the ``distributed`` package)."""
from __future__ import annotations

from typing import Mapping

from ..distributed import DistEnv
from ..config_check import section
from .base import Strategy
from .ddp import DDPStrategy
from .ss import SSStrategy

STRATEGIES = {"ddp": DDPStrategy, "ss": SSStrategy}


def build_strategy(cfg: Mapping, env: DistEnv) -> Strategy:
    """The strategy named ``cfg['name']`` (keys and defaults: :mod:`distnerf.schema`).

    Raises:
        ValueError: an unknown name, key or value (naming it).
    """
    cfg = section("strategy", cfg)
    return STRATEGIES[cfg.name](cfg, env)
