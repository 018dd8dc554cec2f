"""The suite cannot hang (tests/timeouts.py): a test past its timeout fails, printing the stacks of the
processes it started, and leaves none of them running."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import REPO


def test_a_hung_test_fails_with_its_childrens_stacks_and_kills_them(tmp_path):
    (tmp_path / "conftest.py").write_text("from tests.timeouts import pytest_timeout_set_timer  # noqa: F401\n")
    (tmp_path / "test_hang.py").write_text(
        "import subprocess, sys, time\n"
        "def test_waits_on_a_child(tmp_path):\n"
        "    code = 'import time\\ndef stuck_in_the_child():\\n    time.sleep(600)\\nstuck_in_the_child()'\n"
        "    child = subprocess.Popen([sys.executable, '-c', code])\n"
        "    (tmp_path.parent / 'child.pid').write_text(str(child.pid))\n"
        "    time.sleep(1)\n"
        "    child.wait()\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=4",
                           f"--basetemp={tmp_path / 'base'}", str(tmp_path / "test_hang.py")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Timeout after 4 s" in out and "Failed: Timeout" in out, out
    assert "stuck_in_the_child" in out, out  # the child's own Python stack (py-spy)
    pid = int(next((tmp_path / "base").rglob("child.pid")).read_text())
    assert re.search(rf"--- pid {pid}: .*python", out), out
    assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split(")")[1][:3]
