"""The process group: this process's rank, world size and device (:class:`DistEnv`), joining
the group under torchrun (:func:`init_distributed`), the end of set-up (:func:`end_setup`) and
the group's destruction (:func:`shutdown`).

Backends. On CPU the group is ``gloo``. On CUDA it is ``cpu:gloo,cuda:nccl``: CUDA tensors
(gradient buckets, ray segments, coarse weights) travel through NCCL, CPU tensors (the
per-step flags, pickled objects, barriers) through gloo. Why: the small host-side values
never need a device copy and a stream synchronisation to be exchanged, object collectives
do not allocate GPU memory, and ``monitored_barrier`` (gloo only) can name a late rank on
GPUs too (``host_group``). With ``dist_backend=gloo`` (:func:`init_distributed`'s ``backend``) the
group is ``gloo`` on CUDA too: gloo carries the CUDA tensors (its CUDA all-reduce and all-gather
stage them through pinned host memory), so several ranks may share one GPU, which NCCL refuses.
That is a check of the multi-rank code on CUDA tensors on a one-GPU machine, not a way to train:
the ranks contend for one device and every exchange crosses the host. A process started by ``torchrun`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``
set) joins a process group; a plain ``python -m`` process runs alone with no process group.
"""
from __future__ import annotations

import dataclasses
import datetime
import gc
import importlib
import logging
import os
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .compat import accepts

log = logging.getLogger(__name__)


@dataclass
class DistEnv:
    """Runtime facts of this process (passed to builders, never re-read from env)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None
    restart_count: int = 0  # torchrun's TORCHELASTIC_RESTART_COUNT: > 0 in a restarted worker group
    store: object = None  # the process group's key-value store (this attempt's prefix); None alone
    host_group: object = None  # a gloo group of all ranks (the default group itself on CPU): monitored barriers
    local_world_size: int = 1  # ranks on this node (torchrun's LOCAL_WORLD_SIZE): they share its cores

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    @property
    def has_peers(self) -> bool:
        """In a process group with another rank: the helpers below exchange only then (a
        world-size-1 torchrun is in a group, alone)."""
        return self.distributed and self.world_size > 1


def init_distributed(device: str, *, timeout_s: float, setup_timeout_s: float | None,
                     backend: str = "auto") -> DistEnv:
    """Join the process group when launched by torchrun.

    Args:
        device: ``"auto"`` (CUDA of the local rank if available, else CPU), ``"cpu"`` or ``"cuda"``
            (``device`` in ``conf/train.yaml``).
        backend: ``"auto"`` (``cpu:gloo,cuda:nccl`` on CUDA, ``gloo`` on the CPU) or ``"gloo"``
            (``dist_backend``): gloo for CUDA tensors too, the local ranks then sharing the visible
            GPUs round-robin (``LOCAL_RANK`` modulo their count); a check, not a way to train
            (module docstring). On the CPU both mean gloo.
        timeout_s: collective timeout (seconds), so that a lost or hung rank ends the job
            with an error instead of hanging (``dist_timeout_s`` in ``conf/train.yaml``).
        setup_timeout_s: the timeout of the rendezvous and of every collective until
            :func:`end_setup` (``dist_setup_timeout_s``): set-up (scene decoding, pixel cache,
            the balanced partition's fit) may take far longer on one rank than a step; None:
            ``timeout_s`` throughout.
    Raises:
        ValueError: ``device="cuda"`` requested without CUDA, ``device="auto"`` without CUDA in a
            Slurm job or a multi-process torchrun (:func:`resolve_device`), a timeout ``<= 0``, or
            an unknown ``backend``.
    """
    use_cuda = resolve_device(device, torch.cuda.is_available(), os.environ) == "cuda"
    if backend not in ("auto", "gloo"):
        raise ValueError(f"dist_backend must be auto or gloo, got {backend!r}")
    gloo_cuda = use_cuda and backend == "gloo"
    nccl = use_cuda and not gloo_cuda
    if timeout_s <= 0:
        raise ValueError(f"dist_timeout_s must be > 0 seconds, got {timeout_s}")
    if setup_timeout_s is not None and setup_timeout_s <= 0:
        raise ValueError(f"dist_setup_timeout_s must be > 0 seconds, got {setup_timeout_s}")
    if "RANK" not in os.environ:
        dev = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
        return DistEnv(device=dev)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    pg_backend = "cpu:gloo,cuda:nccl" if nccl else "gloo"
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"]) if "LOCAL_WORLD_SIZE" in os.environ else None
    if gloo_cuda:  # several ranks may share a GPU: gloo does not mind (a check, not a way to train)
        dev = torch.device("cuda", shared_cuda_index(local_rank))
        if rank == 0:
            log.warning("dist_backend=gloo on CUDA: gloo carries the CUDA tensors through the host and ranks may "
                        "share a GPU; a check of the multi-rank code, not a way to train (use dist_backend=auto)")
    elif use_cuda:
        dev = torch.device("cuda", cuda_index(local_rank, local_world_size=local_world_size))
    else:
        dev = torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    host_group = None
    if not dist.is_initialized():
        # DDP imports torch._dynamo on first use; imported after a group exists, it keeps ten
        # references to that group (torch 2.13, sys.getrefcount), so the group and its gloo threads
        # outlive destroy_process_group and can abort the interpreter's exit (see shutdown)
        importlib.import_module("torch._dynamo")
        timeout = datetime.timedelta(seconds=max(timeout_s, setup_timeout_s or 0.0))  # end_setup shortens it
        # torchrun keeps one rendezvous store for all restarts of a worker group: without a prefix per
        # attempt, a restarted rank can read the addresses the dead attempt's ranks published and fail to
        # connect ("Gloo connectFullMesh failed ... Connection refused")
        store, _, _ = next(dist.rendezvous("env://", timeout=timeout))
        store = dist.PrefixStore(f"distnerf/attempt_{restart_count}", store)
        # device_id binds NCCL's communicator to the device (eager init); gloo has none to bind
        bind = {"device_id": dev} if nccl and accepts(dist.init_process_group, "device_id") else {}
        dist.init_process_group(pg_backend, store=store, rank=rank, world_size=world_size, timeout=timeout, **bind)
        # monitored_barrier is gloo's: on CUDA a gloo group of the same ranks beside NCCL
        host_group = dist.new_group(backend="gloo", timeout=timeout) if nccl else dist.group.WORLD
        if nccl:
            _check_distinct_devices(dev, rank, host_group)
    else:
        store = None
    return DistEnv(rank, world_size, local_rank, dev, pg_backend, restart_count, store, host_group,
                   local_world_size or 1)


def resolve_device(device: str, cuda_available: bool, environ) -> str:
    """``"cuda"`` or ``"cpu"`` for the ``device`` setting (``auto``, ``cpu`` or ``cuda``).

    ``auto`` means CUDA when it is available, else the CPU, except where the CPU is almost surely
    not what was meant: in a Slurm job (``SLURM_JOB_ID`` set) or a multi-process torchrun
    (``WORLD_SIZE`` > 1), a job that sees no GPU has lost it (no ``--gpus-per-node``, a CUDA-less
    torch, a wrong ``CUDA_VISIBLE_DEVICES``), and training on with CPU ranks would only be
    noticed in its throughput. There ``device=cpu`` must be given.

    Args:
        device: the ``device`` setting.
        cuda_available: ``torch.cuda.is_available()``.
        environ: the process environment (``os.environ``).
    Raises:
        ValueError: ``cuda`` without CUDA; ``auto`` without CUDA in a Slurm job or a multi-process
            torchrun (the message says which and how to go on).
    """
    if device == "cpu":
        return "cpu"
    if cuda_available:
        return "cuda"
    if device == "cuda":
        raise ValueError("device=cuda requested but torch.cuda.is_available() is False")
    why = []
    if environ.get("SLURM_JOB_ID"):
        why.append(f"in Slurm job {environ['SLURM_JOB_ID']}")
    if int(environ.get("WORLD_SIZE", "1") or 1) > 1:
        why.append(f"as one of {environ['WORLD_SIZE']} torchrun ranks")
    if why:
        visible = environ.get("CUDA_VISIBLE_DEVICES")
        raise ValueError(f"device=auto found no CUDA device {' and '.join(why)} (torch {torch.__version__}, "
                         f"CUDA_VISIBLE_DEVICES={visible!r}): refusing to train on the CPU there. Request GPUs "
                         f"(sbatch --gpus-per-node=G) with a CUDA build of torch, or pass device=cpu to train on "
                         f"CPU ranks on purpose")
    return "cpu"


def new_host_group(env: DistEnv) -> DistEnv:
    """``env`` with a new gloo group of every rank as its host group (collective: every rank calls it
    at the same point of set-up), for collectives that run in another thread beside the loop's (a
    background checkpoint's commit): a group of their own keeps the two sequences apart. Alone or
    without a process group: ``env`` itself."""
    if not env.has_peers:
        return env
    return dataclasses.replace(env, host_group=dist.new_group(backend="gloo"))


class SetupTimeout(RuntimeError):
    """Some ranks did not finish set-up within ``dist_setup_timeout_s`` (the message names them)."""


def end_setup(env: DistEnv, setup_timeout_s: float, timeout_s: float) -> None:
    """The end of set-up: a monitored barrier (gloo) that names the ranks that did not arrive
    within ``setup_timeout_s``, then every collective of the run gets the step timeout ``timeout_s``.

    Raises:
        SetupTimeout: a rank did not reach the barrier in time (``Rank N failed to pass
            monitoredBarrier``: the ranks are named).
    """
    if not env.distributed:
        return
    try:
        dist.monitored_barrier(env.host_group, timeout=datetime.timedelta(seconds=setup_timeout_s),
                               wait_all_ranks=True)
    except RuntimeError as err:
        if env.rank == 0:  # rank 0 collects the barrier: its error names the missing ranks
            raise SetupTimeout(f"set-up did not finish within dist_setup_timeout_s={setup_timeout_s:g} s: "
                               f"{str(err).strip().splitlines()[0][:400]}") from err
        raise
    step = datetime.timedelta(seconds=timeout_s)
    setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)  # torch's setter of a live group's timeout
    if setter is None:  # not in this torch: the set-up timeout stays (said once, not hidden)
        if env.rank == 0:
            log.warning("this torch (%s) cannot shorten a live group's timeout: collectives keep "
                        "dist_setup_timeout_s=%g s instead of dist_timeout_s=%g s", torch.__version__,
                        setup_timeout_s, timeout_s)
        return
    for group in {id(g): g for g in (dist.group.WORLD, env.host_group)}.values():
        setter(step, group)



def cuda_index(local_rank: int, visible: int | None = None, local_world_size: int | None = None,
               cuda_visible_devices: str | None = None) -> int:
    """The CUDA device of this process: ``LOCAL_RANK`` when that many devices are visible
    (torchrun starting one rank per GPU of a node), or device 0 when the process sees one device
    (a launcher that binds one GPU per task, e.g. ``srun --gpus-per-task=1``, whatever its local
    rank; several ranks sharing that one device are caught after the rendezvous by
    :func:`shared_devices`).

    Raises:
        ValueError: no device visible, or several visible but fewer than the local ranks
            (``LOCAL_RANK`` or ``LOCAL_WORLD_SIZE`` >= the count: two ranks would share a GPU and
            NCCL would fail later with a duplicate-GPU error); the message names ``LOCAL_RANK``,
            ``LOCAL_WORLD_SIZE``, the visible count and ``CUDA_VISIBLE_DEVICES``.
    """
    visible = torch.cuda.device_count() if visible is None else visible
    if cuda_visible_devices is None:
        cuda_visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)")
    where = (f"LOCAL_RANK={local_rank}, LOCAL_WORLD_SIZE={local_world_size if local_world_size else '(unset)'}, "
             f"{visible} visible CUDA device(s), CUDA_VISIBLE_DEVICES={cuda_visible_devices}")
    if visible < 1:
        raise ValueError(f"device=cuda but no CUDA device is visible to this process ({where})")
    if visible == 1:
        return 0
    if local_rank >= visible or (local_world_size or 0) > visible:
        raise ValueError(f"more local ranks than visible GPUs ({where}): start at most {visible} ranks per node "
                         "(torchrun --nproc_per_node), or bind one GPU per task (srun --gpus-per-task=1)")
    return local_rank


def shared_cuda_index(local_rank: int, visible: int | None = None) -> int:
    """The CUDA device of a rank under ``dist_backend=gloo``: ``LOCAL_RANK`` modulo the visible
    devices, so any number of local ranks share them (two ranks on a one-GPU machine: both on
    device 0).

    Raises:
        ValueError: no CUDA device visible (naming ``CUDA_VISIBLE_DEVICES``).
    """
    visible = torch.cuda.device_count() if visible is None else visible
    if visible < 1:
        raise ValueError(f"device=cuda but no CUDA device is visible to this process (LOCAL_RANK={local_rank}, "
                         f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')})")
    return local_rank % visible


def shared_devices(entries: list[tuple[int, str, str]]) -> list[list[int]]:
    """Groups of ranks that hold the same GPU: ``entries`` are (rank, host name, device UUID) of every
    rank; returns the groups (ranks in order) of more than one rank on one (host, UUID)."""
    by_device: dict[tuple[str, str], list[int]] = {}
    for rank, host, uuid in entries:
        by_device.setdefault((host, uuid), []).append(rank)
    return [sorted(r) for r in by_device.values() if len(r) > 1]


def _check_distinct_devices(dev: torch.device, rank: int, host_group) -> None:
    """After the rendezvous on CUDA: refuse when two ranks of a host hold one GPU (named)."""
    import socket

    mine = (rank, socket.gethostname(), str(torch.cuda.get_device_properties(dev).uuid))
    entries = [None] * dist.get_world_size()
    dist.all_gather_object(entries, mine, group=host_group)
    shared = shared_devices(entries)
    if shared:
        raise ValueError(f"ranks {shared} hold the same GPU (rank {rank}: cuda:{dev.index} of "
                         f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}): give each rank its "
                         "own device (one rank per visible GPU, or srun --gpus-per-task=1 with distinct GPUs)")



def _group_refs(env: DistEnv) -> list[weakref.ref]:
    """Weak references to this process's groups (the default group and ``env.host_group``)."""
    groups = {id(g): g for g in (dist.group.WORLD, env.host_group) if g is not None}
    return [weakref.ref(g) for g in groups.values()]


def shutdown(env: DistEnv) -> int:
    """Destroy the process groups and let their communication threads exit while Python still runs.

    ``destroy_process_group`` only unregisters a group: a gloo group's worker threads live on
    until its last Python reference goes (a ``DistributedDataParallel`` wrapper holds one). A
    worker thread that frees the tensors of a finished collective takes the GIL; if that happens
    during interpreter finalisation, Python ends the thread inside a C++ destructor and the
    process aborts (SIGABRT, "terminate called without an active exception": a finished run
    reported as crashed; pytorch/pytorch#190489). So callers drop their trainer, strategy and
    wrapped model *before* calling this; it clears ``env.host_group``, destroys the groups and
    collects garbage (the wrappers sit in reference cycles), which joins the threads.

    Returns how many groups are still referenced afterwards (0 when the caller dropped its
    wrappers and no exception in flight holds their frames; logged at debug level). A plain
    (non-distributed) ``env``, or a second call, returns 0.
    """
    if not (env.distributed and dist.is_initialized()):
        return 0
    refs = _group_refs(env)
    env.host_group = None
    dist.destroy_process_group()
    gc.collect()
    alive = sum(r() is not None for r in refs)
    if alive:
        log.debug("rank %d: %d process group(s) still referenced after destroy_process_group; their "
                  "threads end with the last reference", env.rank, alive)
    return alive
