"""Regenerate the tables of the benchmark pages from the JSON the runners wrote in ``bench/<question>/results/``.

    python -m bench.tables            # rewrite every table of every page
    python -m bench.tables --check    # exit 1, with a diff, when a page is not what the JSON gives
        [--file PAGE ...] [--results bench]

The pages: ``BENCHMARKS.md`` and every Markdown page under ``bench/`` (``bench/**/*.md``: a question's
``README.md`` and the pages it indexes; not its ``results/``). A table lives between the lines
``<!-- table:NAME -->`` and ``<!-- /table:NAME -->`` (each marker a line of its own); everything between
the two markers is replaced by what ``TABLES[NAME]`` makes of the JSON: the Markdown table, a few figures
computed from the same JSON, and one *Source* line per command that wrote the JSON (its files, the
command, date, commit and the machine load before/after). Text outside the markers is left alone. An
unknown NAME, an unpaired marker or a missing JSON file is an error (exit 2).

``TABLES`` gathers the ``TABLES`` of every question's ``bench/<question>/tables.py`` (a folder of
``bench/`` that has one); a name two questions define is an error. Reading the JSON and the shared
cells: :mod:`bench.tablekit`.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import pkgutil
import re
import sys
from pathlib import Path

import bench
from bench.tablekit import ROOT, Results, ResultError, source_lines

MARKER = re.compile(r"^<!-- (/?)table:([A-Za-z0-9_.-]+) -->[ \t]*$", re.M)  # a marker is a line of its own
BENCH = ROOT / "bench"


def question_tables() -> dict:
    """Every question's ``TABLES``, merged: marker name -> function of a :class:`Results`."""
    tables: dict = {}
    for info in pkgutil.iter_modules(bench.__path__):
        if not info.ispkg or not (BENCH / info.name / "tables.py").is_file():
            continue
        mine = importlib.import_module(f"bench.{info.name}.tables").TABLES
        clash = set(mine) & set(tables)
        if clash:
            raise ResultError(f"bench/{info.name}/tables.py defines tables another question defines: {sorted(clash)}")
        tables.update(mine)
    return tables


TABLES = question_tables()


def pages() -> list[Path]:
    """The Markdown pages that may hold tables: BENCHMARKS.md and bench/**/*.md, results folders aside."""
    return [ROOT / "BENCHMARKS.md",
            *sorted(p for p in BENCH.rglob("*.md") if "results" not in p.relative_to(BENCH).parts)]


def render_block(name: str, results_root: Path) -> str:
    if name not in TABLES:
        raise ResultError(f"unknown table {name!r} (known: {', '.join(sorted(TABLES))})")
    res = Results(results_root)
    lines = TABLES[name](res)
    return "\n".join(["", *lines, "", *source_lines(res), ""])


def regenerate(text: str, results_root: Path) -> str:
    """``text`` with every marked table regenerated from the JSON under ``results_root`` (``bench/``)."""
    out, pos, open_name = [], 0, None
    for m in MARKER.finditer(text):
        closing, name = m.group(1) == "/", m.group(2)
        if not closing:
            if open_name is not None:
                raise ResultError(f"table:{name} opened inside table:{open_name}")
            out.append(text[pos:m.end()])
            open_name = name
        else:
            if open_name != name:
                raise ResultError(f"/table:{name} closes {'nothing' if open_name is None else 'table:' + open_name}")
            out.append(render_block(name, results_root))
            out.append(m.group(0))
            open_name = None
        pos = m.end()
    if open_name is not None:
        raise ResultError(f"table:{open_name} is never closed")
    out.append(text[pos:])
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 when a page differs")
    ap.add_argument("--file", type=Path, nargs="+", default=None, help="pages (default: every page, see above)")
    ap.add_argument("--results", type=Path, default=BENCH, help="the folder holding <question>/results/")
    args = ap.parse_args(argv)
    status = 0
    for page in args.file or pages():
        text = page.read_text()
        try:
            new = regenerate(text, args.results.resolve())
        except ResultError as err:
            print(f"bench.tables: {page}: {err}", file=sys.stderr)
            return 2
        if args.check:
            if new != text:
                sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                           str(page), "from the JSON"))
                print(f"bench.tables: {page} differs from the tables the JSON gives; run python -m bench.tables",
                      file=sys.stderr)
                status = 1
            continue
        if new != text:
            page.write_text(new)
            print(f"rewrote the tables of {page}")
    if args.check and status == 0:
        print(f"tables match the JSON in {args.results}")
    return status


if __name__ == "__main__":
    sys.exit(main())
