"""Profile reports and A/B comparisons of run directories.

Examples::

    python -m distnerf.profile report runs/lego2             # -> runs/lego2/profile/report.{md,json}, breakdown.png
    python -m distnerf.profile compare runs/a runs/b --vary strategy.compression
    python -m distnerf.profile compare runs/a runs/b --vary env.torch_threads --out ab.md
    python -m distnerf.profile compare runs/a runs/b --force   # undeclared differences listed, loudly

Exit status: 0 on success, 2 when compare refuses (undeclared differences) or a
run directory is unusable.
"""
from __future__ import annotations

import sys
from pathlib import Path

from .cli import argument_parser


EXAMPLES = [line.strip().removeprefix("python -m distnerf.profile ") for line in __doc__.split("::")[1].split("\n\n")[1]
            .splitlines()]


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser("profile", __doc__.splitlines()[0].rstrip("."), EXAMPLES)
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="breakdown, overlap, top operators of one run")
    rep.add_argument("run_dir", type=Path)
    cmp_ = sub.add_parser("compare", help="A/B of two runs that differ only in declared settings")
    cmp_.add_argument("run_a", type=Path)
    cmp_.add_argument("run_b", type=Path)
    cmp_.add_argument("--vary", action="append", default=[], metavar="KEY",
                      help="config key or prefix (or env.<key>) that is the A/B variable; repeatable")
    cmp_.add_argument("--force", action="store_true", help="compare despite undeclared differences (warns)")
    cmp_.add_argument("--out", type=Path, help="also write the Markdown here")
    args = parser.parse_args(argv)

    from .observe import compare
    from .observe import run_report as report

    try:
        if args.command == "report":
            result = report.write_report(args.run_dir)
            sys.stdout.write(report.to_markdown(result))
            print("\nwrote " + ", ".join(result["files"]), file=sys.stderr)
            return 0
        result = compare.compare_runs(args.run_a, args.run_b, args.vary, args.force)
    except (FileNotFoundError, ValueError) as err:  # UndeclaredDifference is a ValueError
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    text = compare.to_markdown(result)
    if result["undeclared"]:
        print("WARNING: runs differ in undeclared settings; see the top of the comparison", file=sys.stderr)
    sys.stdout.write(text)
    if args.out:
        from .fileio import atomic_write_text

        atomic_write_text(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
