"""Test PSNR inside the scene box and beyond it, per cell of a study (issue 61 item 4).

    python -m bench.scaling.inside_beyond STUDY_DIR [--out bench/scaling/results/NAME/inside_beyond.json]

For every finished cell of a study on a built-in synthetic scene, its test renders are scored over two
masks of the same pixels for every cell: pixels whose surface point (the exact intersection of the pixel's
centre ray with the scene's analytic geometry, the generator's tracer) lies inside the scene box, and the
others (surface beyond the box, and the sky) (:func:`distnerf.study.seams.run_inside_beyond`; PSNR pooled over
the views, from the 8-bit renders). Prints a line per cell key: mean and standard deviation over seeds of the
whole, inside and beyond PSNR. Writes JSON (rows per cell, ``meta``). Untimed.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench.common import score_study, write_result


def summarise(rows: list[dict]) -> dict:
    """{cell key: {psnr / inside_psnr / beyond_psnr: {mean, sd over seeds}, n}}."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["key"], []).append(r)
    out = {}
    for key, rs in sorted(groups.items()):
        out[key] = {"n": len(rs)}
        for k in ("psnr", "inside_psnr", "beyond_psnr"):
            vals = [r[k] for r in rs if r.get(k) is not None]
            out[key][k] = ({"mean": statistics.mean(vals), "sd": statistics.stdev(vals) if len(vals) > 1 else 0.0}
                           if vals else None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("study_dir", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from distnerf.study.seams import study_inside_beyond

    report, meta = score_study("inside_beyond", args.study_dir, study_inside_beyond)
    report["summary"] = summarise(report["rows"])
    for key, s in report["summary"].items():
        fmt = " ".join(f"{k} {v['mean']:.2f} +- {v['sd']:.2f}" if v else f"{k} -" for k, v in s.items() if k != "n")
        print(f"{key} (n={s['n']}): {fmt}")
    write_result(args.out or args.study_dir / "inside_beyond.json", report, meta)


if __name__ == "__main__":
    main()
