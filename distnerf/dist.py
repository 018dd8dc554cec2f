"""Distributed environment: rank, world size, device, backend, seeds, and every collective.

The only module that calls ``torch.distributed`` collectives (a test scans the package):
strategies call the helpers below. A process started by ``torchrun``
(``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set) joins a process group; a plain
``python -m`` process runs alone with no process group and every helper is the identity.

Backends. On CPU the group is ``gloo``. On CUDA it is ``cpu:gloo,cuda:nccl``: CUDA tensors
(gradient buckets, ray segments, coarse weights) travel through NCCL, CPU tensors (the
per-step flags, pickled objects, barriers) through gloo. Why: the small host-side values
never need a device copy and a stream synchronisation to be exchanged, object collectives
do not allocate GPU memory, and ``monitored_barrier`` (gloo only) can name a late rank on
GPUs too. Each helper checks its tensor: a CUDA tensor must be on this process's current
device, and a CUDA tensor on a gloo-only (CPU) group is refused, with a message naming the
calling line (NCCL would fail obscurely or hang on the first).
"""
from __future__ import annotations

import datetime
import gc
import importlib
import inspect
import logging
import os
import random
import signal
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

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


def init_distributed(device: str, *, timeout_s: float, setup_timeout_s: float | None) -> DistEnv:
    """Join the process group when launched by torchrun.

    Args:
        device: ``"auto"`` (CUDA of the local rank if available, else CPU), ``"cpu"`` or ``"cuda"``
            (``device`` in ``conf/train.yaml``).
        timeout_s: collective timeout (seconds), so that a lost or hung rank ends the job
            with an error instead of hanging (``dist_timeout_s`` in ``conf/train.yaml``).
        setup_timeout_s: the timeout of the rendezvous and of every collective until
            :func:`end_setup` (``dist_setup_timeout_s``): set-up (scene decoding, pixel cache,
            the balanced partition's fit) may take far longer on one rank than a step; None:
            ``timeout_s`` throughout.
    Raises:
        ValueError: ``device="cuda"`` requested without CUDA, or a timeout ``<= 0``.
    """
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise ValueError("device=cuda requested but torch.cuda.is_available() is False")
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
    backend = "cpu:gloo,cuda:nccl" if use_cuda else "gloo"
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"]) if "LOCAL_WORLD_SIZE" in os.environ else None
    dev = torch.device("cuda", cuda_index(local_rank, local_world_size=local_world_size)) if use_cuda \
        else torch.device("cpu")
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
        bind = {"device_id": dev} if use_cuda and accepts(dist.init_process_group, "device_id") else {}
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout, **bind)
        # monitored_barrier is gloo's: on CUDA a gloo group of the same ranks beside NCCL
        host_group = dist.new_group(backend="gloo", timeout=timeout) if use_cuda else dist.group.WORLD
        if use_cuda:
            _check_distinct_devices(dev, rank, host_group)
    else:
        store = None
    return DistEnv(rank, world_size, local_rank, dev, backend, restart_count, store, host_group)


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


COLLECTIVE_FAILURES = ("Timed out", "timed out", "Connection closed by peer", "Connection reset by peer",
                       "NCCL", "Watchdog", "Socket Timeout")
"""Text of the RuntimeErrors a failed or timed-out collective raises (gloo's "Timed out waiting
Nms for recv operation", a peer that died, NCCL's watchdog)."""


def collective_failure(err: BaseException) -> bool:
    """Whether ``err`` is a collective that timed out or lost a peer (torch.distributed.DistError,
    or a RuntimeError with the backends' text for it)."""
    dist_error = getattr(dist, "DistError", ())
    return isinstance(err, dist_error) or (isinstance(err, RuntimeError) and any(
        t in str(err) for t in COLLECTIVE_FAILURES))


PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "remote process exit")
"""Text of a collective that failed because a peer's connection closed (gloo: the peer's process
died, or its node; NCCL's ncclRemoteError: "remote process exited or there was a network error",
"... a remote process exiting prematurely")."""


def peer_lost(err: BaseException) -> bool:
    """Whether the failed collective ``err`` saw a peer's connection close (it died), rather than time out."""
    return any(t in str(err) for t in PEER_LOST)


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


def accepts(fn, keyword: str) -> bool:
    """Whether callable ``fn`` takes ``keyword`` (its signature, not the torch version string:
    version-dependent APIs are chosen by what the installed torch offers)."""
    try:
        return keyword in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def ddp_buffer_kwargs(ddp_cls) -> dict:
    """DDP's keyword that turns off the buffer broadcast before every forward (the occupancy grids
    are derived identically on every rank): ``forward_sync_buffers=False`` where the installed
    torch has it (2.13), else the older ``broadcast_buffers=False`` (same effect)."""
    if accepts(ddp_cls.__init__, "forward_sync_buffers"):
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


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


PREEMPT_SIGNALS = ("USR1", "USR2", "HUP")
"""Signals that may carry the warning before a job's time limit (``PREEMPT_SIGNAL`` in
``launch/``): some NCCL releases install their own SIGUSR1 handler, so a cluster may use USR2 or
HUP instead (as submitit does)."""


def preempt_signal(env: Mapping[str, str] | None = None) -> str:
    """The preemption signal's name (``"SIGUSR1"``, ``"SIGUSR2"`` or ``"SIGHUP"``) from the
    environment variable ``DISTNERF_PREEMPT_SIGNAL`` (set by ``launch/common.sh`` from
    ``PREEMPT_SIGNAL``; default USR1). Raises ValueError naming the variable for any other value."""
    value = (os.environ if env is None else env).get("DISTNERF_PREEMPT_SIGNAL", "USR1").upper().removeprefix("SIG")
    if value not in PREEMPT_SIGNALS:
        raise ValueError(f"DISTNERF_PREEMPT_SIGNAL={value!r}: the preemption signal must be one of "
                         f"{', '.join(PREEMPT_SIGNALS)} (and match sbatch --signal=B:<signal>@T)")
    return f"SIG{value}"


class StopRequest:
    """A stop asked for by a signal: the preemption signal (:func:`preempt_signal`, SIGUSR1
    by default: Slurm's warning before the time limit, ``--signal=B:USR1@T`` forwarded by the
    batch script) or SIGTERM (``scancel``, node drain, torchrun shutting its workers down).

    The handler only records the signal; the trainer adds :attr:`requested` to its
    per-step all-reduce, so a signal that reaches one rank stops every rank at the same
    step, and they checkpoint together. Repeated signals change nothing (Slurm and the
    torchrun agent may both deliver SIGTERM); SIGKILL after their grace period
    (``KillWait``, the agent's shutdown timeout) is the escalation.

    Raises ValueError (from :func:`preempt_signal`) for an unknown ``DISTNERF_PREEMPT_SIGNAL``.
    """

    def __init__(self, env: Mapping[str, str] | None = None):
        self.SIGNALS = (preempt_signal(env), "SIGTERM")
        self.signal: str | None = None
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def install(self) -> "StopRequest":
        """Handle :attr:`SIGNALS` in this process (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                sig = getattr(signal, name)
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.signal is None:
            self.signal = signal.Signals(signum).name


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (model initialisation identical on every rank)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Random states of this process (torch, numpy, python; its own CUDA device's when CUDA is
    present), as data only: tensors, numbers and lists (a checkpoint loads them with
    ``weights_only=True``).

    ``numpy``: ``{"keys": (624,) int64 tensor of the MT19937 key, "pos", "has_gauss",
    "cached_gaussian"}``; ``python``: ``[version, [625 ints], gauss_next]``; ``cuda_device``: the
    (uint8) state of the current CUDA device only, so that a resume where the process sees fewer
    GPUs (8 under torchrun, then one per task under ``srun --gpus-per-task=1``) restores it.
    """
    name, keys, pos, has_gauss, cached = np.random.get_state()
    assert name == "MT19937", name
    version, internal, gauss_next = random.getstate()
    state = {"torch": torch.get_rng_state(),
             "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                       "cached_gaussian": float(cached)},
             "python": [version, list(internal), gauss_next]}
    if torch.cuda.is_available():
        state["cuda_device"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    return state


def own_cuda_state(state: dict, device_index: int):
    """The CUDA generator state of this process's device from a saved :func:`rng_state`, or None.

    ``cuda_device`` (the device's own state); an older checkpoint's ``cuda`` list (every visible
    device's, in device order) gives its entry ``device_index`` when the list has one, else its
    first: the process that wrote it may have seen more devices than this one does.
    """
    if "cuda_device" in state:
        return state["cuda_device"]
    listed = state.get("cuda") or []
    if not listed:
        return None
    return listed[device_index] if device_index < len(listed) else listed[0]


def set_rng_state(state: dict) -> None:
    """Restore :func:`rng_state`'s states (CUDA: into the current device only, see :func:`own_cuda_state`)."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if torch.cuda.is_available():
        cuda = own_cuda_state(state, torch.cuda.current_device())
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, torch.cuda.current_device())


def _caller() -> str:
    """``file:line`` of the first frame outside this module (for error messages)."""
    import inspect

    for frame in inspect.stack()[2:]:
        if frame.filename != __file__:
            return f"{frame.filename}:{frame.lineno}"
    return "?"


def _checked(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` if the process group can exchange it where it lies (module docstring):
    on the CPU, or on this rank's current CUDA device under an NCCL-backed group.

    Raises:
        RuntimeError: naming the calling line, the tensor's device and what the group takes.
    """
    if tensor.device.type == "cpu":
        return tensor
    backend = str(dist.get_backend())
    if tensor.is_cuda and "nccl" in backend and tensor.device.index == torch.cuda.current_device():
        return tensor
    takes = f"cpu or cuda:{torch.cuda.current_device()}" if "nccl" in backend else "cpu tensors only"
    raise RuntimeError(f"{_caller()}: a tensor on {tensor.device} passed to a collective of the {backend} group, "
                       f"which takes {takes}")


OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


def world_size() -> int:
    """Ranks of the process group (1 without one)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank() if dist.is_initialized() else 0


def all_reduce_(tensor: torch.Tensor, op: str = "sum", async_op: bool = False):
    """Reduce ``tensor`` over ranks in place (``op``: sum | min | max); identity without a group.

    Returns:
        None, or with ``async_op`` the work handle (``.get_future()``; on NCCL its future
        completes when the collective is enqueued, not when it is done).
    """
    if not dist.is_initialized():
        return None
    tensor = _checked(tensor)
    if dist.get_world_size() == 1 and not async_op:
        return None  # alone in the group (a world-size-1 torchrun): the reduction is the tensor itself
    return dist.all_reduce(tensor, op=OPS[op], async_op=async_op)


def all_gather(tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``tensor`` (same shape and dtype on every rank), in rank order."""
    if not dist.is_initialized():
        return [tensor]
    tensor = _checked(tensor.contiguous())
    if dist.get_world_size() == 1:
        return [tensor]  # alone in the group: no exchange
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor)
    return parts


def broadcast_object(env: DistEnv, obj, src: int = 0):
    """``obj`` of rank ``src`` on every rank (identity without a process group or alone in it), through
    the host (gloo) group: a pickled object never travels through NCCL."""
    if not env.has_peers:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=env.host_group)
    return box[0]


def all_reduce_max(env: DistEnv, value: float) -> float:
    """Maximum of ``value`` over ranks (a host number: travels on the CPU, through gloo)."""
    if not env.distributed:
        return value
    t = torch.tensor([float(value)], dtype=torch.float64)
    all_reduce_(t, "max")
    return float(t.item())


def all_reduce_sum(env: DistEnv, values: torch.Tensor) -> torch.Tensor:
    """Sum of a small tensor over ranks (a new tensor on the device ``values`` is on)."""
    t = values.detach().clone()
    if env.distributed:
        all_reduce_(t)
    return t


def gather_objects(env: DistEnv, obj) -> list:
    """List of every rank's ``obj`` (on every rank), through the host (gloo) group."""
    if not env.has_peers:
        return [obj]
    out = [None] * env.world_size
    dist.all_gather_object(out, obj, group=env.host_group)
    return out


def barrier(env: DistEnv) -> None:
    """Wait for every rank (nothing to wait for alone), on the host (gloo) group: with a device
    bound, the default group's barrier runs through NCCL, where a slow rank ends in NCCL's watchdog
    instead of a gloo timeout that the trainer reports as a ``CollectiveFailure`` naming the step."""
    if env.has_peers:
        dist.barrier(group=env.host_group)


def timing_event():
    """A CUDA timing event recorded now on the current stream: the marks around a collective that
    time it on the device (NCCL's host calls return at launch). Read after a synchronisation with
    :func:`event_seconds`."""
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def event_seconds(start, end) -> float:
    """Seconds between two :func:`timing_event` marks, waiting for ``end`` to complete."""
    end.synchronize()
    return start.elapsed_time(end) / 1000.0
