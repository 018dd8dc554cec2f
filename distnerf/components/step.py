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
from ..config_check import section
from ..schema import TrainLoopConfig
from .loss import RayError, ray_error
from .optim import build_optimizer, rebuild_optimizer, set_lr
from .regularizer import add_regularizer_grads_
from .sample_budget import SampleBudget, resolve_samples_per_step
from .schedule import Clock, budgeted, stage_step

Phase = Callable[[str], ContextManager]


def records_graph(device: torch.device | str) -> bool:
    """Whether ``train.cuda_graph`` records the static step as a CUDA graph and replays it on ``device``: CUDA.
    Elsewhere :class:`~.graphed_step.GraphedStep` runs the same body uncaptured on the same buffers, and the
    optimizer keeps float learning rates (the CPU's Adam cannot be ``capturable``). The one place the graph
    path is chosen (the step's learning rates, the graphed step, the trainer's log line); a device fact, so
    nothing forces it on the CPU (the uncaptured body is the CPU's stand-in: ``tests/unit/test_graphed_step.py``)."""
    return torch.device(device).type == "cuda"


def no_phase(name: str) -> ContextManager:
    """The default timing hook: times nothing."""
    return contextlib.nullcontext()


def bf16_autocast(enabled: bool, device: torch.device, cache_enabled: bool = True) -> ContextManager:
    """``train.bf16``: the training render under torch's bf16 autocast on ``device``'s type, CUDA or the CPU
    (the operators autocast lists, matrix products among them, run in bfloat16; the loss, the backward's
    accumulation into float32 parameters and the optimizer stay float32). ``cache_enabled=False`` inside a
    CUDA graph's body (PyTorch: autocast's weight cache must not outlive a capture). The one place the step
    chooses its precision (the static step, the dynamic step and the graphed step's body)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bool(enabled), cache_enabled=cache_enabled)


class TrainStep:
    """The optimizer of ``model`` and the step that updates it.

    Args:
        model: the (unwrapped) radiance model; its ``param_groups`` give the optimizer groups.
        optim_cfg: ``train`` config: ``lr``, the schedule (``decay``, ``decay_steps``, ``warmup_steps``,
            ``max_minutes``, ``schedule_steps``: :mod:`.schedule`), ``eps``, ``fused`` (:mod:`.optim`), ``bf16``
            and ``samples_per_step`` (> 0, or null on CUDA: the static step, :mod:`.sample_budget`).
        phase: ``phase(name)`` context manager timing ``backward``, ``regularizer`` and
            ``optimizer`` (the trainer's step breakdown); default: no timing.
        compile_static, compile_mode: ``model.compile`` and ``model.compile_mode`` for the static step:
            its render is compiled with ``fullgraph=True`` (the trainer compiles the dynamic step's model),
            and the optimizer's step is compiled on its own (its learning rates 0-dim tensors changed in
            place, :func:`.optim.build_optimizer`, so the schedule recompiles nothing; one compilation per
            grid stage, whose new tables rebuild the optimizer). ``compile_mode="reduce-overhead"`` replays
            both compiled parts as CUDA graphs on a GPU.
        compile_backend: torch.compile's backend for both (``inductor``; the tests' ``aot_eager``).
        cuda_graph: ``train.cuda_graph``: the static step is replayed as a CUDA graph
            (:class:`~.graphed_step.GraphedStep`, which the trainer builds over this step): the optimizer's
            learning rates are then 0-dim tensors on the device and Adam is ``capturable``.
    Raises:
        ValueError: ``samples_per_step`` > 0 with a model the static step does not cover.
    """

    def __init__(self, model: RadianceModel, optim_cfg, phase: Phase = no_phase, compile_mode: str | None = None,
                 compile_static: bool = False, compile_backend: str = "inductor", cuda_graph: bool = False):
        self.model, self.cfg, self.phase = model, section(TrainLoopConfig, optim_cfg), phase
        self.budget = None  # train.samples_per_step > 0: the static step's sample budget (.sample_budget)
        samples = resolve_samples_per_step(self.cfg.samples_per_step, model)
        self.compiled_optimizer = samples > 0 and compile_static  # model.compile on the static step
        # lr tensors for a step that is recorded: compiled, or a CUDA graph (on the CPU the graph's body runs
        # uncaptured and reads the floats: the CPU's Adam cannot be capturable, a tensor lr would be read there)
        graphs = any(records_graph(p.device) for p in model.parameters())
        self.tensor_lr = self.compiled_optimizer or (samples > 0 and cuda_graph and graphs)
        self._compile = (compile_mode, compile_backend)
        self.optimizer = build_optimizer(model, optim_cfg, tensor_lr=self.tensor_lr)
        self._optimizer_step = self._compiled_step()
        if samples > 0:
            self.budget = model.sample_budget = SampleBudget(model, samples)
            if compile_static:  # model.compile: the static render, fullgraph
                self.budget.compile(compile_mode, compile_backend)

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

    def prepare(self, step: int, budget_fraction: float | None = None) -> bool:
        """Model schedule (grid upsampling, occupancy refresh) and learning rate of ``step``
        (:mod:`.schedule`: by step, or by ``budget_fraction``, the agreed fraction of the time
        budget elapsed, when the config sets ``train.max_minutes``).

        Returns:
            True when the model replaced parameter tensors (the optimizer was rebuilt, keeping
            the state of unchanged tensors; a data-parallel wrapper must be rebuilt too).
        """
        clock = Clock(step, budget_fraction if budgeted(self.cfg) else None)
        replaced = bool(self.model.update_state(step, stage_step(clock, self.cfg)))
        if replaced:
            self.optimizer = rebuild_optimizer(self.optimizer, self.model, self.cfg, tensor_lr=self.tensor_lr)
            self._optimizer_step = self._compiled_step()
        set_lr(self.optimizer, clock, self.cfg)
        return replaced

    def forward(self, module: torch.nn.Module, batch) -> tuple[RenderOutput, RayError]:
        """Render ``batch`` through ``module`` (the model or its strategy wrapper).

        Args:
            batch: a sampler batch: ``rays`` (R rays), ``rgb`` (R, 3) float32, ``valid`` (R,) bool,
                ``jitter_seed`` (int: the stratified-sampling stream of this batch).
        Returns:
            (outputs of the model, its :class:`~.loss.RayError`: ``sse``, the scalar float32 summed
            error over valid rays the caller normalises for :meth:`update`, and the per-row error).
        """
        device = batch.rgb.device
        generator = torch.Generator(device).manual_seed(batch.jitter_seed)
        with bf16_autocast(self.cfg.bf16, device):
            out = module(batch.rays, generator)
        return out, ray_error(out, batch.rgb, batch.valid)

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
