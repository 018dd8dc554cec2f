"""The suite cannot hang: every test runs under pytest-timeout (``timeout`` in pyproject.toml), and
when one fires, the stacks of every process the test started are printed before it fails.

pytest-timeout (signal method) prints the stacks of the pytest process's own threads; a test that
hangs usually waits on a child (a torchrun agent, its ranks, a sampler worker). This hook takes
over pytest-timeout's timer: on expiry it lists this process's descendants from ``/proc``, prints
each one's command line and its Python stacks (``py-spy dump``: a test dependency; without it
the command lines only, said), kills them (nothing is left running into the next test) and then
hands over to pytest-timeout's own handler, which prints the main process's stacks and fails the test.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest


def descendants(pid: int) -> list[int]:
    """Every live descendant of process ``pid`` (from ``/proc/*/stat``), parents before children."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])  # the field after the state
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += children.get(p, [])
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "(gone)"


def dump_and_kill_descendants(write) -> list[int]:
    """Print every descendant's command line and Python stacks, then SIGKILL them; returns their pids."""
    pids = descendants(os.getpid())
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    spy = spy if Path(spy).exists() else None
    write(f"{len(pids)} process(es) started by this test" + ("" if spy else " (py-spy not installed: "
                                                                             "command lines only)") + "\n")
    for pid in pids:
        write(f"--- pid {pid}: {_cmdline(pid)}\n")
        if spy:
            try:
                dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=20)
                write((dump.stdout or dump.stderr).rstrip() + "\n")
            except subprocess.TimeoutExpired:
                write("(py-spy timed out)\n")
    for pid in reversed(pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout's signal timer, with the descendants' stacks first (see the module docstring)."""
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None  # pytest-timeout's own timer
    import pytest_timeout

    def handler(signum, frame):
        __tracebackhide__ = True
        terminal = item.config.get_terminal_writer()
        terminal.sep("+", title=f"Timeout after {settings.timeout:g} s: the processes this test started")
        dump_and_kill_descendants(terminal.write)
        pytest_timeout.timeout_sigalrm(item, settings)

    def cancel():
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    item.cancel_timeout = cancel
    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    return True
