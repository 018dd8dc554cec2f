"""Re-render and re-evaluate a run: ``python -m distnerf.render run_dir=PATH [overrides]``.

Loads ``RUN/config.yaml``, applies ``key=value`` overrides (e.g. ``eval.num_views=25``,
``eval.downscale=2``), restores the newest committed checkpoint (or ``checkpoint=RUN/checkpoints/step_N``, or
``weights=FILE`` from ``distnerf.export``), renders the test split into
``RUN/render/test/`` (or ``out_dir=``) and writes ``metrics.json`` there. Works under torchrun
too (views split across ranks).

Videos (``video_frames`` frames at ``video_fps``, rendered at ``eval.downscale``):

* ``video=PATH``: a fly-through along the training cameras (``distnerf/data/camera_path.py``:
  split order or a nearest-neighbour chain, whichever is shorter; a centripetal Catmull-Rom
  spline through the camera centres, slerp of their orientations, constant speed; the first
  training camera's intrinsics, pinhole). For scenes that are not object-centred. ``.gif``
  is written by Pillow; ``.mp4`` (or ``.mkv``/``.mov``/``.avi``) needs imageio-ffmpeg
  (``pip install imageio-ffmpeg``), without it the GIF is written beside ``PATH``.
* ``orbit=true``: ``RENDER/orbit.gif``, the first test camera turned about world +Y
  (object-centred scenes).

A run that logs to W&B (``logger.wandb.mode`` offline or online, ``logger.wandb.log_images``)
gets the videos in its own W&B run, resumed by its id: ``render/video`` (the fly-through) and
``render/orbit``, at the rendered checkpoint's step (``distnerf.observe.logger.log_render_videos``;
W&B plays ``.gif`` and ``.mp4``; docs/wandb.md).

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

import numpy as np

from . import cli as C
from .checkpoint import CheckpointError
from . import distributed as D
from .rundir import setup_logging
from .data import load_scene
from .data.camera_path import fly_through, orbit, path_cameras
from .data.images import undecoded
from .engine.evaluate import evaluate_run, gather_view_rows, make_eval_split, render_image
from .engine.runs import load_renderer, load_run_config
from .observe.logger import log_render_videos
from .config_check import ConfigError
from .schema import EvalConfig, RenderConfig, TrainConfig
from .strategy import build_strategy

log = logging.getLogger("distnerf")


VIDEO_SUFFIXES = (".gif", ".mp4", ".mkv", ".mov", ".avi")


def video_path(value: str) -> Path:
    """The fly-through's file from ``video=PATH``.

    Raises:
        ConfigError: a boolean (the orbit GIF is ``orbit=true``) or an unknown suffix.
    """
    if value.lower() in ("true", "false"):
        raise ConfigError(f"video={value}: video takes a file path (the fly-through, e.g. video=flythrough.gif); "
                          f"the orbit GIF is orbit=true")
    path = Path(value)
    if path.suffix.lower() not in VIDEO_SUFFIXES:
        raise ConfigError(f"video={value}: the suffix must be one of {list(VIDEO_SUFFIXES)}")
    return path


def write_video(path: Path, frames: list, fps: float) -> Path:
    """Write (H, W, 3) uint8 ``frames`` at ``fps`` frames per second; returns the file written.

    ``.gif`` through Pillow (durations in whole milliseconds; Pillow merges identical
    consecutive frames into one longer frame); other suffixes through imageio-ffmpeg
    (libx264, yuv420p), or, without it, a GIF at ``path`` with the suffix ``.gif`` (a warning).
    """
    import imageio.v3 as iio

    if path.suffix.lower() != ".gif":
        try:
            import imageio_ffmpeg  # noqa: F401
        except ImportError:
            log.warning("video %s: imageio-ffmpeg is not installed (pip install imageio-ffmpeg); writing %s", path,
                        path.with_suffix(".gif"))
            path = path.with_suffix(".gif")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".gif":
        iio.imwrite(path, np.stack(frames), duration=round(1000 / fps), loop=0)
    else:
        # macro_block_size=2: yuv420p needs even sizes; an odd one is resized by one pixel, an even one kept
        iio.imwrite(path, np.stack(frames), plugin="FFMPEG", fps=fps, macro_block_size=2)
    return path


def render_frames(model, strategy, scene, c2w, chunk: int, device, point_chunk: int | None = None) -> list:
    """Views of ``scene``'s first camera moved to the poses ``c2w``, this rank's share
    (``strategy.eval_views``: under ``ss`` every rank takes part in every view), gathered.

    Args:
        c2w: (F, 3, 4) camera-to-world, OpenGL, in the scene's frame.

    Returns:
        F (H, W, 3) uint8 frames in path order.
    """
    cameras = path_cameras(scene.cameras, c2w)
    height, width = cameras.height, cameras.width
    pixels = scene.images[:1, :height, :width].expand(len(c2w), -1, -1, -1)  # not read: render_image needs cameras
    view = dataclasses.replace(scene, cameras=cameras, images=pixels, image_paths=[], mask=None)
    renderer = strategy.inference_model(model)
    rows = [{"view": k, "rgb": (render_image(renderer, view, k, chunk, device, point_chunk)["rgb"].numpy() * 255)
             .round().astype(np.uint8)} for k in strategy.eval_views(len(c2w))]
    return [row["rgb"] for row in gather_view_rows(strategy, rows)]


def render_videos(cfg, model, strategy, scene, out_dir: Path, env) -> dict[str, Path]:
    """The fly-through (``video=PATH``) and the orbit (``orbit=true``); the files written (main rank),
    as {W&B key: file}: ``render/video`` and ``render/orbit``.

    Args:
        scene: the test split (its first camera starts the orbit; its pixels are not read).
    """
    factor = cfg.eval.downscale
    paths, jobs = {}, []
    if cfg.video:
        train = load_scene(cfg.dataset, "train", pixels=undecoded)
        jobs.append(("render/video", video_path(cfg.video), train, fly_through(train.cameras.c2w, cfg.video_frames)))
    if cfg.orbit:
        jobs.append(("render/orbit", out_dir / "orbit.gif", scene, orbit(scene.cameras.c2w[0], cfg.video_frames)))
    for key, path, source, c2w in jobs:
        source = dataclasses.replace(source, cameras=source.cameras.scaled(factor)) if factor > 1 else source
        frames = render_frames(model, strategy, source, c2w, cfg.eval.chunk, env.device, cfg.eval.point_chunk)
        if env.is_main:
            paths[key] = write_video(path, frames, cfg.video_fps)
            log.info("video: %d frames (%dx%d) -> %s", len(frames), *frames[0].shape[1::-1], paths[key])
    return paths


RUN_DIR = C.Key("run_dir", "(required)", "the run's directory (RUN/config.yaml, RUN/checkpoints/)")
ENTRY = C.Entry(
    "render", "Render a run's test views again and score them (PSNR, SSIM, LPIPS), optionally a fly-through or "
    "an orbit video; RUN/config.yaml with key=value overrides.", "run_dir=PATH [key=value ...]",
    [RUN_DIR, *C.schema_keys(RenderConfig, only=["checkpoint", "weights", "fusion", "out_dir", "video", "orbit",
                                                 "video_frames", "video_fps"]),
     *C.schema_keys(EvalConfig, "eval."), *C.schema_keys(TrainConfig, only=["device"])],
    examples=["run_dir=runs/main", "run_dir=runs/main eval.num_views=25 orbit=true",
              "run_dir=runs/main video=runs/main/fly.gif video_frames=120",
              "run_dir=runs/main weights=runs/main/export/model_step_1000.pt out_dir=runs/main/render_export",
              "run_dir=runs/city_ss fusion=blend"],
    notes="Any other key of the run's config can be overridden too (distnerf-train --help lists them). "
          "Under torchrun the views are split across ranks.",
    required=[("run_dir", "the run to render")], existing=["run_dir", "checkpoint", "weights"])


def main(argv: list[str] | None = None) -> dict:
    argv = ENTRY.parse(sys.argv[1:] if argv is None else argv)
    with ENTRY.usage_errors():  # no config.yaml, an unknown key, a wrong value: one line, exit 2
        cfg, run_dir = load_run_config(argv, prog=ENTRY.prog)
        if cfg.video:
            video_path(cfg.video)  # a bad path fails before any rendering
    env = D.init_distributed(cfg.device, timeout_s=cfg.dist_timeout_s,  # the run's timeouts
                             setup_timeout_s=cfg.dist_setup_timeout_s, backend=cfg.dist_backend)
    try:
        out_dir = Path(cfg.out_dir or run_dir / "render")
        if env.is_main:
            out_dir.mkdir(parents=True, exist_ok=True)
        D.barrier(env)
        setup_logging(env, out_dir, "INFO", "render.log")
        strategy = build_strategy(cfg.strategy, env)
        scene = load_scene(cfg.dataset, "test", pixels=undecoded)  # box, background, cameras: evaluation decodes its own
        model, step = load_renderer(cfg, run_dir, scene, env)
        metrics = evaluate_run(cfg, model, strategy, out_dir, step, make_eval_split(cfg, model, strategy))
        videos = render_videos(cfg, model, strategy, scene, out_dir, env)
        if env.is_main:  # into the training's W&B run, when it logs to W&B
            log_render_videos(cfg, run_dir, step, videos)
        return {k: v for k, v in metrics.items() if k not in ("scene", "rows")}
    finally:
        D.shutdown(env)


def cli(argv: list[str] | None = None) -> int:
    """``distnerf-render`` / ``python -m distnerf.render``: :func:`main`; a config error found while
    rendering is one line too (exit 2), a missing or damaged checkpoint or file one line (exit 1)."""
    return ENTRY.run(main, argv, (FileNotFoundError, CheckpointError), ConfigError)  # no checkpoint yet, a damaged one


if __name__ == "__main__":
    sys.exit(cli())
