"""The GPU check's plan (bench/gpu/check.py RUNS): every run fits 7 minutes with its start-up, run 1 takes the
environment, lego at 1 minute with its 200-view evaluation, the sweep and the CUDA tests in that order, and every
section is in some run with a shell function to run it; ``--prepare``'s size limit; the sweep's rows each in their
own process (one that dies or hangs fails its row only); ops.py's lego folder from its argument, never a fixed path.
The script end to end (--cpu): tests/bench/test_gpu_check.py."""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from bench.gpu import check, sweep
from bench.throughput import ops

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = (ROOT / "bench" / "gpu" / "check.sh").read_text()


def names(run: int) -> list[str]:
    return [name for name, _ in check.RUNS[run]]


def test_every_run_with_its_start_up_fits_seven_minutes():
    assert check.RUN_LIMIT_S == 420 and check.STARTUP_S >= 15
    for run, sections in check.RUNS.items():
        total = sum(cap for _, cap in sections) + check.STARTUP_S
        assert total <= check.RUN_LIMIT_S, (run, total)
        assert all(isinstance(cap, int) and cap > 0 for _, cap in sections), run
        assert len(set(names(run))) == len(sections), run  # no section twice in a run


def test_run_one_is_env_lego_1min_sweep_then_the_device_tests():
    assert names(1) == ["env", "lego_1min", "sweep", "cuda_tests"]
    assert "200 test views" in check.SECTIONS["lego_1min"] and "evaluation seconds" in check.SECTIONS["lego_1min"]
    assert re.search(r"^sec_lego_1min\(\) \{ sec_lego 1 200 ", SCRIPT, re.M)  # 1 minute, all 200 views
    assert sweep.CUDA_PLAN[:2] == [("eager", 18, False), ("graphed", 18, False)]  # the sweep's eager, graphed rows
    assert re.search(r"^sec_sweep\(\) \{ sec_sweep_part first sweep ", SCRIPT, re.M)


def test_every_section_is_in_some_run_and_has_its_shell_function():
    planned = {name for run in check.RUNS for name in names(run)}
    assert planned == set(check.SECTIONS)
    for run in check.RUNS:
        assert names(run)[0] == "env", run  # every run records its machine first
    later = {name for run in check.RUNS if run > 1 for name in names(run)}
    assert {"lego_2min", "lego_5min", "two_ranks", "sync_debug", "ops", "ddp_trace", "ss_trace", "study"} <= later
    for name in check.SECTIONS:
        assert re.search(rf"^sec_{name}\(\) \{{", SCRIPT, re.M), name


def test_the_scripts_header_lists_the_plans_runs():
    listed = dict(re.findall(r"^#   (\d)  (.+)$", SCRIPT, re.M))
    assert {int(k): v.split(", ") for k, v in listed.items()} == {run: names(run) for run in check.RUNS}


def test_plan_all_takes_each_section_once_in_the_runs_order():
    everything = check.plan("all")
    assert [n for n, _ in everything] == list(dict.fromkeys(n for run in check.RUNS for n in names(run)))
    assert check.plan("1") == check.RUNS[1]
    for bad in ("0", "7", "one", ""):
        with pytest.raises(ValueError, match="no run"):
            check.plan(bad)


def test_prepared_size_refuses_above_the_limit(tmp_path):
    data, wheels = tmp_path / "data", tmp_path / "whl"
    (data / "train").mkdir(parents=True)
    wheels.mkdir()
    (data / "train" / "r_0.png").write_bytes(b"x" * 3 * 2**20)
    (data / "transforms_train.json").write_bytes(b"{}")
    (wheels / "a.whl").write_bytes(b"y" * 2**20)
    (wheels / "link.whl").symlink_to(data / "train" / "r_0.png")  # not counted twice
    assert check.tree_bytes(data) == 3 * 2**20 + 2 and check.tree_bytes(wheels) == 2**20
    ok, line = check.prepared_size([data, wheels], limit_mib=5)
    assert ok and "4.0 MiB in all, within the 5 MiB limit" in line
    ok, line = check.prepared_size([data, wheels], limit_mib=3.5)
    assert not ok and f"{data} 3.0 MiB" in line and "above the 3.5 MiB limit" in line
    assert check.PREPARE_LIMIT_MIB == 60


def test_a_sweep_row_that_dies_or_hangs_fails_only_its_row(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "ROW_CAP_S", {"eager": 20, "graphed": 20, "graph": 1.5})
    monkeypatch.setattr(sweep, "MIN_ROW_S", 0)
    scripts = {  # what each row's process does instead of measuring
        "eager": "import os; os.abort()",  # as a device-side assert's abort would
        "graphed": "import json, sys; open(sys.argv[1], 'w').write(json.dumps({'status': 'ok', 'rays_per_s': 5.0}))",
        "graph": "import time; time.sleep(30)",  # past its cap
    }
    saved = []

    def command_for(row, row_file):
        return [sys.executable, "-c", scripts[row[0]], str(row_file)]

    rows = [("eager", 18, False), ("graphed", 18, False), ("graph", 18, False)]
    out = sweep.run_plan(rows, True, 60, command_for, tmp_path, lambda done: saved.append(list(done)))
    assert out[0]["status"] == "failed: the process died of SIGABRT", out[0]
    assert out[1]["status"] == "ok" and out[1]["rays_per_s"] == 5.0
    assert out[2]["status"] == "failed: timed out after 2 s (the row's cap)" and out[2]["process_s"] < 15
    assert [len(s) for s in saved] == [1, 2, 3]  # the section written after every row
    monkeypatch.setenv("GC_SECT", str(tmp_path))
    sweep.save(out, ["experiment=smoke"], 3, "sweep", None)
    body = json.loads((tmp_path / "sweep.json").read_text())
    assert body["status"] == "failed: eager_p18, graph_p18 (1 of 3 rows ok)" and body["best_rays_per_s"] == 5.0
    late = sweep.run_plan(rows[:1], True, 0, command_for, tmp_path, lambda done: None)  # the section's time spent
    assert late[0]["status"] == "skipped: time (the section's 0 s spent)"


def test_ops_reads_lego_from_its_argument(tmp_path):
    assert not any("shared" in o for overrides in ops.CONFIGS.values() for o in overrides)
    assert ops.config_overrides("smoke_grid", None) == ["model=grid"]
    with pytest.raises(ValueError, match="DISTNERF_LEGO"):
        ops.config_overrides("lego_grid", None)
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        ops.config_overrides("lego_grid", str(tmp_path))
    (tmp_path / "transforms_train.json").write_text("{}")
    assert ops.config_overrides("lego_grid_64_rays", str(tmp_path)) == [
        "dataset=blender", f"dataset.root={tmp_path}", "train.global_rays=64"]


def test_env_records_absent_tools_as_absent():
    assert check.tool_version("no-such-compiler-for-distnerf") == "absent"
    assert check.package_version("no-such-distribution-for-distnerf") == "absent"
    assert check.package_version("pytest") == pytest.__version__
    assert check.tool_version(Path(sys.executable).name).startswith("Python ")


def test_partial_evaluation_counts_the_renders_and_their_rate(tmp_path):
    assert check.partial_evaluation(tmp_path) is None
    for i in range(5):  # a render every 2 s
        f = tmp_path / f"{i:03d}_r_{i}_rgb.png"
        f.write_bytes(b"")
        os.utime(f, (1000 + 2 * i, 1000 + 2 * i))
    (tmp_path / "000_r_0_depth.png").write_bytes(b"")
    got = check.partial_evaluation(tmp_path)
    assert got == {"views_rendered": 5, "first_to_last_s": 8.0, "views_per_s": 0.5, "seconds_per_200_views": 400.0}


def test_psnr_over_the_25_view_subset_of_a_full_evaluation():
    rows = [{"view": i, "psnr": 20 + i / 10} for i in range(200)]
    assert check.psnr_subset(rows, 25) == pytest.approx(20 + sum(range(0, 200, 8)) / 250)  # r_0, r_8, ..., r_192
    assert check.psnr_subset(rows[:25], 25) is None and check.psnr_subset(rows[1:], 25) is None


def test_merge_lists_the_runs_sections_in_order_with_caps(tmp_path, monkeypatch):
    monkeypatch.setenv("GC_SECT", str(tmp_path))
    check.write("env", {"status": "ok"})
    check.write("sweep", {"status": "skipped: not selected"})
    (tmp_path / "_timings.txt").write_text("env 15 9.5\n")
    check.merge(tmp_path, "gpu", "1", 0.0, 400)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary["sections"]) == names(1) and summary["run"] == "1"
    assert summary["sections"]["env"] == {"status": "ok", "cap_s": 15.0, "section_s": 9.5}
    assert summary["statuses"]["lego_1min"] == "failed: no result (see log.txt)"
    assert [row[:2] for row in summary["plan"]] == [list(x) for x in check.RUNS[1]]
