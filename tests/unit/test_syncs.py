"""distnerf.observe.syncs counts what it says it counts, and the grid training step's host
syncs (counted on the CPU, bench/throughput/syncs.py) do not rise."""
from __future__ import annotations

from pathlib import Path

import torch

from distnerf import dist as D
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


def _bench_syncs():
    from bench.throughput import syncs

    return syncs


def test_grid_training_step_host_syncs_do_not_rise(tmp_path):
    """The smoke grid model (past its upsampling at step 10) on one CPU process, as
    ``python bench/throughput/syncs.py --configs grid`` counts it."""
    bench = _bench_syncs()
    # one marching pass per training ray (model.train_round_steps=0, the default): rounds (opt-in) read the
    # march's sizes once per round (3 more per round; they save the density behind each ray's cut)
    trainer, env = bench.build_trainer(bench.CONFIGS["grid"] + ["model.train_round_steps=0"], tmp_path / "run")
    try:
        while trainer.step < 17:
            bench.run_step(trainer)
        step = bench.counted_step(trainer)
        while trainer.step % trainer.cfg.model.occupancy_every:
            bench.run_step(trainer)
        refresh = bench.counted_step(trainer)
    finally:
        trainer.close()
        D.shutdown(env)
    # reached 2026-12-01 (before: 14 model syncs per step, 17 on a refresh step): the model reads 4 sizes
    # per step (the march's candidate intervals and samples, the samples in front of the termination cut,
    # the coloured samples), + 1 on an occupancy refresh step (the coarse grid's sizes, once per change).
    # The trainer 1 (4 before StepStats.host_values): the tensor fields of the step's flags read back in
    # one transfer; the Python-number flags stay on the host and are all-reduced on the CPU
    # 2026-12-03: 3 and 4, a training render no longer cuts at the termination point by default
    # (model.train_termination=false): the size of the samples in front of the cut is not read
    assert step["model"] <= 3, step["by_location"]
    assert refresh["model"] <= 4, refresh["by_location"]
    # 2026-12-04: the trainer 0 (issue 26 item 8): every ray is valid (no ray filter), so the valid count is
    # the batch size, and the non-finite-loss flag is read a step late from a host buffer (engine/late_flag.py);
    # a lent H200's sync-debug mode found the same places as this counter (bench/gpu/README.md)
    assert step["trainer"] == 0 and refresh["trainer"] == 0, (step["by_location"], refresh["by_location"])
    assert step["total"] <= 3, step["by_location"]
