"""Occupancy grid for empty-space skipping and packed ray marching.

(Just over 500 lines: the grid and the marches that read it, the two-level walk, the dense layout that the
dense walk, the static step and evaluation's fixed rounds share, and the contracted march, use one private
cell lookup and one interval layout, kept in one place.)

Legend: R rays, P packed samples, Q candidate groups, M occupancy cells per axis.

The occupancy grid is a binary (M, M, M) grid over a box, indexed ``[ix, iy, iz]``
(x first). It is derived deterministically from the model's density (no random
numbers), so every process that holds the same parameters holds the same grid
(Instant-NGP, Mueller et al. 2022, Sec. 4 "accelerated ray marching").

Marching (:func:`march`) places samples on a per-ray **global sample grid** anchored at
a ray parameter ``anchor`` (the ray's ``near`` plus a jitter offset): interval ``j`` is
``[anchor + j dt, anchor + (j + 1) dt]`` with ``dt = step_size / |d|``, so ``step_size`` is a
distance in the scene's space (world units, or NDC units for LLFF) whatever the length
of the direction. A segment ``[t_lo, t_hi]`` (a ray clipped to a box or a region) gets
the grid's intervals clipped to it, so consecutive segments of one ray tile it with no
gap and no overlap, and every segment of a ray uses the same grid. Only intervals whose
midpoint lies in an occupied cell are emitted, found by a two-level walk: groups of
``G`` consecutive intervals (a group no longer than a coarse cell) are first tested
against a coarse copy of the grid (``COARSE_FACTOR``^3 cells per coarse cell; exact and
conservative, :meth:`OccupancyGrid.coarse_blocks`), and only the intervals of groups
that may touch occupied space are tested against the grid itself (no per-sample test
of empty groups). The groups sit in a fixed ``(R, K)`` layout, ``K`` bounded by the
occupied box's diagonal or by the caller (an evaluation round's length), both Python
numbers, so a march reads two sizes from the device:
the number of candidate intervals and the number of samples (the packed layout's own
host syncs; nerfacc's ``traverse_grids`` reads its sizes too).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..host_buffers import sync_free
from .contraction import contract, contracted_box, from_spacing, ray_breaks, to_spacing
from .packed import PackedSamples
from .samples import clip_to_box

COARSE_FACTOR = 4  # occupancy cells per coarse cell along each axis


def normalize_points(points: torch.Tensor, aabb: torch.Tensor) -> torch.Tensor:
    """Map points from the box to [0, 1]^3. points: (P, 3); aabb: (2, 3)."""
    return (points - aabb[0]) / (aabb[1] - aabb[0])


def _strides(m: int, device) -> torch.Tensor:
    """(3,) int32 row strides ``(m^2, m, 1)`` of an x-major (m, m, m) grid, made once per (m, device) (inside a
    compiled graph: a constant of the graph, not the cache, whose filling would recompile the graph once)."""
    if torch.compiler.is_compiling():
        return torch.tensor([m * m, m, 1], dtype=torch.int32, device=device)
    key = (m, str(device))
    if key not in _STRIDES:
        _STRIDES[key] = torch.tensor([m * m, m, 1], dtype=torch.int32, device=device)
    return _STRIDES[key]


_STRIDES: dict = {}


def _lookup(cells: torch.Tensor, binary: torch.Tensor) -> torch.Tensor:
    """(P, 3) float positions in cell units (consumed) -> (P,) bool occupancy; outside is False."""
    m = binary.shape[0]
    clamped = cells.clamp(0, m)
    inside = (clamped == cells).all(dim=-1)  # 0 <= cells <= m (NaN: outside)
    i = clamped.clamp_(max=m - 1).to(torch.int32)
    if sync_free(i.device):  # 2 operators (the host paces a GPU step); on the CPU the sum over 3 is ~4x slower
        flat = (i * _strides(m, i.device)).sum(-1)
    else:
        flat = (i[:, 0] * m + i[:, 1]) * m + i[:, 2]
    return binary.reshape(-1).index_select(0, flat) & inside


class OccupancyGrid(nn.Module):
    """Binary occupancy over an axis-aligned box.

    Args:
        aabb: (2, 3) float32 box [min, max] (world units, or NDC for LLFF).
        resolution: M cells per axis.
        contraction_aabb: (2, 3) float32 unit region of a contracted field
            (:mod:`~distnerf.renderer.contraction`), or None. With it the grid covers the
            contracted space, ``aabb`` is :func:`~distnerf.renderer.contraction.contracted_box`
            of it (asserted: one definition of the contracted range), :meth:`query`
            contracts world points first and :meth:`cell_centers` are contracted points.
    """

    def __init__(self, aabb: torch.Tensor, resolution: int, contraction_aabb: torch.Tensor | None = None):
        super().__init__()
        if contraction_aabb is not None:
            aabb = contracted_box(contraction_aabb.float())
        self.register_buffer("aabb", aabb.clone().float())
        self.register_buffer("contraction_aabb", None if contraction_aabb is None else
                             contraction_aabb.clone().float())
        self.register_buffer("binary", torch.ones((resolution,) * 3, dtype=torch.bool))
        self._coarse_key, self._coarse = None, None

    @property
    def resolution(self) -> int:
        return self.binary.shape[0]

    def cell_centers(self) -> torch.Tensor:
        """(M^3, 3) float32 world positions of cell centres, x-major like ``binary``."""
        m = self.resolution
        axis = (torch.arange(m, device=self.aabb.device, dtype=torch.float32) + 0.5) / m
        grid = torch.stack(torch.meshgrid(axis, axis, axis, indexing="ij"), dim=-1).reshape(-1, 3)
        return self.aabb[0] + grid * (self.aabb[1] - self.aabb[0])

    @property
    def contracted(self) -> bool:
        """Whether the grid covers contracted space (``contraction_aabb``)."""
        return self.contraction_aabb is not None

    def query(self, points: torch.Tensor) -> torch.Tensor:
        """Occupancy of points. points: (P, 3) float world positions (contracted first when
        :attr:`contracted`). Returns (P,) bool; outside the box is False."""
        if self.contracted:
            points = contract(points, self.contraction_aabb)
        aabb = self.aabb.to(points.dtype)
        return _lookup((points - aabb[0]) * (self.resolution / (aabb[1] - aabb[0])), self.binary)

    def ray_cells(self, origins: torch.Tensor, directions: torch.Tensor):
        """Rays in cell units: (R, 3) origins and (R, 3) directions such that ``o + t d``
        is the point ``origins + t directions`` measured in cells from the box corner."""
        aabb = self.aabb.to(origins.dtype)
        scale = self.cell_scale(origins.dtype)
        return (origins - aabb[0]) * scale, directions * scale

    def cell_scale(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(3,) cells per unit length along each axis, in ``dtype``: made once per box (2 operators a march) and
        kept; a box that moves (a refresh tightens it in place) is written into the same tensor, so a replayed
        CUDA graph reads the new box's scale (:mod:`distnerf.components.graphed_step`, whose step calls this
        before each replay)."""
        aabb = self.aabb.to(dtype)
        if torch.compiler.is_compiling():  # a graph computes it once anyway (and cannot compare data pointers)
            return self.resolution / (aabb[1] - aabb[0])
        key = (aabb.data_ptr(), aabb._version, aabb.dtype, self.resolution)
        if self.__dict__.get("_cell_scale_key") != key:
            scale, kept = self.resolution / (aabb[1] - aabb[0]), self.__dict__.get("_cell_scale")
            if kept is not None and kept.dtype == scale.dtype and kept.device == scale.device:
                kept.copy_(scale)
            else:
                self._cell_scale = scale
            self._cell_scale_key = key
        return self._cell_scale

    def coarse(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The coarse level of the two-level walk.

        Returns:
            blocks: (Mc, Mc, Mc) bool, ``Mc = ceil(M / f)`` with ``f = COARSE_FACTOR``:
                whether any cell of the 2 x 2 x 2 coarse cells ``[i, i+1] x [j, j+1] x
                [k, k+1]`` is occupied (a coarse cell holds f^3 cells);
            edge: (3,) float the coarse cell edge per axis.
        Cached until ``binary`` changes.
        """
        key = (self.binary.data_ptr(), self.binary._version, self.binary.shape[0], self.aabb.data_ptr(),
               self.aabb._version)
        if self._coarse_key != key:
            f = min(COARSE_FACTOR, self.resolution)
            pooled = F.max_pool3d(self.binary[None, None].float(), f, stride=f, ceil_mode=True)
            blocks = F.max_pool3d(F.pad(pooled, (0, 1, 0, 1, 0, 1)), 2, stride=1)[0, 0] > 0
            self._coarse_key = key
            edge = (self.aabb[1] - self.aabb[0]) / self.resolution * f
            box = self.occupied_aabb()
            # host sync, once per change of the grid: the march's group length and padded group count,
            # and whether any cell is occupied
            sizes = torch.cat([edge, box[1] - box[0], self.binary.any().to(edge.dtype)[None]]).tolist()
            mc = blocks.shape[0]  # the coarse cells' extent, as coarse_cells uses it (made once per change)
            extent = (self.aabb[1] - self.aabb[0]) * (mc * f / self.resolution)
            self._coarse = (blocks, edge, box, min(sizes[:3]), math.sqrt(sum(e * e for e in sizes[3:6])),
                            sizes[6] == 0.0, extent)
        return self._coarse[:2]

    def coarse_edge(self) -> float:
        """The smallest coarse cell edge, a Python float (cached with :meth:`coarse`)."""
        self.coarse()
        return self._coarse[3]

    def occupied_diagonal(self) -> float:
        """Diagonal of :meth:`occupied_box`, a Python float (cached with :meth:`coarse`): no
        segment inside the box is longer."""
        self.coarse()
        return self._coarse[4]

    def is_empty(self) -> bool:
        """Whether no cell is occupied, a Python bool (cached with :meth:`coarse`: read with the
        march's sizes, once per change of the grid)."""
        self.coarse()
        return self._coarse[5]

    def occupied_box(self) -> torch.Tensor:
        """(2, 3) float32 box around the occupied cells (cached; see :meth:`occupied_aabb`)."""
        self.coarse()
        return self._coarse[2]

    def occupied_box_within(self, box: torch.Tensor) -> torch.Tensor:
        """(2, 3) float32 :meth:`occupied_box` intersected with ``box`` ((2, 3) float32), cached.

        Clipping a segment to it equals clipping it to ``box`` and then to the occupied box, to the
        bit (the slab test's entry and exit are monotone in the box's faces, so the faces' maximum
        and minimum give the maximum and minimum of the two clips' parameters): one clip instead of
        two per march. Where the boxes are disjoint along an axis, the face at that axis's upper side
        is moved to the lower one (a box of zero width): every segment comes out empty, as from the
        two clips, and no size is read to find out.
        """
        occupied = self.occupied_box()
        key = (self._coarse_key, box.data_ptr(), box._version)
        if getattr(self, "_within_key", None) != key:
            lo = torch.maximum(box[0], occupied[0])
            self._within = torch.stack([lo, torch.maximum(torch.minimum(box[1], occupied[1]), lo)])
            self._within_key = key
        return self._within

    def coarse_blocks(self, starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """Whether a straight segment may touch an occupied coarse cell (conservative).

        A segment no longer than the smallest coarse cell edge crosses at most one cell
        plane per axis, so every coarse cell it touches lies in the 2 x 2 x 2 block of
        coarse cells starting at the smaller of its two ends' cell indices on each axis;
        one lookup in :meth:`coarse`'s block grid tests it. Ends outside the box are
        clamped to its border cells, which keeps the part inside the box covered.

        Args:
            starts, ends: (Q, 3) float segment end points, each segment no longer than
                ``coarse()[1].min()``.
        Returns:
            (Q,) bool.
        """
        return self.coarse_lookup(torch.minimum(self.coarse_cells(starts), self.coarse_cells(ends)))

    def coarse_cells(self, points: torch.Tensor) -> torch.Tensor:
        """(..., 3) float points -> (..., 3) int64 coarse cell indices, clamped to the grid."""
        mc = self.coarse()[0].shape[0]
        aabb = self.aabb.to(points.dtype)
        extent = self._coarse[6]  # the coarse cells may overhang the box (ceil)
        if extent.dtype != points.dtype:  # as computed in the points' precision
            f = min(COARSE_FACTOR, self.resolution)
            extent = (aabb[1] - aabb[0]) * (mc * f / self.resolution)
        return ((points - aabb[0]) / extent * mc).floor().long().clamp(0, mc - 1)

    def coarse_lookup(self, lo: torch.Tensor) -> torch.Tensor:
        """(..., 3) int64 coarse cell indices -> (...) bool: may the 2 x 2 x 2 coarse cells
        from ``lo`` hold an occupied cell (:meth:`coarse`)."""
        blocks, _ = self.coarse()
        mc = blocks.shape[0]
        if sync_free(lo.device):  # as _lookup: fewer operators on the CUDA paths, the faster form on the CPU
            flat = (lo * _strides(mc, lo.device)).sum(-1)
        else:
            flat = (lo[..., 0] * mc + lo[..., 1]) * mc + lo[..., 2]
        return blocks.reshape(-1).index_select(0, flat.reshape(-1)).view(flat.shape)

    @torch.no_grad()
    def set_from_alpha(self, alpha: torch.Tensor, threshold: float, dilation: int = 1) -> None:
        """Occupied where the (dilated) opacity of a cell exceeds ``threshold``.

        Args:
            alpha: (M, M, M) float opacity of one marching step at each cell.
            threshold: opacity below which a cell is empty.
            dilation: cells of max-pool dilation so that surfaces are not clipped.
        """
        if dilation > 0:
            k = 2 * dilation + 1
            alpha = F.max_pool3d(alpha[None, None], k, stride=1, padding=dilation)[0, 0]
        self.set_binary(alpha > threshold)

    def set_binary(self, occupied: torch.Tensor) -> None:
        """Occupied where ``occupied`` is: (M, M, M) bool, computed by the caller."""
        if occupied.shape != self.binary.shape:
            self.binary = torch.zeros(occupied.shape, dtype=torch.bool, device=self.binary.device)
        self.binary.copy_(occupied)

    def resize(self, aabb: torch.Tensor, resolution: int) -> None:
        """Reset to all-occupied at a new box and resolution (after a grid change)."""
        if self.contracted:
            assert torch.equal(aabb.float().to(self.aabb.device), self.aabb), "a contracted grid keeps its box"
        self.aabb = aabb.clone().float().to(self.aabb.device)
        self.binary = torch.ones((resolution,) * 3, dtype=torch.bool, device=self.binary.device)

    def occupied_aabb(self) -> torch.Tensor:
        """(2, 3) float32 box around the occupied cells (the whole box if none).

        From the first and last occupied slab along each axis (``argmax`` of the slabs'
        occupancy, first and last index), so the box stays on the device (no ``nonzero``).
        """
        m = self.resolution
        first, end = [], []
        for axis in range(3):
            slabs = self.binary.any(dim=[a for a in range(3) if a != axis]).to(torch.uint8)  # (M,)
            first.append(slabs.argmax())  # the first maximum: the first occupied slab
            end.append(m - slabs.flip(0).argmax())  # one past the last occupied slab
        cell = (self.aabb[1] - self.aabb[0]) / m
        box = self.aabb[0] + torch.stack([torch.stack(first), torch.stack(end)]) * cell
        return torch.where(self.binary.any(), box, self.aabb)


def _expand(counts: torch.Tensor, total: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Row of each of ``sum(counts)`` items and its rank within its row: (N,), (N,) int64.

    Without ``total`` (N, when the caller knows it) the size is read from the device: a host sync.
    """
    rows = torch.repeat_interleave(torch.arange(counts.shape[0], device=counts.device), counts,
                                   output_size=total)
    starts = torch.cumsum(counts, 0) - counts
    return rows, torch.arange(rows.shape[0], device=counts.device) - starts.index_select(0, rows)


def grid_edges(anchor: torch.Tensor, dt: torch.Tensor, j: torch.Tensor,
               breaks: torch.Tensor | None = None) -> torch.Tensor:
    """Ray parameter of edge ``j`` of the global sample grid (all (N,)): ``anchor + j dt``,
    in the spacing parameter of :mod:`~distnerf.renderer.contraction` when ``breaks`` (N,)
    is given (then mapped back to a ray parameter; inf past the spacing's end)."""
    s = anchor + j.to(anchor.dtype) * dt
    return s if breaks is None else from_spacing(s, breaks)


def grid_index(t: torch.Tensor, anchor: torch.Tensor, dt: torch.Tensor,
               breaks: torch.Tensor | None = None) -> torch.Tensor:
    """(N,) int64 index of the sample-grid interval holding ray parameter ``t`` (N,): the
    inverse of :func:`grid_edges`, floored."""
    s = t if breaks is None else to_spacing(t, breaks)
    return torch.floor((s - anchor) / dt).long()


def owned_window(t_in: torch.Tensor, t_out: torch.Tensor, t_lo: torch.Tensor, t_hi: torch.Tensor,
                 anchor: torch.Tensor, dt: torch.Tensor, breaks: torch.Tensor | None = None):
    """The part of a ray's march that one region owns: the intervals whose midpoints lie in ``[t_in, t_out)``.

    A ray marched whole over ``[t_lo, t_hi]`` gets the sample-grid intervals clipped to it; its midpoints
    (of the clipped edges) increase along the ray, so the intervals with midpoints in a region's segment
    ``[t_in, t_out)`` are a run ``j_a <= j < j_b``. Marching the window ``[E_{j_a}, E_{j_b}]`` (``E`` the
    clipped edges) gives exactly those intervals, with the whole march's edges and midpoints: regions
    whose segments tile the ray split its samples between them, each sample whole, none twice (``ss``'s
    sharded joint model: :mod:`distnerf.strategy.joint`). A segment's end inside an interval goes to the
    region holding the interval's midpoint.

    Args:
        t_in, t_out: (R,) float the region's segment (empty where ``t_in >= t_out``).
        t_lo, t_hi: (R,) float the whole ray's march (what :func:`march` would clip to; for a contracted
            ray ``t_hi`` already capped by :func:`spacing_end`).
        anchor, dt: (R,) float the sample grid (:func:`grid_edges`). breaks: (R,) float the contracted
            spacing's breaks, or None.
    Returns:
        (w_lo, w_hi): (R,) float, empty (``w_lo >= w_hi``) where the region owns no interval.
    """
    def edge(j):
        return grid_edges(anchor, dt, j, breaks).clamp(t_lo, t_hi)

    def first_owned(t):  # the first interval whose midpoint is at or after t
        j = grid_index(torch.maximum(t, t_lo), anchor, dt, breaks)
        return torch.where(0.5 * (edge(j) + edge(j + 1)) >= t, j, j + 1)

    j_a, j_b = first_owned(t_in), first_owned(t_out)
    w_lo, w_hi = edge(j_a), edge(j_b)
    empty = (t_in >= t_out) | (t_lo >= t_hi)
    return w_lo, torch.where(empty, w_lo, w_hi)


def spacing_end(t_hi: torch.Tensor, anchor: torch.Tensor, dt: torch.Tensor, breaks: torch.Tensor) -> torch.Tensor:
    """(R,) float the segment ends ``t_hi`` (R,) capped where a contracted ray's spacing
    ends: half a step before ``s = 2 b``, so the last interval is finite (the background
    takes what is left behind it)."""
    return torch.minimum(t_hi, from_spacing(2.0 * breaks - 0.5 * dt, breaks))


def _march_spaced(origins, directions, anchor, t_lo, t_hi, step_size: float, occupancy: OccupancyGrid | None,
                  spacing_aabb: torch.Tensor) -> PackedSamples:
    """:func:`march` with the contracted ray spacing: every interval of the segments,
    kept where the occupancy grid (of contracted space) holds its midpoint; two sizes read."""
    num_rays = origins.shape[0]
    dt = step_size / directions.norm(dim=-1)
    breaks = ray_breaks(origins, directions, anchor, spacing_aabb)
    t_hi = spacing_end(t_hi, anchor, dt, breaks)
    valid = t_hi > t_lo
    lo_j = torch.where(valid, grid_index(t_lo, anchor, dt, breaks), 0)
    hi_j = torch.where(valid, torch.ceil((to_spacing(t_hi, breaks) - anchor) / dt).long(), 0)  # exclusive
    ray, rank = _expand((hi_j - lo_j).clamp(min=0))  # host sync: the number of candidate intervals
    j = lo_j.index_select(0, ray) + rank
    b, a, d, lo_r, hi_r = (t.index_select(0, ray) for t in (breaks, anchor, dt, t_lo, t_hi))
    t0 = grid_edges(a, d, j, b).clamp(lo_r, hi_r)
    t1 = grid_edges(a, d, j + 1, b).clamp(lo_r, hi_r)
    keep = t1 > t0
    if occupancy is not None:
        mids = torch.addcmul(origins.index_select(0, ray), directions.index_select(0, ray),
                             (0.5 * (t0 + t1))[:, None])
        keep &= occupancy.query(mids)
    keep = keep.nonzero().view(-1)  # host sync: the number of samples (packed layout)
    return PackedSamples(ray, t0, t1, num_rays).select(keep)


def _march_groups(origins, directions, anchor, dt, t_lo, t_hi, lo_j, hi_j, step_size: float,
                  occupancy: OccupancyGrid, max_intervals: int | None) -> PackedSamples:
    """:func:`march`'s two-level walk (module docstring) of segments inside the occupied box.

    Args: as :func:`march`'s, with ``dt`` (R,) the interval in ray parameter and ``lo_j``, ``hi_j``
    (R,) int64 the first and one past the last interval of each segment (both 0 where it is empty).
    Written for few operators per call (a GPU step's host cost, :mod:`distnerf.observe.ops`): the
    per-ray values are gathered in one ``index_select`` of one (R, 10) table, and each group's
    ``group + 1`` edges are computed once for both ends of its intervals.
    """
    num_rays = origins.shape[0]
    group = max(1, int(math.floor(occupancy.coarse_edge() / step_size)))  # a group is shorter than a coarse cell
    g_lo = torch.div(lo_j, group, rounding_mode="floor")
    g_hi = torch.div(hi_j - 1, group, rounding_mode="floor")  # inclusive; -1 for an empty segment
    # groups in a fixed (R, K) layout sized by Python numbers, so no size is read: a segment
    # inside the occupied box touches n <= diagonal / step_size + 2 intervals (or max_intervals),
    # + 2 of margin for rounding in lo_j, hi_j; n intervals lie in at most (n + group - 2) //
    # group + 1 groups
    bound = occupancy.occupied_diagonal() / step_size + 2
    if max_intervals is not None:
        bound = min(bound, max_intervals)
    num_slots = int((bound + 2 + group - 2) // group) + 1
    # an empty segment has g_hi - g_lo = -1 (lo_j = hi_j = 0): no where needed
    torch._assert_async((g_hi - g_lo < num_slots).all(), "march: more groups than the padded layout holds")
    slot = torch.arange(num_slots + 1, device=origins.device)
    edge_j = (g_lo[:, None] + slot) * group  # (R, K + 1) first interval of each group; group k spans edges k, k + 1
    edges = grid_edges(anchor[:, None], dt[:, None], edge_j).clamp(t_lo[:, None], t_hi[:, None])
    cells = occupancy.coarse_cells(origins[:, None] + directions[:, None] * edges[..., None])  # (R, K + 1, 3)
    # coarse_blocks of each group's two ends, each end's cell computed once
    keep = occupancy.coarse_lookup(torch.minimum(cells[:, :-1], cells[:, 1:]))  # (R, K)
    first = torch.maximum(edge_j[:, :-1], lo_j[:, None])
    last = torch.minimum(edge_j[:, 1:], hi_j[:, None])
    # host sync: the number of groups that may touch occupied space (a slot past a segment's last group has
    # last <= first); their intervals are tested in a dense (groups, group) layout: per-ray values are
    # gathered once per group, not per interval
    picked = (keep & (last > first)).view(-1).nonzero().view(-1)
    ray = torch.div(picked, num_slots, rounding_mode="floor")
    first = first.view(-1).index_select(0, picked)
    cell_origins, cell_directions = occupancy.ray_cells(origins, directions)
    per_ray = torch.cat([anchor[:, None], dt[:, None], t_lo[:, None], t_hi[:, None], cell_origins, cell_directions],
                        dim=1).index_select(0, ray)  # (groups, 10)
    a, d, lo_r, hi_r = per_ray[:, 0:1], per_ray[:, 1:2], per_ray[:, 2:3], per_ray[:, 3:4]
    rank = torch.arange(group + 1, device=origins.device)
    edges = grid_edges(a, d, first[:, None] + rank).clamp(lo_r, hi_r)  # (groups, group + 1)
    t0, t1 = edges[:, :-1], edges[:, 1:]
    keep = (t1 > t0) & (rank[:-1] < (last.view(-1).index_select(0, picked) - first)[:, None])
    mids = torch.addcmul(per_ray[:, None, 4:7], per_ray[:, None, 7:10],
                         (0.5 * (t0 + t1))[..., None])  # (groups, group, 3) midpoints in cell units
    keep &= _lookup(mids.view(-1, 3), occupancy.binary).view(keep.shape)
    # host sync: the number of samples (packed layout); (sample, 2) [group, interval] pairs, row-major
    keep = keep.nonzero()
    flat = keep[:, 0] * (group + 1) + keep[:, 1]  # the interval's first edge in ``edges``
    edges = edges.view(-1)
    return PackedSamples(ray.index_select(0, keep[:, 0]), edges.index_select(0, flat),
                         edges.index_select(0, flat + 1), num_rays)


def interval_bounds(t_lo: torch.Tensor, t_hi: torch.Tensor, anchor: torch.Tensor, dt: torch.Tensor,
                    valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The sample-grid intervals a segment touches: (R,) int64 first and one past the last,
    ``floor((t_lo - anchor) / dt)`` and ``ceil((t_hi - anchor) / dt)``, both 0 where the segment is empty
    (``t_hi <= t_lo``, or not ``valid`` when given). Both ends at once, ``ceil(x)`` as ``-floor(-x)`` (exact);
    the mask a product, not a where (one operator, no scalar tensor)."""
    valid = t_hi > t_lo if valid is None else valid
    ends = torch.floor(torch.stack([t_lo - anchor, anchor - t_hi]) / dt).long() * valid
    return ends[0], -ends[1]


def occupied_intervals(anchor: torch.Tensor, dt: torch.Tensor, t_lo: torch.Tensor, t_hi: torch.Tensor,
                       lo_j: torch.Tensor, counts: torch.Tensor, num_slots: int, cell_origins: torch.Tensor,
                       cell_directions: torch.Tensor, binary: torch.Tensor):
    """Every interval of R segments in a fixed (R, K) layout (K = ``num_slots``, a Python number) and whether
    it is kept: inside its segment, of non-zero length, its midpoint in an occupied cell. Interval ``k`` of
    ray ``r`` is grid interval ``lo_j[r] + k``, clipped to ``[t_lo, t_hi]`` (:func:`interval_bounds`);
    the dense march, the static step's and evaluation's fixed rounds all lay out intervals this way.

    Args:
        anchor, dt, t_lo, t_hi: (R,) float. lo_j: (R,) int64 first interval; counts: (R,) int64 intervals
        of each segment (``hi_j - lo_j``, often needed by the caller too). cell_origins, cell_directions: (R, 3)
        the rays in cell units (:meth:`OccupancyGrid.ray_cells`). binary: (M, M, M) bool occupancy.
    Returns:
        edges: (R, K + 1) float clipped interval edges (interval ``k`` is ``[edges[:, k], edges[:, k + 1]]``);
        keep: (R, K) bool; t_mids: (R, K) float interval midpoints.
    """
    rank = torch.arange(num_slots + 1, device=anchor.device)
    edges = grid_edges(anchor[:, None], dt[:, None], lo_j[:, None] + rank).clamp(t_lo[:, None], t_hi[:, None])
    t0, t1 = edges[:, :-1], edges[:, 1:]
    keep = (t1 > t0) & (rank[:-1] < counts[:, None])
    t_mids = 0.5 * (t0 + t1)
    mids = torch.addcmul(cell_origins[:, None], cell_directions[:, None], t_mids[..., None])  # cell units
    keep &= _lookup(mids.view(-1, 3), binary).view(keep.shape)
    return edges, keep, t_mids


def _march_dense(origins, directions, anchor, dt, t_lo, t_hi, lo_j, hi_j, step_size: float,
                 occupancy: OccupancyGrid, max_intervals: int | None) -> PackedSamples:
    """:func:`_march_groups`'s samples, bit for bit, without its coarse level: every interval of every
    segment in a fixed (R, K) layout is tested against the grid (the walk's groups only skip intervals
    whose midpoints the fine test would reject too). More work (about 4x the intervals' lookups on a
    scene like lego) in a third of the operators: the walk of the CUDA paths
    (:func:`~distnerf.host_buffers.sync_free`), where a step's operators, not its arithmetic, set its
    pace; the CPU keeps the two-level walk. Arguments as :func:`_march_groups`'s.
    """
    num_rays = origins.shape[0]
    # K intervals per segment at most, sized by Python numbers (no size read): as _march_groups's bound
    bound = occupancy.occupied_diagonal() / step_size + 2
    if max_intervals is not None:
        bound = min(bound, max_intervals)
    num_slots = int(bound + 2) + 1
    counts = hi_j - lo_j  # (R,) intervals of each segment (0 where it is empty)
    torch._assert_async((counts <= num_slots).all(), "march: more intervals than the padded layout holds")
    edges, keep, _ = occupied_intervals(anchor, dt, t_lo, t_hi, lo_j, counts, num_slots,
                                        *occupancy.ray_cells(origins, directions), occupancy.binary)
    keep = keep.view(-1).nonzero().view(-1)  # host sync: the number of samples (packed layout)
    ray = torch.div(keep, num_slots, rounding_mode="floor")
    first = keep + ray  # the interval's first edge in ``edges`` (K + 1 a row)
    edges = edges.view(-1)
    return PackedSamples(ray, edges.index_select(0, first), edges.index_select(0, first + 1), num_rays)


def march(origins: torch.Tensor, directions: torch.Tensor, anchor: torch.Tensor, t_lo: torch.Tensor,
          t_hi: torch.Tensor, step_size: float, occupancy: OccupancyGrid | None,
          max_intervals: int | None = None, spacing_aabb: torch.Tensor | None = None,
          inside_occupied_box: bool = False) -> PackedSamples:
    """Packed samples of ray segments on the global sample grid, in occupied space only.

    Args:
        origins, directions: (R, 3) float rays (directions need not be unit; NDC).
        anchor: (R,) float ray parameter of grid edge 0 (``near + u dt``, u in [0, 1):
            a jitter; ``near`` at evaluation).
        t_lo, t_hi: (R,) float segment to sample; empty where ``t_lo >= t_hi``.
        step_size: interval length as a distance in the scene's space (world or NDC units).
        occupancy: grid whose occupied cells are sampled, or None (sample the whole segment).
        max_intervals: a bound, known to the caller, of the grid intervals any segment
            touches (partial ones at its ends included), e.g. an evaluation round's; it
            sizes the padded group layout with the occupied box's diagonal (the bound
            without it). Ignored without ``occupancy``.
        spacing_aabb: (2, 3) unit region of a contracted field, or None. With it the
            grid's intervals are even in the spacing parameter of
            :mod:`~distnerf.renderer.contraction` (steps growing with distance beyond the
            box, ``t_hi`` may be inf), ``occupancy`` must cover that contraction, and
            every interval is tested against it (no two-level walk: the walk's straight
            segments are curves in contracted space).
        inside_occupied_box: the caller has already clipped the segments to
            ``occupancy.occupied_box()`` (evaluation rounds: once per ray, not once per round),
            so the march does not clip them again.
    Returns:
        PackedSamples: the grid intervals clipped to ``[t_lo, t_hi]`` (zero-length
        pieces dropped) whose midpoints are occupied; they tile the segment's occupied
        part, with partial intervals at its two ends.
    """
    if spacing_aabb is not None or (occupancy is not None and occupancy.contracted):
        assert spacing_aabb is not None, "march: a contracted occupancy grid needs the contracted spacing"
        return _march_spaced(origins, directions, anchor, t_lo, t_hi, step_size, occupancy, spacing_aabb)
    num_rays = origins.shape[0]
    dt = step_size / directions.norm(dim=-1)
    if occupancy is not None and not inside_occupied_box:  # nothing outside the occupied cells' box is sampled
        t_lo, t_hi = clip_to_box(origins, directions, t_lo, t_hi, occupancy.occupied_box().to(origins.dtype))
    lo_j, hi_j = interval_bounds(t_lo, t_hi, anchor, dt)  # first interval, one past the last
    if occupancy is not None:
        walk = _march_dense if sync_free(origins.device) else _march_groups
        return walk(origins, directions, anchor, dt, t_lo, t_hi, lo_j, hi_j, step_size, occupancy, max_intervals)
    ray, rank = _expand((hi_j - lo_j).clamp(min=0))  # host sync: the number of samples
    j = lo_j.index_select(0, ray) + rank
    a, d, lo_r, hi_r = (t.index_select(0, ray) for t in (anchor, dt, t_lo, t_hi))
    t0 = grid_edges(a, d, j).clamp(lo_r, hi_r)
    t1 = grid_edges(a, d, j + 1).clamp(lo_r, hi_r)
    keep = (t1 > t0).nonzero().view(-1)  # host sync: the number of samples (packed layout)
    return PackedSamples(ray, t0, t1, num_rays).select(keep)
