"""Photometric loss (summed; the strategy supplies the normaliser).

Returning the *sum* of squared errors over valid rays lets the strategy divide
by ``global_valid / world_size`` so that data-parallel gradient averaging yields
the gradient of the global mean loss (see ``Strategy.loss_normalizer``).
"""
from __future__ import annotations

import torch

from ..renderer.output import RenderOutput


def photometric_sse(outputs: RenderOutput, target: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Sum over valid rays of the per-ray mean squared RGB error (fine + coarse).

    Args:
        outputs: model outputs with ``rgb`` (R, 3) and optionally ``rgb_coarse`` (R, 3);
            with ``ray_index`` (Q,) long the outputs are Q rows for those batch rays
            (a ray may appear several times: ``ss`` sub-models of one rank); with
            ``loss_weight`` (Q,) float each row's error is multiplied by it (``ss``: 1 / the rays
            of its sub-model, which makes the sum each sub-model's own mean error); with
            ``distortion_loss`` (Q,) float (a marched model in training) that per-ray term is
            added to each row's error.
        target: (R, 3) float32 ground-truth colours in [0, 1].
        valid: (R,) bool rays that count.
    Returns:
        scalar float32: ``sum_r w_r (mean_c (rgb - target)^2 + distortion_loss_r)`` (+ the same
        error for the coarse pass).
    """
    if outputs.ray_index is not None:
        target, valid = target[outputs.ray_index], valid[outputs.ray_index]
    w = valid.to(target.dtype)
    if outputs.loss_weight is not None:
        w = w * outputs.loss_weight
    sse = (((outputs.rgb.float() - target) ** 2).mean(dim=-1) * w).sum()
    if outputs.distortion_loss is not None:  # a per-ray regulariser of the weights, summed like the error
        sse = sse + (outputs.distortion_loss.float() * w).sum()
    if outputs.rgb_coarse is not None:
        sse = sse + (((outputs.rgb_coarse.float() - target) ** 2).mean(dim=-1) * w).sum()
    return sse
