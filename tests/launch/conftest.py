"""Fixtures of the launch tests: process trees, launched runs, and a real single-node Slurm.

The Slurm cluster (``tools/slurm_local.sh``: Debian's slurmctld, slurmd and munge) is
started once per session and stopped at its end. Where the packages are missing (or we
are not root) the Slurm tests skip and say why; with ``DISTNERF_REQUIRE_SLURM=1`` (set by
``.ci/run``) they fail instead, so they cannot silently vanish from CI.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from distnerf.observe.logger import read_metrics_log
from tests.conftest import REPO, free_port

# a short 2-rank run: 40 steps, a checkpoint every 10, 1 test view, no LPIPS
SMOKE = ["experiment=smoke", "device=cpu", "monitor.progress=false", "monitor.log_every=1", "checkpoints.every=10",
         "train.max_steps=40", "eval.num_views=1", "sampler.num_workers=2"]
RUN_ENV = {"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


# ----------------------------------------------------------------------------- processes
def children_map() -> dict[int, list[int]]:
    """``{ppid: [pid, ...]}`` of every live process (from ``/proc/*/stat``)."""
    out: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        ppid = int(text.rsplit(")", 1)[1].split()[1])  # the command name may hold spaces and parentheses
        out.setdefault(ppid, []).append(int(stat.parent.name))
    return out


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first)."""
    tree, out, todo = children_map(), [], [pid]
    while todo:
        kids = tree.get(todo.pop(0), [])
        out += kids
        todo += kids
    return out


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def trainer_ranks(root_pid: int, run_dir: Path) -> dict[int, int]:
    """``{rank: pid}`` of the ``distnerf.train`` ranks of ``run_dir`` below ``root_pid``."""
    out = {}
    for pid in descendants(root_pid):
        env = environ(pid)
        if "distnerf.train" in cmdline(pid) and f"run_dir={run_dir}" in cmdline(pid) and "RANK" in env:
            out[int(env["RANK"])] = pid
    return out


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    """Poll ``predicate()`` until it returns a truthy value; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def rows(run_dir: Path) -> list[dict]:
    """The rows of a run's ``metrics.jsonl`` so far (a row being written left out; [] before the file)."""
    return read_metrics_log(run_dir, partial_tail=True)


def last_step(run_dir: Path) -> int:
    return max((r["step"] for r in rows(run_dir) if "loss" in r), default=-1)


def committed_step(run_dir: Path) -> int | None:
    """The step of the run's last committed checkpoint (None: none yet)."""
    from distnerf import checkpoint as ckpt

    latest = ckpt.latest(Path(run_dir) / "checkpoints")
    return None if latest is None else ckpt.read_manifest(latest)["step"]


def past_step_with_checkpoint(run_dir: Path, step: int, every: int) -> bool:
    """The run is past ``step`` and the checkpoint of its last multiple of ``every`` has committed (the write
    runs in the background: it commits a few steps after its own). A test that kills a rank waits for this, so
    that the checkpoint to resume from is known at the kill, not committed after it."""
    now = last_step(run_dir)
    return now >= step and committed_step(run_dir) == now // every * every


def launch_local(nproc: int, run_dir: Path, extra: list[str], env: dict | None = None, log: Path | None = None):
    """Start ``launch/torchrun_local.sh`` (its own process group); returns the Popen."""
    log = log or Path(run_dir).with_suffix(".out")
    Path(run_dir).parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(["bash", str(REPO / "launch" / "torchrun_local.sh"), str(nproc), str(run_dir), "--",
                             *SMOKE, *extra], cwd=REPO, env={**os.environ, **RUN_ENV, **(env or {})},
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float, what: str) -> int:
    """Wait for ``proc``; on timeout kill its process group and fail."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"{what} did not finish in {timeout} s") from None


@pytest.fixture(scope="session")
def ddp_reference(tmp_path_factory) -> Path:
    """The uninterrupted 2-rank ``ddp`` run of :data:`SMOKE` (``torchrun --standalone``, no restarts): the
    bit-exact reference of tests/launch/test_torchrun.py and of tests/launch/test_two_nodes.py's ddp chain,
    trained once per session. Under xdist those files run on different workers: the run lives in the
    session's shared temporary folder and an ``flock`` makes the first worker to need it train it while
    the other waits, then reads it (a ``done`` file marks a finished run; a failed or killed one is
    trained again by the next to ask)."""
    from distnerf.fileio import exclusive_lock

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # parent: shared by the workers
    run, done = root / "ddp_reference" / "run", root / "ddp_reference" / "done"
    run.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(root / "ddp_reference.lock", what="the shared ddp reference run"):
        if not done.exists():
            shutil.rmtree(run, ignore_errors=True)  # a run that failed or was killed: trained again
            proc = launch_local(2, run, ["strategy=ddp"], env={"MAX_RESTARTS": "0"})
            assert finish(proc, 300, "the uninterrupted ddp run") == 0, run.with_suffix(".out").read_text()[-4000:]
            done.write_text("")
    return run


# ----------------------------------------------------------------------------- Slurm
class SlurmCluster:
    """A running single-node cluster: ``SLURM_CONF`` and job helpers."""

    def __init__(self, conf_dir: Path):
        self.dir = conf_dir
        self.env = {**os.environ, "SLURM_CONF": str(conf_dir / "slurm.conf")}

    def cmd(self, *args: str, check: bool = True) -> str:
        proc = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc.stdout

    def sbatch(self, script: str, args: list[str], options: list[str], export: dict[str, str]) -> str:
        """Submit ``launch/<script>`` from the repository root; returns the job id."""
        exported = ",".join(["ALL"] + [f"{k}={v}" for k, v in {**RUN_ENV, **export}.items()])
        out = subprocess.run(["sbatch", "--parsable", f"--export={exported}", *options,
                              str(REPO / "launch" / script), *args], cwd=REPO, env=self.env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"sbatch {script} failed: {out.stderr}"
        return out.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, Restarts, ExitCode, ...)."""
        text = self.cmd("scontrol", "show", "job", job_id, check=False)
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait_state(self, job_id: str, states: tuple[str, ...], timeout: float) -> dict[str, str]:
        """Poll ``scontrol show job`` until the job is in one of ``states``."""
        info = {}

        def reached():
            nonlocal info
            info = self.job(job_id)
            return info.get("JobState") in states

        try:
            wait_for(reached, timeout, f"job {job_id} to reach {states}", interval=0.5)
        except AssertionError as err:
            raise AssertionError(f"{err}; last: {info}; slurmctld log tail: "
                                 f"{(self.dir / 'slurmctld.log').read_text()[-2000:]}") from None
        return info


def _slurm_missing() -> str | None:
    missing = [b for b in ("slurmctld", "slurmd", "munged", "sbatch", "scontrol") if shutil.which(b) is None]
    if missing:
        return f"Slurm not installed ({', '.join(missing)} not found; apt-get install slurmctld slurmd munge)"
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root (munged runs as the munge user, slurmd as root)"
    return None


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A single-node Slurm for the session (skips, or fails with DISTNERF_REQUIRE_SLURM=1, without it)."""
    reason = _slurm_missing()
    if reason:
        if os.environ.get("DISTNERF_REQUIRE_SLURM") == "1":
            pytest.fail(f"DISTNERF_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
    conf_dir = tmp_path_factory.mktemp("slurm")
    port = free_port()
    env = {**os.environ, "SLURM_LOCAL_PORT": str(port)}
    start = subprocess.run(["bash", str(REPO / "tools" / "slurm_local.sh"), "start", str(conf_dir)], env=env,
                           capture_output=True, text=True, timeout=60)
    if start.returncode != 0:
        pytest.fail(f"local Slurm did not start: {start.stdout}{start.stderr}")
    cluster = SlurmCluster(conf_dir)
    yield cluster
    jobs = cluster.cmd("squeue", "-h", "-o", "%i", check=False).split()
    if jobs:
        cluster.cmd("scancel", *jobs, check=False)
    subprocess.run(["bash", str(REPO / "tools" / "slurm_local.sh"), "stop", str(conf_dir)], env=env, timeout=60)
