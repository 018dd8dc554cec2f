"""The CPU threads of a rank: how many compute threads it runs, and how they wait.

A rank's intra-op threads (torch's OpenMP pool) split every operator evenly and meet at a barrier
after it, so one thread pre-empted by another process stalls the whole operator. torch's default
takes one thread per CPU the machine has, not per CPU this process may use, nor shared with the
other ranks of its node; and libgomp's threads spin at each barrier before they sleep
(``OMP_WAIT_POLICY`` unset: up to ``GOMP_SPINCOUNT`` 300,000 iterations), taking from a process
beside them the time their own stalled thread needs; sleeping at every barrier instead costs a rank
whose cores are its own about 16% of its step (each operator wakes the threads again). Measured:
``bench/reliability/README.md`` §"Runs that share their cores" (``python -m bench.reliability.shared_cores``)
and ``bench/quality/main_job.md`` §"The CPU loop's speed".

:func:`choose_wait` (before torch is imported) lets the OpenMP threads spin a bounded while when the
node's cores are free at start-up and sleep at their barriers when other processes keep them busy;
:func:`configure` (once at start-up) sets the thread count: ``num_threads`` from the config, else
``OMP_NUM_THREADS`` when the user set it, else :func:`usable_cores` shared among the node's local
ranks (:func:`threads_per_rank`), and warns when the load average leaves fewer free cores than that.

This module imports no torch at import time, so that an entry point can call :func:`choose_wait`
before torch loads its OpenMP runtime (which reads ``OMP_WAIT_POLICY`` and ``GOMP_SPINCOUNT`` once, when
it loads).
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP = Path("/sys/fs/cgroup")


SPIN_COUNT = 30_000
"""``GOMP_SPINCOUNT`` of a rank whose cores are free at start-up: its threads spin about this many times at a
barrier, then sleep. Measured (``bench/quality/main_job.md``, "The CPU loop's speed"; ``bench/reliability/README.md``,
"The OpenMP wait"): the README main job 16% faster than passive waiting, and faster than before passive
waiting was introduced; 2.5-2.7x slower than alone when an un-niced process arrives on its cores later."""
FREE_CORES_SLACK = 0.5
"""Busy cores of other processes (beyond one per sibling rank starting beside this one) that still count as free."""


def _cpu_ticks(stat: Path = Path("/proc/stat")) -> tuple[int, int] | None:
    """(all, idle) ticks of the machine's CPUs so far, from ``/proc/stat``'s ``cpu`` line (iowait counted
    idle); None where unreadable (not Linux)."""
    try:
        fields = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:]]
    return sum(ticks), ticks[3] + (ticks[4] if len(ticks) > 4 else 0)


def busy_cores(interval_s: float = 0.1, stat: Path = Path("/proc/stat")) -> float | None:
    """Cores the machine's processes kept busy over the next ``interval_s`` seconds (this process sleeps
    meanwhile, so they are the others'): ``(1 - idle share) x online CPUs`` from two reads of
    ``/proc/stat``'s ``cpu`` line (idle and iowait counted idle). None where unreadable (not Linux)."""
    import time

    first = _cpu_ticks(stat)
    if first is None:
        return None
    time.sleep(interval_s)
    second = _cpu_ticks(stat)
    total, idle = second[0] - first[0], second[1] - first[1]
    if total <= 0:
        return None
    return (1.0 - idle / total) * (os.cpu_count() or 1)


def choose_wait(environ=None, busy: float | None = None) -> str:
    """Choose how OpenMP threads wait at a barrier, before torch loads its OpenMP runtime (which reads
    ``OMP_WAIT_POLICY`` and ``GOMP_SPINCOUNT`` once, when it loads):

    - a user's ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is kept (``"user"``);
    - cores free at start-up (other processes keep at most ``FREE_CORES_SLACK`` cores busy beyond one per
      sibling rank of this node, ``LOCAL_WORLD_SIZE``): a bounded spin, ``GOMP_SPINCOUNT=SPIN_COUNT``
      (``"spin"``): the threads stay awake between the step's back-to-back operators;
    - cores busy (or unreadable): ``OMP_WAIT_POLICY=PASSIVE`` (``"passive"``): the threads sleep at every
      barrier, so they do not take the time a stalled thread needs from the processes beside them
      (``bench/reliability/README.md``, "Runs that share their cores").

    A process that arrives on the cores after the choice meets a spinning rank: on a shared machine set
    ``OMP_WAIT_POLICY=PASSIVE``. Returns ``"user"``, ``"spin"``, ``"passive"``, or ``"late"`` when torch
    is already imported (nothing set: too late to take effect).

    Args:
        environ: the environment to read and set (default ``os.environ``).
        busy: busy cores of other processes (default :func:`busy_cores`, a 0.1 s sample: 10 ticks of a busy core).
    """
    environ = os.environ if environ is None else environ
    if "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return "user"
    if "torch" in sys.modules:
        return "late"
    busy = busy_cores() if busy is None else busy
    siblings = max(0, int(environ.get("LOCAL_WORLD_SIZE") or 1) - 1)  # ranks of this node starting meanwhile
    if busy is not None and busy <= siblings + FREE_CORES_SLACK:
        environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
        return "spin"
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return "passive"


def _tree_ticks(pids) -> int:
    """CPU ticks (user + system, ``USER_HZ``) the processes ``pids`` have used, from ``/proc/PID/stat``
    (fields 14 and 15, counted after the command's closing parenthesis); a process gone counts 0."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += int(fields[11]) + int(fields[12])
    return total


def process_tree(root: int) -> set[int]:
    """``root`` and its descendants (``/proc/*/stat``'s parent pids): a rank, its sampler workers and, with
    the torchrun agent as ``root``, the node's other ranks."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, []))
    return tree


class CoreWatch:
    """Fewer compute threads while another process shares the rank's cores, the planned number again once
    they are free: the guard of the bounded spin (:func:`choose_wait`). Spinning threads beside a process
    that arrives after start-up wait for a thread the scheduler gave away: the README main job trained 3.7x
    slower beside one CPU-bound process (``bench/reliability/README.md``, "Runs that share their cores"). With
    one thread fewer per busy core, no thread waits at a barrier for a core it does not get.

    Call :meth:`poll` between steps, in the thread that runs them (``torch.set_num_threads`` sets the calling
    thread's OpenMP team size): at most every ``period_s`` it reads the busy ticks of ``/proc/stat`` and
    those of this run's processes (:func:`process_tree` of ``root``, rescanned every ``rescan_s``), and
    counts the other processes' busy cores over the interval since the last reading (an interval over four
    periods, a pause between steps, only starts a new one). Above ``busy_above`` cores: ``threads - ceil(busy - slack)``
    threads (at least 1); below ``free_below`` for ``restore_after_s``: ``threads`` again.

    Args:
        threads: the planned compute threads (:func:`configure`); with 1 nothing is watched.
        root: the process whose tree is this run's own (the torchrun agent under torchrun, else this one).
    """

    def __init__(self, threads: int, root: int, period_s: float = 0.5, rescan_s: float = 10.0,
                 busy_above: float = 0.6, free_below: float = 0.3, restore_after_s: float = 1.0):
        self.threads, self.current, self.root = int(threads), int(threads), root
        self.period_s, self.rescan_s = period_s, rescan_s
        self.busy_above, self.free_below, self.restore_after_s = busy_above, free_below, restore_after_s
        self.changes, self.others = 0, 0.0
        self._tree, self._scanned, self._last, self._free_since = set(), -1e9, None, None

    def _sample(self, now: float) -> tuple[int, int, int] | None:
        if now - self._scanned >= self.rescan_s:
            self._tree, self._scanned = process_tree(self.root), now
        ticks = _cpu_ticks()
        if ticks is None:
            return None
        return ticks[0], ticks[0] - ticks[1], _tree_ticks(self._tree)

    @contextlib.contextmanager
    def phase_hook(self, name: str):
        """A trainer phase hook (``Trainer.phase_hooks``): :meth:`poll` when the ``after_step`` phase ends (between
        steps, outside the step's time, in the loop's thread)."""
        yield
        if name == "after_step":
            self.poll()

    def poll(self, now: float | None = None) -> int | None:
        """Between steps: the new thread count when it changed (already set), else None."""
        import time

        import torch

        if self.threads <= 1:
            return None
        now = time.monotonic() if now is None else now
        if self._last is not None and now - self._last[0] < self.period_s:
            return None
        sample = self._sample(now)
        if sample is None:
            return None
        last, self._last = self._last, (now, *sample)
        if last is None or now - last[0] > 4 * self.period_s:  # a pause (evaluation, a checkpoint): a new baseline
            return None
        total, busy, own = (a - b for a, b in zip(sample, last[1:]))
        if total <= 0:
            return None
        self.others = max(0.0, (busy - own) / (total / (os.cpu_count() or 1)))
        want = self.current
        if self.others > self.busy_above:
            want, self._free_since = max(1, self.threads - math.ceil(self.others - self.free_below)), None
        elif self.others < self.free_below:
            self._free_since = now if self._free_since is None else self._free_since
            if now - self._free_since >= self.restore_after_s:
                want = self.threads
        else:  # between the two bounds: neither taken away nor free yet
            self._free_since = None
        if want == self.current:
            return None
        torch.set_num_threads(want)
        log.info("%s: %d compute thread(s) (other processes kept %.1f core(s) busy)",
                 "cores shared" if want < self.threads else "cores free again", want, self.others)
        self.current, self.changes = want, self.changes + 1
        return want


def wait_setting(environ=None) -> str:
    """The OpenMP wait as the runtime read it, for the log: ``OMP_WAIT_POLICY`` and ``GOMP_SPINCOUNT``
    ("(unset)": libgomp's own, about 300,000 spins before it sleeps)."""
    environ = os.environ if environ is None else environ
    parts = [f"{k}={environ[k]}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in environ]
    return " ".join(parts) or "OMP_WAIT_POLICY (unset)"


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
    wait_policy: str      # the OpenMP wait as the runtime read it (wait_setting)
    load: float           # 1-minute load average at start-up

    def describe(self) -> str:
        return (f"{self.threads} compute thread(s) per rank ({self.source}; {self.cores} usable core(s), "
                f"{self.local_world_size} local rank(s)); OpenMP wait {self.wait_policy}; "
                f"load average {self.load:.2f}")


def configure(num_threads: int | None, local_world_size: int, environ=None, warn: bool = True) -> ThreadPlan:
    """Set this rank's intra-op thread count (``torch.set_num_threads``) once at start-up, and warn
    when the 1-minute load average leaves fewer free cores than the node's ranks' threads.

    Args:
        num_threads: the config's ``num_threads`` (wins), or None.
        local_world_size: ranks of this node (torchrun's ``LOCAL_WORLD_SIZE``; 1 alone).
        environ: the environment (default ``os.environ``): ``OMP_NUM_THREADS``, the OpenMP wait.
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
    plan = ThreadPlan(threads, source, cores, local_world_size, wait_setting(environ), load)
    free = cores - load
    if warn and free < threads * local_world_size:
        log.warning("the load average (%.1f over the last minute) leaves about %.1f of %d usable cores free, "
                    "fewer than this node's %d rank(s) x %d compute threads: other processes share these cores "
                    "and steps will be slower (set num_threads=N or OMP_NUM_THREADS to fewer threads)",
                    load, max(free, 0.0), cores, local_world_size, threads)
    return plan
