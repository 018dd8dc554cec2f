"""Web viewer of a run: ``python -m distnerf.view run_dir=PATH [port=7007] [checkpoint=DIR] [overrides]``.

Serves http://localhost:PORT (viser; from a remote machine: ``ssh -L 7007:localhost:7007 HOST``
and open the same address locally). The page renders the run's model from the camera the
user drags (low resolution while it moves, ``viewer.max_resolution`` when still), with
the outputs rgb, depth and opacity, the scene box and the training cameras as frustums
(click one to jump to it). A ``strategy=ss`` run renders through its fusion stage, as
``distnerf.render`` does (:func:`distnerf.engine.runs.load_renderer`), draws its region
boxes and offers a tint of each pixel by its region.

It follows the run: without ``checkpoint=``, a newer committed checkpoint is loaded when it
appears (polled every :data:`POLL_S` s, no restart), and the page shows the step, the test
PSNR (``RUN/metrics.json``, when training wrote it) and the latest training rays/s
(``RUN/metrics.jsonl``). A run with no committed checkpoint yet is waited for (the page
and the log say so). One process; live viewing of a training run is ``viewer.enabled=true``
on ``distnerf.train`` (:class:`distnerf.engine.live_view.LiveViewer`).
"""
from __future__ import annotations

import json
import logging
import sys
import threading
import time
from pathlib import Path

from . import checkpoint as ckpt
from . import cli as C
from . import distributed as D
from .rundir import setup_logging
from .data import load_scene
from .data.images import undecoded
from .engine.runs import load_renderer, load_run_config
from .engine.evaluate import render_image
from .viewer.frames import thumbnail
from .viewer.server import ViewerServer
from .observe.logger import read_metrics_log
from .config_check import ConfigError, derive
from .schema import EvalConfig, RenderConfig, TrainConfig, ViewerConfig
from .strategy.partition import Partition

log = logging.getLogger("distnerf")
POLL_S = 2.0  # seconds between looks for a newer checkpoint and new metrics


def read_metrics(run_dir: Path) -> dict:
    """``psnr`` (test, ``RUN/metrics.json``) and ``rays_per_s`` (the last training row of
    ``RUN/metrics.jsonl``) where present."""
    found = {}
    try:
        found["psnr"] = float(json.loads((run_dir / "metrics.json").read_text())["psnr"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        rates = [r["rays_per_s"] for r in read_metrics_log(run_dir, partial_tail=True, tail_bytes=65536) if "rays_per_s" in r]
        if rates:
            found["rays_per_s"] = float(rates[-1])
    except (OSError, ValueError):
        pass
    return found


class RunViewer:
    """A run's checkpoints behind a :class:`ViewerServer`.

    Args:
        cfg, run_dir: from :func:`~distnerf.engine.runs.load_run_config` (``viewer.port``,
            ``viewer.host``, ``viewer.max_resolution``, ``eval.chunk``, ``checkpoint`` are read).
        env: this process's :class:`~distnerf.distributed.DistEnv` (one process).
    Raises:
        OSError: the port is not available.
    """

    def __init__(self, cfg, run_dir: Path, env):
        self.cfg, self.run_dir, self.env = cfg, Path(run_dir), env
        self.scene = load_scene(cfg.dataset, "test", pixels=undecoded)  # frame, box, near/far: no pixels
        lists = []
        train = load_scene(cfg.dataset, "train", pixels=lambda images: (lists.append(images), undecoded(images))[1])
        self.server = ViewerServer(cfg.viewer.port, self.scene, train.cameras, host=cfg.viewer.host,
                                   render_image=render_image,
                                   thumbnails=(lambda k: thumbnail(lists[0].decode(k))) if lists else None,
                                   max_resolution=cfg.viewer.max_resolution, chunk=cfg.eval.chunk,
                                   point_chunk=cfg.eval.point_chunk, device=env.device)
        self.model, self.step, self.loaded = None, -1, None
        self.waiting_logged = False

    def poll(self) -> bool:
        """Load a newer committed checkpoint if there is one, refresh the status; True if a model changed."""
        wanted = Path(self.cfg.checkpoint) if self.cfg.checkpoint else ckpt.latest(self.run_dir / "checkpoints")
        changed = False
        if wanted is None:
            if not self.waiting_logged:
                log.info("viewer: waiting for a committed checkpoint in %s", self.run_dir / "checkpoints")
                self.waiting_logged = True
        elif wanted != self.loaded:
            try:
                self.model, self.step = load_renderer(derive(self.cfg, checkpoint=str(wanted)),
                                                      self.run_dir, self.scene, self.env)
            except (OSError, ckpt.CheckpointError, KeyError, RuntimeError) as err:  # pruned or half-read
                log.warning("viewer: could not load %s (%s); keeping step %d", wanted, err, self.step)
            else:
                self.loaded, changed = wanted, True
                if self.server.partition is None and self.cfg.strategy.name == "ss":
                    self.server.set_partition(Partition.from_dict(ckpt.read_manifest(wanted)["partition"]))
                log.info("viewer: showing %s (step %d)", wanted, self.step)
        self.server.set_status(self.status_text())
        return changed

    def status_text(self) -> str:
        if self.model is None:
            return f"**waiting for a committed checkpoint** in `{self.run_dir / 'checkpoints'}`"
        parts = [f"**step {self.step}**", f"`{self.loaded.name}`"]
        metrics = read_metrics(self.run_dir)
        if "psnr" in metrics:
            parts.append(f"test PSNR {metrics['psnr']:.2f} dB")
        if "rays_per_s" in metrics:
            parts.append(f"{metrics['rays_per_s']:,.0f} training rays/s")
        return " &middot; ".join(parts)

    def serve(self, stop: threading.Event | None = None) -> None:
        """Render frames as they are due and follow the run until ``stop`` is set (or forever)."""
        stop = stop or threading.Event()
        last_poll = -POLL_S
        while not stop.is_set():
            if time.monotonic() - last_poll >= POLL_S:
                self.poll()
                last_poll = time.monotonic()
            spent = self.server.render_pending(self.model, self.step) if self.model is not None else 0.0
            if spent == 0.0:
                stop.wait(0.01)

    def close(self) -> None:
        self.server.stop()


ENTRY = C.Entry(
    "view", "Web viewer of a run (http://localhost:PORT): renders its newest committed checkpoint from the camera "
    "you drag, and follows the run as it trains.", "run_dir=PATH [port=N] [checkpoint=DIR] [key=value ...]",
    [C.Key("run_dir", "(required)", "the run's directory (RUN/config.yaml, RUN/checkpoints/)"),
     *(C.Key("port", k.default, f"short for viewer.port: {k.meaning}") for k in C.schema_keys(ViewerConfig, only=["port"])),
     *C.schema_keys(ViewerConfig, "viewer.", only=["max_resolution"]),
     *C.schema_keys(RenderConfig, only=["checkpoint"]), *C.schema_keys(EvalConfig, "eval.", only=["chunk", "point_chunk"]),
     *C.schema_keys(TrainConfig, only=["device"])],
    examples=["run_dir=runs/main", "run_dir=runs/city_ss port=8080 checkpoint=runs/city_ss/checkpoints/step_00001000"],
    notes="From another machine: ssh -L 7007:localhost:7007 HOST, then open http://localhost:7007 there.",
    required=[("run_dir", "the run to view")], existing=["run_dir", "checkpoint"])


def view_config(argv: list[str]):
    """(config, run_dir) of ``distnerf.view``'s command line: ``port=N`` is ``viewer.port=N``.

    Raises:
        SystemExit: ``--help`` (0); a usage error, one line (2).
    """
    argv = [f"viewer.{a}" if a.startswith("port=") else a for a in ENTRY.parse(argv)]
    with ENTRY.usage_errors():
        return load_run_config(argv, prog=ENTRY.prog)


def main(argv: list[str] | None = None) -> None:
    cfg, run_dir = view_config(sys.argv[1:] if argv is None else argv)
    env = D.init_distributed(cfg.device, timeout_s=cfg.dist_timeout_s, setup_timeout_s=cfg.dist_setup_timeout_s,
                             backend=cfg.dist_backend)
    try:
        setup_logging(env, run_dir, "INFO", "view.log")
        viewer = RunViewer(cfg, run_dir, env)
        log.info("viewer: http://localhost:%d (from another machine: ssh -L %d:localhost:%d HOST)",
                 cfg.viewer.port, cfg.viewer.port, cfg.viewer.port)
        try:
            viewer.serve()
        except KeyboardInterrupt:
            pass
        finally:
            viewer.close()
    finally:
        D.shutdown(env)


def cli(argv: list[str] | None = None) -> int:
    """``distnerf-view`` / ``python -m distnerf.view``: :func:`main`; a config error is one line (exit 2),
    a port not available one line (exit 1)."""
    try:
        with ENTRY.usage_errors(ConfigError):
            main(argv)
    except OSError as err:
        ENTRY.error(err, status=1)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
