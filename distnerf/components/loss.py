"""Photometric loss (summed; the strategy supplies the normaliser).

Returning the *sum* of squared errors over valid rays lets the strategy divide
by ``global_valid / world_size`` so that data-parallel gradient averaging yields
the gradient of the global mean loss (see ``Strategy.loss_normalizer``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..renderer.output import RenderOutput


@dataclass(frozen=True)
class RayError:
    """A step's photometric error per output row (``Q`` rows: the batch's rays, or with ``ray_index``
    one row per (ray, sub-model)), and the weighted sum the step backpropagates.

    Attributes:
        sse: scalar float32 ``sum_r w_r (rgb_r + distortion_r + coarse_r)``, summed term by term.
        weight: (Q,) float32 ``w_r``: 1 for a valid ray's row, 0 otherwise, times ``loss_weight``.
        rgb: (Q,) float32 mean squared RGB error of the (fine) colour per row.
        distortion: (Q,) float32 the model's per-ray distortion term, or None.
        coarse: (Q,) float32 mean squared RGB error of the coarse pass per row, or None.
    """

    sse: torch.Tensor
    weight: torch.Tensor
    rgb: torch.Tensor
    distortion: torch.Tensor | None = None
    coarse: torch.Tensor | None = None

    def row_means(self) -> tuple[float, float]:
        """(the mean per-row error ``rgb + distortion + coarse``, the mean ``rgb`` error) over the
        rows that count (``weight > 0``), unweighted; 0.0 with no such row. Host floats, one
        device read: the trainer's logged ``loss`` and the MSE of its training ``psnr``."""
        with torch.no_grad():
            total = self.rgb + sum(t for t in (self.distortion, self.coarse) if t is not None)
            keep = (self.weight > 0).to(self.rgb.dtype)
            count = keep.sum().clamp(min=1)
            loss, mse = torch.stack([(total * keep).sum() / count, (self.rgb * keep).sum() / count]).tolist()
        return loss, mse


def ray_error(outputs: RenderOutput, target: torch.Tensor, valid: torch.Tensor) -> RayError:
    """The per-row photometric error of ``outputs`` and its weighted sum (fine + coarse).

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
        :class:`RayError`; its ``sse`` is ``sum_r w_r (mean_c (rgb - target)^2 + distortion_loss_r)``
        (+ the same error for the coarse pass).
    """
    if outputs.ray_index is not None:
        target, valid = target[outputs.ray_index], valid[outputs.ray_index]
    # (the same values as valid.to(float) * loss_weight, in one operator)
    w = valid.to(target.dtype) if outputs.loss_weight is None else outputs.loss_weight * valid
    rgb = ((outputs.rgb.float() - target) ** 2).mean(dim=-1)
    sse = (rgb * w).sum()
    distortion = coarse = None
    if outputs.distortion_loss is not None:  # a per-ray regulariser of the weights, summed like the error
        distortion = outputs.distortion_loss.float()
        sse = sse + (distortion * w).sum()
    if outputs.rgb_coarse is not None:
        coarse = ((outputs.rgb_coarse.float() - target) ** 2).mean(dim=-1)
        sse = sse + (coarse * w).sum()
    return RayError(sse, w, rgb, distortion, coarse)


def photometric_sse(outputs: RenderOutput, target: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Sum over valid rays of the per-ray mean squared RGB error (fine + coarse): the ``sse`` of
    :func:`ray_error` (its arguments), a scalar float32."""
    return ray_error(outputs, target, valid).sse
