"""Data parallelism: every rank holds the whole model and trains on its own rays.

Gradients are all-reduced by ``DistributedDataParallel`` around the model's
forward, which runs the whole render (calling the unwrapped module would silently
skip the all-reduce). A communication hook times every bucket's all-reduce and
counts its bytes. Without a process group (``python -m distnerf.train``) the model
is used as is: one code path for world size 1 and N.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..model.base import RadianceModel
from .base import Strategy


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

    def reset(self):
        self.seconds, self.bytes, self.calls = 0.0, 0, 0

    def _clear_step(self):
        self.step_in_hook, self.step_last_return, self.step_bytes = 0.0, None, 0
        self.step_spans: list[tuple[float, float]] = []

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
               "spans": list(self.step_spans), "bytes": self.step_bytes}
        self._clear_step()
        return out


class HookState:
    """State of the communication hook: statistics, wire dtype and the sparse rule.

    Args:
        sparse_min_numel: buckets at least this large are all-reduced sparsely when
            at most ``sparse_max_density`` of their entries are non-zero (voxel-grid
            tables: a step touches few vertices). ``None`` disables it.
    """

    def __init__(self, stats: CommStats, wire_dtype: torch.dtype | None, sparse_min_numel: int | None = None,
                 sparse_max_density: float = 0.25):
        self.stats, self.wire_dtype = stats, wire_dtype
        self.sparse_min_numel, self.sparse_max_density = sparse_min_numel, sparse_max_density


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
    counts = [torch.zeros(1, dtype=torch.long) for _ in range(world_size)]
    dist.all_gather(counts, torch.tensor([index.numel()]))
    width = int(max(c.item() for c in counts))
    if width > max_density * buffer.numel():
        return None
    values = buffer[index] / world_size
    pad = width - index.numel()
    index_p = torch.cat([index, index.new_zeros(pad)])
    values_p = torch.cat([values, values.new_zeros(pad)])
    all_index = [torch.empty_like(index_p) for _ in range(world_size)]
    all_values = [torch.empty_like(values_p) for _ in range(world_size)]
    dist.all_gather(all_index, index_p)
    dist.all_gather(all_values, values_p)
    buffer.zero_()
    for c, idx, val in zip(counts, all_index, all_values):
        n = int(c.item())
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
    if (state.sparse_min_numel is not None and buffer.numel() >= state.sparse_min_numel
            and buffer.device.type == "cpu"):
        nbytes = sparse_allreduce_(buffer, dist.get_world_size(), state.sparse_max_density)
        if nbytes is not None:
            state.stats.record(time.perf_counter() - start, nbytes, start)
            fut = torch.futures.Future()
            fut.set_result(buffer)
            state.stats.hook_returned(start)
            return fut
    wire = buffer if state.wire_dtype is None else buffer.to(state.wire_dtype)
    nbytes = wire.numel() * wire.element_size()
    wire.div_(dist.get_world_size())
    fut = dist.all_reduce(wire, async_op=True).get_future()

    def done(f):
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
    null disables; CPU/gloo only).
    """

    name = "ddp"

    def __init__(self, cfg, env):
        super().__init__(cfg, env)
        self.comm = CommStats()

    def wrap(self, model: nn.Module) -> nn.Module:
        self.model = model.to(self.env.device)
        if not self.env.distributed:
            self.wrapped = self.model
            return self.wrapped
        for module in self.model.modules():  # DDP buckets (and its comm hook) need dense gradients
            if isinstance(module, RadianceModel):
                module.sparse_grad = False
        ddp = DistributedDataParallel(
            self.model,
            device_ids=[self.env.device.index] if self.env.device.type == "cuda" else None,
            forward_sync_buffers=False,  # occupancy grids are derived identically on every rank
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
        out = {"allreduce_s": self.comm.seconds, "allreduce_bytes": self.comm.bytes,
               "allreduce_calls": self.comm.calls}
        self.comm.reset()
        return out

    def step_comm(self) -> dict | None:
        """This step's hook timings (:meth:`CommStats.take_step`); None without a process group."""
        return self.comm.take_step() if self.env.distributed else None
