"""Volume rendering by the NeRF quadrature (pure math, batched layout).

Legend: R rays, S samples per ray. Samples of a ray are sorted front to back;
``t_starts``/``t_ends`` are ray parameters (world units along unit directions).

NeRF (Mildenhall et al. 2020), Eq. 3 (Max 1995)::

    alpha_i = 1 - exp(-sigma_i * delta_i)
    T_i     = prod_{j<i} (1 - alpha_j)          (transmittance before sample i)
    w_i     = T_i * alpha_i
    C       = sum_i w_i c_i + (1 - sum_i w_i) * background

All functions are differentiable w.r.t. densities and colours.
"""
from __future__ import annotations

import torch

from .output import RenderOutput


def alphas_from_densities(sigmas: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
    """Opacity of each interval.

    Args:
        sigmas: (R, S) float density (1 / world unit), >= 0.
        deltas: (R, S) float interval lengths (world units).
    Returns:
        (R, S) alphas in [0, 1].
    """
    return 1.0 - torch.exp(-sigmas * deltas)


def render_weights(alphas: torch.Tensor):
    """Transmittance and compositing weights from per-sample opacities.

    Computed in log space (``T_i = exp(sum_{j<i} log(1 - alpha_j))``) to stay
    stable for long rays.

    Args:
        alphas: (R, S) float in [0, 1].
    Returns:
        weights: (R, S) ``T_i * alpha_i``.
        transmittance: (R, S) ``T_i`` (exclusive product).
    """
    log_one_minus = torch.log1p(-alphas.clamp(max=1.0 - 1e-7))
    log_t = torch.cumsum(log_one_minus, dim=-1) - log_one_minus  # exclusive cumsum
    transmittance = torch.exp(log_t)
    return transmittance * alphas, transmittance


def composite(weights: torch.Tensor, rgbs: torch.Tensor, t_mids: torch.Tensor,
              background: torch.Tensor | None):
    """Accumulate colour, depth and opacity along rays.

    Args:
        weights: (R, S) float compositing weights.
        rgbs: (R, S, 3) float colours in [0, 1].
        t_mids: (R, S) float sample positions along the ray (world units).
        background: (3,) float RGB, or None for no background term.
    Returns:
        rgb: (R, 3); depth: (R,) expected ray parameter of termination (only over
        the accumulated part, i.e. ``sum w_i t_i``); opacity: (R,) ``sum w_i``.
    """
    opacity = weights.sum(dim=-1)
    rgb = (weights[..., None] * rgbs).sum(dim=-2)
    if background is not None:
        rgb = rgb + (1.0 - opacity[..., None]) * background
    depth = (weights * t_mids).sum(dim=-1)
    return rgb, depth, opacity


def volume_render(sigmas, rgbs, t_starts, t_ends, background):
    """Densities and colours at samples to pixel values (Eq. 3 of NeRF).

    Args:
        sigmas: (R, S) float densities; masked-out samples carry 0.
        rgbs: (R, S, 3) float colours.
        t_starts, t_ends: (R, S) float interval bounds along each ray.
        background: (3,) float or None.
    Returns:
        :class:`RenderOutput` with ``rgb`` (R, 3), ``depth`` (R,), ``opacity`` (R,), ``weights`` (R, S).
    """
    alphas = alphas_from_densities(sigmas, t_ends - t_starts)
    weights, _ = render_weights(alphas)
    rgb, depth, opacity = composite(weights, rgbs, 0.5 * (t_starts + t_ends), background)
    return RenderOutput(rgb=rgb, depth=depth, opacity=opacity, weights=weights)
