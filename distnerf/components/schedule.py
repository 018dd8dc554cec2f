"""Training schedules: the learning rate and the model's stage changes (grid upsampling), keyed
to the step, or to the time budget when one is set.

The rule (stated once; the ``optim`` config, :class:`distnerf.schema.OptimConfig`, over the run's length in the
``train`` config, :class:`distnerf.schema.TrainLoopConfig`):

* **No time budget** (``train.max_minutes = 0``): everything follows the step.
  ``lr(step) = lr * decay ** (step / decay_steps)`` after a linear warm-up of ``warmup_steps``
  (NeRF: 5e-4 decayed by 0.1 over 250k steps); the grid moves to its next resolution at
  ``model.upsample_steps``. With ``decay_steps`` null the learning rate follows the budget's
  rule below with ``p = step / max_steps`` (the run's length in steps): constant, then a
  cool-down over the last ``1 - decay_start`` of the steps. The capacity study
  (``conf/study/capacity.yaml``) needs a rate that does not vanish before its cells reach a
  plateau: the default decay (10x per 1500 steps) leaves 1% of it by step 3000.
* **A time budget** (``train.max_minutes > 0``): the schedule follows ``p``, the fraction of the
  budget elapsed: the mean of the ranks' training seconds (evaluation excluded) over the budget,
  agreed in the step's all-reduce (so every rank reads the same ``p`` at the same step) and saved
  in checkpoints (a resumed run continues from it).

  - ``lr(p) = lr * decay ** (max(p - s, 0) / (1 - s))``, ``s = decay_start``: the learning rate
    holds for the first ``s`` of the budget, then falls by ``decay`` over the rest (a warmup-stable-
    decay schedule; Hagele et al., "Scaling Laws and Compute-Optimal Training Beyond Fixed Training
    Durations", NeurIPS 2024, find a cool-down over the last 20% of a run matches a cosine decay
    sized to that run, and the stable phase does not depend on the run's length). ``s = 0``
    decays over the whole budget, as DVGO (Sun et al., CVPR 2022: 0.1 over its 20k iterations)
    and Plenoxels decay over their run. Measured on the README's lego line at 2 minutes, 25 test
    views (``bench/quality/results/lego_budget/``): ``s = 0`` 25.06 dB (885 steps), no decay 26.81 dB,
    ``decay = 0.3`` 26.69 dB, ``s = 0.5`` 27.07 dB, ``s = 0.8`` (the default) 27.26 and 27.33 dB
    (two runs); fern at 10 minutes 22.48 dB against 21.65 with ``s = 0``. A grid model learns its
    detail at the full rate, and a decay over a short budget takes that rate away before the last
    grid stage has begun. A step-keyed ``decay_steps`` sized for one run length decays 10x per 1500
    steps whatever the budget (lego, 10 minutes, ~4500 steps: 1000x, hence BENCHMARKS' tuned
    decay_steps=4000).
  - the grid's stages follow the step (``model.upsample_steps``) by default: a stage must not
    begin before the coarse grid has carved the empty space, and that takes steps, not seconds.
    Measured (``bench/quality/budget.sh 2 25``, ``bench/quality/results/lego_budget/``): keying the stages to the
    budget as well (``optim.schedule_steps=1000``: stage ``i`` at step ``upsample_steps[i]`` or at
    ``p >= upsample_steps[i] / schedule_steps``, whichever first; the stage clock
    ``max(step, floor(p * schedule_steps))``) moved lego's first stage to step ~30 of a 2-minute
    run, left 112 samples per ray where the step schedule had 35 and scored 19.0 dB on 25 views,
    where keyed to the step alone the same line scored 23.2 dB (470 steps). The option stays for
    budgets far shorter than ``upsample_steps`` assume.
  - warm-up and the occupancy refresh stay in steps: warm-up exists for Adam's first moments,
    and the occupancy grid goes stale with parameter updates, that is per step.

The functions are pure (clock in, factor out), so a schedule needs no state of its own beyond
``p``, which :class:`BudgetClock` keeps: agreed at each step, saved in checkpoints and restored
on resume.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from omegaconf import DictConfig

from ..config_check import typed
from ..schema import DEFAULT_MAX_STEPS, OptimConfig, TrainLoopConfig


@dataclass(frozen=True)
class Clock:
    """Where training is.

    Attributes:
        step: training steps taken (int, >= 0).
        budget_fraction: ``p`` in [0, inf): the agreed fraction of ``train.max_minutes``
            elapsed (it passes 1 only on the step that stops the run); None without a budget.
    """

    step: int
    budget_fraction: float | None = None


def budgeted(cfg: DictConfig) -> bool:
    """Whether ``cfg`` (the ``train`` section, a typed node) sets a time budget (``max_minutes > 0``)."""
    return float(typed(TrainLoopConfig, cfg).max_minutes) > 0


def step_limit(cfg: DictConfig) -> float:
    """The step the loop stops at (``cfg``: the ``train`` section): ``max_steps``; when it is null, 1000 without a
    time budget and no limit (``inf``) with one (the budget stops the run)."""
    cfg = typed(TrainLoopConfig, cfg)
    if cfg.max_steps is not None:
        return int(cfg.max_steps)
    return math.inf if budgeted(cfg) else DEFAULT_MAX_STEPS


def lr_factor(clock: Clock | int, cfg: DictConfig, train: DictConfig) -> float:
    """Multiplier of every group's base learning rate at ``clock`` (an int: the step, no budget): ``cfg`` the
    ``optim`` section, ``train`` the ``train`` section (the run's length), both typed nodes.

    ``decay ** (step / decay_steps)`` without a budget, ``decay ** (max(p - decay_start, 0) /
    (1 - decay_start))`` with one (and without one when ``decay_steps`` is null, with
    ``p = step / max_steps``); times the
    linear warm-up ``(step + 1) / warmup_steps`` during the first ``warmup_steps`` steps.
    """
    clock = clock if isinstance(clock, Clock) else Clock(int(clock))
    cfg = typed(OptimConfig, cfg)
    if clock.budget_fraction is None and cfg.decay_steps is not None:
        factor = cfg.decay ** (clock.step / cfg.decay_steps)
    else:  # a budget, or the steps' own fraction of the run (decay_steps null)
        p = clock.budget_fraction if clock.budget_fraction is not None else clock.step / step_limit(train)
        start = float(cfg.decay_start)
        p = min(max(p, 0.0), 1.0)
        factor = cfg.decay ** (max(p - start, 0.0) / (1.0 - start))
    if cfg.warmup_steps > 0 and clock.step < cfg.warmup_steps:
        factor *= (clock.step + 1) / cfg.warmup_steps
    return factor


def stage_step(clock: Clock | int, cfg: DictConfig) -> int:
    """The step the model's stage changes read (``model.upsample_steps`` are compared with it):
    the step without a budget, ``max(step, floor(p * schedule_steps))`` with one (``cfg``: the ``optim`` config)."""
    clock = clock if isinstance(clock, Clock) else Clock(int(clock))
    if clock.budget_fraction is None:
        return clock.step
    cfg = typed(OptimConfig, cfg)
    if cfg.schedule_steps is None:  # the default: stages by step under a budget too
        return clock.step
    return max(clock.step, math.floor(max(clock.budget_fraction, 0.0) * cfg.schedule_steps))


class BudgetClock:
    """``p``, the agreed fraction of the time budget elapsed, kept with the run: set from the
    ranks' mean training seconds at each step agreement, read by the step's schedule, saved in
    checkpoints (``budget_fraction``, ``budget_minutes``) and restored on resume.

    Args:
        cfg: the ``train`` section, a typed node (``max_minutes``).
    Attributes:
        fraction: the latest agreed ``p`` (float >= 0), None without a budget.
    """

    def __init__(self, cfg: DictConfig):
        self.cfg = typed(TrainLoopConfig, cfg)
        self.fraction: float | None = 0.0 if budgeted(self.cfg) else None
        self._read: tuple[int, float | None] = (-1, None)  # (step, the fraction its schedule read)

    def read(self, step: int) -> float | None:
        """The fraction step ``step``'s schedule reads (the latest agreed), remembered for a
        checkpoint saved within that step (:meth:`state_dict`)."""
        self._read = (step, self.fraction)
        return self.fraction

    def agree(self, mean_train_seconds: float) -> None:
        """Set ``p`` from the ranks' mean training seconds (the step agreement's, so the same
        float on every rank); nothing without a budget."""
        if self.fraction is not None:
            self.fraction = self.fraction_of(mean_train_seconds)

    def fraction_of(self, seconds: float) -> float:
        """``seconds`` of training as a fraction of the time budget (``train.max_minutes`` > 0)."""
        return seconds / (60.0 * self.cfg.max_minutes)

    def state_dict(self, step: int) -> dict:
        """What a run resumed at ``step`` must read: ``budget_fraction``, the fraction the step's
        schedule already read if it ran for ``step`` (a save inside the step, or after a stop that
        did not take it), else the latest agreed (None without a budget); ``budget_minutes``, the
        budget it is a fraction of."""
        read_step, fraction = self._read
        return {"budget_fraction": fraction if read_step == step else self.fraction,
                "budget_minutes": float(self.cfg.max_minutes)}

    def load_state_dict(self, state: Mapping, train_seconds: float) -> None:
        """Continue from a checkpoint's trainer state (``state_dict``'s keys; ``train_seconds``:
        the run's training seconds there): its fraction rescaled when the budget changed; from
        ``train_seconds`` when the run it comes from had no budget. Nothing without a budget."""
        if self.fraction is None:
            return
        saved, minutes = state.get("budget_fraction"), state.get("budget_minutes")
        if saved is None or not minutes:
            self.fraction = self.fraction_of(train_seconds)
        else:
            self.fraction = float(saved) * float(minutes) / float(self.cfg.max_minutes)
