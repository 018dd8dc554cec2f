"""Exact checkpoint/resume through the real CLI: single process and 2-rank torchrun (gloo).

2N steps straight must equal N steps + resume + N steps bit for bit, across grid
resolution changes before and after the resume point, and an uncommitted (torn)
newer checkpoint must be ignored. Runs use the pipelined sampler with 2 workers per
rank (its state, the next step, is in the rank files); ``sampler=sync`` must train
the same model bit for bit. Both run directories hold a ``config.yaml`` in the layout from before the
``train`` section was split by concern when they are resumed and re-rendered: old run directories still
resume and render.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml

from distnerf import checkpoint as ckpt
from distnerf.observe.logger import read_metrics_log
from tests.conftest import run_cli, torchrun

N = 4
COMMON = ["experiment=smoke", "device=cpu", "monitor.progress=false", "checkpoints.every=0", "monitor.log_every=1",
          "model.resolutions=[24,32,40]", "model.upsample_steps=[2,5]", "model.occupancy_every=3",
          "sampler=pipelined", "sampler.num_workers=2", "sampler.prefetch=3"]


def launch(nproc: int, run_dir: Path, cache: Path, extra: list[str]):
    base = [sys.executable, "-m", "distnerf.train"] if nproc == 1 else torchrun(nproc) + ["-m", "distnerf.train"]
    return run_cli(base + COMMON + [f"run_dir={run_dir}", f"dataset.cache_dir={cache}"] + extra)


# the keys that were renamed when they left train (the others kept their names)
OLD_NAMES = {"step.probe_every": "graph_probe_every", "checkpoints.every": "ckpt_every",
             "checkpoints.every_minutes": "ckpt_every_minutes", "checkpoints.at_minutes": "ckpt_minutes",
             "checkpoints.keep": "keep_checkpoints", "checkpoints.background": "ckpt_async"}
OLD_LAYOUT = Path(__file__).resolve().parents[1] / "fixtures" / "config_before_sections.yaml"


def as_written_before_the_sections(run_dir: Path) -> None:
    """Rewrite ``run_dir/config.yaml`` as the code before the sections wrote it: every key of ``optim``,
    ``step``, ``checkpoints`` and ``monitor`` back in ``train``, under its old name (the fixture, a config the
    old code wrote, has exactly these train keys)."""
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    for section in ("optim", "step", "checkpoints", "monitor"):
        for key, value in cfg.pop(section).items():
            cfg["train"][OLD_NAMES.get(f"{section}.{key}", key)] = value
    assert set(cfg["train"]) == set(yaml.safe_load(OLD_LAYOUT.read_text())["train"])
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))


def final_state(run_dir: Path) -> dict:
    found = ckpt.latest(run_dir / "checkpoints")
    return torch.load(found / "model.pt", map_location="cpu", weights_only=False)


@pytest.fixture(scope="session", params=[1, 2], ids=["single", "ddp2"])
def resume_runs(request, tmp_path_factory, synthetic_cache):
    nproc = request.param
    root = tmp_path_factory.mktemp(f"resume_{nproc}")
    straight, resumed = root / "straight", root / "resumed"
    launch(nproc, straight, synthetic_cache, [f"train.max_steps={2 * N}", "eval.num_views=2"])
    launch(nproc, resumed, synthetic_cache, [f"train.max_steps={N}", "eval.enabled=false"])
    as_written_before_the_sections(straight)  # re-rendered below (test_run_dir_has_one_config_log_metrics...)
    as_written_before_the_sections(resumed)
    # a torn newer checkpoint: rank 0's files written, the other rank died before the manifest
    first = ckpt.latest(resumed / "checkpoints")
    torn = ckpt.step_dir(resumed / "checkpoints", N + 2)
    torn.mkdir()
    shutil.copy(first / "model.pt", torn / "model.pt")
    shutil.copy(first / "rank_0.pt", torn / "rank_0.pt")
    proc = launch(nproc, resumed, synthetic_cache, [f"train.max_steps={2 * N}", "resume=true", "eval.enabled=false"])
    return {"nproc": nproc, "straight": straight, "resumed": resumed, "resume_log": proc.stderr, "first": first,
            "cache": synthetic_cache}


def test_resume_is_bit_exact(resume_runs):
    a, b = final_state(resume_runs["straight"]), final_state(resume_runs["resumed"])
    assert a["step"] == b["step"] == 2 * N
    assert a["model"]["grid_resolution"] == 40  # both resolution changes happened
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys()
    for i in sa:
        for k in sa[i]:
            assert torch.equal(torch.as_tensor(sa[i][k]), torch.as_tensor(sb[i][k])), (i, k)


def test_sampler_state_in_rank_files(resume_runs):
    found = ckpt.latest(resume_runs["resumed"] / "checkpoints")
    for rank in range(resume_runs["nproc"]):
        state = torch.load(found / f"rank_{rank}.pt", map_location="cpu", weights_only=False)["sampler"]
        assert state["kind"] == "pipelined" and state["num_workers"] == 2
        assert state["next_step"] == 2 * N and state["stream"] == rank


def test_sync_sampler_trains_the_same_model(resume_runs, tmp_path):
    if resume_runs["nproc"] != 1:
        pytest.skip("checked once")
    launch(1, tmp_path / "sync", resume_runs["cache"], [f"train.max_steps={2 * N}", "eval.enabled=false",
                                                         "sampler.name=sync"])
    a, b = final_state(resume_runs["straight"]), final_state(tmp_path / "sync")
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k


def test_torn_checkpoint_ignored_and_resume_from_committed(resume_runs):
    assert f"resumed from {resume_runs['first']}" in resume_runs["resume_log"]
    # the torn directory is older than the new committed one and was pruned or left uncommitted
    for d in (resume_runs["resumed"] / "checkpoints").glob("step_*"):
        if d.name == f"step_{N + 2:08d}":
            with pytest.raises(ckpt.CheckpointError):
                ckpt.read_manifest(d)


def test_metrics_log_has_no_duplicate_steps(resume_runs):
    rows = read_metrics_log(resume_runs["resumed"])
    steps = [r["step"] for r in rows if "loss" in r]
    assert steps == sorted(set(steps)) and steps[-1] == 2 * N


def test_input_wait_and_copy_logged_and_summarised(resume_runs):
    run = resume_runs["straight"]
    rows = read_metrics_log(run)
    steps = [r for r in rows if "loss" in r]
    assert all(r["time_input_wait"] >= 0 and r["time_copy"] >= 0 for r in steps)
    assert "time_input" not in steps[0]
    summary = [r for r in rows if r.get("event") == "input_summary"]
    assert len(summary) == 1 and summary[0]["sampler"] == "pipelined" and 0 <= summary[0]["input_wait_share"] < 1
    assert "input (sampler=pipelined): waited" in (run / "train.log").read_text()


def test_manifest_lists_every_rank_file(resume_runs):
    found = ckpt.latest(resume_runs["straight"] / "checkpoints")
    manifest = ckpt.read_manifest(found, verify=True)
    names = set(manifest["files"])
    assert names == {"model.pt"} | {f"rank_{r}.pt" for r in range(resume_runs["nproc"])}
    assert manifest["world_size"] == resume_runs["nproc"]


def test_run_dir_has_one_config_log_metrics_and_renders(resume_runs):
    run = resume_runs["straight"]
    assert sorted(p.name for p in run.glob("*.yaml")) == ["config.yaml"]
    assert sorted(p.name for p in run.glob("*.log")) == ["train.log"]
    assert (run / "metrics.jsonl").exists() and (run / "metrics.json").exists()
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["protocol"]["num_views"] == 2 and len(list((run / "test").glob("*_rgb.png"))) == 2
    # re-render the run directory (on the same number of processes)
    nproc = resume_runs["nproc"]
    base = [sys.executable, "-m", "distnerf.render"] if nproc == 1 else torchrun(nproc) + ["-m", "distnerf.render"]
    run_cli(base + [f"run_dir={run}"])
    again = json.loads((run / "render" / "metrics.json").read_text())
    assert again["psnr"] == pytest.approx(metrics["psnr"], abs=1e-6)


def test_changed_model_config_refuses_resume(resume_runs):
    if resume_runs["nproc"] != 1:
        pytest.skip("checked once")
    with pytest.raises(AssertionError, match="model config differs"):
        launch(1, resume_runs["resumed"], resume_runs["cache"], ["train.max_steps=10", "resume=true",
                                                                 "model.step_ratio=0.7"])


def test_world_size_change_warns(resume_runs):
    if resume_runs["nproc"] != 2:
        pytest.skip("needs the 2-rank checkpoint")
    proc = launch(1, resume_runs["resumed"], resume_runs["cache"], [f"train.max_steps={2 * N + 1}", "resume=true",
                                                                    "eval.enabled=false"])
    assert "not bit-exact" in proc.stderr


def test_every_checkpoint_file_is_data_only(resume_runs):
    """Every .pt of a ddp (and single-process) run loads with weights_only=True: no pickled code."""
    files = sorted((resume_runs["straight"] / "checkpoints").glob("step_*/*.pt"))
    assert {p.name for p in files} >= {"model.pt", "rank_0.pt"}
    for p in files:
        torch.load(p, map_location="cpu", weights_only=True)
