"""The web viewer's server (viser): the scene box, the training cameras as frustums, an
``ss`` run's region boxes, and frames of a model rendered from each browser's camera.

Legend: H, W image size in pixels; K regions.

Camera conventions. distnerf's ``c2w`` is camera-to-world in the OpenGL convention (the
camera looks down -Z, +Y up, +X right). viser reports and sets a client's camera as
``wxyz`` (the rotation R of ``p_world = R p_camera + t``) and ``position`` (t) in the
OpenCV convention (looks down +Z, +Y down, +X right). The two differ by flipping the
camera's Y and Z axes: ``R_gl = R_cv @ diag(1, -1, -1)`` (:func:`c2w_from_viser`,
:func:`viser_from_c2w`); positions are the same. viser's ``fov`` is the vertical field of
view in radians; frames are pinhole with the principal point at the image centre.

Who renders. :class:`ViewerServer` never renders on viser's threads: camera and GUI
callbacks only record what changed, and :meth:`ViewerServer.render_pending` (called by the
owner's loop: ``distnerf.view``'s main loop, or the trainer between steps in live mode)
renders what is due and pushes it with ``set_background_image``, which queues the message
and returns (a slow client never blocks the caller). A client that disconnects is dropped
from the bookkeeping by viser's disconnect callback; a frame pushed to it meanwhile is
discarded.

Resolution. As in nerfstudio's viewer: while the camera moves (updated in the last
:data:`STILL_S` seconds) a frame has as many pixels as the measured render speed allows in
:data:`MOVING_FRAME_S` seconds; once still, a full frame (``max_resolution`` on its longest
side, at most the browser canvas) follows.
"""
from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import time

import numpy as np
import torch

from ..data.base import Cameras, SceneData
from ..data.rays import image_rays
from .evaluate import render_image

log = logging.getLogger("distnerf")

STILL_S = 0.25          # a camera not updated for this long is still: render a full frame
MOVING_FRAME_S = 0.08   # target render time of a frame while the camera moves
MIN_PIXELS = 48 * 64    # the smallest moving frame
MAX_FRUSTUMS = 64       # training cameras drawn (evenly spaced when there are more)
THUMBNAIL = 48          # longest side of a frustum's thumbnail, pixels
OUTPUTS = ("rgb", "depth", "opacity")
# K region colours (uint8 RGB), repeated for K > 10: matplotlib's tab10
REGION_COLOURS = np.array([[31, 119, 180], [255, 127, 14], [44, 160, 44], [214, 39, 40], [148, 103, 189],
                           [140, 86, 75], [227, 119, 194], [127, 127, 127], [188, 189, 34], [23, 190, 207]],
                          dtype=np.uint8)
_FLIP_YZ = np.diag([1.0, -1.0, -1.0])


def check_port(port: int, host: str = "0.0.0.0") -> None:
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


def c2w_from_viser(wxyz, position) -> np.ndarray:
    """A viser camera pose as distnerf's ``c2w``.

    Args:
        wxyz: (4,) unit quaternion, camera-to-world rotation, OpenCV camera axes.
        position: (3,) camera centre, world units.
    Returns:
        (3, 4) float64 camera-to-world, OpenGL convention.
    """
    import viser.transforms as tf

    rot = tf.SO3(np.asarray(wxyz, dtype=np.float64)).as_matrix() @ _FLIP_YZ
    return np.concatenate([rot, np.asarray(position, dtype=np.float64).reshape(3, 1)], axis=1)


def viser_from_c2w(c2w) -> tuple[np.ndarray, np.ndarray]:
    """distnerf's ``c2w`` as a viser pose: ``(wxyz (4,), position (3,))``, OpenCV axes.

    Args:
        c2w: (3, 4) or (4, 4) camera-to-world, OpenGL convention.
    """
    import viser.transforms as tf

    c2w = np.asarray(c2w, dtype=np.float64)
    return tf.SO3.from_matrix(c2w[:3, :3] @ _FLIP_YZ).wxyz, c2w[:3, 3].copy()


def pinhole(c2w, fov_y: float, height: int, width: int) -> Cameras:
    """One pinhole camera of ``height`` x ``width`` pixels, vertical field of view ``fov_y``
    (radians), principal point at the centre, at pose ``c2w`` ((3, 4), OpenGL)."""
    focal = torch.tensor([0.5 * height / np.tan(0.5 * fov_y)], dtype=torch.float32)
    return Cameras(torch.as_tensor(np.asarray(c2w)[None, :3, :4], dtype=torch.float32), focal, focal.clone(),
                   torch.tensor([width / 2.0]), torch.tensor([height / 2.0]), int(width), int(height))


def frame_size(aspect: float, max_side: int, pixels: float | None = None) -> tuple[int, int]:
    """``(H, W)`` of a frame of ``aspect`` = W / H with longest side at most ``max_side`` and,
    when ``pixels`` is given, at most about that many pixels (never below :data:`MIN_PIXELS`)."""
    h, w = (max_side / aspect, max_side) if aspect >= 1 else (max_side, max_side * aspect)
    if pixels is not None and h * w > pixels:
        scale = np.sqrt(max(pixels, MIN_PIXELS) / (h * w))
        h, w = h * scale, w * scale
    return max(int(round(h)), 1), max(int(round(w)), 1)


def frame_pixels(moving: bool, rays_per_s: float, max_pixels: float | None = None) -> float | None:
    """The pixel budget of a frame: what ``rays_per_s`` renders in :data:`MOVING_FRAME_S` while the
    camera moves, else none (a full frame), capped at ``max_pixels`` when given."""
    pixels = rays_per_s * MOVING_FRAME_S if moving else None
    if max_pixels is not None:
        pixels = max_pixels if pixels is None else min(pixels, max_pixels)
    return pixels


def render_view(renderer, scene: SceneData, cameras: Cameras, chunk: int, device, point_chunk=None) -> dict:
    """Render camera 0 of ``cameras`` in ``scene``'s frame (near/far, NDC) with ``renderer``
    (:func:`~distnerf.engine.evaluate.render_image`, as ``distnerf.render`` does).

    Returns:
        ``rgb`` (H, W, 3), ``depth`` (H, W), ``opacity`` (H, W), float32 on the CPU.
    """
    view = dataclasses.replace(scene, cameras=cameras, images=scene.images[:1], image_paths=[], mask=None)
    return render_image(renderer, view, 0, chunk, device, point_chunk)


def region_of_pixels(out: dict, scene: SceneData, cameras: Cameras, partition) -> torch.Tensor:
    """(H, W) int64: for each pixel the region holding its ray's expected termination point
    ``origin + depth * direction`` (the region that contributed most for a ray ending on a
    surface; a semi-transparent ray's colour may mix several). ``partition``: the run's
    :class:`~distnerf.strategy.partition.Partition` (points outside the box are clamped)."""
    rays = image_rays(cameras, 0, scene.near, scene.far, scene.ndc)
    points = rays.origins + out["depth"].reshape(-1, 1) * rays.directions
    return partition.region_of(points.double()).view(out["depth"].shape)


def colourise(out: dict, output: str, regions: torch.Tensor | None = None) -> np.ndarray:
    """The (H, W, 3) uint8 image shown for ``output`` (``rgb``; ``depth``: turbo colour map over
    the 1st-99th percentile of the covered pixels; ``opacity``: grey). ``regions`` (H, W): tint
    each covered pixel half-way towards its region's colour (:data:`REGION_COLOURS`)."""
    if output == "rgb":
        img = out["rgb"].numpy()
    else:
        value = out[output].numpy()
        if output == "depth":
            covered = value[out["opacity"].numpy() > 0.5]
            lo, hi = (np.percentile(covered, 1), np.percentile(covered, 99)) if covered.size else (0.0, 1.0)
            import matplotlib

            img = matplotlib.colormaps["turbo"](np.clip((value - lo) / max(hi - lo, 1e-8), 0, 1))[..., :3]
        else:
            img = np.repeat(np.clip(value, 0, 1)[..., None], 3, axis=-1)
    img = (np.clip(img, 0, 1) * 255).round().astype(np.uint8)
    if regions is not None:
        colours = REGION_COLOURS[regions.numpy() % len(REGION_COLOURS)]
        weight = 0.5 * np.clip(out["opacity"].numpy(), 0, 1)[..., None]
        img = ((1 - weight) * img + weight * colours).round().astype(np.uint8)
    return img


@dataclasses.dataclass
class Frame:
    """A frame pushed to one client.

    Attributes:
        image: (H, W, 3) uint8, what was sent.
        c2w: (3, 4) float64 camera-to-world, OpenGL. fov_y: vertical field of view, radians.
        full: a still (full-resolution) frame. step: the model's step. seconds: render time.
    """
    image: np.ndarray
    c2w: np.ndarray
    fov_y: float
    full: bool
    step: int
    seconds: float


@dataclasses.dataclass
class _ClientState:
    client: object
    stamp: float = -1.0       # camera update_timestamp of the last frame
    full: bool = False        # the last frame was full resolution
    dirty: bool = True        # something other than the camera changed (model, output, tint)
    frame: Frame | None = None


@dataclasses.dataclass
class FrameRequest:
    """One frame to render: a pinhole camera (``c2w`` (4, 4) float64 camera-to-world, OpenGL
    convention; ``fov`` vertical field of view, radians; ``height`` x ``width`` pixels), whether
    it is the client's full-size still frame, and the camera update it answers (``stamp``)."""

    c2w: np.ndarray
    fov: float
    height: int
    width: int
    full: bool
    stamp: float

    @property
    def cameras(self) -> Cameras:
        return pinhole(self.c2w, self.fov, self.height, self.width)


class ViewerServer:
    """A viser server showing one scene and frames of a model.

    Args:
        port: the port (checked with :func:`check_port` first).
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

    def __init__(self, port: int, scene: SceneData, train_cameras: Cameras, *, thumbnails=None, partition=None,
                 max_resolution: int = 512, chunk: int = 8192, point_chunk: int | None = None, device="cpu",
                 host: str = "0.0.0.0"):
        check_port(port, host)
        import viser

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
        self.port = port
        self._build_gui()
        self._draw_scene(train_cameras, thumbnails)
        self.server.on_client_connect(self._connect)
        self.server.on_client_disconnect(self._disconnect)

    # ------------------------------------------------------------------ set-up
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
    def due(self) -> list[_ClientState]:
        """Clients that need a frame: new camera, not yet full resolution, or invalidated."""
        due = []
        for state in self.clients().values():
            camera = state.client.camera
            try:
                stamp = camera.update_timestamp
            except AssertionError:  # no camera message from the browser yet
                continue
            if stamp and (state.dirty or stamp != state.stamp or not state.full):
                due.append(state)
        return due

    def render_pending(self, renderer, step: int, max_seconds: float | None = None, refresh: bool = True,
                       max_pixels: float | None = None) -> float:
        """Render and push a frame to every client that needs one; returns the seconds spent.

        Args:
            renderer: maps a RayBundle to ``rgb``/``depth``/``opacity`` (a model or fusion stage).
            step: the model's training step (shown on the page, kept in :class:`Frame`).
            max_seconds: stop starting frames once this much time has been spent (None: no limit).
            refresh: a new ``step`` makes every client's frame due (False: only moved cameras).
            max_pixels: at most about this many pixels a frame (live mode: what the measured render
                speed renders in :data:`LIVE_FRAME_S`), or None (a still frame is full size).
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

    def _render_one(self, renderer, state: _ClientState, step: int, max_pixels: float | None = None) -> None:
        request = self.frame_request(state, max_pixels)
        begin = time.perf_counter()
        out = render_view(renderer, self.scene, request.cameras, self.chunk, self.device, self.point_chunk)
        self.push_frame(state, request, out, step, time.perf_counter() - begin)

    def frame_request(self, state: _ClientState, max_pixels: float | None = None) -> FrameRequest:
        """The frame ``state``'s browser needs now: its camera, at the size the measured render
        speed allows (moving), or full size (still; at most ``max_pixels`` when given)."""
        camera = state.client.camera
        stamp, wxyz, position, fov = camera.update_timestamp, camera.wxyz.copy(), camera.position.copy(), camera.fov
        canvas_h, canvas_w = max(camera.image_height, 1), max(camera.image_width, 1)
        moving = time.time() - stamp < STILL_S
        max_side = min(self.max_resolution, max(canvas_h, canvas_w))
        height, width = frame_size(canvas_w / canvas_h, max_side, frame_pixels(moving, self.rays_per_s, max_pixels))
        c2w = c2w_from_viser(wxyz, position)
        full = not moving and (height, width) == frame_size(canvas_w / canvas_h, max_side)
        return FrameRequest(c2w, float(fov), height, width, full, stamp)

    def push_frame(self, state: _ClientState, request: FrameRequest, out: dict, step: int, seconds: float) -> None:
        """Show ``out`` (:func:`render_view` of ``request``'s camera, rendered in ``seconds``) in
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
        state.stamp, state.full, state.dirty = request.stamp, request.full, False
        self.frames_rendered += 1

    def stop(self) -> None:
        """Close the server (its port is free again)."""
        self.server.stop()


def thumbnail(image) -> np.ndarray:
    """(h, w, 3) uint8, ``image`` ((H, W, 3) float in [0, 1]) subsampled to at most :data:`THUMBNAIL` px a side."""
    image = np.asarray(image)
    step = max(1, int(np.ceil(max(image.shape[:2]) / THUMBNAIL)))
    return (np.clip(image[::step, ::step, :3], 0, 1) * 255).round().astype(np.uint8)


LIVE_REFRESH_S = 1.0  # live: a still view is re-rendered with the current model at most this often
LIVE_FRAME_S = 0.5    # live: a frame has as many pixels as the measured render speed allows in this time


class LiveViewer:
    """The viewer during training (``viewer.enabled=true``), served by the main rank.

    :meth:`after_step` is called by the trainer once per step, in the training loop's thread
    (the model is not being updated meanwhile: no locking). It renders the frames due with
    the current model (``strategy.live_view_model``) as long as rendering has taken at most
    ``viewer.max_render_share`` of the wall time since the viewer started (an estimate of the
    next frame's cost included), and re-renders a still view at most every
    :data:`LIVE_REFRESH_S` seconds. A frame has at most as many pixels as the measured render
    speed renders in :data:`LIVE_FRAME_S` (up to ``viewer.max_resolution``), so no single frame
    stalls training for long: an early model, whose grid is still all fog, renders slowly.
    Frames are queued to the browsers, never awaited.

    Collective frames (``strategy.live_view_collective``: ``ss`` under torchrun, whose fusion
    stage needs every rank's regions): the main rank asks for a frame in the step agreement
    (:meth:`wants_frame`, the same share test), and after that step every rank renders it:
    the main rank broadcasts the camera (:class:`FrameRequest`), the others follow
    (:class:`LiveFollower`). One frame per agreed step. Every rank spends the frame's time in
    it, so each rank's training keeps at least ``1 - max_render_share`` of its wall time, as
    the main rank's does: the other ranks are stalled by no more than that budget.

    Args:
        cfg: the run's config (``viewer``, ``eval.chunk``/``point_chunk``).
        strategy: the run's strategy (its ``live_view_model``; ``ss``: its ``partition``).
        scene: the training split (frustums, thumbnails, the frame).
    """

    def __init__(self, cfg, strategy, scene: SceneData):
        images = scene.images
        self.server = ViewerServer(cfg.viewer.port, scene, scene.cameras, thumbnails=lambda k: thumbnail(images[k]),
                                   partition=strategy.partition,
                                   max_resolution=cfg.viewer.max_resolution, chunk=cfg.eval.chunk,
                                   point_chunk=cfg.eval.point_chunk, device=strategy.env.device)
        self.strategy, self.share = strategy, float(cfg.viewer.max_render_share)
        self.collective = bool(strategy.live_view_collective)
        self.collective_frames = 0  # collective: frames every rank rendered (a browser gone meanwhile included)
        self.start, self.render_s, self.last_frame_s, self.shown_at = time.perf_counter(), 0.0, 0.0, 0.0
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
        spent = self.server.render_pending(self.strategy.live_view_model(model), step, allowed, refresh,
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
        self.strategy.broadcast(request)  # every rank learns the camera (None: nothing is due after all)
        if request is not None:
            out = render_view(self.strategy.live_view_model(model), self.server.scene, request.cameras,
                              self.server.chunk, self.server.device, self.server.point_chunk)
            self.server.push_frame(due[0], request, out, step, time.perf_counter() - begin)
            self.collective_frames += 1
        spent = time.perf_counter() - begin
        self.render_s += spent
        if request is not None:
            self.last_frame_s = spent
            self.shown_at = now if refresh else self.shown_at
        return spent

    def close(self) -> None:
        wall = time.perf_counter() - self.start
        frames = self.collective_frames if self.collective else self.server.frames_rendered
        log.info("viewer: %d frames rendered in %.2f s, %.1f%% of %.1f s (viewer.max_render_share=%.2f)",
                 frames, self.render_s, 100 * self.render_s / max(wall, 1e-9), wall, self.share)
        self.server.stop()


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
        request = self.strategy.broadcast(None)
        if request is not None:
            render_view(self.strategy.live_view_model(model), self.scene, request.cameras, self.cfg.eval.chunk,
                        self.strategy.env.device, self.cfg.eval.point_chunk)
            self.frames += 1
        spent = time.perf_counter() - begin
        self.render_s += spent
        return spent

    def close(self) -> None:
        wall = time.perf_counter() - self.start
        log.info("viewer: rank %d took part in %d live frames, %.2f s, %.1f%% of %.1f s", self.strategy.env.rank,
                 self.frames, self.render_s, 100 * self.render_s / max(wall, 1e-9), wall,
                 extra={"every_rank": True})
