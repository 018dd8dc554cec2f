"""Command line of the scene generator (run as ``python -m distnerf.data.synthetic``)::

    python -m distnerf.data.synthetic --kind wide --resolution 200 --out DIR

Generates the scene into the cache directory ``DIR`` if it is not there yet and prints
its root (stdout); the time taken goes to stderr.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

from distnerf.data.synthetic.scenes import KINDS
from distnerf.data.synthetic.writer import ensure_scene

_DESCRIPTION = "Procedural default scenes, rendered analytically and written in Blender format."


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: generates a scene (if needed) and prints its root."""
    parser = argparse.ArgumentParser(prog="python -m distnerf.data.synthetic",
                                     description=_DESCRIPTION)
    parser.add_argument("--kind", choices=KINDS, default="objects")
    parser.add_argument("--resolution", type=int, default=100)
    parser.add_argument("--out", required=True, help="cache directory")
    parser.add_argument("--num-train", type=int, default=60)
    parser.add_argument("--num-val", type=int, default=8)
    parser.add_argument("--num-test", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    root = ensure_scene(args.out, args.kind, args.resolution, args.num_train, args.num_val,
                        args.num_test, args.seed)
    print(root)
    print(f"ready in {time.perf_counter() - start:.2f} s", file=sys.stderr)
    return 0

