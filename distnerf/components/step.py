"""One optimisation step of a radiance model, in the two halves a strategy synchronises
between.

``forward`` renders a batch and returns the *summed* photometric error, with the per-ray
error it sums; the caller (the trainer) divides the sum by the strategy's loss normaliser (a
fixed number: no collective between forward and backward) and hands the loss to ``update``:
backward, the strategy's correction of its gradients (if any), the model's closed-form
regulariser gradients (identical on every rank, so added after any gradient all-reduce), the
optimizer step.
The trainer and the balanced partition's density fit (:mod:`distnerf.strategy.density`)
both run exactly this step.
"""
from __future__ import annotations

import contextlib
from typing import Callable, ContextManager

import torch

from ..model.base import RadianceModel
from ..renderer.output import RenderOutput
from ..config_check import typed
from ..schema import OptimConfig, TrainLoopConfig
from .loss import RayError, ray_error
from .optim import build_optimizer, rebuild_optimizer, set_lr
from .regularizer import add_regularizer_grads_
from .sample_budget import SampleBudget
from .schedule import Clock, budgeted, stage_step

Phase = Callable[[str], ContextManager]


def records_graph(device: torch.device | str) -> bool:
    """Whether ``step.cuda_graph`` records the static step as a CUDA graph and replays it on ``device``: CUDA.
    Elsewhere :class:`~.graphed_step.GraphedStep` runs the same body uncaptured on the same buffers, and the
    optimizer keeps float learning rates (the CPU's Adam cannot be ``capturable``). The one place the graph
    path is chosen (the step's learning rates, the graphed step, the trainer's log line); a device fact, so
    nothing forces it on the CPU (the uncaptured body is the CPU's stand-in: ``tests/unit/test_graphed_step.py``)."""
    return torch.device(device).type == "cuda"


def no_phase(name: str) -> ContextManager:
    """The default timing hook: times nothing."""
    return contextlib.nullcontext()


def bf16_autocast(enabled: bool, device: torch.device, cache_enabled: bool = True) -> ContextManager:
    """``step.bf16``: the training render under torch's bf16 autocast on ``device``'s type, CUDA or the CPU
    (the operators autocast lists, matrix products among them, run in bfloat16; the loss, the backward's
    accumulation into float32 parameters and the optimizer stay float32). ``cache_enabled=False`` inside a
    CUDA graph's body (PyTorch: autocast's weight cache must not outlive a capture). The one place the step
    chooses its precision (the static step, the dynamic step and the graphed step's body)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bool(enabled), cache_enabled=cache_enabled)


def render_batch(module: torch.nn.Module, batch, budget: SampleBudget | None = None,
                 bf16: bool = False) -> tuple[RenderOutput, RayError]:
    """The training render of ``batch`` through ``module`` (the model or its strategy wrapper, whose forward runs
    the whole render) and its error.

    Args:
        batch: a sampler batch: ``rays`` (R rays), ``rgb`` (R, 3) float32, ``valid`` (R,) bool, ``jitter_seed``
            (int: the stratified-sampling stream of this batch).
        budget: the static step's sample budget, passed to the model's forward (P fixed sample slots), or None:
            the dynamic render (the model's forward is called without it).
        bf16: ``step.bf16`` (:func:`bf16_autocast`).
    Returns:
        (the model's outputs, their :class:`~.loss.RayError`: ``sse``, the scalar float32 summed error over valid
        rays, and the per-row error).
    """
    device = batch.rgb.device
    generator = torch.Generator(device).manual_seed(batch.jitter_seed)
    with bf16_autocast(bf16, device):
        out = module(batch.rays, generator) if budget is None else module(batch.rays, generator, budget)
    return out, ray_error(out, batch.rgb, batch.valid)


class TrainStep:
    """The eager training step of ``model``: its optimizer, the forward and the update; the dynamic step
    (``budget`` None: packed samples, sizes read on the host) or the static one (a :class:`SampleBudget`: P fixed
    sample slots). Built by :func:`~.step_path.build_step`, which chooses the path once.

    Args:
        model: the (unwrapped) radiance model; its ``param_groups`` give the optimizer groups.
        optim_cfg: the ``optim`` section (a typed node): ``lr``, the schedule (``decay``, ``decay_steps``,
            ``warmup_steps``, ``schedule_steps``: :mod:`.schedule`), ``betas``, ``eps``, ``fused`` (:mod:`.optim`).
        train_cfg: the ``train`` section (a typed node): the run's length the schedule reads (``max_steps``,
            ``max_minutes``).
        bf16: ``step.bf16`` (the step's other keys are read by the builder, not here).
        phase: ``phase(name)`` context manager around ``forward``, ``backward``, ``regularizer`` and
            ``optimizer`` (the trainer's step breakdown and its phase hooks); default: nothing.
        budget: the static step's sample budget (:mod:`.sample_budget`), or None: the dynamic step.
        compile_optimizer: the optimizer's step compiled on its own (``model.compile`` on the static step: its
            learning rates 0-dim tensors changed in place, :func:`.optim.build_optimizer`, so the schedule
            recompiles nothing; one compilation per grid stage, whose new tables rebuild the optimizer).
        tensor_lr: the learning rates as 0-dim tensors on the device (a compiled optimizer, or a step recorded as
            a CUDA graph, whose Adam is then ``capturable``).
        compile_mode, compile_backend: ``model.compile_mode`` and torch.compile's backend for the optimizer
            (``inductor``; the tests' ``aot_eager``).
    """

    def __init__(self, model: RadianceModel, optim_cfg, train_cfg, *, bf16: bool = False,
                 phase: Phase = no_phase, budget: SampleBudget | None = None, compile_optimizer: bool = False,
                 tensor_lr: bool = False, compile_mode: str | None = None, compile_backend: str = "inductor"):
        self.model, self.cfg, self.phase, self.budget = model, typed(OptimConfig, optim_cfg), phase, budget
        self.train_cfg, self.bf16 = typed(TrainLoopConfig, train_cfg), bool(bf16)
        self.compiled_optimizer, self.tensor_lr = bool(compile_optimizer), bool(tensor_lr or compile_optimizer)
        self._compile = (compile_mode, compile_backend)
        self.optimizer = build_optimizer(model, self.cfg, tensor_lr=self.tensor_lr)
        self._optimizer_step = self._compiled_step()

    def _compiled_step(self):
        """The optimizer's ``step`` compiled on its own where the static step is compiled (the class docstring),
        else None: :meth:`update` then calls ``self.optimizer.step`` as it is at that moment."""
        if not self.compiled_optimizer:
            return None
        mode, backend = self._compile
        return torch.compile(self.optimizer.step, mode=mode, backend=backend)

    def budget_metrics(self) -> dict[str, float]:
        """The sample budget's figures of the previous step (:meth:`SampleBudget.metrics`), or {}."""
        return {} if self.budget is None else self.budget.metrics()

    def metrics(self) -> dict[str, float]:
        """The step's figures for the logs: :meth:`budget_metrics`."""
        return self.budget_metrics()

    def release(self) -> None:
        """Nothing to release (the graphed step's counterpart drops its recorded graph)."""

    def prepare(self, step: int, budget_fraction: float | None = None) -> bool:
        """Model schedule (grid upsampling, occupancy refresh) and learning rate of ``step``
        (:mod:`.schedule`: by step, or by ``budget_fraction``, the agreed fraction of the time
        budget elapsed, when the config sets ``train.max_minutes``).

        Returns:
            True when the model replaced parameter tensors (the optimizer was rebuilt, keeping
            the state of unchanged tensors; a data-parallel wrapper must be rebuilt too).
        """
        clock = Clock(step, budget_fraction if budgeted(self.train_cfg) else None)
        replaced = bool(self.model.update_state(step, stage_step(clock, self.cfg)))
        if replaced:
            self.optimizer = rebuild_optimizer(self.optimizer, self.model, self.cfg, tensor_lr=self.tensor_lr)
            self._optimizer_step = self._compiled_step()
        set_lr(self.optimizer, clock, self.cfg, self.train_cfg)
        return replaced

    def collapsed(self) -> list[str]:
        """The model's emptied parts (:meth:`~distnerf.model.base.RadianceModel.collapsed`); on the static step the
        occupancy grid's emptiness as the budget reported it a step late (no device read)."""
        if self.budget is not None:
            return ["occupancy grid"] if self.budget.occupancy_empty() else []
        return self.model.collapsed()

    def forward(self, module: torch.nn.Module, batch) -> tuple[RenderOutput, RayError]:
        """Render ``batch`` through ``module`` (the model or its strategy wrapper) with this step's budget
        (:func:`render_batch`).

        Args:
            batch: a sampler batch: ``rays`` (R rays), ``rgb`` (R, 3) float32, ``valid`` (R,) bool,
                ``jitter_seed`` (int: the stratified-sampling stream of this batch).
        Returns:
            (outputs of the model, its :class:`~.loss.RayError`: ``sse``, the scalar float32 summed
            error over valid rays the caller normalises for :meth:`update`, and the per-row error).
        """
        return render_batch(module, batch, self.budget, self.bf16)

    def run(self, module: torch.nn.Module, batch, step: int, normalizer: Callable, agree: Callable,
            after_backward: Callable) -> tuple:
        """One whole step of ``batch`` (the interface :class:`~.graphed_step.GraphedStep` shares): :meth:`forward`,
        ``agree(batch, sse)`` (the trainer launches its step agreement: no host wait before the backward), the
        summed error divided by ``normalizer(batch)``'s divisor (a
        :class:`~distnerf.strategy.base.LossNormalizer`), :meth:`update` with ``after_backward(norm)``.

        Args:
            module: the model or its strategy wrapper; batch: a sampler batch (:meth:`forward`);
            step: the step's index (unused here: the graphed step's warm-up and probes).
        Returns:
            (the batch the step ran on, the model's outputs, their :class:`~.loss.RayError`, what ``agree``
            returned).
        """
        with self.phase("forward"):
            out, error = self.forward(module, batch)
        pending = agree(batch, error.sse)
        norm = normalizer(batch)
        self.update(error.sse / norm.divisor, lambda: after_backward(norm))
        return batch, out, error, pending

    def update(self, loss: torch.Tensor, after_backward: Callable[[], None] | None = None) -> None:
        """Backward (a data-parallel wrapper all-reduces inside), ``after_backward()`` (the strategy's
        correction of the loss gradients: :meth:`~distnerf.strategy.base.LossNormalizer.rescale_`),
        regulariser gradients, step."""
        with self.phase("backward"):
            loss.backward()
            if after_backward is not None:
                after_backward()
        with self.phase("regularizer"):
            add_regularizer_grads_(self.model)
        with self.phase("optimizer"):
            (self._optimizer_step or self.optimizer.step)()
            self.optimizer.zero_grad(set_to_none=True)
