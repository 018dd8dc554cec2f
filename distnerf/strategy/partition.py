"""Spatial partition of a scene into axis-aligned regions (``strategy=ss``).

Legend: K regions, P points, R rays, M density-estimate cells per axis.

The regions are boxes that tile the scene box (``bounds``) exactly once: a point
belongs to the region whose half-open box ``[lo, hi)`` holds it, where a face on the
scene box's own maximum is closed, so every point of the closed scene box (and,
after clamping, every point outside it) has exactly one owner. Each region also has
an *enlarged* box grown by ``overlap`` of its size on every side (Mega-NeRF,
Turki et al. 2022, Sec. 3.2, uses 15%), clipped to the scene box: training routes
the rays that cross the enlarged box to the region, and ``blend`` fusion mixes the
regions whose enlarged boxes hold a sample. Boxes live in the scene's own space
(world units, or NDC for forward-facing LLFF scenes), like every spatial structure.

Two builders:

* :func:`grid_partition`: a regular grid; with no explicit counts, factors of K go to
  the axis whose cells are currently longest, which gives a ground-plane grid on
  aerial scenes (their vertical extent is the shortest) as Mega-NeRF uses.
* :func:`balanced_partition`: a k-d split at weighted medians of weighted points (``ss``:
  points along a sample of training rays, weighted by a coarse density fit), so regions
  hold similar amounts of the training work.

Owners: :func:`assign_regions` gives each rank the same number of regions with the
most even measured cost (:func:`region_load`); :func:`region_owner` is the contiguous
layout (no costs; joint training's segment exchange orders regions by rank blocks).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..renderer.samples import clip_to_box, far_above_altitude


@dataclass
class Partition:
    """K axis-aligned regions tiling ``bounds``.

    Attributes:
        bounds: (2, 3) float64 scene box [min, max].
        boxes: (K, 2, 3) float64 region boxes; they tile ``bounds`` without overlap.
        overlap: fraction of a region's size added on every side for training / blend.
        kind: ``grid`` or ``balanced`` (how it was built).
        world_size: the ranks it was trained on (sizes the sub-models of a ``model.max_params``
            run: K / W regions share a rank's budget), or None (not known yet, or an older run).
        unbounded: the scene is unbounded (contracted sub-models): the regions tile the
            scene box, and the outer ones extend to infinity (:meth:`extents`): every
            point of space has one owner, and a ray that leaves the box is routed and
            composited to the sky by the regions it crosses out there.
    """

    bounds: torch.Tensor
    boxes: torch.Tensor
    overlap: float = 0.0
    kind: str = "grid"
    world_size: int | None = None
    unbounded: bool = False

    def __post_init__(self):
        self.bounds = torch.as_tensor(self.bounds, dtype=torch.float64).reshape(2, 3)
        self.boxes = torch.as_tensor(self.boxes, dtype=torch.float64).reshape(-1, 2, 3)
        if self.overlap < 0:
            raise ValueError(f"strategy.overlap must be >= 0, got {self.overlap}")

    def __len__(self) -> int:
        return self.boxes.shape[0]

    @property
    def centers(self) -> torch.Tensor:
        """(K, 3) float64 region box centres."""
        return self.boxes.mean(dim=1)

    def enlarged(self) -> torch.Tensor:
        """(K, 2, 3) float64 boxes grown by ``overlap`` x size per side, clipped to ``bounds``."""
        size = self.boxes[:, 1] - self.boxes[:, 0]
        lo = torch.maximum(self.boxes[:, 0] - self.overlap * size, self.bounds[0])
        hi = torch.minimum(self.boxes[:, 1] + self.overlap * size, self.bounds[1])
        return torch.stack([lo, hi], dim=1)

    def extents(self, enlarged: bool = False) -> torch.Tensor:
        """(K, 2, 3) float64 the regions (or their enlarged boxes) as rays are routed and
        clipped: the boxes themselves, or for an :attr:`unbounded` partition the boxes with
        every face that lies on the scene box's face moved to -inf / +inf (so an aerial
        scene's ground-plane tiles become columns, the outer ones reaching the horizon)."""
        boxes = self.enlarged() if enlarged else self.boxes
        if not self.unbounded:
            return boxes
        inf = torch.full_like(boxes[:, 0], float("inf"))
        lo = torch.where(self.boxes[:, 0] <= self.bounds[0], -inf, boxes[:, 0])
        hi = torch.where(self.boxes[:, 1] >= self.bounds[1], inf, boxes[:, 1])
        return torch.stack([lo, hi], dim=1)

    def contains(self, points: torch.Tensor, enlarged: bool = False) -> torch.Tensor:
        """Membership of points in every region box.

        Half-open ``[lo, hi)`` per axis, closed where ``hi`` is the scene box's maximum,
        so with ``overlap = 0`` every point of the scene box is in exactly one box.

        Args:
            points: (P, 3) float, the scene's space.
            enlarged: test the enlarged boxes instead of the regions.
        Returns:
            (P, K) bool.
        """
        boxes = (self.enlarged() if enlarged else self.boxes).to(points.device, points.dtype)
        top = self.bounds[1].to(points.device, points.dtype)
        p = points[:, None, :]
        below_hi = (p < boxes[None, :, 1]) | ((boxes[None, :, 1] >= top) & (p <= boxes[None, :, 1]))
        return ((p >= boxes[None, :, 0]) & below_hi).all(dim=-1)

    def region_of(self, points: torch.Tensor) -> torch.Tensor:
        """The owning region of each point (points outside the scene box are clamped to it).

        Args:
            points: (P, 3) float.
        Returns:
            (P,) int64 region index in [0, K).
        """
        lo, hi = self.bounds.to(points.device, points.dtype)
        inside = self.contains(torch.maximum(torch.minimum(points, hi), lo))
        assert bool((inside.sum(dim=1) == 1).all()), "partition boxes do not tile the scene box"
        return inside.to(torch.int8).argmax(dim=1)

    def ray_crossings(self, origins, directions, near, far, enlarged: bool = True) -> torch.Tensor:
        """Which region boxes (:meth:`extents`) each ray segment ``[near, far]`` crosses (slab test).

        Args:
            origins, directions: (R, 3) float. near, far: (R,) float.
        Returns:
            (R, K) bool.
        """
        boxes = self.extents(enlarged).to(origins.device, origins.dtype)
        out = []
        for box in boxes:
            t_in, t_out = clip_to_box(origins, directions, near, far, box)
            out.append(t_in <= t_out)
        return torch.stack(out, dim=1)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "overlap": self.overlap, "bounds": self.bounds.tolist(),
                "boxes": self.boxes.tolist(), "world_size": self.world_size, "unbounded": self.unbounded}

    @classmethod
    def from_dict(cls, d: dict) -> "Partition":
        return cls(torch.tensor(d["bounds"]), torch.tensor(d["boxes"]), float(d["overlap"]), d.get("kind", "grid"),
                   d.get("world_size"), bool(d.get("unbounded", False)))  # older files: neither key

    def save(self, path: Path) -> None:
        from ..fileio import atomic_write_text

        atomic_write_text(Path(path), json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: Path) -> "Partition":
        """Raises FileNotFoundError or ValueError naming ``path``."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except FileNotFoundError:
            raise
        except (KeyError, ValueError, TypeError) as err:
            raise ValueError(f"{path}: not a distnerf partition file ({err})") from err


def to_infinity(rays, min_altitude: float | None = None):
    """The rays (a :class:`~distnerf.data.rays.RayBundle`) with ``far = inf``: the segments
    of an :attr:`Partition.unbounded` partition reach the sky (contracted sub-models); with
    ``min_altitude``, ``far`` is where a ray goes below it (the sub-models' floor,
    :func:`~distnerf.renderer.samples.far_above_altitude`), so rays are routed and cut
    where the sub-models end them."""
    far = torch.full_like(rays.far, float("inf"))
    if min_altitude is not None:
        far = far_above_altitude(rays.origins, rays.directions, far, min_altitude)
    return dataclasses.replace(rays, far=far)


def _check_count(num_regions: int) -> None:
    if num_regions < 1:
        raise ValueError(f"strategy.num_regions must be >= 1, got {num_regions}")


def _prime_factors(n: int) -> list[int]:
    out, f = [], 2
    while n > 1:
        while n % f == 0:
            out.append(f)
            n //= f
        f += 1
    return sorted(out, reverse=True)


def grid_partition(bounds, num_regions: int, counts=None, overlap: float = 0.0) -> Partition:
    """A regular grid of regions over ``bounds``.

    Args:
        bounds: (2, 3) scene box. num_regions: K.
        counts: cells per axis ``[nx, ny, nz]`` with product K, or None: each prime
            factor of K (largest first) splits the axis whose cells are longest.
        overlap: see :class:`Partition`.
    Raises:
        ValueError: counts whose product is not K.
    """
    _check_count(num_regions)
    bounds = torch.as_tensor(bounds, dtype=torch.float64).reshape(2, 3)
    extent = bounds[1] - bounds[0]
    if counts is None:
        counts = [1, 1, 1]
        for f in _prime_factors(num_regions):
            axis = int(torch.argmax(extent / torch.tensor(counts, dtype=torch.float64)))
            counts[axis] *= f
    counts = [int(c) for c in counts]
    if len(counts) != 3 or counts[0] * counts[1] * counts[2] != num_regions or min(counts) < 1:
        raise ValueError(f"strategy.grid={counts} must be 3 positive counts whose product is the number of "
                         f"regions {num_regions}")
    edges = [torch.linspace(float(bounds[0, a]), float(bounds[1, a]), counts[a] + 1, dtype=torch.float64)
             for a in range(3)]
    for a, e in enumerate(edges):  # the outer faces are the scene box's own, exactly
        e[0], e[-1] = bounds[0, a], bounds[1, a]
    boxes = [[[edges[0][i], edges[1][j], edges[2][k]], [edges[0][i + 1], edges[1][j + 1], edges[2][k + 1]]]
             for i in range(counts[0]) for j in range(counts[1]) for k in range(counts[2])]
    return Partition(bounds, torch.tensor(boxes, dtype=torch.float64), overlap, "grid")


def weighted_median_split(positions: torch.Tensor, weights: torch.Tensor, fraction: float) -> float:
    """The position below which ``fraction`` of the total weight lies.

    Args:
        positions: (P,) float coordinates. weights: (P,) float >= 0. fraction: in (0, 1).
    Returns:
        The coordinate (float); the mean position when all weights are zero.
    """
    if positions.numel() == 0:
        raise ValueError("no cells to split")
    order = torch.argsort(positions)
    cdf = torch.cumsum(weights[order].double(), 0)
    if float(cdf[-1]) <= 0:
        return float(positions.double().mean())
    i = int(torch.searchsorted(cdf, fraction * cdf[-1]))
    return float(positions[order][min(i, len(order) - 1)])


def balanced_partition(bounds, num_regions: int, points: torch.Tensor, weights: torch.Tensor,
                       overlap: float = 0.0, min_fraction: float = 0.01) -> Partition:
    """Recursive weighted-median (k-d) split so regions hold similar content.

    Each box with k regions to make is cut across its longest axis at the position
    that leaves ``floor(k/2)/k`` of its weight below; the cut is kept at least
    ``min_fraction`` of the box's length from either face so that no region
    degenerates. Weights are typically a coarse density estimate at cell centres.

    Args:
        bounds: (2, 3) scene box. num_regions: K.
        points: (P, 3) float positions of the weights (e.g. cell centres).
        weights: (P,) float >= 0 content at each position (e.g. opacity).
        overlap: see :class:`Partition`.
    """
    _check_count(num_regions)
    bounds = torch.as_tensor(bounds, dtype=torch.float64).reshape(2, 3)
    points, weights = points.double(), weights.double().clamp(min=0)

    def split(box: torch.Tensor, k: int) -> list[torch.Tensor]:
        if k == 1:
            return [box]
        axis = int(torch.argmax(box[1] - box[0]))
        inside = ((points >= box[0]) & (points <= box[1])).all(dim=1)
        k_low = k // 2
        length = float(box[1, axis] - box[0, axis])
        cut = (weighted_median_split(points[inside, axis], weights[inside], k_low / k) if bool(inside.any())
               else float(box[0, axis]) + length * k_low / k)
        cut = min(max(cut, float(box[0, axis]) + min_fraction * length), float(box[1, axis]) - min_fraction * length)
        low, high = box.clone(), box.clone()
        low[1, axis] = cut
        high[0, axis] = cut
        return split(low, k_low) + split(high, k - k_low)

    return Partition(bounds, torch.stack(split(bounds.clone(), num_regions)), overlap, "balanced")


def region_load(partition: Partition, origins, directions, near, far, images: torch.Tensor,
                marched: torch.Tensor | None = None) -> dict:
    """Training load of each region, estimated from a sample of training rays.

    A ray is routed to a region when its segment ``[near, far]`` crosses the enlarged
    box. Its cost there is the length it is marched: inside ``marched`` (an
    independent ``ss`` sub-model renders the whole ray inside the scene box) or, with
    ``marched=None``, inside the region's enlarged box; samples are evenly spaced, so
    the length is proportional to the sample count.

    Args:
        partition: K regions. origins, directions: (R, 3) float. near, far: (R,) float.
        images: (R,) int64 training image (camera) of each ray.
        marched: (2, 3) box the routed rays are marched through, or None.
    Returns:
        ``{"rays": [K] int, "cameras": [K] int, "cost": [K] float}``: sampled rays
        crossing each enlarged region, cameras with at least one such ray, and the
        summed marched length of those rays (scene units).
    """
    crossing = partition.ray_crossings(origins, directions, near, far)  # (R, K)
    boxes = partition.extents(True) if marched is None else torch.as_tensor(marched).reshape(1, 2, 3).expand(
        len(partition), 2, 3)
    out = {"rays": [], "cameras": [], "cost": []}
    for k in range(len(partition)):
        sel = crossing[:, k]
        t_in, t_out = clip_to_box(origins[sel], directions[sel], near[sel], far[sel],
                                  boxes[k].to(origins.device, origins.dtype))
        length = ((t_out - t_in).clamp(min=0) * directions[sel].norm(dim=-1)).double().sum()
        out["rays"].append(int(sel.sum()))
        out["cameras"].append(int(torch.unique(images[sel]).numel()))
        out["cost"].append(float(length))
    return out


def ray_points(rays, aabb, num_per_ray: int) -> torch.Tensor:
    """Evenly spaced points (interval midpoints) along each ray's segment inside ``aabb``.

    Args:
        rays: R rays (origins, directions, near, far). aabb: (2, 3) box. num_per_ray: S.
    Returns:
        (R' S, 3) float64 points of the R' rays that cross the box.
    """
    t_in, t_out = clip_to_box(rays.origins, rays.directions, rays.near, rays.far,
                              torch.as_tensor(aabb).to(rays.origins))
    hit = t_in < t_out
    frac = (torch.arange(num_per_ray, dtype=torch.float64) + 0.5) / num_per_ray
    t = t_in[hit, None].double() + frac * (t_out[hit] - t_in[hit])[:, None].double()  # (R', S)
    return (rays.origins[hit, None].double() + t[..., None] * rays.directions[hit, None].double()).reshape(-1, 3)


def empty_region_error(region: int, box, num_rays: int) -> ValueError:
    """The refusal of a region that no sampled training ray crosses (it would never train)."""
    return ValueError(f"ss: region {region} (box {[[round(v, 4) for v in row] for row in box]}) is crossed by none "
                      f"of {num_rays} sampled training rays: its sub-model would never train. Use fewer regions "
                      f"(strategy.num_regions), a box around the content the cameras see (dataset.aabb), or "
                      f"strategy.partition=balanced")


def assign_regions(costs: list[float], world_size: int, exact_max_regions: int = 12) -> list[int]:
    """Owning rank of each region: ``K / W`` regions per rank, measured costs balanced.

    Every rank gets the same number of regions (so the same memory: the per-rank
    ``model.max_params`` is split evenly) and the largest per-rank total cost is made
    as small as possible: exactly, by enumerating the ways to split the regions into
    equal groups, for ``K <= exact_max_regions``; beyond that greedily (longest
    processing time first, each region to the least-loaded rank with room left).
    Deterministic: ties keep the lexicographically first owner list, so equal costs give
    the contiguous blocks of :func:`region_owner`. Elastic resume reuses this function
    to reassign regions to a new world size.

    Args:
        costs: (K,) cost of each region (e.g. :func:`region_load`'s ``cost``), >= 0.
        world_size: W, a divisor of K.
    Returns:
        (K,) owner rank of each region.
    Raises:
        ValueError: when K is not a multiple of W.
    """
    num = len(costs)
    region_owner(num, world_size)  # refuses K % W != 0
    per_rank = num // world_size
    if num <= exact_max_regions:
        best: tuple[float, list[int]] | None = None
        owner, load, count = [0] * num, [0.0] * world_size, [0] * world_size

        def search(k: int, used: int) -> None:  # ranks are labelled in order of first use
            nonlocal best
            if k == num:
                top = max(load)
                if best is None or top < best[0] * (1 - 1e-12):
                    best = (top, list(owner))
                return
            for r in range(min(used + 1, world_size)):
                if count[r] < per_rank:
                    owner[k] = r
                    load[r] += costs[k]
                    count[r] += 1
                    search(k + 1, max(used, r + 1))
                    load[r] -= costs[k]
                    count[r] -= 1

        search(0, 0)
        return best[1]
    owner, load, count = [0] * num, [0.0] * world_size, [0] * world_size
    for k in sorted(range(num), key=lambda k: (-costs[k], k)):
        r = min((r for r in range(world_size) if count[r] < per_rank), key=lambda r: (load[r], r))
        owner[k] = r
        load[r] += costs[k]
        count[r] += 1
    return owner


def region_owner(num_regions: int, world_size: int) -> list[int]:
    """Owning rank of each region: contiguous blocks of ``num_regions / world_size``.

    Raises:
        ValueError: when the number of regions is not a multiple of the world size.
    """
    if num_regions % world_size:
        raise ValueError(f"strategy.num_regions={num_regions} must be a multiple of the world size {world_size}")
    per_rank = num_regions // world_size
    return [k // per_rank for k in range(num_regions)]
