"""The sparse row path of a voxel table's training step, against dense references.

``sparse_table_grad`` (a grid table's gradient as the touched rows only) against the dense
gradient of a float64 corner gather written out by hand; ``LazyAdam`` on sparse row gradients
against ``torch.optim.Adam`` on the same gradients made dense (rows that receive a gradient
at every step must follow Adam; rows that never do must not move).
"""
from __future__ import annotations

import pytest
import torch

from distnerf.components.optim import LazyAdam, _coalesced
from distnerf.model.grid import interpolate, sparse_table_grad, trilinear_corners


def _reference_grad(index, weights, grad_out, num_rows):
    """Dense d(sum(out * grad_out))/d(table) for out[p] = sum_k weights[p, k] table[index[p, k]]."""
    table = torch.zeros(num_rows, grad_out.shape[1], dtype=torch.float64, requires_grad=True)
    out = (weights[..., None].double() * table[index]).sum(1)
    (out * grad_out.double()).sum().backward()
    return table.grad


@pytest.mark.parametrize("points", [1, 37, 500])
def test_sparse_table_grad_matches_dense_reference(points):
    n, channels = 9, 5
    gen = torch.Generator().manual_seed(points)
    x = torch.rand(points, 3, generator=gen)
    x[: points // 3] = x[0]  # many samples in one cell: rows repeated across samples
    index, weights = trilinear_corners(x, n)
    grad_out = torch.randn(points, channels, generator=gen)
    grad = sparse_table_grad(index, weights, grad_out, n ** 3)
    assert grad.is_sparse and grad.is_coalesced() and grad.shape == (n ** 3, channels)
    rows = grad.indices()[0]
    assert torch.equal(rows, torch.unique(index))  # exactly the touched rows, sorted
    ref = _reference_grad(index, weights, grad_out, n ** 3)
    torch.testing.assert_close(grad.to_dense().double(), ref, rtol=1e-5, atol=1e-6)
    assert ref[~torch.isin(torch.arange(n ** 3), rows)].abs().max() == 0  # nothing left out


def test_interpolate_sparse_backward_equals_dense_backward():
    n, channels = 40, 3  # 64000 rows, 8 x 100 corner references: the sparse path is taken
    gen = torch.Generator().manual_seed(3)
    x = torch.rand(100, 3, generator=gen)
    index, weights = trilinear_corners(x, n)
    grad_out = torch.randn(100, channels, generator=gen)
    grads = []
    for sparse in (False, True):
        table = torch.randn(n ** 3, channels, generator=torch.Generator().manual_seed(0), requires_grad=True)
        interpolate(table, index, weights, sparse).backward(grad_out)
        grads.append(table.grad)
    assert not grads[0].is_sparse and grads[1].is_sparse
    torch.testing.assert_close(grads[1].to_dense(), grads[0], rtol=1e-5, atol=1e-6)


def test_coalesced_keeps_sorted_rows_and_merges_repeated_ones():
    values = torch.arange(6.0).view(3, 2)
    sorted_rows = torch.sparse_coo_tensor(torch.tensor([[1, 4, 7]]), values, (9, 2), check_invariants=True)
    assert not sorted_rows.is_coalesced()
    out = _coalesced(sorted_rows)
    assert out.is_coalesced() and torch.equal(out.to_dense(), sorted_rows.to_dense())
    repeated = torch.sparse_coo_tensor(torch.tensor([[4, 1, 4]]), values, (9, 2), check_invariants=True)
    out = _coalesced(repeated)
    assert out.is_coalesced() and torch.equal(out.indices()[0], torch.tensor([1, 4]))
    assert torch.equal(out.to_dense(), repeated.to_dense())  # rows 4 summed, not dropped


@pytest.mark.parametrize("fused", [False, True])
def test_lazy_adam_follows_adam_on_rows_with_gradient(fused):
    rows_total, channels, steps = 50, 4, 6
    gen = torch.Generator().manual_seed(5)
    start = torch.randn(rows_total, channels, generator=gen)
    touched = torch.tensor([2, 3, 11, 30, 49])  # these rows get a gradient at every step
    lazy_p = torch.nn.Parameter(start.clone())
    dense_p = torch.nn.Parameter(start.clone())
    lazy = LazyAdam([lazy_p], lr=0.05, betas=(0.9, 0.99), eps=1e-15, fused=fused)
    adam = torch.optim.Adam([dense_p], lr=0.05, betas=(0.9, 0.99), eps=1e-15)
    for _ in range(steps):
        g = torch.randn(len(touched), channels, generator=gen)
        lazy_p.grad = torch.sparse_coo_tensor(touched[None], g, (rows_total, channels), check_invariants=True)
        dense_p.grad = torch.zeros(rows_total, channels).index_copy_(0, touched, g)
        lazy.step()
        adam.step()
    torch.testing.assert_close(lazy_p.data[touched], dense_p.data[touched], rtol=1e-5, atol=1e-6)
    untouched = torch.ones(rows_total, dtype=torch.bool).index_fill_(0, touched, False)
    assert torch.equal(lazy_p.data[untouched], start[untouched])  # lazy: never moved
    state = lazy.state[lazy_p]
    assert float(state["step"]) == steps
    torch.testing.assert_close(state["exp_avg"][touched], adam.state[dense_p]["exp_avg"][touched])
    torch.testing.assert_close(state["exp_avg_sq"][touched], adam.state[dense_p]["exp_avg_sq"][touched])
    assert state["exp_avg"][untouched].abs().max() == 0
