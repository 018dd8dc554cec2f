"""Vertex tables of a voxel grid and their trilinear interpolation (the grid model's field
component, :class:`~distnerf.model.grid.GridModel`).

Legend: P points, C channels, V vertices of a table, (n_x, n_y, n_z) vertices per axis.

A table is a (V, C) tensor in x-major order: vertex ``(i, j, k)`` is row ``(i n_y + j) n_z + k``.
Interpolation gathers the 8 corner rows of each point (:func:`trilinear_corners`, whose corner
offsets :func:`corner_offsets` builds once per table shape) and blends them in one fused
``embedding_bag`` (:func:`interpolate`); its backward is one flat scatter into a dense gradient,
or a sparse COO gradient of the touched rows (:func:`sparse_table_grad`) for
:class:`~distnerf.components.optim.LazyAdam`.
"""
from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

from ..host_buffers import sync_free


def voxel_shape(resolution: int, box: torch.Tensor | None = None, cubic: bool = False,
                multiple: tuple[int, int, int] | None = None) -> tuple[int, int, int]:
    """Vertices per axis of a table at schedule resolution N over ``box``.

    Without ``cubic``: N on every axis, whatever the box's shape (a voxel is as long as its
    box's side over N - 1). With ``cubic``: about the same vertex count with voxel edges
    equal on every axis, ``n_a = max(2, round((N - 1) e_a / g) + 1)`` for the box's side
    lengths ``e_a`` and their geometric mean ``g``, so that ``prod(n_a - 1) ~ (N - 1)^3`` on
    any box. (A region box of ``strategy=ss`` is a half or a quarter of the scene box: N^3
    vertices there refine only the split axes, and a band-limited field is resolved by its
    coarsest axis.) Each ``n_a`` is non-decreasing in N.

    With ``multiple`` (``model.lattice_multiple``: ``ss``'s sharded joint model) each axis' voxel count
    ``n_a - 1`` is rounded up to a multiple of ``multiple[a]``, so that the planes cutting the box into
    ``multiple[a]`` equal parts are vertex planes: a region's tables are then a slice of the lattice.

    Args:
        resolution: N >= 2. box: (2, 3) float box [min, max] (any units); needed with ``cubic``.
        multiple: (3,) ints >= 1, or None.
    Returns:
        (n_x, n_y, n_z) Python ints, each >= 2.
    """
    n = int(resolution)
    if not cubic:
        shape = (n, n, n)
    else:
        extent = [float(e) for e in (box[1] - box[0]).tolist()]
        mean = math.prod(extent) ** (1 / 3)
        shape = tuple(max(2, round((n - 1) * e / mean) + 1) for e in extent)
    if multiple is None:
        return shape
    return tuple(-(-(m - 1) // int(k)) * int(k) + 1 for m, k in zip(shape, multiple))


def lattice_corners(x: torch.Tensor, lattice: tuple[int, int, int], first: tuple[int, int, int],
                    shape: tuple[int, int, int], offsets: torch.Tensor):
    """:func:`trilinear_corners` of a table that is a slice of a larger lattice (a shard of ``ss``'s sharded
    joint model): positions are measured on the whole lattice, so a point's corners and weights are the
    same bits as the whole table's, and its corner rows are then taken relative to the slice.

    Args:
        x: (P, 3) float positions in [0, 1] over the whole lattice's box (clamped to the slice).
        lattice: (L_x, L_y, L_z) vertices per axis of the whole lattice. first: (3,) the slice's first
            vertex on each axis. shape: (n_x, n_y, n_z) the slice's vertices per axis (each >= 2).
        offsets: (8,) long :func:`corner_offsets` of ``shape``.
    Returns:
        index: (P, 8) long rows of the slice's table; weights: (P, 8) float, summing to 1.
    """
    pos = [(x[:, a].clamp(0, 1) * (m - 1)).clamp(f, f + n - 1) for a, (m, f, n) in enumerate(zip(lattice, first, shape))]
    lower = [p.floor().clamp(f, f + n - 2) for p, f, n in zip(pos, first, shape)]
    fx, fy, fz = (p - b for p, b in zip(pos, lower))
    base = [(b - f).long() for b, f in zip(lower, first)]
    index = ((base[0] * shape[1] + base[1]) * shape[2] + base[2])[:, None] + offsets
    gx, gy, gz = 1 - fx, 1 - fy, 1 - fz
    xy = (gx * gy, gx * fy, fx * gy, fx * fy)
    return index, torch.stack([w * z for w in xy for z in (gz, fz)], dim=1)


def corner_offsets(resolution: tuple[int, int, int], device: torch.device | str | None = None) -> torch.Tensor:
    """Row offsets of a voxel's 8 corners from its corner (0, 0, 0) in an x-major table.

    Args:
        resolution: (n_x, n_y, n_z) vertices per axis. device: where to build them.
    Returns:
        (8,) long: corner ``(i, j, k)`` = the binary digits of its position, at
        ``(i n_y + j) n_z + k``. Built on the device (``torch.tensor(list, device=)`` would be
        a blocking copy); a caller may keep them for as long as the table's shape holds.
    """
    _, ny, nz = resolution
    c = torch.arange(8, device=device)
    return ((c >> 2) * ny + ((c >> 1) & 1)) * nz + (c & 1)


def row_strides(resolution: tuple[int, int, int], device: torch.device | str | None = None) -> torch.Tensor:
    """(3,) long row strides ``(n_y n_z, n_z, 1)`` of an x-major table of ``resolution`` vertices per axis
    (vertex ``(i, j, k)`` is row ``i n_y n_z + j n_z + k``), built on the device (see :func:`corner_offsets`)."""
    _, ny, nz = resolution
    strides = torch.ones(3, dtype=torch.long, device=device)
    # fill kernels, no host-to-device copy: an indexed assignment of a number (strides[0] = n) is a blocking
    # 0-dim copy from the host on CUDA (tests/fake_cuda found it)
    strides[0:1].fill_(ny * nz)
    strides[1:2].fill_(nz)
    return strides


def trilinear_corners(x: torch.Tensor, resolution: int | tuple[int, int, int],
                      offsets: torch.Tensor | None = None, strides: torch.Tensor | None = None,
                      outer: bool = False):
    """Corner rows and weights of trilinear interpolation on an x-major vertex table.

    Args:
        x: (P, 3) float positions in [0, 1] over the grid box (clamped).
        resolution: N vertices per axis, or (n_x, n_y, n_z) (each >= 2).
        offsets: (8,) long :func:`corner_offsets` of ``resolution``, or None (built here).
        strides: (3,) long :func:`row_strides` of ``resolution``, or None (built here).
        outer: the weights as one broadcast outer product (4 operators instead of 16, the same
            products in the same order, so the same bits; ~2x slower on the CPU, where the
            default column-by-column form is kept: a GPU step is paced by its operator count).
    Returns:
        index: (P, 8) long rows of the corner vertices (vertex ``(i, j, k)`` is row
        ``(i n_y + j) n_z + k``); weights: (P, 8) float, summing to 1.
    """
    nx, ny, nz = (resolution,) * 3 if isinstance(resolution, int) else resolution
    if nx == ny == nz:
        pos = x.clamp(0, 1) * (nx - 1)
        base = pos.floor().clamp(0, nx - 2)
        frac = pos - base
        base = base.long()
    else:  # per axis (a tensor of the counts would be a host-to-device copy)
        pos = [x[:, a].clamp(0, 1) * (n - 1) for a, n in enumerate((nx, ny, nz))]
        lower = [p.floor().clamp(0, n - 2) for p, n in zip(pos, (nx, ny, nz))]
        frac = torch.stack([p - b for p, b in zip(pos, lower)], dim=1)
        base = torch.stack(lower, dim=1).long()
    if strides is None:
        strides = row_strides((nx, ny, nz), x.device)
    if offsets is None:
        offsets = corner_offsets((nx, ny, nz), x.device)
    if outer:  # (P,) row (i n_y + j) n_z + k of corner (0, 0, 0): 2 operators; the CPU's form is faster there
        lin = (base * strides).sum(-1)
    else:
        lin = (base[:, 0] * ny + base[:, 1]) * nz + base[:, 2]
    index = lin[:, None] + offsets  # (P, 8), corners in (i, j, k) binary order
    if outer:  # (P, 3, 2) factors (1 - f, f); [i, j, k] = (w_x,i w_y,j) w_z,k as below
        factors = torch.stack([1 - frac, frac], dim=2)
        xy = factors[:, 0, :, None, None] * factors[:, 1, None, :, None]
        return index, (xy * factors[:, 2, None, None, :]).view(-1, 8)
    fx, fy, fz = frac.unbind(1)
    gx, gy, gz = 1 - fx, 1 - fy, 1 - fz
    # the 8 products column by column (a broadcast outer product of (P, 2) factors is ~6x slower on the CPU)
    xy = (gx * gy, gx * fy, fx * gy, fx * fy)  # (i, j) = (0, 0), (0, 1), (1, 0), (1, 1)
    weights = torch.stack([w * z for w in xy for z in (gz, fz)], dim=1)  # (P, 8) in (i, j, k) binary order
    return index, weights


def interpolate(table: torch.Tensor, index: torch.Tensor, weights: torch.Tensor, sparse: bool = False) -> torch.Tensor:
    """Trilinear interpolation, differentiable w.r.t. ``table`` only.

    Args:
        table: (V, C) float vertex values. index, weights: (P, 8) from :func:`trilinear_corners`.
        sparse: the table's gradient is a sparse COO tensor of the touched rows.
    Returns:
        (P, C) interpolated values.
    """
    return _Interpolate.apply(table, index, weights, sparse)



class _Interpolate(torch.autograd.Function):
    """Gather-and-blend of corner rows (one fused ``embedding_bag``). Backward: a dense
    table gradient by one flat ``scatter_add_`` (several times faster on CPU than the
    sort-based ``embedding`` backward), or with ``sparse``, when the corner references are
    fewer than the table's rows, a sparse COO gradient holding only the touched rows
    (:func:`sparse_table_grad`; for :class:`~distnerf.components.optim.LazyAdam`). The dense
    gradient costs a zero fill of the whole table, page faults included, and a dense Adam step
    over it: at 128^3 with 12 channels, 25 M floats a step (measured: the README lego line's
    2-minute run spent 180 ms per step in backward there, against 29 ms with the sparse rows)."""

    @staticmethod
    def forward(ctx, table, index, weights, sparse: bool = False):
        ctx.save_for_backward(index, weights)
        ctx.table_shape, ctx.sparse = table.shape, sparse
        # one fused gather-multiply-sum (no (P, 8, C) intermediate)
        return F.embedding_bag(index, table, per_sample_weights=weights.to(table.dtype), mode="sum")

    @staticmethod
    def backward(ctx, grad_out):
        index, weights = ctx.saved_tensors
        num_rows, channels = ctx.table_shape
        if ctx.needs_input_grad[2]:
            raise NotImplementedError("gradient w.r.t. interpolation weights is not needed here")
        if ctx.sparse and index.numel() < num_rows:  # fewer corner references than rows: sparse is cheaper
            return sparse_table_grad(index, weights, grad_out, num_rows), None, None, None
        contrib = weights[..., None] * grad_out[:, None, :].to(weights.dtype)  # (P, 8, C)
        if sync_free(index.device):  # rows added whole: 3 operators (the host paces a GPU step); on the CPU
            # the same sums in the same order as the flat scatter below (tested), which is faster there for few channels
            grad_table = torch.zeros(num_rows, channels, dtype=grad_out.dtype, device=grad_out.device)
            return grad_table.index_add_(0, index.view(-1), contrib.view(-1, channels).to(grad_out.dtype)), \
                None, None, None
        flat = (index[..., None] * channels + torch.arange(channels, device=index.device)).reshape(-1)
        grad_table = torch.zeros(num_rows * channels, dtype=grad_out.dtype, device=grad_out.device)
        grad_table.scatter_add_(0, flat, contrib.reshape(-1).to(grad_out.dtype))
        return grad_table.view(num_rows, channels), None, None, None


def sparse_table_grad(index: torch.Tensor, weights: torch.Tensor, grad_out: torch.Tensor,
                      num_rows: int) -> torch.Tensor:
    """The gradient of a vertex table under :func:`interpolate`, as a sparse COO tensor of the
    touched rows only.

    ``grad[r] = sum over (p, k) with index[p, k] = r of weights[p, k] * grad_out[p]``, computed as
    one sparse-times-dense product: the corner references are sorted by row (one sort of the P x 8
    row numbers), which gives the touched rows (sorted, unique) and a CSR matrix ``S`` (rows x P)
    holding the weights, so that ``grad_rows = S @ grad_out``. On the CPU this is about twice as fast
    as ``torch.unique`` with an ``index_add_`` of the (P x 8, C) contributions, which serialises on
    repeated rows.

    Args:
        index, weights: (P, 8) long rows and float weights of the corners
            (:func:`trilinear_corners`). grad_out: (P, C) float gradient of the interpolated values.
        num_rows: V, rows of the table.
    Returns:
        (V, C) sparse COO tensor, coalesced (rows sorted and unique), dtype of ``grad_out``.
    """
    channels = grad_out.shape[1]
    sorted_rows, order = index.reshape(-1).sort()
    rows, counts = torch.unique_consecutive(sorted_rows, return_counts=True)
    crow = counts.new_zeros(rows.shape[0] + 1)
    torch.cumsum(counts, 0, out=crow[1:])
    with warnings.catch_warnings():  # torch says once per process that its CSR layout is in beta
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        by_row = torch.sparse_csr_tensor(crow, order.div(8, rounding_mode="floor"),
                                         weights.reshape(-1)[order].to(grad_out.dtype),
                                         size=(rows.shape[0], grad_out.shape[0]), check_invariants=False)
    values = by_row @ grad_out  # (rows, C)
    return torch.sparse_coo_tensor(rows[None], values, (num_rows, channels), is_coalesced=True,
                                   check_invariants=False)
