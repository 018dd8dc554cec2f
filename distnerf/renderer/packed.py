"""Packed samples and volume rendering on them (pure math, no distributed code).

Legend: R rays, P packed samples (all rays' samples in one flat list).

A packed sample batch (nerfacc's layout, Li et al. 2023) holds every sample of every
ray in one flat list sorted by ray, then front to back: ``ray_indices`` (P,) long,
``t_starts``/``t_ends`` (P,) ray parameters, and the number of rays R. No ray is
padded to the longest one; a ray may have no samples, and so may the whole batch.

Volume rendering (NeRF, Mildenhall et al. 2020, Eq. 3; Max 1995) on packed samples::

    tau_i   = sigma_i * delta_i                  (optical thickness, delta_i = t_end - t_start)
    T_i     = exp(-sum_{j<i, same ray} tau_j)    (exclusive sum per ray, in log space)
    alpha_i = 1 - exp(-tau_i),   w_i = T_i * alpha_i
    T_R     = exp(-sum_{i in ray} tau_i)         (transmittance left behind the last sample)
    C       = sum_{i kept} w_i c_i + T_R * background

``kept`` samples are those that receive a colour (DVGO's colour threshold, Sun et al.
2022): a dropped sample still attenuates the ray (its tau is in every sum) but adds no
colour, and the background gets exactly ``T_R``, never ``1 - sum w``. Opacity is
``1 - T_R``. The exclusive sums are one ``cumsum`` over the flat list in float64 minus
each ray's starting value, so long rays and many rays lose no precision in float32.
All functions are differentiable w.r.t. ``sigmas`` and colours.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .output import RenderOutput


@dataclass
class PackedSamples:
    """Samples of R rays in one flat list, sorted by ray then along the ray.

    Attributes:
        ray_indices: (P,) int64 ray of each sample, non-decreasing.
        t_starts, t_ends: (P,) float interval bounds (ray parameters; world units along
            unit world directions, NDC parameters for LLFF).
        num_rays: R.
    """

    ray_indices: torch.Tensor
    t_starts: torch.Tensor
    t_ends: torch.Tensor
    num_rays: int

    def __len__(self) -> int:
        return self.ray_indices.shape[0]

    @property
    def t_mids(self) -> torch.Tensor:
        """(P,) float interval midpoints, computed once (the bounds are not changed in place)."""
        mids = self.__dict__.get("_t_mids")
        if mids is None:
            mids = self.__dict__["_t_mids"] = 0.5 * (self.t_starts + self.t_ends)
        return mids

    @property
    def deltas(self) -> torch.Tensor:
        return self.t_ends - self.t_starts

    def select(self, index: torch.Tensor) -> "PackedSamples":
        """The samples at ``index`` ((Q,) int64 sorted, or (P,) bool mask): still packed."""
        if index.dtype == torch.bool:
            return PackedSamples(self.ray_indices[index], self.t_starts[index], self.t_ends[index], self.num_rays)
        return PackedSamples(*(t.index_select(0, index) for t in (self.ray_indices, self.t_starts, self.t_ends)),
                             self.num_rays)

    def points(self, origins: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
        """(P, 3) midpoints ``o + t_mid d`` of the samples; origins, directions: (R, 3)."""
        # index_select, not origins[ray_indices]: on the CPU it gathers rows 3-4x faster
        return torch.addcmul(origins.index_select(0, self.ray_indices), directions.index_select(0, self.ray_indices),
                             self.t_mids[:, None])

    @staticmethod
    def cat(parts: list["PackedSamples"]) -> "PackedSamples":
        """Concatenate sample lists of the same rays and sort them by (ray, t_start).

        Parts must not overlap along a ray (e.g. the segments of disjoint regions).
        """
        ray = torch.cat([p.ray_indices for p in parts])
        t0, t1 = torch.cat([p.t_starts for p in parts]), torch.cat([p.t_ends for p in parts])
        order = torch.argsort(t0, stable=True)
        order = order[torch.argsort(ray[order], stable=True)]  # by ray, then by t_start
        return PackedSamples(ray, t0, t1, parts[0].num_rays).select(order)


def ray_offsets(ray_indices: torch.Tensor, num_rays: int) -> tuple[torch.Tensor, torch.Tensor]:
    """First sample of each ray and the sample count of each ray.

    Two binary searches in the sorted list (``bincount`` would read ``max(ray_indices)``
    back to the host on CUDA; these never wait for the device).

    Args:
        ray_indices: (P,) int64 non-decreasing. num_rays: R.
    Returns:
        starts: (R,) int64 index of each ray's first sample (= the next ray's when empty);
        counts: (R,) int64 samples per ray.
    """
    rays = torch.arange(num_rays, device=ray_indices.device, dtype=ray_indices.dtype)
    starts = torch.searchsorted(ray_indices, rays)
    return starts, torch.searchsorted(ray_indices, rays, right=True) - starts


def exclusive_sum(values: torch.Tensor, ray_indices: torch.Tensor, num_rays: int) -> torch.Tensor:
    """Per-ray exclusive prefix sum of a packed (P,) tensor: ``out_i = sum_{j<i, same ray} v_j``.

    Accumulated in float64 (a global cumsum minus each ray's start), returned in the
    dtype of ``values``; differentiable.
    """
    if values.numel() == 0:
        return values
    v = values.double()
    inclusive = torch.cumsum(v, 0)
    excl = inclusive - v
    starts, _ = ray_offsets(ray_indices, num_rays)
    return (excl - excl.index_select(0, starts.clamp(max=values.shape[0] - 1)).index_select(0, ray_indices)
            ).to(values.dtype)


def sum_along_rays(values: torch.Tensor, ray_indices: torch.Tensor, num_rays: int) -> torch.Tensor:
    """(P, ...) packed values -> (R, ...) per-ray sums (``index_add``; differentiable)."""
    out = values.new_zeros((num_rays,) + values.shape[1:])
    return out.index_add(0, ray_indices, values)


def render_transmittance(sigmas: torch.Tensor, samples: PackedSamples):
    """Transmittance and weights of packed samples (module docstring).

    Args:
        sigmas: (P,) float density (1 / ray-parameter unit), >= 0.
        samples: the P samples.
    Returns:
        weights: (P,) ``T_i alpha_i``; transmittance: (P,) ``T_i`` before each sample;
        remaining: (R,) ``T_R`` behind each ray's last sample (1 for a ray without samples).
    """
    tau = sigmas * samples.deltas
    if tau.numel() == 0:
        return tau, tau, torch.ones(samples.num_rays, dtype=samples.t_starts.dtype, device=tau.device)
    # one float64 scan gives both the exclusive sums and each ray's total (its last inclusive sum
    # minus the sum in front of the ray): no second pass (index_add) over the samples for the total
    v = tau.double()
    inclusive = torch.cumsum(v, 0)
    excl = inclusive - v
    rays = torch.arange(samples.num_rays, device=tau.device, dtype=samples.ray_indices.dtype)
    starts = torch.searchsorted(samples.ray_indices, rays)  # (R,) first sample of each ray (as ray_offsets)
    ends = torch.searchsorted(samples.ray_indices, rays, right=True)  # (R,) one past its last
    front = excl.index_select(0, starts.clamp(max=tau.shape[0] - 1))  # (R,) the scan in front of each ray
    trans = torch.exp((front.index_select(0, samples.ray_indices) - excl).to(tau.dtype))  # -(excl - front), exactly
    weights = trans * (1.0 - torch.exp(-tau))
    # a ray without samples (ends == starts) keeps T_R = 1: its total is masked to 0 (a product: the total is finite)
    total = (inclusive.index_select(0, (ends - 1).clamp(min=0)) - front) * (ends > starts)
    remaining = torch.exp(-total).to(tau.dtype)
    return weights, trans, remaining


def accumulate(weights: torch.Tensor, rgbs: torch.Tensor, samples: PackedSamples, remaining: torch.Tensor,
               background: torch.Tensor | None, colour_index: torch.Tensor | None = None,
               colour_rays: torch.Tensor | None = None) -> RenderOutput:
    """Colour, depth and opacity of rays from packed weights.

    Args:
        weights: (P,) float ``w_i``. rgbs: (Q, 3) float colours in [0, 1] of the kept
            samples ``colour_index`` ((Q,) int64; all P samples when None).
        samples: the P samples. remaining: (R,) ``T_R``.
        colour_rays: (Q,) int64 the ray of each kept sample when the caller has it, or None.
        background: (3,) or (R, 3) float RGB, or None (a segment: no background term).
    Returns:
        :class:`RenderOutput` with ``rgb`` (R, 3) ``sum_kept w c + T_R bg``, ``depth`` (R,)
        ``sum_i w_i t_i`` over every sample, ``opacity`` (R,) ``1 - T_R`` and ``transmittance``
        (R,) ``T_R``.
    """
    ray = samples.ray_indices
    w_col = weights if colour_index is None else weights.index_select(0, colour_index)
    ray_col = ray if colour_index is None else (ray.index_select(0, colour_index) if colour_rays is None
                                                else colour_rays)
    rgb = sum_along_rays(w_col[:, None] * rgbs, ray_col, samples.num_rays)
    if background is not None:
        rgb = rgb + remaining[:, None] * background
    depth = sum_along_rays(weights * samples.t_mids, ray, samples.num_rays)
    return RenderOutput(rgb=rgb, depth=depth, opacity=1.0 - remaining, transmittance=remaining)


def render_packed(sigmas: torch.Tensor, rgbs: torch.Tensor, samples: PackedSamples,
                  background: torch.Tensor | None) -> RenderOutput:
    """Densities and colours at every packed sample to pixel values (Eq. 3; no threshold).

    Args:
        sigmas: (P,) float. rgbs: (P, 3) float. samples: P samples of R rays.
        background: (3,) or (R, 3) float, or None.
    Returns:
        :func:`accumulate`'s output with ``weights`` (P,).
    """
    weights, _, remaining = render_transmittance(sigmas, samples)
    out = accumulate(weights, rgbs, samples, remaining, background)
    out.weights = weights
    return out


def distortion_loss(weights: torch.Tensor, s_starts: torch.Tensor, s_ends: torch.Tensor, ray_indices: torch.Tensor,
                    num_rays: int) -> torch.Tensor:
    """Per-ray distortion loss of packed samples (mip-NeRF 360, Barron et al. 2022, Eq. 15).

    ::

        L(s, w) = sum_{i,j} w_i w_j |(s_i + s_{i+1}) / 2 - (s_j + s_{j+1}) / 2|
                  + 1/3 sum_i w_i^2 (s_{i+1} - s_i)

    on normalised ray coordinates ``s`` (mip-NeRF 360 uses its s-space in [0, 1]). It is
    smallest when each ray's weight sits in one short interval, so it removes the
    semi-transparent "fog" a field can use in place of a surface. The double sum is taken
    in O(P) with per-ray exclusive prefix sums (samples sorted along each ray, so
    ``m_i >= m_j`` for ``j < i``): ``sum_{i,j} = 2 sum_i w_i (m_i W_i - (wm)_i)``, ``W_i``
    and ``(wm)_i`` the exclusive sums of ``w`` and ``w m`` (DVGO v2 / nerfacc use the same
    identity).

    Args:
        weights: (P,) float ``w_i`` (differentiable). s_starts, s_ends: (P,) float the
            samples' bounds in normalised ray coordinates. ray_indices: (P,) int64
            non-decreasing. num_rays: R.
    Returns:
        (R,) float distortion of each ray (0 for a ray without samples).
    """
    mids, deltas = 0.5 * (s_starts + s_ends), s_ends - s_starts
    w_before = exclusive_sum(weights, ray_indices, num_rays)
    wm_before = exclusive_sum(weights * mids, ray_indices, num_rays)
    per_sample = 2.0 * weights * (mids * w_before - wm_before) + weights.square() * deltas / 3.0
    return sum_along_rays(per_sample, ray_indices, num_rays)
