"""The sample budget of a static training step (``step.samples_per_step``): its state, its rule, its report.

A static step (:mod:`distnerf.model.marched_static`) renders the batch's R rays into P fixed sample
slots. Instant-NGP and nerfacc keep about 2^18 samples a step; here, as there, the number of rays
marched adapts to the occupancy: the next step marches ``floor(headroom P / s)`` rays (at most R),
``s`` the samples per active ray this step needed (:func:`~distnerf.renderer.static.next_active_rays`),
a 0-dim device tensor that no host reads (the rule acts a step late). Overflowed rays (samples past
slot P) and the inactive ones weigh 0 in the loss, the counted rays' errors are averaged
(``RenderOutput.loss_weight``).

Learning-rate rule: the loss is the mean over the counted rays whatever their number, so the
learning rate is unchanged as the ray count adapts (the gradient's noise, not its scale, follows the
count). On CUDA R (the rank's batch: ``train.rays_per_rank``, or ``train.global_rays`` / W) should exceed what
P holds at the final stage (2^18 slots and lego's ~10 samples per ray: about 26k rays) so that the budget, not R,
sets the work: with both batch keys null the entry point sets ``train.rays_per_rank`` to
:data:`STATIC_RAYS_PER_RANK` where the static step runs by default (:func:`static_by_default`), and the
trainer logs the fill (``budget_fill``).

Reported a step late through a host buffer (as :mod:`distnerf.engine.late_flag`, no host sync):
``budget_overflow_rate`` (overflowed / active rays), ``budget_active_rays``, ``budget_counted_rays`` (the
rays the loss saw: the step's ``rays_per_s`` counts the batch's R), ``budget_samples_per_ray`` (samples
needed per active ray) and ``budget_fill`` (samples needed / P).
"""
from __future__ import annotations

import math

import torch

from ..data.rays import RayBundle
from ..host_buffers import host_buffer, static_nonzero_available
from ..model.marched_static import check_static, field_fn_of, static_problems, static_render
from ..renderer.output import RenderOutput
from ..renderer.static import interval_slots

AUTO_SAMPLES = 1 << 18  # step.samples_per_step=null on CUDA (Instant-NGP's and nerfacc's budget)
STATIC_RAYS_PER_RANK = 1 << 14
"""``train.rays_per_rank`` when it and ``train.global_rays`` are null and the static step runs (CUDA): the batch the
budget marches from. At lego's final stage a ray needs about 10 samples, so 4096 rays fill about 16% of
:data:`AUTO_SAMPLES` slots; 16384 rays can fill more than half (the rule marches ``headroom P / s`` of them)."""
HEADROOM = 0.9  # the fraction of the slots the rule aims at: about 1 overflowed ray in 1e3 on lego (measured: 0)


def auto_budget_on(device: torch.device | str) -> bool:
    """Whether ``step.samples_per_step`` null means the static step on ``device``: CUDA, where a step's
    host reads stall the device (the CPU keeps the dynamic step, faster there: bench/throughput/README.md,
    "Which step the CPU takes"). The one place this choice is made (:func:`resolve_samples_per_step`,
    :func:`static_by_default`)."""
    return torch.device(device).type == "cuda"


def resolve_samples_per_step(value: int | None, model, device: torch.device | None = None) -> int:
    """``step.samples_per_step`` as an int: ``value``, or for null (auto) :data:`AUTO_SAMPLES` where the
    training ``device`` (default: that of ``model``'s parameters) is CUDA and the static step covers
    ``model`` (:func:`~distnerf.model.marched_static.check_static`), else 0 (the dynamic step)."""
    if value is not None:
        return int(value)
    if device is None:
        param = next(model.parameters(), None)
        device = torch.device("cpu") if param is None else param.device
    if not auto_budget_on(device):
        return 0
    try:
        check_static(model)
    except ValueError:
        return 0
    return AUTO_SAMPLES


def static_by_default(cfg, device: torch.device | str) -> bool:
    """Whether a run of the validated config ``cfg`` on ``device`` takes the static step with the automatic
    budget (``step.samples_per_step`` null) before any model is built: CUDA, and the model's options covered
    (:func:`~distnerf.model.marched_static.static_problems`, the rule :func:`resolve_samples_per_step` applies
    to the built model; ``strategy=ss``'s region models are not covered)."""
    if cfg.step.samples_per_step is not None or not auto_budget_on(device):
        return False
    m = cfg.model
    if m.name not in ("grid", "ngp"):  # the marched models (schema.MarchedModelConfig): the keys below are theirs
        return False
    return not static_problems(True, m.contraction == "mipnerf360", m.opaque_floor and m.min_altitude is not None,
                               m.train_round_steps, m.train_termination, cfg.strategy.name == "ss")


class SampleBudget:
    """The state of the static step of one model (passed to its ``forward`` by the step,
    :func:`~distnerf.components.step.render_batch`; a training forward then calls :meth:`render`).

    Args:
        model: a marched model (:func:`~distnerf.model.marched_static.check_static`).
        capacity: P sample slots a step.
        headroom: the fraction of P the ray rule aims at.
    Raises:
        ValueError: ``capacity`` < 1, or the model has options the static step does not cover.
    """

    def __init__(self, model, capacity: int, headroom: float = HEADROOM):
        if capacity < 1:
            raise ValueError(f"step.samples_per_step: {capacity} slots (must be >= 1, or 0 for off)")
        check_static(model)
        self.capacity, self.headroom = int(capacity), float(headroom)
        self.active: torch.Tensor | None = None  # () int64 on the device: the rays the next step marches
        self._render = static_render
        self._clip_key = self._slots_key = self._range_key = None
        self._any_occupied = None  # 0-dim bool: any occupancy cell set, with the clip box
        self._host = None  # (4,) float32 host buffer: the last step's stats (static_render's), read a step late
        self._event, self._pending, self._last = None, False, [0.0] * 4

    def compile(self, mode: str | None = None, backend: str = "inductor") -> None:
        """Compile :func:`~distnerf.model.marched_static.static_render` with ``fullgraph=True``
        (one graph per grid stage: K and the tables' shapes are its only changing sizes)."""
        self._render = torch.compile(static_render, fullgraph=True, mode=mode, backend=backend)

    def render(self, model, rays: RayBundle, generator: torch.Generator | None) -> RenderOutput:
        """``model``'s training render of ``rays`` (R) in P slots: the jitter and the random background
        drawn as :meth:`~distnerf.model.marched.MarchingModel.forward` draws them (:meth:`draw`), then
        :meth:`render_drawn`; the stats go to the host buffer, unread."""
        u, background = self.draw(model, rays, generator)
        out, stats = self.render_drawn(model, rays, u, background)
        self._push(stats)
        return out

    def draw(self, model, rays: RayBundle, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's random draws from ``generator``: ``u`` (R,) the sample-grid jitter in [0, 1) and the
        background, (R, 3) random where ``model.random_background``, else the model's (3,)."""
        origins = rays.origins
        u = torch.rand(rays.near.shape, generator=generator, device=origins.device, dtype=rays.near.dtype)
        background = model.background
        if model.random_background:
            background = torch.rand(len(rays), 3, generator=generator, device=origins.device, dtype=origins.dtype)
        return u, background

    def render_drawn(self, model, rays: RayBundle, u: torch.Tensor, background: torch.Tensor | None
                     ) -> tuple[RenderOutput, torch.Tensor]:
        """:func:`~distnerf.model.marched_static.static_render` of ``rays`` with the draws ``u`` and
        ``background`` (:meth:`draw`); the next step's ray count written in place into :attr:`active` (on the
        device). Every tensor it reads besides its arguments stays at one address within a grid stage (the
        clip box, the ranges, the occupancy grid: refreshed in place), so a CUDA graph can replay it
        (:mod:`.graphed_step`). Returns (outputs, the (4,) int64 stats for :meth:`_push`)."""
        clip, num_slots, ranges = self.prepare_inputs(model, rays)
        out, next_active, stats = self._render(model, rays, u, background, clip, self.active,
                                               field_fn_of(model, rays.image_ids), model.step_size(),
                                               num_slots, self.capacity, self.headroom, ranges, self._any_occupied)
        self.active.copy_(next_active)
        return out, stats

    def prepare_inputs(self, model, rays: RayBundle) -> tuple[torch.Tensor, int, tuple[torch.Tensor, torch.Tensor]]:
        """Bring the step's fixed inputs up to date, in place: the active count (made once), the clip box (after
        a refresh), K and the ranges (once per stage), the march's cell scale. :meth:`render_drawn` calls it; a
        CUDA graph's replay (:mod:`.graphed_step`) calls it before the replay, since the graph runs none of this
        host logic. Returns (the (2, 3) clip box, K, the ranges)."""
        device = rays.origins.device
        if self.active is None or self.active.device != device:
            self.active = torch.full((), len(rays), dtype=torch.int64, device=device)
        static_nonzero_available(device)  # its probe runs here, not inside a compiled render
        model.occupancy.cell_scale(rays.origins.dtype)  # the march's cells per unit (the box moves on a refresh)
        return self._clip_box(model), self._num_slots(model), self._ranges(len(rays), device)

    def _ranges(self, num_rays: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(arange(R), arange(P))`` int64 on ``device``, kept (fixed buffers: no operator a step)."""
        if self._range_key != (num_rays, device):
            self._range = (torch.arange(num_rays, device=device), torch.arange(self.capacity, device=device))
            self._range_key = (num_rays, device)
        return self._range

    def _clip_box(self, model) -> torch.Tensor:
        """(2, 3) the marching box within the occupied cells' box, on the device, recomputed when the
        occupancy changes (a refresh: device operators, no size read)."""
        occ, box = model.occupancy, model.marching_box()
        key = (occ.binary.data_ptr(), occ.binary._version, occ.aabb._version, box.data_ptr(), box._version)
        if key != self._clip_key:
            occupied = occ.occupied_aabb()
            lo = torch.maximum(box[0], occupied[0])
            clip = torch.stack([lo, torch.maximum(torch.minimum(box[1], occupied[1]), lo)])
            any_occupied = occ.binary.any()  # the collapse flag's source (it changes here only)
            if self._clip_key is not None and self._clip.shape == clip.shape and self._clip.device == clip.device:
                self._clip.copy_(clip)  # in place: a replayed CUDA graph reads the same buffers
                self._any_occupied.copy_(any_occupied)
            else:
                self._clip, self._any_occupied = clip, any_occupied
            self._clip_key = key
        return self._clip

    def _num_slots(self, model) -> int:
        """K from the marching box's diagonal and the step: read once per grid stage (the box and
        step change only there), never on a refresh step."""
        box, step = model.marching_box(), model.step_size()
        key = (box.data_ptr(), box._version, step)
        if key != self._slots_key:
            diagonal = math.sqrt(sum(e * e for e in (box[1] - box[0]).tolist()))  # host sync, once per stage
            self._slots, self._slots_key = interval_slots(diagonal, step), key
        return self._slots

    def _push(self, stats: torch.Tensor) -> None:
        cuda = stats.device.type == "cuda"
        self._take()
        if self._host is None:
            self._host = host_buffer(torch.zeros(4).pin_memory() if cuda else torch.zeros(4))
        self._host.copy_(stats, non_blocking=cuda)  # int64 to float32 in the copy
        if cuda:
            self._event = torch.cuda.Event()
            self._event.record()
        self._pending = True

    def _take(self) -> list[float]:
        """The last pushed stats as host floats (waits for their copy, queued a step ago: done)."""
        if self._pending:
            if self._event is not None:
                self._event.synchronize()
            # through numpy: the host buffer's memory, no device read (a CPU tensor's tolist looks like one)
            self._last, self._pending, self._event = self._host.numpy().tolist(), False, None
        return self._last

    def metrics(self) -> dict[str, float]:
        """The previous step's figures (module docstring), host floats; empty before two steps."""
        counted, active, needed, _ = self._last
        overflow = active - counted
        if active == 0:
            return {}
        return {"budget_overflow_rate": overflow / active, "budget_active_rays": active,
                "budget_counted_rays": active - overflow,
                "budget_samples_per_ray": needed / active, "budget_fill": needed / self.capacity}

    def occupancy_empty(self) -> bool:
        """Whether the occupancy grid was empty at the previous step (read a step late)."""
        return self._last[1] > 0 and self._last[3] == 0  # a step has reported (every step has an active ray)
