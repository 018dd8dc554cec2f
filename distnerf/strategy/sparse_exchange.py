"""The sparse exchange of DDP's gradient buckets (:mod:`distnerf.strategy.ddp`'s communication hook
calls it): which buckets travel as (index, value) pairs (:class:`SparseRule`) and the two exchanges.

A voxel-grid table's gradient touches few rows per step, so a bucket of at
least ``sparse_min_numel`` entries may travel as (index, value) pairs, in one of two ways
(``sparse_mode``; ``auto``: ``counted`` on the CPU, ``bounded`` on CUDA):

Bytes are not time: the sparse exchange also scans, compacts and re-zeroes the whole bucket and scatters
W x its pairs, work a dense ring all-reduce does not do. Measured on gloo (``bench/scaling/exchange.py``,
2 ranks, a 4 M-entry bucket) it is faster than the dense all-reduce only below about 2% non-zeros (0.76x the
time at 1%, 1.58x at 5%, 4.5x at 25%) while its bytes are smaller up to 50%: hence the default
``sparse_max_density`` of 0.02, the bound on top of the byte rule (:func:`sparse_pays`).

- ``counted`` (:func:`launch_sparse_allreduce`): a ``nonzero`` over the bucket and an all-gather of
  the counts size the pairs exactly; a bucket with more than ``sparse_max_density`` of its
  entries non-zero falls back to a dense all-reduce and is looked at again only every
  :data:`SPARSE_REVISIT` steps. Reading the counts is a host synchronisation in the hook (free
  on the CPU, a stall of the backward on CUDA).
- ``bounded`` (:func:`launch_bounded_sparse_allreduce`): no host synchronisation and no agreement. Each
  vertex table has a fixed capacity of gradient entries a training forward can make non-zero, from
  sizes every rank knows alike (the static step's P sample slots, 8 corner rows each:
  :meth:`~distnerf.model.base.RadianceModel.gradient_entry_capacity`; a table without one counts all
  its entries). Why every rank holds the same capacities without exchanging them: they depend on P
  (the config) and the tables' shapes (replicas change them at the same step: an upsampling), never
  on this step's forward, so the all-gathers' sizes match. A bucket's
  capacity is the sum of its parameters' capacities; its non-zeros are compacted into it on the
  device (``torch.nonzero_static``, or a prefix sum and a scatter where it has no kernel) and
  all-gathered. The capacity holds every non-zero by construction, so the
  result equals the dense average. The bucket goes sparse when that moves fewer bytes than a
  ring all-reduce (:func:`sparse_pays`) and the bound is at most ``sparse_max_density`` of
  the bucket; else dense. An overflow (a bound that does not hold: a bug) is counted on the
  device and raised on every rank at the next logging step or checkpoint
  (:meth:`~distnerf.strategy.ddp.DDPStrategy.check_exchange`). Sparse buckets travel in the gradient's dtype
  (``compression`` applies to dense buckets).
"""
from __future__ import annotations

import math

import torch

from .. import distributed as D
from ..host_buffers import compact_nonzeros, static_nonzero_available, sync_free  # noqa: F401 (also imported from here)

SPARSE_REVISIT = 50  # steps between two looks at a bucket found too dense for the sparse exchange


class SparseRule:
    """Which buckets travel sparse, and how (the module docstring): the same decision on every rank.

    Args:
        sparse_min_numel: buckets at least this large are all-reduced sparsely when
            at most ``sparse_max_density`` of their entries are non-zero (voxel-grid
            tables: a step touches few vertices). ``None`` disables it.
        mode: ``counted`` or ``bounded``.
    """

    def __init__(self, sparse_min_numel: int | None, sparse_max_density: float, mode: str = "counted"):
        self.sparse_min_numel, self.sparse_max_density = sparse_min_numel, sparse_max_density
        self.mode = mode  # counted | bounded (module docstring)
        #: bounded: () -> {id(parameter): fixed capacity of its gradient's non-zero entries} (the model's
        #: ``gradient_entry_capacity``, the same on every rank); a parameter left out counts all its entries
        self.entry_capacity = dict
        self.overflow: torch.Tensor | None = None  # bounded: non-zeros that found no slot (a bug), on the device
        # per bucket (index, size: DDP rebuilds its buckets after the first step): the hook call
        # from which a bucket found dense is looked at again, and the calls so far
        self.dense_until: dict[tuple[int, int], int] = {}
        self.calls: dict[tuple[int, int], int] = {}

    def try_sparse(self, key: tuple[int, int], buffer: torch.Tensor) -> bool:
        """Whether to attempt the sparse exchange of bucket ``key`` now (every rank decides
        the same: the rule depends only on call counts and on the counts all ranks exchanged). Never
        where the code takes the sync-free paths (:func:`~distnerf.host_buffers.sync_free`: CUDA): the
        counted exchange's sizes are a host read there, so the bucket goes dense."""
        call = self.calls.get(key, 0)
        self.calls[key] = call + 1
        return (self.mode == "counted" and self.sparse_min_numel is not None
                and buffer.numel() >= self.sparse_min_numel and not sync_free(buffer.device)  # its count: a host read
                and call >= self.dense_until.get(key, 0))

    def capacity(self, bucket, buffer: torch.Tensor, world_size: int, dense_value_bytes: int) -> int | None:
        """``bounded``: the fixed number of (index, value) slots per rank for this bucket, or None to
        all-reduce it densely. The same on every rank: it depends on fixed capacities and sizes only."""
        if self.mode != "bounded" or self.sparse_min_numel is None or buffer.numel() < self.sparse_min_numel:
            return None
        capacity = self.entry_capacity()
        cap = sum(min(capacity.get(id(p), p.numel()), p.numel()) for p in bucket.parameters())
        if cap > self.sparse_max_density * buffer.numel():
            return None
        if not sparse_pays(cap, buffer.numel(), world_size, buffer.element_size(), dense_value_bytes):
            return None
        return cap

    def found_dense(self, key: tuple[int, int]) -> None:
        self.dense_until[key] = self.calls[key] - 1 + SPARSE_REVISIT


def _pack(index: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """One rank's (index, value) slots as one byte payload, so that a single all-gather carries both."""
    return torch.cat([index.contiguous().view(torch.uint8).view(-1), values.contiguous().view(torch.uint8).view(-1)])


def _accumulate_(buffer: torch.Tensor, gathered: torch.Tensor, slots: int, index_dtype: torch.dtype) -> torch.Tensor:
    """Zero ``buffer`` and add every rank's gathered slots into it with one ``index_add_`` (rank order: the
    slots are concatenated rank after rank, and a 1-D ``index_add_`` on the CPU adds in index order).

    Args:
        buffer: (N,) float bucket. gathered: (W x P,) uint8, the ranks' :func:`_pack` payloads in rank order,
            each ``slots`` indices of ``index_dtype`` then ``slots`` values of the buffer's dtype.
    """
    buffer.zero_()
    if slots == 0:
        return buffer
    width = index_dtype.itemsize * slots
    rows = gathered.view(-1, width + buffer.element_size() * slots)
    index = rows[:, :width].contiguous().view(index_dtype).view(-1)
    values = rows[:, width:].contiguous().view(buffer.dtype).view(-1)
    buffer.index_add_(0, index, values)
    return buffer


def _when_done(work, result) -> torch.futures.Future:
    """A future holding ``result()`` once the collective ``work`` completes; ``work`` None (it completed, or
    there was no peer): a completed one."""
    if work is None:
        fut = torch.futures.Future()
        fut.set_result(result())
        return fut
    return work.get_future().then(lambda _: result())


def _exchange(buffer: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> torch.futures.Future:
    """Launch the all-gather of every rank's slots (one collective, asynchronous) and return a future that
    holds ``buffer`` once the slots are added into it (:func:`_accumulate_`); alone, a completed one."""
    gathered, work = D.all_gather_into(_pack(index, values), async_op=True)
    slots, index_dtype = index.numel(), index.dtype
    return _when_done(work, lambda: _accumulate_(buffer, gathered, slots, index_dtype))


def launch_sparse_allreduce(buffer: torch.Tensor, world_size: int, max_density: float
                            ) -> tuple[int, torch.futures.Future] | None:
    """Average ``buffer`` over ranks exchanging only its non-zero entries (the ``counted`` exchange),
    launched asynchronously.

    Every rank all-gathers its non-zeros' counts (a host read: the sizes), then (index, value /
    world_size) pairs of its non-zeros padded to the largest count, in one collective, and the pairs
    are added into the zeroed buffer in rank order by one ``index_add_`` when it completes. Zeros and
    the padding (index 0, value 0) contribute nothing, so the result equals a dense average (bitwise for
    2 ranks, where a sum of two values does not depend on order). When any rank holds more than
    ``max_density`` non-zeros the exchange is not done (the caller falls back to a dense all-reduce):
    the decision is taken from the gathered counts, so every rank takes the same branch.

    Returns:
        (bytes this rank sent: indices + values, padded; a future holding ``buffer`` once it holds the
        average), or None when not done (``buffer`` untouched).
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
    return width * (index_p.element_size() + values_p.element_size()), _exchange(buffer, index_p, values_p)


def sparse_allreduce_(buffer: torch.Tensor, world_size: int, max_density: float) -> int | None:
    """:func:`launch_sparse_allreduce`, waited for: ``buffer`` holds the average on return.

    Returns:
        bytes this rank sent (indices + values, padded), or None when not done.
    """
    launched = launch_sparse_allreduce(buffer, world_size, max_density)
    if launched is None:
        return None
    launched[1].wait()
    return launched[0]


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


def launch_bounded_sparse_allreduce(buffer: torch.Tensor, world_size: int, capacity: int, static: bool | None = None
                                    ) -> tuple[int, torch.Tensor, torch.futures.Future]:
    """Average the flat ``buffer`` over ranks, exchanging ``capacity`` (index, value) slots per rank,
    with no host synchronisation (no data-dependent size is read), launched asynchronously: the
    caller (DDP's communication hook) returns its future while the backward goes on.

    The non-zeros are compacted in order into the slots (:func:`compact_nonzeros`; ``static``
    chooses its kernel); unused slots hold (index 0, value 0), which add nothing. Every rank
    all-gathers its slots (fixed size: the capacity is the same on every rank; indices and values
    in one collective) and, when it completes, they are added into the zeroed buffer in rank order
    by one ``index_add_`` (not one per rank). With the capacity at least every rank's non-zero
    count, the result equals a dense average (bitwise for 2 ranks: a sum of two values does not
    depend on order; on CUDA ``index_add_`` is atomic, so for more ranks the order of the sum, and
    its rounding, may vary).

    Args:
        buffer: (N,) float gradient bucket, N < 2^31; overwritten with the average once the future completes.
        world_size: W. capacity: slots per rank (>= 0), the same on every rank.
    Returns:
        (bytes this rank sent: capacity x (4 + value bytes); 0-dim int64 tensor on the buffer's
        device: this rank's non-zeros that found no slot, 0 when the capacity held them; a future
        holding ``buffer`` once it holds the average).
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
    overflow = (count - capacity).clamp(min=0)
    return capacity * (index.element_size() + values.element_size()), overflow, _exchange(buffer, index, values)


def bounded_sparse_allreduce_(buffer: torch.Tensor, world_size: int, capacity: int,
                              static: bool | None = None) -> tuple[int, torch.Tensor]:
    """:func:`launch_bounded_sparse_allreduce`, waited for: ``buffer`` holds the average on return.

    Returns:
        (bytes this rank sent, 0-dim int64 overflow tensor): :func:`launch_bounded_sparse_allreduce`.
    Raises:
        ValueError: when the bucket has 2^31 entries or more (int32 indices).
    """
    nbytes, overflow, fut = launch_bounded_sparse_allreduce(buffer, world_size, capacity, static)
    fut.wait()
    return nbytes, overflow


def launch_row_exchange(grad: torch.Tensor, world_size: int) -> tuple[int, torch.futures.Future, str]:
    """Average a table's gradient over ranks by exchanging its **rows** where every rank made it row-sparse
    (``strategy.sparse_tables``: a voxel grid's colour-feature table, whose backward makes a sparse COO tensor
    of the rows a step read when they are fewer than the table's rows,
    :func:`~distnerf.model.grid_tables.sparse_table_grad`), launched asynchronously. Nothing dense is scanned,
    zeroed or reduced: each rank sends its rows and receives the others'.

    Every rank all-gathers (its row count, whether its gradient is dense): a host read, which also makes the
    choice the same on every rank. When any rank's gradient is dense (its step read more corners than the table
    has rows), every rank all-reduces the dense mean (a sparse one made dense). Otherwise every rank all-gathers
    its (row, value / world_size) pairs padded to the largest count, in one collective (rows as int32, values in
    the gradient's dtype); when it completes, each rank's first ``count`` pairs (the padding dropped) form one
    uncoalesced sparse tensor in rank order, so a row two ranks read appears twice and coalescing (lazy Adam's)
    sums it: the average of the ranks' gradients, the gradient of the global mean loss (every rank's loss is its
    batch's mean). Rows no rank read stay absent, so lazy Adam leaves them, as in one process.

    Args:
        grad: (V, C) float gradient: sparse COO over rows (``sparse_dim() == 1``) or dense.
        world_size: W.
    Returns:
        (bytes this rank sent, padded; a future holding the average: sparse COO or dense; the collective,
        ``all_gather`` or ``all_reduce``).
    Raises:
        ValueError: a sparse ``grad`` not sparse over rows alone, or V does not fit int32.
    """
    if grad.is_sparse and grad.sparse_dim() != 1:
        raise ValueError(f"launch_row_exchange: a gradient sparse over rows is needed, got {grad.sparse_dim()} "
                         "sparse dims")
    if grad.shape[0] >= 2 ** 31:
        raise ValueError(f"launch_row_exchange: {grad.shape[0]} rows do not fit int32 indices")
    rows = grad._indices()[0].to(torch.int32) if grad.is_sparse else None
    mine = torch.tensor([0 if rows is None else rows.numel(), int(not grad.is_sparse)], device=grad.device)
    gathered_counts = torch.stack(D.all_gather(mine)).tolist()  # [[count, dense], ...] in rank order
    if any(dense for _, dense in gathered_counts):  # every rank takes this branch alike
        dense_grad = (grad.to_dense() if grad.is_sparse else grad).div_(world_size)
        fut = D.all_reduce_(dense_grad, async_op=True).get_future().then(lambda f: f.value()[0])
        return dense_grad.numel() * dense_grad.element_size(), fut, "all_reduce"
    counts = [int(c) for c, _ in gathered_counts]
    values = grad._values()
    width = max(counts)
    pad = width - rows.numel()
    rows_p = torch.cat([rows, rows.new_zeros(pad)])
    values_p = torch.cat([values / world_size, values.new_zeros((pad, *values.shape[1:]))])
    gathered, work = D.all_gather_into(_pack(rows_p, values_p), async_op=True)
    row_bytes = 4 + values.element_size() * math.prod(grad.shape[1:])  # int32 row + its C values

    def union() -> torch.Tensor:
        per_rank = gathered.view(len(counts), width * row_bytes)
        index = per_rank[:, :4 * width].contiguous().view(torch.int32).view(len(counts), width)
        vals = per_rank[:, 4 * width:].contiguous().view(values.dtype).view(len(counts), width, *values.shape[1:])
        index = torch.cat([index[r, :c] for r, c in enumerate(counts)]).long()
        vals = torch.cat([vals[r, :c] for r, c in enumerate(counts)])
        return torch.sparse_coo_tensor(index[None], vals, grad.shape, check_invariants=False)

    return width * row_bytes, _when_done(work, union), "all_gather"
