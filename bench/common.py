"""What every benchmark result carries: where it goes and its ``meta`` block.

Not a benchmark itself. The runners (``bench/<question>/*.py``, run as ``python -m bench.<question>.<name>``)
import it:

    from bench.common import default_out, start_meta, write_result
    meta = start_meta()                  # command, start time, git commit, load before
    ...                                  # measure
    write_result(default_out(__file__, "NAME/result.json"), report, meta)
                                         # adds end time, load after, wall seconds; writes JSON

Results go under ``bench/<question>/results/NAME/`` (committed); ``python -m bench.tables`` turns them
into the tables of the pages (``bench/<question>/README.md``). The shell runners write the same block with
``python -m bench.common meta ...`` (see ``--help``).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def _utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def free_port() -> int:
    """A free TCP port on the loopback interface (a benchmark's own process group or server)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_timed(cmd: list[str], threads: int = 1) -> float:
    """Run a benchmark's training command (``OMP_NUM_THREADS=threads``); its wall seconds.

    Raises:
        SystemExit: the command failed, with its exit code and the tail of its stderr.
    """
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return time.time() - t0


def load_average() -> list[float]:
    """1-, 5- and 15-minute load averages (other work competing for the cores)."""
    return [round(x, 2) for x in os.getloadavg()]


def git_state(root: Path = ROOT) -> dict:
    """HEAD commit and whether tracked files differ from it (``None`` when not a git checkout)."""
    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


def _launcher(script: Path) -> list[str]:
    """``python -m bench.q.name`` for a runner of this checkout (``python -m`` puts its path in argv[0]),
    else ``python SCRIPT``."""
    try:
        rel = script.resolve().relative_to(ROOT)
    except ValueError:
        return ["python", str(script)]
    if rel.suffix == ".py" and rel.parts[0] == "bench":
        return ["python", "-m", ".".join(rel.with_suffix("").parts)]
    return ["python", str(rel)]


def start_meta(argv: list[str] | None = None, command: str | None = None) -> dict:
    """The meta block at the start of a measurement: command, date, commit, machine, load before."""
    if command is None:
        argv = sys.argv if argv is None else argv
        command = shlex.join([*_launcher(Path(argv[0])), *argv[1:]])
    return {"command": command, "cwd": os.getcwd(), "started": _utc(), **git_state(),
            "host": platform.node(), "cpu_count": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "load_before": load_average(),
            "load_source": "os.getloadavg() in the tool (1, 5, 15 minutes)", "_t0": time.time()}


def finish_meta(meta: dict) -> dict:
    out = {k: v for k, v in meta.items() if k != "_t0"}
    out.update(finished=_utc(), date=_utc()[:10], load_after=load_average())
    if "_t0" in meta:
        out["wall_s"] = round(time.time() - meta["_t0"], 2)
    return out


def results_dir(runner_file: str | Path) -> Path:
    """``bench/<question>/results``: the results folder of the question whose runner is ``runner_file``
    (pass the runner's ``__file__``)."""
    return Path(runner_file).resolve().parent / "results"


def default_out(runner_file: str | Path, name: str) -> Path:
    """``bench/<question>/results/NAME`` (NAME may hold sub-directories) of the runner ``runner_file``."""
    return results_dir(runner_file) / name


def status_mb(key: str) -> float:
    """A memory figure of this process from ``/proc/self/status`` in MiB (``key``: ``VmRSS``, ``VmHWM``, ...).
    ``VmHWM``, not ``ru_maxrss``: Linux keeps ``ru_maxrss`` across exec, so a child would report its parent's
    peak. Raises IndexError when the kernel has no such line."""
    with open("/proc/self/status") as f:
        line = [ln for ln in f if ln.startswith(key + ":")]
    return int(line[0].split()[1]) / 1024


def write_result(path: Path | str, report, meta: dict) -> Path:
    """Write ``report`` as JSON with the finished meta block (a dict gets a ``meta`` key; a list is
    wrapped as ``{"meta": ..., "rows": [...]}``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = finish_meta(meta)
    body = {**report, "meta": meta} if isinstance(report, dict) else {"meta": meta, "rows": report}
    path.write_text(json.dumps(body, indent=1, default=str) + "\n")
    print(f"wrote {path}", flush=True)
    return path


def score_study(tool: str, study_dir: Path, score) -> tuple[dict, dict]:
    """(report, meta) of ``score(study_dir)`` over a study's run directory, the meta started just before it: the
    runners that score a finished study's cells (inside/beyond, seams, touched vertices). A directory without
    ``cells/``, or a ValueError or FileNotFoundError from ``score``, exits with one line naming ``tool``."""
    study_dir = Path(study_dir)
    if not (study_dir / "cells").is_dir():
        raise SystemExit(f"{tool}: {study_dir / 'cells'} does not exist: give a study's run directory")
    meta = start_meta()
    try:
        return score(study_dir), meta
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"{tool}: {exc}") from None


def append_meta(directory: Path | str, entry: dict) -> Path:
    """Add one run's meta block (with ``files``, relative to DIRECTORY) to DIRECTORY/meta.json
    (``{"runs": [...]}``); older entries lose the files written again."""
    path = Path(directory) / "meta.json"
    runs = json.loads(path.read_text())["runs"] if path.exists() else []
    for r in runs:  # files written again: their old entries no longer describe them
        r["files"] = [f for f in r.get("files", []) if f not in entry["files"]]
    runs = [r for r in runs if r["files"]] + [entry]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    print(f"wrote {path}", flush=True)
    return path


def main() -> None:
    """``meta`` for shell scripts: append one run's meta block to DIR/meta.json (``{"runs": [...]}``)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("meta", help="append a run's meta block to DIR/meta.json")
    m.add_argument("dir", type=Path)
    m.add_argument("--command", required=True, help="the command line that produced the files")
    m.add_argument("--files", nargs="+", required=True, help="result files, relative to DIR")
    m.add_argument("--load-before", type=float, nargs="+", required=True, help="os.getloadavg() before the run")
    m.add_argument("--started", required=True, help="UTC start time (date -u +%%FT%%TZ)")
    m.add_argument("--wall-s", type=float, required=True)
    m.add_argument("--phases", default=None, help='JSON object of per-phase wall seconds, e.g. {"train": 610.2}')
    q = sub.add_parser("quote", help="print the arguments as one shell-quoted command line (shlex.join)")
    q.add_argument("words", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    if args.cmd == "quote":
        print(shlex.join(args.words))
        return
    # the commit of the checkout the run ran in (its cwd: a worktree of another commit for bench/quality/regression.sh)
    meta = {"files": args.files, "command": args.command, "started": args.started, **git_state(Path.cwd()),
            "host": platform.node(), "cpu_count": os.cpu_count(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "load_before": args.load_before, "load_source": "/proc/loadavg in the script (1, 5, 15 minutes)"}
    meta = finish_meta(meta)
    meta["wall_s"] = args.wall_s
    if args.phases:
        meta["phase_wall_s"] = json.loads(args.phases)
    append_meta(args.dir, meta)


if __name__ == "__main__":
    main()
