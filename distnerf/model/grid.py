"""Voxel-grid radiance field (DVGO / Plenoxels style), the CPU-practical default.

Legend: P evaluated samples, C feature channels, N grid resolution per axis
(vertices), V = N^3 vertices (with ``cubic_voxels``: (n_x, n_y, n_z) per axis, about N^3 in
all, :func:`voxel_shape`).

Two vertex tables in x-major order (vertex ``(i, j, k)`` is row ``(i n_y + j) n_z + k``):
a raw density (V, 1) and colour features (V, C), trilinearly interpolated by
gathering the 8 corner rows (channels-last, so one fused ``embedding_bag`` moves C
contiguous floats per corner; the backward is a scatter, or sparse rows).

* Density: DVGO's shifted softplus (Sun et al. 2022, Eq. 5-6) in units of the
  *final* voxel size, so a resolution change keeps the field unchanged; sigma is per
  unit of distance (world, or NDC for LLFF).
* Colour: spherical harmonics of the features (``color=sh``) or a tiny MLP on the
  features and the encoded view direction (``color=mlp``, DVGO Sec. 5), evaluated only
  where a sample's compositing weight exceeds ``color_threshold`` (DVGO's "fast colour
  threshold").
* Rendering: packed samples, early ray termination and the colour threshold of
  :class:`~distnerf.model.marched.MarchingModel`, marching ``grid_aabb`` with a step of
  ``step_ratio`` x the smallest voxel edge.
* Empty space is skipped with an occupancy grid derived from the density (the voxels
  themselves, from their largest corner density; :meth:`GridModel.update_occupancy`).
* Coarse to fine: at ``upsample_steps`` the tables are resampled to the next of
  ``resolutions`` inside a box tightened around the occupied cells.
* Total variation on the density (Plenoxels, Fridovich-Keil et al. 2022, Eq. 3), its
  gradient in closed form (:func:`total_variation_grad_`).
* Focus box (``focus_aabb``, the sub-scene models of ``strategy=ss``): the tables
  above cover only the focus box, at full resolution, and a second pair of tables at
  ``context_resolution`` covers the rest of the scene box, so that the model can
  explain whole pixels while its memory goes mostly to its own region. Rays are
  marched through the whole scene box with the focus box's step; the box is not
  tightened.
"""
from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ..renderer.contraction import contracted_box, world_step_scale
from ..renderer.occupancy import OccupancyGrid
from ..config_check import section
from ..host_buffers import sync_free
from ..schema import GridModelConfig
from .appearance import LR_SCALE, build_appearance
from .encoding import PositionalEncoding
from .marched import MarchingModel

SHELL_SCALE_CAP = 64.0
"""Largest world length of a contracted unit step (``r^2``, ``r`` = 8 box units) that the initial
density compensates (:meth:`GridModel._even_shell_density_`)."""

def voxel_shape(resolution: int, box: torch.Tensor | None = None, cubic: bool = False) -> tuple[int, int, int]:
    """Vertices per axis of a table at schedule resolution N over ``box``.

    Without ``cubic``: N on every axis, whatever the box's shape (a voxel is as long as its
    box's side over N - 1). With ``cubic``: about the same vertex count with voxel edges
    equal on every axis, ``n_a = max(2, round((N - 1) e_a / g) + 1)`` for the box's side
    lengths ``e_a`` and their geometric mean ``g``, so that ``prod(n_a - 1) ~ (N - 1)^3`` on
    any box. (A region box of ``strategy=ss`` is a half or a quarter of the scene box: N^3
    vertices there refine only the split axes, and a band-limited field is resolved by its
    coarsest axis.) Each ``n_a`` is non-decreasing in N.

    Args:
        resolution: N >= 2. box: (2, 3) float box [min, max] (any units); needed with ``cubic``.
    Returns:
        (n_x, n_y, n_z) Python ints, each >= 2.
    """
    n = int(resolution)
    if not cubic:
        return (n, n, n)
    extent = [float(e) for e in (box[1] - box[0]).tolist()]
    mean = math.prod(extent) ** (1 / 3)
    return tuple(max(2, round((n - 1) * e / mean) + 1) for e in extent)


def trilinear_corners(x: torch.Tensor, resolution: int | tuple[int, int, int]):
    """Corner rows and weights of trilinear interpolation on an x-major vertex table.

    Args:
        x: (P, 3) float positions in [0, 1] over the grid box (clamped).
        resolution: N vertices per axis, or (n_x, n_y, n_z) (each >= 2).
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
    lin = (base[:, 0] * ny + base[:, 1]) * nz + base[:, 2]  # (P,) row of corner (0, 0, 0)
    c = torch.arange(8, device=x.device)  # corner (i, j, k) = the binary digits of c; made on the device, as
    offsets = ((c >> 2) * ny + ((c >> 1) & 1)) * nz + (c & 1)  # torch.tensor(list, device=) is a blocking copy
    index = lin[:, None] + offsets  # (P, 8), corners in (i, j, k) binary order
    fx, fy, fz = frac.unbind(1)
    gx, gy, gz = 1 - fx, 1 - fy, 1 - fz
    # the 8 products column by column (a broadcast outer product of (P, 2) factors is ~6x slower on the CPU)
    xy = (gx * gy, gx * fy, fx * gy, fx * fy)  # (i, j) = (0, 0), (0, 1), (1, 0), (1, 1)
    weights = torch.stack([w * z for w in xy for z in (gz, fz)], dim=1)  # (P, 8) in (i, j, k) binary order
    return index, weights


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
        flat = (index[..., None] * channels + torch.arange(channels, device=index.device)).reshape(-1)
        contrib = (weights[..., None] * grad_out[:, None, :].to(weights.dtype)).reshape(-1)
        grad_table = torch.zeros(num_rows * channels, dtype=grad_out.dtype, device=grad_out.device)
        grad_table.scatter_add_(0, flat, contrib.to(grad_out.dtype))
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


def spherical_harmonics(dirs: torch.Tensor, degree: int) -> torch.Tensor:
    """Real spherical-harmonic basis up to ``degree`` (<= 2), as in Plenoxels / PlenOctrees.

    Args:
        dirs: (P, 3) float unit directions.
    Returns:
        (P, (degree + 1)^2) basis values.
    """
    x, y, z = dirs.unbind(-1)
    out = [torch.full_like(x, 0.28209479177387814)]
    if degree >= 1:
        out += [-0.4886025119029199 * y, 0.4886025119029199 * z, -0.4886025119029199 * x]
    if degree >= 2:
        out += [1.0925484305920792 * x * y, -1.0925484305920792 * y * z,
                0.31539156525252005 * (2 * z * z - x * x - y * y), -1.0925484305920792 * x * z,
                0.5462742152960396 * (x * x - y * y)]
    if degree > 2:
        raise ValueError(f"spherical harmonics degree {degree} > 2 is not supported")
    return torch.stack(out, dim=-1)


def interpolate(table: torch.Tensor, index: torch.Tensor, weights: torch.Tensor, sparse: bool = False) -> torch.Tensor:
    """Trilinear interpolation, differentiable w.r.t. ``table`` only.

    Args:
        table: (V, C) float vertex values. index, weights: (P, 8) from :func:`trilinear_corners`.
        sparse: the table's gradient is a sparse COO tensor of the touched rows.
    Returns:
        (P, C) interpolated values.
    """
    return _Interpolate.apply(table, index, weights, sparse)


class GridModel(MarchingModel):
    """Dense voxel grid with a tiny colour MLP.

    Args:
        aabb, background: see :class:`RadianceModel`.
        cfg, options: the keys of :class:`~distnerf.schema.GridModelConfig` (a mapping and/or
            keywords; defaults there):
        resolutions: vertex resolutions of the coarse-to-fine schedule, e.g. [64, 128, 160].
        upsample_steps: training steps at which to move to the next resolution.
        num_features: C. hidden_width, viewdir_frequencies: colour MLP.
        step_ratio: marching step as a fraction of the smallest voxel edge of the current
            resolution (a distance in world, or NDC, units).
        alpha_init: initial opacity of one step of the final resolution.
        occupancy_threshold / occupancy_every: empty-space skipping.
        occupancy_threshold_final: the threshold at the final resolution, or None
            (:meth:`current_occupancy_threshold`).
        color_threshold: samples with a smaller compositing weight get no colour.
        termination: transmittance below which a ray stops (early ray termination); in training
            only with ``train_termination`` or ``train_round_steps``
            (:meth:`~distnerf.model.marched.MarchingModel.current_termination`).
        sparse_grad: the colour-feature tables get sparse row gradients (only the rows a
            step touched; trained by :class:`~distnerf.components.optim.LazyAdam`); strategies
            that all-reduce dense buckets turn it off (``RadianceModel.sparse_grad``). On CUDA
            (:func:`~distnerf.host_buffers.sync_free`) the gradients stay dense: the touched rows'
            count is a host sync there, and a dense Adam step over the table is a fraction of a
            millisecond of device bandwidth (untouched rows then follow Adam, as under multi-rank ``ddp``).
        eval_round_steps, train_round_steps: sample-grid intervals marched per round at
            evaluation and in training (0: one pass).
        tv_weight: weight of the density total-variation regulariser.
        tighten_aabb: shrink the box to the occupied region at each upsampling.
        cubic_voxels: equal voxel edges on every axis (:func:`voxel_shape`): the full-resolution
            tables hold about N^3 vertices spread over the axes in proportion to the box's sides,
            instead of N per axis; for boxes that are not cubes (``ss`` region boxes).
        focus_aabb: (2, 3) box holding the full-resolution tables, or None (the whole
            scene box). context_resolution: vertices per axis of the context tables
            that cover the scene box outside the focus box.
        appearance, appearance_dim: per-image appearance (:mod:`.appearance`; ``embedding``
            needs ``color=mlp``). num_images: training images (rows of its table).
    """

    holds_focus = True

    def __init__(self, aabb, background, cfg=None, *, focus_aabb=None, context_resolution: int | None = None,
                 num_images: int = 0, **options):
        c = section(GridModelConfig, cfg, **options)  # the keys above; defaults: distnerf/schema.py
        resolutions, upsample_steps, num_features = list(c.resolutions), list(c.upsample_steps), c.num_features
        step_ratio, alpha_init, color, sh_degree = c.step_ratio, c.alpha_init, c.color, c.sh_degree
        termination, eval_round_steps, sparse_grad = c.termination, c.eval_round_steps, c.sparse_grad
        occupancy_threshold, occupancy_every = c.occupancy_threshold, c.occupancy_every
        color_threshold, tv_weight, tighten_aabb = c.color_threshold, c.tv_weight, c.tighten_aabb
        hidden_width, viewdir_frequencies = c.hidden_width, c.viewdir_frequencies
        if focus_aabb is not None and context_resolution is None:
            raise ValueError("GridModel: a focus_aabb needs context_resolution (strategy.context_resolution)")
        super().__init__(aabb, background)
        self._geometry_key = None  # what the cached (resolution, marching step) was computed for
        self.termination, self.eval_round_steps = float(termination), int(eval_round_steps)
        self.train_round_steps, self.distortion_loss_weight = int(c.train_round_steps), float(c.distortion_loss_weight)
        self.train_termination = bool(c.train_termination)
        self.sparse_grad = bool(sparse_grad)
        if len(upsample_steps) != len(resolutions) - 1:
            raise ValueError(f"model.upsample_steps ({list(upsample_steps)}) needs one entry per "
                             f"resolution change of model.resolutions ({list(resolutions)})")
        self.resolutions, self.upsample_steps = list(resolutions), list(upsample_steps)
        self.step_ratio, self.occupancy_threshold = step_ratio, occupancy_threshold
        self.occupancy_threshold_final = c.occupancy_threshold_final
        self.occupancy_every, self.color_threshold = occupancy_every, color_threshold
        self.init_contraction(c)
        # a contracted grid covers all of space: its box stays the doubled box (never tightened)
        self.tv_weight = tv_weight
        self.tighten_aabb = tighten_aabb and focus_aabb is None and self.contraction_aabb is None
        self.register_buffer("focus", None if focus_aabb is None else
                             torch.as_tensor(focus_aabb, dtype=torch.float32).reshape(2, 3).clone())
        box = self._context_box() if self.focus is None else self.focus
        # density unit: the smallest voxel edge of the final resolution, the edge the march step is
        # measured in (step_size), so one step of the final grid starts at opacity alpha_init on any
        # box shape. (It was the largest edge / resolution: on a flat box, such as an aerial capture's,
        # the first steps started below color_threshold, no sample got a colour and nothing learned.)
        self.cubic_voxels = bool(c.cubic_voxels)
        final = voxel_shape(self.resolutions[-1], box, self.cubic_voxels)
        self.base_voxel = min(float(e) / (m - 1) for e, m in zip((box[1] - box[0]).tolist(), final))
        # softplus(shift) * step / base_voxel = -log(1 - alpha_init) at step = step_ratio voxels
        self.density_shift = math.log(math.expm1(-math.log(1.0 - alpha_init) / step_ratio))
        self.color, self.sh_degree = color, sh_degree
        if color == "sh":
            num_features = 3 * (sh_degree + 1) ** 2
        n = self.resolutions[0]
        vertices = math.prod(voxel_shape(n, box, self.cubic_voxels))
        self.density = nn.Parameter(torch.zeros(vertices, 1))
        self.features = nn.Parameter(torch.zeros(vertices, num_features))
        self.dir_encoding = PositionalEncoding(viewdir_frequencies)
        self.appearance = build_appearance(c.appearance, num_images, c.appearance_dim, color == "mlp")
        latent_dim = self.appearance.latent_dim if self.appearance is not None else 0
        self.color_net = nn.Sequential(
            nn.Linear(num_features + self.dir_encoding.output_dim(3) + latent_dim, hidden_width), nn.ReLU(),
            nn.Linear(hidden_width, hidden_width), nn.ReLU(),
            nn.Linear(hidden_width, 3)) if color == "mlp" else nn.Identity()
        if self.focus is not None:
            c = int(context_resolution)
            self.context_density = nn.Parameter(torch.zeros(c ** 3, 1))
            self.context_features = nn.Parameter(torch.zeros(c ** 3, num_features))
        self.register_buffer("grid_aabb", self._context_box().clone())
        self.register_buffer("grid_resolution", torch.tensor(n))
        self.occupancy = OccupancyGrid(self.grid_aabb, n, contraction_aabb=self.contraction_aabb)
        assert torch.equal(self.occupancy.aabb, self.grid_aabb), "one contracted range for tables and occupancy"
        if self.contraction_aabb is not None and c.shell_alpha_init:
            self._even_shell_density_()

    @torch.no_grad()
    def _even_shell_density_(self) -> None:
        """Start every marching step at opacity ``alpha_init``, in the contracted shell too.

        A unit step of the contracted spacing spans ``world_step_scale`` (``r^2``) world units in
        the shell, so a density even in world units starts a shell step ``r^2`` times as opaque
        as one in the box: on an aerial capture whose cameras sit in the shell, the air in front
        of the scene and the shell behind its ground started as fog that the first steps
        painted the images on. Each vertex's raw density is lowered so that ``sigma x scale`` is
        the box's ``sigma`` (``softplus(raw + shift) = softplus(shift) / scale``); the scale is
        capped at :data:`SHELL_SCALE_CAP` (beyond ``r`` = 8 box units, the sky's far shell keeps
        raw densities from which a few steps reach opacity)."""
        for table, _, shape, box in self._tables():
            axis = [torch.linspace(float(box[0, a]), float(box[1, a]), shape[a]) for a in range(3)]
            vertices = torch.stack(torch.meshgrid(*axis, indexing="ij"), dim=-1).reshape(-1, 3)
            scale = world_step_scale(vertices, self.contraction_aabb.cpu()).clamp(max=SHELL_SCALE_CAP)
            target = F.softplus(torch.tensor(self.density_shift)) / scale
            raw = torch.log(torch.expm1(target)) - self.density_shift
            table.copy_(raw.view_as(table).to(table))

    # ---------------------------------------------------------------- state
    @property
    def resolution(self) -> int:
        """N, the schedule's vertices per axis now (``model.resolutions``); the table's own
        counts per axis are :attr:`shape`."""
        return self._geometry()[0]

    @property
    def shape(self) -> tuple[int, int, int]:
        """(n_x, n_y, n_z) vertices per axis of the full-resolution tables now (:func:`voxel_shape`)."""
        return self._geometry()[2]

    def num_vertices(self, resolution: int) -> int:
        """Rows of the full-resolution tables at schedule resolution ``resolution`` on the
        current table box (the parameter budget's count, :mod:`.budget`)."""
        return math.prod(voxel_shape(resolution, self._table_box(), self.cubic_voxels))

    def _geometry(self) -> tuple[int, float, tuple[int, int, int]]:
        """(resolution, marching step, table shape) as Python numbers, recomputed only when the
        grid changes (upsampling, loading a state), so the hot path reads no tensor."""
        key = (self.grid_resolution._version, self._table_box()._version, self._table_box().data_ptr(),
               self.grid_resolution.data_ptr())
        if self._geometry_key != key:
            box = self._table_box()
            n = int(self.grid_resolution)
            shape = voxel_shape(n, box, self.cubic_voxels)
            extent = (box[1] - box[0]).tolist()
            if len(set(shape)) == 1:  # the smallest side over the count (this order of operations: the same step as ever)
                step = self.step_ratio * min(extent) / (shape[0] - 1)
            else:
                step = self.step_ratio * min(e / (m - 1) for e, m in zip(extent, shape))
            self._geometry_cache = (n, step, shape)
            self._geometry_key = key
        return self._geometry_cache

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # match the saved resolution before tensors are copied
        saved = state_dict.get(prefix + "density")
        if saved is not None and saved.shape != self.density.shape:
            self.density = nn.Parameter(torch.zeros_like(saved))
            self.features = nn.Parameter(self.features.new_zeros(saved.shape[0], self.features.shape[1]))
        occ = state_dict.get(prefix + "occupancy.binary")
        if occ is not None and occ.shape != self.occupancy.binary.shape:
            self.occupancy.binary = torch.ones_like(occ)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _context_box(self) -> torch.Tensor:
        """(2, 3) box of the whole field's coordinates: the scene box, or for a contracted
        field the doubled box of contracted space (:meth:`field_coordinates`)."""
        return self.aabb if self.contraction_aabb is None else contracted_box(self.aabb)

    def _table_box(self) -> torch.Tensor:
        """(2, 3) box of the full-resolution tables: the focus box, else ``grid_aabb``."""
        return self.focus if self.focus is not None else self.grid_aabb

    def _tables(self) -> list[tuple[nn.Parameter, nn.Parameter, tuple[int, int, int], torch.Tensor]]:
        """(density, features, vertices per axis, box) of each table pair, full resolution first."""
        out = [(self.density, self.features, self.shape, self._table_box())]
        if self.focus is not None:
            c = round(self.context_density.shape[0] ** (1 / 3))
            out.append((self.context_density, self.context_features, (c, c, c), self._context_box()))
        return out

    def bounded_parameters(self) -> list[nn.Parameter]:
        """The vertex tables: read only by trilinear interpolation (8 corner rows per point), so
        their loss gradient is non-zero in the rows read (:meth:`RadianceModel.gradient_entry_bounds`)."""
        return [t for d, f, _, _ in self._tables() for t in (d, f)]

    def param_groups(self, lr: float) -> list[dict]:
        """Tables at ``lr`` * 100 (DVGO uses 0.1 for grids and 1e-3 for the MLP)."""
        groups = [{"params": self.bounded_parameters(), "lr": lr * 100.0, "name": "grid"}]
        if self.color == "mlp":
            groups.append({"params": list(self.color_net.parameters()), "lr": lr, "name": "color_net"})
        if self.appearance is not None:
            groups.append({"params": [self.appearance.table], "lr": lr * LR_SCALE, "name": "appearance"})
        return groups

    # ---------------------------------------------------------------- field
    def _corners(self, points: torch.Tensor):
        box = self._table_box()
        return trilinear_corners((points - box[0]) / (box[1] - box[0]), self.shape)

    def _colours(self, feats: torch.Tensor, viewdirs: torch.Tensor, ray_idx: torch.Tensor | None,
                 image_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(P, C) features + view directions -> (P, 3) RGB in [0, 1] (with ``affine``
        appearance, transformed: may leave [0, 1]).

        ``viewdirs`` is (R, 3) per ray, indexed by ``ray_idx`` (P,), or (P, 3) per point
        when ``ray_idx`` is None; ``image_ids``: (R,) (or (P,)) training image ids or None
        (see :mod:`.appearance`).
        """
        pick = (lambda t: t) if ray_idx is None else (lambda t: t.index_select(0, ray_idx))  # noqa: E731
        app = self.appearance
        codes = app.codes(image_ids, viewdirs.shape[0]) if app is not None else None
        if self.color == "sh":
            basis = pick(spherical_harmonics(viewdirs, self.sh_degree))  # (P, K)
            rgb = torch.sigmoid((feats.view(-1, 3, basis.shape[-1]) * basis[:, None, :]).sum(-1))
        else:
            latent = app.latent(codes, ray_idx) if app is not None else []
            rgb = torch.sigmoid(self.color_net(torch.cat([feats, pick(self.dir_encoding(viewdirs)), *latent], dim=-1)))
        return rgb if app is None else app.transform(rgb, codes, ray_idx)

    def _split(self, points: torch.Tensor, fn, width: int) -> torch.Tensor:
        """Evaluate ``fn(points, table_index)`` on each table pair's points.

        Returns (P, width): the focus tables inside the focus box, the context tables
        elsewhere (only the focus tables without a focus box). The points are split by a
        stable partition whose size is read (a host sync); where that stalls the device
        (:func:`~distnerf.host_buffers.sync_free`: CUDA) both table pairs run on every point
        instead and ``torch.where`` keeps the right value (twice the interpolation, no size read).
        """
        if self.focus is None:
            return fn(points, 0)
        inside = ((points >= self.focus[0]) & (points <= self.focus[1])).all(dim=-1)
        if sync_free(points.device):  # no size read: both table pairs at every point, then the right one
            return torch.where(inside[:, None], fn(points, 0).view(-1, width), fn(points, 1).view(-1, width))
        # a stable partition on the device (the points inside first, each part in order), as
        # inside.nonzero() then (~inside).nonzero() would give, but with one size read
        num_in = inside.sum()
        rank = torch.where(inside, inside.cumsum(0) - 1, num_in + (~inside).cumsum(0) - 1)
        order = torch.empty_like(rank).scatter_(0, rank, torch.arange(rank.shape[0], device=rank.device))
        n = int(num_in)  # host sync: how many points go to the focus tables
        idx_in, idx_out = order[:n], order[n:]
        out = points.new_zeros(points.shape[0], width)
        out = out.index_put((idx_in,), fn(points[idx_in], 0).view(-1, width))
        return out.index_put((idx_out,), fn(points[idx_out], 1).view(-1, width))

    def raw_density(self, points: torch.Tensor, contracted: bool = False) -> torch.Tensor:
        """(P, 3) world points (field coordinates, :meth:`field_coordinates`, when
        ``contracted``) -> (P,) trilinearly interpolated raw density.

        Without autograd: ``grid_sample`` on the x-major table viewed as (1, 1, N, N, N) =
        [x, y, z], so the sample coordinates are passed in (z, y, x) order (its W axis is
        our z). With autograd: the corner gather of :func:`interpolate` (the same values
        to float rounding), whose scatter backward is about twice as fast on the CPU as
        ``grid_sample``'s.
        """
        tables = self._tables()
        grad = torch.is_grad_enabled()
        points = points if contracted else self.field_coordinates(points)

        def sample(p: torch.Tensor, t: int) -> torch.Tensor:
            density, _, shape, box = tables[t]
            x = ((p - box[0]) / (box[1] - box[0])).clamp(0, 1)
            if grad:
                index, weights = trilinear_corners(x, shape)
                self.note_rows_read(density, index.numel())
                return interpolate(density, index, weights).view(-1)
            return F.grid_sample(density.view(1, 1, *shape), (x * 2 - 1).flip(-1).view(1, 1, 1, -1, 3),
                                 mode="bilinear", align_corners=True).view(-1)

        return self._split(points, sample, 1).view(-1)

    def point_features(self, points: torch.Tensor) -> torch.Tensor:
        """(P, 3) world points -> (P, C) trilinearly interpolated colour features."""
        tables = self._tables()
        points = self.field_coordinates(points)

        def sample(p: torch.Tensor, t: int) -> torch.Tensor:
            _, features, shape, box = tables[t]
            index, weights = trilinear_corners((p - box[0]) / (box[1] - box[0]), shape)
            self.note_rows_read(features, index.numel())
            # sparse rows need their count (a host sync); where that stalls the device, dense gradients
            return interpolate(features, index, weights, self.sparse_grad and not sync_free(p.device))

        return self._split(points, sample, self.features.shape[1])

    def field(self, points: torch.Tensor, viewdirs: torch.Tensor):
        return self.field_density(points), self.field_rgb(points, viewdirs)

    def field_density(self, points: torch.Tensor) -> torch.Tensor:
        return self.densities(self.raw_density(points))

    def field_rgb(self, points: torch.Tensor, viewdirs: torch.Tensor) -> torch.Tensor:
        return self._colours(self.point_features(points), viewdirs, None)

    def marching_box(self) -> torch.Tensor:
        return self.grid_aabb

    def colours(self, points: torch.Tensor, viewdirs: torch.Tensor, ray_indices: torch.Tensor,
                image_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self._colours(self.point_features(points), viewdirs, ray_indices, image_ids)

    def densities(self, raw: torch.Tensor) -> torch.Tensor:
        """Raw grid density -> sigma (1 / world unit)."""
        return F.softplus(raw + self.density_shift) / self.base_voxel

    def step_size(self) -> float:
        """Marching step: ``step_ratio`` x the smallest voxel edge (distance, world or NDC units)."""
        return self._geometry()[1]

    def add_regularizer_grads_(self, value: bool = False) -> torch.Tensor | float | None:
        """Total variation of the density (weighted by ``tv_weight``), gradient added locally.

        Returns, with ``value``, the value as a 0-dim tensor (0.0 with ``tv_weight`` 0); else None.
        """
        if self.tv_weight <= 0:
            return 0.0 if value else None
        total = 0.0
        workspace = self.__dict__.setdefault("_tv_workspace", {})  # the differences' buffer, kept across steps
        for table, _, shape, _ in self._tables():
            if table.grad is None:
                table.grad = torch.zeros_like(table)
            tv = total_variation_grad_(table.detach().view(shape), self.tv_weight, table.grad.view(shape),
                                       value, workspace)
            if value:
                total = total + tv
        return total if value else None

    # ---------------------------------------------------------------- schedule
    @torch.no_grad()
    def update_occupancy(self) -> None:
        """Occupancy from the density (deterministic).

        Without a focus box the occupancy cells are the grid's voxels, (N-1)^3 over
        ``grid_aabb``, and a voxel is occupied when the opacity of one marching step at
        the *largest* of its 8 corner densities exceeds ``occupancy_threshold``: trilinear
        interpolation never exceeds its largest corner and softplus is monotonic, so no
        point of an empty voxel is above the threshold (no interpolation). On a bounded field
        the test moves to the raw table (:meth:`raw_threshold`: a voxel is occupied when any
        corner's raw value exceeds it, :func:`any_corner`), so no opacity is computed; a
        contracted field's step length varies per cell, so there the largest corner's opacity
        is computed (a 2x2x2 max-pool). With a focus box, the density at N^3 cell centres over the scene
        box, dilated by one cell; with a table of unequal counts per axis (``cubic_voxels`` on a
        box that is not a cube), the same at M^3 cell centres over ``grid_aabb``, M = the largest
        count - 1 (no cell longer than a voxel).
        """
        n, step_size, shape = self.resolution, self.step_size(), self.shape
        threshold = self.current_occupancy_threshold()
        if self.focus is None and len(set(shape)) == 1:
            m = shape[0]
            raw = self.density.detach().view(m, m, m)
            self.occupancy.aabb.copy_(self.grid_aabb)  # the voxels' box (setting the cells refreshes the caches)
            raw_threshold = self.raw_threshold(threshold, step_size) if self.contraction_aabb is None else None
            if raw_threshold is not None:  # a bounded field: compare the raw table, not 4 M opacities
                self.occupancy.set_binary(any_corner(raw > raw_threshold))
                return
            corner_max = F.max_pool3d(raw[None, None], 2, stride=1)[0, 0]
            alpha = 1.0 - torch.exp(-self.densities(corner_max) * step_size * self._step_scale(m - 1))
            self.occupancy.set_from_alpha(alpha, threshold, dilation=0)
            return
        m = n if self.focus is not None else max(shape) - 1
        if self.occupancy.resolution != m:
            self.occupancy.resize(self.grid_aabb, m)
        else:
            self.occupancy.aabb.copy_(self.grid_aabb)  # a tightened box (a contracted one never moves)
        sigma = self.densities(self.raw_density(self.occupancy.cell_centers(), contracted=True))
        scale = self._step_scale(m)
        alpha = 1.0 - torch.exp(-sigma * step_size * (scale.reshape(-1) if torch.is_tensor(scale) else scale))
        self.occupancy.set_from_alpha(alpha.view(m, m, m), threshold, dilation=1)

    def raw_threshold(self, threshold: float, step_size: float) -> float | None:
        """The raw table value above which one marching step of ``step_size`` has opacity above
        ``threshold``: 1 - exp(-softplus(raw + shift) / base_voxel * step) > threshold
        <=> raw > log(expm1(-log(1 - threshold) * base_voxel / step)) - shift (softplus and
        exp are increasing, so the comparison moves to the raw values unchanged). None when it
        has no finite value (threshold 0, or one so small that expm1 underflows): the caller
        then compares opacities."""
        if not 0.0 < threshold < 1.0:
            return None
        target = -math.log1p(-threshold) * self.base_voxel / step_size  # softplus(raw + shift) above this
        inner = math.expm1(target)
        if not (inner > 0.0 and math.isfinite(inner)):
            return None
        return math.log(inner) - self.density_shift

    def current_occupancy_threshold(self) -> float:
        """Opacity of one marching step below which a cell is empty now: ``occupancy_threshold_final``
        at the final resolution (with two or more resolutions and the key set), else
        ``occupancy_threshold``. The coarse stages start every cell at ``alpha_init``, so their
        threshold must not exceed it; by the final stage the surfaces have formed and the
        semi-transparent fog grown in free air can be pruned (Instant-NGP, Mueller et al. 2022,
        Sec. 4: density threshold 0.01)."""
        if self.occupancy_threshold_final is not None and len(self.resolutions) > 1 \
                and self.resolution == self.resolutions[-1]:
            return float(self.occupancy_threshold_final)
        return float(self.occupancy_threshold)

    def _step_scale(self, m: int) -> torch.Tensor | float:
        """(m, m, m) world length of a unit marching step at the centres of m^3 cells over
        ``grid_aabb`` (:func:`~distnerf.renderer.contraction.world_step_scale`; cached per m),
        or 1.0 for a bounded field."""
        if self.contraction_aabb is None:
            return 1.0
        cache = self.__dict__.setdefault("_step_scale_cache", {})
        if m not in cache:
            box = self.grid_aabb
            axis = (torch.arange(m, device=box.device, dtype=torch.float32) + 0.5) / m
            cells = torch.stack(torch.meshgrid(axis, axis, axis, indexing="ij"), dim=-1).reshape(-1, 3)
            cache[m] = world_step_scale(box[0] + cells * (box[1] - box[0]), self.contraction_aabb).view(m, m, m)
        return cache[m]

    @torch.no_grad()
    def upsample(self, resolution: int) -> None:
        """Resample the tables to ``resolution`` (inside a tightened box if enabled)."""
        new_aabb = self._table_box().clone()
        if self.tighten_aabb:
            self.update_occupancy()
            box = self.occupancy.occupied_aabb()
            pad = (self.grid_aabb[1] - self.grid_aabb[0]) / self.resolution
            new_aabb = torch.stack([torch.maximum(box[0] - pad, self.grid_aabb[0]),
                                    torch.minimum(box[1] + pad, self.grid_aabb[1])])
        lo, hi = new_aabb.tolist()  # host sync (once per upsampling): the new box's bounds
        shape = voxel_shape(resolution, new_aabb, self.cubic_voxels)
        axes = [torch.linspace(lo[i], hi[i], shape[i], device=self.density.device) for i in range(3)]
        points = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3)  # x-major
        index, weights = self._corners(points)
        density = interpolate(self.density, index, weights)
        features = interpolate(self.features, index, weights)
        self.density, self.features = nn.Parameter(density), nn.Parameter(features)
        self._table_box().copy_(new_aabb)
        self.grid_resolution.fill_(resolution)
        self.update_occupancy()

    def update_state(self, step: int, stage_step: int | None = None) -> bool:
        """Move to the next resolution once ``stage_step`` (default ``step``) reaches the current
        stage's entry of ``upsample_steps`` (one stage per call: the stage is read from the
        current resolution, so a model restored at any stage goes on from it); refresh the
        occupancy grid every ``occupancy_every`` steps of ``step``."""
        stage_step = step if stage_step is None else stage_step
        stage = max(i for i, r in enumerate(self.resolutions) if r == self.resolution) \
            if self.resolution in self.resolutions else len(self.resolutions) - 1
        replaced = False
        if stage < len(self.upsample_steps) and stage_step >= self.upsample_steps[stage]:
            self.upsample(self.resolutions[stage + 1])
            replaced = True
        if step > 0 and step % self.occupancy_every == 0:
            self.update_occupancy()
        return replaced


def any_corner(vertex: torch.Tensor) -> torch.Tensor:
    """Whether any of each voxel's 8 corners is set.

    Args:
        vertex: (M, M, M) bool, one per grid vertex.
    Returns:
        (M - 1, M - 1, M - 1) bool, one per voxel: the OR of its corners (a 2x2x2 max-pool
        with stride 1, as three pairwise ORs along the axes).
    """
    v = vertex[1:] | vertex[:-1]
    v = v[:, 1:] | v[:, :-1]
    return v[:, :, 1:] | v[:, :, :-1]


def total_variation(grid: torch.Tensor) -> torch.Tensor:
    """Mean squared difference of neighbouring voxels (Plenoxels Eq. 3).

    Args:
        grid: (1, C, D, H, W) float.
    Returns:
        scalar tensor.
    """
    dz = (grid[:, :, 1:] - grid[:, :, :-1]).pow(2).mean()
    dy = (grid[:, :, :, 1:] - grid[:, :, :, :-1]).pow(2).mean()
    dx = (grid[..., 1:] - grid[..., :-1]).pow(2).mean()
    return dx + dy + dz


@torch.no_grad()
def total_variation_grad_(grid: torch.Tensor, weight: float, grad: torch.Tensor, value: bool = True,
                          workspace: dict | None = None) -> torch.Tensor | None:
    """Add ``weight`` x the gradient of :func:`total_variation` to ``grad``, in closed form.

    For each axis, ``tv_a = mean_i (x_{i+1} - x_i)^2`` over the ``m_a`` neighbour pairs,
    so ``d tv_a / d x_{i+1} = 2 (x_{i+1} - x_i) / m_a`` and ``d tv_a / d x_i`` is its
    negative: one difference tensor per axis, no autograd graph.

    Args:
        grid: (D, H, W) float values. weight: float. grad: (D, H, W) float, updated in place.
        value: also compute the value (one more pass per axis).
        workspace: a dict kept by the caller, holding the difference buffer between calls
            (a fresh 16 MB tensor per axis at 160^3 costs its page faults at every step), or None.
    Returns:
        with ``value``: 0-dim tensor (dtype of ``grid``) ``weight * total_variation(grid)``; a
        tensor, so that a training step that ignores it never waits for the device. Else None.
    """
    total = grid.new_zeros(())
    for axis in range(3):
        n = grid.shape[axis]
        if n < 2:
            continue
        hi, lo = grid.narrow(axis, 1, n - 1), grid.narrow(axis, 0, n - 1)
        if workspace is None:
            diff = hi - lo
        else:
            key = (grid.dtype, grid.device)
            buf = workspace.get(key)
            if buf is None or buf.numel() < hi.numel():
                buf = workspace[key] = torch.empty(hi.numel(), dtype=grid.dtype, device=grid.device)
            diff = torch.sub(hi, lo, out=buf[:hi.numel()].view(hi.shape))
        if value:
            total = total + diff.pow(2).mean()
        scale = 2.0 * weight / diff.numel()
        grad.narrow(axis, 1, n - 1).add_(diff, alpha=scale)
        grad.narrow(axis, 0, n - 1).sub_(diff, alpha=scale)
    return weight * total if value else None
