"""Data parallelism: every rank holds the whole model and trains on its own rays.

Gradients are all-reduced by ``DistributedDataParallel`` around the model's
forward, which runs the whole render (calling the unwrapped module would silently
skip the all-reduce). A communication hook times every bucket's all-reduce and
counts its bytes. Without a process group (``python -m distnerf.train``) or alone in
one (a world-size-1 torchrun) the model is used as is: no peer, so no all-reduce (and
the dist helpers skip their collectives there too).

Timing. On gloo (CPU) a bucket's future completes when its all-reduce is done, so the
hook's (launch, completion) span is a duration and bus bandwidth follows from it. On
NCCL the future completes when the collective is queued on its stream: the host clock
measures the launch only (reported as ``allreduce_launch_s``). The device times it: the
hook records a CUDA event on the current stream when it launches a bucket, and its
``fut.then`` callback records another (the callback's stream waits on the collective), so
each pair spans the bucket's all-reduce on the GPU timeline. The step breakdown resolves
them at its one end-of-step synchronisation (:func:`distnerf.observe.breakdown.gpu_comm_figures`):
per-bucket durations, communication time, bus bandwidth and the exposed share.

Sparse buckets. A voxel-grid table's gradient touches few rows per step; a bucket of at
least ``sparse_min_numel`` entries with at most ``sparse_max_density`` of them non-zero
travels as (index, value) pairs (gloo/CPU). Deciding costs a ``nonzero`` over the bucket
and an exchange of the counts; a bucket found dense is remembered as dense and looked at
again only every :data:`SPARSE_REVISIT` steps. On CUDA buckets stay dense: sizing the
index/value buffers needs the non-zero count on the host (a synchronisation in the hook
on every step); a fixed-capacity sync-free exchange is future work and was not measured.
"""
from __future__ import annotations

import time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .. import dist as D
from ..model.base import RadianceModel
from .base import Strategy

SPARSE_REVISIT = 50  # steps between two looks at a bucket found too dense for the sparse exchange


class CommStats:
    """Accumulates all-reduce time (launch to completion) and bytes per bucket.

    Besides the sums since :meth:`reset` (logged every ``log_every`` steps) it keeps,
    for the step in progress, what the profiler needs to tell exposed from hidden
    communication (host clock, ``time.perf_counter`` seconds): the time spent inside
    the hook (it runs on the autograd thread, so it blocks backward), when the last
    hook returned, and each bucket's (launch, completion) span. :meth:`take_step`
    returns and clears them.
    """

    def __init__(self):
        self.reset()
        self._clear_step()
        self.launch_only = False  # NCCL: the spans are launches, not durations (module docstring)

    def reset(self):
        self.seconds, self.bytes, self.calls = 0.0, 0, 0

    def _clear_step(self):
        self.step_in_hook, self.step_last_return, self.step_bytes = 0.0, None, 0
        self.step_spans: list[tuple[float, float]] = []
        self.step_events: list[list] = []  # CUDA: [launch event, completion event, bytes] per bucket

    def record(self, seconds: float, nbytes: int, start: float | None = None):
        self.seconds += seconds
        self.bytes += nbytes
        self.calls += 1
        if start is not None:
            self.step_spans.append((start, start + seconds))
            self.step_bytes += nbytes

    def hook_returned(self, entered: float) -> None:
        """Called at the end of every hook call that entered at ``entered``."""
        now = time.perf_counter()
        self.step_in_hook += now - entered
        self.step_last_return = now

    def take_step(self) -> dict:
        """This step's hook timings (see the class docstring); cleared afterwards."""
        out = {"in_hook_s": self.step_in_hook, "last_return": self.step_last_return,
               "spans": list(self.step_spans), "bytes": self.step_bytes,
               "timing": "launch" if self.launch_only else "duration",
               "events": [tuple(e) for e in self.step_events if e[1] is not None]}
        self._clear_step()
        return out


class HookState:
    """State of the communication hook: statistics, wire dtype and the sparse rule.

    Args:
        sparse_min_numel: buckets at least this large are all-reduced sparsely when
            at most ``sparse_max_density`` of their entries are non-zero (voxel-grid
            tables: a step touches few vertices). ``None`` disables it.
    """

    def __init__(self, stats: CommStats, wire_dtype: torch.dtype | None, sparse_min_numel: int | None,
                 sparse_max_density: float):
        self.stats, self.wire_dtype = stats, wire_dtype
        self.sparse_min_numel, self.sparse_max_density = sparse_min_numel, sparse_max_density
        # per bucket (index, size: DDP rebuilds its buckets after the first step): the hook call
        # from which a bucket found dense is looked at again, and the calls so far
        self.dense_until: dict[tuple[int, int], int] = {}
        self.calls: dict[tuple[int, int], int] = {}

    def try_sparse(self, key: tuple[int, int], buffer: torch.Tensor) -> bool:
        """Whether to attempt the sparse exchange of bucket ``key`` now (every rank decides
        the same: the rule depends only on call counts and on the counts all ranks exchanged)."""
        call = self.calls.get(key, 0)
        self.calls[key] = call + 1
        return (self.sparse_min_numel is not None and buffer.numel() >= self.sparse_min_numel
                and not buffer.is_cuda and call >= self.dense_until.get(key, 0))

    def found_dense(self, key: tuple[int, int]) -> None:
        self.dense_until[key] = self.calls[key] - 1 + SPARSE_REVISIT


def sparse_allreduce_(buffer: torch.Tensor, world_size: int, max_density: float) -> int | None:
    """Average ``buffer`` over ranks exchanging only its non-zero entries.

    Every rank all-gathers (index, value / world_size) pairs of its non-zeros
    (padded to the largest count) and accumulates them into a zeroed buffer in rank
    order. Zeros contribute nothing, so the result equals a dense average (bitwise for
    2 ranks, where a sum of two values does not depend on order). When any rank holds
    more than ``max_density`` non-zeros the exchange is not done (the caller falls
    back to a dense all-reduce): the decision is taken from the gathered counts, so
    every rank takes the same branch.

    Returns:
        bytes this rank sent (indices + values, padded), or None when not done.
    """
    index = buffer.nonzero().view(-1)
    counts = torch.cat(D.all_gather(torch.tensor([index.numel()]))).tolist()
    width = max(counts)
    if width > max_density * buffer.numel():
        return None
    values = buffer[index] / world_size
    pad = width - index.numel()
    index_p = torch.cat([index, index.new_zeros(pad)])
    values_p = torch.cat([values, values.new_zeros(pad)])
    all_index, all_values = D.all_gather(index_p), D.all_gather(values_p)
    buffer.zero_()
    for n, idx, val in zip(counts, all_index, all_values):
        buffer.index_add_(0, idx[:n], val[:n])
    return width * (index_p.element_size() + values_p.element_size())


def timed_allreduce_hook(state, bucket):  # no annotations: DDP checks them at runtime
    """DDP communication hook: average the bucket over ranks, timing and counting it.

    With ``state.wire_dtype`` (fp16/bf16) the bucket travels compressed and is cast
    back (the same idea as ``torch.distributed.algorithms.ddp_comm_hooks``'
    ``bf16_compress_hook``), halving the bytes of float32 gradients. The hook's own
    work is marked ``distnerf:comm_hook`` in profiler traces (it is communication,
    not backward computation, in the report's overlap figure).
    """
    with torch.profiler.record_function("distnerf:comm_hook"):
        return _allreduce_bucket(state, bucket)


def _allreduce_bucket(state, bucket):
    buffer = bucket.buffer()
    start = time.perf_counter()
    state.stats.launch_only = buffer.is_cuda
    key = (bucket.index(), buffer.numel())
    if state.try_sparse(key, buffer):
        nbytes = sparse_allreduce_(buffer, D.world_size(), state.sparse_max_density)
        if nbytes is None:
            state.found_dense(key)
        else:
            state.stats.record(time.perf_counter() - start, nbytes, start)
            fut = torch.futures.Future()
            fut.set_result(buffer)
            state.stats.hook_returned(start)
            return fut
    wire = buffer if state.wire_dtype is None else buffer.to(state.wire_dtype)
    nbytes = wire.numel() * wire.element_size()
    wire.div_(D.world_size())
    events = [D.timing_event(), None, nbytes] if buffer.is_cuda else None  # the launch, on the bucket's stream
    if events is not None:
        state.stats.step_events.append(events)
    fut = D.all_reduce_(wire, async_op=True).get_future()

    def done(f):
        if events is not None:  # the callback's stream waits on the collective: its completion on the GPU
            events[1] = D.timing_event()
        state.stats.record(time.perf_counter() - start, nbytes, start)
        result = f.value()[0]
        if result is not buffer:
            buffer.copy_(result)
        return buffer

    out = fut.then(done)
    state.stats.hook_returned(start)
    return out


class DDPStrategy(Strategy):
    """``strategy=ddp``.

    Config keys: ``bucket_cap_mb`` (DDP bucket size), ``find_unused_parameters``
    (False by default), ``gradient_as_bucket_view``, ``compression`` (``none``,
    ``fp16`` or ``bf16``: the dtype gradients travel in), ``sparse_min_numel``
    (buckets this large or larger travel as (index, value) pairs when mostly zero;
    null disables; CPU/gloo only), ``sparse_max_density``.
    """

    name = "ddp"

    def __init__(self, cfg, env):
        super().__init__(cfg, env)
        self.comm = CommStats()

    def wrap(self, model: nn.Module) -> nn.Module:
        self.model = model.to(self.env.device)
        if not self.env.has_peers:  # no peer: no gradient all-reduce
            self.wrapped = self.model
            return self.wrapped
        for module in self.model.modules():  # DDP buckets (and its comm hook) need dense gradients
            if isinstance(module, RadianceModel):
                module.sparse_grad = False
        ddp = DistributedDataParallel(
            self.model,
            device_ids=[self.env.device.index] if self.env.device.type == "cuda" else None,
            **D.ddp_buffer_kwargs(DistributedDataParallel),  # no buffer broadcast: occupancy is derived alike
            bucket_cap_mb=self.cfg.bucket_cap_mb,
            find_unused_parameters=self.cfg.find_unused_parameters,
            gradient_as_bucket_view=self.cfg.gradient_as_bucket_view,
        )
        wire = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}[self.cfg.compression]
        ddp.register_comm_hook(HookState(self.comm, wire, self.cfg.sparse_min_numel, self.cfg.sparse_max_density),
                               timed_allreduce_hook)
        self.wrapped = ddp
        return ddp

    def comm_stats(self) -> dict:
        """Since the last call: seconds (``allreduce_launch_s`` on NCCL, see the module docstring),
        bytes and calls."""
        seconds_key = "allreduce_launch_s" if self.comm.launch_only else "allreduce_s"
        out = {seconds_key: self.comm.seconds, "allreduce_bytes": self.comm.bytes,
               "allreduce_calls": self.comm.calls}
        self.comm.reset()
        return out

    def step_comm(self) -> dict | None:
        """This step's hook timings (:meth:`CommStats.take_step`); None without a peer (no DDP wrapper)."""
        return self.comm.take_step() if self.env.has_peers else None
