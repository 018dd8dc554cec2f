"""Command line of the scene generator (run as ``python -m distnerf.data.synthetic``)::

    python -m distnerf.data.synthetic --kind city_small --out DIR
    python -m distnerf.data.synthetic --kind objects --resolution 200 --out DIR

Generates the scene into the cache directory ``DIR`` if it is not there yet and prints
its root (stdout); the time taken goes to stderr. Unset options take the kind's
defaults (see :func:`~distnerf.data.synthetic.writer.ensure_scene`).
"""
from __future__ import annotations

import sys
import time
from typing import Sequence

from distnerf.cli import argument_parser
from distnerf.data.synthetic.scenes import KINDS
from distnerf.data.synthetic.writer import ensure_scene

_DESCRIPTION = "Procedural default scenes, rendered analytically (objects; detail; aerial cities)."
EXAMPLES = [line.strip().removeprefix("python -m distnerf.data.synthetic ") for line in
            __doc__.split("::")[1].split("\n\n")[1].splitlines()]


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: generates a scene (if needed) and prints its root."""
    parser = argument_parser("scene", _DESCRIPTION.rstrip("."), EXAMPLES, module="distnerf.data.synthetic")
    parser.add_argument("--kind", choices=KINDS, default="objects")
    parser.add_argument("--resolution", type=int, default=None,
                        help="image width in pixels (default: the kind's)")
    parser.add_argument("--out", required=True, help="cache directory")
    parser.add_argument("--num-train", type=int, default=None, help="objects, detail only")
    parser.add_argument("--num-val", type=int, default=None)
    parser.add_argument("--num-test", type=int, default=None, help="objects, detail only")
    parser.add_argument("--num-views", type=int, default=None,
                        help="cities: first views of the flight to keep (default all)")
    parser.add_argument("--no-appearance-jitter", action="store_true",
                        help="cities: no per-image exposure / white-balance gains")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        root = ensure_scene(args.out, args.kind, args.resolution, args.num_train, args.num_val,
                            args.num_test, args.seed, not args.no_appearance_jitter, args.num_views)
    except ValueError as err:  # bad counts, resolution or seed: a usage error, not a traceback
        parser.error(str(err))
    print(root)
    print(f"ready in {time.perf_counter() - start:.2f} s", file=sys.stderr)
    return 0
