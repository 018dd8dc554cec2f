"""The rendering shared by marched models (``grid``, ``ngp``): a radiance field queried
at packed samples on a uniform sample grid, in the cells its occupancy grid marks.

Legend: R rays, P packed samples, Q samples that get a colour.

A subclass supplies the field (:meth:`field_density`, :meth:`colours`), its marching
box and step, and an :class:`~distnerf.renderer.occupancy.OccupancyGrid`; this class
renders whole rays (:meth:`forward`) and ray segments (:meth:`render_segment`, used by
``ss`` fusion and joint training) with
:func:`~distnerf.renderer.marching.render_segment`.

Sample grid: every ray's samples lie on the grid anchored at its ``near`` bound, jittered
during training by one uniform offset ``u dt`` per ray (``u`` in [0, 1), ``dt`` = step_size /
|direction|), so the segments of one ray, sampled separately, tile it exactly and
agree with sampling the whole ray (see :mod:`distnerf.renderer.occupancy`).

Contraction (``model.contraction=mipnerf360``, :mod:`distnerf.renderer.contraction`): the
field is defined on all of space, the scene box being its unit region; rays are marched
from ``near`` to infinity (the dataset's ``far`` is not a limit: the sky is content of the
contracted shell), on the contracted spacing (steps growing with distance beyond the
box), and the occupancy grid covers the contracted space.
"""
from __future__ import annotations

from functools import partial

import torch

from ..data.rays import RayBundle
from ..renderer.contraction import contract, ray_breaks, to_spacing
from ..renderer.marching import render_segment
from ..renderer.occupancy import OccupancyGrid, march, owned_window, spacing_end
from ..renderer.output import RenderOutput
from ..renderer.packed import distortion_loss
from ..renderer.samples import clip_to_box, far_above_altitude
from .base import RadianceModel


class MarchingModel(RadianceModel):
    """Base class of models rendered by packed ray marching.

    Subclasses set ``self.occupancy`` (OccupancyGrid), ``self.color_threshold``
    (weight below which a sample gets no colour), ``self.termination`` (transmittance
    below which a ray stops), ``self.eval_round_steps`` and ``self.train_round_steps``
    (grid intervals per marching round at evaluation and in training; 0: one pass),
    ``self.train_termination`` (a training render in one pass cuts at the termination point:
    :meth:`current_termination`), ``self.distortion_loss_weight`` (mip-NeRF 360's distortion
    loss in training; 0: off),
    and implement :meth:`marching_box`, :meth:`step_size`, :meth:`field_density` and
    :meth:`colours`.
    """

    occupancy: OccupancyGrid
    color_threshold: float = 1e-3
    termination: float = 1e-4
    eval_round_steps: int = 64
    train_round_steps: int = 0
    train_termination: bool = False
    distortion_loss_weight: float = 0.0
    sample_capacity: int | None = None  # P: a static step's sample slots per training forward (set by its builder)

    def init_marching(self, cfg) -> None:
        """From the model's validated section (:class:`~distnerf.schema.MarchedModelConfig`'s keys):
        set ``color_threshold``, ``termination``, ``eval_round_steps``, ``train_round_steps``,
        ``train_termination`` and ``distortion_loss_weight`` (instance attributes: a test or a tool
        may change them on a built model)."""
        self.color_threshold, self.termination = float(cfg.color_threshold), float(cfg.termination)
        self.eval_round_steps, self.train_round_steps = int(cfg.eval_round_steps), int(cfg.train_round_steps)
        self.train_termination = bool(cfg.train_termination)
        self.distortion_loss_weight = float(cfg.distortion_loss_weight)

    def init_contraction(self, cfg) -> None:
        """From the model's validated section (:class:`~distnerf.schema.MarchedModelConfig`'s keys):
        register ``contraction_aabb``, the unit region of a contracted field ((2, 3) float32
        buffer, the scene box) for ``contraction='mipnerf360'``, None for ``'none'``; keep
        ``min_altitude`` (rays end below it: :meth:`ray_far`; with ``floor_footprint`` only
        above the box's footprint; with ``opaque_floor`` the floor absorbs what reaches it:
        :meth:`forward`) and ``random_background`` (:meth:`forward`).

        Raises:
            ValueError: an unknown contraction.
        """
        if cfg.contraction not in ("none", "mipnerf360"):
            raise ValueError(f"model.contraction: unknown contraction {cfg.contraction!r} (none | mipnerf360)")
        self.register_buffer("contraction_aabb", self.aabb.clone() if cfg.contraction == "mipnerf360" else None)
        self.min_altitude = None if cfg.min_altitude is None else float(cfg.min_altitude)
        self.floor_footprint = bool(cfg.floor_footprint)
        self.opaque_floor = bool(cfg.opaque_floor) and self.min_altitude is not None
        self.random_background = bool(cfg.random_background)

    def ray_far(self, rays: RayBundle) -> torch.Tensor:
        """(R,) float where each ray's field ends: ``rays.far`` (``inf`` for a contracted field,
        whose sky is content), cut where the ray goes below ``min_altitude`` when set
        (:func:`~distnerf.renderer.samples.far_above_altitude`)."""
        far = self.ray_far_without_floor(rays)
        if self.min_altitude is None:
            return far
        return far_above_altitude(rays.origins, rays.directions, far, self.min_altitude,
                                  self.aabb if self.floor_footprint else None)

    def marching_box(self) -> torch.Tensor:
        """(2, 3) float32 box outside which the field is empty (never sampled); unused by a
        contracted field, which fills all of space."""
        raise NotImplementedError

    def field_coordinates(self, points: torch.Tensor) -> torch.Tensor:
        """(P, 3) world points -> (P, 3) the points where the model's tables are read: the
        contracted points (in the doubled box) for a contracted field, else the points."""
        box = self.contraction_aabb
        return points if box is None else contract(points, box)

    def colours(self, points: torch.Tensor, viewdirs: torch.Tensor, ray_indices: torch.Tensor,
                image_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Colour at points: (Q, 3) points, (R, 3) unit viewdirs per ray, (Q,) int64 ray of
        each point, (R,) int64 training image of each ray or None (:mod:`.appearance`) ->
        (Q, 3) float RGB in [0, 1] (an ``affine`` appearance may leave it)."""
        raise NotImplementedError

    def collapsed(self) -> list[str]:
        # reads the grid's emptiness from the device (the static step reads it a step late: TrainStep.collapsed)
        return ["occupancy grid"] if self.occupancy.is_empty() else []

    def field_rgb(self, points: torch.Tensor, viewdirs: torch.Tensor) -> torch.Tensor:
        return self.colours(points, viewdirs, torch.arange(points.shape[0], device=points.device))

    def occupied(self, points: torch.Tensor) -> torch.Tensor:
        return self.occupancy.query(points)

    def marcher(self, step_size: float | None = None):
        """``(origins, directions, anchor, t_lo, t_hi, max_intervals=None) -> PackedSamples``
        marching this model's occupied cells inside its box with ``step_size`` (default
        :meth:`step_size`; ``max_intervals``: see :func:`~distnerf.renderer.occupancy.march`)."""
        step_size = self.step_size() if step_size is None else step_size
        spacing = self.contraction_aabb
        if spacing is not None:  # all of space, on the contracted spacing
            def spaced(origins, directions, anchor, t_lo, t_hi, max_intervals=None):
                return march(origins, directions, anchor, t_lo, t_hi, step_size, self.occupancy, max_intervals,
                             spacing_aabb=spacing.to(origins.dtype))

            spaced.spacing_aabb = spacing  # for evaluation rounds
            return spaced
        box = self.marching_box()

        def clip(origins, directions, t_lo, t_hi):  # the part of each segment that can hold a sample: inside
            # the box and the occupied cells' box (one clip to both, OccupancyGrid.occupied_box_within)
            return clip_to_box(origins, directions, t_lo, t_hi, self.occupancy.occupied_box_within(box).to(origins.dtype))

        def fn(origins, directions, anchor, t_lo, t_hi, max_intervals=None):
            t0, t1 = clip(origins, directions, t_lo, t_hi)
            return march(origins, directions, anchor, t0, t1, step_size, self.occupancy, max_intervals,
                         inside_occupied_box=True)

        def inside(origins, directions, anchor, t_lo, t_hi, max_intervals=None):  # fn for segments inside clip's
            return march(origins, directions, anchor, t_lo, t_hi, step_size, self.occupancy, max_intervals,
                         inside_occupied_box=True)

        fn.clip = clip  # evaluation rounds start and end inside the box and its occupied cells
        fn.inside = inside  # ... and march their rounds without clipping each round again
        fn.occupancy = self.occupancy  # ... or, on the sync-free paths, in a fixed layout (renderer/rounds.py)
        return fn

    def sample_anchor(self, rays: RayBundle, step_size: float, generator: torch.Generator | None) -> torch.Tensor:
        """(R,) float anchor of each ray's sample grid: ``near``, plus ``u dt`` in training."""
        if not self.training:
            return rays.near
        u = torch.rand(rays.near.shape, generator=generator, device=rays.near.device, dtype=rays.near.dtype)
        return rays.near + u * step_size / rays.directions.norm(dim=-1)

    def round_steps(self) -> int:
        """Grid intervals per marching round now: ``train_round_steps`` while autograd is on,
        else ``eval_round_steps`` (0: one pass; :func:`~distnerf.renderer.marching.march_alive`)."""
        return self.train_round_steps if torch.is_grad_enabled() else self.eval_round_steps

    def current_termination(self) -> float:
        """Transmittance below which a render stops a ray now: ``termination``, except in a training
        render in one pass (``train_round_steps`` 0) without ``train_termination``: 0 (every marched
        sample is rendered with gradients, no no-grad pass to find the cut)."""
        if torch.is_grad_enabled() and not self.train_round_steps and not self.train_termination:
            return 0.0
        return self.termination

    def render_segment(self, rays: RayBundle, t_lo: torch.Tensor, t_hi: torch.Tensor, anchor: torch.Tensor,
                       background: torch.Tensor | None, step_size: float | None = None,
                       in_front: torch.Tensor | None = None, owned: tuple | None = None) -> RenderOutput:
        """Render the segments ``[t_lo, t_hi]`` ((R,) float) of ``rays``.

        Args:
            anchor: (R,) float sample-grid anchor (:meth:`sample_anchor`).
            background: (3,) or (R, 3) float, or None for a segment without background.
            step_size: marching step (distance; default :meth:`step_size`).
            in_front: (R,) float transmittance in front of the segment, or None.
            owned: ``(t_in, t_out)`` (R,) float each: render only the samples of the march over
                ``[t_lo, t_hi]`` (the whole ray) whose midpoints lie in ``[t_in, t_out)``
                (:meth:`owned_window`), or None (the whole segment, its end intervals clipped).
        Returns:
            see :func:`~distnerf.renderer.marching.render_segment`.
        """
        step_size = self.step_size() if step_size is None else step_size
        if owned is not None:
            t_lo, t_hi = self.owned_window(rays, t_lo, t_hi, anchor, step_size, *owned)
        colours = self.colours if rays.image_ids is None else partial(self.colours, image_ids=rays.image_ids)
        background = self.appearance_background(background, rays)
        field_fn = self.field_query(rays.image_ids)
        return render_segment(self.field_density, colours, self.marcher(step_size), rays.origins, rays.directions,
                              rays.viewdirs, anchor, t_lo, t_hi, background=background,
                              colour_threshold=self.color_threshold, termination=self.current_termination(),
                              in_front=in_front, step_size=step_size, round_steps=self.round_steps(),
                              field_fn=field_fn)

    def owned_window(self, rays: RayBundle, t_lo: torch.Tensor, t_hi: torch.Tensor, anchor: torch.Tensor,
                     step_size: float, t_in: torch.Tensor, t_out: torch.Tensor):
        """(R,) float window of each ray whose march gives exactly the samples of the march over the whole
        ray ``[t_lo, t_hi]`` with midpoints in ``[t_in, t_out)``
        (:func:`~distnerf.renderer.occupancy.owned_window`): the whole ray is first clipped as the marcher
        clips it (a bounded field: to its box and occupied cells; a contracted one: where its spacing ends)."""
        dt = step_size / rays.directions.norm(dim=-1)
        spacing = self.contraction_aabb
        if spacing is None:
            t_lo, t_hi = self.marcher(step_size).clip(rays.origins, rays.directions, t_lo, t_hi)
            return owned_window(t_in, t_out, t_lo, t_hi, anchor, dt)
        breaks = ray_breaks(rays.origins, rays.directions, anchor, spacing.to(rays.origins.dtype))
        return owned_window(t_in, t_out, t_lo, spacing_end(t_hi, anchor, dt, breaks), anchor, dt, breaks)

    def field_query(self, image_ids: torch.Tensor | None = None):
        """A ``field_fn`` of :func:`~distnerf.renderer.marching.render_segment` (density and colour from
        one pass over the field) for rays of training images ``image_ids`` ((R,) int64 or None), or None
        where the model has none (then :meth:`field_density` and :meth:`colours` run separately)."""
        return None

    def forward(self, rays: RayBundle, generator: torch.Generator | None = None, budget=None) -> RenderOutput:
        """Render rays over ``[near, far]`` (``[near, inf)`` when contracted; ended below
        ``min_altitude``: :meth:`ray_far`) with the background (in training with
        ``random_background``: a uniform random colour per ray, drawn from ``generator``)
        (see :class:`RadianceModel`). In training with ``distortion_loss_weight > 0`` the outputs
        hold ``distortion_loss`` (R,) float: that weight times each ray's distortion loss
        (:meth:`ray_distortion`), which the photometric loss adds per ray. ``budget``: a static step's sample
        budget (:class:`~distnerf.components.sample_budget.SampleBudget`, P fixed sample slots): a training render
        with gradients is then its :meth:`~distnerf.components.sample_budget.SampleBudget.render` (fixed shapes,
        no host read); None, or evaluation: the dynamic render."""
        if budget is not None and self.training and torch.is_grad_enabled():
            return budget.render(self, rays, generator)  # fixed shapes, no host read
        step_size = self.step_size()
        far = self.ray_far(rays)
        anchor = self.sample_anchor(rays, step_size, generator)
        background = self.background
        if self.random_background and self.training:  # an opaque capture: unabsorbed light must not fit
            background = torch.rand(len(rays), 3, generator=generator, device=rays.origins.device,
                                    dtype=rays.origins.dtype)
        out = self.render_segment(rays, rays.near, far, anchor, background, step_size)
        if self.opaque_floor:
            self._absorb_at_floor(out, rays, far, background)
        samples, weights = out.samples, out.weights
        out.samples = out.weights = None  # the packed samples stay here: a wrapper's output holds pixels only
        if self.distortion_loss_weight > 0 and torch.is_grad_enabled():
            out.distortion_loss = self.distortion_loss_weight * self.ray_distortion(rays, anchor, samples, weights)
        return out

    def _absorb_at_floor(self, out: RenderOutput, rays: RayBundle, far: torch.Tensor, background) -> None:
        """``model.opaque_floor``: the light a floored ray has left when it reaches the floor takes
        the colour field's value at the floor point, not the background's: the floor is an opaque
        surface (what lies under the ground of an aerial capture is hidden, but the ground is
        there), so a ground that is still translucent early in training is not tinted by the
        background. In place on ``out.rgb`` (R, 3): ``rgb + [floored] (1 - opacity) (c_floor - bg)``,
        since a render composites ``(1 - opacity) bg`` behind its samples. Every ray's floor colour
        is evaluated (R colour evaluations, no size read); the others are masked out."""
        floored = (far < self.ray_far_without_floor(rays)) & (far > rays.near)  # (R,) the floor ended these rays
        floor_rgb = self.floor_colour(rays, torch.where(floored, far, torch.zeros_like(far)))
        bg = self.appearance_background(background, rays)
        bg = torch.zeros_like(floor_rgb) if bg is None else bg.expand_as(floor_rgb).to(floor_rgb.dtype)
        left = (1.0 - out.opacity).to(floor_rgb.dtype) * floored.to(floor_rgb.dtype)
        out.rgb = out.rgb + (left[:, None] * (floor_rgb - bg)).to(out.rgb.dtype)

    def floor_colour(self, rays: RayBundle, t_floor: torch.Tensor) -> torch.Tensor:
        """The colour field at each ray's floor point, seen along the ray (``model.opaque_floor``).

        Args:
            rays: R rays (their training images' appearance applied where ``rays.image_ids`` is set).
            t_floor: (R,) float ray parameter of the floor point (any finite value for a ray the
                floor does not end: its colour is computed and left to the caller to mask).
        Returns:
            (R, 3) float RGB of :meth:`colours` at ``origins + t_floor directions``.
        """
        points = rays.origins + rays.directions * t_floor[:, None]
        return self.colours(points, rays.viewdirs, torch.arange(len(rays), device=points.device),
                            image_ids=rays.image_ids)

    def ray_far_without_floor(self, rays: RayBundle) -> torch.Tensor:
        """(R,) float: :meth:`ray_far` before the floor's cut."""
        if self.contraction_aabb is None:
            return rays.far
        # an empty segment (far <= near: a ray masked out by strategy=ss on the sync-free path) stays empty
        return torch.where(rays.far > rays.near, torch.full_like(rays.far, float("inf")), rays.near)

    def ray_distortion(self, rays: RayBundle, anchor: torch.Tensor, samples, weights: torch.Tensor) -> torch.Tensor:
        """(R,) float distortion loss (:func:`~distnerf.renderer.packed.distortion_loss`) of whole
        rays' packed ``samples`` and ``weights`` (P,), on normalised ray coordinates: the
        contracted spacing ``s / 2b`` in [0, 1] (mip-NeRF 360's s-space; :mod:`~distnerf.renderer.contraction`)
        for a contracted field, else ``(t - near) / (far - near)``."""
        ray = samples.ray_indices
        if self.contraction_aabb is not None:
            breaks = ray_breaks(rays.origins, rays.directions, anchor, self.contraction_aabb.to(rays.origins.dtype))
            b = breaks[ray]
            s0, s1 = to_spacing(samples.t_starts, b) / (2 * b), to_spacing(samples.t_ends, b) / (2 * b)
        else:
            near, span = rays.near[ray], (rays.far - rays.near).clamp(min=1e-9)[ray]
            s0, s1 = (samples.t_starts - near) / span, (samples.t_ends - near) / span
        return distortion_loss(weights, s0.detach(), s1.detach(), ray, samples.num_rays)
