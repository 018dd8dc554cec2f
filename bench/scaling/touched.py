"""The share of vertices touched by a sample of weight above 1e-4, per cell of a study (issue 61 item 4).

    python -m bench.scaling.touched STUDY_DIR [--batches 100] [--out bench/scaling/results/NAME/touched.json]

For every finished cell that kept its final checkpoint (``ddp`` or joint ``ss``, ``model=grid``), the
full-resolution table rows that are a trilinear corner of a sample whose weight in the whole ray's
composite exceeds the threshold, over ``--batches`` batches of the run's global batch of training rays,
on the final model (:func:`distnerf.study.touched.run_touched`). Prints a line per cell key: mean and
standard deviation over seeds of the share. Writes JSON (rows per cell, ``summary``, ``meta``). Untimed.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench.common import score_study, write_result


def summarise(rows: list[dict]) -> dict:
    """{cell key: {share: {mean, sd over seeds}, vertices: mean rows held, n}}."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["key"], []).append(r)
    out = {}
    for key, rs in sorted(groups.items()):
        shares = [r["share"] for r in rs]
        out[key] = {"n": len(rs), "share": {"mean": statistics.mean(shares),
                                            "sd": statistics.stdev(shares) if len(shares) > 1 else 0.0},
                    "vertices": statistics.mean(r["vertices"] for r in rs)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("study_dir", type=Path)
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--threshold", type=float, default=1e-4)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from distnerf.study.touched import study_touched

    report, meta = score_study("touched", args.study_dir,
                               lambda d: study_touched(d, batches=args.batches, threshold=args.threshold))
    report["summary"] = summarise(report["rows"])
    for key, s in report["summary"].items():
        print(f"{key} (n={s['n']}): share {s['share']['mean']:.3f} +- {s['share']['sd']:.3f} of "
              f"{s['vertices']:.0f} rows")
    write_result(args.out or args.study_dir / "touched.json", report, meta)


if __name__ == "__main__":
    main()
