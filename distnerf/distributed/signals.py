"""Stop requests by signal: the preemption warning before a job's time limit and SIGTERM,
recorded by a handler and acted on by the trainer at a step every rank agrees on."""
from __future__ import annotations

import os
import signal
import threading
from collections.abc import Mapping


PREEMPT_SIGNALS = ("USR1", "USR2", "HUP")
"""Signals that may carry the warning before a job's time limit (``PREEMPT_SIGNAL`` in
``launch/``): some NCCL releases install their own SIGUSR1 handler, so a cluster may use USR2 or
HUP instead (as submitit does)."""


def preempt_signal(env: Mapping[str, str] | None = None) -> str:
    """The preemption signal's name (``"SIGUSR1"``, ``"SIGUSR2"`` or ``"SIGHUP"``) from the
    environment variable ``DISTNERF_PREEMPT_SIGNAL`` (set by ``launch/common.sh`` from
    ``PREEMPT_SIGNAL``; default USR1). Raises ValueError naming the variable for any other value."""
    value = (os.environ if env is None else env).get("DISTNERF_PREEMPT_SIGNAL", "USR1").upper().removeprefix("SIG")
    if value not in PREEMPT_SIGNALS:
        raise ValueError(f"DISTNERF_PREEMPT_SIGNAL={value!r}: the preemption signal must be one of "
                         f"{', '.join(PREEMPT_SIGNALS)} (and match sbatch --signal=B:<signal>@T)")
    return f"SIG{value}"


class StopRequest:
    """A stop asked for by a signal: the preemption signal (:func:`preempt_signal`, SIGUSR1
    by default: Slurm's warning before the time limit, ``--signal=B:USR1@T`` forwarded by the
    batch script) or SIGTERM (``scancel``, node drain, torchrun shutting its workers down).

    The handler only records the signal; the trainer adds :attr:`requested` to its
    per-step all-reduce, so a signal that reaches one rank stops every rank at the same
    step, and they checkpoint together. Repeated signals change nothing (Slurm and the
    torchrun agent may both deliver SIGTERM); SIGKILL after their grace period
    (``KillWait``, the agent's shutdown timeout) is the escalation.

    Raises ValueError (from :func:`preempt_signal`) for an unknown ``DISTNERF_PREEMPT_SIGNAL``.
    """

    def __init__(self, env: Mapping[str, str] | None = None):
        self.SIGNALS = (preempt_signal(env), "SIGTERM")
        self.signal: str | None = None
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def install(self) -> "StopRequest":
        """Handle :attr:`SIGNALS` in this process (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                sig = getattr(signal, name)
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.signal is None:
            self.signal = signal.Signals(signum).name
