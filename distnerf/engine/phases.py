"""The phases of one training step and how they are observed (:meth:`~.trainer.Trainer.phase`).

A step (:meth:`~.trainer.Trainer.step_once`) enters the phases of :data:`PHASES` in order; each is the step
timer's context (the breakdown of ``time_*`` figures: :class:`~distnerf.observe.run_profiler.RunProfiler`) and
that of every hook of ``Trainer.phase_hooks``. A hook is the public way to observe the trainer (a benchmark counting
host syncs per phase, the CPU core guard acting between steps: :meth:`distnerf.cpu.CoreWatch.phase_hook`) without
patching it.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

PhaseHook = Callable[[str], ContextManager]
"""A hook of :attr:`~.trainer.Trainer.phase_hooks`: ``hook(name)`` returns a context manager entered around the phase
``name`` (after the step timer's own, exited before it)."""

PHASES = ("input_wait", "copy", "model_update", "forward", "graph", "agree", "backward", "regularizer", "optimizer",
          "step_sync", "end_step", "after_step")
"""The phases of :meth:`~.trainer.Trainer.step_once`, in the order a step enters them (``graph``: a replayed CUDA graph,
``step.cuda_graph``, instead of ``forward`` ... ``optimizer``, and then ``agree`` comes after it). Timed by the
step breakdown: ``input_wait`` ... ``optimizer`` (and ``graph``) and ``step_sync``. Not timed: ``agree`` (the step
agreement launched), ``end_step`` (the profiler's end of the step) and ``after_step`` (the logs, validation,
checkpoint, the live viewer: outside the step's time)."""


def phase_context(timer: ContextManager | None, hooks: list[PhaseHook], name: str) -> ContextManager:
    """The context of phase ``name``: ``timer`` (the step timer's, or None: untimed) entered first, then each of
    ``hooks``'s ``hook(name)`` in order (exited in reverse)."""
    if not hooks:
        return timer if timer is not None else contextlib.nullcontext()
    stack = contextlib.ExitStack()
    if timer is not None:
        stack.enter_context(timer)
    for hook in list(hooks):
        stack.enter_context(hook(name))
    return stack


@dataclass
class StepResult:
    """What :meth:`Trainer.step_once` did.

    Attributes:
        batch: the batch the step trained on (a :class:`~distnerf.sampler.base.RayBatch`, R rays).
        out: the model's outputs (:class:`~distnerf.renderer.output.RenderOutput`).
        error: their :class:`~distnerf.components.loss.RayError` (``sse``: scalar float32, summed over valid rays).
        agreed: the step agreement over the ranks (:class:`~distnerf.strategy.base.StepAgreement`).
        seconds: the step's wall seconds (the profiler's end of the step minus its start).
        stop: None, or why every rank leaves the loop after this step: ``time_budget`` or ``signal``.
    """
    batch: Any
    out: Any
    error: Any
    agreed: Any
    seconds: float
    stop: str | None
