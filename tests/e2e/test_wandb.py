"""W&B dashboards from a real 2-rank run (issue 27, part 2): image panels at each validation and of the
test views, per-rank step figures gathered into the one W&B run, the group and job type set from the
strategy, the fly-through of ``distnerf.render video=`` in the same run, and the workspace that
``tools/wandb_workspace.py`` builds from what the run logged. Checked in the offline run files wandb
writes (``RUN/wandb/offline-run-*/run-*.wandb``), read with wandb's own reader
(``wandb leet inspect --json``, :mod:`distnerf.observe.wandb_records`)."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import pytest
from PIL import Image

from distnerf.observe import wandb_records as W
from tests.conftest import REPO, run_cli, torchrun

pytest.importorskip("wandb")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 10-step ddp run on 2 ranks logging offline, its directory moved (as from a cluster to a desk),
    then ``distnerf.render`` of its fly-through (4 frames)."""
    trained, run_dir = tmp_path_factory.mktemp("wandb") / "trained", tmp_path_factory.mktemp("moved") / "run"
    env = {"WANDB_MODE": "offline"}
    run_cli([*torchrun(2), "-m", "distnerf.train", "experiment=smoke", "device=cpu", "dataset=synthetic", "dataset.resolution=24",
             "strategy=ddp", "train.max_steps=10", "monitor.log_every=5", "monitor.val_every=5", "monitor.val_views=1",
             "eval.num_views=2", "monitor.progress=false", "logger.wandb.mode=offline", f"run_dir={trained}"],
            env=env, timeout=300)
    shutil.move(trained, run_dir)  # the W&B run id came from the old path: render finds it in RUN/wandb
    run_cli([sys.executable, "-m", "distnerf.render", f"run_dir={run_dir}", f"video={run_dir / 'fly.gif'}",
             "video_frames=4", "eval.num_views=1"], env=env, timeout=300)
    files = W.run_files(run_dir)
    assert len(files) == 2, files  # the training's, then the render's (the same run id)
    return run_dir, files[0].parent, W.read_records(files[0]), W.read_records(files[1])


def test_group_job_type_and_world_size(run):
    _, _, recs, _ = run
    meta = W.run_meta(recs)
    assert meta["run_group"] == "ddp" and meta["job_type"] == "train"
    config = W.run_config(recs)
    assert config["world_size"] == 2 and config["strategy_label"] == "ddp"


def test_per_rank_figures_of_both_ranks(run):
    _, _, recs, _ = run
    rows = [row for row in W.history(recs).values() if "loss" in row]
    assert rows
    for row in rows:
        for rank in (0, 1):
            assert row[f"rank{rank}/step_ms"] > 0 and row[f"rank{rank}/rays_per_s"] > 0
            assert row[f"rank{rank}/peak_rss_mb"] > 0


def test_validation_and_test_panels_with_their_sizes(run):
    _, files, recs, _ = run
    rows = W.history(recs)
    val = {k: v for row in rows.values() for k, v in row.items() if k.startswith("val/") and isinstance(v, dict)}
    test = {k: v for row in rows.values() for k, v in row.items() if k.startswith("test/") and isinstance(v, dict)}
    assert val and len(test) == 2, (list(val), list(test))
    for key, image in {**val, **test}.items():
        assert image["_type"] == "image-file" and image["height"] == 24 and image["width"] == 3 * 24, (key, image)
        with Image.open(files / "files" / image["path"]) as im:  # ground truth | prediction | depth
            assert im.size == (72, 24)
    steps_with_val = sorted(s for s, row in rows.items() if any(k.startswith("val/") for k in row))
    assert steps_with_val == [5, 10]


def test_render_video_goes_into_the_training_run(run):
    run_dir, _, train, render = run
    meta = W.run_meta(render)
    assert meta["run_id"] == W.run_meta(train)["run_id"]  # wandb sync uploads both files into one run, moved or not
    assert meta["run_group"] == "ddp" and meta["job_type"] == "train" and meta["resume"]
    (row,) = [row for row in W.history(render).values() if "render/video" in row]
    video = row["render/video"]
    assert video["_type"] == "video-file" and row["step"] == 10 and row["_step"] == 10  # the checkpoint's step
    assert video["path"] in W.uploaded_files(render)
    logged = W.run_files(run_dir)[1].parent / "files" / video["path"]
    assert logged.read_bytes() == (run_dir / "fly.gif").read_bytes()
    assert hashlib.sha256(logged.read_bytes()).hexdigest() == video["sha256"]


def workspace(*args):
    pytest.importorskip("wandb_workspaces")  # the `wandb` extra (tools/setup_env.sh installs it)
    return subprocess.run([sys.executable, str(REPO / "tools" / "wandb_workspace.py"), *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def panel_keys(spec: dict) -> dict:
    """{"history", "x", "config", "summary"}: the keys the spec's panels name (read from the JSON, not the tool)."""
    out = {"history": set(), "x": set(), "config": set(), "summary": set()}
    for section in spec["spec"]["section"]["panelBankConfig"]["sections"]:
        for panel in section["panels"]:
            cfg = panel["config"]
            out["history"] |= set(cfg.get("metrics", [])) | set(cfg.get("mediaKeys", []))
            if "xAxis" in cfg:
                out["x"].add(cfg["xAxis"])
            for col in cfg.get("columns", []):
                kind, _, name = col["accessor"].partition(":")
                top, _, rest = name.partition(".value")  # config:sampler.value.name -> sampler.name
                out[kind].add(top + rest if kind == "config" else name)
    return out


def test_workspace_spec_names_the_keys_the_run_logged(run, tmp_path):
    run_dir, _, train, render = run
    out = tmp_path / "ws.json"
    proc = workspace("--group", "ddp", "--keys-from", run_dir, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote the workspace's spec to {out}" in proc.stderr
    spec = json.loads(out.read_text())
    rows = [row for recs in (train, render) for row in W.history(recs).values()]
    scalars = {k for row in rows for k, v in row.items() if not isinstance(v, dict)}
    media = {k for row in rows for k, v in row.items() if isinstance(v, dict) and v["_type"] in ("image-file",
                                                                                                    "video-file")}
    config = set(W.flat_config(W.run_config(train)))
    keys = panel_keys(spec)
    assert keys["history"] <= scalars | media and keys["x"] <= scalars and keys["summary"] <= scalars
    assert keys["config"] <= config, keys["config"] - config
    # every per-rank figure of both ranks, every image and the video, the quality curves against both axes
    wanted = {k for k in scalars if k.split("/", 1)[-1] in ("step_ms", "exposed_comm_ms", "input_wait_ms",
                                                            "peak_rss_mb") and k.startswith("rank")}
    assert {k.split("/")[0] for k in wanted} == {"rank0", "rank1"} and wanted <= keys["history"]
    assert media <= keys["history"] and {"render/video", "val/r_0"} <= media
    assert {"loss", "psnr", "val_psnr", "rays_per_s"} <= keys["history"] and keys["x"] == {"step", "train_seconds"}
    assert {"strategy_label", "world_size", "sampler.name"} <= keys["config"]
    runs = spec["spec"]["section"]["runSets"][0]
    assert [g["name"] for g in runs["grouping"]] == ["group", "jobType"]
    assert {"key": {"section": "run", "name": "group"}, "op": "IN", "value": ["ddp"], "disabled": False} \
        in runs["filters"]["filters"]


def test_workspace_refuses_a_run_without_wandb_files(tmp_path):
    proc = workspace("--group", "ddp", "--keys-from", tmp_path, "--out", tmp_path / "ws.json")
    assert proc.returncode == 2 and f"{tmp_path}: no wandb/offline-run-" in proc.stderr
    assert not (tmp_path / "ws.json").exists()
