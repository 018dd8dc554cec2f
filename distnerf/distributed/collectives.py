"""Every collective of the package (a test scans ``distnerf/`` for ``torch.distributed``
collectives outside ``distnerf/distributed/``): strategies and the trainer call these helpers. Without a
process group, or alone in it, every helper is the identity.

Each helper checks its tensor (:func:`_checked`): a CUDA tensor must be on this process's current
device (NCCL would fail obscurely or hang on another), with a message naming the calling line; a gloo
group takes it too (``dist_backend=gloo``, :mod:`distnerf.distributed.env`). Pickled objects and barriers travel on the
host (gloo) group (:attr:`~distnerf.distributed.env.DistEnv.host_group`). :func:`collective_failure` and
:func:`peer_lost` classify the errors a failed collective raises.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .env import DistEnv


COLLECTIVE_FAILURES = ("Timed out", "timed out", "Application timeout", "Connection closed by peer",
                       "Connection reset by peer", "NCCL", "Watchdog", "Socket Timeout")
"""Text of the RuntimeErrors a failed or timed-out collective raises (gloo's "Timed out waiting
Nms for recv operation"; gloo's "Application timeout caused pair closure", raised in a future's
callback, e.g. DDP's comm hook, when a timed-out operation closed the pair; a peer that died, NCCL's
watchdog)."""


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



def _caller() -> str:
    """``file:line`` of the first frame outside this module (for error messages)."""
    import inspect

    for frame in inspect.stack()[2:]:
        if frame.filename != __file__:
            return f"{frame.filename}:{frame.lineno}"
    return "?"


def _checked(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` if the process group can exchange it where it lies (module docstring):
    on the CPU, or on this rank's current CUDA device under an NCCL-backed group or a CUDA rank's
    gloo group (``dist_backend=gloo``: gloo's CUDA all-reduce and all-gather stage them through pinned host
    memory; the all-to-all and the single-tensor all-gather, which gloo has no CUDA kernel for, are staged
    here: :func:`_gloo_cuda`).

    Raises:
        RuntimeError: naming the calling line, the tensor's device and what the group takes.
    """
    if tensor.device.type == "cpu":
        return tensor
    backend = str(dist.get_backend())
    cuda_group = _nccl() or (backend == "gloo" and torch.cuda.is_available())
    if tensor.is_cuda and cuda_group and tensor.device.index == torch.cuda.current_device():
        return tensor
    takes = f"cpu or cuda:{torch.cuda.current_device()}" if cuda_group else "cpu tensors only"
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


def all_gather_into(tensor: torch.Tensor, async_op: bool = False):
    """Every rank's ``tensor`` (same shape and dtype on every rank) concatenated along its first dimension in
    rank order, in one new tensor and one collective (``W x N`` rows for ``N`` per rank): ``all_gather_single``
    where the installed torch has it, else ``all_gather_into_tensor`` (the same call, deprecated in 2.13).

    Returns:
        ``(output, work)``: ``work`` is None when the call completed (``async_op`` false, or no peer: then
        ``output`` is ``tensor`` itself), else the work handle (``.get_future()``; on NCCL its future completes
        when the collective is enqueued, and a ``then`` callback's stream waits on it).
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return tensor, None  # alone: no exchange
    tensor = _checked(tensor.contiguous())
    if _gloo_cuda(tensor):  # gloo carries CUDA tensors for a check, not for speed: staged on the host, waited for
        output, _ = all_gather_into(tensor.cpu())
        return output.to(tensor.device), None
    output = tensor.new_empty((dist.get_world_size() * tensor.shape[0], *tensor.shape[1:]))
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    work = gather(output, tensor, async_op=async_op)
    return output, work if async_op else None


def _gloo_cuda(tensor: torch.Tensor) -> bool:
    """A CUDA tensor in a gloo group (``dist_backend=gloo`` on a GPU): the collectives gloo has no CUDA
    kernel for (its all-to-all, its single-tensor all-gather) stage it through host memory."""
    return tensor.is_cuda and not _nccl()


def _nccl() -> bool:
    """Whether the default group runs NCCL (it takes device tensors only)."""
    return "nccl" in str(dist.get_backend())


def exchange_counts(send_counts: list[int]) -> list[int]:
    """How many rows every rank will send this rank, from how many this rank sends each (one all-to-all of
    W integers, read on the host: the sizes of the :func:`all_to_all_rows` that follows).

    Args:
        send_counts: W rows this rank sends to rank 0, 1, ... (itself included).
    Returns:
        W rows this rank receives from rank 0, 1, ...
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return list(send_counts)
    device = torch.device("cuda", torch.cuda.current_device()) if _nccl() else torch.device("cpu")
    sent = torch.tensor(send_counts, dtype=torch.int64, device=device)
    received = torch.empty_like(sent)
    dist.all_to_all_single(received, sent)
    return received.tolist()  # a host read: the next all-to-all's sizes


def all_to_all_rows(tensor: torch.Tensor, send_counts: list[int], recv_counts: list[int]) -> torch.Tensor:
    """Rows of ``tensor`` sent to their ranks (the first ``send_counts[0]`` rows to rank 0, the next to rank 1,
    ...), and the rows every rank sent this one, concatenated in rank order (one all-to-all).

    Args:
        tensor: (sum(send_counts), ...) rows grouped by destination rank.
        send_counts, recv_counts: W row counts (:func:`exchange_counts` gives the second from the first).
    Returns:
        (sum(recv_counts), ...) tensor of ``tensor``'s dtype and device.
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return tensor
    tensor = _checked(tensor.contiguous())
    if _gloo_cuda(tensor):  # staged on the host (_gloo_cuda)
        return all_to_all_rows(tensor.cpu(), send_counts, recv_counts).to(tensor.device)
    output = tensor.new_empty((sum(recv_counts), *tensor.shape[1:]))
    dist.all_to_all_single(output, tensor, output_split_sizes=list(recv_counts), input_split_sizes=list(send_counts))
    return output


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


def all_reduce_or(env: DistEnv, flags: torch.Tensor) -> torch.Tensor:
    """The OR over ranks of a bool tensor (same shape on every rank), sent bit-packed: each rank's N flags as
    ceil(N / 8) bytes in one all-gather, ORed here byte by byte and unpacked. A rank receives
    :func:`all_reduce_or_bytes` (W x ceil(N / 8)) bytes, where an all-reduce (max) of uint8 moves N; no
    reduce op (NCCL has no bitwise one), no host read. On ``flags``' device (CUDA under NCCL, either under
    gloo).

    Returns:
        bool tensor of ``flags``' shape and device: True where any rank's is; ``flags`` itself without peers.
    """
    if not env.has_peers:
        return flags
    packed = pack_bits(flags)
    gathered, _ = all_gather_into(packed)  # (W x B,) in rank order
    rows = gathered.view(env.world_size, -1)
    union = rows[0].clone()
    for row in rows[1:]:
        union.bitwise_or_(row)
    shifts = torch.arange(8, dtype=torch.uint8, device=union.device)
    return ((union[:, None] >> shifts) & 1).view(torch.bool).view(-1)[:flags.numel()].view(flags.shape)


def pack_bits(flags: torch.Tensor) -> torch.Tensor:
    """``flags`` (bool, any shape) as ceil(N / 8) uint8, flag ``8 i + j`` in bit ``j`` of byte ``i`` (the padding
    zero). Eight flags are the bytes of one int64 (little-endian, as x86, ARM and CUDA), byte ``j`` at bit ``8 j``;
    shifting it right by ``7 j`` puts flag ``j`` at bit ``j`` and every other byte's outside the low byte, which
    the cast to uint8 keeps: 8 shifts of N / 8 integers, no multiply of N."""
    flat = flags.reshape(-1).to(torch.bool)
    if flat.numel() % 8:
        flat = torch.cat([flat, flat.new_zeros(-flat.numel() % 8)])
    octets = flat.contiguous().view(torch.uint8).view(torch.int64)
    packed = octets.clone()
    for j in range(1, 8):
        packed |= octets >> (7 * j)
    return packed.to(torch.uint8)


def all_reduce_or_bytes(world_size: int, numel: int) -> int:
    """Bytes one rank receives in :func:`all_reduce_or` of ``numel`` flags over ``world_size`` ranks (0 alone)."""
    return world_size * -(-numel // 8) if world_size > 1 else 0


def gather_objects(env: DistEnv, obj) -> list:
    """List of every rank's ``obj`` (on every rank), through the host (gloo) group."""
    if not env.has_peers:
        return [obj]
    out = [None] * env.world_size
    dist.all_gather_object(out, obj, group=env.host_group)
    return out


def all_gather_floats(env: DistEnv, values) -> torch.Tensor:
    """Every rank's few host numbers, in one all-gather of float64 on the host (gloo) group.

    For small per-rank figures logged or compared every few steps: unlike :func:`gather_objects`
    (``all_gather_object``: a size exchange, then pickles), one fixed-size collective and no pickling.

    Args:
        values: K numbers (floats, ints, bools); K must be the same on every rank. NaN travels as a
            number: the conventional "this rank has no such figure".
    Returns:
        (W, K) float64 on the CPU, row r rank r's ``values``; (1, K) without peers (no exchange).
    """
    mine = torch.tensor([float(v) for v in values], dtype=torch.float64)
    if not env.has_peers:
        return mine[None]
    parts = [torch.empty_like(mine) for _ in range(env.world_size)]
    dist.all_gather(parts, mine, group=env.host_group)
    return torch.stack(parts)


def barrier(env: DistEnv) -> None:
    """Wait for every rank (nothing to wait for alone), on the host (gloo) group: with a device
    bound, the default group's barrier runs through NCCL, where a slow rank ends in NCCL's watchdog
    instead of a gloo timeout that the trainer reports as a ``CollectiveFailure`` naming the step."""
    if env.has_peers:
        dist.barrier(group=env.host_group)


def device_timed(device: torch.device | str) -> bool:
    """The timing method on ``device``, the one switch the timers and the collectives' marks take: True on
    CUDA, where work is timed by CUDA events (:func:`timing_event`) resolved after it is done, and a host clock
    around a collective or a kernel measures its launch only (NCCL's calls return when queued); False on the
    CPU, where the host clock around the work measures the work itself. A device fact, so nothing forces it
    on the CPU (CUDA events have no CPU kind); tests stand in for it by patching the caller's flag."""
    return torch.device(device).type == "cuda"


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
