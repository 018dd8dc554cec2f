"""The grid model's occupancy refresh: which cells of its occupancy grid hold density, derived
from the density table (deterministic, so identical replicas stay identical).

Legend: N schedule resolution (vertices per axis), M occupancy cells per axis.

:class:`GridOccupancy` is a part of :class:`~distnerf.model.grid.GridModel` (a mixin, so the
model's state and checkpoint keys stay its own); it reads the model's ``cfg``
(:class:`~distnerf.schema.GridModelConfig`), ``occupancy``, ``density``, ``focus``,
``grid_aabb``, ``contraction_aabb``, ``base_voxel``, ``density_shift`` and its geometry
(``resolution``, ``shape``, ``step_size``, ``densities``, ``raw_density``).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..renderer.contraction import world_step_scale
from ..schema import GridModelConfig


def occupancy_threshold_at(cfg: GridModelConfig, resolution: int) -> float:
    """The opacity threshold of one marching step at schedule resolution ``resolution``:
    ``cfg.occupancy_threshold_final`` at the final resolution (with two or more resolutions and the
    key set), else ``cfg.occupancy_threshold``."""
    if cfg.occupancy_threshold_final is not None and len(cfg.resolutions) > 1 \
            and resolution == cfg.resolutions[-1]:
        return float(cfg.occupancy_threshold_final)
    return float(cfg.occupancy_threshold)


TRUNC_EXP_CLAMP = 15.0
"""``trunc_exp``'s gradient is ``exp(clamp(x, -15, 15))`` (Instant-NGP's exponential density)."""


class _TruncExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.exp(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * torch.exp(x.clamp(-TRUNC_EXP_CLAMP, TRUNC_EXP_CLAMP))


def trunc_exp(x: torch.Tensor) -> torch.Tensor:
    """``exp(x)``, its gradient's exponent clamped to ``[-15, 15]`` (Instant-NGP, Müller et al. 2022): a
    large raw density's gradient stays finite, a very negative one keeps a small push."""
    return _TruncExp.apply(x)


def density_activation(name: str):
    """``model.density_activation``: the function of ``raw + density_shift`` that is the density in units of
    ``base_voxel`` (``F.softplus`` or :func:`trunc_exp`)."""
    return trunc_exp if name == "trunc_exp" else F.softplus


def inverse_density_activation(name: str, y):
    """The ``raw + density_shift`` whose activation is ``y`` > 0 (a float or a tensor): ``log(expm1(y))`` under
    softplus, ``log(y)`` under trunc_exp; None for a float with no finite value (``expm1`` underflows)."""
    if isinstance(y, torch.Tensor):
        return torch.log(y) if name == "trunc_exp" else torch.log(torch.expm1(y))
    inner = y if name == "trunc_exp" else math.expm1(y)
    return math.log(inner) if inner > 0.0 and math.isfinite(inner) else None


def raw_threshold(threshold: float, step_size: float, base_voxel: float, density_shift: float,
                  activation: str = "softplus") -> float | None:
    """The raw table value above which one marching step of ``step_size`` (world units) has opacity
    above ``threshold`` under the density ``activation(raw + density_shift) / base_voxel``, or None
    when it has no finite value (:meth:`GridOccupancy.raw_threshold`)."""
    if not 0.0 < threshold < 1.0:
        return None
    target = -math.log1p(-threshold) * base_voxel / step_size  # activation(raw + shift) above this
    inner = inverse_density_activation(activation, target)
    return None if inner is None else inner - density_shift


def any_corner(vertex: torch.Tensor) -> torch.Tensor:
    """Whether any of each voxel's 8 corners is set.

    Args:
        vertex: (M, M, M) bool, one per grid vertex.
    Returns:
        (M - 1, M - 1, M - 1) bool, one per voxel: the OR of its corners (a 2x2x2 max-pool
        with stride 1, as three pairwise ORs along the axes).
    """
    v = vertex[1:] | vertex[:-1]
    v = v[:, 1:] | v[:, :-1]
    return v[:, :, 1:] | v[:, :, :-1]


def dilate(occupied: torch.Tensor, dilation: int) -> torch.Tensor:
    """(M, M, M) bool grown by ``dilation`` cells (a max-pool; the same cells as thresholding the max-pooled
    opacities, :meth:`~distnerf.renderer.occupancy.OccupancyGrid.set_from_alpha`, since max commutes with
    a threshold)."""
    if dilation <= 0:
        return occupied
    k = 2 * dilation + 1
    return F.max_pool3d(occupied[None, None].to(torch.float32), k, stride=1, padding=dilation)[0, 0] > 0


def merged_occupancy(evidence: list[tuple[torch.Tensor, int]], reduce=None) -> torch.Tensor:
    """The whole model's occupancy from its shards' :attr:`GridOccupancy.occupancy_evidence`.

    Args:
        evidence: (cells (M, M, M) bool, dilation) of each shard held here (one dilation for all).
        reduce: ``reduce(t)``: the element-wise OR of a (M, M, M) bool tensor over the processes
            holding the other shards (:func:`~distnerf.distributed.all_reduce_or`), or None (every shard is here).
    Returns:
        (M, M, M) bool: the union of the shards' cells, dilated.
    """
    union = torch.stack([e for e, _ in evidence]).any(dim=0)
    if reduce is not None:
        union = reduce(union)
    return dilate(union, evidence[0][1])


class GridOccupancy:
    """The occupancy refresh of :class:`~distnerf.model.grid.GridModel` (see the module docstring)."""

    occupancy_evidence: tuple[torch.Tensor, int] | None = None  # a shard's last refresh, undilated
    occupancy_refreshes: int = 0  # a shard's refreshes so far (the strategy merges after each)

    @torch.no_grad()
    def update_occupancy(self) -> None:
        """Occupancy from the density (deterministic).

        Without a focus box the occupancy cells are the grid's voxels, (N-1)^3 over
        ``grid_aabb``, and a voxel is occupied when the opacity of one marching step at
        the *largest* of its 8 corner densities exceeds ``occupancy_threshold``: trilinear
        interpolation never exceeds its largest corner and the activation is monotonic, so no
        point of an empty voxel is above the threshold (no interpolation). On a bounded field
        the test moves to the raw table (:meth:`raw_threshold`: a voxel is occupied when any
        corner's raw value exceeds it, :func:`any_corner`), so no opacity is computed; a
        contracted field's step length varies per cell, so there the largest corner's opacity
        is computed (a 2x2x2 max-pool). With a focus box, the density at N^3 cell centres over the scene
        box, dilated by one cell; with a table of unequal counts per axis (``cubic_voxels`` on a
        box that is not a cube), the same at M^3 cell centres over ``grid_aabb``, M = the largest
        count - 1 (no cell longer than a voxel).

        A shard (``shard_aabb``) decides the cells the whole model would decide that it owns: the voxels
        of its slice, or the cells whose centres lie in its box (half-open, closed at ``grid_aabb``'s
        maximum), from the same values; it keeps them undilated in :attr:`occupancy_evidence` ((M, M, M)
        bool, and the dilation to apply) and sets its grid to them, dilated. The strategy merges the
        shards' evidence into the whole model's grid (:func:`merged_occupancy`).
        """
        n, step_size, shape = self.resolution, self.step_size(), self.shape
        lattice, first = self.lattice
        threshold = self.current_occupancy_threshold()
        shard = self.shard is not None
        if self.focus is None and len(set(lattice)) == 1:
            voxels = tuple(slice(f, f + m - 1) for f, m in zip(first, shape))  # a shard's voxels on the lattice
            raw = self.density.detach().view(shape)
            self.occupancy.aabb.copy_(self.grid_aabb)  # the voxels' box (setting the cells refreshes the caches)
            raw_threshold = self.raw_threshold(threshold, step_size) if self.contraction_aabb is None else None
            if raw_threshold is not None:  # a bounded field: compare the raw table, not 4 M opacities
                occupied = any_corner(raw > raw_threshold)
            else:
                corner_max = F.max_pool3d(raw[None, None], 2, stride=1)[0, 0]
                scale = self._step_scale(lattice[0] - 1)
                if shard and torch.is_tensor(scale):
                    scale = scale[voxels]
                occupied = 1.0 - torch.exp(-self.densities(corner_max) * step_size * scale) > threshold
            if not shard:
                self.occupancy.set_binary(occupied)
                return
            evidence = torch.zeros((lattice[0] - 1,) * 3, dtype=torch.bool, device=raw.device)
            evidence[voxels] = occupied
            self._set_evidence(evidence, 0)
            return
        m = n if self.focus is not None else max(lattice) - 1
        if self.occupancy.resolution != m:
            self.occupancy.resize(self.grid_aabb, m)
        else:
            self.occupancy.aabb.copy_(self.grid_aabb)  # a tightened box (a contracted one never moves)
        centres = self.occupancy.cell_centers()
        sigma = self.densities(self.raw_density(centres, contracted=True))
        scale = self._step_scale(m)
        alpha = 1.0 - torch.exp(-sigma * step_size * (scale.reshape(-1) if torch.is_tensor(scale) else scale))
        if not shard:
            self.occupancy.set_from_alpha(alpha.view(m, m, m), threshold, dilation=1)
            return
        self._set_evidence(((alpha > threshold) & self._owned(centres)).view(m, m, m), 1)

    def _owned(self, points: torch.Tensor) -> torch.Tensor:
        """(P,) bool: the (P, 3) field-coordinate points a shard owns (its box, half-open; closed at the lattice
        box's maximum, so the shards of a tiling own every point once)."""
        lo, hi, top = self.shard[0], self.shard[1], self.grid_aabb[1]
        return ((points >= lo) & ((points < hi) | ((hi >= top) & (points <= hi)))).all(dim=-1)

    def _set_evidence(self, evidence: torch.Tensor, dilation: int) -> None:
        self.occupancy_evidence = (evidence, dilation)
        self.occupancy_refreshes += 1
        self.occupancy.set_binary(dilate(evidence, dilation))

    def raw_threshold(self, threshold: float, step_size: float) -> float | None:
        """The raw table value above which one marching step of ``step_size`` has opacity above
        ``threshold``: 1 - exp(-softplus(raw + shift) / base_voxel * step) > threshold
        <=> raw > log(expm1(-log(1 - threshold) * base_voxel / step)) - shift (softplus and
        exp are increasing, so the comparison moves to the raw values unchanged; under
        ``density_activation=trunc_exp``, log instead of log(expm1)). None when it
        has no finite value (threshold 0, or one so small that expm1 underflows): the caller
        then compares opacities."""
        return raw_threshold(threshold, step_size, self.base_voxel, self.density_shift, self.cfg.density_activation)

    def current_occupancy_threshold(self) -> float:
        """Opacity of one marching step below which a cell is empty now: ``occupancy_threshold_final``
        at the final resolution (with two or more resolutions and the key set), else
        ``occupancy_threshold``. The coarse stages start every cell at ``alpha_init``, so their
        threshold must not exceed it; by the final stage the surfaces have formed and the
        semi-transparent fog grown in free air can be pruned (Instant-NGP, Mueller et al. 2022,
        Sec. 4: density threshold 0.01)."""
        return occupancy_threshold_at(self.cfg, self.resolution)

    def _step_scale(self, m: int) -> torch.Tensor | float:
        """(m, m, m) world length of a unit marching step at the centres of m^3 cells over
        ``grid_aabb`` (:func:`~distnerf.renderer.contraction.world_step_scale`; cached per m),
        or 1.0 for a bounded field."""
        if self.contraction_aabb is None:
            return 1.0
        cache = self.__dict__.setdefault("_step_scale_cache", {})
        if m not in cache:
            box = self.grid_aabb
            axis = (torch.arange(m, device=box.device, dtype=torch.float32) + 0.5) / m
            cells = torch.stack(torch.meshgrid(axis, axis, axis, indexing="ij"), dim=-1).reshape(-1, 3)
            cache[m] = world_step_scale(box[0] + cells * (box[1] - box[0]), self.contraction_aabb).view(m, m, m)
        return cache[m]
