"""The signal handler behind preemption: SIGUSR1/SIGTERM only record a stop request."""
from __future__ import annotations

import os
import signal

import pytest

from distnerf import dist as D


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
        D.init_distributed("cpu", timeout_s=0)
