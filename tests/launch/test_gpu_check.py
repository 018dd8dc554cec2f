"""``tools/gpu_check.sh --cpu`` (bench/gpu/check.sh, bench/gpu/check.py): the prepared GPU check runs end to end on the CPU (tiny sizes,
gloo, the built-in scene) and its summary has every section, the GPU-only ones marked
``skipped: reason``; the two-rank section really trains, checkpoints and resumes two gloo ranks (on
a GPU both share it: issue 50 item 6), and the one-GPU study's config expands."""
from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch

from tests.conftest import REPO

SECTIONS = ["env", "ops", "cuda_tests", "sweep", "lego_quality", "ddp_trace", "ss_trace", "paths", "two_ranks", "hta_overlap",
            "sync_debug", "sync_counter", "nsys", "study"]
NEED_GPU = {"hta_overlap", "sync_debug", "nsys", "study"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="--cpu is the check of CPU-only machines")
def test_gpu_check_cpu_mode_writes_every_section(tmp_path):
    out, runs = tmp_path / "out", tmp_path / "runs"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", "tools/gpu_check.sh", "--cpu", "--out", str(out), "--runs", str(runs)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert (out / "log.txt").exists()
    assert summary["mode"] == "cpu" and list(summary["sections"]) == SECTIONS
    sections = summary["sections"]
    for name, sec in sections.items():
        status = sec["status"]
        if name in NEED_GPU or name == "cuda_tests":
            assert status.startswith("skipped: ") and len(status) > len("skipped: ") + 5, (name, status)
        elif name == "sync_counter" and not (REPO / "bench" / "throughput" / "syncs.py").exists():
            assert status.startswith("skipped: "), status
        else:
            assert status == "ok", (name, status, proc.stdout[-3000:])
    assert sections["env"]["cuda_available"] is False and sections["env"]["dev_shm_free_mb"] is not None
    paths = sections["paths"]["runs"]  # what users run: fusion, joint, sampler=device; bf16 needs CUDA
    assert [paths[p]["status"] for p in ("ss_fusion", "sampler_device")] == ["ok"] * 2, paths
    assert "ss_joint" not in paths  # --cpu: joint ss runs in two_ranks instead
    assert paths["bf16"]["status"].startswith("skipped: ") and paths["ss_fusion"]["psnr"] > 0
    assert sections["cuda_tests"]["failed"] == 0 and sections["cuda_tests"]["skipped"] >= 1
    sweep = sections["sweep"]["configs"]  # --cpu: eager at two budgets and the graph's body trained and timed,
    # the compiled modes skipped
    assert [c["status"] for c in sweep[:3]] == ["ok"] * 3 and all(c["rays_per_s"] > 0 for c in sweep[:3]), sweep
    assert sweep[2]["mode"] == "graph" and "train.cuda_graph=true" in sweep[2]["overrides"], sweep[2]
    assert all(c["status"].startswith("skipped: needs CUDA") for c in sweep[3:]) and len(sweep) == 5, sweep
    quality = sections["lego_quality"]
    assert quality["step"] == 20 and 0 < quality["psnr"] < 60 and quality["eval_rays_per_s"] > 0
    assert quality["train_rays_per_s_median"] > 0 and quality["num_views"] == 2
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
