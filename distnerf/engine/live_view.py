"""The live viewer: the trainer's hook that serves the web viewer during training
(``viewer.enabled=true``), rendering the model being trained between steps.

It sits in ``engine/`` (the trainer's floor) because it renders with evaluation's
:func:`~distnerf.engine.evaluate.render_image`; the server it drives is
:class:`distnerf.viewer.server.ViewerServer` (a floor below, given that render function).
"""
from __future__ import annotations

import logging
import re
import time

from .. import distributed as D
from ..data.base import SceneData
from ..viewer.frames import single_view, thumbnail
from ..viewer.server import ViewerServer
from .evaluate import render_image

log = logging.getLogger("distnerf")

LIVE_REFRESH_S = 1.0  # live: a still view is re-rendered with the current model at most this often
LIVE_FRAME_S = 0.5    # live: a frame has as many pixels as the measured render speed allows in this time
GOODBYE_S = 1.0       # the run ended: a connected page gets this long to receive its last status
MARKDOWN = re.compile(r"([\\`*_\[\]<>&#|~])")  # what a backslash keeps markdown from reading in plain text


class LiveViewer:
    """The viewer during training (``viewer.enabled=true``), served by the main rank.

    :meth:`after_step` is called by the trainer once per step, in the training loop's thread
    (the model is not being updated meanwhile: no locking). It renders the frames due with
    the current model (``strategy.inference_model``) as long as rendering has taken at most
    ``viewer.max_render_share`` of the wall time since the viewer started (an estimate of the
    next frame's cost included), and re-renders a still view at most every
    :data:`LIVE_REFRESH_S` seconds. A frame has at most as many pixels as the measured render
    speed renders in :data:`LIVE_FRAME_S` (up to ``viewer.max_resolution``), so no single frame
    stalls training for long: an early model, whose grid is still all fog, renders slowly.
    Frames are queued to the browsers, never awaited.

    Collective frames (``strategy.renders_collectively``: ``ss`` under torchrun, whose fusion
    stage needs every rank's regions): the main rank asks for a frame in the step agreement
    (:meth:`wants_frame`, the same share test), and after that step every rank renders it:
    the main rank broadcasts the camera (:class:`~distnerf.viewer.frames.FrameRequest`), the others follow
    (:class:`LiveFollower`). One frame per agreed step. Every rank spends the frame's time in
    it, so each rank's training keeps at least ``1 - max_render_share`` of its wall time, as
    the main rank's does: the other ranks are stalled by no more than that budget.

    Args:
        cfg: the run's config (``viewer``, ``eval.chunk``/``point_chunk``).
        strategy: the run's strategy (its ``inference_model``; ``ss``: its ``partition``).
        scene: the training split (frustums, thumbnails, the frame).
    """

    def __init__(self, cfg, strategy, scene: SceneData):
        images = scene.images
        self.server = ViewerServer(cfg.viewer.port, scene, scene.cameras, host=cfg.viewer.host,
                                   render_image=render_image, thumbnails=lambda k: thumbnail(images[k]),
                                   partition=strategy.partition,
                                   max_resolution=cfg.viewer.max_resolution, chunk=cfg.eval.chunk,
                                   point_chunk=cfg.eval.point_chunk, device=strategy.env.device)
        self.strategy, self.share = strategy, float(cfg.viewer.max_render_share)
        self.collective = bool(strategy.renders_collectively)
        self.collective_frames = 0  # collective: frames every rank rendered (a browser gone meanwhile included)
        self.start, self.render_s, self.last_frame_s, self.shown_at = time.perf_counter(), 0.0, 0.0, 0.0
        self.ended = False  # end() told the page how the run ended
        log.info("viewer: http://localhost:%d (live; rendering at most %.0f%% of wall time%s)", cfg.viewer.port,
                 100 * self.share, "; every rank renders each frame through the fusion stage" if self.collective
                 else "")

    def _allowed(self, now: float) -> float:
        """Seconds of rendering the share allows now (the next frame's estimated cost taken off)."""
        return self.share * (now - self.start) - self.render_s - self.last_frame_s

    def wants_frame(self) -> bool:
        """Collective frames: whether to ask every rank for a frame after this step (the share
        allows one, and a browser's view is due or stale). Always False otherwise."""
        if not self.collective:
            return False
        now = time.perf_counter()
        if self._allowed(now) <= 0:
            return False
        return bool(self.server.clients()) if now - self.shown_at >= LIVE_REFRESH_S else bool(self.server.due())

    def after_step(self, model, step: int, rays_per_s: float | None = None, frame_agreed: bool = False) -> float:
        """Render what is due with ``model`` at ``step`` within the time share; returns seconds spent.
        Collective frames: render one frame with every rank when ``frame_agreed`` (the agreement's
        :attr:`~distnerf.strategy.base.StepStats.live_frame`), nothing otherwise."""
        now = time.perf_counter()
        if self.collective:
            if rays_per_s is not None:
                self.server.set_status(f"**live** step {step} &middot; {rays_per_s:,.0f} training rays/s")
            return self._collective_frame(model, step, now) if frame_agreed else 0.0
        allowed = self._allowed(now)
        if allowed <= 0:
            return 0.0
        if rays_per_s is not None:
            self.server.set_status(f"**live** step {step} &middot; {rays_per_s:,.0f} training rays/s")
        refresh = now - self.shown_at >= LIVE_REFRESH_S
        if not refresh and not self.server.due():
            return 0.0
        count = self.server.frames_rendered
        # a frame no longer than LIVE_FRAME_S at the measured speed: training never stalls for a whole
        # full-size frame of an early (slow, still foggy) model
        spent = self.server.render_pending(self.strategy.inference_model(model), step, allowed, refresh,
                                           max_pixels=self.server.rays_per_s * LIVE_FRAME_S)
        self.render_s += spent
        if self.server.frames_rendered > count:
            self.last_frame_s = spent / (self.server.frames_rendered - count)
            self.shown_at = now if refresh else self.shown_at
        return spent

    def _collective_frame(self, model, step: int, now: float) -> float:
        """One frame rendered by every rank (the first browser due); the main rank's side."""
        refresh = now - self.shown_at >= LIVE_REFRESH_S
        if refresh and step != self.server.step:
            self.server.step = step
            self.server.invalidate()
        due = self.server.due()
        request = self.server.frame_request(due[0], self.server.rays_per_s * LIVE_FRAME_S) if due else None
        begin = time.perf_counter()
        # collective: every rank learns the camera (None: nothing is due after all)
        D.broadcast_object(self.strategy.env, request)
        if request is not None:
            out = self.server.render_view(self.strategy.inference_model(model), request.cameras)
            self.server.push_frame(due[0], request, out, step, time.perf_counter() - begin)
            self.collective_frames += 1
        spent = time.perf_counter() - begin
        self.render_s += spent
        if request is not None:
            self.last_frame_s = spent
            self.shown_at = now if refresh else self.shown_at
        return spent

    def end(self, status: str, reason: str | None = None) -> None:
        """The run ended (no frame follows): the page's status says how until the server closes, and
        :meth:`close` gives the browsers :data:`GOODBYE_S` to receive it.

        Args:
            status: markdown, e.g. ``**finished** at step 250``, ``**stopped** by SIGTERM at step 12``.
            reason: plain text after it (an error's message, shown as written), e.g. ``rank 1 lost
                (last heard at step 66 in phase backward)``; None: none.
        """
        self.server.set_status(status if reason is None else status + ": " + MARKDOWN.sub(r"\\\1", reason))
        self.ended = True

    def close(self) -> None:
        wall = time.perf_counter() - self.start
        frames = self.collective_frames if self.collective else self.server.frames_rendered
        log.info("viewer: %d frames rendered in %.2f s, %.1f%% of %.1f s (viewer.max_render_share=%.2f)",
                 frames, self.render_s, 100 * self.render_s / max(wall, 1e-9), wall, self.share)
        log.info("viewer: the page's last status: %s", self.server.status.content)
        self.server.stop(GOODBYE_S if self.ended else 0.0)


class LiveFollower:
    """A rank other than the main one in collective live viewing (see :class:`LiveViewer`):
    after each step whose agreement asked for a frame, it receives the camera from the main
    rank and renders its part of the frame through the fusion stage. It serves nothing."""

    collective = True

    def __init__(self, cfg, strategy, scene: SceneData):
        self.strategy, self.scene, self.cfg = strategy, scene, cfg
        self.start, self.render_s, self.frames = time.perf_counter(), 0.0, 0

    def wants_frame(self) -> bool:
        return False  # only the main rank asks

    def after_step(self, model, step: int, rays_per_s: float | None = None, frame_agreed: bool = False) -> float:
        if not frame_agreed:
            return 0.0
        begin = time.perf_counter()
        request = D.broadcast_object(self.strategy.env, None)  # collective: the main rank's camera
        if request is not None:
            render_image(self.strategy.inference_model(model), single_view(self.scene, request.cameras), 0,
                         self.cfg.eval.chunk, self.strategy.env.device, self.cfg.eval.point_chunk)
            self.frames += 1
        spent = time.perf_counter() - begin
        self.render_s += spent
        return spent

    def end(self, status: str, reason: str | None = None) -> None:
        pass  # no page here: the main rank's tells how the run ended

    def close(self) -> None:
        wall = time.perf_counter() - self.start
        log.info("viewer: rank %d took part in %d live frames, %.2f s, %.1f%% of %.1f s", self.strategy.env.rank,
                 self.frames, self.render_s, 100 * self.render_s / max(wall, 1e-9), wall,
                 extra={"every_rank": True})
