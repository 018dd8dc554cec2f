"""Where regions meet: test PSNR at the seams of a spatial partition against the rest (issue 25 item 2).

Independent ``ss`` (Mega-NeRF) trains each region's sub-model on the rays that cross it and
composites them at evaluation; its errors are expected where one sub-model hands a ray over to
the next. This module measures that from a finished run's test renders, with no model loaded:

* the surface point behind every test pixel is found exactly, by intersecting the pixel's
  centre ray (:func:`distnerf.data.rays.image_rays`) with the built-in scene's analytic
  geometry (:func:`distnerf.data.synthetic.tracer.nearest_hit`; the generator is independent
  of distnerf's renderer);
* a pixel is a *seam* pixel when its surface point lies within ``band`` (world units) of a
  face shared by two regions of the partition: moving the point by ``band`` along some axis
  changes its owner (:meth:`~distnerf.strategy.partition.Partition.region_of`); the faces of
  the scene box are no seam;
* PSNR is pooled over the views: ``-10 log10(MSE)`` of all seam pixels (all channels) of all
  scored views, and likewise for the other surface pixels (the *rest*); pixels whose ray
  misses the geometry (background) are in neither.

The same masks score ``ddp`` and one-rank runs (whose model has no seams) as the reference:
a seam gap (seam minus rest) that only ``ss`` shows is the seam's cost.

Only the built-in synthetic scenes (``dataset=synthetic``) have analytic geometry; other
datasets are refused by name.
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import torch
import yaml

from ..data import load_scene
from ..data.images import undecoded
from ..data.rays import image_rays
from ..strategy.partition import Partition

def seam_mask(points: torch.Tensor, partition: Partition, band: float) -> torch.Tensor:
    """Which points lie within ``band`` of a face shared by two regions.

    Args:
        points: (P, 3) float world positions (inside the scene box; outside ones are clamped to
            it, so the box's own faces are never a seam).
        partition: the regions (their core boxes, without overlap).
        band: half-width of the seam band in world units (> 0).
    Returns:
        (P,) bool.
    Raises:
        ValueError: ``band <= 0``.
    """
    if not band > 0:
        raise ValueError(f"seam band must be > 0 world units, got {band}")
    pts = points.to(torch.float64)
    owner = partition.region_of(pts)
    seam = torch.zeros(pts.shape[0], dtype=torch.bool)
    for axis in range(3):
        step = torch.zeros(3, dtype=torch.float64)
        step[axis] = band
        for sign in (1.0, -1.0):
            seam |= partition.region_of(pts + sign * step) != owner
    return seam


def pooled_psnr(sq_err_sum: float, count: int) -> float | None:
    """``-10 log10(sum / count)`` (data range 1), or None for no pixel."""
    if count == 0:
        return None
    return -10.0 * math.log10(max(sq_err_sum / count, 1e-10))


@functools.lru_cache(maxsize=4)
def _built_scene(kind: str):
    """The generator's scene of ``kind`` with its defaults (built once per kind: every view reads it)."""
    from ..data.synthetic.scenes import build_scene

    return build_scene(kind)


def surface_points(scene_cfg: dict, test_scene, view: int):
    """The analytic surface point behind each pixel centre of test view ``view``.

    Args:
        scene_cfg: the run's ``dataset`` config (``name`` must be ``synthetic``).
        test_scene: the loaded test split (:func:`distnerf.data.load_scene`).
        view: index into it.
    Returns:
        points (H*W, 3) float64 (row-major pixels; undefined where ``hit`` is False), hit (H*W,) bool.
    Raises:
        ValueError: not a built-in synthetic scene, or the view's camera is not the generator's.
    """
    if scene_cfg.get("name") != "synthetic":
        raise ValueError(f"seams need analytic geometry: dataset={scene_cfg.get('name')!r} is not the built-in "
                         f"synthetic scene (dataset=synthetic)")
    from ..data.synthetic.tracer import nearest_hit

    spec = _built_scene(scene_cfg["kind"])
    test_c2w = spec.c2w.get("test")
    loaded = test_scene.cameras.c2w[view][:3, :4].double()
    if test_c2w is None or view >= len(test_c2w) or not torch.allclose(
            torch.as_tensor(test_c2w[view][:3, :4]), loaded, atol=1e-4):
        raise ValueError(f"test view {view} of the {scene_cfg['kind']!r} scene in {scene_cfg.get('cache_dir')}: its "
                         f"camera is not the one the generator builds with its defaults (other view counts or seed?)")
    rays = image_rays(test_scene.cameras, view, test_scene.near, test_scene.far)
    origins = rays.origins.double().numpy()
    dirs = rays.directions.double().numpy()
    dirs = dirs / np.linalg.norm(dirs, axis=-1, keepdims=True)
    t, index, _ = nearest_hit(spec.primitives, origins, dirs)
    hit = index >= 0
    points = origins + np.where(hit, t, 0.0)[:, None] * dirs
    return torch.from_numpy(points), torch.from_numpy(hit)


def score_renders(run_dir: Path, masks_of, cache: dict | None = None) -> dict:
    """Pooled PSNR of one finished run's test renders (``RUN/test/*_rgb.png``) over pixel masks.

    Args:
        run_dir: a training run directory with ``config.yaml``, ``metrics.json`` and the renders.
        masks_of: ``masks_of(points, hit, view) -> {name: (H*W,) bool}`` from the view's surface points
            ((H*W, 3) float64) and hits (:func:`surface_points`); its result is cached per view under
            ``masks_of.key`` (a hashable naming what the masks depend on, besides the view).
        cache: optional dict reused across runs of one scene (test split, surface points, masks).
    Returns:
        ``{name}_psnr`` (dB, pooled over views, None without pixels), ``{name}_pixels`` per mask, ``views``.
    Raises:
        FileNotFoundError: a render named in ``metrics.json`` is missing (named).
        ValueError: not a built-in synthetic scene; a render of another size than its view.
    """
    run_dir = Path(run_dir)
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    metrics = json.loads((run_dir / "metrics.json").read_text())
    if cfg["dataset"].get("name") != "synthetic":
        raise ValueError(f"{run_dir / 'config.yaml'}: seams need analytic geometry (every mask here does), and dataset="
                         f"{cfg['dataset'].get('name')!r} is not the built-in synthetic scene (dataset=synthetic)")
    cache = {} if cache is None else cache
    downscale = int(cfg["eval"]["downscale"])  # a run's config.yaml holds every key
    key = json.dumps(cfg["dataset"], sort_keys=True) + f"/{downscale}"
    if key not in cache:
        scene = load_scene(cfg["dataset"], "test")
        if downscale > 1:
            scene = scene.downscaled(downscale)
        cache[key] = {"scene": scene, "points": {}, "masks": {}}
    scene, points, masks = cache[key]["scene"], cache[key]["points"], cache[key]["masks"]
    sums: dict[str, list] = {}
    views = [(r["view"], r["name"]) for r in metrics.get("per_view", [])]
    if not views:
        raise ValueError(f"{run_dir / 'metrics.json'}: no per-view rows ('per_view') to score")
    for view, name in views:
        path = run_dir / "test" / f"{view:03d}_{name}_rgb.png"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: the test render of view {name} is missing")
        pred = torch.from_numpy(iio.imread(path)[..., :3].astype(np.float64) / 255.0)
        ref = scene.image(view).double()
        if pred.shape != ref.shape:
            raise ValueError(f"{path}: render is {tuple(pred.shape)}, the view is {tuple(ref.shape)}")
        if view not in points:
            points[view] = surface_points(cfg["dataset"], scene, view)
        if (masks_of.key, view) not in masks:  # the same for every cell scored with these masks
            masks[masks_of.key, view] = masks_of(*points[view], view)
        err = ((pred - ref) ** 2).reshape(-1, 3).sum(dim=1)
        for name_, mask in masks[masks_of.key, view].items():
            acc = sums.setdefault(name_, [0.0, 0])
            acc[0] += float(err[mask].sum())
            acc[1] += int(mask.sum()) * 3
    out = {f"{n}_psnr": pooled_psnr(*acc) for n, acc in sums.items()}
    out.update({f"{n}_pixels": acc[1] // 3 for n, acc in sums.items()})
    return {**out, "views": len(views)}


def run_seams(run_dir: Path, partition: Partition, band: float, cache: dict | None = None) -> dict:
    """Seam and rest PSNR of one finished run's test renders (:func:`score_renders`: surface pixels within
    ``band`` world units of a face shared by two regions of ``partition``, and the other surface pixels).

    Returns:
        ``seam_psnr``, ``rest_psnr`` (dB, pooled over views, None without pixels), ``gap_db``
        (seam minus rest), ``seam_pixels``, ``rest_pixels``, ``views``.
    Raises:
        as :func:`score_renders`.
    """
    def masks_of(pts, hit, view):
        seam = seam_mask(pts, partition, band) & hit
        return {"seam": seam, "rest": hit & ~seam}

    masks_of.key = ("seams", partition.boxes.numpy().tobytes(), band)
    out = score_renders(run_dir, masks_of, cache)
    seam_psnr, rest_psnr = out.get("seam_psnr"), out.get("rest_psnr")
    return {"seam_psnr": seam_psnr, "rest_psnr": rest_psnr,
            "gap_db": None if seam_psnr is None or rest_psnr is None else seam_psnr - rest_psnr,
            "seam_pixels": out.get("seam_pixels", 0), "rest_pixels": out.get("rest_pixels", 0), "views": out["views"]}


def run_inside_beyond(run_dir: Path, aabb, cache: dict | None = None) -> dict:
    """PSNR of one finished run's test renders over the pixels whose surface point lies inside the scene box
    ``aabb`` ((2, 3), closed) and over the others (surface points beyond it, and rays that hit nothing: the
    sky of an aerial scene), the same pixels for every run of the scene (:func:`score_renders`).

    Returns:
        ``inside_psnr``, ``beyond_psnr`` (dB, pooled over views), ``inside_pixels``, ``beyond_pixels``, ``views``.
    """
    box = torch.as_tensor(aabb, dtype=torch.float64)

    def masks_of(pts, hit, view):
        inside = hit & ((pts >= box[0]) & (pts <= box[1])).all(dim=-1)
        return {"inside": inside, "beyond": ~inside}

    masks_of.key = ("inside_beyond", box.numpy().tobytes())
    return score_renders(run_dir, masks_of, cache)


def study_inside_beyond(study_dir: Path) -> dict:
    """:func:`run_inside_beyond` of every finished cell of a study (the scene box: the cell's test split's).

    Returns:
        ``{"rows": [...]}``, a row per cell: ``cell``, ``key``, ``values`` (the axes), ``repeat``, ``psnr``
        (``metrics.json``'s), and :func:`run_inside_beyond`'s figures.
    """
    cells_dir = Path(study_dir) / "cells"
    rows, cache = [], {}
    for d in sorted(p for p in cells_dir.iterdir() if (p / "study_cell.json").is_file()):
        info = json.loads((d / "study_cell.json").read_text())
        if info.get("status") != "done" or not (d / "metrics.json").is_file():
            continue
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        if "aabb" not in cache:  # one scene per study (its box: no pixels decoded)
            cache["aabb"] = load_scene(cfg["dataset"], "test", pixels=undecoded).aabb
        aabb = cache["aabb"]
        metrics = json.loads((d / "metrics.json").read_text())
        rows.append({"cell": info["cell"], "key": info["key"], "values": info["values"], "repeat": info["repeat"],
                     "psnr": metrics.get("psnr"), **run_inside_beyond(d, aabb, cache)})
    return {"rows": rows}


def study_seams(study_dir: Path, band: float) -> dict:
    """Seam and rest PSNR of every finished cell of a study, under each world size's partition.

    The partition of world size W is read from the study's ``ss`` cells at W (``partition.json``;
    all of them must agree). Every finished cell at W is scored under it, and every one-rank cell
    under each W's partition (the reference without seams).

    Returns:
        ``{"band": band, "partitions": {W: boxes}, "rows": [...]}``, a row per (cell, W): ``cell``,
        ``key``, ``strategy``, ``world_size``, ``budget`` (the cell's budget level, or None),
        ``repeat``, ``partition_world_size`` and
        :func:`run_seams`'s figures.
    Raises:
        ValueError: no finished ``ss`` cell with a partition; two ``ss`` cells at one W disagree.
    """
    cells_dir = Path(study_dir) / "cells"
    cells = []
    for d in sorted(p for p in cells_dir.iterdir() if (p / "study_cell.json").is_file()):
        info = json.loads((d / "study_cell.json").read_text())
        if info.get("status") == "done" and (d / "metrics.json").is_file():
            cells.append((d, info))
    partitions: dict[int, Partition] = {}
    for d, info in cells:
        if (d / "partition.json").is_file():
            part = Partition.load(d / "partition.json")
            w = int(info["values"]["world_size"])
            if w in partitions and not torch.equal(partitions[w].boxes, part.boxes):
                raise ValueError(f"{d / 'partition.json'}: differs from another ss cell's partition at world size {w}")
            partitions.setdefault(w, part)
    if not partitions:
        raise ValueError(f"{cells_dir}: no finished ss cell with a partition.json: nothing defines the seams")
    rows, cache = [], {}
    for d, info in cells:
        w = int(info["values"]["world_size"])
        for pw in ([w] if w in partitions else sorted(partitions) if w == 1 else []):
            rows.append({"cell": info["cell"], "key": info["key"], "strategy": info["values"]["strategy"],
                         "world_size": w, "budget": info["values"].get("budget"), "repeat": info["repeat"],
                         "partition_world_size": pw,
                         **run_seams(d, partitions[pw], band, cache)})
    return {"band": band, "partitions": {str(w): p.boxes.tolist() for w, p in sorted(partitions.items())},
            "rows": rows}
