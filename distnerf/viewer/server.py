"""The web viewer's server (viser): the scene box, the training cameras as frustums, an
``ss`` run's region boxes, and frames of a model rendered from each browser's camera.

Who renders. :class:`ViewerServer` never renders on viser's threads: camera and GUI
callbacks only record what changed, and :meth:`ViewerServer.render_pending` (called by the
owner's loop: ``distnerf.view``'s main loop, or the trainer between steps in live mode,
:mod:`distnerf.engine.live_view`) renders what is due with the render function its owner gave
(evaluation's :func:`~distnerf.engine.evaluate.render_image`) and pushes it with
``set_background_image``, which queues the message and returns (a slow client never blocks the
caller). A client that disconnects is dropped from the bookkeeping by viser's disconnect
callback; a frame pushed to it meanwhile is discarded. A camera whose view (pose, field of view,
canvas size) has not changed for :data:`STILL_S` seconds is still: its frame is rendered full size
(:mod:`.frames`, Resolution). A camera message alone is no move: the page re-sends an unchanged
camera on its own (about a second after connecting, and when it is captured); taken for a move, it
replaced the still frame on the page with a low-resolution one and rendered the same still again.

Access. The server has no authentication: whoever reaches its address sees the renders and the
training images (the frustums' thumbnails). ``viewer.host`` is ``127.0.0.1`` by default (reach it
from elsewhere through ``ssh -L``); any other address is the user's choice and is logged as a warning.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import logging
import socket
import threading
import time

import numpy as np
import torch

from ..data.base import Cameras, SceneData
from .frames import (OUTPUTS, REGION_COLOURS, Frame, FrameRequest, c2w_from_viser, colourise, frame_pixels,
                     frame_size, region_of_pixels, single_view, viser_from_c2w)

log = logging.getLogger("distnerf")

STILL_S = 0.25          # a camera not updated for this long is still: render a full frame
MAX_FRUSTUMS = 64       # training cameras drawn (evenly spaced when there are more)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def check_port(port: int, host: str) -> None:
    """Raise a clear error if ``port`` cannot be bound on ``host`` (before viser starts).

    Raises:
        OSError: the port is in use (or not allowed), naming it and the key that sets it.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as err:
            raise OSError(f"viewer port {port} on {host} is not available ({err.strerror}); another viewer or "
                          f"program holds it: choose another with port=N (viewer.port=N in training)") from None


def camera_view(camera) -> tuple:
    """What a browser's camera shows: ``(wxyz (4,), position (3,), fov, (canvas H, W))``, copies."""
    return (np.array(camera.wxyz, dtype=np.float64), np.array(camera.position, dtype=np.float64),
            float(camera.fov), (max(camera.image_height, 1), max(camera.image_width, 1)))


def same_view(a: tuple | None, b: tuple | None) -> bool:
    """Whether two :func:`camera_view` readings show the same picture: equal within 1e-4 (relative
    or absolute; radians, world units). The page's camera controls return a pose they were sent moved
    by about 5e-6; a pixel of a 512 px frame is about 1e-3 radians, and a drag moves far more."""
    if a is None or b is None:
        return a is b
    return all(np.allclose(x, y, rtol=1e-4, atol=1e-4) for x, y in zip(a, b))


@dataclasses.dataclass
class _ClientState:
    client: object
    stamp: float = -1.0         # camera update_timestamp last looked at
    view: tuple | None = None   # camera_view at that time
    moved_at: float = 0.0       # when the view last changed (time.time(), as viser's stamps)
    shown: tuple | None = None  # camera_view of the last frame pushed
    full: bool = False          # the last frame was full resolution
    dirty: bool = True          # something other than the camera changed (model, output, tint)
    frame: Frame | None = None


class ViewerServer:
    """A viser server showing one scene and frames of a model.

    Args:
        port: the port (checked with :func:`check_port` first).
        host: the address to serve on (``viewer.host``); any but a loopback one logs a warning (module
            docstring, Access).
        render_image: ``(renderer, scene, index, chunk, device, point_chunk) -> dict`` of ``rgb``,
            ``depth``, ``opacity`` (evaluation's :func:`~distnerf.engine.evaluate.render_image`, given by
            the owner: the engine sits a floor above this package).
        scene: the split whose frame, ``near``/``far``, NDC and box the frames use.
        train_cameras: the training cameras, drawn as frustums (at most :data:`MAX_FRUSTUMS`).
        thumbnails: optional callable ``k -> (h, w, 3) uint8`` image of training camera ``k``.
        partition: an ``ss`` run's partition: its boxes are drawn and the region tint offered.
        max_resolution: longest side of a still frame, pixels.
        chunk, point_chunk: rays per forward and points per network call (``eval.*``).
        device: where the renderer lives.
    Raises:
        OSError: the port is not available.
    """

    def __init__(self, port: int, scene: SceneData, train_cameras: Cameras, *, host: str, render_image,
                 thumbnails=None, partition=None, max_resolution: int = 512, chunk: int = 8192,
                 point_chunk: int | None = None, device="cpu"):
        check_port(port, host)
        import viser

        if not is_loopback(host):
            log.warning("viewer: serving on %s:%d (viewer.host) without authentication: anyone who can reach this "
                        "address sees the renders and the training images; the default 127.0.0.1 with "
                        "ssh -L %d:localhost:%d HOST keeps them to you", host, port, port, port)
        self.render_image = render_image

        self.scene, self.partition, self.max_resolution = scene, partition, int(max_resolution)
        self.chunk, self.point_chunk, self.device = chunk, point_chunk, torch.device(device)
        self.rays_per_s = 2.0e4  # a first guess, replaced by measurements
        self.step = -1
        self.frames_rendered = 0
        self._clients: dict[int, _ClientState] = {}
        self._lock = threading.Lock()  # the client table: viser's threads add and remove, the renderer reads
        self._first_pose = viser_from_c2w(train_cameras.c2w[0].numpy())
        self._first_fov = float(2 * np.arctan(0.5 * train_cameras.size(0)[0] / float(train_cameras.fy[0])))
        self.server = viser.ViserServer(host=host, port=port, verbose=False)
        self.host, self.port = host, port
        self._initial_camera(train_cameras.c2w[0].double().numpy())
        self._build_gui()
        self._draw_scene(train_cameras, thumbnails)
        self.server.on_client_connect(self._connect)
        self.server.on_client_disconnect(self._disconnect)

    # ------------------------------------------------------------------ set-up
    def _initial_camera(self, c2w: np.ndarray) -> None:
        """The page's own first camera (viser's initial camera, also its "Reset View"): ``c2w`` ((3, 4),
        OpenGL; training camera 0), orbiting about the scene box's centre projected on its viewing axis.
        Without it the page opens at viser's default camera and takes the camera set in :meth:`_connect`
        only later, so it sends three different cameras in its first two seconds (ours, its default,
        ours again), each rendered and each replacing the still frame of the one before."""
        position, forward = c2w[:3, 3], -c2w[:3, 2]
        centre = self.scene.aabb.double().mean(0).numpy()
        depth = max(float(np.dot(centre - position, forward)), 1e-3 * float(np.linalg.norm(centre - position)), 1e-6)
        initial = self.server.initial_camera
        initial.fov = self._first_fov
        initial.up = c2w[:3, 1]
        initial.position = position
        initial.look_at = position + depth * forward

    def _build_gui(self) -> None:
        gui = self.server.gui
        self.status = gui.add_markdown("**waiting for a model**")
        self.output = gui.add_dropdown("output", OUTPUTS, initial_value="rgb")
        self.output.on_update(lambda _: self.invalidate())
        self.tint = gui.add_checkbox("region tint", False, visible=self.partition is not None,
                                     hint="tint each pixel by the region holding its ray's expected depth")
        self.tint.on_update(lambda _: self.invalidate())
        self.overlays = gui.add_checkbox("cameras and boxes", True)
        self.overlays.on_update(lambda event: self.show_overlays(event.target.value))

    def _draw_scene(self, cameras: Cameras, thumbnails) -> None:
        scene_api = self.server.scene
        self._overlay_handles = []
        lo, hi = self.scene.aabb.double().numpy()
        self._overlay_handles.append(scene_api.add_box("/scene_box", color=(230, 230, 230), dimensions=tuple(hi - lo),
                                                       wireframe=True, position=tuple((lo + hi) / 2)))
        self.set_partition(self.partition)
        count = len(cameras)
        picks = np.unique(np.linspace(0, count - 1, min(count, MAX_FRUSTUMS)).round().astype(int))
        extent = float(np.linalg.norm(hi - lo))
        for k in picks:
            h, w = cameras.size(int(k))
            fov = float(2 * np.arctan(0.5 * h / float(cameras.fy[k])))
            wxyz, pos = viser_from_c2w(cameras.c2w[k].numpy())
            image = thumbnails(int(k)) if thumbnails is not None else None
            handle = scene_api.add_camera_frustum(f"/cameras/{k}", fov=fov, aspect=w / h, scale=0.04 * extent,
                                                  image=image, format="jpeg", wxyz=wxyz, position=pos,
                                                  color=(120, 120, 120))
            handle.on_click(lambda event, pose=(wxyz, pos), fov=fov: self._jump(event.client, pose, fov))
            self._overlay_handles.append(handle)

    def set_partition(self, partition) -> None:
        """Draw an ``ss`` run's region boxes (colours of the tint) and offer the tint; None: neither."""
        self.partition = partition
        self.tint.visible = partition is not None
        if partition is None:
            return
        for k, (lo, hi) in enumerate(partition.boxes.numpy()):
            self._overlay_handles.append(self.server.scene.add_box(
                f"/regions/{k}", color=tuple(int(c) for c in REGION_COLOURS[k % len(REGION_COLOURS)]),
                dimensions=tuple(hi - lo), wireframe=True, position=tuple((lo + hi) / 2)))

    def show_overlays(self, visible: bool) -> None:
        """Show or hide the frustums and boxes (drawn over the frames)."""
        for handle in self._overlay_handles:
            handle.visible = bool(visible)
        self.overlays.value = bool(visible)

    # ------------------------------------------------------------------ clients
    def _connect(self, client) -> None:
        with self._lock:
            self._clients[client.client_id] = _ClientState(client)
        with client.atomic():
            client.camera.fov = self._first_fov
            client.camera.position = self._first_pose[1]
            client.camera.wxyz = self._first_pose[0]
            import viser.transforms as tf  # the up direction: the first camera's (OpenCV -Y)

            client.camera.up_direction = -tf.SO3(self._first_pose[0]).as_matrix()[:, 1]
        log.info("viewer: client %d connected", client.client_id)

    def _disconnect(self, client) -> None:
        with self._lock:
            self._clients.pop(client.client_id, None)
        log.info("viewer: client %d disconnected", client.client_id)

    def _jump(self, client, pose, fov: float) -> None:
        with client.atomic():
            client.camera.fov = fov
            client.camera.position = pose[1]
            client.camera.wxyz = pose[0]

    def clients(self) -> dict[int, _ClientState]:
        """The connected clients' states (a copy of the table)."""
        with self._lock:
            return dict(self._clients)

    def frame(self, client_id: int) -> Frame | None:
        """The last frame pushed to client ``client_id`` (None: none yet, or disconnected)."""
        state = self.clients().get(client_id)
        return None if state is None else state.frame

    def invalidate(self) -> None:
        """Every client needs a new frame (new model, output or tint)."""
        for state in self.clients().values():
            state.dirty = True

    def set_status(self, text: str) -> None:
        """The page's status line (markdown)."""
        self.status.content = text

    # ------------------------------------------------------------------ rendering
    def _look(self, state: _ClientState) -> bool:
        """Read ``state``'s camera if a message came since the last look; a message that changes
        nothing the frame shows (the page re-sends its camera on its own, e.g. when it settles or is
        captured) is no move. False: no camera message from the browser yet."""
        camera = state.client.camera
        try:
            stamp = camera.update_timestamp
        except AssertionError:  # no camera message from the browser yet
            return False
        if not stamp:
            return False
        if stamp != state.stamp:
            view = camera_view(camera)
            if not same_view(view, state.view):
                state.view, state.moved_at = view, stamp
            state.stamp = stamp
        return True

    def due(self) -> list[_ClientState]:
        """Clients that need a frame: a camera that shows something other than the last frame, a frame
        not yet full resolution, or invalidated (model, output, tint). A camera message that changes
        nothing (:meth:`_look`) makes no frame due: a still frame is never replaced by the same view."""
        return [state for state in self.clients().values()
                if self._look(state) and (state.dirty or not state.full or not same_view(state.view, state.shown))]

    def render_pending(self, renderer, step: int, max_seconds: float | None = None, refresh: bool = True,
                       max_pixels: float | None = None) -> float:
        """Render and push a frame to every client that needs one; returns the seconds spent.

        Args:
            renderer: maps a RayBundle to ``rgb``/``depth``/``opacity`` (a model or fusion stage).
            step: the model's training step (shown on the page, kept in :class:`Frame`).
            max_seconds: stop starting frames once this much time has been spent (None: no limit).
            refresh: a new ``step`` makes every client's frame due (False: only moved cameras).
            max_pixels: at most about this many pixels a frame (live mode: what the measured render
                speed renders in :data:`~distnerf.engine.live_view.LIVE_FRAME_S`), or None (a still frame is
                full size).
        """
        if refresh and step != self.step:
            self.step = step
            self.invalidate()
        start = time.perf_counter()
        for state in self.due():
            if max_seconds is not None and time.perf_counter() - start >= max_seconds:
                break
            self._render_one(renderer, state, step, max_pixels)
        return time.perf_counter() - start

    def render_view(self, renderer, cameras: Cameras) -> dict:
        """Render camera 0 of ``cameras`` in the scene's frame (near/far, NDC) with ``renderer``, through
        the owner's ``render_image``, as ``distnerf.render`` renders a view.

        Returns:
            ``rgb`` (H, W, 3), ``depth`` (H, W), ``opacity`` (H, W), float32 on the CPU.
        """
        return self.render_image(renderer, single_view(self.scene, cameras), 0, self.chunk, self.device,
                                 self.point_chunk)

    def _render_one(self, renderer, state: _ClientState, step: int, max_pixels: float | None = None) -> None:
        request = self.frame_request(state, max_pixels)
        begin = time.perf_counter()
        out = self.render_view(renderer, request.cameras)
        self.push_frame(state, request, out, step, time.perf_counter() - begin)

    def frame_request(self, state: _ClientState, max_pixels: float | None = None) -> FrameRequest:
        """The frame ``state``'s browser needs now: its camera, at the size the measured render
        speed allows (moving), or full size (still; at most ``max_pixels`` when given)."""
        self._look(state)
        wxyz, position, fov, (canvas_h, canvas_w) = state.view
        moving = time.time() - state.moved_at < STILL_S
        max_side = min(self.max_resolution, max(canvas_h, canvas_w))
        height, width = frame_size(canvas_w / canvas_h, max_side, frame_pixels(moving, self.rays_per_s, max_pixels))
        c2w = c2w_from_viser(wxyz, position)
        full = not moving and (height, width) == frame_size(canvas_w / canvas_h, max_side)
        return FrameRequest(c2w, float(fov), height, width, full, state.stamp, state.view)

    def push_frame(self, state: _ClientState, request: FrameRequest, out: dict, step: int, seconds: float) -> None:
        """Show ``out`` (:meth:`render_view` of ``request``'s camera, rendered in ``seconds``) in
        ``state``'s browser; queued, never awaited. Nothing is sent to a client gone meanwhile."""
        cameras = request.cameras
        regions = (region_of_pixels(out, self.scene, cameras, self.partition)
                   if self.partition is not None and self.tint.value else None)
        image = colourise(out, self.output.value, regions)
        self.rays_per_s = 0.5 * self.rays_per_s + 0.5 * request.height * request.width / max(seconds, 1e-6)
        if state.client.client_id not in self.clients():  # disconnected meanwhile: nothing to send or keep
            return
        # PNG for still frames (exact pixels), JPEG while moving (small); queued, never awaited
        state.client.scene.set_background_image(image, format="png" if request.full else "jpeg")
        state.frame = Frame(image, request.c2w, request.fov, request.full, int(step), seconds)
        state.shown, state.full, state.dirty = request.view, request.full, False
        self.frames_rendered += 1

    def stop(self, linger_s: float = 0.0) -> None:
        """Close the server (its port is free again). ``linger_s``: with a browser connected, the
        messages queued (a last status) are sent and given this long to arrive before the
        connections close."""
        if linger_s > 0 and self.clients():
            self.server.flush()
            time.sleep(linger_s)
        self.server.stop()
