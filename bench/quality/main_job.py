"""The README main job in a fresh clone, timed (bench/quality/main_job.md, "The README main job").

    python -m bench.quality.main_job [--clone DIR] [--no-setup] [--rev REV] [--out bench/quality/results/main_job]

1. ``git clone`` of this checkout (its HEAD: uncommitted changes are not in the clone; ``--rev``:
   that commit instead, for a before/after pair) into DIR (default: a new temporary directory; it
   must not exist);
2. ``bash tools/setup_env.sh`` there, as the README says (``--no-setup``: this interpreter runs
   the job instead);
3. ``python -m distnerf.train run_dir=runs/main`` with no ``.cache`` (the scene is generated
   too), timed: scene generation, 1000 steps, evaluation of the test views;
4. ``python -m distnerf.render run_dir=runs/main``, timed.

Copies the run's ``metrics.json``, ``metrics.jsonl`` and ``render/metrics.json`` to ``--out``
and records each command's wall seconds, date, the clone's commit and the load before/after in
``--out``/meta.json. Run it alone on a quiet machine (``../shared/tools/quiet``).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import ROOT, append_meta, default_out, finish_meta, git_state, start_meta


def timed(cmd: list[str], cwd: Path, files: list[str]) -> dict:
    meta = start_meta(command=" ".join(cmd))
    meta.update(git_state(cwd), cwd=str(cwd))
    subprocess.run(cmd, cwd=cwd, check=True)
    return {"files": files, **finish_meta(meta)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clone", type=Path, default=None, help="where to clone (default: a new temporary directory)")
    ap.add_argument("--no-setup", action="store_true", help="skip tools/setup_env.sh; run with this interpreter")
    ap.add_argument("--out", type=Path, default=None, help="result directory (default bench/quality/results/main_job)")
    ap.add_argument("--rev", default=None, help="check this commit out in the clone (default: HEAD)")
    args = ap.parse_args()
    clone = args.clone or Path(tempfile.mkdtemp(prefix="distnerf_main_job_")) / "repo"
    out = args.out or default_out(__file__, "main_job")
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    if args.rev:
        subprocess.run(["git", "checkout", "-q", args.rev], cwd=clone, check=True)
    if args.no_setup:
        python = sys.executable
    else:
        subprocess.run(["bash", "tools/setup_env.sh"], cwd=clone, check=True)
        python = str(clone / ".venv" / "bin" / "python")
    shutil.rmtree(clone / ".cache", ignore_errors=True)
    train = timed([python, "-m", "distnerf.train", "run_dir=runs/main"], clone, ["metrics.json", "metrics.jsonl"])
    render = timed([python, "-m", "distnerf.render", "run_dir=runs/main"], clone, ["render/metrics.json"])
    run = clone / "runs" / "main"
    (out / "render").mkdir(parents=True, exist_ok=True)
    for name in ("metrics.json", "metrics.jsonl", "render/metrics.json"):
        shutil.copyfile(run / name, out / name)
    append_meta(out, train)
    append_meta(out, render)
    print(f"train {train['wall_s']:.1f} s, render {render['wall_s']:.1f} s; clone left in {clone}")


if __name__ == "__main__":
    main()
