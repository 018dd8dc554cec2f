"""launch/common.sh picks the network interface gloo and NCCL use (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME)
from this machine's real interfaces (``ip``)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2's ip")


def pick(host: str, **env) -> dict:
    script = f". {REPO / 'launch' / 'common.sh'}; distnerf_socket_ifname {host}; " \
             'echo "G=${GLOO_SOCKET_IFNAME:-} N=${NCCL_SOCKET_IFNAME:-}"'
    base = {k: v for k, v in os.environ.items() if not k.endswith("_SOCKET_IFNAME")}
    proc = subprocess.run(["bash", "-c", script], env={**base, **env}, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    out = dict(kv.split("=", 1) for kv in proc.stdout.split())
    return {"gloo": out["G"], "nccl": out["N"], "log": proc.stderr}


def interfaces() -> dict[str, str]:
    """{IPv4 address: interface} of this machine."""
    lines = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout.splitlines()
    return {ln.split()[3].split("/")[0]: ln.split()[1] for ln in lines}


def test_the_interface_holding_the_hosts_address_is_picked_for_both():
    for addr, dev in interfaces().items():
        got = pick(addr)
        assert got["gloo"] == dev and got["nccl"] == dev, (addr, got)
        assert f"GLOO_SOCKET_IFNAME={dev}" in got["log"]


def test_a_users_setting_is_kept_and_an_unreachable_host_is_said():
    addr = next(iter(interfaces()))
    assert pick(addr, GLOO_SOCKET_IFNAME="ib0")["gloo"] == "ib0"
    got = pick("no-such-host.invalid")
    assert got["gloo"] == "" and "set GLOO_SOCKET_IFNAME" in got["log"]
