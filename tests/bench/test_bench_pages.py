"""The benchmark pages: BENCHMARKS.md stays a short index whose links each name a heading that exists, no
page under bench/ grows past 500 lines, and every results folder under bench/ is cited by a page (bench/**/*.md,
docs/**/*.md or BENCHMARKS.md); the links of README.md, docs/, BENCHMARKS.md and the bench pages resolve; the
figures of docs/when_to_pick_ss.md read the same in the files they cite."""
from __future__ import annotations

import json
import re
from pathlib import Path

from tests.conftest import REPO

INDEX = REPO / "BENCHMARKS.md"
BENCH_PAGES = sorted(p for p in (REPO / "bench").rglob("*.md") if "results" not in p.relative_to(REPO / "bench").parts)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces
    to hyphens."""
    text = heading.strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)  # no headings inside code
    return {anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_anchor_of_a_heading_with_code_and_punctuation():
    assert anchor("The README's lego line (issue 28)") == "the-readmes-lego-line-issue-28"
    assert anchor("`ss` fused render: 2 ranks") == "ss-fused-render-2-ranks"
    assert anchor("What does each strategy cost? `python -m distnerf.study`") == (
        "what-does-each-strategy-cost-python--m-distnerfstudy")


def test_index_is_short_and_its_rows_link_to_existing_headings():
    lines = INDEX.read_text().splitlines()
    assert len(lines) <= 300
    rows = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| question")]
    assert len(rows) >= 10
    for ln in rows:
        assert len(ln) <= 200, (len(ln), ln)
        links = LINK.findall(ln)
        assert links, ln
        for target, frag in links:
            page = (INDEX.parent / target).resolve()
            assert page.is_file() and page.parent.parent == REPO / "bench", ln
            assert frag and frag in anchors(page), (frag, target)  # a section, not the top of a page


def test_every_link_of_the_index_names_a_heading():
    """Issue 63: every link of BENCHMARKS.md, its rows' and its prose's, points at a heading of its page
    (``page.md#anchor``), so that a section moved to another page breaks this test, not the reader's link."""
    links = LINK.findall(INDEX.read_text())
    assert links
    unanchored = [target for target, frag in links if not frag]
    wrong = [(target, frag) for target, frag in links if frag and frag not in anchors((INDEX.parent / target).resolve())]
    assert not unanchored and not wrong, (unanchored, wrong)


def test_benchmark_pages_stay_short():
    """Issue 63: a page under bench/ holds at most 500 lines; a longer question is split by sub-question into
    pages beside its README.md, which indexes them."""
    long = {p.relative_to(REPO).as_posix(): n for p in BENCH_PAGES if (n := len(p.read_text().splitlines())) > 500}
    assert len(BENCH_PAGES) >= 10 and not long, long


def test_every_results_folder_is_cited_by_a_page():
    pages = [INDEX, *(REPO / "bench").rglob("*.md"), *(REPO / "docs").rglob("*.md")]
    texts = {p: p.read_text() for p in pages}
    folders = sorted(p for p in (REPO / "bench").glob("*/results/*") if p.is_dir())
    assert len(folders) >= 40
    uncited = []
    for folder in folders:
        rel = folder.relative_to(REPO).as_posix()  # bench/<question>/results/NAME
        local = f"results/{folder.name}"  # as the question's own page names it
        if not any(rel in t or (p.parent == folder.parent.parent and local in t) for p, t in texts.items()):
            uncited.append(rel)
    assert not uncited


def test_every_result_file_records_its_command_and_commit():
    """Each JSON / JSONL file of a results folder has a meta block (its own ``meta`` key or a ``meta.json``
    entry listing it) naming the command and the commit that wrote it."""
    from bench.tablekit import Results

    res = Results(REPO / "bench")
    files = [f for f in (REPO / "bench").glob("*/results/*/**/*")
             if f.suffix in (".json", ".jsonl") and f.name != "meta.json" and f.is_file()]
    assert len(files) >= 100
    lacking = []
    for f in files:
        folder = next(p for p in f.parents if p.parent.name == "results")
        meta = res.meta(f"{folder.name}/{f.relative_to(folder).as_posix()}")
        if not (meta.get("command") and meta.get("git_commit")):
            lacking.append(f.relative_to(REPO).as_posix())
    assert not lacking


def test_page_links_reach_files_and_headings():
    """Every relative link of README.md, docs/*.md, BENCHMARKS.md and the bench pages (bench/**/*.md) names a
    file that exists, and a fragment names a heading of the page it points to (a bare ``(#fragment)``: of the
    page itself)."""
    own = re.compile(r"\]\(#([^)\s]+)\)")
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), INDEX, *BENCH_PAGES]:
        text = page.read_text()
        for target, frag in LINK.findall(text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path = (page.parent / target).resolve()
            if not path.exists() or (frag and path.suffix == ".md" and frag not in anchors(path)):
                broken.append((page.name, target, frag))
        broken += [(page.name, "#", frag) for frag in own.findall(text) if frag not in anchors(page)]
    assert not broken


def figure_values(doc, key: str) -> list:
    """The values at ``key`` in a parsed JSON document: ``name`` a field, ``[k=v,...]`` the list's elements
    whose fields ``k`` read ``v``, ``[*]`` all of them (docs/when_to_pick_ss.md, its figures table)."""
    found = [doc]
    for sel, name in re.findall(r"\[([^\]]*)\]|([^.\[\]]+)", key):
        if name:
            found = [f[name] for f in found if isinstance(f, dict) and name in f]
            continue
        items = [e for f in found for e in (f if isinstance(f, list) else [])]
        if sel != "*":
            want = dict(part.split("=", 1) for part in sel.split(","))
            items = [e for e in items if all(str(e.get(k)) == v for k, v in want.items())]
        found = items
    return [v for v in found if isinstance(v, (int, float))]


def test_figure_values_reads_fields_selections_and_jsonl_lines():
    doc = {"t": {"r": [{"s": "a", "w": 1, "x": 1.5}, {"s": "a", "w": 2, "x": 2.5}, {"s": "b", "w": 2, "x": 9}]}}
    assert figure_values(doc, "t.r[s=a,w=2].x") == [2.5]
    assert figure_values(doc, "t.r[s=a].x") == [1.5, 2.5]
    assert figure_values([{"e": "m", "rk": [{"p": 3}, {"p": 4}]}, {"e": "n"}], "[e=m].rk[*].p") == [3, 4]
    assert figure_values(doc, "t.r[s=c].x") == []


def test_key_values_derive_differences_and_ratios_across_files(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"r": [{"s": 1, "x": 3.0}, {"s": 2, "x": 5.0}], "y": 2.0}))
    (tmp_path / "b.jsonl").write_text('{"x": 1.0}\n{"x": 4.0}\n')
    a, b = tmp_path / "a.json", tmp_path / "b.jsonl"
    assert key_values(a, "r[*].x / y") == [1.5, 2.5]  # each against the one
    assert key_values(a, f"r[*].x - {b}:[*].x") == [2.0, 1.0]  # element by element, another file
    assert key_values(a, "r[s=3].x - y") == [] and key_values(a, f"r[*].x - {b}:[*].z") == []
    assert reads_as(key_values(a, "y / r[*].x"), "0.40-0.67", "x") and key_values(a, "y * r[s=2].x") == [10.0]


FIGURE_PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHORT = {"R62": "bench/scaling/results/study_capacity_cooled_p62k/report.json",
         "R125": "bench/scaling/results/study_capacity_cooled/report.json"}
# a figure table's value suffix (and a page figure's unit) -> the factor from the file's units; other units: 1
# (KiB, MiB, GiB: the file's own unit, as peak_rss_mb's VmHWM / 1024 and eval_memory's *_gb are)
SCALE = {"k": 1e3, "M": 1e6, "G": 1e9, "%": 1e-2, "ms": 1e-3, "kB": 1e3, "MB": 1e6, "GB": 1e9}
UNITS = ("k rays/s", "rays/s", "samples per ray", "samples/ray", "steps", "minutes", "min", "ms", "s", "dB",
         "%", "x", "kB", "MB", "GB", "KiB", "MiB", "GiB", "k", "M")
_NUM = r"\d{1,3}(?: \d{3})+(?![\d.])|\d[\d,]*(?:\.\d+)?"  # 12 000, 62,052, 35.54
_ONE = rf"[+-]?(?:{_NUM})(?:-(?:{_NUM}))?"  # a value or a range, 0.16-0.33
_UNIT = "|".join((" ?" if u in ("%", "x") else r"\s") + re.escape(u) if u != "x" else "x" for u in UNITS)
FIGURE = re.compile(rf"(?<![\w.^/=+:-])(?<!= )({_ONE}(?:(?:, | and | -> | / | to |, then ){_ONE})*)(?:{_UNIT})(?![\w/])")
NUMBER = re.compile(rf"[+-]?(?:{_NUM})(?:-(?:{_NUM}))?")

# Figures with a unit that are not measurements of this project, so no committed file holds them: (page,
# pattern covering the figure in its line, why); page "*": every page. A page's figure is exempt when a match
# of its pattern spans it.
EXEMPT = [
    ("*", r"(?<![\d.])(?:31|62|62\.5|125|250|500) k\b|\b0\.25-4 M\b|(?<![\d.])1 M\b",
     "a study's parameter budget per rank (model.max_params, 31 k-1 M), a setting"),
    ("*", r"(?<![\d-])(?<!\d )(?:100|200|600|2000|3000|12 000) steps", "a run's or study's length (train.max_steps), a setting"),
    ("*", r"(?:at |, )(?:2|10) minutes", "a run's training-time budget (train.max_minutes), a setting"),
    ("*", r"last 20%", "the cool-down share (optim.decay_start=0.8) and the plateau check's window, settings"),
    ("README.md", r"\d+ MB for 2\.\d\.\d", "PyPI's wheel sizes, not this project's"),
    ("*", r"suite's 30 minutes|polled every 2 s|at least 92%|\+ 10% of its|15% tolerance|, 1000 steps\.|a 4x coarser",
     "settings and defaults: the suite's time limit, the viewer's poll period and share, the box margin, "
     "the target check's tolerance, the stages' default, the coarse occupancy grid's factor"),
    ("*", r"leave 48%|350 M parameters|3-13% under",
     "arithmetic, not measured: a ball in its cube, the grid's whole-cube sizing rule"),
    ("when_to_pick_ss.md", r"0\.5x and 2x the default|target \+1 dB|44% at",
     "settings (city_capacity's multipliers, the issue's target) and arithmetic the page says is not measured"),
    ("operations.md", r"\(7200 s|\(5 s\)|\b30 s\b|\(121 s\)",
     "timeouts and periods: defaults of the code, of torchrun's agent and of Slurm"),
    ("profiling.md", r"at or below 5%", "a test's threshold"),
    ("newcomer_trial.md", r"a 3 s budget", "the suite's per-test time budget, a setting"),
]


def prose(text: str) -> str:
    """The page without fenced code, inline code, HTML comments and its figures table (blanked, so line
    numbers stay)."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731
    text = re.sub(r"^```.*?^```", blank, text, flags=re.S | re.M)
    text = re.sub(r"<!-- figures -->.*?<!-- /figures -->", blank, text, flags=re.S)
    text = re.sub(r"<!--.*?-->", blank, text, flags=re.S)
    return re.sub(r"`[^`\n]*`", blank, text)


def page_figures(text: str) -> list[tuple[int, str, str, tuple[int, int]]]:
    """Each number shown with a unit outside code: (line, number as written, unit, its span in the line);
    ``24.23, 24.95, 25.60 dB`` is three figures in dB, ``1.8-2.2x`` one range."""
    found = []
    for i, line in enumerate(prose(text).splitlines(), 1):
        for m in FIGURE.finditer(line):
            unit = line[m.end(1):m.end()].strip()
            for n in NUMBER.finditer(m.group(1)):
                found.append((i, n.group(0), unit, (m.start(1) + n.start(), m.end())))
    return found


def figure_table(text: str) -> list[tuple[str, str, str, list]]:
    """A page's figures table, between ``<!-- figures -->`` and ``<!-- /figures -->`` (shown, as in
    docs/when_to_pick_ss.md) or inside one comment ``<!-- figures ... /figures -->`` (hidden): rows
    ``| figure | value | file | key |`` -> (figure, value, file, the key's values there)."""
    m = re.search(r"<!-- figures(.*?)/figures -->", text, flags=re.S)
    rows, source = [], None
    for line in (m.group(1).splitlines() if m else []):
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or len(cells) != 4 or cells[0] == "figure" or set(cells[0]) <= {"-"}:
            continue
        figure, value, where, key = cells
        source = source if where == "same" else SHORT.get(where, where)
        path = REPO / source
        assert path.is_file(), (figure, source)
        rows.append((figure, value, source, key_values(path, key)))
    return rows


def load(path: Path):
    raw = path.read_text()
    return [json.loads(ln) for ln in raw.splitlines() if ln.strip()] if path.suffix == ".jsonl" else json.loads(raw)


def key_values(path: Path, key: str) -> list:
    """A figures-table key's values in ``path``: ``key`` (figure_values), or a derived figure ``A - B`` or
    ``A / B`` or ``A * B`` (a difference in dB, a ratio, a product), each operand a key of ``path`` or ``FILE:key`` of another
    committed file (a SHORT name or a path); element by element, or one value against each of the other's."""
    m = re.fullmatch(r"(.+?) ([-/*]) (.+)", key)
    if not m:
        return figure_values(load(path), key)
    sides = []
    for operand in (m.group(1), m.group(3)):
        where, _, own = operand.rpartition(":")
        sides.append(figure_values(load(REPO / SHORT.get(where, where)) if where else load(path), own))
    a, b = sides
    if len(a) != len(b):
        a, b = (a * len(b), b) if len(a) == 1 else (a, b * len(a)) if len(b) == 1 else ([], [])
    op = {"-": lambda x, y: x - y, "/": lambda x, y: x / y, "*": lambda x, y: x * y}[m.group(2)]
    return [op(x, y) for x, y in zip(a, b)]


def shown(x: float, like: str, unit: str) -> str:
    """``x`` (in its file's units) written as ``like`` is: scaled by the unit, at ``like``'s decimals."""
    like = like.lstrip("+").replace(",", "").replace(" ", "")
    decimals = len(like.split(".")[1]) if "." in like else 0
    return f"{x / SCALE.get(unit, 1.0):.{decimals}f}"


def reads_as(found: list, number: str, unit: str, every: bool = False) -> bool:
    """Whether the values ``found`` read as ``number`` in ``unit``: one value (any of them; ``every``: all),
    or a range ``lo-hi`` as their min-max."""
    if not found:
        return False
    plain = number.lstrip("+").replace(",", "")
    parts = re.fullmatch(r"(\d[\d ]*(?:\.\d+)?)(?:-(\d[\d ]*(?:\.\d+)?))?", plain)
    if not parts:
        return False
    lo, hi = parts.group(1).replace(" ", ""), (parts.group(2) or "").replace(" ", "")
    if hi:
        return (shown(min(found), lo, unit), shown(max(found), hi, unit)) == (lo, hi)
    return (all if every else any)(shown(x, lo, unit) == lo for x in found)


def bindable(number: str, unit: str) -> bool:
    """A single digit (``2 min``, ``8x``) would read as too many table values: it is bound by no row."""
    return not re.fullmatch(r"[+-]?\d", number)


def fits(value: str, unit: str) -> bool:
    """Whether a table value (``35.54``, ``88.05 k``, ``19.3-21.7 ms``, ``119.5 s``) may stand for a page
    figure in ``unit``: the same multiplier (``kB`` and ``k rays/s`` take ``k``; MiB, GiB: the file's own),
    and for times and step counts the unit itself written in the value."""
    suffix = re.sub(r"^[+\d., -]*", "", value)
    if unit in ("s", "min", "minutes", "steps"):
        return suffix == unit
    multiplier = next((m for m in ("ms", "k", "M", "G", "%") if unit == m or unit.startswith(m + " ")
                       or unit in (m + "B",)), "")
    return (suffix if suffix in ("ms", "k", "M", "G", "%") else "") == multiplier


def test_page_figures_are_found_with_their_units():
    text = ("lego at 1, 2 and 4 ranks, 300 steps: 24.23, 24.95, 25.60 dB; 1.8-2.2x a step, 12 000 steps, "
            "88-170 kB, 6.6%, 400x400 px, step_N, 160^3, `3 s` and 62.5 k per rank\n```\n5 s\n```\n<!-- 9 s -->")
    got = [(n, u) for _, n, u, _ in page_figures(text)]
    assert got == [("300", "steps"), ("24.23", "dB"), ("24.95", "dB"), ("25.60", "dB"), ("1.8-2.2", "x"),
                   ("12 000", "steps"), ("88-170", "kB"), ("6.6", "%"), ("62.5", "k")]
    assert reads_as([0.0881, 0.1699], "88-170", "kB") is False and reads_as([88050, 169970], "88-170", "kB")
    assert reads_as([31.8048], "31.80", "dB") and not reads_as([31.8048], "31.8", "%")


def test_every_page_figure_with_a_unit_is_bound_to_its_file_or_exempt():
    """Issue 60 item 1: every number shown with a unit in README.md and docs/*.md, outside code, reads the
    same, at its decimals and in its unit, as a row of the page's figures table (value, file, key: the row
    itself checked against the file by the next test), or is on EXEMPT (not a measurement)."""
    unbound, used = [], set()
    for page in FIGURE_PAGES:
        text = page.read_text()
        lines = prose(text).splitlines()
        rows = figure_table(text)
        for line, number, unit, (a, b) in page_figures(text):
            if bindable(number, unit) and any(reads_as(found, number, unit) and fits(value, unit)
                                              for _, value, _, found in rows):
                continue
            hit = [i for i, (where, pattern, _) in enumerate(EXEMPT) if where in (page.name, "*") and any(
                m.start() <= a and b <= m.end() for m in re.finditer(pattern, lines[line - 1]))]
            used.update(hit)
            if not hit:
                unbound.append((f"{page.name}: {number} {unit}", line))
    assert not unbound, "\n".join(f"{name} (line {line})" for name, line in unbound)
    assert not [EXEMPT[i] for i in range(len(EXEMPT)) if i not in used]  # no stale exemption


def test_figure_tables_match_their_committed_files():
    """Each row of a page's figures table (value, file, key) reads the same, at the value's decimals, as
    the committed file it cites: one value, or the min-max over the key's matches (seeds, ranks)."""
    wrong, tables = [], 0
    for page in FIGURE_PAGES:
        rows = figure_table(page.read_text())
        tables += bool(rows)
        for figure, value, source, found in rows:
            m = re.fullmatch(r"([+-]?[\d.,]+(?:-[\d.,]+)?)\s*([^\d\s].*)?", value)
            assert m and found, (page.name, figure, value, source)
            if not reads_as(found, m.group(1), m.group(2) or "", every=True):
                wrong.append((page.name, figure, value, source, min(found), max(found)))
    assert tables >= 2 and not wrong, wrong


def test_when_to_pick_ss_figures_table_covers_the_page():
    """The guide promises every figure with its file and key: its table holds them, each file linked."""
    text = (REPO / "docs" / "when_to_pick_ss.md").read_text()
    rows = figure_table(text)
    assert len(rows) >= 50
    assert not [s for s in sorted({r[2] for r in rows}) if f"](../{s})" not in text]
