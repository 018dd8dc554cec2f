"""``strategy=ss`` through the real CLI: a 2-rank gloo run on the built-in city_small scene with
4 regions (2 per rank), fused rendering from its manifest (one process and across
ranks), and exact resume of the sharded checkpoint."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from distnerf import checkpoint as ckpt
from tests.conftest import run_cli, torchrun

N = 3
BUDGET = 500_000  # parameters per rank: each of a rank's 2 regions gets half
COMMON = ["experiment=smoke", "strategy=ss", "strategy.num_regions=4", "dataset.kind=city_small", "train.progress=false",
          "train.ckpt_every=0", "train.log_every=1", "model.resolutions=[24,32]", "model.upsample_steps=[2]",
          "model.occupancy_every=2", "strategy.context_resolution=12", "sampler=pipelined", "sampler.num_workers=1",
          f"model.max_params={BUDGET}"]


def train(run_dir: Path, cache: Path, extra: list[str]):
    return run_cli(torchrun(2) + ["-m", "distnerf.train"] + COMMON + [f"run_dir={run_dir}",
                                                                      f"dataset.cache_dir={cache}"] + extra)


@pytest.fixture(scope="session")
def ss_runs(tmp_path_factory, synthetic_cache):
    root = tmp_path_factory.mktemp("ss")
    straight, resumed = root / "straight", root / "resumed"
    log = train(straight, synthetic_cache, [f"train.max_steps={2 * N}", "eval.num_views=2"]).stderr
    train(resumed, synthetic_cache, [f"train.max_steps={N}", "eval.enabled=false"])
    train(resumed, synthetic_cache, [f"train.max_steps={2 * N}", "resume=true", "eval.enabled=false"])
    return {"straight": straight, "resumed": resumed, "log": log}


def test_partition_saved_and_routing_reported(ss_runs):
    part = json.loads((ss_runs["straight"] / "partition.json").read_text())
    assert len(part["boxes"]) == 4 and part["overlap"] == 0.15
    assert "training rays crossing each enlarged region" in ss_runs["log"] and "cost per rank" in ss_runs["log"]
    manifest = ckpt.read_manifest(ckpt.latest(ss_runs["straight"] / "checkpoints"), verify=True)
    owner = manifest["region_owner"]  # assigned by measured cost, 2 regions per rank
    assert manifest["strategy"] == "ss" and sorted(owner) == [0, 0, 1, 1]
    table = ss_runs["log"].split("cost per rank")[0].splitlines()[-4:]  # the start-up table's 4 region rows
    assert [int(row.split()[-1]) for row in table] == owner
    assert manifest["partition"] == part
    assert set(manifest["files"]) == ({f"region_{k:03d}.pt" for k in range(4)} | {"optimizer_rank_0.pt",
                                      "optimizer_rank_1.pt", "rank_0.pt", "rank_1.pt"})


def test_parameters_per_rank_are_the_rank_s_own_regions_at_the_budget(ss_runs):
    from distnerf.model import build_model

    rows = [json.loads(line) for line in (ss_runs["straight"] / "metrics.jsonl").read_text().splitlines()]
    size = next(r for r in rows if r.get("event") == "model_size")
    regions = size["parameters_per_region"]
    assert sorted(regions) == ["0", "1", "2", "3"] and all(r["budget"]["max_params"] == BUDGET // 2
                                                          for r in regions.values())
    per_rank = [sum(r["parameters"] for r in regions.values() if r["owner"] == rank) for rank in (0, 1)]
    assert [r["parameters"] for r in size["ranks"]] == per_rank and size["parameters_per_rank"] <= BUDGET
    assert size["parameters_total"] == sum(per_rank) and all("peak_rss_mb" in r for r in size["ranks"])
    # the whole ss model holds W x (per-rank budget); one ddp replica at the same budget holds it once
    box = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])
    ddp = build_model({"name": "grid", "resolutions": [24, 32], "upsample_steps": [2], "max_params": BUDGET}, box,
                      torch.ones(3)).budget["final_parameters"]
    assert 0.85 * BUDGET <= ddp <= BUDGET and 0.85 * BUDGET <= min(per_rank)
    assert 2 * 0.85 <= size["parameters_total"] / ddp <= 2 / 0.85


def test_no_gradient_all_reduce_and_sub_models_differ(ss_runs):
    rows = [json.loads(line) for line in (ss_runs["straight"] / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert steps and all("allreduce_bytes" not in r or r["allreduce_bytes"] == 0 for r in steps)
    found = ckpt.latest(ss_runs["straight"] / "checkpoints")
    a = torch.load(found / "region_000.pt", weights_only=False)["model"]
    b = torch.load(found / "region_003.pt", weights_only=False)["model"]
    assert not torch.equal(a["focus"], b["focus"])  # each grid sub-model holds its own region
    assert not torch.equal(a["density"], b["density"])


def test_resume_of_sharded_checkpoint_is_bit_exact(ss_runs):
    a_dir = ckpt.latest(ss_runs["straight"] / "checkpoints")
    b_dir = ckpt.latest(ss_runs["resumed"] / "checkpoints")
    assert a_dir.name == b_dir.name == f"step_{2 * N:08d}"
    for name in [f"region_{k:03d}.pt" for k in range(4)] + ["optimizer_rank_0.pt", "optimizer_rank_1.pt"]:
        a = torch.load(a_dir / name, weights_only=False)
        b = torch.load(b_dir / name, weights_only=False)
        key = "model" if "model" in a else "optimizer"
        if key == "model":
            for k in a["model"]:
                assert torch.equal(a["model"][k], b["model"][k]), (name, k)
        else:
            for i in a["optimizer"]["state"]:
                for k, v in a["optimizer"]["state"][i].items():
                    assert torch.equal(torch.as_tensor(v), torch.as_tensor(b["optimizer"]["state"][i][k])), (name, k)


def psnr_of_pngs(render_dir: Path, rows: list, cache: Path) -> list[float]:
    """PSNR of the written 8-bit renders against the test images, computed here (numpy)."""
    import imageio.v3 as iio
    import numpy as np

    from distnerf.data import load_scene

    scene = load_scene({"name": "synthetic", "kind": "city_small", "resolution": 40, "cache_dir": str(cache)}, "test")
    out = []
    for r in rows:
        img = iio.imread(render_dir / f"{r['view']:03d}_{r['name']}_rgb.png").astype(np.float64) / 255.0
        mse = float(((img - scene.images[r["view"]].double().numpy()) ** 2).mean())
        out.append(-10 * np.log10(mse))
    return out


def test_fused_render_one_process_equals_distributed(ss_runs, synthetic_cache):
    run = ss_runs["straight"]
    trained = json.loads((run / "metrics.json").read_text())  # distributed segment fusion at the end of training
    run_cli([sys.executable, "-m", "distnerf.render", f"run_dir={run}", f"out_dir={run / 'single'}"])
    single = json.loads((run / "single" / "metrics.json").read_text())
    assert single["psnr"] == pytest.approx(trained["psnr"], abs=1e-6)
    run_cli(torchrun(2) + ["-m", "distnerf.render", f"run_dir={run}", f"out_dir={run / 'dist'}"])
    distributed = json.loads((run / "dist" / "metrics.json").read_text())
    assert distributed["psnr"] == pytest.approx(single["psnr"], abs=1e-6)
    for png in (run / "single" / "test").glob("*_rgb.png"):
        assert png.read_bytes() == (run / "dist" / "test" / png.name).read_bytes()
    # blend needs one process; it renders the same run (differently, in the overlaps)
    run_cli([sys.executable, "-m", "distnerf.render", f"run_dir={run}", "fusion=blend", f"out_dir={run / 'blend'}"])
    blend = json.loads((run / "blend" / "metrics.json").read_text())
    for reported, computed in zip([r["psnr"] for r in blend["per_view"]],
                                  psnr_of_pngs(run / "blend" / "test", blend["per_view"], synthetic_cache)):
        assert reported == pytest.approx(computed, abs=0.05)  # 8-bit quantisation of the PNG
    # the fused export (every region in one file) renders exactly as the checkpoint does
    export = run_cli([sys.executable, "-m", "distnerf.export", f"run_dir={run}"]).stdout.strip().splitlines()[-1]
    run_cli([sys.executable, "-m", "distnerf.render", f"run_dir={run}", f"weights={export}",
             f"out_dir={run / 'exported'}"])
    for png in (run / "single" / "test").glob("*_rgb.png"):
        assert png.read_bytes() == (run / "exported" / "test" / png.name).read_bytes()
    with pytest.raises(AssertionError, match="one process"):
        run_cli(torchrun(2) + ["-m", "distnerf.render", f"run_dir={run}", "fusion=blend",
                               f"out_dir={run / 'blend2'}"])


def test_resume_at_other_world_size_is_refused(ss_runs, synthetic_cache):
    with pytest.raises(AssertionError, match="original world size"):
        run_cli([sys.executable, "-m", "distnerf.train"] + COMMON + [
            f"run_dir={ss_runs['resumed']}", f"dataset.cache_dir={synthetic_cache}", "strategy.num_regions=4",
            f"train.max_steps={2 * N + 1}", "resume=true", "eval.enabled=false"])


@pytest.fixture(scope="session")
def joint_run(tmp_path_factory, synthetic_cache):
    run = tmp_path_factory.mktemp("ss_joint") / "run"
    train(run, synthetic_cache, [f"train.max_steps={N}", "eval.num_views=2", "strategy.num_regions=2",
                                 "strategy.training=joint"])
    return run


def test_joint_run_exchanges_segments_and_renders_the_same_on_one_process(joint_run):
    rows = [json.loads(line) for line in (joint_run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    # 5 float32 per ray and region sent by each rank: 256 rays (smoke: global 512 = every rank's batch) x 1 region
    assert steps and all(r["exchange_bytes"] == 512 * 1 * 5 * 4 for r in steps)
    manifest = ckpt.read_manifest(ckpt.latest(joint_run / "checkpoints"))
    assert manifest["training"] == "joint"
    trained = json.loads((joint_run / "metrics.json").read_text())
    run_cli([sys.executable, "-m", "distnerf.render", f"run_dir={joint_run}", f"out_dir={joint_run / 'single'}"])
    single = json.loads((joint_run / "single" / "metrics.json").read_text())
    assert single["psnr"] == pytest.approx(trained["psnr"], abs=1e-6)
    for png in (joint_run / "test").glob("*_rgb.png"):
        assert png.read_bytes() == (joint_run / "single" / "test" / png.name).read_bytes()
    with pytest.raises(AssertionError, match="no overlapping regions to blend"):
        run_cli([sys.executable, "-m", "distnerf.render", f"run_dir={joint_run}", "fusion=blend",
                 f"out_dir={joint_run / 'blend'}"])


def test_render_of_an_ss_checkpoint_missing_a_region_file_names_the_step_and_the_file(ss_runs, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(ss_runs["straight"], run, ignore=shutil.ignore_patterns("test", "single", "dist", "blend*",
                                                                            "exported", "export"))
    found = ckpt.latest(run / "checkpoints")
    (found / "region_002.pt").unlink()
    with pytest.raises(AssertionError, match=rf"step {2 * N}: region_002.pt missing \(listed in .*manifest.json\)"):
        run_cli([sys.executable, "-m", "distnerf.render", f"run_dir={run}", f"out_dir={run / 'r'}"])


def test_every_ss_and_joint_checkpoint_file_is_data_only(ss_runs, joint_run):
    """Sub-models, per-rank optimizers and RNG/sampler states of ss (independent and joint)
    checkpoints load with weights_only=True: sharing a run directory never runs pickled code."""
    for run in (ss_runs["straight"], joint_run):
        files = sorted((run / "checkpoints").glob("step_*/*.pt"))
        assert {p.name for p in files} >= {"region_000.pt", "optimizer_rank_0.pt", "rank_0.pt", "rank_1.pt"}, files
        for p in files:
            torch.load(p, map_location="cpu", weights_only=True)
