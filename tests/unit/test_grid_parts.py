"""The grid model's parts, against values worked out by hand: the corner offsets of an x-major
table, the upsampling schedule's next resolution, the raw occupancy threshold (inverted back to an
opacity) and the colour head's feature count."""
from __future__ import annotations

import math

import pytest

from distnerf.model.grid_color import feature_channels
from distnerf.model.grid_occupancy import raw_threshold
from distnerf.model.grid_schedule import next_resolution
from distnerf.model.grid_tables import corner_offsets


def test_corner_offsets_of_an_x_major_table():
    # (n_x, n_y, n_z) = (2, 3, 4): vertex (i, j, k) is row (3 i + j) 4 + k; corners in (i, j, k) binary order
    assert corner_offsets((2, 3, 4)).tolist() == [0, 1, 4, 5, 12, 13, 16, 17]


@pytest.mark.parametrize("resolution, stage_step, expected", [
    (8, 1, None), (8, 2, 12),      # the first change at step 2
    (12, 4, None), (12, 5, 16),    # the second at step 5, read from the current resolution
    (8, 9, 12),                    # one stage per call, even past both changes
    (16, 100, None), (20, 100, None),  # the last stage, or a resolution off the list: stay
])
def test_next_resolution(resolution, stage_step, expected):
    assert next_resolution([8, 12, 16], [2, 5], resolution, stage_step) == expected


def test_raw_threshold_gives_the_opacity_threshold_back():
    threshold, step, base_voxel, shift = 0.01, 0.02, 0.05, -3.0
    raw = raw_threshold(threshold, step, base_voxel, shift)
    sigma = math.log1p(math.exp(raw + shift)) / base_voxel  # softplus(raw + shift) / base_voxel
    assert 1.0 - math.exp(-sigma * step) == pytest.approx(threshold, rel=1e-9)
    assert raw_threshold(0.0, step, base_voxel, shift) is None  # no finite value: compare opacities
    assert raw_threshold(1.0, step, base_voxel, shift) is None


def test_feature_channels():
    assert feature_channels("sh", 12, 1) == 12 and feature_channels("sh", 12, 2) == 27
    assert feature_channels("mlp", 7, 2) == 7


@pytest.mark.parametrize("shape", [(5, 5, 5), (3, 6, 4)])
def test_trilinear_corners_match_a_float64_reference_in_both_weight_forms(shape):
    """Rows and weights of each point's 8 corners against a float64 computation from the definition
    (vertex (i, j, k) at row (i n_y + j) n_z + k; weight prod over axes of (1 - f) or f); the few-operator
    form (``outer``, the CUDA path) gives the column form's bits."""
    import torch

    from distnerf.model.grid_tables import row_strides, trilinear_corners

    g = torch.Generator().manual_seed(0)
    x = torch.rand(257, 3, generator=g)
    x[0] = torch.tensor([0.0, 1.0, 0.5])  # faces of the box: the last cell, not one past it
    index, weights = trilinear_corners(x, shape)
    index_o, weights_o = trilinear_corners(x, shape, outer=True)
    assert torch.equal(index, index_o) and torch.equal(weights, weights_o)
    assert row_strides(shape).tolist() == [shape[1] * shape[2], shape[2], 1]
    n = torch.tensor(shape, dtype=torch.float64)
    pos = x.double() * (n - 1)
    base = torch.minimum(pos.floor(), n - 2)
    frac = pos - base
    for c in range(8):
        bits = [(c >> 2) & 1, (c >> 1) & 1, c & 1]
        ijk = [int(b) for b in bits]
        rows = ((base[:, 0] + ijk[0]) * shape[1] + base[:, 1] + ijk[1]) * shape[2] + base[:, 2] + ijk[2]
        assert torch.equal(index[:, c], rows.long())
        w = torch.ones(x.shape[0], dtype=torch.float64)
        for a in range(3):
            w = w * (frac[:, a] if ijk[a] else 1 - frac[:, a])
        torch.testing.assert_close(weights[:, c].double(), w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("channels", [1, 5])
def test_interpolate_table_gradient_both_backward_forms(channels):
    """The dense table gradient of :func:`interpolate`: the CUDA form (rows added whole, ``index_add_``)
    gives the CPU form's bits (flat ``scatter_add_``), and both equal autograd through a plain float64
    gather-and-sum."""
    import torch

    from distnerf.host_buffers import sync_free_paths
    from distnerf.model.grid_tables import interpolate, trilinear_corners

    g = torch.Generator().manual_seed(1)
    shape = (4, 5, 3)
    table = torch.rand(4 * 5 * 3, channels, generator=g)
    index, weights = trilinear_corners(torch.rand(300, 3, generator=g), shape)
    upstream = torch.randn(300, channels, generator=g)
    grads = []
    for free in (False, True):
        t = table.clone().requires_grad_(True)
        with sync_free_paths(free):
            (interpolate(t, index, weights) * upstream).sum().backward()
        grads.append(t.grad)
    assert torch.equal(grads[0], grads[1])
    ref = table.double().requires_grad_(True)
    ((ref[index] * weights.double()[..., None]).sum(1) * upstream.double()).sum().backward()
    torch.testing.assert_close(grads[0].double(), ref.grad, rtol=1e-5, atol=1e-5)
