"""Shared test fixtures: dataset locations, free ports, spawning gloo workers."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.timeouts import pytest_timeout_set_timer  # noqa: F401  (the hook: a hung test prints its children's stacks)

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
LEGO = SHARED_DATA / "nerf_synthetic_half" / "lego"
FERN = SHARED_DATA / "nerf_llff_data" / "fern"


def free_port() -> int:
    """A free TCP port on the loopback interface (a test's process group, server or Slurm daemon)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _data_missing() -> list[str]:
    return [str(p) for p in (LEGO, FERN) if not p.is_dir()]


def pytest_configure(config):
    """CI (``DISTNERF_REQUIRE_DATA=1``, set by ``.ci/run``) always has ../shared/data: fail at once
    without it, rather than pass with the real-data tests skipped."""
    missing = _data_missing()
    if missing and os.environ.get("DISTNERF_REQUIRE_DATA") == "1":
        raise pytest.UsageError(f"DISTNERF_REQUIRE_DATA=1 but the real datasets are missing: {', '.join(missing)}")


SLURM_FILES = ("tests/launch/test_slurm.py", "tests/launch/test_study_slurm.py")
"""The files whose tests use the local Slurm cluster (the ``slurm`` fixture: one slurmctld and munged per
machine): under xdist they run on one worker, one after another. Collection fails if a test elsewhere uses it."""


def _file(nodeid: str) -> str:
    return nodeid.split("::")[0]


def schedule_scope(nodeid: str) -> str:
    """The scope a test is scheduled with under xdist: its file, or "slurm" for the files of SLURM_FILES.
    (Not named ``test_*``: a test module importing this conftest's names would collect it as a test.)"""
    path = _file(nodeid)
    return "slurm" if path in SLURM_FILES else path


def pytest_collection_modifyitems(config, items):
    """Every test that uses the ``slurm`` fixture must be in a file of SLURM_FILES (else one worker's cluster
    would meet another's)."""
    strays = sorted({_file(i.nodeid) for i in items if "slurm" in getattr(i, "fixturenames", ())}
                    - set(SLURM_FILES))
    if strays:
        raise pytest.UsageError(f"tests/conftest.py: {', '.join(strays)} use(s) the slurm fixture: add to SLURM_FILES")


DURATIONS = Path(__file__).with_name("durations.json")
"""Seconds each schedule scope (:func:`schedule_scope`) took in a recorded run of the suite (setup, call and
teardown of its tests, summed): the order in which the workers are given the scopes. Rewrite it with
``DISTNERF_RECORD_DURATIONS=1 bash tools/run_tests.sh`` (:func:`pytest_sessionfinish`)."""


def scope_order(scopes: list[str], seconds: dict[str, float]) -> list[str]:
    """``scopes`` longest first by their recorded ``seconds``, the scopes with no record (new files) before
    them in their given order: a scope's cost is unknown until recorded, and a long one started last leaves
    the other worker idle while it runs (longest-processing-time-first; Graham 1969)."""
    unknown = [s for s in scopes if s not in seconds]
    return unknown + sorted((s for s in scopes if s in seconds), key=lambda s: -seconds[s])


def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (``tools/run_tests.sh``: ``-n 2``) a file's tests run on one worker, so its module- and
    session-scoped runs (the shared multi-process trainings) are built once, not once per worker, and the
    Slurm files share one worker; the files are handed out longest first (:func:`scope_order`; xdist's own
    order is by test count, which put the few-test multi-process files last). (xdist's own ``--dist
    loadgroup`` does not group under pytest 9, whose node ids ignore the group suffix xdist adds: each
    file's fixtures then ran on both workers.)"""
    import json

    from xdist.scheduler import LoadScopeScheduling

    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}

    class FileScheduling(LoadScopeScheduling):
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return schedule_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self._ordered:  # the queue is complete at the first hand-out (LoadScopeScheduling.schedule)
                self._ordered = True
                queue = dict(self.workqueue)
                self.workqueue.clear()
                self.workqueue.update((s, queue[s]) for s in scope_order(list(queue), seconds))
            super()._assign_work_unit(node)

    return FileScheduling(config, log)


_scope_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Sum each schedule scope's seconds (under xdist: on the controller, from the workers' reports)."""
    scope = schedule_scope(report.nodeid)
    _scope_seconds[scope] = _scope_seconds.get(scope, 0.0) + report.duration


def pytest_sessionfinish(session):
    """``DISTNERF_RECORD_DURATIONS=1``: write :data:`DURATIONS` from this run's xdist part (on its controller; the
    part ``tools/run_tests.sh`` runs alone afterwards is not scheduled), merged over the recorded scopes this run did not run (a run of a few files keeps
    the others' records)."""
    if (os.environ.get("DISTNERF_RECORD_DURATIONS") != "1" or hasattr(session.config, "workerinput")
            or not getattr(session.config.option, "numprocesses", None)):  # the xdist part only (its order)
        return
    import json

    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    seconds.update({k: round(v, 1) for k, v in _scope_seconds.items()})
    DURATIONS.write_text(json.dumps(dict(sorted(seconds.items(), key=lambda kv: -kv[1])), indent=0) + "\n")


def pytest_report_header(config):
    missing = _data_missing()
    if missing:
        return [f"!!! REAL-DATA TESTS WILL SKIP: {', '.join(missing)} not found (expected beside the repo, "
                f"in ../shared/data; see its README) !!!"]
    return [f"real data: {SHARED_DATA}"]


def spawn(fn, world_size: int, *args, timeout: float = 300.0) -> None:
    """Run ``fn(rank, world_size, port, *args)`` in ``world_size`` spawned processes."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(fn, args=(world_size, free_port(), *args), nprocs=world_size, join=False,
                             start_method="spawn")
    import time

    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"workers of {fn.__name__} did not finish in {timeout} s")


def run_cli(args: list[str], cwd: Path = REPO, timeout: float = 600.0, env: dict | None = None):
    """Run a command (e.g. ``[sys.executable, '-m', 'distnerf.train', ...]``); fail with its output."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", **(env or {})}
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed with {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\n"
                             f"STDERR:\n{proc.stderr[-6000:]}")
    return proc


def torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]


@pytest.fixture(scope="session")
def synthetic_cache(tmp_path_factory) -> Path:
    """One cache directory for the built-in scene shared by the whole session."""
    return tmp_path_factory.mktemp("synthetic_cache")





def step_sse(trainer, run_step) -> float:
    """One training step of ``trainer`` through ``run_step`` (tests/trainers.py::run_step, fit's step); the
    summed error (``RayError.sse``) that step backpropagated, as a float."""
    return float(run_step(trainer)[2].sse)
