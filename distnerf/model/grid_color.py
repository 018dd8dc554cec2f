"""The grid model's colour head: view-dependent colour from interpolated vertex features.

Legend: R rays, P points, C feature channels, K = (degree + 1)^2 basis functions.

Two heads (``model.color``):

* ``sh``: the features are spherical-harmonic coefficients, 3 x K per vertex (Plenoxels,
  Fridovich-Keil et al. 2022; PlenOctrees, Yu et al. 2021), the colour ``sigmoid(sum_k c_k Y_k(d))``.
* ``mlp``: a tiny MLP on the features, the encoded view direction and, with
  ``model.appearance=embedding``, the image's code (DVGO, Sun et al. 2022, Sec. 5). The direction's
  encoding (``model.viewdir_encoding``): ``frequency``, NeRF's sinusoids (:class:`.PositionalEncoding`),
  or ``sh``, its real spherical-harmonic basis (:class:`SphericalHarmonicEncoding`, Instant-NGP's).

An ``affine`` appearance (:mod:`.appearance`) transforms either head's colour.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .appearance import Appearance
from .encoding import PositionalEncoding


def feature_channels(color: str, num_features: int, sh_degree: int) -> int:
    """C, the colour features per vertex: 3 (degree + 1)^2 for ``sh``, ``num_features`` for ``mlp``."""
    return 3 * (sh_degree + 1) ** 2 if color == "sh" else num_features


class SphericalHarmonicEncoding(nn.Module):
    """A view direction as its real spherical-harmonic basis up to ``degree`` (Instant-NGP, Mueller et al.
    2022, Sec. 4: the direction's encoding for the colour network), the same basis as the ``sh`` head's.

    Args:
        degree: the highest band, 0 to 2 (``model.sh_degree``).
    Shapes: (P, 3) float unit directions -> (P, (degree + 1)^2).
    Raises:
        ValueError: ``degree`` above 2.
    """

    def __init__(self, degree: int):
        super().__init__()
        if degree > 2:
            raise ValueError(f"spherical harmonics degree {degree} > 2 is not supported")
        self.degree = degree

    def output_dim(self, input_dim: int) -> int:
        """(degree + 1)^2, the basis functions of a direction (``input_dim`` must be 3)."""
        assert input_dim == 3, input_dim
        return (self.degree + 1) ** 2

    def forward(self, dirs: torch.Tensor) -> torch.Tensor:
        return spherical_harmonics(dirs, self.degree)


def build_dir_encoding(kind: str, frequencies: int, sh_degree: int) -> PositionalEncoding | SphericalHarmonicEncoding:
    """The ``mlp`` head's view-direction encoding of ``model.viewdir_encoding``: ``frequency`` (``frequencies``
    octaves of sinusoids and the direction itself, 3 (2 L + 1) values) or ``sh`` (degree ``sh_degree``,
    (degree + 1)^2 values). Raises ValueError for another ``kind``."""
    if kind == "frequency":
        return PositionalEncoding(frequencies)
    if kind == "sh":
        return SphericalHarmonicEncoding(sh_degree)
    raise ValueError(f"model.viewdir_encoding={kind!r}: expected 'frequency' or 'sh'")


def build_color_net(color: str, num_features: int, dir_encoding: nn.Module, latent_dim: int,
                    hidden_width: int) -> nn.Module:
    """The ``mlp`` head's network, (C + encoded direction + latent) -> 64 -> 64 -> 3 with ReLUs
    (``hidden_width`` wide; no output activation), or ``nn.Identity`` for ``sh``."""
    if color != "mlp":
        return nn.Identity()
    return nn.Sequential(
        nn.Linear(num_features + dir_encoding.output_dim(3) + latent_dim, hidden_width), nn.ReLU(),
        nn.Linear(hidden_width, hidden_width), nn.ReLU(),
        nn.Linear(hidden_width, 3))


def shade(feats: torch.Tensor, viewdirs: torch.Tensor, ray_idx: torch.Tensor | None, image_ids: torch.Tensor | None,
          *, sh_degree: int | None, color_net: nn.Module, dir_encoding: nn.Module,
          appearance: Appearance | None) -> torch.Tensor:
    """Features and view directions -> colour.

    Args:
        feats: (P, C) float interpolated features.
        viewdirs: (R, 3) float unit directions per ray, indexed by ``ray_idx`` (P,) int64, or
            (P, 3) per point when ``ray_idx`` is None.
        image_ids: (R,) (or (P,)) int64 training image ids, or None (:mod:`.appearance`).
        sh_degree: the ``sh`` head's degree, or None for the ``mlp`` head (``color_net``, fed
            ``dir_encoding`` of the directions and the appearance's latent code).
        appearance: the model's per-image appearance, or None.
    Returns:
        (P, 3) float RGB in [0, 1] (transformed by an ``affine`` appearance: may leave [0, 1]).
    """
    pick = (lambda t: t) if ray_idx is None else (lambda t: t.index_select(0, ray_idx))  # noqa: E731
    app = appearance
    codes = app.codes(image_ids, viewdirs.shape[0]) if app is not None else None
    if sh_degree is not None:
        basis = pick(spherical_harmonics(viewdirs, sh_degree))  # (P, K)
        rgb = torch.sigmoid((feats.view(-1, 3, basis.shape[-1]) * basis[:, None, :]).sum(-1))
    else:
        latent = app.latent(codes, ray_idx) if app is not None else []
        rgb = torch.sigmoid(color_net(torch.cat([feats, pick(dir_encoding(viewdirs)), *latent], dim=-1)))
    return rgb if app is None else app.transform(rgb, codes, ray_idx)


def spherical_harmonics(dirs: torch.Tensor, degree: int) -> torch.Tensor:
    """Real spherical-harmonic basis up to ``degree`` (<= 2), as in Plenoxels / PlenOctrees.

    Args:
        dirs: (P, 3) float unit directions.
    Returns:
        (P, (degree + 1)^2) basis values.
    """
    if degree > 2:
        raise ValueError(f"spherical harmonics degree {degree} > 2 is not supported")
    x, y, z = dirs.unbind(-1)
    if degree == 0:
        return torch.full_like(dirs[:, :1], 0.28209479177387814)
    # degree 1 in four operators: (y, z, x) scaled, the constant term padded in front, y and x negated
    # (the same bits as scaling by the negative constants)
    out = F.pad(dirs.roll(-1, dims=-1) * 0.4886025119029199, (1, 0), value=0.28209479177387814)
    out[:, 1::2].neg_()
    if degree >= 2:
        out = torch.cat([out, torch.stack([1.0925484305920792 * x * y, -1.0925484305920792 * y * z,
                                           0.31539156525252005 * (2 * z * z - x * x - y * y),
                                           -1.0925484305920792 * x * z, 0.5462742152960396 * (x * x - y * y)],
                                          dim=-1)], dim=-1)
    return out
