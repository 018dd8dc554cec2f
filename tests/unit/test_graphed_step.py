"""The whole static step replayed as one CUDA graph per grid stage (step.cuda_graph, issue 49 item 5).

On the CPU the graph's body runs uncaptured on the graph's fixed buffers: it must train as the eager static
step does on the same batches (losses and tables), read nothing from the device, and read every tensor from
outside itself at one address through a grid stage, occupancy refreshes included (what a replay needs: a
graph holds addresses, not tensors). On a GPU the recorded graph itself is checked against the eager step.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from distnerf import distributed as D
from distnerf.components.graphed_step import GraphedStep, check_graphable
from distnerf.host_buffers import sync_free_paths

from tests import trainers
from tests.conftest import step_sse

STATIC = ["model=grid", "model.train_termination=false", "model.train_round_steps=0",
          ]
CPU = ["train.global_rays=128", "step.samples_per_step=32768"]
STEPS = 24  # past the smoke grid's stage change (step 10) and two occupancy refreshes (every 8 steps)


class ExternalReads(TorchDispatchMode):
    """The tensors an operator reads that no earlier operator of the same span made (parameters, optimizer
    state, buffers), by storage address; the tensors are held so that no address is reused while held."""

    def __init__(self):
        super().__init__()
        self.made, self.read = set(), {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                ptr = t.untyped_storage().data_ptr()
                if ptr and ptr not in self.made:
                    self.read.setdefault(ptr, t)
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.made.add(t.untyped_storage().data_ptr())
        return out


def _train(tmp_path, overrides, steps=STEPS, watch=False, device="cpu", never_record=False):
    """Losses of ``steps`` steps of the real trainer and its final tables; with ``watch`` also each graph
    body's external reads and the sync counts of steps 18 and 24, by step; ``never_record``: the graphed step's
    warm-up never ends (every step eager on its buffers, with its optimizer)."""
    torch.manual_seed(0)
    trainer, env = trainers.build_trainer([*STATIC, *overrides], tmp_path / "run", device=device)
    losses, reads, syncs = [], {}, {}
    try:
        graphed = trainer.train_step
        if never_record:
            graphed.warmup = 10 ** 9
        if watch:
            body = graphed._body

            def watched(*args):
                with ExternalReads() as mode:
                    result = body(*args)
                reads[trainer.step] = mode.read
                return result

            graphed._body = watched
        with sync_free_paths(True):  # the CUDA paths (no host read) on the CPU
            while trainer.step < steps:
                if watch and trainer.step in (18, 24):  # a graph step, and a refresh step (every 8)
                    at = trainer.step
                    syncs[at] = trainers.count_syncs(trainer)
                    losses.append(None)
                    continue
                losses.append(step_sse(trainer, trainers.run_step))
        tables = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        return losses, tables, reads, syncs, graphed
    finally:
        trainer.close()
        D.shutdown(env)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    eager = _train(tmp_path_factory.mktemp("eager"), [*CPU, "model.sparse_grad=false"], steps=STEPS + 2)
    graphed = _train(tmp_path_factory.mktemp("graphed"), [*CPU, "step.cuda_graph=true", "step.probe_every=7"],
                     steps=STEPS + 2, watch=True)
    return eager, graphed


def test_graph_body_trains_as_the_eager_static_step(runs):
    (losses, tables, *_), (g_losses, g_tables, _, _, graphed) = runs
    assert graphed.probes == 3  # steps 7, 14, 21: eager on the buffers (the phase breakdown's steps)
    assert graphed.eager_steps - graphed.probes >= 2 * graphed.warmup  # a warm-up after each (re)key
    assert not graphed.captured and graphed.replays == 0  # the CPU: no CUDA graph, the body uncaptured
    # the same operators on the same numbers: bit for bit, losses and tables (Adam amplifies any difference
    # in the smallest gradients, eps 1e-15, so a tolerance would hide a wrong input)
    assert [a for a, b in zip(losses, g_losses) if b is not None] == [b for b in g_losses if b is not None]
    assert tables.keys() == g_tables.keys()
    for name, t in tables.items():
        assert torch.equal(g_tables[name], t), name


def test_graph_body_reads_every_outside_tensor_at_one_address_and_nothing_from_the_device(runs):
    _, (_, _, reads, syncs, graphed) = runs
    stage = [s for s in sorted(reads) if 10 + graphed.warmup <= s]  # the second stage's body steps
    assert len(stage) >= 8 and any(s % 8 == 0 for s in stage)  # a refresh (every 8 steps) among them
    first = set(reads[stage[0]])
    assert len(first) > 10  # tables, Adam's moments and steps, learning rates, the buffers, the clip box, ...
    for s in stage[1:]:
        assert set(reads[s]) == first, f"step {s}: outside tensors moved: {len(set(reads[s]) ^ first)} addresses"
    for step, counted in syncs.items():
        assert counted["total"] == 0, (step, counted["by_location"])


def test_graphed_step_refuses_without_a_budget(tmp_path):
    with pytest.raises(ValueError, match="static step"):
        check_graphable(False, 1, False)
    with pytest.raises(ValueError, match="world size 2"):
        check_graphable(True, 2, False)
    with pytest.raises(ValueError, match="model.compile=false"):
        check_graphable(True, 1, True)
    check_graphable(True, 1, False)
    with pytest.raises(ValueError, match="static step"):
        GraphedStep(SimpleNamespace(budget=None))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a lent GPU runs it: issue 49 item 5)")
def test_cuda_graph_replays_the_whole_step_as_the_eager_step(tmp_path):
    """On a GPU: the recorded graph (one per grid stage) trains as the eager static step on the same batches."""
    cuda = ["device=cuda", "train.global_rays=4096", "step.samples_per_step=65536", "step.cuda_graph=true",
            "step.probe_every=0"]
    # the reference: the same step, same buffers, same capturable Adam, never recorded
    losses, tables, _, _, eager = _train(tmp_path / "eager", cuda, device="cuda", never_record=True)
    g_losses, g_tables, _, _, graphed = _train(tmp_path / "graphed", cuda, device="cuda")
    assert eager.captures == 0 and eager.eager_steps == STEPS
    # a graph per key: the first stage, its occupancy grid's first refresh (vertices -> cells), the second stage
    assert 2 <= graphed.captures <= 3 and graphed.replays == STEPS - graphed.eager_steps > 0
    for step, (a, b) in enumerate(zip(losses, g_losses)):
        assert a == pytest.approx(b, rel=2e-3, abs=1e-5), step
    # CUDA's atomic index_add_ orders its sums freely, and Adam (eps 1e-15) turns a rounding-level sign flip of
    # a near-zero gradient into a full step: the tables are compared as a whole, not element by element
    for name, t in tables.items():
        assert (g_tables[name] - t).abs().mean() <= 1e-3 * t.abs().mean(), name
