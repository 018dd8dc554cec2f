"""The benchmark pages: BENCHMARKS.md stays a short index whose rows link to headings that exist, and every
results folder under bench/ is cited by a page (bench/**/*.md, docs/**/*.md or BENCHMARKS.md); README.md's and
docs/'s links resolve; the figures of docs/when_to_pick_ss.md read the same in the files they cite."""
from __future__ import annotations

import json
import re
from pathlib import Path

from tests.conftest import REPO

INDEX = REPO / "BENCHMARKS.md"
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
            assert not frag or frag in anchors(page), (frag, target)


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


def test_readme_and_docs_links_reach_files_and_headings():
    """Every relative link of README.md and docs/*.md names a file that exists, and a fragment names a
    heading of the page it points to (a bare ``(#fragment)``: of the page itself)."""
    own = re.compile(r"\]\(#([^)\s]+)\)")
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
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


def test_when_to_pick_ss_figures_match_their_committed_files():
    """Each row of the guide's figures table (value, file, key) reads the same, at the value's decimals, as
    the committed file it cites: one value, or the min-max over the key's matches (seeds, ranks)."""
    page = REPO / "docs" / "when_to_pick_ss.md"
    text = page.read_text()
    table = text.split("<!-- figures -->")[1].split("<!-- /figures -->")[0]
    short = {"R62": "bench/scaling/results/study_capacity_cooled_p62k/report.json",
             "R125": "bench/scaling/results/study_capacity_cooled/report.json"}
    scale = {"": 1.0, "k": 1e3, "M": 1e6, "%": 1e-2, "ms": 1e-3}
    rows, source, wrong, cited = 0, None, [], set()
    for line in table.strip().splitlines()[2:]:
        figure, value, where, key = [c.strip().strip("`") for c in line.strip("|").split("|")]
        source = source if where == "same" else short.get(where, where)
        path, _ = REPO / source, cited.add(source)
        assert path.is_file(), (figure, source)
        raw = path.read_text()
        doc = [json.loads(ln) for ln in raw.splitlines() if ln.strip()] if path.suffix == ".jsonl" else json.loads(raw)
        m = re.fullmatch(r"([\d.]+)(?:-([\d.]+))?\s*(k|M|%|ms)?", value)
        assert m, (figure, value)
        found = figure_values(doc, key)
        assert found, (figure, key)

        def shown(x, like):
            decimals = len(like.split(".")[1]) if "." in like else 0
            return f"{x / scale[m.group(3) or '']:.{decimals}f}"
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if (shown(min(found), lo), shown(max(found), hi)) != (lo, hi):
            wrong.append((figure, value, shown(min(found), lo), shown(max(found), hi)))
        rows += 1
    assert rows >= 50 and not wrong, wrong
    assert not [s for s in sorted(cited) if f"](../{s})" not in text]  # each file is linked from the page
