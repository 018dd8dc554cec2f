"""Chunked full-image rendering and test-split evaluation.

Legend: H, W image size; chunk = rays rendered at once (bounds memory).
"""
from __future__ import annotations

from pathlib import Path

import imageio.v3 as iio
import numpy as np
import torch

from ..data.base import SceneData
from ..data.rays import image_rays
from ..observe.metrics import LPIPS, psnr, ssim


COUNTS = ("num_samples", "num_density_samples", "num_colour_samples")


@torch.no_grad()
def render_image(model, scene: SceneData, index: int, chunk: int, device) -> dict:
    """Render view ``index`` of ``scene`` in chunks of ``chunk`` rays.

    Returns:
        dict with ``rgb`` (H, W, 3) float32 in [0, 1], ``depth`` (H, W) float32 (ray
        parameter units), ``opacity`` (H, W) float32, ``num_samples`` int (marched), and
        ``num_density_samples`` / ``num_colour_samples`` when the model reports them; on the CPU.
    """
    was_training = model.training
    model.eval()
    rays = image_rays(scene.cameras, index, scene.near, scene.far, scene.ndc)
    outs = {"rgb": [], "depth": [], "opacity": []}
    counts: dict[str, int] = {}
    for start in range(0, len(rays), chunk):
        part = rays.map(lambda t: t[start:start + chunk].to(device))
        out = model(part)
        for k in outs:
            outs[k].append(out[k].float().cpu())
        for k in COUNTS:
            if k in out:
                counts[k] = counts.get(k, 0) + int(out[k])
    model.train(was_training)
    h, w = scene.height, scene.width
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
                   out_dir: Path | None, lpips: LPIPS | None) -> list[dict]:
    """Render ``views``, score them against ground truth, write RGB and depth PNGs.

    Returns:
        one dict per view: ``view``, ``name``, ``psnr``, ``ssim``, ``lpips`` (None when
        unavailable), ``num_samples``.
    """
    rows = []
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
    for i in views:
        out = render_image(model, scene, i, chunk, device)
        gt = scene.images[i]
        name = Path(scene.image_paths[i]).stem if scene.image_paths else f"{i:03d}"
        rows.append({"view": i, "name": name, "psnr": psnr(out["rgb"], gt), "ssim": ssim(out["rgb"], gt),
                     "lpips": lpips(out["rgb"], gt) if lpips is not None else None,
                     "num_samples": out["num_samples"]})
        if out_dir is not None:
            iio.imwrite(Path(out_dir) / f"{i:03d}_{name}_rgb.png", (out["rgb"].numpy() * 255).round().astype(np.uint8))
            save_depth_png(out["depth"], Path(out_dir) / f"{i:03d}_{name}_depth.png")
    return rows


def select_views(num_available: int, num_views: int | None) -> list[int]:
    """All views (``num_views`` None or <= 0), else ``num_views`` evenly spaced ones
    (e.g. 25 of lego's 200 test views: r_0, r_8, ...)."""
    if not num_views or num_views <= 0 or num_views >= num_available:
        return list(range(num_available))
    stride = num_available / num_views
    return sorted({int(i * stride) for i in range(num_views)})
