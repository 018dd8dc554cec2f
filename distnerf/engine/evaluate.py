"""Chunked full-image rendering and test-split evaluation.

Legend: H, W image size; chunk = rays rendered at once, point_chunk = points per network
call inside a chunk (both bound memory: models that sample a fixed count per ray, NeRF,
turn ``chunk`` rays into ``chunk * S`` points).

A test view's per-image appearance: :mod:`.held_out_appearance`.
"""
from __future__ import annotations

import contextlib
import json
import logging
import statistics
import time
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import torch

from ..data.base import SceneData
from ..data.rays import image_rays
from ..data import load_scene
from .. import distributed as D
from ..observe.metrics import LPIPS, LPIPS_BACKBONE, PSNR_MAX_DB, psnr, ssim
from ..config_check import section
from ..schema import EvalConfig
from ..strategy.fusion import FusedRenderer
from .held_out_appearance import appearance_protocol, appearance_tables, clear_appearance, fit_appearance

log = logging.getLogger(__name__)


COUNTS = ("num_samples", "num_density_samples", "num_colour_samples")


@contextlib.contextmanager
def point_chunk_set(model, point_chunk: int | None):
    """Within the block, every submodule of ``model`` that has a ``point_chunk`` attribute
    (:class:`~distnerf.model.nerf.NeRFModel`, also inside a fusion stage) evaluates its
    networks in calls of at most ``point_chunk`` points (0: no limit; None: leave as is)."""
    if point_chunk is None:
        yield
        return
    old = [(m, m.point_chunk) for m in model.modules() if hasattr(m, "point_chunk")]
    for m, _ in old:
        m.point_chunk = int(point_chunk)
    try:
        yield
    finally:
        for m, value in old:
            m.point_chunk = value


@torch.no_grad()
def render_image(model, scene: SceneData, index: int, chunk: int, device, point_chunk: int | None = None) -> dict:
    """Render view ``index`` of ``scene`` in chunks of ``chunk`` rays.

    ``point_chunk``: points per network call (``eval.point_chunk``; see :func:`point_chunk_set`);
    None leaves the model's setting (by default, no limit).

    Returns:
        dict with ``rgb`` (H, W, 3) float32 in [0, 1], ``depth`` (H, W) float32 (ray
        parameter units), ``opacity`` (H, W) float32, ``num_samples`` int (marched), and
        ``num_density_samples`` / ``num_colour_samples`` when the model reports them; on the CPU.
        H, W: the view's own size (``scene.cameras.size(index)``).
    """
    was_training = model.training
    model.eval()
    rays = image_rays(scene.cameras, index, scene.near, scene.far, scene.ndc)
    outs = {"rgb": [], "depth": [], "opacity": []}
    counts: dict[str, int] = {}
    with point_chunk_set(model, point_chunk):
        for start in range(0, len(rays), chunk):
            part = rays.map(lambda t: t[start:start + chunk].to(device))
            out = model(part)
            for k in outs:
                outs[k].append(getattr(out, k).float().cpu())
            for k in COUNTS:
                if getattr(out, k) is not None:
                    counts[k] = counts.get(k, 0) + int(getattr(out, k))
    model.train(was_training)
    h, w = scene.cameras.size(index)
    return {"rgb": torch.cat(outs["rgb"]).view(h, w, 3).clamp(0, 1),
            "depth": torch.cat(outs["depth"]).view(h, w),
            "opacity": torch.cat(outs["opacity"]).view(h, w), "num_samples": counts.get("num_samples", 0),
            **{k: v for k, v in counts.items() if k != "num_samples"}}


def save_depth_png(depth: torch.Tensor, path: Path) -> None:
    """Depth normalised to its own [min, max] of the covered range, 8-bit grey."""
    d = depth.numpy()
    lo, hi = np.percentile(d, 1), np.percentile(d, 99)
    img = np.clip((d - lo) / max(hi - lo, 1e-8), 0, 1)
    iio.imwrite(path, (img * 255).round().astype(np.uint8))


def evaluate_views(model, scene: SceneData, views: list[int], chunk: int, device,
                   out_dir: Path | None, lpips: LPIPS | None, point_chunk: int | None = None,
                   eval_cfg=None) -> list[dict]:
    """Render ``views`` (``chunk`` rays, ``point_chunk`` points per network call: see
    :func:`render_image`), score them against ground truth, write RGB and depth PNGs.

    ``eval_cfg``: the ``eval`` config (defaults: :class:`~distnerf.schema.EvalConfig`); with
    ``appearance=fit_left_half`` and a model with a per-image appearance table, each view's code
    is first fitted on its left half (:func:`fit_appearance`) and the metrics score the right
    half (columns ``u >= W // 2``); the written render is the whole view.

    Returns:
        one dict per view: ``view``, ``name``, ``psnr``, ``ssim``, ``lpips`` (None when
        unavailable), ``constant_psnr`` (the trivial level: the PSNR of the best constant image,
        every pixel the view's own mean colour), ``num_samples``, ``num_rays`` (the view's pixels), ``seconds`` (wall time of the render, its results
        copied to the CPU: on CUDA every kernel has finished) and ``rays_per_s``; with a fitted
        code also ``fit_loss`` and ``fit_seconds`` (not in ``seconds``).
    """
    fit = section(EvalConfig, eval_cfg).appearance == "fit_left_half" and bool(appearance_tables(model))
    rows = []
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
    for i in views:
        fitted = fit_appearance(model, scene, i, device, eval_cfg) if fit else {}
        start = time.perf_counter()
        out = render_image(model, scene, i, chunk, device, point_chunk)
        seconds = time.perf_counter() - start  # render_image ends with device-to-host copies
        clear_appearance(model)
        gt = scene.image(i)  # at the view's own size (padding of smaller images cropped)
        name = Path(scene.image_paths[i]).stem if scene.image_paths else f"{i:03d}"
        pred, ref = out["rgb"], gt
        if fit:  # scored on the half the code never saw
            pred, ref = pred[:, gt.shape[1] // 2:], ref[:, gt.shape[1] // 2:]
        constant = ref.reshape(-1, ref.shape[-1]).mean(0).expand_as(ref)  # the view's own mean colour
        rows.append({"view": i, "name": name, "psnr": psnr(pred, ref), "ssim": ssim(pred, ref),
                     "constant_psnr": psnr(constant, ref),
                     "lpips": lpips(pred, ref) if lpips is not None else None,
                     "num_samples": out["num_samples"], "seconds": seconds, "num_rays": gt.shape[0] * gt.shape[1],
                     "rays_per_s": gt.shape[0] * gt.shape[1] / max(seconds, 1e-9), **fitted})
        if out_dir is not None:
            iio.imwrite(Path(out_dir) / f"{i:03d}_{name}_rgb.png", (out["rgb"].numpy() * 255).round().astype(np.uint8))
            save_depth_png(out["depth"], Path(out_dir) / f"{i:03d}_{name}_depth.png")
    return rows


def image_panels(scene: SceneData, rows: list[dict], render_dir: Path, prefix: str) -> dict:
    """{``<prefix>/<view name>``: (H, 3W, 3) uint8 panel}: ground truth | prediction | depth of each row's
    view, the prediction and depth read from the PNGs :func:`evaluate_views` wrote in ``render_dir``."""
    out = {}
    for r in rows:
        stem = Path(render_dir) / f"{r['view']:03d}_{r['name']}"
        rgb = iio.imread(f"{stem}_rgb.png")[..., :3]
        depth = iio.imread(f"{stem}_depth.png")
        depth = np.repeat(depth[..., None], 3, axis=-1) if depth.ndim == 2 else depth[..., :3]
        truth = (scene.image(r["view"]).numpy() * 255).round().astype(np.uint8)
        h = min(truth.shape[0], rgb.shape[0], depth.shape[0])
        out[f"{prefix}/{r['name']}"] = np.concatenate([truth[:h], rgb[:h], depth[:h]], axis=1)
    return out


def select_views(num_available: int, num_views: int | None) -> list[int]:
    """All views (``num_views`` None or <= 0), else ``num_views`` evenly spaced ones
    (e.g. 25 of lego's 200 test views: r_0, r_8, ...)."""
    if not num_views or num_views <= 0 or num_views >= num_available:
        return list(range(num_available))
    stride = num_available / num_views
    return sorted({int(i * stride) for i in range(num_views)})


def gather_view_rows(strategy, rows: list[dict]) -> list[dict]:
    """Every rank's evaluation rows (dicts with a ``"view"`` key), sorted by view. Collective (every
    rank at the same point) unless rendering is collective (``strategy.renders_collectively``: every
    rank rendered every view, so the rows are already the same on every rank)."""
    if not strategy.renders_collectively:
        rows = [row for part in D.gather_objects(strategy.env, rows) for row in part]  # collective: pickled rows
    return sorted(rows, key=lambda row: row["view"])


def make_eval_split(cfg, model, strategy):
    """A function ``(split, num_views, downscale, out_dir, lpips) -> {"scene", "rows"}`` that
    renders this rank's share of the views with the unwrapped model and gathers all rows."""

    def eval_split(split: str, num_views, downscale: int, out_dir: Path | None, lpips) -> dict:
        scene = load_scene(cfg.dataset, split)
        if downscale > 1:
            scene = scene.downscaled(downscale)
        views = select_views(len(scene), num_views)
        mine = [views[i] for i in strategy.eval_views(len(views))]
        device = next(model.buffers()).device
        renderer = strategy.inference_model(model)  # ss: the fusion stage over every region
        timing = renderer.timing if isinstance(renderer, FusedRenderer) else None  # routing, exchange, total
        if timing is not None:
            timing.clear()
            renderer.timed = cfg.eval.fusion_timing  # CUDA: each phase a device sync (CPU: always timed)
            if not renderer.keeps_timing:
                timing = None  # not measured: None, never zeros
        rows = evaluate_views(renderer, scene, mine, cfg.eval.chunk, device,
                              out_dir if strategy.env.is_main or not strategy.renders_collectively else None, lpips, cfg.eval.point_chunk, cfg.eval)
        rows = gather_view_rows(strategy, rows)
        return {"scene": scene, "rows": rows, "fusion_timing": dict(timing) if timing is not None else None}

    return eval_split


def evaluate_run(cfg, model, strategy, out_dir: Path, step: int, eval_split) -> dict:
    """Shared by training and ``distnerf.render``: evaluate the test split, write
    ``out_dir/metrics.json`` (main rank) and renders under ``out_dir/test/``.

    Returns:
        ``psnr``, ``ssim``, ``lpips`` (the means), ``scene`` (the evaluated split) and ``rows`` (per view).
    """
    eval_cfg = cfg.eval
    lpips = LPIPS() if eval_cfg.lpips else None
    downscale = eval_cfg.downscale
    res = eval_split("test", eval_cfg.num_views, downscale, Path(out_dir) / "test", lpips)
    rows, scene = res["rows"], res["scene"]
    # an exact view (PSNR at the cap: e.g. every ray misses the scene and the background is right) would
    # lift the mean by tens of dB: such views are counted and named, and left out of every mean
    perfect = [r["name"] for r in rows if r["psnr"] >= PSNR_MAX_DB]
    scored = [r for r in rows if r["psnr"] < PSNR_MAX_DB] or rows  # every view exact: the mean of all
    mean = lambda k: sum(r[k] for r in scored) / len(scored)  # noqa: E731
    metrics = {
        "step": step, "psnr": mean("psnr"), "ssim": mean("ssim"),
        "perfect_views": perfect, "num_scored_views": len(scored),
        "constant_psnr": mean("constant_psnr"),  # the trivial level: each view's mean colour everywhere
        "lpips": mean("lpips") if lpips is not None and lpips.available else None,
        "lpips_backbone": LPIPS_BACKBONE,
        # one rendering process's rate: all views' rays over their summed render seconds (the first
        # view's warm-up included), and the median view's
        "eval_rays_per_s": sum(r["num_rays"] for r in rows) / max(sum(r["seconds"] for r in rows), 1e-9),
        "eval_rays_per_s_median": statistics.median(r["rays_per_s"] for r in rows),
        "lpips_reason": None if lpips is not None and lpips.available else (
            lpips.reason if lpips is not None else "disabled by eval.lpips=false"),
        "protocol": {"split": "test", "num_views": len(rows), "views": [r["name"] for r in rows],
                     "resolution": [scene.height, scene.width], "eval_downscale": downscale,
                     "sizes": "per view (resolution is the largest)" if scene.cameras.sizes is not None else "all equal",
                     "background": [float(x) for x in scene.background], "psnr": (f"mean of per-image PSNR over the views below the {PSNR_MAX_DB:g} dB cap; a view at the cap "
                              "(an exact render) is named in perfect_views and left out of the PSNR, SSIM and LPIPS "
                              "means (every view at the cap: the mean of all)"),
                     "ssim": "torchmetrics SSIM, gaussian 11x11, sigma 1.5, data range 1",
                     "dataset": str(scene.source),
                     "appearance": appearance_protocol(cfg, model),
                     # renders and depths are in the scene's normalised frame; this maps the dataset's into it
                     "scene_transform": scene.transform},
        "per_view": rows,
        # ss: the fusion stage's seconds over this rank's views (routing_s, exchange_composite_s, total_s)
        "fusion_timing": res.get("fusion_timing"),
    }
    if strategy.env.is_main:
        # strict JSON (no NaN/Infinity, which most parsers refuse): PSNR is capped, see observe.metrics.psnr
        (Path(out_dir) / "metrics.json").write_text(json.dumps(metrics, indent=1, allow_nan=False))
        log.info("test: PSNR %.2f dB, SSIM %.4f over %d views (%dx%d)", metrics["psnr"], metrics["ssim"],
                 len(rows), scene.height, scene.width)
    return {**{k: metrics[k] for k in ("psnr", "ssim", "lpips")}, "scene": scene, "rows": rows}
