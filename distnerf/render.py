"""Re-render and re-evaluate a run: ``python -m distnerf.render run_dir=PATH [overrides]``.

Loads ``RUN/config.yaml``, applies ``key=value`` overrides (e.g. ``eval.num_views=25``,
``eval.downscale=2``), restores the newest committed checkpoint (or ``checkpoint=RUN/checkpoints/step_N``, or
``weights=FILE`` from ``distnerf.export``), renders the test split into
``RUN/render/test/`` (or ``out_dir=``) and writes ``metrics.json`` there. ``video=true`` adds an orbit GIF. Works under torchrun
too (views split across ranks).

A ``strategy=ss`` run is rendered through the fusion stage (``fusion=segment``, the
default, or ``fusion=blend``): on one process every region's sub-model is loaded and
fused; under torchrun each rank loads the regions it owns and ``segment`` fusion
composites the ranks' ray segments (every rank renders every view).
"""
from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from . import checkpoint as ckpt
from . import dist as D
from .config import setup_logging
from .data import load_scene
from .engine.evaluate import evaluate_run, make_eval_split, render_image
from .model import build_model
from .schema import ConfigError, RenderConfig, validate
from .strategy import build_strategy

log = logging.getLogger("distnerf")


def load_run_config(argv: list[str]):
    """(config, run_dir) from ``run_dir=PATH`` and overrides on the command line.

    Raises:
        ValueError: no ``run_dir=``; FileNotFoundError: no ``config.yaml`` in it.
    """
    cli = OmegaConf.from_dotlist(argv)
    run_dir = cli.get("run_dir")
    if not run_dir:
        raise ValueError("usage: python -m distnerf.render run_dir=PATH [key=value ...]")
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        raise FileNotFoundError(f"{path}: not a distnerf run directory (no config.yaml)")
    try:
        cfg = validate(OmegaConf.merge(OmegaConf.load(path), cli), root=RenderConfig)
    except ConfigError as err:
        raise ConfigError(f"{path} with {' '.join(argv)}: {err}") from None
    return cfg, Path(run_dir).resolve()


def find_checkpoint(cfg, run_dir: Path) -> tuple[Path, dict]:
    """The checkpoint to render (``cfg.checkpoint`` or the newest committed) and its verified manifest."""
    found = Path(cfg.checkpoint) if cfg.checkpoint else ckpt.latest(run_dir / "checkpoints")
    if found is None:
        broken = ckpt.damaged(run_dir / "checkpoints")
        if broken:  # committed, then damaged: say which file, not "no checkpoint"
            raise ckpt.CheckpointError(f"{run_dir / 'checkpoints'}: no usable checkpoint; the newest: {broken[-1]}")
        raise FileNotFoundError(f"{run_dir / 'checkpoints'}: no committed checkpoint to render")
    return found, ckpt.read_manifest(found, verify=True)


def load_weights(cfg, run_dir: Path):
    """Model state and step: ``cfg.weights`` (an export) or the newest checkpoint."""
    if cfg.weights:
        blob = torch.load(cfg.weights, map_location="cpu", weights_only=False)
        return blob["model"], int(blob["step"])
    found, manifest = find_checkpoint(cfg, run_dir)
    if manifest["strategy"] != "ddp":
        raise ValueError(f"{found}: a {manifest['strategy']} checkpoint has no single {ckpt.MODEL_FILE}; "
                         f"render it through its fusion stage (python -m distnerf.render run_dir=...)")
    state = torch.load(found / ckpt.MODEL_FILE, map_location="cpu", weights_only=False)
    return state["model"], int(state["step"])


def load_renderer(cfg, run_dir: Path, scene, env):
    """(module that renders rays, step): the model, or the fusion stage of an ``ss`` run."""
    if cfg.strategy.name == "ss":
        from .strategy.fused import load_fused, region_states

        if cfg.weights:  # a fused export: every region's sub-model in one file
            blob = torch.load(cfg.weights, map_location="cpu", weights_only=False)
            partition, state, step = blob["partition"], blob["regions"].__getitem__, int(blob["step"])
        else:
            found, manifest = find_checkpoint(cfg, run_dir)
            partition, state, step = manifest["partition"], region_states(found), int(manifest["step"])
        fused = load_fused(partition, state, OmegaConf.to_container(cfg.model, resolve=True), cfg.strategy,
                           scene.aabb, scene.background, cfg.fusion or cfg.strategy.fusion, env)
        return fused, step
    state, step = load_weights(cfg, run_dir)
    model = build_model(cfg.model, scene.aabb, scene.background)
    model.load_state_dict(state)
    return model.to(env.device).eval(), step


def orbit_video(model, scene, out: Path, num_frames: int, chunk: int, device, point_chunk: int | None = None) -> None:
    """Render an orbit around the scene's vertical axis through the test cameras' centre
    of interest (rotating the first test camera about world +Y for object scenes)."""
    import imageio.v3 as iio
    import numpy as np

    c2w0 = scene.cameras.c2w[0]
    frames = []
    for k in range(num_frames):
        a = 2 * np.pi * k / num_frames
        rot = torch.tensor([[np.cos(a), 0, np.sin(a)], [0, 1, 0], [-np.sin(a), 0, np.cos(a)]], dtype=torch.float32)
        c2w = torch.cat([rot @ c2w0[:, :3], (rot @ c2w0[:, 3])[:, None]], dim=1)[None]
        first = scene.subset([0])
        view = dataclasses.replace(first, cameras=dataclasses.replace(first.cameras, c2w=c2w))
        frames.append((render_image(model, view, 0, chunk, device, point_chunk)["rgb"].numpy() * 255).astype(np.uint8))
    iio.imwrite(out, np.stack(frames), duration=80, loop=0)


def main(argv: list[str] | None = None) -> dict:
    cfg, run_dir = load_run_config(sys.argv[1:] if argv is None else argv)
    env = D.init_distributed(cfg.device)
    try:
        out_dir = Path(cfg.out_dir or run_dir / "render")
        if env.is_main:
            out_dir.mkdir(parents=True, exist_ok=True)
        D.barrier(env)
        setup_logging(env, out_dir, "INFO", "render.log")
        strategy = build_strategy(cfg.strategy, env)
        scene = load_scene(cfg.dataset, "test")
        model, step = load_renderer(cfg, run_dir, scene, env)
        metrics = evaluate_run(cfg, model, strategy, out_dir, step, make_eval_split(cfg, model, strategy))
        if cfg.video and env.is_main:
            factor = cfg.eval.downscale
            view_scene = scene.downscaled(factor) if factor > 1 else scene
            orbit_video(model, view_scene, out_dir / "orbit.gif", cfg.video_frames, cfg.eval.chunk, env.device,
                        cfg.eval.point_chunk)
        return metrics
    finally:
        D.shutdown(env)


if __name__ == "__main__":
    try:
        main()
    except ConfigError as err:
        raise SystemExit(f"distnerf.render: {err}") from None
