"""``python -m distnerf.study`` end to end: conf/study/smoke.yaml (2 strategies x 2 samplers x
world sizes 1 and 2, real torchrun cells), its report, a re-run that trains nothing, a cell
killed mid-way that is run again, a failing cell, and an undeclared difference flagged."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from PIL import Image

from tests.conftest import REPO
from tests.launch.conftest import descendants

ENV = {**os.environ, "WANDB_MODE": "disabled"}
SMOKE = REPO / "conf" / "study" / "smoke.yaml"


def study(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "distnerf.study", *map(str, args)], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("study") / "smoke"
    proc = study("run", SMOKE, root)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return root, proc


def test_smoke_study_runs_every_cell_and_reports_them(smoke):
    root, _ = smoke
    report = json.loads((root / "report" / "report.json").read_text())
    cells = report["cells"]
    assert len(cells) == 8 and all(c["status"] == "done" for c in cells), [(c["id"], c["status"]) for c in cells]
    assert {(c["values"]["strategy"], c["values"]["sampler"], c["values"]["world_size"]) for c in cells} == {
        (s, p, w) for s in ("ddp", "ss_joint") for p in ("sync", "pipelined") for w in (1, 2)}
    for c in cells:  # ordinary run directories, with the record of how each ran
        run = root / "cells" / c["id"]
        assert (run / "metrics.json").exists() and (run / "profile" / "rank_0.json").exists()
        record = json.loads((run / "study_cell.json").read_text())
        assert record["status"] == "done" and record["rc"] == 0 and record["load"]["load1"] >= 0
        assert len(list((run / "profile").glob("rank_*.json"))) == c["values"]["world_size"]
    t = report["tables"]
    assert len(t["breakdown"]) == 8
    for row in t["breakdown"]:  # the stacked shares of a step sum to one
        assert sum(row[p] for p in ("input_wait", "copy", "forward", "backward", "exposed_comm", "step_sync",
                                    "optimizer", "unattributed", "other")) == pytest.approx(1.0, abs=1e-6)
    kinds = {(r["kind"], r["world_size"]) for r in t["sync"]}
    assert kinds == {("ddp all-reduce", 2), ("ss joint exchange", 2)}
    assert all(r["bytes_per_step"] > 0 for r in t["sync"])
    assert {r["world_size"] for r in t["inference"]} == {1, 2} and all(r["fused_over_single"] > 0
                                                                      for r in t["inference"])
    piped = [r for r in t["input"] if r["sampler"] == "pipelined"]
    assert len(piped) == 4 and all(r["speedup_over_sync"] > 0 and r["ideal_bound"] >= 1 for r in piped)
    assert t["scaling"]["predictions"]["ib400"][-1]["world_size"] == 1024
    assert {(r["strategy"], r["world_size"]) for r in t["scaling_check"]["rows"]} >= {("ddp", 1), ("ddp", 2)}
    assert t["differs"] == []


def test_report_figures_open_and_the_html_links_them(smoke):
    root, _ = smoke
    out = root / "report"
    names = json.loads((out / "report.json").read_text())["figures"]
    assert set(names) == {"breakdown.png", "sync.png", "inference.png", "input.png", "quality.png", "scaling.png"}
    html = (out / "report.html").read_text()
    for name in names:
        with Image.open(out / name) as im:
            im.verify()
        assert f"href='{name}'" in html
    assert html.count("data:image/png;base64,") == len(names)  # self-contained: the figures embedded
    md = (out / "report.md").read_text()
    assert "## Training step breakdown" in md and "## Scaling model" in md


def test_rerun_skips_finished_cells(smoke):
    root, _ = smoke
    before = {p: p.stat().st_mtime_ns for p in (root / "cells").glob("*/metrics.json")}
    dirs = sorted(p.name for p in (root / "cells").iterdir())
    proc = study("run", SMOKE, root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count(": finished") == 8 and "every cell is finished" in proc.stderr
    assert sorted(p.name for p in (root / "cells").iterdir()) == dirs and not (root / "attempts").exists()
    assert {p: p.stat().st_mtime_ns for p in (root / "cells").glob("*/metrics.json")} == before


def test_an_undeclared_difference_is_flagged(smoke, tmp_path):
    """A cell whose config differs from the others in a key no axis declares (as after editing
    conf/ between two runs of a study) is listed in the report's what-differs table."""
    import shutil

    root, _ = smoke
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    cell = copy / "cells" / "ss_joint-pipelined-w2-builtin-s12-r0"
    cfg = yaml.safe_load((cell / "config.yaml").read_text())
    cfg["train"]["lr"] = cfg["train"]["lr"] * 2
    (cell / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = study("report", copy, "--markdown")
    assert proc.returncode == 0, proc.stderr[-3000:]
    differs = json.loads((copy / "report" / "report.json").read_text())["tables"]["differs"]
    assert [(d["cell"], d["key"]) for d in differs] == [(cell.name, "train.lr")]
    assert "train.lr" in proc.stdout.split("## What differs")[1]


def test_killed_cell_is_rerun_and_failed_cell_reported(tmp_path):
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg.update(name="kill", axes={"strategy": ["ddp"], "sampler": ["sync"], "world_size": [1], "budget": ["s60", "bad"]},
               levels={"budget": {"s60": ["train.max_steps=60", "train.ckpt_every=10"],
                                  "bad": ["train.max_steps=0"]}})  # max_steps must be > 0: the cell fails
    path = tmp_path / "kill.yaml"
    path.write_text(yaml.safe_dump(cfg))
    root = tmp_path / "kill"
    proc = subprocess.Popen([sys.executable, "-m", "distnerf.study", "run", str(path), str(root)], cwd=REPO,
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    rows = root / "cells" / "ddp-sync-w1-s60-r0" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (rows.exists() and '"loss"' in rows.read_text()):
        time.sleep(0.2)
    assert rows.exists(), "the first cell never trained a step"
    for sig in (signal.SIGSTOP, signal.SIGKILL):  # the runner, launch script, torchrun, rank: killed mid-way
        for pid in [proc.pid, *descendants(proc.pid)]:  # (stopped first: nothing forks while the tree is listed)
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    proc.wait()
    again = study("run", path, root)
    assert again.returncode == 1, again.stderr[-3000:]  # the bad cell failed
    assert "ddp-sync-w1-s60-r0: interrupted; its directory moved to" in again.stderr
    kept = list((root / "attempts").iterdir())
    assert [p.name for p in kept] == ["ddp-sync-w1-s60-r0.0"] and (kept[0] / "metrics.jsonl").exists()
    steps = [json.loads(ln)["step"] for ln in rows.read_text().splitlines() if '"loss"' in ln]
    assert steps[0] == 1 and steps[-1] == 60  # run again from scratch, to the end
    bad = json.loads((root / "cells" / "ddp-sync-w1-bad-r0" / "study_cell.json").read_text())
    assert bad["status"] == "failed" and bad["rc"] != 0
    assert "not finished: ddp-sync-w1-bad-r0 (re-run with --retry-failed)" in again.stderr
    third = study("run", path, root)  # failed cells are skipped unless asked
    assert third.returncode == 1 and "skip ddp-sync-w1-bad-r0: failed before" in third.stderr
    assert "ddp-sync-w1-s60-r0: finished" in third.stderr
