"""What every question's tables share: the reader of the results JSON and the Markdown cells.

A table function (``bench/<question>/tables.py``) takes a :class:`Results` and returns the lines of its
table; it names a result file by its results folder's name and the path inside it
(``"lego_1p/metrics.json"``), wherever that folder lives: ``bench/<question>/results/NAME/``. Meta data of
a result file: its own ``meta`` key (the Python runners write one), else the entry of the nearest
``meta.json`` above it (up to its results folder) whose ``files`` list it, the latest such entry (the
shell runners, and results copied from earlier runs, whose load lines came from ``../shared/tools/quiet``).
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class ResultError(Exception):
    """A table's JSON is missing or malformed."""


@dataclass
class Results:
    """Reads result JSON under ``root`` (the ``bench/`` folder: ``root/<question>/results/NAME/...``) and
    remembers which files a table used."""

    root: Path
    used: list[str] = field(default_factory=list)

    def folder(self, name: str) -> Path:
        """The results folder ``root/<question>/results/NAME`` (``root/results/NAME`` when none has it, which
        then does not exist). Raises ResultError when two questions hold a folder of that name."""
        found = sorted(self.root.glob(f"*/results/{name}"))
        if len(found) > 1:
            raise ResultError(f"results folder {name!r} in several questions: {[str(p) for p in found]}")
        return found[0] if found else self.root / "results" / name

    def locate(self, rel: str) -> Path:
        """The path of ``rel`` (``NAME/inner/path``), whether or not it exists."""
        name, _, inner = rel.partition("/")
        return self.folder(name) / inner if inner else self.folder(name)

    def shown(self, rel: str) -> str:
        """``rel``'s path as the Source lines name it: relative to the repository when inside it."""
        p = self.locate(rel)
        try:
            return p.relative_to(ROOT).as_posix()
        except ValueError:
            return p.as_posix()

    def path(self, rel: str) -> Path:
        p = self.locate(rel)
        if not p.is_file():
            raise ResultError(f"missing result file {p}")
        if rel not in self.used:
            self.used.append(rel)
        return p

    def json(self, rel: str):
        try:
            return json.loads(self.path(rel).read_text())
        except json.JSONDecodeError as err:
            raise ResultError(f"{self.locate(rel)}: {err}") from err

    def jsonl(self, rel: str) -> list[dict]:
        return [json.loads(line) for line in self.path(rel).read_text().splitlines() if line.strip()]

    def meta(self, rel: str) -> dict:
        """The meta block of a result file (see the module docstring)."""
        p = self.locate(rel)
        if p.suffix == ".json":
            own = json.loads(p.read_text())
            if isinstance(own, dict) and isinstance(own.get("meta"), dict):
                return own["meta"]
        top = self.folder(rel.partition("/")[0])
        d = p.parent
        while True:
            m = d / "meta.json"
            if m.is_file():
                inner = p.relative_to(d).as_posix()
                for run in reversed(json.loads(m.read_text()).get("runs", [])):  # the latest run that wrote it
                    if inner in run.get("files", []):
                        return run
            if d == top or top not in d.parents:
                break
            d = d.parent
        raise ResultError(f"no meta for {p}: neither a 'meta' key nor a meta.json entry listing it")


def f2(x: float) -> str:
    return f"{x:.2f}"


def kilo(x: float) -> str:
    return f"{x / 1e3:.1f}k"


def mega(x: float) -> str:
    return f"{x / 1e6:.2f} M"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def psnr_ssim(m: dict) -> str:
    return f"{m['psnr']:.2f} / {m['ssim']:.3f}"


def row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def header(*cells) -> list[str]:
    return [row(*cells), "|" + "---|" * len(cells)]


def load_text(meta: dict) -> str:
    def first(x):
        return x[0] if isinstance(x, list) else x

    src = "../shared/tools/quiet" if "quiet" in meta else "the tool"
    if meta.get("load_before") is None:
        return "load not recorded"
    after = "not recorded" if meta.get("load_after") is None else f"{first(meta['load_after']):.2f}"
    return f"load {first(meta['load_before']):.2f} before, {after} after (1-minute average, from {src})"


def commit_text(meta: dict) -> str:
    commit = meta.get("git_commit")
    if not commit:
        return "commit not recorded"
    if str(meta.get("git_commit_basis", "")).startswith("not recorded"):
        return f"commit {commit} (inferred from commit times, see meta.json)"
    return f"commit {commit}" + (" with local changes" if meta.get("git_dirty") else "")


def shown_command(command):
    """A recorded command as a page shows it: a ``train.*`` key that has since moved to its own section
    (:data:`distnerf.config_check.MOVED_TRAIN_KEYS`: ``train.lr`` is ``optim.lr``) under its new name, so the
    page's command runs on the current code (tests/bench/test_page_commands.py); the JSON keeps the command as
    it ran (its commit says when)."""
    import re

    from distnerf.config_check import MOVED_TRAIN_KEYS

    if not isinstance(command, str):
        return command
    return re.sub(r"(?<![\w.])train\.(\w+)(?==)",
                  lambda m: MOVED_TRAIN_KEYS.get(m.group(1), m.group(0)), command)


def source_lines(res: Results) -> list[str]:
    """One line per command: the files it wrote that the table used, command (:func:`shown_command`), date,
    commit, load."""
    groups: dict[str, tuple[dict, list[str]]] = {}
    for rel in res.used:
        meta = res.meta(rel)
        key = json.dumps({k: meta.get(k) for k in ("command", "finished", "started")}, sort_keys=True)
        groups.setdefault(key, (meta, []))[1].append(rel)
    lines = []
    for meta, files in groups.values():
        names = ", ".join(f"`{res.shown(f)}`" for f in files)
        date = meta.get("date") or str(meta.get("finished", ""))[:10] or "date not recorded"
        lines.append(f"- *Source:* {names} — `{shown_command(meta.get('command', 'command not recorded'))}`; {date}, "
                     f"{commit_text(meta)}; {load_text(meta)}.")
    return lines


# ----------------------------------------------------------------------------- tables of several questions
def quality(res: Results, run: str, label: str, minutes=(2, 5, 10)) -> list[str]:
    """bench/quality/quality.sh: PSNR / SSIM at the 2- and 5-minute checkpoints and at the end."""
    ms = [res.json(f"{run}/at_{minutes[0]}min/metrics.json"), res.json(f"{run}/at_{minutes[1]}min/metrics.json"),
          res.json(f"{run}/metrics.json")]
    cols = [f"{m} min ({x['protocol']['num_views']} views)" for m, x in zip(minutes, ms)]
    out = header("", *cols, f"steps at {' / '.join(str(m) for m in minutes)} min")
    out.append(row(label, *(psnr_ssim(m) for m in ms), " / ".join(str(m["step"]) for m in ms)))
    return out


def stages(res: Results, run: str) -> list[str]:
    """Per grid stage: medians of the training log's rows (metrics.jsonl), and the run's phase shares."""
    rows = res.jsonl(f"{run}/metrics.jsonl")
    steps = [r for r in rows if "loss" in r]
    by: dict[int, list[dict]] = {}
    for r in steps:
        by.setdefault(int(r["grid_resolution"]), []).append(r)
    out = header("grid", "logged steps", "rays/s", "samples marched / ray", "density evaluations / ray",
                 "coloured samples / ray")
    for n, rs in sorted(by.items()):
        med = {k: statistics.median(r[k] for r in rs) for k in
               ("rays_per_s", "samples_per_ray", "density_samples_per_ray", "colour_samples_per_ray")}
        out.append(row(f"{n}^3", f"{rs[0]['step']}-{rs[-1]['step']} ({len(rs)} rows)", kilo(med["rays_per_s"]),
                       f"{med['samples_per_ray']:.1f}", f"{med['density_samples_per_ray']:.1f}",
                       f"{med['colour_samples_per_ray']:.1f}"))
    summary = [r for r in rows if r.get("event") == "profile_summary"]
    if summary:
        s = summary[-1]
        pre = next(k.rsplit("/", 1)[0] for k in s if k.endswith("/step_s_median"))
        phases = [("forward", "forward"), ("backward", "backward"), ("optimizer", "optimizer"),
                  ("regularizer", "regulariser (TV)"), ("model_update", "`model_update` (occupancy, upsampling)"),
                  ("input_wait", "input wait")]
        shares = ", ".join(f"{label} {pct(s[f'{pre}/{k}_share'])}" for k, label in phases if f"{pre}/{k}_share" in s)
        out += ["", f"Whole run (`profile_summary` row): step median {1e3 * s[f'{pre}/step_s_median']:.1f} ms; "
                    f"shares of the training time: {shares}."]
    return out
