"""The step path chosen once (issue 63): :func:`distnerf.components.step_path.build_step` refuses every invalid
combination at build time naming the config key, turns ``model.sparse_grad`` off in one place, and
:meth:`Trainer.step_once` with its phase hooks is ``fit``'s body."""
from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest
import torch

from distnerf import distributed as D
from distnerf.components.graphed_step import GraphedStep
from distnerf.components.step import TrainStep
from distnerf.components.step_path import build_step
from distnerf.config_check import ConfigError, section
from distnerf.distributed import DistEnv
from distnerf.model.grid import GridModel
from distnerf.model.nerf import NeRFModel
from distnerf.observe.logger import read_metrics_log
from distnerf.schema import OptimConfig, StepConfig, TrainLoopConfig
from distnerf.strategy.base import Strategy
from distnerf.strategy.ddp import DDPStrategy
from tests import trainers

AABB = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])
PACKAGE = Path(__file__).resolve().parents[2] / "distnerf"


def _step(model, cfg: dict, **kwargs):
    """:func:`build_step` with the ``step`` section ``cfg`` (a partial mapping made a typed node) and the defaults'
    ``optim`` and ``train`` sections."""
    return build_step(model, section(StepConfig, cfg), "cpu", optim_cfg=section(OptimConfig),
                      train_cfg=section(TrainLoopConfig), **kwargs)


def _grid(**options) -> GridModel:
    return GridModel(AABB, torch.ones(3), resolutions=[8], upsample_steps=[], **options)


@pytest.mark.parametrize("model, cfg, world_size, compile, key", [
    ("grid", {"cuda_graph": True, "samples_per_step": 0}, 1, False, r"step\.cuda_graph=true needs the static step"),
    ("grid", {"cuda_graph": True}, 1, False, r"step\.cuda_graph=true needs the static step"),  # null: 0 off CUDA
    ("grid", {"cuda_graph": True, "samples_per_step": 4096}, 2, False, r"step\.cuda_graph=true needs one process"),
    ("grid", {"cuda_graph": True, "samples_per_step": 4096}, 1, True,
     r"step\.cuda_graph=true needs model\.compile=false"),
    ("nerf", {"samples_per_step": 4096}, 1, False, r"step\.samples_per_step needs a marched model"),
    ("grid_rounds", {"samples_per_step": 4096}, 1, False, r"step\.samples_per_step: the static step does not cover"),
])
def test_every_invalid_step_combination_is_refused_at_build_time_naming_its_key(model, cfg, world_size, compile, key):
    built = {"grid": _grid, "grid_rounds": lambda: _grid(train_round_steps=4),
             "nerf": lambda: NeRFModel(AABB, torch.ones(3))}[model]()
    with pytest.raises(ConfigError, match=key):
        _step(built, cfg, world_size=world_size, compile=compile)


def test_each_valid_combination_builds_its_step_with_one_interface():
    dynamic = _step(_grid(), {})
    static = _step(_grid(), {"samples_per_step": 4096})
    graphed = _step(_grid(), {"samples_per_step": 4096, "cuda_graph": True})
    assert type(dynamic) is TrainStep and dynamic.budget is None  # null on the CPU: the dynamic step
    assert type(static) is TrainStep and static.budget.capacity == 4096
    assert type(graphed) is GraphedStep and graphed.budget.capacity == 4096
    for step in (dynamic, static, graphed):
        for member in ("optimizer", "budget", "phase", "prepare", "run", "metrics", "budget_metrics", "release"):
            assert hasattr(step, member), (type(step).__name__, member)
    assert "graph_replays" in graphed.metrics() and "graph_replays" not in static.metrics()


def test_sparse_grad_is_switched_off_by_the_step_builder_only():
    kept, dense, graphed = _grid(), _grid(), _grid()
    assert kept.sparse_grad and dense.sparse_grad and graphed.sparse_grad  # model.sparse_grad's default
    _step(kept, {})
    _step(dense, {}, dense_gradients=True)
    _step(graphed, {"samples_per_step": 4096, "cuda_graph": True})
    assert kept.sparse_grad and not dense.sparse_grad and not graphed.sparse_grad
    # who asks for dense gradients: DDP with a peer and no sparse tables; nobody else
    peers = DistEnv(world_size=2, backend="gloo")
    assert peers.has_peers
    assert DDPStrategy({"name": "ddp"}, peers).dense_gradients()
    assert not DDPStrategy({"name": "ddp"}, DistEnv()).dense_gradients()
    tables = DDPStrategy({"name": "ddp", "sparse_tables": True}, peers)
    tables.model = _grid()
    assert not tables.dense_gradients()
    assert not Strategy({"name": "ddp"}, peers).dense_gradients()
    # and the one place in the package that assigns it False
    assigned = [f"{p.relative_to(PACKAGE)}:{i}" for p in sorted(PACKAGE.rglob("*.py"))
                for i, line in enumerate(p.read_text().splitlines(), 1)
                if re.search(r"\.sparse_grad\s*=\s*False", line)]
    assert len(assigned) == 1 and assigned[0].startswith("components/step_path.py:"), assigned


def test_a_refused_step_fails_the_trainer_before_any_step(tmp_path):
    with pytest.raises(ConfigError, match=r"step\.cuda_graph=true needs the static step"):
        trainers.build_trainer(["model=grid", "step.cuda_graph=true", "step.samples_per_step=0"], tmp_path / "run")


STEPS = ["model=grid", "monitor.log_every=1", "train.max_steps=6"]


def _losses(run_dir: Path) -> list[tuple[int, float]]:
    return [(row["step"], row["loss"]) for row in read_metrics_log(run_dir) if "loss" in row]


def test_a_loop_of_step_once_is_fit_bit_for_bit_and_its_hooks_see_each_phase_in_order(tmp_path):
    torch.manual_seed(0)
    trainer, env = trainers.build_trainer(STEPS, tmp_path / "fit")
    try:
        trainer.fit()
        fitted = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    finally:
        trainer.close()
        D.shutdown(env)
    torch.manual_seed(0)
    trainer, env = trainers.build_trainer(STEPS, tmp_path / "loop")
    spans: list[tuple[str, str]] = []

    @contextlib.contextmanager
    def hook(name):
        spans.append(("start", name))
        yield
        spans.append(("end", name))

    try:
        trainer.phase_hooks.append(hook)
        results = []
        while trainer.step < trainer.max_steps:
            results.append(trainer.step_once())
        looped = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    finally:
        trainer.close()
        D.shutdown(env)
    fit_losses, loop_losses = _losses(tmp_path / "fit"), _losses(tmp_path / "loop")
    assert [s for s, _ in fit_losses] == list(range(1, 7))
    assert loop_losses == fit_losses  # the same floats, step by step
    assert [float(r.error.row_means()[0]) for r in results] == [loss for _, loss in fit_losses]
    assert fitted.keys() == looped.keys() and all(torch.equal(fitted[k], looped[k]) for k in fitted)
    assert all(r.stop is None and r.seconds > 0 for r in results)
    # each phase opened and closed in turn, none nested in another, in fit's order, every step
    per_step = [name for kind, name in spans if kind == "start"]
    order = ["input_wait", "copy", "model_update", "forward", "agree", "backward", "regularizer", "optimizer",
             "step_sync", "end_step", "after_step"]
    assert per_step == order * 6
    assert spans == [(kind, name) for name in per_step for kind in ("start", "end")]


def test_the_core_guard_polls_through_the_phase_hook_after_each_step_only():
    """``between_steps`` is gone: distnerf.train adds ``CoreWatch.phase_hook``, which polls when ``after_step``
    (the loop's work between steps) ends, and at no other phase."""
    from distnerf import cpu

    watch, events = cpu.CoreWatch(2, 0), []
    watch.poll = lambda: events.append("poll")
    for name in ("input_wait", "forward", "step_sync", "end_step", "after_step"):
        with watch.phase_hook(name):
            events.append(name)
    assert events == ["input_wait", "forward", "step_sync", "end_step", "after_step", "poll"]
