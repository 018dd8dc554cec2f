"""The viewer's address (issue 52, item 3): by default the server listens on loopback only, so a
connection to the machine's own network address is refused; an explicit ``viewer.host=0.0.0.0``
accepts it (the control that makes the refusal mean something) and logs a warning."""
from __future__ import annotations

import ipaddress
import logging
import socket
import time

import numpy as np
import pytest
import torch

pytest.importorskip("viser")

from distnerf.data.base import SceneData  # noqa: E402
from distnerf.schema import ViewerConfig  # noqa: E402
from distnerf.viewer.frames import pinhole  # noqa: E402
from distnerf.viewer.server import ViewerServer  # noqa: E402
from tests.conftest import free_port  # noqa: E402


def own_address() -> str | None:
    """This machine's IPv4 address on its outgoing interface (connecting a UDP socket sends
    nothing), else any non-loopback address of its host name; None when it has none."""
    candidates = []
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            candidates.append(s.getsockname()[0])
    except OSError:
        pass
    try:
        candidates += [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
    except OSError:
        pass
    for address in candidates:
        ip = ipaddress.ip_address(address)
        if not (ip.is_loopback or ip.is_unspecified):
            return address
    return None


def connects(address: str, port: int) -> bool:
    """Whether a TCP connection to ``address:port`` is accepted (False: refused)."""
    try:
        socket.create_connection((address, port), timeout=5).close()
        return True
    except ConnectionRefusedError:
        return False


def tiny_server(host: str) -> ViewerServer:
    cams = pinhole(np.eye(4)[:3], 1.0, 8, 8)
    scene = SceneData("train", torch.zeros(1, 8, 8, 3), cams, 1.0, 2.0,
                      torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]]), torch.ones(3))

    def never(*args):  # no browser connects: nothing is rendered
        raise AssertionError("rendered without a client")

    return ViewerServer(free_port(), scene, cams, host=host, render_image=never)


def listening(address: str, port: int, seconds: float = 5.0) -> bool:
    """``connects``, retried while the server's thread may still be starting."""
    end = time.monotonic() + seconds
    while not connects(address, port):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def test_the_default_host_refuses_the_machines_own_address_and_another_host_warns(caplog):
    address = own_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect to")
    assert ViewerConfig().host == "127.0.0.1"
    with caplog.at_level(logging.WARNING, logger="distnerf"):
        server = tiny_server(ViewerConfig().host)
        try:
            assert listening("127.0.0.1", server.port)  # it serves, on loopback
            assert not connects(address, server.port), f"the default viewer accepted a connection on {address}"
        finally:
            server.stop()
        assert not [r for r in caplog.records if "without authentication" in r.getMessage()]
        server = tiny_server("0.0.0.0")
        try:
            assert listening(address, server.port)  # every interface: the same connection is accepted
        finally:
            server.stop()
    warned = [r for r in caplog.records if "without authentication" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING and "0.0.0.0" in warned[0].getMessage()
