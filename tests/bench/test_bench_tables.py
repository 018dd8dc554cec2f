"""bench/tables.py: tables between markers regenerated from bench/<question>/results JSON; --check."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import tables as driver

ROOT = Path(__file__).resolve().parents[2]

DOC = """# Benchmarks

Prose that the generator must leave alone: `<!-- table:memory -->` in inline code is no marker.

<!-- table:memory -->
| stale | table |
<!-- /table:memory -->

Closing prose.
"""


def _memory_result(root: Path, peak: float = 1000.0, meta: bool = True) -> Path:
    """A bench/throughput/engine.py --parts memory result with made-up figures (test data only), in the
    results folder of a question (``root`` stands for ``bench/``)."""
    body = {"memory": {"8192": {"peak_rss_mb": peak, "rss_before_render_mb": 800.0, "seconds": 1.5},
                       "65536": {"peak_rss_mb": peak + 200, "rss_before_render_mb": 800.0, "seconds": 2.0}}}
    if meta:
        body["meta"] = {"command": "python -m bench.throughput.engine runs/x --parts memory", "date": "2026-01-02",
                        "git_commit": "abc1234", "git_dirty": False, "load_before": [0.5, 0.6, 0.7],
                        "load_after": [0.9, 0.8, 0.7]}
    path = root / "memory" / "results" / "lego_1p" / "bench_engine_memory.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body))
    return path


def _args(doc: Path, results: Path, *extra: str) -> list[str]:
    return ["--file", str(doc), "--results", str(results), *extra]


def test_check_fails_until_regenerated_then_passes(tmp_path, capsys):
    results, doc = tmp_path / "bench", tmp_path / "BENCHMARKS.md"
    _memory_result(results)
    doc.write_text(DOC)
    assert driver.main(_args(doc, results, "--check")) == 1
    assert doc.read_text() == DOC  # --check never writes
    assert driver.main(_args(doc, results)) == 0
    assert driver.main(_args(doc, results, "--check")) == 0
    text = doc.read_text()
    assert "| stale | table |" not in text
    assert "| 8192 | 1000 MB | 800 MB | 200 MB | 1.50 s |" in text
    assert "memory/results/lego_1p/bench_engine_memory.json" in text
    assert "python -m bench.throughput.engine runs/x" in text
    assert "load 0.50 before, 0.90 after" in text and "commit abc1234" in text
    before, after = DOC.split("<!-- table:memory -->\n| stale")[0], DOC.split("<!-- /table:memory -->")[1]
    assert text.startswith(before) and text.endswith(after)  # prose outside the markers unchanged
    # regenerating again is a no-op
    assert driver.regenerate(text, results) == text


def test_check_fails_when_the_json_changes(tmp_path):
    results, doc = tmp_path / "bench", tmp_path / "BENCHMARKS.md"
    _memory_result(results)
    doc.write_text(DOC)
    driver.main(_args(doc, results))
    _memory_result(results, peak=1100.0)
    assert driver.main(_args(doc, results, "--check")) == 1
    driver.main(_args(doc, results))
    assert "| 8192 | 1100 MB | 800 MB | 300 MB |" in doc.read_text()


def test_meta_json_entry_when_the_file_has_no_meta(tmp_path):
    results, doc = tmp_path / "bench", tmp_path / "BENCHMARKS.md"
    _memory_result(results, meta=False)
    doc.write_text(DOC)
    assert driver.main(_args(doc, results)) == 2  # no meta anywhere: an error
    quiet = {"load_before": 0.3, "load_after": 1.2, "at": "2026-01-03T00:00:00Z"}
    (results / "memory" / "results" / "lego_1p" / "meta.json").write_text(json.dumps({"runs": [
        {"files": ["bench_engine_memory.json"], "command": "quiet -- python -m bench.throughput.engine",
         "date": "2026-01-03", "git_commit": None, "load_before": 0.3, "load_after": 1.2, "quiet": quiet}]}))
    assert driver.main(_args(doc, results)) == 0
    text = doc.read_text()
    assert "load 0.30 before, 1.20 after (1-minute average, from ../shared/tools/quiet)" in text
    assert "commit not recorded" in text


@pytest.mark.parametrize("doc, message", [
    ("<!-- table:nosuch -->\n<!-- /table:nosuch -->\n", "unknown table"),
    ("<!-- table:memory -->\nno end\n", "never closed"),
    ("<!-- /table:memory -->\n", "closes nothing"),
    ("<!-- table:main_job -->\n<!-- /table:main_job -->\n", "missing result file"),
])
def test_errors(tmp_path, capsys, doc, message):
    results, path = tmp_path / "bench", tmp_path / "BENCHMARKS.md"
    _memory_result(results)
    path.write_text(doc)
    assert driver.main(_args(path, results, "--check")) == 2
    assert message in capsys.readouterr().err


def test_repository_benchmarks_match_their_json():
    """Every page's tables (BENCHMARKS.md, bench/**/README.md) are what bench/<question>/results gives
    (python -m bench.tables regenerates them)."""
    assert driver.main(["--check"]) == 0
