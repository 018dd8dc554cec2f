"""A rank whose torchrun agent dies stops within its grace period, naming the agent (issue 52, item 7a).

Not a real torchrun: a tiny process tree of the same shape. A reaper (the test's child, made a
child subreaper so the orphaned rank is re-parented to it and its exit status can be read)
starts an "agent" process, which starts a "rank" with ``TORCHELASTIC_RUN_ID`` set, as torchrun's
agent starts its workers. The rank runs :class:`distnerf.distributed.agent.AgentWatch` (the module loaded
from its file: importing the ``distnerf.distributed`` package would import torch, ~2 s per process)
and ignores SIGTERM, as a rank blocked in a collective whose peers are gone would not act on it.
The reaper SIGKILLs the agent and waits for the rank.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

AGENT_PY = Path(__file__).resolve().parents[2] / "distnerf" / "distributed" / "agent.py"

RANK = f"""
import importlib.util, signal, sys, time
spec = importlib.util.spec_from_file_location("agent", {str(AGENT_PY)!r})
agent = importlib.util.module_from_spec(spec); spec.loader.exec_module(agent)
signal.signal(signal.SIGTERM, lambda *a: print("SIGTERM", file=sys.stderr, flush=True))  # blocked: no stop
agent.AgentWatch(agent.torchrun_agent_pid(), rank=3, poll_s=0.1, grace_s=1.0).start()
print("ready", flush=True)
time.sleep(20)  # without the watch: exit 0 after 20 s
"""

AGENT = """
import os, subprocess, sys
rank = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env={**os.environ, "TORCHELASTIC_RUN_ID": "t"},
                        stdout=sys.stdout, stderr=open(sys.argv[2], "w"))
print(rank.pid, flush=True)
rank.wait()
"""

REAPER = """
import ctypes, json, os, signal, subprocess, sys, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come to us
agent = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]], stdout=subprocess.PIPE, text=True)
rank_pid = int(agent.stdout.readline())
assert agent.stdout.readline().strip() == "ready"
os.kill(agent.pid, signal.SIGKILL)
agent.wait()
t0 = time.monotonic()
_, status = os.waitpid(rank_pid, 0)
print(json.dumps({"agent_pid": agent.pid, "exit": os.waitstatus_to_exitcode(status), "seconds": time.monotonic() - t0}))
"""


def test_a_rank_whose_agent_dies_stops_naming_it(tmp_path):
    err = tmp_path / "rank.err"
    proc = subprocess.run([sys.executable, "-c", REAPER, AGENT, RANK, str(err)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["exit"] == 75, (got, err.read_text())  # EXIT_AGENT_LOST, after the 1 s grace
    assert 0.9 < got["seconds"] < 10, got  # not before the grace ran out, not at a collective timeout
    text = err.read_text()
    assert f"rank 3: its torchrun agent (pid {got['agent_pid']}) is gone" in text, text
    assert "SIGTERM" in text  # the trainer's stop request came first


def test_no_watch_outside_torchrun():
    from distnerf.distributed import AgentWatch, torchrun_agent_pid

    assert torchrun_agent_pid({}) is None
    assert AgentWatch(None, 0).start()._thread is None
