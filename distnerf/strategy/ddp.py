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

Sparse buckets. A voxel-grid table's gradient touches few rows per step, so a bucket of at
least ``sparse_min_numel`` entries may travel as (index, value) pairs, in one of two ways
(``sparse_mode``; ``auto``: ``counted`` on the CPU, ``bounded`` on CUDA):

- ``counted`` (:func:`sparse_allreduce_`): a ``nonzero`` over the bucket and an all-gather of
  the counts size the pairs exactly; a bucket with more than ``sparse_max_density`` of its
  entries non-zero falls back to a dense all-reduce and is looked at again only every
  :data:`SPARSE_REVISIT` steps. Reading the counts is a host synchronisation in the hook (free
  on the CPU, a stall of the backward on CUDA).
- ``bounded`` (:func:`bounded_sparse_allreduce_`): no host synchronisation. The forward
  records how many rows it read of each vertex table (host integers, from shapes:
  :meth:`~distnerf.model.base.RadianceModel.gradient_entry_bounds`); the step agreement,
  which already all-reduces host numbers between forward and backward, carries every rank's
  bounds, so all ranks know the largest (:meth:`DDPStrategy.step_extra`). A bucket's
  capacity is the sum of its parameters' agreed bounds (a parameter without one counts all its
  entries); its non-zeros are compacted into that fixed capacity on the device
  (``torch.nonzero_static``, or a prefix sum and a scatter where it has no kernel) and
  all-gathered. The capacity holds every non-zero by construction, so the
  result equals the dense average. The bucket goes sparse when that moves fewer bytes than a
  ring all-reduce (:func:`sparse_pays`) and the bound is at most ``sparse_max_density`` of
  the bucket; else dense. An overflow (a bound that does not hold: a bug) is counted on the
  device and raised on every rank at the next logging step or checkpoint
  (:meth:`DDPStrategy.check_exchange`). Sparse buckets travel in the gradient's dtype
  (``compression`` applies to dense buckets). Their logged bytes are each rank's payload; the
  bus bandwidth the profiler derives counts each bucket in its own collective's convention
  (:func:`bus_bytes`: all-gather or all-reduce).
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


class HookState:
    """State of the communication hook: statistics, wire dtype and the sparse rule.

    Args:
        sparse_min_numel: buckets at least this large are all-reduced sparsely when
            at most ``sparse_max_density`` of their entries are non-zero (voxel-grid
            tables: a step touches few vertices). ``None`` disables it.
    """

    def __init__(self, stats: CommStats, wire_dtype: torch.dtype | None, sparse_min_numel: int | None,
                 sparse_max_density: float, mode: str = "counted"):
        self.stats, self.wire_dtype = stats, wire_dtype
        self.sparse_min_numel, self.sparse_max_density = sparse_min_numel, sparse_max_density
        self.mode = mode  # counted | bounded (module docstring)
        #: bounded: id(parameter) -> the largest bound over ranks on its gradient's non-zero
        #: entries for the step in progress (set by the step agreement; empty: no bound, dense)
        self.bounds: dict[int, int] = {}
        self.overflow: torch.Tensor | None = None  # bounded: non-zeros that found no slot (a bug), on the device
        # per bucket (index, size: DDP rebuilds its buckets after the first step): the hook call
        # from which a bucket found dense is looked at again, and the calls so far
        self.dense_until: dict[tuple[int, int], int] = {}
        self.calls: dict[tuple[int, int], int] = {}

    def try_sparse(self, key: tuple[int, int], buffer: torch.Tensor) -> bool:
        """Whether to attempt the sparse exchange of bucket ``key`` now (every rank decides
        the same: the rule depends only on call counts and on the counts all ranks exchanged)."""
        call = self.calls.get(key, 0)
        self.calls[key] = call + 1
        return (self.mode == "counted" and self.sparse_min_numel is not None
                and buffer.numel() >= self.sparse_min_numel and not buffer.is_cuda
                and call >= self.dense_until.get(key, 0))

    def capacity(self, bucket, buffer: torch.Tensor, world_size: int, dense_value_bytes: int) -> int | None:
        """``bounded``: the fixed number of (index, value) slots per rank for this bucket, or None to
        all-reduce it densely. The same on every rank: it depends on the agreed bounds and sizes only."""
        if self.mode != "bounded" or self.sparse_min_numel is None or buffer.numel() < self.sparse_min_numel:
            return None
        cap = sum(self.bounds.get(id(p), p.numel()) for p in bucket.parameters())
        if cap > self.sparse_max_density * buffer.numel():
            return None
        if not sparse_pays(cap, buffer.numel(), world_size, buffer.element_size(), dense_value_bytes):
            return None
        return cap

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


INDEX_DTYPE = torch.int32  # bounded exchange: buckets hold fewer than 2^31 entries (checked)


def sparse_pays(capacity: int, numel: int, world_size: int, value_bytes: int, dense_value_bytes: int) -> bool:
    """Whether an all-gather of ``capacity`` (int32 index, value) pairs per rank sends fewer bytes
    per rank than a ring all-reduce of the ``numel``-entry bucket.

    A ring all-gather of W parts sends (W - 1) x part bytes per rank; a ring all-reduce sends
    2 (W - 1) / W x the bucket's bytes (reduce-scatter then all-gather; Thakur et al., "Optimization
    of collective communication operations in MPICH", 2005). So the pairs pay when
    ``capacity x (4 + value_bytes) x W < 2 x numel x dense_value_bytes``: at W = 2 with float32,
    when at most half the entries can be non-zero; at W = 8 an eighth. An all-gather grows with
    the world size, so the sparse exchange suits few ranks, or very sparse buckets.
    """
    return capacity * (INDEX_DTYPE.itemsize + value_bytes) * world_size < 2 * numel * dense_value_bytes


_STATIC_NONZERO: dict[str, bool] = {}  # device type -> whether torch.nonzero_static runs there


def static_nonzero_available(device: torch.device) -> bool:
    """Whether ``torch.nonzero_static`` has a kernel for ``device``'s type (a probe on a tiny
    tensor, once per process: CUDA has one, with no host sync, since torch 2.6; the CPU since 2.1)."""
    kind = device.type
    if kind not in _STATIC_NONZERO:
        try:
            torch.nonzero_static(torch.zeros(2, device=device), size=1, fill_value=0)
            _STATIC_NONZERO[kind] = True
        except (AttributeError, NotImplementedError, RuntimeError):
            _STATIC_NONZERO[kind] = False
    return _STATIC_NONZERO[kind]


def compact_nonzeros(buffer: torch.Tensor, capacity: int, static: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``capacity`` non-zero positions of the flat ``buffer``, in order, padded with 0, and
    the number of non-zeros (a 0-dim int64 tensor on the device): no data-dependent size is read.

    With ``static`` (default: :func:`static_nonzero_available`) one ``torch.nonzero_static``;
    otherwise an inclusive prefix sum of the non-zero mask gives each non-zero its slot
    (``cumsum - 1``), and a scatter writes the positions (zeros and non-zeros past the capacity
    go to a spare slot that is dropped). Both give the same tensor.

    Returns:
        ((capacity,) int64 positions, 0-dim int64 count).
    """
    n = buffer.numel()
    count = torch.count_nonzero(buffer)
    if static is None:
        static = static_nonzero_available(buffer.device)
    if static:
        return torch.nonzero_static(buffer, size=capacity, fill_value=0).view(-1), count
    nonzero = buffer != 0
    slot = torch.cumsum(nonzero, 0) - 1
    slot = torch.where(nonzero & (slot < capacity), slot, capacity)
    index = torch.zeros(capacity + 1, dtype=torch.int64, device=buffer.device)
    index.scatter_(0, slot, torch.arange(n, device=buffer.device))
    return index[:capacity], count


def bounded_sparse_allreduce_(buffer: torch.Tensor, world_size: int, capacity: int,
                              static: bool | None = None) -> tuple[int, torch.Tensor]:
    """Average the flat ``buffer`` over ranks, exchanging ``capacity`` (index, value) slots per rank,
    with no host synchronisation (no data-dependent size is read).

    The non-zeros are compacted in order into the slots (:func:`compact_nonzeros`; ``static``
    chooses its kernel); unused slots hold (index 0, value 0), which add nothing. Every rank
    all-gathers the slots (fixed size: the capacity is the same on every rank) and accumulates
    them into the zeroed buffer in rank order with ``index_add_``. With the capacity at least
    every rank's non-zero count, the result equals a dense average (bitwise for 2 ranks: a sum of
    two values does not depend on order; on CUDA ``index_add_`` is atomic, so for more ranks the
    order of the sum, and its rounding, may vary).

    Args:
        buffer: (N,) float gradient bucket, N < 2^31; overwritten with the average.
        world_size: W. capacity: slots per rank (>= 0), the same on every rank.
    Returns:
        (bytes this rank sent: capacity x (4 + value bytes), 0-dim int64 tensor on the buffer's
        device: this rank's non-zeros that found no slot, 0 when the capacity held them).
    Raises:
        ValueError: when the bucket has 2^31 entries or more (int32 indices).
    """
    n = buffer.numel()
    if n >= 2 ** 31:
        raise ValueError(f"bounded sparse exchange: a bucket of {n} entries needs int64 indices")
    position, count = compact_nonzeros(buffer, capacity, static)
    real = torch.arange(capacity, device=buffer.device) < count
    values = torch.where(real, buffer.index_select(0, position) / world_size, 0.0).to(buffer.dtype)
    index = position.to(INDEX_DTYPE)
    all_index, all_values = D.all_gather(index), D.all_gather(values)
    buffer.zero_()
    for idx, val in zip(all_index, all_values):
        buffer.index_add_(0, idx, val)
    overflow = (count - capacity).clamp(min=0)
    return capacity * (index.element_size() + values.element_size()), overflow


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


def _done_in_hook(state, buffer: torch.Tensor, start: float) -> torch.futures.Future:
    """A completed future holding ``buffer``: a sparse exchange finished inside the hook."""
    fut = torch.futures.Future()
    fut.set_result(buffer)
    state.stats.hook_returned(start)
    return fut


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
            state.stats.record(time.perf_counter() - start, nbytes, start, bus_bytes("all_gather", nbytes, D.world_size()))
            return _done_in_hook(state, buffer, start)
    wire_bytes = buffer.element_size() if state.wire_dtype is None else state.wire_dtype.itemsize
    capacity = state.capacity(bucket, buffer, D.world_size(), wire_bytes)
    if capacity is not None:  # bounded: no host sync (module docstring)
        events = [D.timing_event(), None, 0] if buffer.is_cuda else None
        nbytes, overflow = bounded_sparse_allreduce_(buffer, D.world_size(), capacity)
        if events is not None:  # the current stream waited for the all-gathers: their end on the GPU
            events[1], events[2] = D.timing_event(), nbytes
            state.stats.step_events.append(events)
        state.overflow = overflow if state.overflow is None else state.overflow + overflow
        state.stats.record(time.perf_counter() - start, nbytes, start,  # on CUDA: the launch (as below)
                           bus_bytes("all_gather", nbytes, D.world_size()))
        return _done_in_hook(state, buffer, start)
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
        state.stats.record(time.perf_counter() - start, nbytes, start, bus_bytes("all_reduce", nbytes, D.world_size()))
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
    (buckets this large or larger may travel as (index, value) pairs; null disables),
    ``sparse_max_density``, ``sparse_mode`` (``auto``, ``counted``, ``bounded``: the module
    docstring).
    """

    name = "ddp"

    def __init__(self, cfg, env):
        super().__init__(cfg, env)
        self.comm = CommStats()
        self.hook_state: HookState | None = None
        self._bounded_tables: list[nn.Parameter] = []  # step_extra's tables, in its slot order

    @property
    def sparse_mode(self) -> str:
        """``counted`` or ``bounded``: ``auto`` is ``bounded`` on CUDA (no host sync in the hook)
        and ``counted`` elsewhere (exact sizes, where reading them costs nothing)."""
        mode = self.cfg.sparse_mode
        return ("bounded" if self.env.device.type == "cuda" else "counted") if mode == "auto" else mode

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
        bounded = (self.sparse_mode == "bounded" and self.cfg.sparse_min_numel is not None
                   and isinstance(self.model, RadianceModel))
        if bounded:
            self.model.record_rows_read = True  # the forward notes the rows it reads (host integers)
            self.model.reset_rows_read()
        pending = self.hook_state.overflow if self.hook_state is not None else None  # a rewrap keeps it for the check
        self.hook_state = HookState(self.comm, wire, self.cfg.sparse_min_numel, self.cfg.sparse_max_density,
                                    "bounded" if bounded else "counted")
        self.hook_state.overflow = pending
        ddp.register_comm_hook(self.hook_state, timed_allreduce_hook)
        self.wrapped = ddp
        return ddp

    def step_extra(self) -> list[float]:
        """Under the ``bounded`` sparse exchange, every rank's bounds on its tables' gradient entries
        from this step's forward, carried by the step agreement's one all-reduce: each rank puts its
        k bounds in its own k of W x k slots (zeros elsewhere), so the sum hands every rank every
        rank's bounds (:meth:`take_step_extra`). Host numbers only: nothing is read from the device."""
        state = self.hook_state
        if state is None or state.mode != "bounded":
            return []
        self._bounded_tables = tables = self.model.bounded_parameters()
        bounds = self.model.gradient_entry_bounds()
        self.model.reset_rows_read()
        k, rank = len(tables), self.env.rank
        slots = [0.0] * (k * self.env.world_size)
        slots[rank * k:(rank + 1) * k] = [float(bounds[id(p)]) for p in tables]  # exact in float64 (< 2^53)
        return slots

    def take_step_extra(self, sums: list[float]) -> None:
        """The hook sizes each bucket by the largest bound over ranks (the same on every rank)."""
        if not sums:
            return
        tables, world = self._bounded_tables, self.env.world_size
        k = len(tables)
        self.hook_state.bounds = {id(p): int(max(sums[r * k + i] for r in range(world))) for i, p in enumerate(tables)}

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
        lost = self.sum_over_ranks([local])[0]
        if lost:
            raise RuntimeError(f"ddp bounded sparse exchange: {int(lost)} non-zero gradient entries (over all ranks) "
                               "exceeded the capacity their bounds gave (model.gradient_entry_bounds is wrong for "
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
