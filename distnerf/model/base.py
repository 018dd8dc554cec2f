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
    #: the step builder sets it to False where the strategy all-reduces dense gradient buckets
    #: (:func:`~distnerf.components.step_path.build_step`).
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

    # -- a fixed capacity of a gradient's non-zero entries (for a sparse gradient exchange) ---------
    def sparse_parameters(self) -> list[nn.Parameter]:
        """The parameters whose gradient may be a row-sparse COO tensor (under :attr:`sparse_grad`), in a fixed
        order (the same on every replica); [] by default."""
        return []

    def bounded_parameters(self) -> list[nn.Parameter]:
        """The parameters whose loss gradient :meth:`gradient_entry_capacity` bounds (row tables
        read by interpolation), in a fixed order (the same on every replica); [] by default."""
        return []

    def gradient_entry_capacity(self) -> dict[int, int]:
        """Fixed upper bounds on the non-zero entries of each :meth:`bounded_parameters` gradient that
        any one training forward can make, keyed by ``id(param)``: from sizes alone (the same on every
        replica, with no forward seen), so a sparse gradient exchange sized by them needs no agreement
        between ranks (:mod:`distnerf.strategy.sparse_exchange`, ``bounded``). Parameter-only
        regularisers add their gradients after the exchange (:meth:`regularized_tables`), so they do
        not count. A parameter left out has no such bound (all its entries count). None by default."""
        return {}

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
