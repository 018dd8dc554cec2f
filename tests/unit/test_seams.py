"""Seam PSNR (distnerf/study/seams.py): the mask against hand-placed points, and a whole run's
seam and rest PSNR against renders whose error was put only near a region face, found by an
independent ray-sphere intersection written here."""
import json
import math

import imageio.v3 as iio
import numpy as np
import pytest
import torch
import yaml

from distnerf.data import load_scene
from distnerf.data.synthetic import ensure_scene
from distnerf.strategy.partition import Partition
from distnerf.study.seams import pooled_psnr, run_inside_beyond, run_seams, seam_mask

BOX = torch.tensor([[-1.1] * 3, [1.1] * 3], dtype=torch.float64)


def split(axis: int) -> Partition:
    lo, hi = BOX.clone(), BOX.clone()
    lo[1, axis], hi[0, axis] = 0.0, 0.0
    return Partition(BOX, torch.stack([lo, hi]))


def test_seam_mask_marks_points_near_a_shared_face_only():
    pts = torch.tensor([[0.05, 0.3, 0.2],    # 0.05 from the x = 0 face: seam
                        [-0.09, -0.5, 0.0],  # 0.09 from it: seam
                        [0.2, 0.3, 0.2],     # 0.2 away: not
                        [1.09, 0.0, 0.0],    # near the scene box's face, which no region shares: not
                        [-0.5, 1.05, -1.05]])
    assert seam_mask(pts, split(0), 0.1).tolist() == [True, True, False, False, False]
    # along y the same points: only the ones within 0.1 of y = 0
    assert seam_mask(pts, split(1), 0.1).tolist() == [False, False, False, True, False]
    with pytest.raises(ValueError, match="band must be > 0"):
        seam_mask(pts, split(0), 0.0)


def test_pooled_psnr_by_hand():
    assert pooled_psnr(0.03, 3) == pytest.approx(20.0)
    assert pooled_psnr(0.0, 0) is None


def make_run(tmp_path, pick, err: float = 0.2):
    """A run of 3 test views of the detail scene whose renders are the truth (8-bit) plus ``err`` where
    ``pick(hit, x)`` ((H, W) bool ray hits the unit sphere, (H, W) x of the hit) is True; the rays and the
    sphere intersection are written here, independently of the module. Returns (run dir, views)."""
    cache = tmp_path / "cache"
    ensure_scene(str(cache), kind="detail", resolution=24)
    dataset = {"name": "synthetic", "kind": "detail", "resolution": 24, "cache_dir": str(cache)}
    scene = load_scene(dataset, "test")
    run = tmp_path / "run"
    (run / "test").mkdir(parents=True)
    views = []
    for i in range(3):
        h, w = scene.cameras.size(i)
        # the pixel centres' rays, written here: OpenGL camera, centre (u + 0.5, v + 0.5)
        c2w = scene.cameras.c2w[i].double().numpy()
        fx, fy, cx, cy = (float(scene.cameras.fx[i]), float(scene.cameras.fy[i]), float(scene.cameras.cx[i]),
                          float(scene.cameras.cy[i]))
        v, u = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        cam = np.stack([(u + 0.5 - cx) / fx, -(v + 0.5 - cy) / fy, -np.ones_like(u, dtype=float)], -1)
        d = cam @ c2w[:3, :3].T
        d /= np.linalg.norm(d, axis=-1, keepdims=True)
        o = np.broadcast_to(c2w[:3, 3], d.shape)
        b = (o * d).sum(-1)
        disc = b ** 2 - ((o * o).sum(-1) - 1.0)  # |o + t d| = 1, the unit sphere
        hit = disc > 0
        t = -b - np.sqrt(np.where(hit, disc, 0.0))
        x = (o + t[..., None] * d)[..., 0]
        picked = pick(hit, x)
        truth = scene.image(i).numpy()
        render = np.round(truth * 255) / 255  # what an 8-bit PNG of the truth holds
        render[picked] = np.clip(render[picked] + err, 0, 1)
        name = f"r_{i}"
        iio.imwrite(run / "test" / f"{i:03d}_{name}_rgb.png", np.round(render * 255).astype(np.uint8))
        views.append({"view": i, "name": name, "seam": picked, "truth": truth, "render": np.round(render * 255) / 255})
    (run / "metrics.json").write_text(json.dumps({"per_view": [{"view": v["view"], "name": v["name"]} for v in views]}))
    (run / "config.yaml").write_text(yaml.safe_dump({"dataset": dataset, "eval": {"downscale": 1}}))
    return run, views


def test_inside_beyond_splits_at_the_box(tmp_path):
    """Error put only on surface points with x > 0 and on the misses; the box x <= 0 holds the rest."""
    run, views = make_run(tmp_path, lambda hit, x: ~hit | (x > 0))
    out = run_inside_beyond(run, [[-2.0, -2.0, -2.0], [0.0, 2.0, 2.0]])
    inside = sum(int((v["seam"] == 0).sum()) for v in views)  # hits with x <= 0
    assert out["inside_pixels"] == inside > 0 and out["beyond_pixels"] == sum(v["seam"].size for v in views) - inside
    assert out["inside_psnr"] > 45  # only the PNG's rounding
    err = np.concatenate([((v["render"] - v["truth"])[v["seam"]] ** 2).ravel() for v in views])
    assert out["beyond_psnr"] == pytest.approx(-10 * math.log10(err.mean()), abs=0.05)


def test_run_seams_finds_an_error_put_only_at_the_seam(tmp_path):
    run, views = make_run(tmp_path, lambda hit, x: hit & (np.abs(x) < 0.1))
    out = run_seams(run, split(0), 0.1)
    seam_err = np.concatenate([((v["render"] - v["truth"])[v["seam"]] ** 2).ravel() for v in views])
    assert out["seam_pixels"] == sum(int(v["seam"].sum()) for v in views) > 0
    assert out["seam_psnr"] == pytest.approx(-10 * math.log10(seam_err.mean()), abs=0.05)
    assert out["rest_psnr"] > 45  # only the PNG's rounding off the seam
    assert out["gap_db"] < -20
    # across the other axis the seam pixels are elsewhere: the error spreads over both masks
    other = run_seams(run, split(2), 0.1)
    assert other["seam_psnr"] > out["seam_psnr"] + 3 and other["rest_psnr"] < 40

    # another dataset is refused by name
    (run / "config.yaml").write_text(yaml.safe_dump({"dataset": {"name": "blender", "root": str(tmp_path / "cache")},
                                                     "eval": {"downscale": 1}}))
    with pytest.raises(ValueError, match="config.yaml: seams need analytic geometry"):
        run_seams(run, split(0), 0.1)


def test_study_seams_scores_each_cell_under_its_world_sizes_partition(tmp_path):
    import shutil

    from distnerf.study.seams import study_seams

    cache = tmp_path / "cache"
    ensure_scene(str(cache), kind="detail", resolution=24)
    dataset = {"name": "synthetic", "kind": "detail", "resolution": 24, "cache_dir": str(cache)}
    scene = load_scene(dataset, "test")
    cells = tmp_path / "study" / "cells"
    first = cells / "ddp-w1-r0"
    (first / "test").mkdir(parents=True)
    iio.imwrite(first / "test" / "000_r_0_rgb.png", np.round(scene.image(0).numpy() * 255).astype(np.uint8))
    (first / "metrics.json").write_text(json.dumps({"per_view": [{"view": 0, "name": "r_0"}]}))
    (first / "config.yaml").write_text(yaml.safe_dump({"dataset": dataset, "eval": {"downscale": 1}}))
    for name, strategy, w in (("ddp-w1-r0", "ddp", 1), ("ss-w2-r0", "ss_joint", 2), ("ddp-w2-r0", "ddp", 2),
                              ("ss-w4-r0", "ss_joint", 4)):
        if name != first.name:
            shutil.copytree(first, cells / name)
        (cells / name / "study_cell.json").write_text(json.dumps(
            {"cell": name, "key": name[:-3], "values": {"strategy": strategy, "world_size": w}, "repeat": 0,
             "status": "failed" if name == "ss-w2-r0" else "done"}))
    split(0).save(cells / "ss-w2-r0" / "partition.json")
    with pytest.raises(ValueError, match="no finished ss cell"):
        study_seams(tmp_path / "study", 0.1)  # ss-w4 has no partition yet, ss-w2 is not done
    (cells / "ss-w2-r0" / "study_cell.json").write_text(json.dumps(
        {"cell": "ss-w2-r0", "key": "ss-w2", "values": {"strategy": "ss_joint", "world_size": 2}, "repeat": 0,
         "status": "done"}))
    split(1).save(cells / "ss-w4-r0" / "partition.json")
    out = study_seams(tmp_path / "study", 0.1)
    scored = sorted((r["cell"], r["partition_world_size"]) for r in out["rows"])
    # the one-rank cell under each W's partition, the others under their own W's
    assert scored == [("ddp-w1-r0", 2), ("ddp-w1-r0", 4), ("ddp-w2-r0", 2), ("ss-w2-r0", 2), ("ss-w4-r0", 4)]
    assert all(r["rest_psnr"] > 45 for r in out["rows"])  # the truth, through the PNG's rounding
