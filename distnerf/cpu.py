"""The CPU threads of a rank: how many compute threads it runs, and how they wait.

A rank's intra-op threads (torch's OpenMP pool) split every operator evenly and meet at a barrier
after it, so one thread pre-empted by another process stalls the whole operator. torch's default
takes one thread per CPU the machine has, not per CPU this process may use, nor shared with the
other ranks of its node; and libgomp's threads spin at each barrier before they sleep
(``OMP_WAIT_POLICY`` unset: up to ``GOMP_SPINCOUNT`` 300,000 iterations), taking from a process
beside them the time their own stalled thread needs. Measured: ``bench/reliability/README.md``
§"Runs that share their cores" (``python -m bench.reliability.shared_cores``).

:func:`passive_wait` (before torch is imported) makes the OpenMP threads sleep at their barriers;
:func:`configure` (once at start-up) sets the thread count: ``num_threads`` from the config, else
``OMP_NUM_THREADS`` when the user set it, else :func:`usable_cores` shared among the node's local
ranks (:func:`threads_per_rank`), and warns when the load average leaves fewer free cores than that.

This module imports no torch at import time, so that an entry point can call :func:`passive_wait`
before torch loads its OpenMP runtime (which reads ``OMP_WAIT_POLICY`` once, when it loads).
"""
from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP = Path("/sys/fs/cgroup")


def passive_wait(environ=None) -> bool:
    """Make OpenMP threads sleep, not spin, while they wait (``OMP_WAIT_POLICY=PASSIVE``), unless the
    user set ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``. Takes effect only when called before torch is
    imported (the runtime reads the variable when it loads). Returns whether the policy was set here."""
    environ = os.environ if environ is None else environ
    if "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ or "torch" in sys.modules:
        return False
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


def cgroup_cpu_limit(root: Path = CGROUP) -> float | None:
    """The CPU quota of this process's cgroup in cores (``quota / period``), or None when unlimited or
    unreadable. cgroup v2: ``ROOT/cpu.max`` (``"200000 100000"``, ``"max 100000"``); cgroup v1:
    ``ROOT/cpu/cpu.cfs_quota_us`` (-1: none) over ``cpu.cfs_period_us``."""
    try:
        v2 = root / "cpu.max"
        if v2.exists():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        for sub in ("cpu", "cpu,cpuacct"):
            q = root / sub / "cpu.cfs_quota_us"
            if q.exists():
                quota = int(q.read_text())
                return None if quota <= 0 else quota / int((root / sub / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None


def usable_cores(affinity: set[int] | None = None, quota: float | None = None) -> int:
    """The cores this process may use: its CPU affinity (``os.sched_getaffinity``, e.g. Slurm's
    ``--cpus-per-task`` binding or ``taskset``) capped by the cgroup quota (:func:`cgroup_cpu_limit`,
    e.g. a container's ``--cpus``), rounded down, at least 1. Arguments override what is read."""
    if affinity is None:
        affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
        quota = cgroup_cpu_limit() if quota is None else quota
    cores = len(affinity)
    if quota is not None:
        cores = min(cores, math.floor(quota))
    return max(1, cores)


def threads_per_rank(cores: int, local_world_size: int) -> int:
    """Intra-op threads of each of ``local_world_size`` ranks sharing ``cores``: an equal share,
    rounded down, at least 1. Sampler workers are not counted: they run one thread each and sleep
    on their pipe between batches (input was 0.6% of a step's time in the README main job)."""
    if cores < 1 or local_world_size < 1:
        raise ValueError(f"cores={cores} and local_world_size={local_world_size} must be >= 1")
    return max(1, cores // local_world_size)


@dataclass
class ThreadPlan:
    """What :func:`configure` chose."""

    threads: int          # intra-op threads of this rank (torch.set_num_threads)
    source: str           # "config num_threads", "OMP_NUM_THREADS", or "cores / local ranks"
    cores: int            # usable_cores()
    local_world_size: int
    wait_policy: str      # OMP_WAIT_POLICY as the runtime read it ("(unset)": libgomp spins first)
    load: float           # 1-minute load average at start-up

    def describe(self) -> str:
        return (f"{self.threads} compute thread(s) per rank ({self.source}; {self.cores} usable core(s), "
                f"{self.local_world_size} local rank(s)); OMP_WAIT_POLICY={self.wait_policy}; "
                f"load average {self.load:.2f}")


def configure(num_threads: int | None, local_world_size: int, environ=None, warn: bool = True) -> ThreadPlan:
    """Set this rank's intra-op thread count (``torch.set_num_threads``) once at start-up, and warn
    when the 1-minute load average leaves fewer free cores than the node's ranks' threads.

    Args:
        num_threads: the config's ``num_threads`` (wins), or None.
        local_world_size: ranks of this node (torchrun's ``LOCAL_WORLD_SIZE``; 1 alone).
        environ: the environment (default ``os.environ``): ``OMP_NUM_THREADS``, ``OMP_WAIT_POLICY``.
        warn: log the load warning (the entry point passes it for one rank per node).
    Raises:
        ValueError: ``OMP_NUM_THREADS`` is not a positive integer (named with its value).
    """
    import torch

    environ = os.environ if environ is None else environ
    cores = usable_cores()
    if num_threads is not None:
        threads, source = num_threads, "config num_threads"
    elif environ.get("OMP_NUM_THREADS"):
        value = environ["OMP_NUM_THREADS"]
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"OMP_NUM_THREADS={value!r}: a positive integer (the compute threads of each rank)")
        threads, source = int(value), "OMP_NUM_THREADS"
    else:
        threads, source = threads_per_rank(cores, local_world_size), "cores / local ranks"
    torch.set_num_threads(threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    plan = ThreadPlan(threads, source, cores, local_world_size, environ.get("OMP_WAIT_POLICY", "(unset)"), load)
    free = cores - load
    if warn and free < threads * local_world_size:
        log.warning("the load average (%.1f over the last minute) leaves about %.1f of %d usable cores free, "
                    "fewer than this node's %d rank(s) x %d compute threads: other processes share these cores "
                    "and steps will be slower (set num_threads=N or OMP_NUM_THREADS to fewer threads)",
                    load, max(free, 0.0), cores, local_world_size, threads)
    return plan
