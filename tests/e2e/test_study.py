"""``python -m distnerf.study`` end to end: conf/study/smoke.yaml (2 strategies x world sizes 1 and
2 x the sync sampler, the pipelined one at 2 ranks, and ddp at 4 ranks: 7 real torchrun cells), its report
with the scaling model checked out of sample at W = 4, a re-run that trains nothing, a cell
killed mid-way that is run again, an untimed cell stopped by SIGTERM that resumes from its checkpoint, a
study edited between a stop and its re-run (the changed cells set aside and run again), a failing cell,
and an undeclared difference flagged."""
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

from distnerf.study.collect import cell_figures
from distnerf.observe.logger import read_metrics_log
from tests.conftest import REPO
from tests.launch.conftest import descendants

ENV = {**os.environ, "WANDB_MODE": "disabled"}
SMOKE = REPO / "conf" / "study" / "smoke.yaml"


def study(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "distnerf.study", *map(str, args)], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and every descendant (stopped first: nothing forks while the tree is listed)."""
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in [proc.pid, *descendants(proc.pid)]:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    proc.wait()


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The smoke study, its runner killed (with the cell's torchrun and ranks) while the fourth
    cell runs, then run again: the interrupted cell is set aside and run from scratch."""
    root = tmp_path_factory.mktemp("study") / "smoke"
    proc = subprocess.Popen([sys.executable, "-m", "distnerf.study", "run", str(SMOKE), str(root)], cwd=REPO,
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    third = root / "cells" / "ddp-pipelined-w2-builtin-s12-r0"  # the fourth cell; run order: plan.expand
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None and not (third / "train.log").exists():
        time.sleep(0.2)
    assert (third / "train.log").exists(), "the fourth cell never started"
    kill_tree(proc)
    assert not (third / "metrics.json").exists()  # killed mid-way
    again = study("run", SMOKE, root)
    assert again.returncode == 0, again.stderr[-5000:]
    return root, again


def test_a_cell_killed_mid_way_is_set_aside_and_run_again(smoke):
    root, again = smoke
    name = "ddp-pipelined-w2-builtin-s12-r0"
    assert f"{name}: interrupted; its directory moved to" in again.stderr
    assert again.stderr.count(": finished") == 3  # the three cells before it are not trained again
    kept = list((root / "attempts").iterdir())
    assert [p.name for p in kept] == [f"{name}.0"] and (kept[0] / "train.log").exists()
    rows = read_metrics_log(root / "cells" / name)
    steps = [r["step"] for r in rows if "loss" in r]
    assert steps[-1] == 12 and not any(r.get("event") == "resumed" for r in rows)  # from scratch


def test_smoke_study_runs_every_cell_and_reports_them(smoke):
    root, _ = smoke
    report = json.loads((root / "report" / "report.json").read_text())
    cells = report["cells"]
    assert len(cells) == 7 and all(c["status"] == "done" for c in cells), [(c["id"], c["status"]) for c in cells]
    assert {(c["values"]["strategy"], c["values"]["sampler"], c["values"]["world_size"]) for c in cells} == {
        (s, p, w) for s in ("ddp", "ss_joint") for p in ("sync", "pipelined") for w in (1, 2)
        if (p, w) != ("pipelined", 1)} | {("ddp", "sync", 4)}
    for c in cells:  # ordinary run directories, with the record of how each ran
        run = root / "cells" / c["id"]
        assert (run / "metrics.json").exists() and (run / "profile" / "rank_0.json").exists()
        record = json.loads((run / "study_cell.json").read_text())
        assert record["status"] == "done" and record["rc"] == 0 and record["load"]["load1"] >= 0
        assert len(list((run / "profile").glob("rank_*.json"))) == c["values"]["world_size"]
    t = report["tables"]
    assert len(t["breakdown"]) == 7
    for row in t["breakdown"]:  # the stacked shares of a step sum to one
        assert sum(row[p] for p in ("input_wait", "copy", "forward", "backward", "exposed_comm", "step_sync",
                                    "optimizer", "unattributed", "other")) == pytest.approx(1.0, abs=1e-6)
    kinds = {(r["kind"], r["world_size"]) for r in t["sync"]}
    assert kinds == {("ddp all-reduce", 2), ("ddp all-reduce", 4), ("ss joint exchange", 2)}
    assert all(r["bytes_per_step"] > 0 for r in t["sync"])
    assert {r["world_size"] for r in t["inference"]} == {1, 2} and all(r["fused_over_single"] > 0
                                                                      for r in t["inference"])
    piped = [r for r in t["input"] if r["sampler"] == "pipelined"]
    assert len(piped) == 2 and all(r["speedup_over_sync"] > 0 and r["ideal_bound"] >= 1 for r in piped)
    assert t["scaling"]["predictions"]["ib400"][-1]["world_size"] == 1024
    # the check is out of sample: fitted at W <= 2, it predicts the ddp cell at W = 4 (its own measured
    # step time beside the prediction; within the tolerance or not, both are reported)
    (row,) = t["scaling_check"]["rows"]
    w4 = next(c for c in cells if c["values"]["world_size"] == 4)
    assert (row["strategy"], row["world_size"]) == ("ddp", 4) and t["scaling_check"]["host_collectives"]
    assert row["step_s"] == pytest.approx(w4["figures"]["step_s_median"]) and row["predicted_s"] > 0
    assert row["relative_error"] == pytest.approx((row["predicted_s"] - row["step_s"]) / row["step_s"])
    assert row["within"] == (abs(row["relative_error"]) <= row["tolerance"])
    assert t["differs"] == []


def test_the_touched_share_reads_every_finished_cell(smoke):
    """distnerf.study.touched on real run directories (checkpoints, fusion loading, training rays): a
    [touched, rows] pair per model (one for ddp, one per region for joint ss), the share their ratio."""
    from distnerf.study.touched import study_touched

    root, _ = smoke
    rows = study_touched(root, batches=2, rays=128)["rows"]
    assert len(rows) == 7
    for r in rows:
        regions = r["values"]["world_size"] if r["values"]["strategy"] == "ss_joint" else 1
        assert len(r["per_model"]) == regions and all(0 < t <= v for t, v in r["per_model"]), r
        assert r["share"] == pytest.approx(r["touched"] / r["vertices"]) and r["step"] == 12 and r["psnr"] > 0


def test_report_figures_open_and_the_html_links_them(smoke):
    root, _ = smoke
    out = root / "report"
    names = json.loads((out / "report.json").read_text())["figures"]
    assert set(names) == {"breakdown.png", "sync.png", "inference.png", "input.png", "quality.png", "scaling.png",
                          "ranks.png", "ranks_views.png"}  # one budget: quality against ranks, no capacity curve
    html = (out / "report.html").read_text()
    for name in names:
        with Image.open(out / name) as im:
            im.verify()
        assert f"href='{name}'" in html
    assert html.count("data:image/png;base64,") == len(names)  # self-contained: the figures embedded
    md = (out / "report.md").read_text()
    assert "## Training step breakdown" in md and "## Scaling model" in md


def test_a_report_json_alone_gives_the_same_html_page(smoke, tmp_path):
    """A committed report (report.json and its PNGs, without the runs) gives its report.html
    again: the same sections and embedded figures as the page the run wrote; a figure it
    names that is missing is refused, naming it."""
    import shutil

    from distnerf.study.__main__ import main as study_main

    out = smoke[0] / "report"
    copy = tmp_path / "committed"
    copy.mkdir()
    names = json.loads((out / "report.json").read_text())["figures"]
    for name in ["report.json", *names]:
        shutil.copy(out / name, copy / name)
    assert study_main(["report", str(copy / "report.json"), "--html"]) == 0
    assert (copy / "report.html").read_text() == (out / "report.html").read_text()
    # its tables derived again from the figures the JSON holds (a changed model, no runs): the same tables
    assert study_main(["report", str(copy / "report.json"), "--rederive"]) == 0
    rederived, written = (json.loads(p.read_text()) for p in (copy / "report.json", out / "report.json"))
    assert rederived["tables"] == written["tables"] and rederived["cells"] == written["cells"]
    assert study_main(["report", str(copy), "--rederive"]) == 2  # a directory, not a report.json
    (copy / "other.json").write_text('{"runs": []}')
    assert study_main(["report", str(copy / "other.json"), "--rederive"]) == 2  # not a study report
    (copy / names[0]).unlink()
    assert study_main(["report", str(copy / "report.json"), "--html"]) == 2


def test_rerun_skips_finished_cells(smoke):
    root, _ = smoke
    before = {p: p.stat().st_mtime_ns for p in (root / "cells").glob("*/metrics.json")}
    dirs = sorted(p.name for p in (root / "cells").iterdir())
    proc = study("run", SMOKE, root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count(": finished") == 7 and "every cell is finished" in proc.stderr
    assert sorted(p.name for p in (root / "cells").iterdir()) == dirs and len(list((root / "attempts").iterdir())) == 1
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
    cfg["optim"]["lr"] = cfg["optim"]["lr"] * 2
    cfg["dataset"]["resolution"] = 32  # declared by the scene's level (dataset=synthetic), but one scene here
    (cell / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = study("report", copy, "--markdown")
    assert proc.returncode == 0, proc.stderr[-3000:]
    differs = json.loads((copy / "report" / "report.json").read_text())["tables"]["differs"]
    assert [(d["cell"], d["key"]) for d in differs] == [(cell.name, "dataset.resolution"), (cell.name, "optim.lr")]
    assert "optim.lr" in proc.stdout.split("## What differs")[1]


def test_repeats_runs_only_the_first_seeds(tmp_path, capsys):
    from distnerf.study.__main__ import main as study_main

    cfg = yaml.safe_load(SMOKE.read_text())
    cfg.update(name="first", exclude=[], repeats=3, axes={"strategy": ["ddp"], "sampler": ["sync"], "world_size": [1],
                                                          "budget": ["bad"]},
               levels={"budget": {"bad": ["train.max_steps=0"]}})  # refused at once: a cell that fails fast
    path, root = tmp_path / "first.yaml", tmp_path / "first"
    path.write_text(yaml.safe_dump(cfg))
    assert study_main(["run", str(path), str(root), "--repeats", "0"]) == 2
    capsys.readouterr()
    assert study_main(["run", str(path), str(root), "--repeats", "2"]) == 1  # the cells fail, as configured
    unfinished = capsys.readouterr().err.split("not finished:")[-1]
    assert "bad-r0" in unfinished and "bad-r1" in unfinished and "bad-r2" not in unfinished  # r2 was not asked for
    assert study_main(["run", str(path), str(root), "--only", "ss_*"]) == 2  # matches no cell: refused
    assert study_main(["run", str(path), str(root), "--only", "ddp-*", "--repeats", "1"]) == 1  # r0 again
    assert sorted(p.name for p in (root / "cells").iterdir()) == ["ddp-sync-w1-bad-r0", "ddp-sync-w1-bad-r1"]
    seeds = [[o for o in json.loads((root / "cells" / f"ddp-sync-w1-bad-r{r}" / "study_cell.json").read_text())
              ["overrides"] if o.startswith("seed=")] for r in (0, 1)]
    assert seeds == [["seed=0"], ["seed=1"]]  # the config's seeds of those repeats


def test_a_failed_cell_is_reported_and_retried_only_when_asked(tmp_path):
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg.update(name="bad", exclude=[], axes={"strategy": ["ddp"], "sampler": ["sync"], "world_size": [1], "budget": ["bad"]},
               levels={"budget": {"bad": ["train.max_steps=0"]}})  # max_steps must be > 0: the run refuses it
    path, root = tmp_path / "bad.yaml", tmp_path / "bad"
    path.write_text(yaml.safe_dump(cfg))
    first = study("run", path, root)
    assert first.returncode == 1, first.stderr[-3000:]
    record = json.loads((root / "cells" / "ddp-sync-w1-bad-r0" / "study_cell.json").read_text())
    assert record["status"] == "failed" and record["rc"] != 0
    assert "train.max_steps" in (root / "cells" / "ddp-sync-w1-bad-r0" / "launch.log").read_text()
    assert "not finished: ddp-sync-w1-bad-r0 (re-run with --retry-failed)" in first.stderr
    second = study("run", path, root)  # skipped, still reported
    assert second.returncode == 1 and "skip ddp-sync-w1-bad-r0: failed before" in second.stderr
    assert not (root / "attempts").exists()
    third = study("run", path, root, "--retry-failed")
    assert third.returncode == 1 and "ddp-sync-w1-bad-r0: failed before, retried" in third.stderr
    assert [p.name for p in (root / "attempts").iterdir()] == ["ddp-sync-w1-bad-r0.0"]


def test_the_report_goes_to_wandb_as_one_run_of_the_study_group(smoke, tmp_path):
    """The smoke study's cells do not log to W&B (logger.wandb.mode=disabled): neither does its report.
    ``report --wandb offline`` logs every figure as an image of its own size and the headline tables,
    in one run of job type ``report`` in the cells' group, read back with wandb's reader."""
    import shutil

    from distnerf.observe import wandb_records as W

    root, _ = smoke
    assert not (root / "wandb").exists()  # the cells' mode decides
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    proc = study("report", copy, "--wandb", "offline")  # the flag wins over ENV's WANDB_MODE=disabled
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = W.run_files(copy)
    assert f"the report logged to W&B: {path.parent}" in proc.stderr
    records = W.read_records(path)
    meta = W.run_meta(records)
    assert (meta["run_group"], meta["job_type"]) == ("study-smoke", "report")
    assert W.run_config(records)["name"] == "smoke"
    report = json.loads((copy / "report" / "report.json").read_text())
    (row,) = W.history(records).values()
    images = {k: v for k, v in row.items() if isinstance(v, dict) and v["_type"] == "image-file"}
    assert set(images) == {f"report/{Path(name).stem}" for name in report["figures"]}
    for key, image in images.items():
        with Image.open(copy / "report" / f"{key.split('/', 1)[1]}.png") as png, \
                Image.open(path.parent / "files" / image["path"]) as logged:
            assert (image["width"], image["height"]) == png.size == logged.size
    tables = {k: v["nrows"] for k, v in row.items() if isinstance(v, dict) and v["_type"] == "table-file"}
    assert tables == {f"table/{k}": len(v) for k, v in report["tables"].items() if isinstance(v, list) and v
                      and isinstance(v[0], dict)}
    assert tables["table/breakdown"] == 7


def test_an_untimed_cell_stopped_by_sigterm_resumes_from_its_checkpoint(tmp_path):
    """``run`` stopped by SIGTERM mid-cell passes it to the cell's ranks, which checkpoint and exit; run
    again, the untimed cell resumes in place from that checkpoint instead of starting again, and ends
    with the same test PSNR as a second repeat of the same seed that ran uninterrupted (resume is
    bit-exact)."""
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg.update(name="resume", exclude=[], repeats=2, vary_seed=False,
               axes={"strategy": ["ddp"], "sampler": ["sync"], "world_size": [1], "budget": ["s240"]},
               # the grid grows at step 120, after the stop: the size logged at the stop is not the final one
               levels={"budget": {"s240": ["train.max_steps=240", "model.upsample_steps=[120]"]}})
    path, root = tmp_path / "resume.yaml", tmp_path / "resume"
    path.write_text(yaml.safe_dump(cfg))
    first_cell, second_cell = (root / "cells" / f"ddp-sync-w1-s240-r{r}" for r in (0, 1))
    proc = subprocess.Popen([sys.executable, "-m", "distnerf.study", "run", str(path), str(root)], cwd=REPO,
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and not (
            sum("loss" in r for r in read_metrics_log(first_cell, partial_tail=True)) >= 10):
        time.sleep(0.05)
    record = json.loads((first_cell / "study_cell.json").read_text())
    proc.terminate()  # SIGTERM to the runner alone
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "stopped (SIGTERM)" in err, err[-3000:]
    assert not (first_cell / "metrics.json").exists() and not second_cell.exists()
    stopped_at = json.loads(sorted((first_cell / "checkpoints").glob("step_*/manifest.json"))[-1].read_text())["step"]
    assert 0 < stopped_at < 120  # the ranks checkpointed mid-way, before the grid grows

    again = study("run", path, root)
    assert again.returncode == 0, again.stderr[-5000:]
    assert f"ddp-sync-w1-s240-r0: interrupted; resumes from its checkpoint at step {stopped_at} (untimed)" in again.stderr
    assert not (root / "attempts").exists()
    resumed = json.loads((first_cell / "study_cell.json").read_text())
    assert resumed["status"] == "done" and resumed["resumed_from_step"] == stopped_at
    assert resumed["first_started"] == record["started"]
    rows = read_metrics_log(first_cell)
    assert [r["step"] for r in rows if r.get("event") == "resumed"] == [stopped_at]
    assert max(r["step"] for r in rows if "loss" in r) == 240
    psnr = [json.loads((d / "metrics.json").read_text())["psnr"] for d in (first_cell, second_cell)]
    assert psnr[0] == psnr[1]  # the same seed, one run resumed, one not
    # the report's model size is the finished model's, not the one logged when the ranks stopped mid-way
    stopped_size = next(r for r in rows if r.get("event") == "model_size")
    assert stopped_size["step"] == stopped_at
    sizes = [cell_figures(d)["parameters_per_rank"] for d in (first_cell, second_cell)]
    assert sizes[0] == sizes[1] != stopped_size["parameters_per_rank"], (sizes, stopped_size)


def test_a_setting_edited_between_a_kill_and_the_rerun_runs_the_changed_cells_again(tmp_path):
    """Issue 60: a study stopped while its second cell trains (the first finished, the second left with
    a committed checkpoint), its fixed ``dataset.resolution`` edited, then planned again: both cells'
    settings changed, so both are moved to ``superseded/`` (kept, with the changed keys in their record)
    and run from scratch; none is kept at the old resolution or resumed from a checkpoint of it. The
    second run is planned by the runner's own ``plan_actions`` (what ``run`` does before training), so
    no cell trains twice here."""
    from distnerf.study import plan, runner

    cfg = yaml.safe_load(SMOKE.read_text())
    cfg.update(name="edited", exclude=[], axes={"strategy": ["ddp"], "sampler": ["sync"], "world_size": [1],
                                               "budget": ["s4", "s2000"]},
               levels={"budget": {"s4": ["train.max_steps=4"], "s2000": ["train.max_steps=2000"]}})
    assert "dataset.resolution=24" in cfg["fixed"]
    path, root = tmp_path / "edited.yaml", tmp_path / "edited"
    path.write_text(yaml.safe_dump(cfg))
    done, killed = (root / "cells" / f"ddp-sync-w1-{b}-r0" for b in ("s4", "s2000"))
    proc = subprocess.Popen([sys.executable, "-m", "distnerf.study", "run", str(path), str(root)], cwd=REPO,
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and not any(
            "loss" in r for r in read_metrics_log(killed, partial_tail=True)):
        time.sleep(0.05)
    proc.terminate()  # SIGTERM to the runner: the second cell's ranks checkpoint and exit
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert runner.finished(done) and not (killed / "metrics.json").exists()
    stopped_at = runner.resumable_step(killed, plan.expand(plan.load_study(path))[1], runner.read_record(killed))
    assert stopped_at is not None  # what the old runner resumed, at the old resolution

    cfg["fixed"] = [o.replace("dataset.resolution=24", "dataset.resolution=32") for o in cfg["fixed"]]
    path.write_text(yaml.safe_dump(cfg))
    said = []
    todo = runner.plan_actions(root, plan.expand(plan.load_study(path)), retry_failed=False, log=said.append)
    assert [c.id for c in todo] == [done.name, killed.name], said
    for cell, kept in ((done, "metrics.json"), (killed, "checkpoints")):
        moved = root / "superseded" / f"{cell.name}.0"
        assert f"{cell.name}: settings changed since it ran (dataset.resolution: 24 -> 32); its directory moved " \
               f"to {moved}; runs again from scratch" in said, said
        assert not cell.exists() and (moved / kept).exists()  # set aside, nothing deleted
        assert runner.read_record(moved)["superseded"]["changed"] == {"dataset.resolution": ["24", "32"]}
    assert not (root / "attempts").exists()
