"""``model.occupancy_threshold_final``: the grid's occupancy threshold at its final resolution
(the coarse stages keep ``occupancy_threshold``), checked against occupancy computed here by
looping over the voxels and their eight corners."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from distnerf.model.grid import GridModel

AABB = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])
BG = torch.zeros(3)
FOG, SURFACE = 0.01, 0.3  # opacity per marching step at the two kinds of vertex


def _raw_for(model: GridModel, alpha: float) -> float:
    """The raw table value whose one marching step has opacity ``alpha``:
    1 - exp(-softplus(raw + shift) / base_voxel * step)."""
    sigma = -math.log(1.0 - alpha) / model.step_size()
    return math.log(math.expm1(sigma * model.base_voxel)) - model.density_shift


def _set_vertices(model: GridModel, seed: int) -> torch.Tensor:
    """Each vertex empty, fog or surface at random; returns the (n, n, n) per-vertex opacity."""
    n = model.resolution
    kind = torch.randint(0, 10, (n, n, n), generator=torch.Generator().manual_seed(seed))
    alpha = torch.where(kind == 0, SURFACE, torch.where(kind < 4, FOG, 1e-6))
    raw = torch.tensor([_raw_for(model, float(a)) for a in alpha.reshape(-1)])
    with torch.no_grad():
        model.density.copy_(raw[:, None])
    model.update_occupancy()
    return alpha


def _expected(alpha: torch.Tensor, threshold: float) -> torch.Tensor:
    n = alpha.shape[0]
    out = torch.zeros((n - 1,) * 3, dtype=torch.bool)
    for i, j, k in itertools.product(range(n - 1), repeat=3):
        corners = [float(alpha[i + a, j + b, k + c]) for a, b, c in itertools.product((0, 1), repeat=3)]
        out[i, j, k] = max(corners) > threshold
    return out


@pytest.mark.parametrize("final", [None, 0.05])
def test_the_final_stage_prunes_cells_below_its_threshold(final):
    model = GridModel(AABB, BG, resolutions=[6, 8], upsample_steps=[10], color="sh", tv_weight=0.0,
                      tighten_aabb=False, occupancy_threshold=1e-3, occupancy_threshold_final=final)
    alpha = _set_vertices(model, seed=1)
    coarse = model.occupancy.binary.clone()
    assert torch.equal(coarse, _expected(alpha, 1e-3))  # the coarse stage: the usual threshold
    assert model.current_occupancy_threshold() == pytest.approx(1e-3)
    model.update_state(10)  # to the final resolution
    assert model.resolution == 8
    alpha = _set_vertices(model, seed=2)
    threshold = 1e-3 if final is None else final
    assert model.current_occupancy_threshold() == pytest.approx(threshold)
    expected = _expected(alpha, threshold)
    assert torch.equal(model.occupancy.binary, expected)
    fog_only = _expected(alpha, 1e-3) & ~_expected(alpha, 0.05)
    assert fog_only.any()  # the case distinguishes the two thresholds
    assert bool((model.occupancy.binary & fog_only).any()) == (final is None)


def test_a_single_resolution_keeps_the_usual_threshold():
    """With one resolution there is no coarse stage to form the surfaces first: the key is ignored."""
    model = GridModel(AABB, BG, resolutions=[6], upsample_steps=[], color="sh", tv_weight=0.0,
                      occupancy_threshold=1e-3, occupancy_threshold_final=0.05)
    alpha = _set_vertices(model, seed=3)
    assert torch.equal(model.occupancy.binary, _expected(alpha, 1e-3))


@pytest.mark.parametrize("threshold", [1e-3, 0.05, 0.5])
def test_continuous_densities_match_a_float64_opacity_per_voxel(threshold):
    """Raw values spread over the threshold's neighbourhood: the occupancy equals the voxels whose
    largest corner opacity, computed here in float64 from 1 - exp(-softplus(raw + shift) /
    base_voxel * step), exceeds the threshold."""
    model = GridModel(AABB, BG, resolutions=[9], upsample_steps=[], color="sh", tv_weight=0.0,
                      tighten_aabb=False, occupancy_threshold=threshold)
    n = model.resolution
    centre = _raw_for(model, threshold)
    raw = centre + 2.0 * torch.randn((n, n, n), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        model.density.copy_(raw.reshape(-1, 1))
    model.update_occupancy()
    sigma = torch.nn.functional.softplus(raw.double() + model.density_shift) / model.base_voxel
    alpha = 1.0 - torch.exp(-sigma * model.step_size())
    expected = _expected(alpha, threshold)
    assert expected.any() and not expected.all()  # the case has both kinds of voxel
    differ = model.occupancy.binary != expected
    # a float32 comparison may only disagree with float64 on a corner opacity at the threshold itself
    near = _expected(alpha, threshold * (1 - 1e-5)) & ~_expected(alpha, threshold * (1 + 1e-5))
    assert not bool((differ & ~near).any())
