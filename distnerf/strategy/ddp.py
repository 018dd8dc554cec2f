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

from .base import Strategy


class CommStats:
    """Accumulates all-reduce time (launch to completion) and bytes per bucket."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.seconds, self.bytes, self.calls = 0.0, 0, 0

    def record(self, seconds: float, nbytes: int):
        self.seconds += seconds
        self.bytes += nbytes
        self.calls += 1


class HookState:
    """State of the communication hook: the statistics and the wire dtype."""

    def __init__(self, stats: CommStats, wire_dtype: torch.dtype | None):
        self.stats, self.wire_dtype = stats, wire_dtype


def timed_allreduce_hook(state, bucket):  # no annotations: DDP checks them at runtime
    """DDP communication hook: average the bucket over ranks, timing and counting it.

    With ``state.wire_dtype`` (fp16/bf16) the bucket travels compressed and is cast
    back (the same idea as ``torch.distributed.algorithms.ddp_comm_hooks``'
    ``bf16_compress_hook``), halving the bytes of float32 gradients.
    """
    buffer = bucket.buffer()
    start = time.perf_counter()
    wire = buffer if state.wire_dtype is None else buffer.to(state.wire_dtype)
    nbytes = wire.numel() * wire.element_size()
    wire.div_(dist.get_world_size())
    fut = dist.all_reduce(wire, async_op=True).get_future()

    def done(f):
        state.stats.record(time.perf_counter() - start, nbytes)
        result = f.value()[0]
        if result is not buffer:
            buffer.copy_(result)
        return buffer

    return fut.then(done)


class DDPStrategy(Strategy):
    """``strategy=ddp``.

    Config keys: ``bucket_cap_mb`` (DDP bucket size), ``find_unused_parameters``
    (False by default), ``gradient_as_bucket_view``, ``compression`` (``none``,
    ``fp16`` or ``bf16``: the dtype gradients travel in).
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
        ddp = DistributedDataParallel(
            self.model,
            device_ids=[self.env.device.index] if self.env.device.type == "cuda" else None,
            forward_sync_buffers=False,  # occupancy grids are derived identically on every rank
            bucket_cap_mb=float(self.cfg.get("bucket_cap_mb", 25)),
            find_unused_parameters=bool(self.cfg.get("find_unused_parameters", False)),
            gradient_as_bucket_view=bool(self.cfg.get("gradient_as_bucket_view", True)),
        )
        wire = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}[self.cfg.get("compression", "none")]
        ddp.register_comm_hook(HookState(self.comm, wire), timed_allreduce_hook)
        self.wrapped = ddp
        return ddp

    def comm_stats(self) -> dict:
        out = {"allreduce_s": self.comm.seconds, "allreduce_bytes": self.comm.bytes,
               "allreduce_calls": self.comm.calls}
        self.comm.reset()
        return out
