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
  unit of distance (world, or NDC for LLFF). ``density_activation=trunc_exp``: Instant-NGP's
  exponential instead (its gradient clamped, :func:`~.grid_occupancy.trunc_exp`), shifted alike.
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
* Total variation on the density (Plenoxels, Fridovich-Keil et al. 2022, Eq. 3): the model
  lists its density tables (:meth:`GridModel.regularized_tables`), the step adds the gradient in
  closed form (:mod:`distnerf.components.regularizer`).
* Focus box (``focus_aabb``, the sub-scene models of ``strategy=ss``): the tables
  above cover only the focus box, at full resolution, and a second pair of tables at
  ``context_resolution`` covers the rest of the scene box, so that the model can
  explain whole pixels while its memory goes mostly to its own region. Rays are
  marched through the whole scene box with the focus box's step; the box is not
  tightened.
* Shard (``shard_aabb``, the sharded joint model of ``strategy=ss``): the tables hold only the
  vertices of one model's lattice (``grid_aabb`` at ``resolutions``, ``lattice_multiple``) that lie
  in the shard's box (field coordinates: contracted space for a contracted field), a slice of the
  one model's tables; everything else (contraction, step, density unit, occupancy cells, sample
  spacing) is the one model's, so K shards whose boxes tile ``grid_aabb`` render together what one
  model renders (:mod:`distnerf.strategy.joint`). A point is interpolated with its position on the
  whole lattice (:func:`~.grid_tables.lattice_corners`: the one model's bits); the occupancy refresh
  marks the cells the shard owns (:meth:`~.grid_occupancy.GridOccupancy.update_occupancy`), which the
  strategy merges into one grid for all shards. The box is never tightened.

The model is split by concern (nerfstudio's fields / field components / model components):

=============================  =====================================================================
:mod:`.grid_tables`            vertex tables: shapes, corners, interpolation (custom autograd, sparse rows)
:mod:`.grid_color`             the colour head (spherical harmonics or the tiny MLP)
:mod:`.grid_occupancy`         the occupancy refresh from the density table
:mod:`.grid_schedule`          the coarse-to-fine upsampling schedule
this module                    the field: its config, tables and boxes, geometry, density and colour at points
=============================  =====================================================================
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from ..config_check import section
from ..host_buffers import sync_free
from ..renderer.contraction import contracted_box, world_step_scale
from ..renderer.occupancy import OccupancyGrid
from ..schema import GridModelConfig
from .appearance import build_appearance
from .grid_color import build_color_net, build_dir_encoding, feature_channels, shade, spherical_harmonics
from .grid_occupancy import GridOccupancy, any_corner, density_activation, inverse_density_activation
from .grid_schedule import GridSchedule
from .grid_tables import (corner_offsets, interpolate, lattice_corners, row_strides, sparse_table_grad,
                          trilinear_corners, voxel_shape)
from .marched import MarchingModel

__all__ = ["GridModel", "SHELL_SCALE_CAP", "lattice_slice", "any_corner", "interpolate", "sparse_table_grad", "spherical_harmonics",
           "trilinear_corners", "voxel_shape"]  # the parts' names that other modules import from here

SHELL_SCALE_CAP = 64.0
"""Largest world length of a contracted unit step (``r^2``, ``r`` = 8 box units) that the initial
density compensates (:meth:`GridModel._even_shell_density_`)."""


def lattice_slice(lattice: tuple[int, int, int], box: torch.Tensor, shard: torch.Tensor):
    """The vertices of a lattice inside a shard's box: (first vertex per axis, vertices per axis).

    Args:
        lattice: (L_x, L_y, L_z) vertices per axis over ``box`` ((2, 3) float). shard: (2, 3) float box whose
            faces lie on the lattice's vertex planes.
    Raises:
        ValueError: a face off the vertex planes (naming ``model.lattice_multiple``, which puts the planes
            cutting the box into equal parts on vertices).
    """
    first, count = [], []
    for a, m in enumerate(lattice):
        ends = [(float(shard[i, a]) - float(box[0, a])) / (float(box[1, a]) - float(box[0, a])) * (m - 1)
                for i in (0, 1)]
        idx = [round(e) for e in ends]
        if any(abs(e - i) > 1e-3 for e, i in zip(ends, idx)) or not 0 <= idx[0] < idx[1] <= m - 1:
            raise ValueError(f"GridModel: the shard box {shard.tolist()} is not on the vertex planes of the lattice "
                             f"of {lattice} vertices over {box.tolist()} (axis {a}: vertex {ends[0]:.4g} to "
                             f"{ends[1]:.4g}); set model.lattice_multiple to the split counts per axis")
        first.append(idx[0])
        count.append(idx[1] - idx[0] + 1)
    return tuple(first), tuple(count)


class GridModel(GridOccupancy, GridSchedule, MarchingModel):
    """Dense voxel grid with a tiny colour MLP.

    Args:
        aabb, background: see :class:`RadianceModel`.
        cfg, options: the keys of :class:`~distnerf.schema.GridModelConfig` (a mapping and/or
            keywords; defaults there), kept as ``self.cfg``, the typed config (a ``GridModelConfig``):
        resolutions: vertex resolutions of the coarse-to-fine schedule, e.g. [64, 128, 160].
        upsample_steps: training steps at which to move to the next resolution.
        num_features: C. hidden_width, viewdir_encoding, viewdir_frequencies: colour MLP.
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
        lattice_multiple: (3,) ints: each axis' voxel count is a multiple of it (:func:`voxel_shape`).
        shard_aabb: (2, 3) box in field coordinates on the lattice's vertex planes at every stage, or None
            (module docstring: a shard of one model).

    Raises:
        ValueError: a focus box without ``context_resolution``; a shard box with a focus box, or off the
            lattice's vertex planes at some stage (naming ``model.lattice_multiple``).
    """

    holds_focus = True

    def __init__(self, aabb, background, cfg=None, *, focus_aabb=None, context_resolution: int | None = None,
                 num_images: int = 0, shard_aabb=None, **options):
        cfg = OmegaConf.to_object(section(GridModelConfig, cfg, **options))  # defaults: distnerf/schema.py
        if focus_aabb is not None and context_resolution is None:
            raise ValueError("GridModel: a focus_aabb needs context_resolution (strategy.context_resolution)")
        if len(cfg.upsample_steps) != len(cfg.resolutions) - 1:
            raise ValueError(f"model.upsample_steps ({list(cfg.upsample_steps)}) needs one entry per "
                             f"resolution change of model.resolutions ({list(cfg.resolutions)})")
        super().__init__(aabb, background)
        self.cfg: GridModelConfig = cfg
        self._geometry_key = None  # what the cached (resolution, marching step) was computed for
        self.init_marching(cfg)
        self.sparse_grad = bool(cfg.sparse_grad)
        self.init_contraction(cfg)
        # a contracted grid covers all of space: its box stays the doubled box (never tightened)
        self.tighten_aabb = (cfg.tighten_aabb and focus_aabb is None and shard_aabb is None
                             and self.contraction_aabb is None)
        if focus_aabb is not None and shard_aabb is not None:
            raise ValueError("GridModel: a shard (shard_aabb) holds no focus box")
        self.register_buffer("focus", None if focus_aabb is None else
                             torch.as_tensor(focus_aabb, dtype=torch.float32).reshape(2, 3).clone())
        self.register_buffer("shard", None if shard_aabb is None else
                             torch.as_tensor(shard_aabb, dtype=torch.float32).reshape(2, 3).clone())
        self.multiple = None if cfg.lattice_multiple is None else tuple(int(k) for k in cfg.lattice_multiple)
        if self.multiple is not None and (len(self.multiple) != 3 or min(self.multiple) < 1):
            raise ValueError(f"model.lattice_multiple must be 3 integers >= 1 (one per axis), got {list(self.multiple)}")
        box = self._context_box() if self.focus is None else self.focus
        # density unit: the smallest voxel edge of the final resolution, the edge the march step is
        # measured in (step_size), so one step of the final grid starts at opacity alpha_init on any
        # box shape. (It was the largest edge / resolution: on a flat box, such as an aerial capture's,
        # the first steps started below color_threshold, no sample got a colour and nothing learned.)
        final = voxel_shape(cfg.resolutions[-1], box, cfg.cubic_voxels, self.multiple)
        self.base_voxel = min(float(e) / (m - 1) for e, m in zip((box[1] - box[0]).tolist(), final))
        # activation(shift) * step / base_voxel = -log(1 - alpha_init) at step = step_ratio voxels
        self.activation = density_activation(cfg.density_activation)
        self.density_shift = inverse_density_activation(cfg.density_activation,
                                                        -math.log(1.0 - cfg.alpha_init) / cfg.step_ratio)
        num_features = feature_channels(cfg.color, cfg.num_features, cfg.sh_degree)
        n = cfg.resolutions[0]
        for r in cfg.resolutions:  # a shard: its slice of the lattice at every stage (refused otherwise)
            self._lattice_at(r, box)
        vertices = math.prod(self._lattice_at(n, box)[2])
        self.density = nn.Parameter(torch.zeros(vertices, 1))
        self.features = nn.Parameter(torch.zeros(vertices, num_features))
        self.dir_encoding = build_dir_encoding(cfg.viewdir_encoding, cfg.viewdir_frequencies, cfg.sh_degree)
        self.appearance = build_appearance(cfg.appearance, num_images, cfg.appearance_dim, cfg.color == "mlp")
        latent_dim = self.appearance.latent_dim if self.appearance is not None else 0
        self.color_net = build_color_net(cfg.color, num_features, self.dir_encoding, latent_dim, cfg.hidden_width)
        if self.focus is not None:
            c = int(context_resolution)
            self.context_density = nn.Parameter(torch.zeros(c ** 3, 1))
            self.context_features = nn.Parameter(torch.zeros(c ** 3, num_features))
        self.register_buffer("grid_aabb", self._context_box().clone())
        self.register_buffer("grid_resolution", torch.tensor(n))
        self.occupancy = OccupancyGrid(self.grid_aabb, n, contraction_aabb=self.contraction_aabb)
        assert torch.equal(self.occupancy.aabb, self.grid_aabb), "one contracted range for tables and occupancy"
        if self.contraction_aabb is not None and cfg.shell_alpha_init:
            self._even_shell_density_()

    @torch.no_grad()
    def _even_shell_density_(self) -> None:
        """Start every marching step at opacity ``alpha_init``, in the contracted shell too.

        A unit step of the contracted spacing spans ``world_step_scale`` (``r^2``) world units in
        the shell, so a density even in world units starts a shell step ``r^2`` times as opaque
        as one in the box: on an aerial capture whose cameras sit in the shell, the air in front
        of the scene and the shell behind its ground started as fog that the first steps
        painted the images on. Each vertex's raw density is lowered so that ``sigma x scale`` is
        the box's ``sigma`` (``softplus(raw + shift) = softplus(shift) / scale``, or ``density_activation``'s
        function in place of softplus); the scale is
        capped at :data:`SHELL_SCALE_CAP` (beyond ``r`` = 8 box units, the sky's far shell keeps
        raw densities from which a few steps reach opacity)."""
        for i, (table, _, shape, box) in enumerate(self._tables()):
            if i == 0:  # the full-resolution tables: their lattice's vertices
                vertices = self.table_vertices(self.resolution).cpu()
            else:
                axis = [torch.linspace(float(box[0, a]), float(box[1, a]), shape[a]) for a in range(3)]
                vertices = torch.stack(torch.meshgrid(*axis, indexing="ij"), dim=-1).reshape(-1, 3)
            scale = world_step_scale(vertices, self.contraction_aabb.cpu()).clamp(max=SHELL_SCALE_CAP)
            target = self.activation(torch.tensor(self.density_shift)) / scale
            raw = inverse_density_activation(self.cfg.density_activation, target) - self.density_shift
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
        return math.prod(self._lattice_at(resolution, self._lattice_box())[2])

    def _lattice_at(self, resolution: int, lattice_box: torch.Tensor):
        """(vertices per axis of the lattice over ``lattice_box`` at ``resolution``, the full-resolution tables'
        first vertex on it, their vertices per axis): the whole lattice, or a shard's slice of it
        (:func:`lattice_slice`, which refuses a shard box off the lattice's vertex planes)."""
        lattice = voxel_shape(resolution, lattice_box, self.cfg.cubic_voxels, self.multiple)
        if self.shard is None:
            return lattice, (0, 0, 0), lattice
        return (lattice, *lattice_slice(lattice, lattice_box, self.shard))

    def _lattice_box(self) -> torch.Tensor:
        """(2, 3) box of the lattice the full-resolution tables lie on: ``grid_aabb`` for a shard (its
        tables are a slice), else the tables' own box."""
        return self.grid_aabb if self.shard is not None else self._table_box()

    @property
    def lattice(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """(vertices per axis of the whole lattice, the tables' first vertex on it): (``shape``, (0, 0, 0))
        but for a shard."""
        return self._geometry()[3]

    def _geometry(self) -> tuple[int, float, tuple[int, int, int], tuple]:
        """(resolution, marching step, table shape, :attr:`lattice`) as Python numbers, recomputed only when
        the grid changes (upsampling, loading a state), so the hot path reads no tensor. The step is the
        lattice's (a shard marches as the whole model)."""
        key = (self.grid_resolution._version, self._table_box()._version, self._table_box().data_ptr(),
               self.grid_resolution.data_ptr())
        if self._geometry_key != key:
            box = self._lattice_box()
            n = int(self.grid_resolution)
            lattice, first, shape = self._lattice_at(n, box)
            extent = (box[1] - box[0]).tolist()
            if len(set(lattice)) == 1:  # the smallest side over the count (this order of operations: the same step as ever)
                step = self.cfg.step_ratio * min(extent) / (lattice[0] - 1)
            else:
                step = self.cfg.step_ratio * min(e / (m - 1) for e, m in zip(extent, lattice))
            self._geometry_cache = (n, step, shape, (lattice, first))
            self._geometry_key = key
        return self._geometry_cache

    def table_vertices(self, resolution: int) -> torch.Tensor:
        """(V, 3) float32 field coordinates of the full-resolution tables' vertices at ``resolution``, x-major
        (a shard's: its slice of the lattice's vertices, the same floats as the whole lattice's)."""
        box = self._lattice_box()
        lo, hi = box.tolist()  # host read (once per upsampling): the box's bounds
        lattice, first, shape = self._lattice_at(resolution, box)
        axes = [torch.linspace(lo[i], hi[i], lattice[i], device=box.device)[first[i]:first[i] + shape[i]]
                for i in range(3)]
        return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3)

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
        """(density, features, vertices per axis, box) of each table pair, full resolution first (a shard's
        box: its lattice's, over which points are placed: :meth:`_table_corners`)."""
        out = [(self.density, self.features, self.shape, self._lattice_box())]
        if self.focus is not None:
            c = round(self.context_density.shape[0] ** (1 / 3))
            out.append((self.context_density, self.context_features, (c, c, c), self._context_box()))
        return out

    def sparse_parameters(self) -> list[nn.Parameter]:
        """The colour-feature tables, whose gradient is a sparse COO tensor of the rows read when
        :attr:`sparse_grad` (on a device where rows are counted without a host sync: the CPU), else dense."""
        return [f for _, f, _, _ in self._tables()]

    def bounded_parameters(self) -> list[nn.Parameter]:
        """The vertex tables: read only by trilinear interpolation (8 corner rows per point), so
        their loss gradient is non-zero in the rows read (:meth:`gradient_entry_capacity`)."""
        return [t for d, f, _, _ in self._tables() for t in (d, f)]

    def gradient_entry_capacity(self) -> dict[int, int]:
        """Under a static step's sample budget of P slots (``sample_capacity``: the field runs on every
        slot, each reading 8 corner rows of a table) a forward reads at most 8 P rows of each table, so
        ``min(V, 8 P) x C`` entries of a (V, C) table can be non-zero. Without one the samples a step
        marches depend on the data: no fixed bound ({})."""
        if self.sample_capacity is None:
            return {}
        rows = 8 * self.sample_capacity
        return {id(t): min(t.shape[0], rows) * (t.numel() // max(t.shape[0], 1)) for t in self.bounded_parameters()}

    def param_groups(self, lr: float) -> list[dict]:
        """Tables at ``lr`` * 100 (DVGO uses 0.1 for grids and 1e-3 for the MLP)."""
        groups = [{"params": self.bounded_parameters(), "lr": lr * 100.0, "name": "grid"}]
        if self.cfg.color == "mlp":
            groups.append({"params": list(self.color_net.parameters()), "lr": lr, "name": "color_net"})
        if self.appearance is not None:
            groups.append(self.appearance.param_group(lr))
        return groups

    def regularized_tables(self) -> list[tuple[nn.Parameter, tuple[int, int, int], float]]:
        """The density tables, regularised by total variation at ``tv_weight`` (none when 0)."""
        if self.cfg.tv_weight <= 0:
            return []
        return [(density, shape, self.cfg.tv_weight) for density, _, shape, _ in self._tables()]

    # ---------------------------------------------------------------- field
    def _corners(self, points: torch.Tensor):
        """(P, 3) points in the full-resolution tables' box -> their (P, 8) corner rows and weights."""
        box, shape = self._lattice_box(), self.shape
        return self._table_corners((points - box[0]) / (box[1] - box[0]), shape)

    def _table_corners(self, x: torch.Tensor, shape: tuple[int, int, int]):
        """:func:`~.grid_tables.trilinear_corners` of (P, 3) positions ``x`` in [0, 1] over a table of
        ``shape``, its corner offsets and row strides built once per shape and device, and the weights in
        the few-operator form where the host paces the step (:func:`~distnerf.host_buffers.sync_free`)."""
        cache = self.__dict__.setdefault("_corner_layout_cache", {})
        key = (shape, x.device)
        if key not in cache:
            cache[key] = (corner_offsets(shape, x.device), row_strides(shape, x.device))
        offsets, strides = cache[key]
        if self.shard is not None:  # x over the lattice's box: the whole model's positions, then the slice's rows
            lattice, first = self.lattice
            return lattice_corners(x, lattice, first, shape, offsets)
        return trilinear_corners(x, shape, offsets, strides, outer=sync_free(x.device))

    def _colours(self, feats: torch.Tensor, viewdirs: torch.Tensor, ray_idx: torch.Tensor | None,
                 image_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(P, C) features + view directions -> (P, 3) RGB (:func:`~.grid_color.shade`: ``viewdirs``
        (R, 3) per ray indexed by ``ray_idx`` (P,), or (P, 3) per point when it is None)."""
        sh_degree = self.cfg.sh_degree if self.cfg.color == "sh" else None
        return shade(feats, viewdirs, ray_idx, image_ids, sh_degree=sh_degree, color_net=self.color_net,
                     dir_encoding=self.dir_encoding, appearance=self.appearance)

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
            if grad or self.shard is not None:  # a shard: the lattice's positions (grid_sample's are its own)
                index, weights = self._table_corners(x, shape)
                return interpolate(density, index, weights).view(-1)
            return F.grid_sample(density.view(1, 1, *shape), (x * 2 - 1).flip(-1).view(1, 1, 1, -1, 3),
                                 mode="bilinear", align_corners=True).view(-1)

        return self._split(points, sample, 1).view(-1)

    def field_query(self, image_ids: torch.Tensor | None = None):
        """Density and colour from one corner pass (:meth:`MarchingModel.field_query`): with autograd and
        one table pair (no focus box), the corner rows and weights found for the density are gathered
        for the coloured samples (two ``index_select``) instead of found again from their points; the
        same bits as :meth:`field_density` then :meth:`colours` (the corners of a point do not depend on
        which pass finds them). Otherwise None."""
        if self.focus is not None or not torch.is_grad_enabled():
            return None
        density, features, shape, box = self._tables()[0]

        def field_fn(points: torch.Tensor):
            p = self.field_coordinates(points)
            # (trilinear_corners clamps the positions to [0, 1])
            index, weights = self._table_corners((p - box[0]) / (box[1] - box[0]), shape)
            sigmas = self.densities(interpolate(density, index, weights).view(-1))

            def colour_at(sel: torch.Tensor | None, viewdirs: torch.Tensor, ray_indices: torch.Tensor) -> torch.Tensor:
                rows, w = (index, weights) if sel is None else (index.index_select(0, sel), weights.index_select(0, sel))
                # sparse rows need their count (a host sync); where that stalls the device, dense gradients
                feats = interpolate(features, rows, w,
                                    self.sparse_grad and not sync_free(points.device))
                return self._colours(feats, viewdirs, ray_indices, image_ids)

            return sigmas, colour_at

        return field_fn

    def point_features(self, points: torch.Tensor) -> torch.Tensor:
        """(P, 3) world points -> (P, C) trilinearly interpolated colour features."""
        tables = self._tables()
        points = self.field_coordinates(points)

        def sample(p: torch.Tensor, t: int) -> torch.Tensor:
            _, features, shape, box = tables[t]
            index, weights = self._table_corners((p - box[0]) / (box[1] - box[0]), shape)
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
        return self.activation(raw + self.density_shift) / self.base_voxel

    def step_size(self) -> float:
        """Marching step: ``step_ratio`` x the smallest voxel edge (distance, world or NDC units)."""
        return self._geometry()[1]
