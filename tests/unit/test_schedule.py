"""Schedules keyed to the step or to the time budget (distnerf/components/schedule.py).

Expected values are computed by hand from the rule the schema states, not by the module.
"""
from __future__ import annotations

import math
import pytest
import torch

from distnerf.components.schedule import Clock, lr_factor, stage_step, step_limit
from distnerf.model.grid import GridModel
from distnerf.config_check import describe_schedule, section
from distnerf.schema import DEFAULT_MAX_STEPS, OptimConfig, TrainLoopConfig
AABB = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])


def _train(**kw) -> tuple:
    """(the ``optim`` section, the ``train`` section), typed nodes, with ``kw`` set in the one declaring each key."""
    optim, train = {}, {}
    for key, value in kw.items():
        (optim if key in OptimConfig.__dataclass_fields__ else train)[key] = value
    return section(OptimConfig, optim), section(TrainLoopConfig, train)


def test_without_a_budget_the_learning_rate_follows_the_step():
    cfg = _train(decay=0.1, decay_steps=1500.0, warmup_steps=0)
    assert lr_factor(0, *cfg) == pytest.approx(1.0)
    assert lr_factor(1500, *cfg) == pytest.approx(0.1)
    assert lr_factor(750, *cfg) == pytest.approx(0.1 ** 0.5)
    # a budget fraction passed without max_minutes is not read: the clock says "no budget"
    assert lr_factor(Clock(1500, None), *cfg) == pytest.approx(0.1)


def test_with_a_budget_the_learning_rate_falls_by_decay_over_the_budget_whatever_the_steps():
    cfg = _train(decay=0.1, decay_steps=1500.0, warmup_steps=0, max_minutes=10.0, decay_start=0.0)
    assert lr_factor(Clock(4570, 0.0), *cfg) == pytest.approx(1.0)
    assert lr_factor(Clock(100, 0.5), *cfg) == pytest.approx(0.1 ** 0.5)
    assert lr_factor(Clock(9000, 1.0), *cfg) == pytest.approx(0.1)
    assert lr_factor(Clock(9001, 1.3), *cfg) == pytest.approx(0.1)  # the stopping step: clamped at 1


def test_with_a_decay_start_the_learning_rate_holds_then_falls_by_decay_over_the_rest_of_the_budget():
    cfg = _train(decay=0.1, decay_steps=1500.0, warmup_steps=0, max_minutes=2.0, decay_start=0.8)
    assert lr_factor(Clock(10, 0.0), *cfg) == 1.0
    assert lr_factor(Clock(500, 0.8), *cfg) == 1.0  # the decay begins at p = 0.8
    assert lr_factor(Clock(600, 0.9), *cfg) == pytest.approx(0.1 ** 0.5)  # half of the last fifth
    assert lr_factor(Clock(700, 1.0), *cfg) == pytest.approx(0.1)
    assert lr_factor(Clock(701, 1.2), *cfg) == pytest.approx(0.1)
    assert OptimConfig().decay_start == 0.8  # the default (components/schedule.py: the measurement)


def test_with_decay_steps_null_the_steps_follow_the_budgets_rule_over_max_steps():
    cfg = _train(decay=0.1, decay_steps=None, warmup_steps=0, max_steps=3000, decay_start=0.8)
    assert lr_factor(0, *cfg) == 1.0
    assert lr_factor(2400, *cfg) == 1.0  # constant through 80% of the steps
    assert lr_factor(2700, *cfg) == pytest.approx(0.1 ** 0.5)  # half of the last fifth
    assert lr_factor(3000, *cfg) == pytest.approx(0.1)
    # decay_start 0: over the whole run; max_steps null: the 1000-step default run
    assert lr_factor(500, *_train(decay=0.1, decay_steps=None, warmup_steps=0, decay_start=0.0)) == pytest.approx(
        0.1 ** 0.5)
    # a budget keeps its own fraction: decay_steps null changes nothing there
    budget = _train(decay=0.1, decay_steps=None, warmup_steps=0, max_minutes=2.0, max_steps=3000, decay_start=0.8)
    assert lr_factor(Clock(2900, 0.5), *budget) == 1.0
    text = describe_schedule(3000, 0, 0.1, None, 0, None, decay_start=0.8)
    assert "lr constant until step 2400, then x 0.1 ** ((step / 3000 - 0.8) / 0.2)" in text

def test_warm_up_counts_steps_in_both_schedules():
    for cfg, clock in ((_train(warmup_steps=10, decay_steps=1e12), 4),
                       (_train(warmup_steps=10, max_minutes=1.0), Clock(4, 0.0))):
        assert lr_factor(clock, *cfg) == pytest.approx(5 / 10)


def test_stage_clock_is_the_step_or_the_budget_fraction_times_schedule_steps_whichever_is_later():
    cfg = _train(max_minutes=2.0, schedule_steps=1000.0)
    assert stage_step(Clock(50, None), cfg[0]) == 50
    assert stage_step(Clock(50, 0.25), cfg[0]) == 250  # a slow run: p leads
    assert stage_step(Clock(700, 0.25), cfg[0]) == 700  # a fast run: the step leads
    assert stage_step(Clock(3, 0.2009), cfg[0]) == 200  # floor(200.9)
    assert stage_step(Clock(50, 0.25), _train(max_minutes=2.0)[0]) == 50  # the default: stages by step


def test_step_limit():
    assert step_limit(_train(max_steps=None)[1]) == DEFAULT_MAX_STEPS
    assert step_limit(_train(max_steps=None, max_minutes=5.0)[1]) == math.inf
    assert step_limit(_train(max_steps=30, max_minutes=5.0)[1]) == 30


def test_grid_moves_one_stage_per_call_from_the_stage_clock_and_refreshes_occupancy_by_step():
    model = GridModel(AABB, torch.ones(3), resolutions=[8, 12, 16], upsample_steps=[200, 600], color="sh",
                     occupancy_every=1000)
    assert model.resolution == 8
    assert not model.update_state(5, 150)
    assert model.update_state(5, 650) and model.resolution == 12  # the clock passed both: one stage now
    assert model.update_state(6, 650) and model.resolution == 16  # and the next on the next call
    assert not model.update_state(7, 10_000) and model.resolution == 16
    # the step schedule (no stage clock): stage i at step upsample_steps[i], as before
    plain = GridModel(AABB, torch.ones(3), resolutions=[8, 12, 16], upsample_steps=[200, 600], color="sh",
                     occupancy_every=1000)
    assert not plain.update_state(199) and plain.update_state(200) and plain.resolution == 12


def test_the_resolved_rule_names_the_budget_and_stage_fractions():
    budget = describe_schedule(None, 10, 0.1, 1500, 0, 1000, [200, 600], 8)
    assert "0.1 ** p" in budget and "constant" not in budget and "[0.2, 0.6]" in budget and "every 8 steps" in budget
    by_step = describe_schedule(None, 10, 0.1, 1500, 0, None, [200, 600], 8)
    assert "0.1 ** p" in by_step and "grid stages at steps [200, 600];" in by_step and "p >=" not in by_step
    held = describe_schedule(None, 2, 0.1, 1500, 0, None, [200, 600], 8, decay_start=0.8)
    assert "lr constant until p = 0.8, then x 0.1 ** ((p - 0.8) / 0.2)" in held
    steps = describe_schedule(None, 0, 0.1, 1500, 0, 1000, [200, 600], 8, decay_start=0.8)
    assert f"stop at step {DEFAULT_MAX_STEPS}" in steps and "step / 1500" in steps


def test_a_resumed_time_budgeted_run_continues_the_uninterrupted_one_bit_exactly(tmp_path):
    """The real Trainer of one CPU process under a 1-minute budget whose clock is set by hand
    (6 s of training a step, so p grows 0.1 a step and the grid's stages, at p >= 0.2 and 0.6,
    come at steps 3 and 7). Run A trains 8 steps; run B trains 4, checkpoints, and a new trainer
    resumed from it trains 4 more: the learning rates and the parameters are A's bit for bit."""
    from distnerf import distributed as D

    from tests import trainers

    overrides = ["model=grid", "sampler=sync", "train.max_minutes=1", "optim.warmup_steps=0",
                 "model.resolutions=[8,12,16]", "model.upsample_steps=[200,600]", "optim.schedule_steps=1000",
                 "optim.decay_start=0.3"]

    def steps(trainer, until, lrs):
        while trainer.step < until:
            trainers.run_step(trainer)
            trainer.train_seconds = 6.0 * trainer.step  # not the step's wall time (step_once's): a fixed clock
            lrs.append(trainer.optimizer.param_groups[0]["lr"])

    def state(trainer):
        return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}

    trainer, env = trainers.build_trainer(overrides, tmp_path / "a")
    try:
        lrs_a = []
        steps(trainer, 8, lrs_a)
        final_a, resolution_a = state(trainer), trainer.model.resolution
    finally:
        trainer.close()
        D.shutdown(env)
    base = lrs_a[0]
    # step s's prepare reads p agreed at step s - 1's end: train_seconds then was 6 (s - 1), p = (s - 1) / 10
    # the decay starts at p = 0.3 and runs over the remaining 0.7 of the budget
    assert lrs_a[1:] == pytest.approx([base * 0.1 ** (max((s - 1) / 10 - 0.3, 0) / 0.7) for s in range(1, 8)])
    assert lrs_a[3] == base > lrs_a[5]
    assert resolution_a == 16

    trainer, env = trainers.build_trainer(overrides, tmp_path / "b")
    try:
        lrs_b = []
        steps(trainer, 4, lrs_b)
        trainer.save_checkpoint()
    finally:
        trainer.close()
        D.shutdown(env)
    trainer, env = trainers.build_trainer([*overrides, "resume=true"], tmp_path / "b")
    try:
        assert trainer.step == 4 and trainer.budget_clock.fraction == pytest.approx(0.3)
        steps(trainer, 8, lrs_b)
        final_b = state(trainer)
    finally:
        trainer.close()
        D.shutdown(env)
    assert lrs_b == lrs_a
    assert final_a.keys() == final_b.keys()
    assert all(torch.equal(final_a[k], final_b[k]) for k in final_a)


def test_the_budget_clock_saves_the_fraction_its_step_read_and_a_resume_rescales_it_to_the_new_budget():
    """BudgetClock (components/schedule.py), by hand: 2 minutes of budget, so 30 s is p = 0.25."""
    from distnerf.components.schedule import BudgetClock

    clock = BudgetClock(_train(max_minutes=2.0)[1])
    assert clock.fraction == 0.0
    clock.agree(30.0)
    assert clock.read(5) == 0.25  # step 5's schedule reads the fraction agreed at step 4's end
    clock.agree(60.0)  # step 5's agreement: p = 0.5, read by step 6
    assert clock.state_dict(5) == {"budget_fraction": 0.25, "budget_minutes": 2.0}  # saved inside step 5
    assert clock.state_dict(6) == {"budget_fraction": 0.5, "budget_minutes": 2.0}  # saved after it
    resumed = BudgetClock(_train(max_minutes=1.0)[1])  # the budget halved: the same seconds are twice the fraction
    resumed.load_state_dict(clock.state_dict(6), train_seconds=60.0)
    assert resumed.fraction == 1.0
    from_steps = BudgetClock(_train(max_minutes=4.0)[1])  # from a run without a budget: its training seconds
    from_steps.load_state_dict({"budget_fraction": None, "budget_minutes": 0.0}, train_seconds=48.0)
    assert from_steps.fraction == pytest.approx(0.2)
    unbudgeted = BudgetClock(_train(max_minutes=0.0)[1])
    unbudgeted.agree(30.0)
    unbudgeted.load_state_dict({"budget_fraction": 0.5, "budget_minutes": 2.0}, train_seconds=60.0)
    assert unbudgeted.read(3) is None and unbudgeted.state_dict(3) == {"budget_fraction": None, "budget_minutes": 0.0}
