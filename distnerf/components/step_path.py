"""The one place the training step's path is chosen (:func:`build_step`).

Five paths from four switches, decided here once, at build time:

============================  ==============================  =================================================
``step.samples_per_step``    ``model.compile``               step
============================  ==============================  =================================================
0 (null on the CPU)           false                           dynamic eager (:class:`~.step.TrainStep`, no budget)
0 (null on the CPU)           true                            dynamic, the model compiled in place
> 0 (null on CUDA: 2^18)      false                           static eager (:class:`~.step.TrainStep` with a
                                                              :class:`~.sample_budget.SampleBudget`)
> 0 (null on CUDA: 2^18)      true                            static, its render compiled ``fullgraph=True``
> 0, ``step.cuda_graph``     false                           the whole static step replayed as a CUDA graph
                                                              (:class:`~.graphed_step.GraphedStep`)
============================  ==============================  =================================================

Both classes share one interface: ``optimizer``, ``budget``, ``phase``, ``prepare(step, fraction)``,
``run(module, batch, step, normalizer, agree, after_backward)``, ``metrics()``, ``budget_metrics()``,
``release()``.
"""
from __future__ import annotations

import torch

from ..config_check import ConfigError, typed
from ..model.base import RadianceModel
from ..schema import StepConfig
from .graphed_step import GraphedStep, check_graphable
from .sample_budget import SampleBudget, resolve_samples_per_step
from .step import Phase, TrainStep, no_phase, records_graph


def use_dense_gradients(model: torch.nn.Module) -> None:
    """Turn ``model.sparse_grad`` off on ``model`` and every radiance model in it: their gradients are then dense
    tensors (what DDP's buckets and a recorded CUDA graph need). The one place it is switched off:
    :func:`build_step` calls it, and a test wrapping a model without the trainer calls it as the trainer would."""
    for module in model.modules():
        if isinstance(module, RadianceModel):
            module.sparse_grad = False


def build_step(model: RadianceModel, step_cfg, device: torch.device | str, world_size: int = 1,
               compile: bool = False, compile_mode: str | None = None, phase: Phase = no_phase,
               dense_gradients: bool = False, compile_backend: str = "inductor", *, optim_cfg,
               train_cfg) -> TrainStep | GraphedStep:
    """The training step of ``model`` on ``device`` (the module docstring's table).

    ``step.samples_per_step`` is resolved here (:func:`~.sample_budget.resolve_samples_per_step`, with the
    training device), and ``model.sparse_grad`` is turned off here, on ``model`` and every radiance model in it,
    where the gradients must be dense: ``dense_gradients`` (the strategy's wrapper all-reduces dense buckets:
    :meth:`~distnerf.strategy.base.Strategy.dense_gradients`) or ``step.cuda_graph`` (a sparse gradient's sizes
    depend on the data: not recordable). ``model.compile`` compiles the dynamic step's model in place (a strategy's
    re-wrap keeps it), or the static step's render (``fullgraph=True``) and its optimizer's step.

    Args:
        model: the unwrapped radiance model, on ``device``.
        step_cfg: the ``step`` section, a typed node (:class:`~distnerf.schema.StepConfig`).
        device: the training device; world_size: the processes training together.
        compile, compile_mode: ``model.compile`` and ``model.compile_mode``.
        phase: the step's phase context (the trainer's timer and hooks).
        dense_gradients: the strategy needs dense gradients.
        compile_backend: torch.compile's backend (``inductor``; the tests' ``aot_eager``).
        optim_cfg, train_cfg: the ``optim`` and ``train`` sections, typed nodes (:class:`~.step.TrainStep`).
    Raises:
        ConfigError (a ValueError): ``step.samples_per_step`` > 0 with a model the static step does not cover;
            ``step.cuda_graph=true`` without the static step, with ``world_size`` > 1 or ``model.compile=true``.
    """
    cfg = typed(StepConfig, step_cfg)
    samples = resolve_samples_per_step(cfg.samples_per_step, model, device)
    try:
        if cfg.cuda_graph:
            check_graphable(samples > 0, world_size, bool(compile))
        budget = SampleBudget(model, samples) if samples > 0 else None
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if dense_gradients or cfg.cuda_graph:
        use_dense_gradients(model)
    if budget is not None:
        model.sample_capacity = budget.capacity  # bounds a training forward's gradient entries (sparse exchange)
        if compile:
            budget.compile(compile_mode, compile_backend)
    elif compile:  # in place, so a strategy's re-wrap keeps it; compile time reported by the profiler
        model.compile(mode=compile_mode, backend=compile_backend)
    compile_optimizer = budget is not None and bool(compile)
    # lr tensors for a step that is recorded: compiled, or a CUDA graph (on the CPU the graph's body runs
    # uncaptured and reads the floats: the CPU's Adam cannot be capturable, a tensor lr would be read there)
    tensor_lr = compile_optimizer or (bool(cfg.cuda_graph) and records_graph(device))
    step = TrainStep(model, optim_cfg, train_cfg, bf16=cfg.bf16, phase=phase, budget=budget,
                     compile_optimizer=compile_optimizer, tensor_lr=tensor_lr, compile_mode=compile_mode,
                     compile_backend=compile_backend)
    return GraphedStep(step, probe_every=cfg.probe_every) if cfg.cuda_graph else step
