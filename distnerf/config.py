"""Config validation, the run directory and logging set-up (every rank composes
the config itself; the run directory is chosen once and shared)."""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from . import dist as D

REQUIRED_POSITIVE = ("train.global_rays", "train.max_steps", "eval.chunk")


def validate(cfg: DictConfig) -> None:
    """Raise ValueError naming the key for missing or nonsensical settings."""
    for key in REQUIRED_POSITIVE:
        value = OmegaConf.select(cfg, key)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"config {key} must be a positive integer, got {value!r}")
    if cfg.dataset.name in ("blender", "llff") and OmegaConf.is_missing(cfg.dataset, "root"):
        raise ValueError(f"dataset={cfg.dataset.name} needs dataset.root=PATH")
    if cfg.get("device") not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {cfg.get('device')!r}")


def resolve_run_dir(cfg: DictConfig, env: D.DistEnv) -> Path:
    """``cfg.run_dir`` if given, else ``runs/<timestamp>`` picked by rank 0 and broadcast
    (never a per-rank ``${now:}``). Pass ``run_dir=`` explicitly to resume or restart."""
    chosen = cfg.get("run_dir")
    if not chosen:
        chosen = D.broadcast_object(env, f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
    path = Path(chosen).resolve()
    if env.is_main:
        path.mkdir(parents=True, exist_ok=True)
    D.barrier(env)
    return path


def setup_logging(env: D.DistEnv, run_dir: Path | None, level: str = "INFO", log_name: str = "train.log") -> None:
    """Rank 0: console at ``level`` plus ``RUN/<log_name>``; other ranks: warnings and
    errors on the console, prefixed with the rank."""
    root = logging.getLogger("distnerf")
    root.handlers.clear()
    root.propagate = False
    fmt = logging.Formatter(f"%(asctime)s [rank {env.rank}] %(levelname)s %(message)s", "%H:%M:%S")
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(fmt)
    console.setLevel(level if env.is_main else logging.WARNING)
    root.addHandler(console)
    root.setLevel(level)
    if env.is_main and run_dir is not None:
        fh = logging.FileHandler(Path(run_dir) / log_name)
        fh.setFormatter(fmt)
        root.addHandler(fh)
