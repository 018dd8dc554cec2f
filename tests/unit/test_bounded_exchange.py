"""The bounded sparse gradient exchange (issue 26 item 9), without a process group.

The two-rank run on gloo, against a one-process float64 reference, is
``tests/dist/test_ddp.py`` (mode ``bounded``). Here: the compaction against the buffer's own
non-zeros, the overflow count, the absence of host syncs (against the counted exchange,
which has them), the byte rule by hand, and the model's fixed capacity against real gradients.
"""
from __future__ import annotations

import pytest
import torch

from distnerf.model.grid import GridModel
from distnerf.observe.syncs import SyncCounter
from distnerf.strategy.sparse_exchange import bounded_sparse_allreduce_, compact_nonzeros, sparse_allreduce_, sparse_pays


def _sparse_buffer(n: int, nonzeros: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    buffer = torch.zeros(n)
    where = torch.randperm(n, generator=gen)[:nonzeros]
    buffer[where] = torch.randn(nonzeros, generator=gen)
    return buffer


@pytest.mark.parametrize("static", [True, False])  # torch.nonzero_static, and the prefix sum where it has no kernel
@pytest.mark.parametrize("capacity", [1, 36, 37, 50])
def test_compaction_is_the_first_non_zeros_in_order_and_their_count(static, capacity):
    buffer = _sparse_buffer(1000, 37, seed=capacity)
    position, count = compact_nonzeros(buffer, capacity, static)
    expected = buffer.nonzero().view(-1)[:capacity]
    assert int(count) == 37 and position.shape == (capacity,)
    assert torch.equal(position[:expected.numel()], expected)
    assert not position[expected.numel():].any()  # padding: 0


@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("capacity", [38, 50, 999])  # 38 non-zeros: the buffer's 37 and position 0
def test_alone_the_exchange_returns_the_buffer_and_bytes_of_its_slots(capacity, static):
    buffer = _sparse_buffer(1000, 37)
    buffer[0] = 0.5  # a real non-zero at position 0, where the padding slots point too
    expected = buffer.clone()
    nbytes, overflow = bounded_sparse_allreduce_(buffer, 1, capacity, static)
    assert torch.equal(buffer, expected)
    assert nbytes == capacity * (4 + 4)  # int32 index + float32 value per slot
    assert int(overflow) == 0


@pytest.mark.parametrize("static", [True, False])
def test_non_zeros_past_the_capacity_are_counted_as_overflow_not_hidden(static):
    buffer = _sparse_buffer(1000, 37, seed=1)
    original = buffer.clone()
    _, overflow = bounded_sparse_allreduce_(buffer, 1, 30, static)
    assert int(overflow) == 7
    kept = original.nonzero().view(-1)[:30]  # the first 30 in order found a slot, the rest did not
    assert torch.equal(buffer.nonzero().view(-1), kept)
    assert torch.equal(buffer[kept], original[kept])


@pytest.mark.parametrize("static", [True, False])
def test_the_bounded_exchange_reads_nothing_from_the_device_the_counted_one_does(static):
    with SyncCounter() as bounded:
        bounded_sparse_allreduce_(_sparse_buffer(4000, 300), 1, 400, static)
    with SyncCounter() as counted:
        sparse_allreduce_(_sparse_buffer(4000, 300), 1, 0.25)
    assert bounded.total == 0, bounded.by_op()
    assert counted.total >= 2, counted.by_op()  # the nonzero and the counts' tolist: the counter can fail


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])  # bounded slots, counted pairs
def test_the_ranks_slots_are_added_by_one_index_add_whatever_the_world_size(index_dtype):
    """Issue 50 item 3: the gathered slots of W ranks (each rank's (index, value) payload as the exchange packs
    it, padding included) are added into the bucket by the same operators at W = 2, 4 and 8 (one
    ``index_add_``, not one per rank), and equal the float64 sum of the ranks' sparse buffers."""
    from distnerf.observe.ops import OpCounter
    from distnerf.strategy.sparse_exchange import _accumulate_, _pack

    ops = {}
    for world_size in (2, 4, 8):
        parts = [_sparse_buffer(3000, 50 + 7 * r, seed=r) for r in range(world_size)]
        slots = 120
        payloads = []
        for part in parts:
            index = part.nonzero().view(-1)
            pad = slots - index.numel()
            payloads.append(_pack(torch.cat([index, index.new_zeros(pad)]).to(index_dtype),
                                  torch.cat([part[index], part.new_zeros(pad)])))
        bucket = torch.full((3000,), 7.0)  # stale values: the exchange overwrites them
        with OpCounter() as counter:
            _accumulate_(bucket, torch.cat(payloads), slots, index_dtype)
        ops[world_size] = counter.by_op()
        expected = torch.stack([p.double() for p in parts]).sum(0)
        assert torch.allclose(bucket.double(), expected, rtol=0, atol=1e-6), world_size
    assert ops[2] == ops[4] == ops[8] and ops[2].get("aten.index_add_.default", 0) == 1, ops


def test_sparse_pays_against_bytes_by_hand():
    # W = 2, float32: slots (4 + 4) B x 2 ranks against 2 x numel x 4 B -> capacity < numel / 2
    assert sparse_pays(49, 100, 2, 4, 4) and not sparse_pays(50, 100, 2, 4, 4)
    # W = 8: 12 x 8 x 8 = 768 < 800, 13 x 64 = 832 > 800
    assert sparse_pays(12, 100, 8, 4, 4) and not sparse_pays(13, 100, 8, 4, 4)
    # a bf16 dense wire halves the dense bytes: 24 x 8 x 2 = 384 < 400, 25 x 16 = 400 is not
    assert sparse_pays(24, 100, 2, 4, 2) and not sparse_pays(25, 100, 2, 4, 2)


def _grid(resolution: int) -> GridModel:
    torch.manual_seed(0)
    aabb = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])
    model = GridModel(aabb, torch.ones(3), resolutions=[resolution], upsample_steps=[], color="mlp",
                      hidden_width=16, alpha_init=1e-2, tv_weight=0.0, occupancy_threshold=1e-3)
    with torch.no_grad():
        model.density.normal_(-4.0, 4.0)
        model.features.normal_(0, 0.5)
    return model


@pytest.mark.parametrize("resolution", [6, 48])
def test_the_static_steps_fixed_capacity_holds_every_non_zero_gradient_entry(resolution):
    """The fixed capacity (8 corner rows x P slots of each table under a static step's budget, from
    sizes alone) against the gradients a real training forward and backward make: every table's
    non-zero entries within it; at 48^3 (118 k rows, P = 2048 slots) it is under a fifth of the table
    (a capacity of 'everything' would pass the first check trivially); at 6^3 it is the table. Without
    a budget (the dynamic step) there is none: the exchange stays dense."""
    from distnerf.components.sample_budget import SampleBudget
    from distnerf.data.rays import RayBundle

    model = _grid(resolution)
    model.sparse_grad = False  # dense gradients, as under DDP (its buckets hold dense tables)
    assert model.gradient_entry_capacity() == {}
    budget = SampleBudget(model, 2048)
    model.sample_capacity = budget.capacity  # as the step builder sets it
    gen = torch.Generator().manual_seed(1)
    origins = torch.randn(64, 3, generator=gen) * 0.1 + torch.tensor([0.0, 0.0, -3.0])
    directions = torch.nn.functional.normalize(torch.tensor([0.0, 0.0, 1.0]) + 0.2 * torch.randn(64, 3, generator=gen), dim=-1)
    rays = RayBundle(origins=origins, directions=directions, viewdirs=directions, near=torch.full((64,), 0.5), far=torch.full((64,), 6.0))
    model.train()
    out = model(rays, generator=torch.Generator().manual_seed(2), budget=budget)
    out.rgb.square().sum().backward()
    capacity = model.gradient_entry_capacity()
    assert set(capacity) == {id(p) for p in model.bounded_parameters()}
    for table in model.bounded_parameters():
        nonzero = int((table.grad != 0).sum())
        assert 0 < nonzero <= capacity[id(table)], (table.shape, nonzero, capacity[id(table)])
        if resolution == 48:
            assert capacity[id(table)] == 8 * 2048 * table.shape[1] < table.numel() / 5
        else:
            assert capacity[id(table)] == table.numel()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (tools/gpu_check.sh runs it on a lent GPU)")
@pytest.mark.parametrize("static", [True, False])
def test_bounded_exchange_on_cuda_never_synchronises(static):
    """On a GPU, under ``torch.cuda.set_sync_debug_mode("error")`` (any host sync raises): the exchange
    (alone: its all-gathers are identities) returns the buffer and counts its overflow on the device."""
    buffer = _sparse_buffer(100_000, 3_000, seed=5).cuda()
    expected = buffer.clone()
    if static:
        from distnerf.strategy.sparse_exchange import static_nonzero_available

        if not static_nonzero_available(buffer.device):
            pytest.skip("this torch has no CUDA kernel for nonzero_static (the prefix-sum path serves it)")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _, overflow = bounded_sparse_allreduce_(buffer, 1, 4_000, static)
        _, lost = bounded_sparse_allreduce_(buffer.clone(), 1, 2_000, static)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(buffer, expected)
    assert int(overflow) == 0 and int(lost) == 1_000


def test_bus_bytes_follow_the_nccl_tests_convention_by_hand():
    """nccl-tests (doc/PERFORMANCE.md): all-reduce bus bytes = size x 2 (W - 1) / W; all-gather
    (each rank's part p) = W p x (W - 1) / W = p (W - 1). At W = 2 both equal the size sent."""
    from distnerf.strategy.ddp import CommStats, bus_bytes

    assert bus_bytes("all_reduce", 100, 2) == 100 and bus_bytes("all_gather", 100, 2) == 100
    assert bus_bytes("all_reduce", 100, 4) == 150 and bus_bytes("all_gather", 100, 4) == 300
    assert bus_bytes("all_reduce", 100, 8) == 175 and bus_bytes("all_gather", 100, 8) == 700
    with pytest.raises(ValueError, match="broadcast"):
        bus_bytes("broadcast", 100, 4)
    stats = CommStats()  # a step with one dense and one sparse bucket at W = 4
    stats.record(0.5, 100, 1.0, bus_bytes("all_reduce", 100, 4))
    stats.record(0.25, 40, 1.5, bus_bytes("all_gather", 40, 4))
    step = stats.take_step()
    assert step["bytes"] == 140 and step["bus_bytes"] == 150 + 120
