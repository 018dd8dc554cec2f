"""``python -m distnerf.study``: run a study's cells, report on them.

Examples::

    python -m distnerf.study run conf/study/smoke.yaml runs/study_smoke          # every unfinished cell
    python -m distnerf.study run conf/study/characterization.yaml runs/char --retry-failed
    python -m distnerf.study run conf/study/smoke.yaml runs/s --launcher slurm  # one sbatch job per cell
    python -m distnerf.study run conf/study/aerial_sharded.yaml runs/a1 --repeats 1  # its first seed only
    python -m distnerf.study run conf/study/capacity_cooled_p62k.yaml runs/j2 --repeats 1 --only 'ss_joint-w2-*'
    python -m distnerf.study list conf/study/characterization.yaml               # the cells and their overrides
    python -m distnerf.study report runs/study_smoke                              # -> runs/study_smoke/report/
    python -m distnerf.study report runs/char --markdown                          # the tables on stdout too
    python -m distnerf.study report bench/scaling/results/study_characterization/report.json --markdown
                                    # the Markdown again from a report's JSON (committed without the runs)
    python -m distnerf.study report bench/scaling/results/study_characterization/report.json --html
                                    # ... and its self-contained report.html beside it
    python -m distnerf.study report bench/scaling/results/study_characterization/report.json --rederive
                                    # its tables again from the cells' figures it holds (a changed model)
    python -m distnerf.study report runs/study_smoke --wandb offline          # the report into W&B too

``run`` also writes the report at the end. When the cells log to W&B (their
``logger.wandb.mode``), the report's figures and tables go into the study's W&B group as a run of
job type ``report`` (``--wandb MODE`` overrides the cells' mode; ``distnerf/study/dashboard.py``).
Exit status: 0 when every cell is finished, 1 when a cell failed (reported, re-run with
``--retry-failed``), 2 on a bad config or study directory (or a report W&B refused), 130 when
``run`` was stopped by Ctrl-C or SIGTERM: it passes SIGTERM to the running cell's ranks, which
checkpoint and exit, and waits for them; the next ``run`` resumes that cell from its checkpoint
when it is untimed (``runner.resumable_step``) and starts it again when it is timed. A cell whose
training overrides the edited study config changes is moved to ``STUDY_DIR/superseded/`` and run
again from scratch (``runner.plan_actions``).
"""
from __future__ import annotations

import fnmatch
import shutil
import signal
import sys
from pathlib import Path

from ..cli import argparse_keys, argument_parser, schema_keys
from ..schema import StudyConfig


def _stop(signum, frame):
    """SIGTERM handler of ``run``: stop as Ctrl-C does (the runner passes SIGTERM on to the running cell)."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _examples() -> list[str]:
    """The docstring's example commands, after the program's name."""
    block = __doc__.split("::")[1].split("\n\n")[1]
    return [line.strip().removeprefix("python -m distnerf.study ") for line in block.splitlines()
            if line.strip().startswith("python -m")]


def main(argv: list[str] | None = None) -> int:
    keys = argparse_keys("study config keys (conf/study/*.yaml; default; meaning):", schema_keys(StudyConfig))
    parser = argument_parser("study", __doc__.splitlines()[0].split(": ", 1)[1].rstrip("."), _examples(), keys=keys)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train every unfinished cell, then write the report")
    run.add_argument("config", type=Path)
    run.add_argument("study_dir", type=Path)
    run.add_argument("--retry-failed", action="store_true", help="run failed cells again")
    run.add_argument("--launcher", choices=("local", "slurm"), help="override the config's launcher")
    run.add_argument("--only", metavar="PATTERN",
                     help="run only the cells whose key (the cell id without -r<repeat>) matches this shell pattern, "
                          "e.g. 'ss_joint-w2-*'")
    run.add_argument("--repeats", type=int, metavar="N",
                     help="run only the config's first N repeats (their seeds unchanged: a study's first seeds again, "
                          "e.g. to keep their final checkpoints for a reading the report does not make)")
    wandb_help = "log the report to W&B in this mode (default: as the cells did, their logger.wandb.mode)"
    run.add_argument("--wandb", choices=("offline", "online", "disabled"), help=wandb_help)
    lst = sub.add_parser("list", help="print the cells of a study config")
    lst.add_argument("config", type=Path)
    rep = sub.add_parser("report", help="tables, figures, HTML of a study directory (or Markdown of a report.json)")
    rep.add_argument("study_dir", type=Path, help="STUDY_DIR, or a report.json to print as Markdown")
    rep.add_argument("--markdown", action="store_true", help="print the Markdown report")
    rep.add_argument("--html", action="store_true",
                     help="with a report.json: write report.html beside it (the figures named in it, embedded)")
    rep.add_argument("--rederive", action="store_true",
                     help="with a report.json: recompute its tables (scaling model, check, verdicts) from the cells' "
                          "figures it holds with this code, rewriting it (before --html / --markdown)")
    rep.add_argument("--wandb", choices=("offline", "online", "disabled"), help=wandb_help)
    args = parser.parse_args(argv)
    selected = None  # run --repeats N: the ids of the cells it runs

    from ..config_check import ConfigError
    from . import dashboard, document, plan, report, runner

    if args.command == "report" and args.rederive and not args.study_dir.is_file():
        print(f"{parser.prog}: error: --rederive takes a report.json file; {args.study_dir} is not one (a study "
              "directory's report is derived afresh by `report STUDY_DIR`)", file=sys.stderr)
        return 2
    try:
        if args.command == "report" and args.study_dir.is_file():
            if args.rederive:
                report.rederive(args.study_dir)
                print(f"rewrote {args.study_dir} (tables derived again)", file=sys.stderr)
                if not (args.html or args.markdown):
                    return 0
            if args.html:  # a committed report without its runs: the page from the JSON and the PNGs beside it
                print(f"wrote {document.write_html_from_json(args.study_dir)}", file=sys.stderr)
                return 0
            import json

            data = json.loads(args.study_dir.read_text())
            sys.stdout.write(document.to_markdown(data, data.get("figures", [])))
            return 0
        if args.command == "list":
            cfg = plan.load_study(args.config)
            for cell in plan.expand(cfg):
                print(f"{cell.id}\tW={cell.world_size}\t{' '.join(cell.overrides)}")
            return 0
        if args.command == "run":
            cfg = plan.load_study(args.config)
            if args.launcher:
                cfg.launcher = args.launcher
            if args.repeats is not None:
                if args.repeats < 1:
                    print(f"{parser.prog}: error: --repeats must be >= 1, got {args.repeats}", file=sys.stderr)
                    return 2
                cfg.repeats = min(args.repeats, cfg.repeats)
            cells = plan.expand(cfg)
            if args.only is not None:
                cells = [c for c in cells if fnmatch.fnmatchcase(c.key, args.only)]
                if not cells:
                    print(f"{parser.prog}: error: --only {args.only!r} matches no cell of {args.config}", file=sys.stderr)
                    return 2
            selected = {c.id for c in cells} if args.repeats is not None or args.only is not None else None
            saved = args.study_dir / report.STUDY_FILE
            args.study_dir.mkdir(parents=True, exist_ok=True)
            if not saved.exists() or saved.read_text() != args.config.read_text():
                if saved.exists():
                    print(f"distnerf.study: {saved} differs from {args.config}: replaced (a cell whose training "
                          f"overrides changed is moved to {args.study_dir / 'superseded'}/ and runs again from "
                          "scratch, the runner names each; the report flags any other setting that differs "
                          "between finished cells)", file=sys.stderr)
                shutil.copyfile(args.config, saved)
            signal.signal(signal.SIGTERM, _stop)
            try:
                runner.run_study(cfg, args.study_dir, cells, args.retry_failed)
            except KeyboardInterrupt as stop:
                print(f"distnerf.study: stopped ({stop or 'Ctrl-C'}); a local cell that was running got SIGTERM and "
                      "has exited (submitted Slurm jobs stay queued); run the same command again to continue",
                      file=sys.stderr)
                return 130
        result = report.write_report(args.study_dir)
    except (FileNotFoundError, ConfigError, ValueError, RuntimeError) as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    try:
        logged = dashboard.log_report(args.study_dir, result, args.wandb)
    except Exception as err:  # wandb's own errors (no API key, no network, ...): the report is written
        print(f"distnerf.study: the report is written; logging it to W&B failed: {err}", file=sys.stderr)
        return 2
    if logged:
        print(f"distnerf.study: the report logged to W&B: {logged}", file=sys.stderr)
    if args.command == "report" and args.markdown:
        sys.stdout.write(Path(result["files"][1]).read_text())
    print("wrote " + ", ".join(result["files"]), file=sys.stderr)
    # --repeats N, --only: the report lists the config's other cells as not run; only the selected ones count here
    failed = [c["id"] for c in result["cells"] if c["status"] != "done" and (selected is None or c["id"] in selected)]
    if failed:
        print(f"distnerf.study: {len(failed)} cell(s) not finished: {', '.join(failed)}"
              + (" (re-run with --retry-failed)" if any(c["status"] == "failed" for c in result["cells"]) else ""),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
