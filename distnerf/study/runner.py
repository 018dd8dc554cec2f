"""Running a study's cells: one ordinary run directory per cell, locally or on Slurm.

Every cell runs ``distnerf.train`` under the launch scripts users run themselves:

* ``local``: ``launch/torchrun_local.sh <world size> STUDY_DIR/cells/<id> -- <overrides>``,
  one cell after another;
* ``slurm``: one ``launch/slurm_train.sbatch`` job per cell (``RUN_DIR`` and ``NPROC``
  exported), all submitted at once with ``--dependency=singleton`` and one job name per
  study, so Slurm runs them one at a time (timed cells never share the machine), then
  polled with ``squeue`` until they leave the queue.

A cell's record, ``cells/<id>/study_cell.json``, holds its status (``running``,
``submitted``, ``done``, ``failed``), exit status, wall time, the load average and free
memory when it started, how long it waited for a quiet machine and whether it had to start
anyway (``contended``). A cell is **finished** when its run directory has ``metrics.json``
and a committed checkpoint of the same step (the trainer writes both at the end): re-running
the study skips it. A failed cell is reported and skipped unless ``retry_failed``; a cell
left ``running``/``submitted`` by a study that was killed is moved to
``STUDY_DIR/attempts/<id>.<n>`` (kept, not deleted) and run again from scratch, unless it is
untimed and has a committed checkpoint (a cell stopped by SIGTERM writes one): then it resumes
from that checkpoint in place (``resume=true``; a resumed run continues the uninterrupted one
bit-exactly, ``tests/dist/test_resume.py``), its record keeping the step it resumed from and when
its first attempt started. A timed cell always starts again: a resumed run's step times would mix
two processes' start-ups. Before any of that, a cell whose record's training overrides differ from
the ones the study now plans for it (its config edited since: a ``fixed`` setting, a level, the seed)
is moved to ``STUDY_DIR/superseded/<id>.<n>``, finished or not, and run again from scratch: a study
never keeps a finished cell, nor resumes a killed one, at settings it no longer has.

World size 1 runs under torchrun too (one rank, no process group: the trainer's
single-process path), so every cell is launched the same way. Torchrun restarts are off
(``MAX_RESTARTS=0``): a crash fails its cell instead of hiding in a restart.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .. import checkpoint as ckpt
from ..config_check import upgrade_overrides
from ..fileio import atomic_write_text
from .plan import Cell, override_changes

REPO = Path(__file__).resolve().parents[2]
RECORD = "study_cell.json"


def cell_dir(study_dir: Path, cell: Cell) -> Path:
    return Path(study_dir) / "cells" / cell.id


def read_record(run_dir: Path) -> dict | None:
    path = Path(run_dir) / RECORD
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not a study cell record ({err}); remove the cell's directory to re-run it") from None


def write_record(run_dir: Path, record: dict) -> None:
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(run_dir) / RECORD, json.dumps(record, indent=1))


def finished(run_dir: Path) -> bool:
    """``metrics.json`` and a committed checkpoint at its step: the run ended and was evaluated."""
    metrics = Path(run_dir) / "metrics.json"
    if not metrics.exists():
        return False
    last = ckpt.latest(Path(run_dir) / "checkpoints")
    if last is None:
        return False
    return ckpt.read_manifest(last)["step"] == json.loads(metrics.read_text())["step"]


def busy_cores(sample_s: float) -> float:
    """Cores busy over the next ``sample_s`` seconds (from ``/proc/stat``: non-idle jiffies of all
    CPUs over elapsed jiffies of one): the machine's load now, not averaged over minutes."""
    def read():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, sum(fields)

    busy0, total0 = read()
    time.sleep(sample_s)
    busy1, total1 = read()
    ncpu = os.cpu_count() or 1
    return ncpu * (busy1 - busy0) / max(total1 - total0, 1)


def machine_load(sample_s: float | None = None) -> dict:
    """1/5/15-minute load averages, ``MemAvailable`` (MiB) and, with ``sample_s``, the cores busy
    over that many seconds (``busy``)."""
    load1, load5, load15 = os.getloadavg()
    mem = None
    try:
        with open("/proc/meminfo") as f:
            mem = next(int(ln.split()[1]) / 1024 for ln in f if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        pass
    out = {"load1": load1, "load5": load5, "load15": load15, "mem_available_mb": mem}
    if sample_s:
        out["busy"] = busy_cores(sample_s)
    return out


def wait_for_quiet(load_cfg, log=print) -> dict:
    """Wait (at most ``load_cfg.wait_s``) until the load is below ``load_cfg.max_load``: the cores
    busy over ``sample_s`` (``measure: instant``, the default: the 1-minute average stays high for
    minutes after the study's own previous cell has exited) or the 1-minute load average.

    Returns:
        ``{"load": machine_load() at the start, "waited_s", "contended"}`` (contended: the wait
        ran out and the cell starts anyway; False when no threshold is set).
    """
    start = time.monotonic()
    if load_cfg.max_load is None:
        return {"load": machine_load(), "waited_s": 0.0, "contended": False, "max_load": None}
    said = False
    key = "busy" if load_cfg.measure == "instant" else "load1"
    while True:
        now = machine_load(load_cfg.sample_s if key == "busy" else None)
        if now[key] < load_cfg.max_load:
            return {"load": now, "waited_s": time.monotonic() - start, "contended": False,
                    "max_load": load_cfg.max_load}
        if time.monotonic() - start >= load_cfg.wait_s:
            log(f"  load ({key}) {now[key]:.2f} still >= {load_cfg.max_load} after {load_cfg.wait_s:.0f} s: "
                "starting anyway, marked contended")
            return {"load": now, "waited_s": time.monotonic() - start, "contended": True,
                    "max_load": load_cfg.max_load}
        if not said:  # once
            log(f"  waiting for load ({key}) < {load_cfg.max_load} (now {now[key]:.2f}, at most {load_cfg.wait_s:.0f} s)")
            said = True
        time.sleep(load_cfg.poll_s)


def threads_per_rank(cfg, cell: Cell) -> int:
    return int(cfg.threads) if cfg.threads is not None else max(1, (os.cpu_count() or 1) // cell.world_size)


class StudyLock:
    """One runner per study directory (``STUDY_DIR/study.lock``, ``flock``)."""

    def __init__(self, study_dir: Path):
        self.path = Path(study_dir) / "study.lock"

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "w")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"{self.path}: another `distnerf.study run` is running this study") from None
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def _set_aside(study_dir: Path, run_dir: Path, folder: str = "attempts") -> Path:
    """Move a cell's directory to ``STUDY_DIR/<folder>/<id>.<n>`` (kept for inspection, never deleted):
    ``attempts`` for an interrupted or failed attempt, ``superseded`` for a run of settings the study
    no longer plans (:func:`changed_settings`)."""
    kept = Path(study_dir) / folder
    kept.mkdir(parents=True, exist_ok=True)
    n = 0
    while (kept / f"{run_dir.name}.{n}").exists():
        n += 1
    dest = kept / f"{run_dir.name}.{n}"
    shutil.move(str(run_dir), dest)
    return dest


def recorded_overrides(record: dict) -> list[str] | None:
    """The training overrides a cell's record says it ran with: ``overrides``, or for a record
    written before that key, its launch command's arguments after ``--`` (local) or after the
    sbatch script (Slurm); None when the record names neither. Keys that left the ``train`` section
    are named by their new key (:func:`~distnerf.config_check.upgrade_overrides`: a cell that ran with
    ``train.lr=X`` ran with ``optim.lr=X``, not with other settings)."""
    if "overrides" in record:
        return upgrade_overrides(record["overrides"])
    command = record.get("command") or []
    start = next((i + 1 for i, arg in enumerate(command) if arg == "--" or arg.endswith("slurm_train.sbatch")), None)
    return None if start is None else upgrade_overrides(command[start:])


def changed_settings(record: dict | None, cell: Cell) -> dict:
    """``{key: [value it ran with, value planned now]}`` where a cell's recorded overrides differ
    from the study's plan for it (a study config edited since: its ``fixed``, ``levels``, ``seed``);
    empty when they agree or the record names no overrides. Keys that never change what a run
    measures (W&B names, ``monitor.progress``) are not compared (:func:`distnerf.study.plan.override_changes`)."""
    ran = recorded_overrides(record) if record else None
    return {} if ran is None else override_changes(ran, cell.overrides)


def _alive_group(pgid) -> bool:
    """Whether a live (not zombie) process of process group ``pgid`` exists (``/proc/*/stat``)."""
    if not pgid:
        return False
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == int(pgid) and fields[0] != "Z":  # state, ppid, pgrp, ...
            return True
    return False


def plan_actions(study_dir: Path, cells: list[Cell], retry_failed: bool, log=print) -> list[Cell]:
    """The cells to run now, in order; says what it skips and why, sets aside interrupted ones.

    A cell whose directory holds a run of other settings than the study now plans for it (its
    record's overrides against :attr:`Cell.overrides`: the study config was edited since) is moved
    to ``STUDY_DIR/superseded/<id>.<n>``, finished or not, its record noting the changed keys, and runs
    again from scratch: a finished cell is never kept, nor an interrupted one resumed, at settings
    the study no longer has.

    Raises:
        RuntimeError: a cell's earlier runner left it running (its process group is alive).
    """
    todo = []
    for cell in cells:
        run_dir = cell_dir(study_dir, cell)
        record = read_record(run_dir)
        if record and record["status"] == "running" and _alive_group(record.get("pgid")):
            raise RuntimeError(f"{cell.id}: still running (process group {record['pgid']} of an earlier "
                               f"`distnerf.study run`): stop it (kill -- -{record['pgid']}) or wait for it")
        changed = changed_settings(record, cell)
        if changed:
            write_record(run_dir, {**record, "superseded": {"at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                                            "changed": changed}})
            what = ", ".join(f"{k}: {'unset' if a is None else a} -> {'unset' if b is None else b}"
                             for k, (a, b) in changed.items())
            log(f"{cell.id}: settings changed since it ran ({what}); its directory moved to "
                f"{_set_aside(study_dir, run_dir, 'superseded')}; runs again from scratch")
            todo.append(cell)
            continue
        if finished(run_dir):
            log(f"skip {cell.id}: finished")
            continue
        if record and record["status"] == "failed" and not retry_failed:
            log(f"skip {cell.id}: failed before (exit {record.get('rc')}; see {run_dir}/launch.log); "
                "run again with --retry-failed")
            continue
        if run_dir.exists():
            step = resumable_step(run_dir, cell, record)
            if step is not None:
                log(f"{cell.id}: interrupted; resumes from its checkpoint at step {step} (untimed)")
            else:
                why = {"failed": "failed before, retried", "done": "recorded done but unfinished"}.get(
                    (record or {}).get("status"), "interrupted")
                log(f"{cell.id}: {why}; its directory moved to {_set_aside(study_dir, run_dir)}")
        todo.append(cell)
    return todo


def resumable_step(run_dir: Path, cell: Cell, record: dict | None) -> int | None:
    """The step an interrupted cell resumes from, or None when it must start again from scratch.

    Resumable: an untimed cell whose record says it was still ``running``/``submitted`` (its study
    was stopped, not its run failed) and whose run directory holds a committed checkpoint
    (:func:`distnerf.checkpoint.latest`: torn checkpoints are not counted)."""
    if cell.timed or not record or record.get("status") not in ("running", "submitted"):
        return None
    last = ckpt.latest(Path(run_dir) / "checkpoints")
    return None if last is None else int(ckpt.read_manifest(last)["step"])


def _launch_env(cfg, cell: Cell) -> dict:
    threads = str(threads_per_rank(cfg, cell))
    return {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "MAX_RESTARTS": "0",
            "DISTNERF_ROOT": str(REPO)}


def run_local(cfg, study_dir: Path, cells: list[Cell], log=print) -> dict:
    """Run ``cells`` one after another through ``launch/torchrun_local.sh``; {cell id: status}."""
    out = {}
    for i, cell in enumerate(cells):
        run_dir = cell_dir(study_dir, cell)
        log(f"[{i + 1}/{len(cells)}] {cell.id}")
        quiet = wait_for_quiet(cfg.load, log) if cell.timed else {"load": machine_load(), "waited_s": 0.0,
                                                                  "contended": False, "max_load": None}
        command = ["bash", str(REPO / "launch" / "torchrun_local.sh"), str(cell.world_size), str(run_dir), "--",
                   *cell.overrides, "monitor.progress=false"]
        earlier = read_record(run_dir) if run_dir.exists() else None  # plan_actions kept it: a resume
        record = {"cell": cell.id, "key": cell.key, "values": cell.values, "repeat": cell.repeat,
                  "overrides": list(cell.overrides), "status": "running", "launcher": "local", "command": command, "timed": cell.timed,
                  "threads_per_rank": threads_per_rank(cfg, cell), "cpu_count": os.cpu_count(),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                  **quiet}
        if earlier is not None:
            record.update(resumed_from_step=resumable_step(run_dir, cell, earlier),
                          first_started=earlier.get("first_started", earlier.get("started")))
        write_record(run_dir, record)
        start = time.monotonic()
        with open(run_dir / "launch.log", "a" if earlier is not None else "w") as logfile:
            proc = subprocess.Popen(command, cwd=REPO, env=_launch_env(cfg, cell), stdout=logfile,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            record["pgid"] = proc.pid  # the cell's own process group (torchrun and its ranks)
            write_record(run_dir, record)
            try:
                rc = proc.wait(timeout=cfg.cell_timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 15)
                try:
                    rc = proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, 9)
                    rc = proc.wait()
                record["timed_out"] = True
            except BaseException:  # Ctrl-C or SIGTERM: stop the cell's ranks too (they checkpoint first);
                os.killpg(proc.pid, 15)  # its record stays "running": resumable when untimed
                proc.wait()
                raise
        record.update(rc=rc, wall_s=time.monotonic() - start, finished=time.strftime("%Y-%m-%dT%H:%M:%S"),
                      load_after=machine_load())
        record["status"] = "done" if rc == 0 and finished(run_dir) else "failed"
        write_record(run_dir, record)
        out[cell.id] = record["status"]
        log(f"  {record['status']} in {record['wall_s']:.0f} s"
            + (f" (exit {rc}; see {run_dir}/launch.log)" if record["status"] == "failed" else ""))
    return out


def _slurm(args: list[str], env: dict) -> str:
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def run_slurm(cfg, study_dir: Path, cells: list[Cell], log=print) -> dict:
    """Submit one ``launch/slurm_train.sbatch`` job per cell (run one at a time by
    ``--dependency=singleton``), wait until every job has left the queue; {cell id: status}."""
    env = dict(os.environ)
    name = f"distnerf-study-{cfg.name}"
    jobs = {}
    for cell in cells:
        run_dir = cell_dir(study_dir, cell)
        run_dir.mkdir(parents=True, exist_ok=True)
        threads = threads_per_rank(cfg, cell)
        resources = ([f"--gpus-per-node={cell.world_size * cfg.slurm.gpus_per_rank}"] if cfg.slurm.gpus_per_rank
                     else ["--gpus-per-node=0", f"--cpus-per-task={threads * cell.world_size}"])  # over the script's GPUs
        exports = {"RUN_DIR": str(run_dir), "NPROC": str(cell.world_size), "MAX_RESTARTS": "0",
                   "OMP_NUM_THREADS": str(threads), "DISTNERF_ROOT": str(REPO)}
        command = ["sbatch", "--parsable", f"--job-name={name}", "--dependency=singleton", "--ntasks-per-node=1",
                   "--no-requeue", f"--output={run_dir / 'launch.log'}", *resources, *cfg.slurm.options,
                   "--export=" + ",".join(["ALL"] + [f"{k}={v}" for k, v in exports.items()]),
                   str(REPO / "launch" / "slurm_train.sbatch"), *cell.overrides, "monitor.progress=false"]
        job = _slurm(command, env).strip().split(";")[0]
        jobs[cell.id] = (cell, job)
        write_record(run_dir, {"cell": cell.id, "key": cell.key, "values": cell.values, "repeat": cell.repeat,
                               "overrides": list(cell.overrides), "status": "submitted", "launcher": "slurm", "job_id": job, "command": command,
                               "timed": cell.timed, "threads_per_rank": threads,
                               "submitted": time.strftime("%Y-%m-%dT%H:%M:%S"),
                               "load": None, "waited_s": 0.0, "contended": False,
                               "load_note": "scheduled by Slurm (one job at a time: --dependency=singleton)"})
        log(f"submitted {cell.id}: job {job}")
    out, pending = {}, dict(jobs)
    deadline = time.monotonic() + cfg.cell_timeout_s * max(1, len(jobs))
    while pending:
        queued = set(_slurm(["squeue", "-h", "-o", "%i", "-n", name], env).split())
        for cid, (cell, job) in list(pending.items()):
            if job in queued:
                continue
            run_dir = cell_dir(study_dir, cell)
            record = read_record(run_dir) or {}
            record.update(status="done" if finished(run_dir) else "failed",
                          finished=time.strftime("%Y-%m-%dT%H:%M:%S"))
            if record["status"] == "failed":
                record["rc"] = "see launch.log"
            write_record(run_dir, record)
            out[cid] = record["status"]
            log(f"  {cid} (job {job}): {record['status']}")
            del pending[cid]
        if pending and time.monotonic() > deadline:
            _slurm(["scancel", *[job for _, job in pending.values()]], env)
            raise RuntimeError(f"study {cfg.name}: jobs {sorted(pending)} still queued after the cells' time limit; "
                               "cancelled")
        if pending:
            time.sleep(cfg.slurm.poll_s)
    return out


def run_study(cfg, study_dir: Path, cells: list[Cell], retry_failed: bool = False, log=None) -> dict:
    """Run every unfinished cell of the study (see the module docstring); {cell id: status} of those run."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    study_dir = Path(study_dir)
    with StudyLock(study_dir):
        study_dir.mkdir(parents=True, exist_ok=True)
        todo = plan_actions(study_dir, cells, retry_failed, log)
        if not todo:
            log("every cell is finished")
            return {}
        runner = run_slurm if cfg.launcher == "slurm" else run_local
        return runner(cfg, study_dir, todo, log)
