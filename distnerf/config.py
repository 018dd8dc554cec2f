"""The run directory and logging set-up (every rank composes the config itself; the run
directory is chosen once and shared). The config's keys, defaults and checks: :mod:`distnerf.schema`."""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from omegaconf import DictConfig

from . import dist as D


def resolve_run_dir(cfg: DictConfig, env: D.DistEnv) -> Path:
    """``cfg.run_dir`` if given, else ``runs/<timestamp>`` picked by rank 0 and broadcast
    (never a per-rank ``${now:}``). Pass ``run_dir=`` explicitly to resume or restart."""
    chosen = cfg.run_dir
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
