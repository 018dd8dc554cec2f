"""Clean exits: N consecutive 2-rank ``experiment=smoke`` runs under torchrun (BENCHMARKS.md, "Clean exits").

    python -m bench.reliability.exits [--runs 30] [--out bench/reliability/results/exits/exits.json] [-- extra overrides]

Each run is ``launch/torchrun_local.sh 2 RUN -- experiment=smoke`` with ``MAX_RESTARTS=1``:
a rank that aborts at interpreter exit after a completed run ("terminate called without an
active exception") makes torchrun restart the group, which resumes at the final step. A clean
run exits 0 with no restart: its ``metrics.jsonl`` holds no ``resumed`` event and the agent
logged no restart. Writes each run's exit status, restarts, wall time and any abort text, and
the count of clean runs, as JSON with a ``meta`` block.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import ROOT, default_out, start_meta, write_result
from distnerf.observe.logger import read_metrics_log

ABORTS = ("terminate called", "Aborted", "core dumped", "SIGABRT", "Segmentation fault", "SIGSEGV")


def one_run(run: Path, overrides: list[str]) -> dict:
    shutil.rmtree(run, ignore_errors=True)
    log = run.with_suffix(".out")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MAX_RESTARTS": "1", "WANDB_MODE": "disabled"}
    start = time.monotonic()
    with open(log, "w") as out:
        rc = subprocess.run(["bash", str(ROOT / "launch" / "torchrun_local.sh"), "2", str(run), "--",
                             "experiment=smoke", "device=cpu", "monitor.progress=false", *overrides], cwd=ROOT, env=env,
                            stdout=out, stderr=subprocess.STDOUT).returncode
    text = log.read_text(errors="replace")
    rows = read_metrics_log(run)
    resumed = [r["step"] for r in rows if r.get("event") == "resumed"]
    restarts = text.count("will restart worker group")  # the agent's line when a rank failed
    aborts = sorted({a for a in ABORTS if a in text})
    return {"rc": rc, "wall_s": time.monotonic() - start, "resumed_at": resumed, "agent_restarts": restarts,
            "aborts": aborts, "clean": rc == 0 and not resumed and not restarts and not aborts,
            "tail": text[-1500:] if rc != 0 or resumed or aborts else ""}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "bench" / "exits")
    ap.add_argument("--out", type=Path, default=default_out(__file__, "exits/exits.json"))
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    meta = start_meta()
    args.run_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    for i in range(args.runs):
        r = one_run(args.run_dir / f"run_{i:02d}", args.overrides)
        runs.append(r)
        print(f"run {i:2d}: rc {r['rc']} restarts {r['agent_restarts']} resumed {r['resumed_at']} "
              f"aborts {r['aborts']} ({r['wall_s']:.0f} s)", flush=True)
    report = {"runs": runs, "num_runs": len(runs), "clean_runs": sum(r["clean"] for r in runs),
              "nonzero_exits": sum(r["rc"] != 0 for r in runs),
              "restarted_runs": sum(bool(r["resumed_at"] or r["agent_restarts"]) for r in runs)}
    write_result(args.out, report, meta)
    print(f"{report['clean_runs']}/{report['num_runs']} clean")
    return 0 if report["clean_runs"] == report["num_runs"] else 1


if __name__ == "__main__":
    sys.exit(main())
