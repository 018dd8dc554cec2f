"""Which vertices a trained grid model uses: the share of its table rows touched by a sample whose
compositing weight exceeds a threshold (issue 61 item 4).

A sub-model of a split holds vertices that face the other regions; under its own contraction some of
them are never reached by a sample that matters. This module counts, for a finished run's final
checkpoint, the full-resolution table rows (vertices) that are a trilinear corner of at least one
sample of weight ``w_i > threshold`` over ``batches`` batches of training rays:

* rays: uniform pixels of the training split (every image alike), ``rays`` a batch (the run's global
  batch by default), drawn from a generator seeded by ``seed``; each ray's sample grid jittered as in
  training;
* a sample's weight is its weight in the **whole ray's composite**: for one model ``T_i alpha_i``
  (:func:`~distnerf.renderer.marching.render_segment`); for joint ``ss`` a region's local weight times
  the transmittance of the segments in front of it
  (:func:`~distnerf.renderer.segments.transmittance_in_front`), each region rendering its segment as in
  training (:func:`~distnerf.strategy.joint.render_segments`: a shard the one model's intervals by
  midpoint, a per-region model its clipped segment);
* renders run as in training (autograd on, so the training termination and round settings hold; no
  parameter is changed); the opaque floor ends rays where training ends them.

The share is ``touched rows / rows`` over every model of the run (a face plane held by two shards counts
twice: the question is how much of what the ranks hold is used). It is measured on the final model, not
during the last training steps: with the learning rate cooled 100-fold over the last 20% of the steps the
two differ little, and this reads any finished run with a checkpoint.

Only ``model=grid`` without a focus box, trained with ``ddp`` (one model) or joint ``ss``; other runs are
refused by name.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..data import load_scene
from ..data.images import undecoded
from ..data.rays import RayBundle, generate_rays
from ..distributed import DistEnv
from ..engine.runs import load_renderer, load_run_config
from ..model.grid import GridModel
from ..renderer.segments import segment_entries, transmittance_in_front
from ..strategy.floor import floored_rays
from ..strategy.joint import render_segments


def training_rays(scene, count: int, generator: torch.Generator) -> RayBundle:
    """``count`` rays through uniform pixel centres of the training split ``scene`` (images alike).

    Returns:
        the rays with ``image_ids`` (R,) int64 set (their images' appearance rows).
    """
    h, w, n = scene.height, scene.width, len(scene.cameras.c2w)
    flat = torch.randint(0, n * h * w, (count,), generator=generator)
    image, pixel = flat // (h * w), flat % (h * w)
    rays = generate_rays(scene.cameras, image, pixel % w, pixel // w, scene.near, scene.far, scene.ndc)
    rays.image_ids = image
    return rays


def _mark(model: GridModel, rays: RayBundle, samples, weights: torch.Tensor, threshold: float,
          touched: torch.Tensor) -> None:
    """Set ``touched`` (V,) bool at the corner rows of ``samples`` whose weight (P,) exceeds ``threshold``."""
    keep = weights.detach() > threshold
    if not bool(keep.any()):
        return
    ray = samples.ray_indices[keep]
    t = samples.t_mids[keep]
    points = rays.origins[ray] + rays.directions[ray] * t[:, None]
    index, _ = model._corners(model.field_coordinates(points))
    touched[index.reshape(-1)] = True


def mark_touched(renderer, rays: RayBundle, jitter: torch.Tensor, threshold: float,
                 touched: list[torch.Tensor]) -> None:
    """Mark the rows touched by ``rays``' samples of weight above ``threshold`` in the whole ray's composite.

    A training render (autograd on, models in training mode: the training termination and rounds; no
    parameter changes), the sample grid of each ray offset by ``jitter`` steps as in training.

    Args:
        renderer: a :class:`~distnerf.model.grid.GridModel`, or a joint ``ss`` container
            (:class:`~distnerf.strategy.regions.JointRegionModels` holding every region) of them.
        rays: R rays. jitter: (R,) float in [0, 1).
        touched: a (V_k,) bool mask per model (region order), set in place.
    """
    joint = hasattr(renderer, "regions")
    models = list(renderer.models) if joint else [renderer]
    was = [m.training for m in models]
    for m in models:
        m.train()
    try:
        with torch.enable_grad():
            if not joint:
                model = models[0]
                step_size = model.step_size()
                anchor = rays.near + jitter * step_size / rays.directions.norm(dim=-1)
                out = model.render_segment(rays, rays.near, model.ray_far(rays), anchor, None, step_size)
                _mark(model, rays, out.samples, out.weights, threshold, touched[0])
                return
            rays, _ = floored_rays(rays, renderer.unbounded, models[0].min_altitude)
            seg = render_segments(models, renderer.regions, renderer.all_boxes, rays, jitter=jitter,
                                  keep_samples=True)
            entry = segment_entries(rays.origins, rays.directions, rays.near, rays.far, renderer.all_boxes)
            before, _ = transmittance_in_front(seg["values"][..., 3].detach(), entry)
            for k, (model, (samples, weights)) in enumerate(zip(models, seg["samples"])):
                weight = before[:, k][samples.ray_indices] * weights.detach()  # the sample's weight in the ray
                _mark(model, rays, samples, weight, threshold, touched[k])
    finally:
        for m, w in zip(models, was):
            m.train(w)


def _check(model, run_dir: Path) -> GridModel:
    if not isinstance(model, GridModel):
        raise ValueError(f"{run_dir}: the touched share counts grid vertices; this run's model is "
                         f"{type(model).__name__} (model=grid only)")
    if model.focus is not None:
        raise ValueError(f"{run_dir}: a grid with a focus box has two tables of vertices; the touched share counts "
                         f"one (model.focus_aabb unset)")
    return model


def run_touched(run_dir: Path, batches: int = 100, rays: int | None = None, threshold: float = 1e-4,
                seed: int = 0) -> dict:
    """The share of a finished run's vertices touched by a sample of weight above ``threshold`` (module docstring).

    Args:
        run_dir: a training run directory with a committed checkpoint (``ddp``, or joint ``ss``).
        batches: batches of training rays. rays: rays a batch (default: the run's ``train.global_rays``).
        threshold: the compositing weight a sample must exceed. seed: the ray generator's seed.
    Returns:
        ``touched`` (rows touched), ``vertices`` (rows held, every model), ``share`` (their ratio),
        ``per_model`` (a [touched, rows] pair per model, region order), ``rays``, ``batches``, ``threshold``, ``step``.
    Raises:
        ValueError: not a grid model without a focus box; an independent ``ss`` run; ``batches`` < 1.
        FileNotFoundError: no config or committed checkpoint (named).
    """
    if batches < 1:
        raise ValueError(f"batches must be >= 1, got {batches}")
    cfg, run_dir = load_run_config([f"run_dir={run_dir}"], prog="distnerf.study.touched")
    env = DistEnv(device=torch.device("cpu"))
    train = load_scene(cfg.dataset, "train", pixels=undecoded)
    renderer, step = load_renderer(cfg, run_dir, train, env)
    joint = cfg.strategy.name == "ss"
    if joint and cfg.strategy.training != "joint":
        raise ValueError(f"{run_dir}: an independent ss run composites blended or owned fields, not one ray's "
                         f"weights; the touched share reads ddp and joint ss runs")
    models = [_check(m, run_dir) for m in (renderer.models if joint else [renderer])]
    count = int(rays or cfg.train.global_rays)
    generator = torch.Generator().manual_seed(seed)
    touched = [torch.zeros(m.density.shape[0], dtype=torch.bool) for m in models]
    for _ in range(batches):
        batch = training_rays(train, count, generator)
        jitter = torch.rand(batch.near.shape, generator=generator, dtype=batch.near.dtype)
        mark_touched(renderer, batch, jitter, threshold, touched)
    per_model = [[int(t.sum()), int(t.numel())] for t in touched]
    hit, rows = sum(p[0] for p in per_model), sum(p[1] for p in per_model)
    return {"touched": hit, "vertices": rows, "share": hit / rows, "per_model": per_model, "rays": count,
            "batches": batches, "threshold": threshold, "step": step}


def study_touched(study_dir: Path, **kwargs) -> dict:
    """:func:`run_touched` of every finished cell of a study that kept a checkpoint.

    Returns:
        ``{"rows": [...]}``, a row per cell: ``cell``, ``key``, ``values``, ``repeat``, ``psnr`` (its test PSNR,
        ``metrics.json``'s, or None) and the figures.
    Raises:
        ValueError: no finished cell with a checkpoint.
    """
    rows = []
    for d in sorted(p for p in (Path(study_dir) / "cells").iterdir() if (p / "study_cell.json").is_file()):
        info = json.loads((d / "study_cell.json").read_text())
        if info.get("status") != "done" or not (d / "checkpoints").is_dir():
            continue
        psnr = json.loads((d / "metrics.json").read_text()).get("psnr") if (d / "metrics.json").is_file() else None
        rows.append({"cell": info["cell"], "key": info["key"], "values": info["values"], "repeat": info["repeat"],
                     "psnr": psnr, **run_touched(d, **kwargs)})
    if not rows:
        raise ValueError(f"{Path(study_dir) / 'cells'}: no finished cell with a checkpoint to read")
    return {"rows": rows}
