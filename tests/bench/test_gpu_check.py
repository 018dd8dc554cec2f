"""``tools/gpu_check.sh --cpu --run all`` (bench/gpu/check.sh, bench/gpu/check.py): every section of every run of
the GPU check's plan runs end to end on the CPU (toy sizes, gloo, the built-in scene) and reports ``ok`` or, for the
GPU-only ones, ``skipped: reason``; the two-rank section really trains, checkpoints and resumes two gloo ranks (on a
GPU both share it: issue 50 item 6), the sweep's rows each ran in their own process, and the one-GPU study's config
expands. The plan itself (caps, order): tests/bench/test_gpu_check_plan.py."""
from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch

from bench.gpu.check import RUNS, plan
from tests.conftest import REPO

NEED_GPU = {"cuda_tests", "hta_overlap", "sync_debug", "nsys", "study"}


def test_gpu_check_refuses_a_run_not_in_the_plan(tmp_path):
    proc = subprocess.run(["bash", "tools/gpu_check.sh", "--cpu", "--run", "99", "--out", str(tmp_path / "out"),
                           "--runs", str(tmp_path / "runs")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no run '99'" in proc.stderr, proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="--cpu is the check of CPU-only machines")
def test_gpu_check_cpu_mode_runs_every_section_of_every_run(tmp_path):
    out, runs = tmp_path / "out", tmp_path / "runs"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("GPU_CHECK_ONLY", None)
    proc = subprocess.run(["bash", "tools/gpu_check.sh", "--cpu", "--run", "all", "--out", str(out), "--runs", str(runs)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert (out / "log.txt").exists()
    assert summary["mode"] == "cpu" and list(summary["sections"]) == [name for name, _ in plan("all")]
    sections = summary["sections"]
    for run, planned in RUNS.items():  # every run's sections, each ok or skipped with its reason
        for name, _ in planned:
            status = sections[name]["status"]
            if name in NEED_GPU:
                assert status.startswith("skipped: ") and len(status) > len("skipped: ") + 5, (run, name, status)
            elif name == "sync_counter" and not (REPO / "bench" / "throughput" / "syncs.py").exists():
                assert status.startswith("skipped: "), status
            else:
                assert status == "ok", (run, name, status, proc.stdout[-3000:])
            assert 0 < sections[name]["section_s"] <= sections[name]["cap_s"] + 5, (name, sections[name])
    assert sections["env"]["cuda_available"] is False and sections["env"]["dev_shm_free_mb"] is not None
    assert all(sections["env"][k] for k in ("cc", "gcc", "triton"))  # a version or "absent"
    paths = sections["paths"]["runs"]  # what users run: fusion, joint, sampler=device; bf16 needs CUDA
    assert [paths[p]["status"] for p in ("ss_fusion", "sampler_device")] == ["ok"] * 2, paths
    assert "ss_joint" not in paths  # --cpu: joint ss runs in two_ranks instead
    assert paths["bf16"]["status"].startswith("skipped: ") and paths["ss_fusion"]["psnr"] > 0
    assert sections["cuda_tests"]["failed"] == 0 and sections["cuda_tests"]["skipped"] >= 1
    # the sweep: eager and the graph's body trained and timed, each in its own process; the compiled modes skipped
    first, rest = sections["sweep"]["configs"], sections["sweep_more"]["configs"]
    assert [(c["mode"], c["samples_per_step"]) for c in first + rest] == [
        ("eager", 1024), ("graphed", 1024), ("graph", 1024), ("eager", 4096), ("compiled", 1024)]
    for c in (first[0], first[2], rest[0]):
        assert c["status"] == "ok" and c["rays_per_s"] > 0 and c["process_s"] > 0 and os.path.exists(c["log"]), c
    assert "step.cuda_graph=true" in first[2]["overrides"], first[2]
    assert all(c["status"].startswith("skipped: needs CUDA") for c in (first[1], rest[1]))
    for name, steps in (("lego_1min", 20), ("lego_2min", 8), ("lego_5min", 8)):
        quality = sections[name]
        assert quality["step"] == steps and 0 < quality["psnr"] < 60 and quality["eval_rays_per_s"] > 0, name
        assert quality["train_rays_per_s_median"] > 0 and quality["num_views"] == 2 and quality["eval_seconds"] > 0
        assert quality["psnr_25_views"] is None  # 2 views: no 25-view subset
    for name in ("ddp_trace", "ss_trace"):
        trace = sections[name]
        assert trace["backend"] == "gloo" and trace["world_size"] == 1 and trace["step_ms_median"] > 0
        assert trace["global_rays_per_s"] > 0 and trace["traces"], name
        assert "skipped" in trace["hta"]  # CPU traces have no kernels
    assert sections["sync_debug"]["models"]["grid"]["error"] is None
    assert len(sections["sync_debug"]["models"]["grid"]["per_step"]) == 4
    assert 0 < sections["ops"]["totals"]["smoke_grid"] and sections["ops"]["by_section"]["smoke_grid"]["forward"] > 0
    two = sections["two_ranks"]["runs"]  # --cpu: joint ss only, 2 gloo ranks, a checkpoint at 4, resumed to 6
    assert list(two) == ["ss_joint"] and two["ss_joint"]["resumed_at"] == [4] and two["ss_joint"]["last_step"] == 6
    assert (two["ss_joint"]["world_size"], two["ss_joint"]["backend"], two["ss_joint"]["device"]) == (2, "gloo", "cpu")
    assert two["ss_joint"]["psnr"] > 0
    assert sections["study"]["status"] == "skipped: needs CUDA (conf/study/gpu_one.yaml lists 4 cells)"
    if sections["sync_counter"]["status"] == "ok":
        assert sections["sync_counter"]["configs"]["grid"]["count_step"] >= 0
    assert summary["wall_s"] < summary["budget_s"]
