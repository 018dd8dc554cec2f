"""Profiling through the real CLI: one 2-rank gloo DDP run with ``profiler=trace`` shared by
every assertion, plus two short single-process runs (exposed communication zero, A/B compare).

The 2-rank run uses several gradient buckets (``bucket_cap_mb=1``, dense exchange)
and the grid model's colour MLP, so that communication can overlap backward and the
forward has a network sub-phase.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from distnerf.observe.logger import read_metrics_log
from distnerf.observe.traces import read_trace
from tests.conftest import run_cli, torchrun

# the breakdown is checked against the trace's clock to 0.5 ms: no other test's processes beside it
pytestmark = pytest.mark.exclusive

COMMON = ["experiment=smoke", "device=cpu", "monitor.progress=false", "checkpoints.every=-1", "sampler=sync", "monitor.log_every=4",
          "eval.num_views=1"]
# batches large enough that one OS time slice (~4 ms, the machine is shared) is not 5% of a step
TRACE_RUN = ["train.max_steps=14", "train.global_rays=4096", "model.color=mlp", "strategy.sparse_min_numel=null", "strategy.bucket_cap_mb=1",
             "profiler=trace", "profiler.trace.wait=5", "profiler.trace.warmup=1", "profiler.trace.active=2",
             # the hang-report thread wakes every dist_progress_s and may take the GIL across a phase
             # boundary of a traced step (up to the 5 ms switch interval), which the two clocks below
             # are compared to 0.5 ms: not within these 14 steps
             "dist_progress_s=3600"]


def rank_file(run: Path, rank: int) -> dict:
    return json.loads((run / "profile" / f"rank_{rank}.json").read_text())


@pytest.fixture(scope="session")
def profiled_runs(tmp_path_factory, synthetic_cache):
    root = tmp_path_factory.mktemp("profile")
    ddp, single, single_b = root / "ddp2", root / "single", root / "single_lr"
    cache = f"dataset.cache_dir={synthetic_cache}"
    proc = run_cli(torchrun(2) + ["-m", "distnerf.train", *COMMON, *TRACE_RUN, f"run_dir={ddp}", cache])
    # NVTX ranges on: a no-op without CUDA (and no error)
    base = [sys.executable, "-m", "distnerf.train", *COMMON, "train.max_steps=10", "train.global_rays=2048",
            "profiler.nvtx=true", cache]
    run_cli(base + [f"run_dir={single}"])
    run_cli(base + [f"run_dir={single_b}", "optim.lr=2e-3", "eval.enabled=false"])
    report = run_cli([sys.executable, "-m", "distnerf.profile", "report", str(ddp)])
    return {"ddp": ddp, "single": single, "single_b": single_b, "train_log": proc.stderr, "report": report}


@pytest.mark.parametrize("which", ["ddp", "single"])
def test_unattributed_share_at_most_5_percent(profiled_runs, which):
    run = profiled_runs[which]
    ranks = 2 if which == "ddp" else 1
    for rank in range(ranks):
        data = rank_file(run, rank)
        share = data["summary"]["unattributed_share"]
        assert share["median"] <= 0.05 and share["p95"] <= 0.05, (rank, share)
        assert all(rec["unattributed"] >= 0 for rec in data["steps"])
    # the breakdown's step times are the trainer's own step clock (independent timer)
    rows = read_metrics_log(run)
    train_seconds = [r["train_seconds"] for r in rows if "loss" in r][-1]
    steps = rank_file(run, 0)["steps"]
    assert sum(r["step_s"] for r in steps) == pytest.approx(train_seconds, rel=0.02)


def test_breakdown_matches_the_trace_clock(profiled_runs):
    """On the traced steps torch.profiler's own spans of the phases (``phase:*`` ranges, the
    profiler's clock) are an independent clock for the breakdown (perf_counter marks).

    A range opens before its phase's first mark and closes after its last, so the breakdown
    may only be shorter: by microseconds, or by a time slice when the process is preempted
    in between (the machine is shared), hence 0.5 ms one way and 5 ms the other.
    """
    tight, loose = 0.5e-3, 5e-3
    run = profiled_runs["ddp"]
    for rank in range(2):
        data = rank_file(run, rank)
        records = {rec["step"]: rec for rec in data["steps"]}
        trace = read_trace(next((run / "profile" / "traces").glob(f"rank_{rank}.*")))
        events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
        steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
        assert len(steps) == 2  # profiler.trace.active=2
        for step in steps:
            rec = records[int(step["name"].split("#")[1])]  # the schedule advances once per step from step 0
            phases = sorted((e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6, e["name"][len("phase:"):]) for e in events
                            if e["name"].startswith("phase:") and step["ts"] <= e["ts"] < step["ts"] + step["dur"])
            names = [name for *_, name in phases]
            assert names == [p for p in data["phases"] if p in names] and len(set(names)) == len(names), names
            assert {"input_wait", "forward", "step_sync", "backward", "optimizer"} <= set(names)
            for start, end, name in phases:  # backward's span holds the exposed communication too
                measured = rec[name] + (rec["exposed_comm"] if name == "backward" else 0.0)
                assert end - start - loose <= measured <= end - start + tight, (rank, rec["step"], name)
            covered = phases[-1][1] - phases[0][0]  # first phase's start to last phase's end
            outside = covered - sum(end - start for start, end, _ in phases)
            assert outside - tight <= rec["unattributed"] <= outside + loose, (rank, rec["step"])
            assert covered - tight <= rec["step_s"] <= covered + loose, (rank, rec["step"])
            assert rec["checkpoint"] == 0.0 and "checkpoint" not in names


def test_exposed_comm_positive_in_2rank_ddp_and_zero_single(profiled_runs):
    for rank in range(2):
        keys = rank_file(profiled_runs["ddp"], rank)["summary"]["keys"]
        assert keys["exposed_comm"]["median"] > 0 and keys["comm_bytes"]["median"] > 0
        assert keys["comm_total_s"]["median"] >= keys["exposed_comm"]["median"]
    single = rank_file(profiled_runs["single"], 0)
    assert all(r["exposed_comm"] == 0.0 for r in single["steps"])
    assert "comm_bytes" not in single["summary"]["keys"]
    rows = read_metrics_log(profiled_runs["ddp"])
    logged = [r for r in rows if "loss" in r]
    assert all(r["time_exposed_comm"] > 0 and r["field_evals"] > 0 for r in logged)
    assert any(r.get("event") == "profile_summary" and "profile/rank_1/exposed_comm_share" in r for r in rows)


def test_forward_has_network_subphase(profiled_runs):
    keys = rank_file(profiled_runs["ddp"], 0)["summary"]["keys"]
    assert keys["forward.color_net"]["mean"] > 0 and keys["forward.other"]["mean"] > 0
    assert keys["forward_ns_per_sample"]["median"] > 0


def test_one_parseable_trace_per_rank(profiled_runs):
    traces = sorted((profiled_runs["ddp"] / "profile" / "traces").iterdir())
    assert [p.name.split(".")[0] for p in traces] == ["rank_0", "rank_1"]
    for rank, path in enumerate(traces):
        trace = read_trace(path)
        assert trace["distributedInfo"]["rank"] == rank and trace["distributedInfo"]["world_size"] == 2
        names = {e.get("name") for e in trace["traceEvents"]}
        assert {"phase:forward", "phase:backward", "gloo:all_reduce"} <= names
        assert f"trace {path}" in profiled_runs["train_log"] and "MB" in profiled_runs["train_log"]


def test_report_on_the_trace_run(profiled_runs):
    prof = profiled_runs["ddp"] / "profile"
    report = json.loads((prof / "report.json").read_text())
    assert set(report["per_rank"]) == {"0", "1"}
    assert (prof / "breakdown.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (prof / "report.md").read_text()
    assert "unattributed share of the step" in md and "rank imbalance" in md
    assert report["rank_imbalance"]["median"] >= 1.0
    assert 0 < report["exposed_comm_share"] < 1
    assert report["top_ops"]["0"]["ops"] and not any(o["name"].startswith("phase:")
                                                     for o in report["top_ops"]["0"]["ops"])
    assert "no GPU kernels" in report["hta"]["skipped"]
    for rank in ("0", "1"):  # gradient all-reduces in backward; the step agreement's all-reduce launched after the
        # forward, run by gloo's thread while the backward runs, only waited for in step_sync (issue 50 item 2)
        phases = report["collectives"][rank]["gloo:all_reduce"]["phases"]
        assert phases.get("step_sync", 0) == 0 and phases["backward"] >= 2 and sum(phases.values()) >= 4, phases


def test_cpu_overlap_of_2rank_run_is_computed(profiled_runs):
    report = json.loads((profiled_runs["ddp"] / "profile" / "report.json").read_text())
    for rank in ("0", "1"):
        c = report["cpu_overlap"][rank]
        assert c["steps"] == 2 and c["collectives"] >= 2  # two traced steps, several buckets each
        assert c["comm_s"] > 0 and 0 < c["overlapped_s"] <= c["comm_s"]
        assert 0 < c["overlap_fraction"] <= 1
        assert c["backward_compute_s"] <= c["backward_s"]


def test_compare_refuses_undeclared_difference(profiled_runs):
    a, b = str(profiled_runs["single"]), str(profiled_runs["single_b"])
    cmd = [sys.executable, "-m", "distnerf.profile", "compare", a, b]
    with pytest.raises(AssertionError, match="optim.lr: 0.001 vs 0.002"):
        run_cli(cmd)
    out = run_cli(cmd + ["--vary", "optim.lr", "--vary", "eval.enabled"]).stdout
    assert "| step_s |" in out and "| forward |" in out and "WARNING" not in out
    forced = run_cli(cmd + ["--force"])
    assert "WARNING" in forced.stdout and "optim.lr" in forced.stdout


def test_compare_refuses_runs_on_another_world_size(profiled_runs):
    cmd = [sys.executable, "-m", "distnerf.profile", "compare", str(profiled_runs["single"]),
           str(profiled_runs["ddp"]), "--vary", "train", "--vary", "model", "--vary", "strategy", "--vary", "profiler"]
    with pytest.raises(AssertionError, match="env.world_size: 1 vs 2"):
        run_cli(cmd)
