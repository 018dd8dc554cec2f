"""A rank's compute threads: the cores it may use (affinity, cgroup quota) shared among the node's
ranks, the user's setting first, passive OpenMP waiting, and the load warning (issue 52, item 5)."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest
import torch

from distnerf import cpu


@pytest.mark.parametrize("files, expected", [
    ({"cpu.max": "250000 100000\n"}, 2.5),                                       # cgroup v2, --cpus=2.5
    ({"cpu.max": "max 100000\n"}, None),                                         # v2, unlimited
    ({"cpu/cpu.cfs_quota_us": "150000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1.5),  # v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),     # v1, unlimited
    ({}, None),                                                                  # no cgroup cpu files
])
def test_cgroup_cpu_limit(tmp_path, files, expected):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cpu.cgroup_cpu_limit(tmp_path) == expected


def test_usable_cores_and_the_share_of_each_rank():
    assert cpu.usable_cores(set(range(8))) == 8
    assert cpu.usable_cores(set(range(8)), quota=2.5) == 2  # the quota caps the affinity, rounded down
    assert cpu.usable_cores({3}, quota=4.0) == 1
    assert cpu.usable_cores(set(range(4)), quota=0.5) == 1  # at least one
    assert cpu.threads_per_rank(16, 1) == 16
    assert cpu.threads_per_rank(16, 3) == 5
    assert cpu.threads_per_rank(2, 4) == 1
    with pytest.raises(ValueError):
        cpu.threads_per_rank(2, 0)


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_configure_takes_the_config_then_the_environment_then_the_cores(monkeypatch, restore_threads):
    monkeypatch.setattr(cpu, "usable_cores", lambda: 6)
    monkeypatch.setattr(cpu.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    plan = cpu.configure(None, 2, environ={})
    assert (plan.threads, plan.source, torch.get_num_threads()) == (3, "cores / local ranks", 3)
    plan = cpu.configure(None, 2, environ={"OMP_NUM_THREADS": "1"})
    assert (plan.threads, plan.source, torch.get_num_threads()) == (1, "OMP_NUM_THREADS", 1)
    plan = cpu.configure(4, 2, environ={"OMP_NUM_THREADS": "1"})
    assert (plan.threads, plan.source, torch.get_num_threads()) == (4, "config num_threads", 4)
    with pytest.raises(ValueError, match="OMP_NUM_THREADS='two'"):
        cpu.configure(None, 1, environ={"OMP_NUM_THREADS": "two"})


def test_a_loaded_machine_is_warned_about(monkeypatch, caplog, restore_threads):
    monkeypatch.setattr(cpu, "usable_cores", lambda: 4)
    monkeypatch.setattr(cpu.os, "getloadavg", lambda: (3.0, 0.0, 0.0))  # one core free, 4 threads wanted
    with caplog.at_level(logging.WARNING, logger="distnerf.cpu"):
        cpu.configure(None, 1, environ={})
    assert "leaves about 1.0 of 4 usable cores free, fewer than this node's 1 rank(s) x 4 compute threads" \
        in caplog.text
    caplog.clear()
    monkeypatch.setattr(cpu.os, "getloadavg", lambda: (0.5, 0.0, 0.0))
    with caplog.at_level(logging.WARNING, logger="distnerf.cpu"):
        cpu.configure(None, 2, environ={})  # 2 ranks x 2 threads on 3.5 free cores
        assert "usable cores free" in caplog.text
        caplog.clear()
        cpu.configure(None, 2, environ={}, warn=False)  # the other local ranks stay quiet
    assert caplog.text == ""


def test_the_wait_spins_on_free_cores_sleeps_on_busy_ones_and_never_overrides_the_user(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch")  # as at the entry point, before torch loads OpenMP
    environ = {}
    assert cpu.choose_wait(environ, busy=0.3) == "spin" and environ == {"GOMP_SPINCOUNT": str(cpu.SPIN_COUNT)}
    environ = {}
    assert cpu.choose_wait(environ, busy=1.0) == "passive" and environ == {"OMP_WAIT_POLICY": "PASSIVE"}
    environ = {"LOCAL_WORLD_SIZE": "4"}  # three sibling ranks importing beside this one: still free
    assert cpu.choose_wait(environ, busy=3.2) == "spin" and environ["GOMP_SPINCOUNT"] == str(cpu.SPIN_COUNT)
    environ = {"LOCAL_WORLD_SIZE": "4"}
    assert cpu.choose_wait(environ, busy=3.8) == "passive"
    for user in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "10000"}):
        environ = dict(user)
        assert cpu.choose_wait(environ, busy=0.0) == "user" and environ == user
    monkeypatch.undo()
    environ = {}
    assert cpu.choose_wait(environ, busy=0.0) == "late" and environ == {}  # torch loaded: too late to take effect
    assert "GOMP_SPINCOUNT=30000" in cpu.wait_setting({"GOMP_SPINCOUNT": "30000"})


def test_busy_cores_sees_a_process_spinning_beside_it():
    """A real busy process on one core shows as at least 0.7 busy cores in /proc/stat (others may add more)."""
    if cpu.busy_cores(0.05) is None:
        pytest.skip("no /proc/stat (not Linux)")
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 5: pass"])
    try:
        time.sleep(0.3)  # the interpreter started and spinning
        assert cpu.busy_cores(0.5) >= 0.7
    finally:
        spinner.kill()
        spinner.wait()


def _poll_until(watch, condition, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        watch.poll()
        if condition():
            return True
        time.sleep(0.05)
    return False


SPIN = "import time\nt = time.time()\nwhile time.time() - t < 20: pass"


@pytest.mark.exclusive  # it reads the machine's idle cores: alone, after the parallel part
def test_core_watch_drops_a_thread_beside_another_process_and_takes_it_back(restore_threads):
    """A real CPU-bound process outside the run's tree: the watch goes to one thread within a second; once it
    ends, back to two. The run's own processes (its tree: here a spinning child of the root) never count."""
    if cpu.busy_cores(0.05) is None:
        pytest.skip("no /proc/stat (not Linux)")
    torch.set_num_threads(2)
    own = subprocess.Popen([sys.executable, "-c", SPIN])  # a child of this process: the run's own work
    try:
        watch = cpu.CoreWatch(2, os.getpid(), period_s=0.2, restore_after_s=0.4)
        assert not _poll_until(watch, lambda: watch.current != 2, 2.0), watch.others  # its own tree: not others
    finally:
        own.kill()
        own.wait()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    other = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        watch = cpu.CoreWatch(2, sleeper.pid, period_s=0.2, restore_after_s=0.4)  # this process and `other`: others
        assert _poll_until(watch, lambda: watch.current == 1, 3.0), watch.others
        assert torch.get_num_threads() == 1 and watch.others >= 0.6
        other.kill()
        other.wait()
        assert _poll_until(watch, lambda: watch.current == 2, 4.0), watch.others
        assert torch.get_num_threads() == 2 and watch.changes == 2
    finally:
        for p in (sleeper, other):
            p.kill()
            p.wait()


def test_core_watch_waits_out_a_pause_and_leaves_one_thread_alone(restore_threads):
    """A poll after a pause longer than four periods (an evaluation) only takes a new baseline; with one planned
    thread nothing is read."""
    watch = cpu.CoreWatch(2, os.getpid(), period_s=0.2)
    assert watch.poll(now=100.0) is None and watch._last is not None
    first = watch._last
    assert watch.poll(now=100.1) is None and watch._last is first  # within a period: not read again
    assert watch.poll(now=105.0) is None and watch._last is not first  # a pause: a new baseline, no decision
    single = cpu.CoreWatch(1, os.getpid())
    assert single.poll() is None and single._last is None
