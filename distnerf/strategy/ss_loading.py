"""Fused loading: the inference model of a committed ``ss`` checkpoint (every region's
sub-model on one process, or each rank's own regions under torchrun)."""
from __future__ import annotations

from pathlib import Path

import torch

from .. import checkpoint as ckpt
from .. import distributed as D
from .fusion import FusedRenderer
from .partition import Partition, region_owner
from .regions import JointRegionModels
from .ss import SSStrategy, read_shared


def region_states(ckpt_dir: Path):
    """``state(k)``: region ``k``'s sub-model state dict from a committed ``ss`` checkpoint."""
    return lambda k: ckpt.load_file(Path(ckpt_dir) / ckpt.region_file(k))["model"]


def shared_state(ckpt_dir: Path) -> dict | None:
    """The sharded joint model's shared appearance state from a committed ``ss`` checkpoint (region 0's file),
    or None (a checkpoint of per-region sub-models)."""
    shared = read_shared(ckpt_dir)
    return None if shared is None else shared["model"]


def load_fused(partition_dict: dict, state, model_cfg: dict, strategy_cfg, aabb, background, fusion: str,
               env: "D.DistEnv", shared: dict | None = None) -> FusedRenderer:
    """A fused renderer of an ``ss`` run's sub-models.

    One process: every region's sub-model is loaded (one after another) and fused.
    Under torchrun (``env.distributed``): each rank loads the regions it owns at the
    current world size and ``segment`` fusion runs across ranks.

    Args:
        partition_dict: the run's partition (``manifest["partition"]``, or an export's).
        state: ``state(k)`` -> region ``k``'s state dict (:func:`region_states`, or an export's table).
        model_cfg, strategy_cfg: the run's ``model`` and ``strategy`` configs.
        aabb, background: the scene's (2, 3) box and (3,) RGB background.
        fusion: ``segment`` or ``blend``.
        shared: the sharded joint model's appearance state (:func:`shared_state`), or None.
    Raises:
        ValueError: a world size that does not divide the number of regions, or blend across ranks.
    """
    partition = Partition.from_dict(partition_dict)
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
        sub.load_state_dict(state(k))
        models[k] = sub.to(env.device).eval()
    if strategy.joint:  # the same segments and compositing as training
        appearance = strategy.shared_appearance(model_cfg, 0)
        if appearance is not None:
            if shared is None:
                raise ValueError("a sharded joint ss run's appearance table was not found (region 0's file holds "
                                 "it under 'shared'): render it with its checkpoint, or strategy.joint_model=per_region")
            appearance.load_state_dict(shared)
        return JointRegionModels(models, partition, torch.as_tensor(background).float(),
                                 env, appearance=appearance).to(env.device).eval()
    return strategy.fuse(models, fusion).to(env.device)
