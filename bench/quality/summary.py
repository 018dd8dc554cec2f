"""PSNR / SSIM of a ``bench/quality/quality.sh`` run at its 2- and 5-minute checkpoints and at the end.

    python -m bench.quality.summary RUN_DIR

Reads ``RUN_DIR/{at_2min,at_5min,.}/metrics.json`` (written by ``distnerf.render`` and the run's final
evaluation) and prints one line each: step, PSNR (dB), SSIM and the number of test views scored.
Raises FileNotFoundError when one of the three is missing.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    out = ap.parse_args(argv).run_dir
    for name in ("at_2min", "at_5min", "."):
        m = json.loads((out / name / "metrics.json").read_text())
        print(f"{name:8s} step {m['step']:6d}  PSNR {m['psnr']:.2f}  SSIM {m['ssim']:.4f}  views {m['protocol']['num_views']}")


if __name__ == "__main__":
    main()
