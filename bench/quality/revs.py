"""The summary of a ``bench/quality/main_job_revs.sh`` invocation: per commit, the main job's training seconds
(the 1000 steps, ``input_summary.steps_s``), its wall seconds to ``metrics.json`` (scene generation and the
final evaluation included, ``meta.json``), the re-render's wall seconds and PSNR, as the median with the min and max over its runs (never
the best run), and each commit's median against the first commit's (steps per training minute: the inverse).

    python -m bench.quality.revs OUT        # OUT: the invocation's folder (OUT/REV_RUN_i/...)

Writes ``OUT/summary.json`` and prints it. Runs are grouped by the commit before ``_`` in their folder's name
(``e1483d9_RUN_1``), in the invocation's order (``OUT/steps_s.txt``): the first commit is the baseline; a folder whose run has no ``input_summary`` raises ValueError naming it.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench.common import finish_meta, start_meta


def run_figures(folder: Path) -> dict:
    """One run's training seconds, wall seconds of the training command, PSNR and its commit."""
    rows = [json.loads(ln) for ln in (folder / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    summary = [r for r in rows if r.get("event") == "input_summary"]
    if not summary:
        raise ValueError(f"{folder / 'metrics.jsonl'}: no input_summary event (the run did not finish)")
    meta, render = json.loads((folder / "meta.json").read_text())["runs"][:2]  # the training command, the render's
    return {"run": folder.name, "commit": meta["git_commit"], "git_dirty": meta["git_dirty"],
            "steps_s": summary[-1]["steps_s"], "train_wall_s": meta["wall_s"], "render_wall_s": render["wall_s"],
            "psnr": json.loads((folder / "metrics.json").read_text())["psnr"]}


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarise(out: Path) -> dict:
    runs = [run_figures(f) for f in sorted(p for p in out.iterdir() if (p / "metrics.jsonl").is_file())]
    order = out / "steps_s.txt"  # the invocation's order (main_job_revs.sh appends a line per run)
    named = [ln.split()[0].split(":")[0] for ln in order.read_text().splitlines() if ln.strip()] if order.is_file() else []
    commits = list(dict.fromkeys([*named, *(r["run"].split("_")[0] for r in runs)]))  # the first: the baseline
    by = {c: [r for r in runs if r["run"].split("_")[0] == c] for c in commits}
    per = {c: {"steps_s": spread([r["steps_s"] for r in rs]), "train_wall_s": spread([r["train_wall_s"] for r in rs]),
               "render_wall_s": spread([r["render_wall_s"] for r in rs]),
               "psnr": spread([r["psnr"] for r in rs])} for c, rs in by.items()}
    base = per[commits[0]]["steps_s"]["median"]
    for c in commits:
        per[c]["steps_s_vs_first"] = per[c]["steps_s"]["median"] / base
        per[c]["steps_per_minute_vs_first"] = base / per[c]["steps_s"]["median"]
    return {"first": commits[0], "commits": per, "runs": runs}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    out = ap.parse_args(argv).out
    meta = start_meta(command=f"python -m bench.quality.revs {out}")
    result = {**summarise(out), "meta": finish_meta(meta)}
    (out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({c: {k: v for k, v in f.items() if k != "psnr"} for c, f in result["commits"].items()}, indent=1))


if __name__ == "__main__":
    main()
