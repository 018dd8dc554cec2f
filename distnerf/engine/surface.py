"""Point clouds and meshes of a trained radiance field (``python -m distnerf.export format=ply|mesh``).

Legend: P points, N lattice vertices per axis, V mesh vertices, F triangles, S samples per colour ray.

The field is sampled on one regular lattice of N^3 vertices spanning the scene box (its
corners included; cell ``(box_max - box_min) / (N - 1)`` per axis):

- **density**: the model's field density (1 / scene unit) where its occupancy grid marks the
  point occupied, 0 elsewhere (rendering never samples an empty cell). For an ``ss`` run the
  density and colour at a point are its *owning* region's (:meth:`Partition.region_of`, the
  field segment fusion renders), evaluated on the one lattice of the whole scene: a surface
  crossing a region face is one surface, with no seam (no duplicated or missing vertices there).
- **point cloud**: the lattice vertices whose density exceeds ``threshold``; colour: the colour
  field at the point looking inward, along the density's gradient (central differences).
- **mesh**: marching cubes of the density at level ``threshold`` (scikit-image's
  ``measure.marching_cubes``: Lewiner et al., "Efficient implementation of marching cubes' cases
  with topological guarantees", 2003), on the lattice padded with one layer of empty cells so
  content cut by the box is closed at its faces. Vertex colour: the colour composited along a
  short ray entering the surface along the inward normal (from 2 cells outside to 2 cells inside,
  ``S`` samples, the quadrature of NeRF's volume rendering), normalised by its weight; where that
  ray gathers no weight, the colour at the vertex.

Frame: the run works in the scene frame (:mod:`distnerf.data.normalize`: ``p_scene = M [p_source, 1]``
with M a similarity, stored as ``RUN/scene_transform.json``); :func:`to_capture_frame` takes the
points back to the capture's own frame with ``M^-1`` (normals rotate with M's rotation only).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..model.base import RadianceModel
from ..strategy.partition import Partition

POINT_CHUNK = 1 << 18  # points per field call (bounds memory)
COLOUR_SAMPLES = 8     # S: samples along each vertex's inward colour ray
COLOUR_REACH = 2.0     # the colour ray starts this many cells outside the surface and ends as far inside


@dataclass
class Field:
    """A radiance field at points, no autograd.

    Attributes:
        density: (P, 3) float32 scene points -> (P,) float32 density, 1 / scene unit (0 where empty).
        rgb: (P, 3) points, (P, 3) unit view directions -> (P, 3) float32 RGB in [0, 1].
        device: where the points go.
    """

    density: Callable[[torch.Tensor], torch.Tensor]
    rgb: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    device: torch.device


def model_field(model: RadianceModel) -> Field:
    """The field of one model (a ``ddp`` run): its density where its occupancy grid is occupied."""
    device = model.aabb.device
    return Field(lambda p: model.field_density(p) * model.occupied(p), model.field_rgb, device)


def region_field(models: dict[int, RadianceModel], partition: Partition) -> Field:
    """The fused field of an ``ss`` run: at each point, its owning region's sub-model's field
    (:func:`model_field`). ``models`` holds every region (region index -> sub-model).

    Raises:
        ValueError: a region of the partition is missing.
    """
    if sorted(models) != list(range(len(partition))):
        raise ValueError(f"the fused field needs all {len(partition)} regions, got {sorted(models)}")
    fields = {k: model_field(m) for k, m in models.items()}
    device = next(iter(fields.values())).device

    def routed(points: torch.Tensor, fn) -> torch.Tensor:
        owner = partition.region_of(points)
        out = None
        for k, field in fields.items():
            idx = (owner == k).nonzero().view(-1)
            if len(idx) == 0:
                continue
            values = fn(field, idx)
            if out is None:
                out = values.new_zeros((len(points),) + values.shape[1:])
            out[idx] = values
        return out

    return Field(lambda p: routed(p, lambda f, i: f.density(p[i])),
                 lambda p, d: routed(p, lambda f, i: f.rgb(p[i], d[i])), device)


def _chunked(fn, *arrays: np.ndarray) -> np.ndarray:
    outs = []
    for start in range(0, len(arrays[0]), POINT_CHUNK):
        outs.append(fn(*(a[start:start + POINT_CHUNK] for a in arrays)))
    return np.concatenate(outs) if outs else np.zeros((0,), np.float32)


@torch.no_grad()
def _call(field: Field, fn, *arrays: np.ndarray) -> np.ndarray:
    def one(*parts):
        args = [torch.as_tensor(np.ascontiguousarray(a), dtype=torch.float32, device=field.device) for a in parts]
        return fn(*args).float().cpu().numpy()
    return _chunked(one, *arrays)


def lattice_axes(box: np.ndarray, resolution: int) -> list[np.ndarray]:
    """The lattice's coordinates per axis: ``resolution`` values from ``box[0]`` to ``box[1]`` ((2, 3) box)."""
    return [np.linspace(box[0, a], box[1, a], resolution) for a in range(3)]


def sample_lattice(field: Field, box: np.ndarray, resolution: int) -> np.ndarray:
    """(N, N, N) float32 density at the lattice vertices, indexed [x, y, z]."""
    axes = lattice_axes(box, resolution)
    volume = np.empty((resolution,) * 3, np.float32)
    for i, x in enumerate(axes[0]):  # one x slice at a time: N^2 points
        y, z = np.meshgrid(axes[1], axes[2], indexing="ij")
        pts = np.stack([np.full_like(y, x), y, z], -1).reshape(-1, 3)
        volume[i] = _call(field, field.density, pts).reshape(resolution, resolution)
    return volume


def _inward(volume: np.ndarray, cell: np.ndarray, index: np.ndarray) -> np.ndarray:
    """(P, 3) unit inward directions (the density's gradient) at lattice vertices ``index`` (P, 3) int."""
    grads = []
    for a in range(3):
        lo, hi = index.copy(), index.copy()
        lo[:, a] = np.maximum(lo[:, a] - 1, 0)
        hi[:, a] = np.minimum(hi[:, a] + 1, volume.shape[a] - 1)
        diff = volume[tuple(hi.T)] - volume[tuple(lo.T)]
        grads.append(diff / ((hi[:, a] - lo[:, a]).clip(1) * cell[a]))
    g = np.stack(grads, -1).astype(np.float64)
    norm = np.linalg.norm(g, axis=-1, keepdims=True)
    down = np.tile([0.0, -1.0, 0.0], (len(g), 1))  # no gradient (a flat interior): look down
    return np.where(norm > 0, g / np.maximum(norm, 1e-30), down)


def point_cloud(field: Field, box: np.ndarray, resolution: int, threshold: float, volume: np.ndarray | None = None):
    """The lattice vertices whose density exceeds ``threshold``.

    Args:
        field: the field (:func:`model_field`, :func:`region_field`). box: (2, 3) float scene box.
        resolution: N. threshold: density, 1 / scene unit.
        volume: the lattice's density when already sampled (:func:`sample_lattice`).
    Returns:
        points (P, 3) float64 scene units, normals (P, 3) float64 unit outward (minus the density's
        gradient), colours (P, 3) uint8 (looking inward).
    """
    box = np.asarray(box, np.float64)
    volume = sample_lattice(field, box, resolution) if volume is None else volume
    cell = (box[1] - box[0]) / (resolution - 1)
    index = np.argwhere(volume > threshold)
    points = box[0] + index * cell
    inward = _inward(volume, cell, index)
    rgb = _call(field, field.rgb, points, inward)
    return points, -inward, to_uint8(rgb)


def extract_mesh(field: Field, box: np.ndarray, resolution: int, threshold: float,
                 volume: np.ndarray | None = None):
    """Marching cubes of the density at level ``threshold``, coloured looking inward.

    Args: as :func:`point_cloud`.
    Returns:
        vertices (V, 3) float64 scene units, faces (F, 3) int64 (counter-clockwise seen from
        outside), normals (V, 3) float64 unit outward, colours (V, 3) uint8.
    Raises:
        ImportError: scikit-image missing (``pip install distnerf[export]``);
        ValueError: no density above ``threshold`` (no surface).
    """
    try:
        from skimage import measure
    except ImportError as err:
        raise ImportError("format=mesh needs scikit-image: pip install 'distnerf[export]'") from err
    box = np.asarray(box, np.float64)
    volume = sample_lattice(field, box, resolution) if volume is None else volume
    if not (volume > threshold).any():
        raise ValueError(f"no density above threshold={threshold} (max {float(volume.max()):.4g}): no surface")
    cell = (box[1] - box[0]) / (resolution - 1)
    padded = np.pad(volume, 1)  # empty outside the box: content cut by the box is closed at its faces
    verts, faces, normals, _ = measure.marching_cubes(padded, level=threshold, spacing=tuple(cell),
                                                      gradient_direction="ascent", allow_degenerate=False)
    verts = verts - cell + box[0]
    normals = normals / np.maximum(np.linalg.norm(normals, axis=-1, keepdims=True), 1e-12)
    colours = inward_colours(field, verts, normals, float(cell.min()))
    return verts, faces.astype(np.int64), normals.astype(np.float64), colours


def inward_colours(field: Field, vertices: np.ndarray, normals: np.ndarray, cell: float) -> np.ndarray:
    """(V, 3) uint8 colour at surface vertices: the field composited along the ray that enters
    along ``-normals`` from ``COLOUR_REACH`` cells outside to as far inside (``COLOUR_SAMPLES``
    samples, ``alpha = 1 - exp(-sigma dt)``, weights ``T alpha``, divided by their sum); the
    colour at the vertex where the weights sum below 1e-4."""
    reach, n = COLOUR_REACH * cell, COLOUR_SAMPLES
    dt = 2 * reach / n
    offsets = reach - (np.arange(n) + 0.5) * dt  # along the outward normal: outside first
    pts = (vertices[:, None, :] + offsets[None, :, None] * normals[:, None, :]).reshape(-1, 3)
    dirs = np.repeat(-normals, n, axis=0)
    sigma = _call(field, field.density, pts).reshape(-1, n).astype(np.float64)
    rgb = _call(field, field.rgb, pts, dirs).reshape(-1, n, 3).astype(np.float64)
    alpha = 1.0 - np.exp(-sigma * dt)
    trans = np.cumprod(np.concatenate([np.ones((len(alpha), 1)), 1.0 - alpha[:, :-1]], 1), 1)
    weights = trans * alpha
    total = weights.sum(1, keepdims=True)
    at_vertex = _call(field, field.rgb, vertices, -normals)
    colour = np.where(total > 1e-4, (weights[..., None] * rgb).sum(1) / np.maximum(total, 1e-12), at_vertex)
    return to_uint8(colour)


def to_uint8(rgb: np.ndarray) -> np.ndarray:
    """(P, 3) float RGB in [0, 1] (clipped) -> (P, 3) uint8."""
    return np.round(np.clip(rgb, 0.0, 1.0) * 255.0).astype(np.uint8)


def to_capture_frame(points: np.ndarray, normals: np.ndarray, transform: dict | None):
    """Scene-frame points and unit normals (P, 3) -> the capture's frame, through the inverse of
    ``transform["matrix"]`` (4x4, ``p_scene = M [p_source, 1]``, a similarity); unchanged when
    ``transform`` is None (the scene frame is the capture's: Blender, the built-in scenes)."""
    if transform is None:
        return points, normals
    matrix = np.asarray(transform["matrix"], np.float64)
    inverse = np.linalg.inv(matrix)
    out = points @ inverse[:3, :3].T + inverse[:3, 3]
    rotated = normals @ inverse[:3, :3].T  # s^-1 R^T: a rotation times a positive scale
    return out, rotated / np.maximum(np.linalg.norm(rotated, axis=-1, keepdims=True), 1e-12)
