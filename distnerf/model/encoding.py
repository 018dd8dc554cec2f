"""Input encodings: sinusoidal positional encoding and multiresolution hash grid.

Legend: P points, L levels, F features per level, T table size.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn


class PositionalEncoding(nn.Module):
    """NeRF positional encoding (Mildenhall et al. 2020, Eq. 4).

    ``gamma(p) = (p, sin(2^0 pi p), cos(2^0 pi p), ..., sin(2^{L-1} pi p), cos(2^{L-1} pi p))``
    (the reference implementation omits pi; so do we, to match its frequencies).

    Args:
        num_frequencies: L. include_input: prepend p itself.
    Shapes: (P, D) -> (P, D * (2 L + include_input)).
    """

    def __init__(self, num_frequencies: int, include_input: bool = True):
        super().__init__()
        self.include_input = include_input
        self.register_buffer("freqs", 2.0 ** torch.arange(num_frequencies, dtype=torch.float32),
                             persistent=False)

    def output_dim(self, input_dim: int) -> int:
        return input_dim * (2 * len(self.freqs) + int(self.include_input))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xb = (x[..., None, :] * self.freqs[:, None]).flatten(-2)  # (P, L*D)
        parts = [torch.sin(xb), torch.cos(xb)]
        if self.include_input:
            parts.insert(0, x)
        return torch.cat(parts, dim=-1)


_PRIMES = (1, 2654435761, 805459861)


class HashEncoding(nn.Module):
    """Multiresolution hash encoding (Instant-NGP, Mueller et al. 2022, Sec. 3).

    Level ``l`` has resolution ``N_l = floor(N_min * b^l)`` with
    ``b = exp((ln N_max - ln N_min) / (L - 1))``. A level whose dense grid
    ``(N_l + 1)^3`` fits in the table is indexed densely, otherwise by the spatial
    hash ``xor_i(x_i * pi_i) mod T`` (Eq. 4). Features of the 8 cell corners are
    trilinearly interpolated; differentiable w.r.t. the table (and the inputs).

    Args:
        num_levels: L. features_per_level: F. log2_table_size: log2 T.
        table_size: T itself, any positive integer (``model.max_params``), instead of 2^log2_table_size.
        base_resolution: N_min. max_resolution: N_max. (Defaults: ``model=ngp``'s, in
        :class:`distnerf.schema.NGPModelConfig`.)
    Shapes: points (P, 3) in [0, 1] -> (P, L * F), dtype of the table.
    """

    def __init__(self, num_levels: int, features_per_level: int, log2_table_size: int, base_resolution: int,
                 max_resolution: int, dtype=torch.float32, table_size: int | None = None):
        # no defaults here: the model's (distnerf.schema.NGPModelConfig) are the only ones
        super().__init__()
        self.num_levels, self.features_per_level = num_levels, features_per_level
        growth = math.exp((math.log(max_resolution) - math.log(base_resolution)) / max(num_levels - 1, 1))
        # the epsilon absorbs rounding in growth ** l (e.g. 16 * b^15 = 1023.999... for N_max = 1024)
        resolutions = [int(math.floor(base_resolution * growth ** l + 1e-6)) for l in range(num_levels)]
        table_size = 2 ** log2_table_size if table_size is None else int(table_size)  # any T: the hash is mod T
        sizes = [min(table_size, (r + 1) ** 3) for r in resolutions]
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        self.register_buffer("resolutions", torch.tensor(resolutions, dtype=torch.long), persistent=False)
        self.register_buffer("sizes", torch.tensor(sizes, dtype=torch.long), persistent=False)
        self.register_buffer("offsets", torch.tensor(offsets[:-1], dtype=torch.long), persistent=False)
        self.hashed = [(r + 1) ** 3 > table_size for r in resolutions]
        # the same numbers for the forward pass: reading the buffers would be host syncs on CUDA
        self._levels = [(r, s, int(o)) for r, s, o in zip(resolutions, sizes, offsets[:-1])]
        self.table = nn.Parameter(
            (torch.rand(int(offsets[-1]), features_per_level, dtype=dtype) * 2 - 1) * 1e-4)

    @property
    def output_dim(self) -> int:
        return self.num_levels * self.features_per_level

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        num = x.shape[0]
        c = torch.arange(8, device=x.device)  # on the device: torch.tensor(list, device=) is a blocking copy
        corners = torch.stack([c >> 2, (c >> 1) & 1, c & 1], dim=1)  # (8, 3) corner (i, j, k), i slowest
        outs = []
        for level, (res, size, offset) in enumerate(self._levels):
            pos = x.to(self.table.dtype) * res
            cell = pos.floor().long().clamp(0, res - 1)
            frac = pos - cell  # (P, 3)
            ids = cell[:, None, :] + corners  # (P, 8, 3)
            if self.hashed[level]:
                h = ids[..., 0] * _PRIMES[0]
                h = h ^ (ids[..., 1] * _PRIMES[1])
                h = h ^ (ids[..., 2] * _PRIMES[2])
                index = h % size
            else:
                index = ids[..., 0] + (res + 1) * (ids[..., 1] + (res + 1) * ids[..., 2])
            feats = self.table[index + offset]  # (P, 8, F)
            w = torch.where(corners.bool(), frac[:, None, :], 1 - frac[:, None, :]).prod(-1)  # (P, 8)
            outs.append((feats * w[..., None]).sum(dim=1))
        return torch.cat(outs, dim=-1).reshape(num, self.output_dim)
