"""The whole static training step replayed as one CUDA graph per grid stage (``step.cuda_graph=true``).

A step of the static path (:mod:`.sample_budget`) has fixed shapes within a grid stage and reads nothing back
to the host, so its forward, loss, backward, regulariser gradients and optimizer step can be recorded once and
replayed: PyTorch's whole-network capture (``torch.cuda.graph``; the recipe of the CUDA-graphs section of
PyTorch's CUDA semantics notes: warm-up steps first, gradients set to None before the capture so the backward
allocates them in the graph's private pool, an optimizer with ``capturable=True``, autocast without its
weight cache). A replay costs one launch instead of ~250 operator dispatches (``bench/throughput/ops.py``).

Each step the trainer's batch is copied into fixed input buffers (R rays: origins, directions, viewdirs,
near, far, image ids; rgb, valid), the step's random draws (the sample-grid jitter, a random background) are
made eagerly from the batch's jitter generator exactly as the eager step draws them and copied into fixed
buffers, the loss divisor into a 0-dim device buffer; then the graph replays. Everything else the step reads
stays at one address within a stage: the parameters and Adam's state (rebuilt only at a stage change), the
learning rates (0-dim device tensors the schedule fills in place, :func:`.optim.set_lr`), the occupancy grid
(a refresh writes it in place, outside the graph), the sample budget's clip box and ranges. A **key** of
those (the tables' and the occupancy grid's addresses and shapes, the optimizer and its learning rates'
addresses, R; P, K and the step size change only with the tables) is checked every step; when it changes (a
grid stage) the step runs eagerly for ``warmup`` steps and is captured again. Every ``probe_every`` steps one
step runs eagerly (on the same buffers) so the trainer's phase breakdown (forward, backward, regulariser,
optimizer) has figures: a replay is one ``graph`` phase, opaque inside.

Limits (:func:`check_graphable`): the static step (``step.samples_per_step`` > 0), one process (a gradient
all-reduce inside a graph is not attempted), ``model.compile=false`` (the graph records the eager operators),
dense gradients (the sparse colour-row gradient's sizes depend on the data: ``model.sparse_grad`` is turned
off, as DDP does), a loss divisor that needs no correction after the backward.

On the CPU there are no CUDA graphs: the same body runs uncaptured on the same buffers every step
(``captured`` False), which is what the CPU suite checks (the body against the eager step, and that every
tensor it reads from outside sits at one address through a stage, refresh steps included:
``tests/unit/test_graphed_step.py``); the captured replay is checked by that file's CUDA tests.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import torch

from ..data.rays import RayBundle
from ..renderer.output import RenderOutput
from .loss import RayError, ray_error
from .regularizer import add_regularizer_grads_
from .step import bf16_autocast, records_graph

log = logging.getLogger("distnerf")


def check_graphable(static: bool, world_size: int, compiled: bool) -> None:
    """Raise ValueError naming what stops ``step.cuda_graph=true``: no static step (``static`` False:
    ``step.samples_per_step`` 0, or null off CUDA), more than one process, or ``model.compile=true``. Called by
    :func:`~.step_path.build_step`, at build time."""
    problems = []
    if not static:
        problems.append("the static step (step.samples_per_step > 0, or null on CUDA, with a grid or ngp model "
                        "the static step covers)")
    if world_size > 1:
        problems.append(f"one process (world size {world_size}: a gradient all-reduce inside a graph is not supported)")
    if compiled:
        problems.append("model.compile=false (the graph records the eager operators; model.compile_mode="
                        "reduce-overhead is torch.compile's own CUDA-graph route)")
    if problems:
        raise ValueError("step.cuda_graph=true needs " + "; ".join(problems))


@dataclass
class _Key:
    """What a captured graph depends on: when any of it changes the graph is recorded again."""
    tables: tuple  # (data_ptr, shape) of every parameter
    occupancy: tuple  # the occupancy grid's binary and box: address, shape
    optimizer: int  # id of the optimizer (rebuilt at a stage change)
    lrs: tuple  # addresses of the groups' learning-rate tensors (filled in place by the schedule)
    rays: int  # R
    image_ids: bool
    random_background: bool


class GraphedStep:
    """The whole training step of a :class:`~.step.TrainStep` on the static path, replayed as a CUDA graph
    (module docstring).

    Args:
        step: the TrainStep (its model, optimizer, sample budget; built with ``cuda_graph=True``).
        warmup: eager steps after each (re)key before the capture (PyTorch's recipe warms up before capture).
        probe_every: one eager step every this many steps (0: never), for the phase breakdown.
    Raises:
        ValueError: ``step`` has no sample budget (:func:`check_graphable`).
    """

    def __init__(self, step, warmup: int = 3, probe_every: int = 100):
        check_graphable(step.budget is not None, world_size=1, compiled=False)
        self.step, self.warmup, self.probe_every = step, int(warmup), int(probe_every)
        self.graph = None
        self.captures = self.replays = self.eager_steps = self.probes = 0
        self._key = None
        self._warm, self._probing = 0, False
        self._buffers: dict[str, torch.Tensor] = {}
        self._outputs = None  # (RenderOutput, RayError) of the captured body: rewritten by every replay
        self._stats = None  # the captured body's (4,) stats
        self._stream = None  # CUDA: the side stream of the warm-up steps and the capture

    @property
    def model(self):
        return self.step.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.step.optimizer

    @property
    def budget(self):
        return self.step.budget

    @property
    def phase(self):
        return self.step.phase

    def prepare(self, step: int, budget_fraction: float | None = None) -> bool:
        """The eager step's :meth:`~.step.TrainStep.prepare` (a replaced table re-keys the graph at the next step)."""
        return self.step.prepare(step, budget_fraction)

    def budget_metrics(self) -> dict[str, float]:
        return self.step.budget_metrics()

    def collapsed(self) -> list[str]:
        return self.step.collapsed()

    @property
    def captured(self) -> bool:
        """Whether a recorded CUDA graph replays (False: eager, or the CPU's uncaptured body)."""
        return self.graph is not None

    # ------------------------------------------------------------------ inputs
    def inputs(self, batch):
        """``batch`` copied into the fixed input buffers (allocated anew when the key changes, which restarts
        the warm-up); returns a :class:`~distnerf.sampler.base.RayBatch` of the buffers (its ``jitter_seed``
        and ``num_valid`` as ``batch``'s)."""
        from ..sampler.base import RayBatch

        key = self._make_key(batch)
        if key != self._key:
            self._key, self._warm, self.graph, self._outputs, self._stats = key, 0, None, None, None
            self._buffers = {}
        rays = batch.rays
        named = {"origins": rays.origins, "directions": rays.directions, "viewdirs": rays.viewdirs,
                 "near": rays.near, "far": rays.far, "rgb": batch.rgb, "valid": batch.valid}
        if rays.image_ids is not None:
            named["image_ids"] = rays.image_ids
        for name, value in named.items():
            self._fill(name, value)
        b = self._buffers
        static = RayBundle(b["origins"], b["directions"], b["viewdirs"], b["near"], b["far"], b.get("image_ids"))
        return RayBatch(static, b["rgb"], b["valid"], batch.jitter_seed, batch.num_valid)

    def _make_key(self, batch) -> _Key:
        model, occ = self.model, self.model.occupancy
        return _Key(tables=tuple((p.data_ptr(), tuple(p.shape)) for p in model.parameters()),
                    occupancy=(occ.binary.data_ptr(), tuple(occ.binary.shape), occ.aabb.data_ptr()),
                    optimizer=id(self.step.optimizer), rays=len(batch.rays),
                    lrs=tuple(g["lr"].data_ptr() if torch.is_tensor(g["lr"]) else None
                              for g in self.step.optimizer.param_groups),
                    image_ids=batch.rays.image_ids is not None, random_background=bool(model.random_background))

    # ------------------------------------------------------------------ the step
    def eager_now(self, step_index: int) -> bool:
        """Whether this step runs eagerly (the trainer's usual forward and update, on the buffers): a
        warm-up step after a (re)key, or a probe step (every ``probe_every`` steps once warm)."""
        self._probing = self._warm >= self.warmup and bool(self.probe_every) and step_index % self.probe_every == 0
        return self._warm < self.warmup or self._probing

    def after_eager(self) -> None:
        """Count an eager step the trainer ran on the buffers (a warm-up step brings the capture nearer)."""
        if self._probing:
            self.probes += 1
        else:
            self._warm += 1
        self.eager_steps += 1

    def run(self, module: torch.nn.Module, batch, step: int, normalizer, agree, after_backward) -> tuple:
        """One whole step (:meth:`~.step.TrainStep.run`'s interface): ``batch`` copied into the buffers
        (:meth:`inputs`), then a replay (:meth:`replay`, the ``graph`` phase) or, for a warm-up or probe step
        (:meth:`eager_now`), the eager forward and update on the buffers; ``agree(batch, sse)`` after the update
        (one process: nothing waits on it). ``after_backward`` is not called: one process, an exact divisor
        (:func:`check_graphable`), nothing to correct. Returns (the buffers' batch, outputs, their
        :class:`~.loss.RayError`, what ``agree`` returned): tensors the next replay rewrites."""
        batch = self.inputs(batch)  # the graph's fixed buffers (a new grid stage: new ones)
        norm = normalizer(batch)
        assert norm.exact, "one process (check_graphable): the loss divisor needs no correction after the backward"
        if not self.eager_now(step):
            with self.step.phase("graph"):
                out, error = self.replay(batch, norm.divisor)
        else:
            with self.warmup_stream(batch.rgb.device):  # a warm-up or probe step: eager, on the buffers
                with self.step.phase("forward"):
                    out, error = self.step.forward(module, batch)
                self.step.update(error.sse / norm.divisor)
            self.after_eager()
        return batch, out, error, agree(batch, error.sse)

    def replay(self, batch, divisor) -> tuple[RenderOutput, RayError]:
        """One whole step of ``batch`` (the buffers :meth:`inputs` returned): draws, then the graph's replay
        (recorded first when there is none; on the CPU the body itself). ``divisor``: the loss divisor (a host
        number or a 0-dim device tensor). Returns the step's outputs: tensors the next replay rewrites."""
        budget, model = self.step.budget, self.model
        generator = torch.Generator(batch.rgb.device).manual_seed(batch.jitter_seed)
        u, background = budget.draw(model, batch.rays, generator)  # as the eager step draws them
        self._fill("u", u)
        if model.random_background:
            background = self._fill("background", background)
        if torch.is_tensor(divisor):
            self._fill("divisor", divisor.detach().to(torch.float32).reshape(()))
        else:  # a host number, filled by a kernel (a copy from pageable host memory would wait for the device)
            self._buffer("divisor", (), torch.float32, batch.rgb.device).fill_(float(divisor))
        budget.prepare_inputs(model, batch.rays)  # the clip box refreshed in place, outside any graph
        if not records_graph(batch.rgb.device):  # no CUDA graphs: the body, uncaptured, on the same buffers
            out, error, stats = self._body(batch, background)
            self.step.optimizer.zero_grad(set_to_none=True)  # as a replay: the next backward writes, not adds
        else:
            if self.graph is None:
                self._capture(batch, background)
            self.graph.replay()
            self.replays += 1
            (out, error), stats = self._outputs, self._stats
        budget._push(stats)
        return out, error

    def _buffer(self, name: str, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The fixed buffer ``name`` (made at the first use after a (re)key; one made anew while a graph
        exists drops the graph, which holds the old one's address: warm-up and capture again)."""
        buf = self._buffers.get(name)
        if buf is None or tuple(buf.shape) != tuple(shape) or buf.dtype != dtype:
            if buf is not None and self.graph is not None:
                self.release()
            self._buffers[name] = buf = torch.empty(shape, dtype=dtype, device=device)
        return buf

    def release(self) -> None:
        """Drop the recorded graph (its memory pool goes with it); the next steps warm up and record again."""
        self.graph, self._outputs, self._stats, self._warm = None, None, None, 0

    @contextlib.contextmanager
    def warmup_stream(self, device: torch.device):
        """Where an eager step runs: on CUDA the graph's capture stream (PyTorch's recipe warms up on a side
        stream, then records on it), ordered after and before the current stream's work; elsewhere as is."""
        if device.type != "cuda":
            yield
            return
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        current = torch.cuda.current_stream(device)
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream):
            yield
        current.wait_stream(self._stream)

    def _fill(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """``value`` copied into the fixed buffer ``name``."""
        return self._buffer(name, value.shape, value.dtype, value.device).copy_(value)

    def _body(self, batch, background) -> tuple[RenderOutput, RayError, torch.Tensor]:
        """The recorded step: render (the sample budget's), the summed error over the divisor, backward,
        regulariser gradients, the optimizer's step. No host read, no allocation the next step needs."""
        model, b = self.model, self._buffers
        device = b["u"].device
        with bf16_autocast(self.step.bf16, device, cache_enabled=False):
            out, stats = self.step.budget.render_drawn(model, batch.rays, b["u"], background)
        error = ray_error(out, batch.rgb, batch.valid)
        (error.sse / b["divisor"]).backward()
        add_regularizer_grads_(model)
        self.step.optimizer.step()
        return out, error, stats

    def _capture(self, batch, background) -> None:
        """Record :meth:`_body` (gradients set to None first: the backward allocates them in the graph's pool),
        then leave the gradients to the graph (set to None for the eager steps that follow)."""
        optimizer = self.step.optimizer
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        if self._stream is None:
            self._stream = torch.cuda.Stream(batch.rgb.device)
        # on the warm-up steps' stream; thread_local: a background thread's CUDA call (an asynchronous
        # checkpoint's copy) does not invalidate the capture (the backward's kernels follow the stream)
        with torch.cuda.graph(graph, stream=self._stream, capture_error_mode="thread_local"):
            out, error, stats = self._body(batch, background)
        self.graph, self._outputs, self._stats = graph, (out, error), stats
        optimizer.zero_grad(set_to_none=True)  # the graph keeps its gradient buffers (its pool)
        self.captures += 1
        log.info("step.cuda_graph: step recorded as one CUDA graph (capture %d; %d rays, %d sample slots)",
                 self.captures, len(batch.rays), self.step.budget.capacity)

    def metrics(self) -> dict[str, float]:
        """Figures for the logs: the step's (:meth:`~.step.TrainStep.metrics`) and the graph's counts:
        ``graph_captures``, ``graph_replays``, ``graph_eager_steps`` (warm-up and probe steps), ``graph_probes``."""
        return {**self.step.metrics(), "graph_captures": float(self.captures), "graph_replays": float(self.replays),
                "graph_eager_steps": float(self.eager_steps), "graph_probes": float(self.probes)}
