"""Training strategies: everything distributed lives here (and in ``dist.py``)."""
from __future__ import annotations

from typing import Mapping

from ..dist import DistEnv
from .base import Strategy
from .ddp import DDPStrategy
from .ss import SSStrategy

STRATEGIES = {"ddp": DDPStrategy, "ss": SSStrategy}


def build_strategy(cfg: Mapping, env: DistEnv) -> Strategy:
    """The strategy named ``cfg['name']``. Raises ValueError for an unknown name."""
    name = cfg["name"]
    if name not in STRATEGIES:
        raise ValueError(f"strategy.name={name!r} is not one of {sorted(STRATEGIES)}")
    return STRATEGIES[name](cfg, env)
