"""distnerf.observe.syncs counts what it says it counts, and the grid training step's host
syncs (counted on the CPU, bench/throughput/syncs.py) do not rise."""
from __future__ import annotations

from pathlib import Path

import torch

from distnerf.observe.syncs import SyncCounter, classify
from distnerf.renderer.packed import PackedSamples

ROOT = Path(__file__).resolve().parents[2]
aten = torch.ops.aten


def test_counts_k_items_one_nonzero_one_bool_mask_index():
    x = torch.arange(10.0)

    def fn(k: int):
        values = []
        for i in range(k):
            values.append(x[i].item())  # k reads
        idx = (x > 3).nonzero().view(-1)           # one data-dependent size
        picked = x[x > 5]                          # one boolean-mask index
        return values, x[idx], x.index_select(0, idx), picked  # long indices: no sync

    for k in (0, 3):
        with SyncCounter() as syncs:
            fn(k)
        expected = {"aten._local_scalar_dense": k, "aten.nonzero": 1, "aten.index (bool mask)": 1}
        assert syncs.by_op() == {op: n for op, n in expected.items() if n}
        assert syncs.total == k + 2
        assert all(e.location.startswith("tests/unit/test_syncs.py:") and e.function == "fn" for e in syncs.events)


def test_scalar_reads_lists_sizes_and_backward_are_counted_once_each():
    x = torch.rand(8, requires_grad=True)
    counts = torch.tensor([1, 0, 2])
    with SyncCounter() as syncs:
        s = x.detach().sum()
        float(s), int(s), bool(s > 0), s.item()                      # 4 scalar reads
        s.tolist(), counts.tolist()                                  # 2 lists (no aten op on the CPU)
        torch.repeat_interleave(torch.arange(3), counts)             # size read
        torch.repeat_interleave(torch.arange(3), counts, output_size=3)  # size given: no sync
        torch.bincount(counts, minlength=4)                          # CUDA reads max(input)
        torch.searchsorted(torch.arange(4), counts)                  # no sync
        torch.unique(counts)
        torch.equal(counts, counts)
        torch.tensor([1.0, 2.0], device=x.device)                    # a blocking copy on CUDA
        torch.as_tensor(counts, device=x.device), torch.full((2,), 1.0, device=x.device)  # no copy
        with syncs.section("backward"):
            x[x > 0.5].sum().backward()                              # forward mask + its index_put backward
    ops = syncs.by_op()
    assert ops.pop("aten._local_scalar_dense") == 4 and ops.pop("Tensor.tolist") == 2
    assert ops.pop("aten.repeat_interleave (no output_size)") == 1 and ops.pop("aten.bincount") == 1
    assert ops.pop("aten._unique2") == 1 and ops.pop("aten.equal") == 1
    assert ops.pop("torch.tensor (host to device, blocking)") == 1
    assert ops == {"aten.index (bool mask)": 1, "aten.index_put (bool mask)": 1}
    assert syncs.by_section() == {"": 11, "backward": 2}
    backward = [e for e in syncs.events if e.op == "aten.index_put (bool mask)"][0]
    assert backward.section == "backward" and backward.via.startswith("torch/autograd/")
    with torch.no_grad():
        x.sum().item()  # outside the counter
    assert syncs.total == 13


def test_location_is_the_innermost_distnerf_frame():
    samples = PackedSamples(torch.tensor([0, 0, 1]), torch.zeros(3), torch.ones(3), 2)
    with SyncCounter() as syncs:
        samples.select(torch.tensor([True, False, True]))  # three boolean-mask indexes inside packed.py
    assert syncs.total == 3
    for e in syncs.events:
        assert e.location.startswith("distnerf/renderer/packed.py:") and e.function == "select" and e.via is None


def test_device_to_host_copies_are_classified():
    meta = torch.empty(4, device="meta")  # stands for a device tensor without a device
    cpu = torch.empty(4)
    assert classify(aten._to_copy.default, (meta,), {"device": torch.device("cpu")}) == "aten._to_copy (device to host)"
    assert classify(aten._to_copy.default, (cpu,), {"dtype": torch.float64}) is None
    assert classify(aten.copy_.default, (cpu, meta), {}) == "aten.copy_ (device to host)"
    assert classify(aten.copy_.default, (meta, cpu), {}) == "aten.copy_ (host to device, blocking)"
    assert classify(aten.copy_.default, (meta, cpu, True), {}) is None  # non_blocking
    assert classify(aten._to_copy.default, (cpu,), {"device": torch.device("meta")}) == \
        "aten._to_copy (host to device, blocking)"
    assert classify(aten._to_copy.default, (cpu,), {"device": torch.device("meta"), "non_blocking": True}) is None
    assert classify(aten.masked_fill.Tensor, (cpu, cpu > 0, torch.tensor(1.0)), {}) == "aten.masked_fill (tensor value)"
    assert classify(aten.masked_fill.Scalar, (cpu, cpu > 0, 1.0), {}) is None
