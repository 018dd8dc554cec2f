"""The viewer's frames for a camera that does not move (issue 52, item 4), without a browser: a
stand-in client whose camera messages are set by hand. One still frame per view; a camera message
that changes nothing (the page re-sends its camera on its own) renders nothing; a real move renders
a moving frame, then a still. The page's own first camera is training camera 0."""
from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("viser")

from distnerf.data.base import SceneData  # noqa: E402
from distnerf.viewer.frames import pinhole, viser_from_c2w  # noqa: E402
from distnerf.viewer.server import STILL_S, ViewerServer, _ClientState  # noqa: E402
from tests.conftest import free_port  # noqa: E402


def blank(renderer, scene, index, chunk, device, point_chunk):
    h, w = scene.cameras.size(index)
    return {"rgb": torch.full((h, w, 3), 0.5), "depth": torch.ones(h, w), "opacity": torch.ones(h, w)}


class Page:
    """A stand-in browser: its camera (viser's axes) and the frames it was sent."""

    def __init__(self, wxyz, position, fov):
        self.client_id, self.sent = 0, []
        self.camera = SimpleNamespace(wxyz=np.array(wxyz), position=np.array(position), fov=fov,
                                      image_height=300, image_width=400, update_timestamp=0.0)
        self.scene = SimpleNamespace(set_background_image=lambda image, format: self.sent.append((image.shape, format)))

    def send_camera(self, at: float, position=None):
        """A camera message received at ``at`` (time.time()), moved to ``position`` when given."""
        if position is not None:
            self.camera.position = np.array(position)
        self.camera.update_timestamp = at


@pytest.fixture
def served():
    c2w = np.array([[1.0, 0, 0, 0.5], [0, 1, 0, -0.25], [0, 0, 1, 3.0]])
    cams = pinhole(c2w, 0.8, 6, 8)
    scene = SceneData("train", torch.zeros(1, 6, 8, 3), cams, 1.0, 5.0,
                      torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]]), torch.ones(3))
    server = ViewerServer(free_port(), scene, cams, host="127.0.0.1", render_image=blank, max_resolution=40)
    wxyz, position = viser_from_c2w(c2w)
    page = Page(wxyz, position, 0.8)
    server._clients[0] = _ClientState(page)
    yield server, page, c2w
    server.stop()


def test_an_unchanged_camera_gets_one_still_frame(served):
    server, page, _ = served
    page.send_camera(time.time() - 1.0)  # still for a second
    server.render_pending(None, step=7)
    assert page.sent == [((30, 40, 3), "png")] and server.frame(0).full  # 40 px on the long side, 4:3
    server.render_pending(None, step=7)
    assert len(page.sent) == 1  # nothing new: nothing rendered
    # the page re-sends the same camera (echoed 5e-6 off, as chromium's camera controls do): no frame
    page.send_camera(time.time() - 0.5, page.camera.position + 5e-6)
    server.render_pending(None, step=7)
    assert len(page.sent) == 1 and server.frames_rendered == 1
    # a new model (step) is a new frame of the same view, full size at once (the camera is still)
    server.render_pending(None, step=8)
    assert page.sent[1:] == [((30, 40, 3), "png")]


def test_a_move_gets_a_moving_frame_then_one_still(served):
    server, page, _ = served
    page.send_camera(time.time() - 1.0)
    server.render_pending(None, step=1)
    page.send_camera(time.time(), page.camera.position + np.array([0.0, 0.0, 0.1]))  # dragged just now
    server.render_pending(None, step=1)
    assert page.sent[-1][1] == "jpeg" and not server.frame(0).full
    time.sleep(STILL_S + 0.05)
    server.render_pending(None, step=1)
    server.render_pending(None, step=1)
    assert [fmt for _, fmt in page.sent] == ["png", "jpeg", "png"] and server.frame(0).full
    assert np.allclose(server.frame(0).c2w[:, 3], [0.5, -0.25, 3.1])


def test_the_pages_first_camera_is_training_camera_0(served):
    server, _, c2w = served
    initial = server.server.initial_camera
    assert np.allclose(initial.position, [0.5, -0.25, 3.0]) and initial.fov == pytest.approx(0.8)
    assert np.allclose(initial.up, [0, 1, 0])
    # looking down -Z of c2w at the box centre's depth along it: (0.5, -0.25, 3 - 3)
    assert np.allclose(initial.look_at, [0.5, -0.25, 0.0])
