"""The interface every radiance model implements (no distributed code here).

A model's ``forward`` runs the *whole* render of a ray batch (sampling, field,
volume rendering), so that a data-parallel wrapper around it sees every parameter
that receives a gradient.
"""
from __future__ import annotations

import torch
from torch import nn

from ..data.rays import RayBundle
from ..renderer.output import RenderOutput


class RadianceModel(nn.Module):
    """Base class: rays in, rendered pixels out.

    Args:
        aabb: (2, 3) float32 scene box (world units, NDC for LLFF).
        background: (3,) float32 RGB composited behind every ray.
    """

    #: whether some parameters receive sparse COO gradients (only the rows a step touched);
    #: a strategy that all-reduces dense gradient buckets sets it to False before wrapping.
    sparse_grad: bool = False
    #: height (+y, scene units) below which rays end (``model.min_altitude``), or None; read by
    #: strategies that route whole rays to regions (they must end where the model ends them)
    min_altitude: float | None = None
    #: whether the floor is opaque (``model.opaque_floor`` with a floor): the light a ray has left at the
    #: floor takes the colour field's value there (:meth:`~distnerf.model.marched.MarchingModel.floor_colour`);
    #: read by strategies that composite a ray's segments (the floor replaces the background)
    opaque_floor: bool = False
    #: what ``model.max_params`` derived when the model was sized to it (:func:`distnerf.model.budget.fit_budget`'s
    #: report), set by :func:`distnerf.model.build_model`; None otherwise
    budget: dict | None = None
    #: whether the constructor takes a focus box (``focus_aabb``, ``context_resolution``): full
    #: resolution inside it, coarse context around it (a voxel grid's ``ss`` sub-models)
    holds_focus: bool = False

    @property
    def resolution(self) -> int | None:
        """The grid's vertices per axis now, for a model trained in resolution stages (a
        voxel grid); None for a model without one."""
        return None

    @property
    def renders_coarse(self) -> bool:
        """Whether :meth:`forward`'s output holds ``rgb_coarse``/``opacity_coarse`` (NeRF's
        hierarchical sampling with a fine network)."""
        return False

    def __init__(self, aabb: torch.Tensor, background: torch.Tensor):
        super().__init__()
        #: per-image appearance (``model.appearance``, :class:`~distnerf.model.appearance.Appearance`) or None
        self.appearance = None
        self.register_buffer("aabb", aabb.clone().float())
        self.register_buffer("background", background.clone().float())

    def forward(self, rays: RayBundle, generator: torch.Generator | None = None) -> RenderOutput:
        """Render rays.

        Args:
            rays: R rays. generator: random source for sample jitter (training mode);
                evaluation (``self.training`` False) is deterministic.
        Returns:
            :class:`~distnerf.renderer.output.RenderOutput`: ``rgb`` (R, 3) float in [0, 1],
            ``depth`` (R,), ``opacity`` (R,), ``num_samples`` (samples evaluated), and what
            the model adds (``rgb_coarse``, ``distortion_loss``, ...).
        """
        raise NotImplementedError

    def appearance_background(self, background: torch.Tensor | None, rays: RayBundle) -> torch.Tensor | None:
        """The background of each ray under an ``affine`` appearance ((R, 3), the ray's
        image's transform, or the held-out/mean one without ids), else ``background`` as is
        ((3,), (R, 3) or None)."""
        app = self.appearance
        if background is None or app is None or app.kind != "affine":
            return background
        codes = app.codes(rays.image_ids, len(rays))
        return app.transform(background.expand(len(rays), 3), codes, None)

    def regularized_tables(self) -> list[tuple[nn.Parameter, tuple[int, int, int], float]]:
        """The vertex tables a parameter-only regulariser (total variation) acts on, as
        ``(table, vertices per axis, weight)``: a (V, C) table viewed as (n_x, n_y, n_z) (C = 1),
        and its weight (> 0). The step adds their gradients outside any wrapper's forward
        (:func:`distnerf.components.regularizer.add_regularizer_grads_`); [] by default."""
        return []

    # -- bounds on a gradient's non-zero entries (for a sparse gradient exchange) ---------
    #: whether the forward records the rows it reads (:meth:`note_rows_read`); set by a strategy
    #: that sizes a sparse gradient exchange from them, off otherwise (no cost)
    record_rows_read: bool = False

    def bounded_parameters(self) -> list[nn.Parameter]:
        """The parameters whose loss gradient :meth:`gradient_entry_bounds` bounds (row tables
        read by interpolation), in a fixed order (the same on every replica); [] by default."""
        return []

    def note_rows_read(self, table: torch.Tensor, references: int) -> None:
        """Record that a forward with autograd read ``references`` rows of the (V, C) ``table``
        (with repeats: e.g. 8 corner rows per point of a trilinear interpolation). Only shapes
        are used, so recording reads nothing from the device."""
        if self.record_rows_read and torch.is_grad_enabled() and table.requires_grad:
            refs = self.__dict__.setdefault("_rows_read", {})
            refs[id(table)] = refs.get(id(table), 0) + int(references)

    def gradient_entry_bounds(self) -> dict[int, int]:
        """Upper bounds on the non-zero entries of each :meth:`bounded_parameters` gradient
        from the recorded forwards since the last :meth:`reset_rows_read`, keyed by ``id(param)``.

        A (V, C) table read only through interpolation at rows it references gets a
        non-zero gradient only in those rows (the backward scatters into them), so at most
        ``min(V, references) * C`` entries; an unread table: 0. Parameter-only regularisers
        add their gradients after the exchange (:meth:`regularized_tables`), so they do
        not count. Host integers from shapes: computing them needs no device value.
        """
        refs = self.__dict__.get("_rows_read", {})
        return {id(p): min(p.shape[0], refs.get(id(p), 0)) * (p.numel() // max(p.shape[0], 1))
                for p in self.bounded_parameters()}

    def reset_rows_read(self) -> None:
        """Forget the rows recorded so far (a new step)."""
        self.__dict__["_rows_read"] = {}

    def update_state(self, step: int, stage_step: int | None = None) -> bool:
        """Non-gradient updates before training step ``step`` (occupancy grid,
        resolution changes). ``stage_step``: the step the stage changes (e.g. grid
        upsampling) compare with, the schedule's clock (:func:`distnerf.components.schedule.stage_step`;
        default ``step``). Deterministic given the parameters, so that identical
        replicas stay identical. Returns True when parameter tensors were replaced
        (the caller must rebuild optimizer state and any wrapper)."""
        return False

    def param_groups(self, lr: float) -> list[dict]:
        """Optimizer parameter groups (base learning rate ``lr``)."""
        return [{"params": list(self.parameters()), "lr": lr}]

    # -- point queries (used by the fusion stage of segmented scenes) -----------
    def field(self, points: torch.Tensor, viewdirs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The radiance field at points.

        Args:
            points: (P, 3) float positions (the scene's space: world, or NDC).
            viewdirs: (P, 3) float unit world-space viewing directions.
        Returns:
            sigma: (P,) float density: 1 / distance unit for marched models (``grid``,
            ``ngp``: world or NDC units), 1 / ray-parameter unit for ``nerf``; rgb: (P, 3) float in [0, 1].
        """
        raise NotImplementedError(f"{type(self).__name__} has no point-query field")

    def field_density(self, points: torch.Tensor) -> torch.Tensor:
        """(P, 3) points -> (P,) density; models override it when colour can be skipped."""
        return self.field(points, torch.zeros_like(points))[0]

    def field_rgb(self, points: torch.Tensor, viewdirs: torch.Tensor) -> torch.Tensor:
        """(P, 3) points, (P, 3) unit viewdirs -> (P, 3) colour in [0, 1]."""
        return self.field(points, viewdirs)[1]

    def step_size(self) -> float | None:
        """Interval length of the model's uniform ray marching (a distance in the scene's
        space: world units, or NDC units for LLFF), or
        None when it samples stratified + hierarchically (NeRF)."""
        return None

    def collapsed(self) -> list[str]:
        """Parts of the model whose empty-space skipping marks *all* space empty (an occupancy
        grid emptied by training: nothing is sampled any more, nothing can learn), e.g.
        ``["occupancy grid"]``; empty when healthy. A Python value: no device read beyond
        what rendering already made."""
        return []

    def occupied(self, points: torch.Tensor) -> torch.Tensor:
        """(P, 3) points -> (P,) bool: False where empty-space skipping drops a sample."""
        return torch.ones(points.shape[0], dtype=torch.bool, device=points.device)
