"""The signal handler behind preemption: SIGUSR1/SIGTERM only record a stop request."""
from __future__ import annotations

import os
import signal

import pytest

from distnerf import distributed as D


def test_signal_sets_the_flag_once_and_uninstall_restores_handlers():
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    stop = D.StopRequest().install()
    try:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGUSR1)  # delivered to this (main) thread before kill returns
        assert stop.requested and stop.signal == "SIGUSR1"
        os.kill(os.getpid(), signal.SIGTERM)  # a later signal neither kills nor overwrites the first
        assert stop.signal == "SIGUSR1"
    finally:
        stop.uninstall()
    assert {s: signal.getsignal(s) for s in before} == before


def test_collective_timeout_must_be_positive():
    with pytest.raises(ValueError, match="dist_timeout_s must be > 0"):
        D.init_distributed("cpu", timeout_s=0, setup_timeout_s=None)


def test_preemption_signal_is_configurable_and_checked():
    stop = D.StopRequest({"DISTNERF_PREEMPT_SIGNAL": "USR2"}).install()
    try:
        os.kill(os.getpid(), signal.SIGUSR2)  # without the handler SIGUSR2 would end this process
        assert stop.signal == "SIGUSR2"
    finally:
        stop.uninstall()
    assert D.preempt_signal({}) == "SIGUSR1" and D.preempt_signal({"DISTNERF_PREEMPT_SIGNAL": "SIGHUP"}) == "SIGHUP"
    with pytest.raises(ValueError, match="DISTNERF_PREEMPT_SIGNAL='TERM'.*USR1, USR2, HUP"):
        D.StopRequest({"DISTNERF_PREEMPT_SIGNAL": "TERM"})


CHILD = """
import signal, sys, time
got = []
for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
    signal.signal(s, lambda n, f: got.append(signal.Signals(n).name))
print("ready", flush=True)
deadline = time.time() + 20
while not got and time.time() < deadline:
    time.sleep(0.05)
print("child got", got, flush=True)
"""


@pytest.mark.parametrize("preempt, sent", [("USR2", "USR2"), ("HUP", "USR1")])
def test_launch_script_forwards_the_configured_signal(tmp_path, preempt, sent):
    """launch/common.sh's distnerf_run forwards PREEMPT_SIGNAL to its child; another preemption
    signal (a --signal that does not match) is named and forwarded as the configured one."""
    import subprocess
    import sys
    import time

    from tests.conftest import REPO

    (tmp_path / "child.py").write_text(CHILD)
    script = (f". {REPO}/launch/common.sh; distnerf_setup; distnerf_run {sys.executable} {tmp_path}/child.py; "
              f'echo "signal=$DISTNERF_SIGNAL rc=$DISTNERF_RC"')
    env = {**os.environ, "PREEMPT_SIGNAL": preempt, "DISTNERF_ROOT": str(REPO)}
    proc = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    proc.send_signal(getattr(signal, f"SIG{sent}"))
    out, err = proc.communicate(timeout=30)
    assert f"child got ['SIG{preempt}']" in out and f"signal={preempt} rc=0" in out, (out, err)
    assert ("differ" in err) == (sent != preempt), err
    bad = subprocess.run(["bash", "-c", f". {REPO}/launch/common.sh; distnerf_setup"], capture_output=True, text=True,
                         env={**env, "PREEMPT_SIGNAL": "TERM"})
    assert bad.returncode == 2 and "PREEMPT_SIGNAL=TERM: must be USR1, USR2 or HUP" in bad.stderr
