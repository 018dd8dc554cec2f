"""Data parallelism: every rank holds the whole model and trains on its own rays.

Gradients are all-reduced by ``DistributedDataParallel`` around the model's
forward, which runs the whole render (calling the unwrapped module would silently
skip the all-reduce). A communication hook times every bucket's all-reduce and
counts its bytes. Without a process group (``python -m distnerf.train``) or alone in
one (a world-size-1 torchrun) the model is used as is: no peer, so no all-reduce (and
the distributed helpers skip their collectives there too).

Timing. On gloo (CPU) a bucket's future completes when its all-reduce is done, so the
hook's (launch, completion) span is a duration and bus bandwidth follows from it. On
NCCL the future completes when the collective is queued on its stream: the host clock
measures the launch only (reported as ``allreduce_launch_s``). The device times it: the
hook records a CUDA event on the current stream when it launches a bucket, and its
``fut.then`` callback records another (the callback's stream waits on the collective), so
each pair spans the bucket's all-reduce on the GPU timeline. The step breakdown resolves
them at its one end-of-step synchronisation (:func:`distnerf.observe.breakdown.gpu_comm_figures`):
per-bucket durations, communication time, bus bandwidth and the exposed share.

Sparse buckets. A voxel-grid table's gradient touches few rows per step, so a large bucket may
travel as (index, value) pairs: ``counted`` (exact sizes, a host synchronisation) or ``bounded``
(a fixed capacity, the model's :meth:`~distnerf.model.base.RadianceModel.gradient_entry_capacity`,
the same on every rank and agreed with nobody: no host synchronisation, no collective), chosen by
``sparse_mode``; the rule and both exchanges are in :mod:`distnerf.strategy.sparse_exchange`.
Every exchange is launched, not waited for: the hook returns the collective's future (a sparse
bucket's pairs travel in one all-gather and are added into the bucket by one ``index_add_`` when it
completes), so the backward goes on while the bucket travels. Their logged bytes are each rank's payload; the bus bandwidth the profiler derives counts each
bucket in its own collective's convention (:func:`bus_bytes`: all-gather or all-reduce).
"""
from __future__ import annotations

import time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .. import distributed as D
from ..config_check import ConfigError
from ..host_buffers import sync_free
from ..model.base import RadianceModel
from .base import Strategy
from .sparse_exchange import SparseRule, launch_bounded_sparse_allreduce, launch_row_exchange, launch_sparse_allreduce


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
        self.step_in_hook, self.step_last_return, self.step_bytes, self.step_bus_bytes = 0.0, None, 0, 0.0
        self.step_spans: list[tuple[float, float]] = []
        self.step_events: list[list] = []  # CUDA: [launch event, completion event, bytes] per bucket

    def record(self, seconds: float, nbytes: int, start: float | None, bus: float):
        """One bucket: ``nbytes`` this rank sent; ``bus`` the bucket's bytes in the nccl-tests bus
        convention (:func:`bus_bytes`), from which the profiler derives bus bandwidth."""
        self.seconds += seconds
        self.bytes += nbytes
        self.calls += 1
        if start is not None:
            self.step_spans.append((start, start + seconds))
            self.step_bytes += nbytes
            self.step_bus_bytes += bus

    def hook_returned(self, entered: float) -> None:
        """Called at the end of every hook call that entered at ``entered``."""
        now = time.perf_counter()
        self.step_in_hook += now - entered
        self.step_last_return = now

    def take_step(self) -> dict:
        """This step's hook timings (see the class docstring); cleared afterwards."""
        out = {"in_hook_s": self.step_in_hook, "last_return": self.step_last_return,
               "spans": list(self.step_spans), "bytes": self.step_bytes, "bus_bytes": self.step_bus_bytes,
               "timing": "launch" if self.launch_only else "duration",
               "events": [tuple(e) for e in self.step_events if e[1] is not None]}
        self._clear_step()
        return out


class HookState(SparseRule):
    """State of the communication hook: statistics, wire dtype, and the sparse rule (:class:`SparseRule`).

    Args:
        stats: where the hook records each bucket. world_size: the ranks the buckets are averaged over
            (the strategy's ``env.world_size``). wire_dtype: the dtype dense buckets travel in (None: the
            gradient's own).
        sparse_min_numel, sparse_max_density, mode: :class:`SparseRule`.
    """

    def __init__(self, stats: CommStats, world_size: int, wire_dtype: torch.dtype | None,
                 sparse_min_numel: int | None, sparse_max_density: float, mode: str = "counted"):
        super().__init__(sparse_min_numel, sparse_max_density, mode)
        self.stats, self.world_size, self.wire_dtype = stats, world_size, wire_dtype


def bus_bytes(kind: str, nbytes: float, world_size: int) -> float:
    """A collective's bytes in the nccl-tests "bus bandwidth" convention, so that bus bytes over time
    is comparable with the links' bandwidth whatever the collective (NVIDIA nccl-tests,
    doc/PERFORMANCE.md): an all-reduce of an ``nbytes`` buffer moves ``nbytes x 2 (W - 1) / W`` per
    rank; an all-gather of ``nbytes`` per rank moves ``nbytes x (W - 1)``."""
    if kind == "all_reduce":
        return nbytes * 2 * (world_size - 1) / world_size
    if kind == "all_gather":
        return nbytes * (world_size - 1)
    raise ValueError(f"bus_bytes: unknown collective {kind!r}")


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


def _finished_later(state, fut: torch.futures.Future, start: float, nbytes: int, kind: str, events: list | None
                    ) -> torch.futures.Future:
    """The hook's return for a bucket whose collective ``fut`` was launched at ``start``: a future that
    records the bucket's span and bytes (``kind``: the collective, for :func:`bus_bytes`) when it completes
    (on CUDA also its completion event: the callback's stream waits on the collective) and holds the bucket."""
    def done(f):
        if events is not None:  # the callback's stream waits on the collective: its completion on the GPU
            events[1] = D.timing_event()
        state.stats.record(time.perf_counter() - start, nbytes, start, bus_bytes(kind, nbytes, state.world_size))
        return f.value()

    out = fut.then(done)
    state.stats.hook_returned(start)
    return out


def _allreduce_bucket(state, bucket):
    """Launch ``bucket``'s exchange and return its future without waiting for it: dense, an all-reduce; sparse
    (the module docstring), one all-gather of every rank's (index, value) pairs, added into the bucket when it
    completes. Either way the backward goes on while it travels (the counted sparse exchange first reads its
    pairs' counts: a host synchronisation, its module docstring)."""
    buffer = bucket.buffer()
    start = time.perf_counter()
    state.stats.launch_only = D.device_timed(buffer.device)  # the host clock measures the launch only
    key = (bucket.index(), buffer.numel())
    if state.try_sparse(key, buffer):
        launched = launch_sparse_allreduce(buffer, state.world_size, state.sparse_max_density)
        if launched is None:
            state.found_dense(key)
        else:
            return _finished_later(state, launched[1], start, launched[0], "all_gather", None)
    wire_bytes = buffer.element_size() if state.wire_dtype is None else state.wire_dtype.itemsize
    capacity = state.capacity(bucket, buffer, state.world_size, wire_bytes)
    if capacity is not None:  # bounded: no host sync (module docstring)
        events = [D.timing_event(), None, 0] if D.device_timed(buffer.device) else None
        nbytes, overflow, fut = launch_bounded_sparse_allreduce(buffer, state.world_size, capacity)
        if events is not None:
            events[2] = nbytes
            state.stats.step_events.append(events)
        state.overflow = overflow if state.overflow is None else state.overflow + overflow
        return _finished_later(state, fut, start, nbytes, "all_gather", events)
    wire = buffer if state.wire_dtype is None else buffer.to(state.wire_dtype)
    nbytes = wire.numel() * wire.element_size()
    wire.div_(state.world_size)
    events = [D.timing_event(), None, nbytes] if D.device_timed(buffer.device) else None  # the launch, on the bucket's stream
    if events is not None:
        state.stats.step_events.append(events)

    def into_bucket(f):
        result = f.value()[0]
        if result is not buffer:
            buffer.copy_(result)
        return buffer

    fut = D.all_reduce_(wire, async_op=True).get_future().then(into_bucket)
    return _finished_later(state, fut, start, nbytes, "all_reduce", events)


def keep_out_of_ddp(model: nn.Module, params) -> None:
    """Mark ``params`` (parameters of ``model``) for the ``DistributedDataParallel`` that will wrap ``model``
    to leave alone: no bucket holds them and their gradients are not all-reduced (each rank keeps its own).
    Call before wrapping; an empty ``params`` clears the mark.

    Uses DDP's private ``_set_params_and_buffers_to_ignore_for_model`` (no public API does this); the 2-rank
    ``tests/dist/test_ddp.py::test_the_row_exchange_averages_rows_and_goes_dense_together`` fails if it
    disappears or stops working (a parameter kept out would be averaged).
    """
    # both spellings: DDP's reducer matches f"{module_name}.{param_name}" (".features" at the root), its
    # parameter list matches named_parameters()'s "features"
    names = [f"{m}.{n}" for m, module in model.named_modules()
             for n, p in module.named_parameters(recurse=False) if any(p is t for t in params)]
    names += [n for n, p in model.named_parameters() if any(p is t for t in params)]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)


class DDPStrategy(Strategy):
    """``strategy=ddp``.

    Config keys: ``bucket_cap_mb`` (DDP bucket size), ``find_unused_parameters``
    (False by default), ``gradient_as_bucket_view``, ``compression`` (``none``,
    ``fp16`` or ``bf16``: the dtype gradients travel in), ``sparse_min_numel``
    (buckets this large or larger may travel as (index, value) pairs; null disables),
    ``sparse_max_density``, ``sparse_mode`` (``auto``, ``counted``, ``bounded``: the module
    docstring).
    """

    name = "ddp"

    def __init__(self, cfg, env):
        super().__init__(cfg, env)
        if self.cfg.sparse_tables and sync_free(env.device):  # the grid's colour gradients are dense there
            raise ConfigError(
                "strategy.sparse_tables=true is refused on CUDA: the colour tables' gradients are dense there "
                "(the grid makes row-sparse gradients only where rows are counted without a host sync: the CPU), so "
                "the row exchange would all-reduce each dense table after the backward with a host read per table per step, slower than DDP's own "
                "buckets, which overlap the backward. Leave strategy.sparse_tables=false on CUDA")
        self.comm = CommStats()
        self.hook_state: HookState | None = None

    @property
    def sparse_mode(self) -> str:
        """``counted`` or ``bounded``: ``auto`` is ``bounded`` where the code takes the sync-free paths
        (:func:`~distnerf.host_buffers.sync_free`: CUDA, or the CPU inside ``sync_free_paths``; no host sync in
        the hook) and ``counted`` elsewhere (exact sizes, where reading them costs nothing)."""
        mode = self.cfg.sparse_mode
        return ("bounded" if sync_free(self.env.device) else "counted") if mode == "auto" else mode

    def wrap(self, model: nn.Module) -> nn.Module:
        self.model = model.to(self.env.device)
        if not self.env.has_peers:  # no peer: no gradient all-reduce
            self.wrapped = self.model
            return self.wrapped
        keep_out_of_ddp(self.model, self._sparse_tables())  # strategy.sparse_tables: these travel as rows
        ddp = DistributedDataParallel(
            self.model,
            device_ids=[self.env.device.index] if self.env.device.type == "cuda" else None,
            **D.ddp_buffer_kwargs(DistributedDataParallel),  # no buffer broadcast: occupancy is derived alike
            bucket_cap_mb=self.cfg.bucket_cap_mb,
            find_unused_parameters=self.cfg.find_unused_parameters,
            gradient_as_bucket_view=self.cfg.gradient_as_bucket_view,
        )
        wire = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}[self.cfg.compression]
        bounded = (self.sparse_mode == "bounded" and self.cfg.sparse_min_numel is not None
                   and isinstance(self.model, RadianceModel))
        pending = self.hook_state.overflow if self.hook_state is not None else None  # a rewrap keeps it for the check
        self.hook_state = HookState(self.comm, self.env.world_size, wire, self.cfg.sparse_min_numel,
                                    self.cfg.sparse_max_density, "bounded" if bounded else "counted")
        if bounded:  # the model's fixed capacity, asked at each hook call (its sample budget is set after wrap)
            self.hook_state.entry_capacity = self.model.gradient_entry_capacity
        self.hook_state.overflow = pending
        ddp.register_comm_hook(self.hook_state, timed_allreduce_hook)
        self.wrapped = ddp
        return ddp

    def dense_gradients(self) -> bool:
        """With peers, DDP's buckets (and its comm hook) need dense gradients, unless ``strategy.sparse_tables``
        exchanges the model's row-sparse tables outside them (:meth:`_sparse_tables`)."""
        return self.env.has_peers and not self._sparse_tables()

    def _sparse_tables(self) -> list[nn.Parameter]:
        """``strategy.sparse_tables``: the model's row-sparse tables (:meth:`RadianceModel.sparse_parameters`),
        kept out of DDP's buckets; else []."""
        if not self.cfg.sparse_tables or not isinstance(self.model, RadianceModel):
            return []
        return list(self.model.sparse_parameters())

    def _launch_rows(self, table: nn.Parameter) -> torch.futures.Future:
        """Launch the exchange of a sparse table's gradient (:func:`launch_row_exchange`: rows where every rank
        made them, else a dense all-reduce); a rank whose samples read none of the table sends no rows."""
        start = time.perf_counter()
        grad = table.grad
        if grad is None:
            grad = torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.long, device=table.device),
                                           table.new_zeros((0, *table.shape[1:])), table.shape)
        nbytes, fut, kind = launch_row_exchange(grad, self.env.world_size)
        return _finished_later(self.hook_state, fut, start, nbytes, kind, None)

    def finish_gradients(self) -> None:
        """``strategy.sparse_tables``: exchange the sparse tables' gradients and set each to the average over
        ranks. After the backward (DDP's buckets done), in the tables' fixed order on every rank: the collectives
        of all ranks line up whatever order the backward made the gradients in (the exchange does not overlap
        the backward; its time is exposed, and measured as such)."""
        # every table on every rank, with a gradient or not (a rank whose samples read no row of it sends none)
        pending = [(t, self._launch_rows(t)) for t in self._sparse_tables()]
        for table, fut in pending:
            table.grad = fut.wait()

    def check_exchange(self) -> None:
        """Raise on every rank when any rank's ``bounded`` sparse exchange found more non-zeros than
        its capacity since the last check (a bound that does not hold: the gradients of those steps
        were wrong). Collective (every rank at the same step: a logging step, and before every
        checkpoint, so no checkpoint keeps such parameters); reads the device there, not in the step.

        Raises:
            RuntimeError: naming the entries lost over all ranks.
        """
        state = self.hook_state
        if state is None or state.mode != "bounded" or not self.env.has_peers:
            return
        local = 0.0 if state.overflow is None else float(state.overflow)  # host sync: here only
        state.overflow = None
        lost = D.all_reduce_sum(self.env, torch.tensor([local], dtype=torch.float64))[0].item()  # collective
        if lost:
            raise RuntimeError(f"ddp bounded sparse exchange: {int(lost)} non-zero gradient entries (over all ranks) "
                               "exceeded their fixed capacity (model.gradient_entry_capacity is wrong for "
                               "this model); the run stops without saving")

    def comm_stats(self) -> dict:
        """Since the last call: seconds (``allreduce_launch_s`` on NCCL, see the module docstring),
        bytes and calls. Collective under the ``bounded`` exchange (:meth:`check_exchange`).

        Raises:
            RuntimeError: see :meth:`check_exchange`.
        """
        self.check_exchange()
        seconds_key = "allreduce_launch_s" if self.comm.launch_only else "allreduce_s"
        out = {seconds_key: self.comm.seconds, "allreduce_bytes": self.comm.bytes,
               "allreduce_calls": self.comm.calls}
        self.comm.reset()
        return out

    def step_comm(self) -> dict | None:
        """This step's hook timings (:meth:`CommStats.take_step`); None without a peer (no DDP wrapper)."""
        return self.comm.take_step() if self.env.has_peers else None
