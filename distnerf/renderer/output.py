"""What rendering R rays returns: :class:`RenderOutput`.

One type for every renderer and model (a model's ``forward``, a region set, the fusion stage, the
joint compositing), so a consumer reads ``out.rgb`` or ``out.ray_index`` instead of spelling dict
keys, and a field a renderer does not produce is ``None``, never a guessed default.

Legend: R rays (rows; under ``ss``'s per-region training, (ray, region) rows), P packed samples.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .packed import PackedSamples


@dataclass
class RenderOutput:
    """Pixel values of R rays and what it took to render them.

    Attributes:
        rgb: (R, 3) float in [0, 1], the background included where the renderer has one.
        depth: (R,) float, expected termination distance ``sum_i w_i t_i`` along the ray (ray
            parameter t: world units for unit directions).
        opacity: (R,) float, ``1 - T_R`` (accumulated weight).
        num_samples: samples evaluated (marched; a host int or a 0-dim int64 tensor: counting
            it must not force a host sync).
        transmittance: (R,) float ``T_R`` left after the last sample (segment renderers), or None.
        weights: the samples' weights ``w_i`` ((P,) packed or (R, S) batched; differentiable),
            or None once dropped (a model keeps them only to compute a loss on them).
        samples: the rendered :class:`PackedSamples` (with ``weights``), or None.
        num_density_samples: density evaluations (both marching passes), or None.
        num_colour_samples: colour evaluations (samples above the colour threshold), or None.
        distortion_loss: (R,) float, the weighted distortion loss per ray (mip-NeRF 360,
            Eq. 15), added to the photometric loss, or None.
        rgb_coarse: (R, 3) float, opacity_coarse: (R,) float: the coarse network's pixels
            (NeRF's hierarchical sampling), or None.
        ray_index: (R,) int64, the batch ray each row belongs to (``ss``: a ray crossing two
            of this rank's regions has two rows), or None (row r is ray r).
        loss_weight: (R,) float, each row's weight in the loss (``ss``: ``1 / rows of its
            region``), or None (uniform).
        samples_per_region: samples per region (joint ``ss``), or None.

    Dict-style reads (``out["rgb"]``, ``"ray_index" in out``, ``out.get(...)``, ``keys()``)
    see the fields that are not None; they are kept for code written against the earlier
    dict outputs. Raises ``KeyError`` for a field that is None or unknown.
    """

    rgb: torch.Tensor
    depth: torch.Tensor
    opacity: torch.Tensor
    num_samples: int | torch.Tensor = 0
    transmittance: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    samples: PackedSamples | None = None
    num_density_samples: int | torch.Tensor | None = None
    num_colour_samples: int | torch.Tensor | None = None
    distortion_loss: torch.Tensor | None = None
    rgb_coarse: torch.Tensor | None = None
    opacity_coarse: torch.Tensor | None = None
    ray_index: torch.Tensor | None = None
    loss_weight: torch.Tensor | None = None
    samples_per_region: list[int] | None = None

    def keys(self) -> list[str]:
        """The names of the fields that are set (not None)."""
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]

    def __getitem__(self, key: str):
        value = getattr(self, key, None) if key in _FIELDS else None
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key: str) -> bool:
        return key in _FIELDS and getattr(self, key) is not None

    def get(self, key: str, default=None):
        return self[key] if key in self else default


_FIELDS = frozenset(f.name for f in fields(RenderOutput))
