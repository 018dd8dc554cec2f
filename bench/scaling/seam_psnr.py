"""Test PSNR at the seams of a study's partitions against the rest (issue 25 item 2).

    python -m bench.scaling.seam_psnr STUDY_DIR [--band 0.1] [--out bench/scaling/results/study_capacity/seams.json]

For every finished cell of a study on a built-in synthetic scene (``runs/capacity``, say), the
test renders are scored in two masks: pixels whose surface point (the exact ray-geometry
intersection) lies within ``--band`` world units of a face shared by two regions of the
partition of the cell's world size, and the other surface pixels (the rest); the one-rank cells
are scored under every world size's partition as the reference without seams
(:mod:`distnerf.study.seams`). Writes JSON (rows per cell and partition, ``meta``); prints a
line per strategy and world size: mean seam and rest PSNR over seeds and the gap. Untimed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path


from bench.common import score_study, write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("study_dir", type=Path)
    ap.add_argument("--band", type=float, default=0.1, help="seam half-width, world units (default 0.1)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from distnerf.study.seams import study_seams

    report, meta = score_study("seam_psnr", args.study_dir, lambda d: study_seams(d, args.band))
    groups: dict[tuple, list[dict]] = {}
    for r in report["rows"]:
        groups.setdefault((r["partition_world_size"], r["budget"] or "-", r["strategy"], r["world_size"]), []).append(r)
    for (pw, budget, strategy, w), rows in sorted(groups.items()):
        mean = {k: statistics.mean(r[k] for r in rows) for k in ("seam_psnr", "rest_psnr", "gap_db")}
        print(f"partition W={pw}, {budget}: {strategy} W={w} (n={len(rows)}): seam {mean['seam_psnr']:.2f} dB, "
              f"rest {mean['rest_psnr']:.2f} dB, gap {mean['gap_db']:+.2f} dB")
    write_result(args.out or args.study_dir / "seams.json", report, meta)


if __name__ == "__main__":
    main()
