"""A rank whose torchrun agent dies: noticed within seconds, stopped with a message naming the agent.

torchrun's agent (``torch.distributed.elastic``) is the parent process of its node's ranks: it
restarts them, hosts the rendezvous store on the first node and reports their exits. When the
agent alone dies (killed, out of memory), its ranks live on, re-parented; nothing restarts them,
and a rank whose peers went with their own agents waits in its next collective until
``dist_timeout_s``, or forever outside one. :class:`AgentWatch` is a daemon thread that sees the
parent change (``os.getppid()``), logs which agent was lost, asks the trainer to stop at a step
every rank agrees on (as SIGTERM would: a checkpoint when the peers are alive) and, if the process
is still running ``grace_s`` seconds later (blocked in a collective whose peers are gone), ends it
with exit status :data:`EXIT_AGENT_LOST`.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading

log = logging.getLogger(__name__)

EXIT_AGENT_LOST = 75
"""Exit status of a rank ended by :class:`AgentWatch` (EX_TEMPFAIL: a retry may succeed)."""
GRACE_S = 30.0
"""Seconds between the stop request and the forced exit (the clean stop's checkpoint, if the peers live)."""


def torchrun_agent_pid(environ=None) -> int | None:
    """The pid of this process's torchrun agent (its parent) when started by torchrun
    (``TORCHELASTIC_RUN_ID`` set), else None."""
    environ = os.environ if environ is None else environ
    return os.getppid() if "TORCHELASTIC_RUN_ID" in environ else None


class AgentWatch:
    """Watch the parent process ``agent_pid``; when this process is re-parented (the agent died),
    log an error naming it, send this process SIGTERM (the trainer's stop request,
    :class:`~distnerf.distributed.StopRequest`) and, ``grace_s`` seconds later, exit with
    :data:`EXIT_AGENT_LOST` if still running.

    Args:
        agent_pid: the agent's pid (:func:`torchrun_agent_pid`); None: :meth:`start` does nothing.
        rank: this process's rank (named in the message).
        poll_s: seconds between checks of the parent pid (> 0).
        grace_s: seconds from the stop request to the forced exit (>= 0).
    """

    def __init__(self, agent_pid: int | None, rank: int, poll_s: float = 1.0, grace_s: float = GRACE_S):
        if poll_s <= 0 or grace_s < 0:
            raise ValueError(f"poll_s={poll_s} must be > 0 and grace_s={grace_s} >= 0")
        self.agent_pid, self.rank, self.poll_s, self.grace_s = agent_pid, rank, poll_s, grace_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False

    def start(self) -> "AgentWatch":
        if self.agent_pid is not None and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="distnerf-agent-watch", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (the run ended on its own)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.poll_s)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if os.getppid() != self.agent_pid:
                break
        else:
            return
        self.lost = True
        msg = (f"rank {self.rank}: its torchrun agent (pid {self.agent_pid}) is gone (this process now has "
               f"parent pid {os.getppid()}): nothing will restart or report this rank; stopping (a checkpoint "
               f"if the other ranks are alive), exit {EXIT_AGENT_LOST} in {self.grace_s:g} s at the latest")
        log.error(msg)
        print(f"distnerf: {msg}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        if self._stop.wait(self.grace_s):
            return  # the run stopped on its own
        log.error("rank %d: still running %g s after its torchrun agent (pid %d) was lost: exit %d", self.rank,
                  self.grace_s, self.agent_pid, EXIT_AGENT_LOST)
        print(f"distnerf: rank {self.rank}: torchrun agent (pid {self.agent_pid}) lost; exit {EXIT_AGENT_LOST}",
              file=sys.stderr, flush=True)
        logging.shutdown()
        os._exit(EXIT_AGENT_LOST)
