"""The benchmark pages: BENCHMARKS.md stays a short index whose rows link to headings that exist, and every
results folder under bench/ is cited by a page (bench/**/*.md, docs/**/*.md or BENCHMARKS.md)."""
from __future__ import annotations

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
