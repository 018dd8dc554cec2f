"""Parameter-only regularisers of a training step: the total variation of a model's vertex
tables (Plenoxels, Fridovich-Keil et al. 2022, Eq. 3), its gradient in closed form.

A model declares what is regularised (:meth:`~distnerf.model.base.RadianceModel.regularized_tables`:
the tables, their vertices per axis and the weight); the step adds the gradients here
(:func:`add_regularizer_grads_`), after the backward and outside any wrapper: such a term depends on
the parameters alone, identical on every replica, so its gradient needs no all-reduce, and keeping it
out of the wrapped backward keeps an all-reduced table gradient sparse.

Legend: (D, H, W) vertices per axis of a table.
"""
from __future__ import annotations

import torch

from ..model.base import RadianceModel


def add_regularizer_grads_(model: RadianceModel, value: bool = False) -> torch.Tensor | float | None:
    """Add ``weight`` x the gradient of :func:`total_variation` of each of ``model``'s
    :meth:`~distnerf.model.base.RadianceModel.regularized_tables` to its ``.grad`` (made zero
    when None), accumulating like ``.backward()``.

    Args:
        model: the unwrapped model (a strategy's model of sub-models lists all of theirs).
        value: also return the regulariser's value.
    Returns:
        with ``value``: the weighted total as a 0-dim tensor (reading it is a host sync, left to
        the caller), 0.0 without a regularised table; else None (the value is a pass over the
        tables that training never reads).
    """
    total = 0.0
    workspace = model.__dict__.setdefault("_tv_workspace", {})  # the differences' buffer, kept across steps
    for table, shape, weight in model.regularized_tables():
        if table.grad is None:
            table.grad = torch.zeros_like(table)
        tv = total_variation_grad_(table.detach().view(shape), weight, table.grad.view(shape), value, workspace)
        if value:
            total = total + tv
    return total if value else None


def total_variation(grid: torch.Tensor) -> torch.Tensor:
    """Mean squared difference of neighbouring voxels (Plenoxels Eq. 3).

    Args:
        grid: (1, C, D, H, W) float.
    Returns:
        scalar tensor.
    """
    dz = (grid[:, :, 1:] - grid[:, :, :-1]).pow(2).mean()
    dy = (grid[:, :, :, 1:] - grid[:, :, :, :-1]).pow(2).mean()
    dx = (grid[..., 1:] - grid[..., :-1]).pow(2).mean()
    return dx + dy + dz


@torch.no_grad()
def total_variation_grad_(grid: torch.Tensor, weight: float, grad: torch.Tensor, value: bool = True,
                          workspace: dict | None = None) -> torch.Tensor | None:
    """Add ``weight`` x the gradient of :func:`total_variation` to ``grad``, in closed form.

    For each axis, ``tv_a = mean_i (x_{i+1} - x_i)^2`` over the ``m_a`` neighbour pairs,
    so ``d tv_a / d x_{i+1} = 2 (x_{i+1} - x_i) / m_a`` and ``d tv_a / d x_i`` is its
    negative: one difference tensor per axis, no autograd graph.

    Args:
        grid: (D, H, W) float values. weight: float. grad: (D, H, W) float, updated in place.
        value: also compute the value (one more pass per axis).
        workspace: a dict kept by the caller, holding the difference buffer between calls
            (a fresh 16 MB tensor per axis at 160^3 costs its page faults at every step), or None.
    Returns:
        with ``value``: 0-dim tensor (dtype of ``grid``) ``weight * total_variation(grid)``; a
        tensor, so that a training step that ignores it never waits for the device. Else None.
    """
    total = grid.new_zeros(()) if value else None
    for axis in range(3):
        n = grid.shape[axis]
        if n < 2:
            continue
        hi, lo = grid.narrow(axis, 1, n - 1), grid.narrow(axis, 0, n - 1)
        if workspace is None:
            diff = hi - lo
        else:
            key = (grid.dtype, grid.device)
            buf = workspace.get(key)
            if buf is None or buf.numel() < hi.numel():
                buf = workspace[key] = torch.empty(hi.numel(), dtype=grid.dtype, device=grid.device)
            diff = torch.sub(hi, lo, out=buf[:hi.numel()].view(hi.shape))
        if value:
            total = total + diff.pow(2).mean()
        scale = 2.0 * weight / diff.numel()
        grad.narrow(axis, 1, n - 1).add_(diff, alpha=scale)
        grad.narrow(axis, 0, n - 1).sub_(diff, alpha=scale)
    return weight * total if value else None
