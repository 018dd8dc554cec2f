"""The run directory and logging set-up (every rank composes the config itself; the run
directory is chosen once and shared). The config's keys, defaults and checks: :mod:`distnerf.schema`."""
from __future__ import annotations

import fcntl
import logging
import os
import socket
import sys
import time
from pathlib import Path

from omegaconf import DictConfig

from . import distributed as D


LOCK_NAME = ".train.lock"  # in the run directory: flock-ed by the main rank of the run that trains there
_held: dict[Path, int] = {}  # run directory -> the open, locked file descriptor of this process


class RunDirBusy(RuntimeError):
    """Another live process trains in this run directory (the message names it)."""


def claim_run_dir(path: Path) -> str | None:
    """Take the run directory's lock (``RUN/.train.lock``, an exclusive ``flock``) for this process
    and write who holds it into the file; None when taken, else the holder's description.

    The kernel drops a ``flock`` when its process dies, so a directory left by a killed run is
    free again (the stale text in the file is overwritten): never mistaken for a live run.
    """
    fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 4096).decode(errors="replace").strip()
        os.close(fd)
        return holder or "a process that has not written its name yet"
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}: "
                 f"{' '.join(sys.argv)}\n".encode())
    _held[path] = fd
    return None


def release_run_dir(path: Path) -> None:
    """Drop this process's lock of ``path`` (also dropped when the process exits)."""
    fd = _held.pop(Path(path), None)
    if fd is not None:
        os.close(fd)


def resolve_run_dir(cfg: DictConfig, env: D.DistEnv) -> Path:
    """``cfg.run_dir`` if given, else ``runs/<timestamp>`` picked by rank 0 and broadcast
    (never a per-rank ``${now:}``), claimed by rank 0 for this run (:func:`claim_run_dir`).
    Pass ``run_dir=`` explicitly to resume or restart.

    Raises:
        RunDirBusy (on every rank): another live run trains in the directory; the message names its
            process, host, start time and command line.
    """
    chosen = cfg.run_dir
    if not chosen:
        chosen = D.broadcast_object(env, f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
    path = Path(chosen).resolve()
    busy = None
    if env.is_main:
        path.mkdir(parents=True, exist_ok=True)
        holder = claim_run_dir(path)
        if holder is not None:
            busy = (f"run directory {path} is in use by another run ({holder}; lock {path / LOCK_NAME}): wait for it, "
                    "stop it, or choose another run_dir")
    busy = D.broadcast_object(env, busy)  # every rank learns it (and waits for the directory)
    if busy:
        raise RunDirBusy(busy)
    return path


def setup_logging(env: D.DistEnv, run_dir: Path | None, level: str = "INFO", log_name: str = "train.log") -> None:
    """Rank 0: console at ``level`` plus ``RUN/<log_name>``; other ranks: warnings and
    errors on the console, prefixed with the rank, and the records logged with
    ``extra={"every_rank": True}`` (work that one rank does for all, e.g. building the pixel cache: its
    progress must show whichever rank builds)."""
    root = logging.getLogger("distnerf")
    root.handlers.clear()
    root.propagate = False
    fmt = logging.Formatter(f"%(asctime)s [rank {env.rank}] %(levelname)s %(message)s", "%H:%M:%S")
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(fmt)
    console.setLevel(level)
    if not env.is_main:
        console.addFilter(lambda r: r.levelno >= logging.WARNING or getattr(r, "every_rank", False))
    root.addHandler(console)
    root.setLevel(level)
    if env.is_main and run_dir is not None:
        fh = logging.FileHandler(Path(run_dir) / log_name)
        fh.setFormatter(fmt)
        root.addHandler(fh)
