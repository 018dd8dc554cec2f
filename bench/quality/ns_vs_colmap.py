"""A nerfstudio capture against the same capture through COLMAP: ray bounds, scene box and test
PSNR at equal steps (issue 52 item 1: 20.66 dB against 23.43 dB, near/far 0.035 / 2.763 against
0.672 / 1.448 before the nerfstudio importer read the sparse points).

    python -m bench.quality.ns_vs_colmap [--steps 200] [--views 8] [--downscale 4] [--work DIR]
        [--out bench/quality/results/ns_vs_colmap] [--lego ../shared/data/nerf_synthetic_half/lego]

The capture: lego's 100 training images and 20 of its test images (every 10th), converted to a
COLMAP model with ``python -m distnerf.data.convert`` (the known poses, PINHOLE), then sparse
points as COLMAP makes them for known poses (pycolmap: SIFT features, exhaustive matching,
``triangulate_points``, one thread). From that model a ``transforms.json`` as ``ns-process-data``
writes it (``tests.fixtures.captures.write_ns_process_data``: nerfstudio's ``colmap_to_json`` rules,
OPENCV camera, ``applied_transform``, per-frame ``file_path``, ``sparse_pc.ply``), plus the same
file without ``ply_file_path`` (``transforms_cameras.json``); both with ``train_filenames`` /
``test_filenames`` so that every variant trains and tests on the same images (COLMAP:
``dataset.test_list``). Variants, each ``python -m distnerf.train`` with the defaults and
``dataset.downscale``, ``train.max_steps``, ``eval.num_views`` (OMP_NUM_THREADS=1):

* ``colmap``: ``dataset=colmap`` on the folder (the reference);
* ``nerfstudio_points``: ``dataset=nerfstudio`` on ``transforms.json`` (with the points);
* ``nerfstudio_cameras``: ``dataset=nerfstudio`` on ``transforms_cameras.json`` (cameras alone);
* ``nerfstudio_cameras_box``: the same with ``dataset.aabb=[[-1,-1,-1],[1,1,1]]``, the box rule
  the importer used for every file before (bounds from the box [-1, 1]^3 around the cameras'
  focus point; the old rule also widened the box to hold every camera).

Bounds are reported in scene units (what the renderer uses) and in the capture's source units
(divided by the normalisation's scale, comparable across importers). Writes ``results.json``
and ``meta.json`` (command, commit, start and end) under ``--out``; the capture is cached in
``--work`` (default ``.cache/ns_vs_colmap``). A quality figure, not a timing: it may run beside
other work. About 3 CPU-minutes for the capture and 1-2 per variant on one core.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
LEGO = ROOT.parent / "shared" / "data" / "nerf_synthetic_half" / "lego"
OUT = ROOT / "bench" / "quality" / "results" / "ns_vs_colmap"
TEST_STRIDE = 10   # 20 of lego's 200 test images
BOX_RULE = "[[-1,-1,-1],[1,1,1]]"


def subset(lego: Path, work: Path) -> Path:
    """``work/lego_sub``: lego's transforms with every training frame and every 10th test frame."""
    sub = work / "lego_sub"
    if not (sub / "transforms_test.json").is_file():
        sub.mkdir(parents=True, exist_ok=True)
        for split, stride in (("train", 1), ("test", TEST_STRIDE)):
            meta = json.loads((lego / f"transforms_{split}.json").read_text())
            meta["frames"] = meta["frames"][::stride]
            if not (sub / split).exists():
                (sub / split).symlink_to(lego / split)
            (sub / f"transforms_{split}.json").write_text(json.dumps(meta, indent=1))
    return sub


def colmap_capture(sub: Path, work: Path) -> Path:
    """``work/capture``: images/, sparse/0 (known poses + triangulated points), test_list.txt."""
    cap = work / "capture"
    done = cap / "sparse" / "0" / "points.done"
    if done.is_file():
        return cap
    os.environ.setdefault("GLOG_minloglevel", "2")
    import pycolmap

    from distnerf.data.convert import main as convert

    if not (cap / "test_list.txt").is_file():
        convert(["--to", "colmap", "--out", str(cap), "--overwrite", "dataset=blender", f"dataset.root={sub}"])
    known = pycolmap.Reconstruction(str(cap / "sparse" / "0"))
    (camera,) = known.cameras.values()
    poses = {im.name: im.cam_from_world() for im in known.images.values()}
    database = work / "database.db"
    database.unlink(missing_ok=True)
    reader = pycolmap.ImageReaderOptions()
    reader.camera_model = camera.model.name
    reader.camera_params = ",".join(repr(float(p)) for p in camera.params)
    extraction = pycolmap.FeatureExtractionOptions()
    extraction.num_threads = 1
    pycolmap.extract_features(database, cap / "images", camera_mode=pycolmap.CameraMode.SINGLE,
                              reader_options=reader, extraction_options=extraction, device=pycolmap.Device.cpu)
    matching = pycolmap.FeatureMatchingOptions()
    matching.num_threads = 1
    pycolmap.match_exhaustive(database, matching_options=matching, device=pycolmap.Device.cpu)
    with pycolmap.Database.open(database) as db:  # the database's ids, the known poses
        (db_camera,) = db.read_all_cameras()
        images = db.read_all_images()
    rec = pycolmap.Reconstruction()
    rec.add_camera_with_trivial_rig(db_camera)
    for image in images:
        rec.add_image_with_trivial_frame(pycolmap.Image(name=image.name, camera_id=db_camera.camera_id,
                                                        image_id=image.image_id), poses[image.name])
    options = pycolmap.IncrementalPipelineOptions()
    options.num_threads = 1
    triangulated = work / "triangulated"
    triangulated.mkdir(exist_ok=True)
    rec = pycolmap.triangulate_points(rec, database, cap / "images", triangulated, options=options)
    for old in (cap / "sparse" / "0").iterdir():
        old.unlink()
    rec.write_text(str(cap / "sparse" / "0"))
    done.write_text(f"{rec.num_points3D()} points\n")
    return cap


def nerfstudio_files(cap: Path) -> dict:
    """``transforms.json`` (with sparse_pc.ply) and ``transforms_cameras.json`` (without) in ``cap``."""
    from tests.fixtures.captures import write_ns_process_data  # run from the checkout (python -m): tests/ imports

    test = set((cap / "test_list.txt").read_text().split())
    names = sorted(p.relative_to(cap / "images").as_posix() for p in (cap / "images").rglob("*.png"))
    splits = {"train_filenames": [f"images/{n}" for n in names if n not in test],
              "test_filenames": [f"images/{n}" for n in names if n in test]}
    write_ns_process_data(cap, points=False, **splits)
    (cap / "transforms.json").replace(cap / "transforms_cameras.json")
    write_ns_process_data(cap, points=True, **splits)
    return {"points": cap / "transforms.json", "cameras": cap / "transforms_cameras.json"}


def variants(cap: Path, files: dict) -> dict:
    """name -> dataset overrides."""
    return {"colmap": ["dataset=colmap", f"dataset.root={cap}", "dataset.test_list=test_list.txt"],
            "nerfstudio_points": ["dataset=nerfstudio", f"dataset.root={files['points']}"],
            "nerfstudio_cameras": ["dataset=nerfstudio", f"dataset.root={files['cameras']}"],
            "nerfstudio_cameras_box": ["dataset=nerfstudio", f"dataset.root={files['cameras']}",
                                       f"dataset.aabb={BOX_RULE}"]}


def bounds(overrides: list, downscale: int) -> dict:
    """The train split's near/far and box, in scene units and in the source's units."""
    from distnerf.data import load_scene

    cfg = {"downscale": downscale}
    for item in overrides:
        key, value = item.split("=", 1)
        if key == "dataset":
            cfg["name"] = value
        else:
            cfg[key.split(".", 1)[1]] = json.loads(value) if value.startswith("[") else value
    scene = load_scene(cfg, "train")
    scale = scene.transform["scale"]
    per_camera = scene.cameras.bounds.double().numpy()
    box = scene.aabb.double().numpy()
    return {"near": scene.near, "far": scene.far, "scale": scale, "aabb": box.tolist(),
            "aabb_size_source": ((box[1] - box[0]) / scale).tolist(),
            "near_source": scene.near / scale, "far_source": scene.far / scale,
            "median_near_far_source": (np.median(per_camera, 0) / scale).tolist(),
            "sparse_points": scene.transform.get("sparse_points")}


def train(name: str, overrides: list, args, runs: Path) -> dict:
    run_dir = runs / name
    command = [sys.executable, "-m", "distnerf.train", f"run_dir={run_dir}", *overrides,
               f"dataset.downscale={args.downscale}", f"train.max_steps={args.steps}", f"eval.num_views={args.views}",
               "eval.lpips=false", "logger.wandb.mode=disabled", "monitor.progress=false", "checkpoints.every=0"]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"})
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: training failed ({shlex.join(command)}):\n{proc.stderr[-4000:]}")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {"psnr": metrics["psnr"], "ssim": metrics.get("ssim"), "wall_s": round(time.perf_counter() - start, 1),
            "num_views": metrics["protocol"]["num_views"], "command": shlex.join(command[1:])}


def commit() -> dict:
    def git(*a):
        proc = subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": git("rev-parse", "--short", "HEAD"), "git_dirty": None if status is None else bool(status)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--views", type=int, default=8)
    parser.add_argument("--downscale", type=int, default=4)
    parser.add_argument("--lego", type=Path, default=LEGO)
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "ns_vs_colmap")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--only", nargs="*", help="variants to run (default: all)")
    args = parser.parse_args(argv)
    utc = lambda: datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    meta = {"command": shlex.join(["python", "-m", "bench.quality.ns_vs_colmap",
                                   *(sys.argv[1:] if argv is None else argv)]),
            **commit(), "start": utc(), "host": platform.node(), "cpus": os.cpu_count(),
            "load_before": list(os.getloadavg())}
    if not args.lego.is_dir():
        parser.error(f"--lego {args.lego} not found")
    args.work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    cap = colmap_capture(subset(args.lego, args.work), args.work)
    files = nerfstudio_files(cap)
    capture_s = time.perf_counter() - start
    results = {"capture": {"images": {"train": 100, "test": 200 // TEST_STRIDE},
                           "points": int((cap / "sparse" / "0" / "points.done").read_text().split()[0]),
                           "prepare_s": round(capture_s, 1)},
               "settings": {"steps": args.steps, "views": args.views, "downscale": args.downscale}, "variants": {}}
    for name, overrides in variants(cap, files).items():
        if args.only and name not in args.only:
            continue
        entry = {"bounds": bounds(overrides, args.downscale)}
        entry.update(train(name, overrides, args, args.work / "runs"))
        results["variants"][name] = entry
        print(f"{name}: near/far {entry['bounds']['near']:.3f}/{entry['bounds']['far']:.3f} (source units "
              f"{entry['bounds']['near_source']:.3f}/{entry['bounds']['far_source']:.3f}), PSNR {entry['psnr']:.2f} dB",
              flush=True)
    reference = results["variants"].get("colmap")
    if reference:
        for entry in results["variants"].values():
            entry["psnr_minus_colmap"] = round(entry["psnr"] - reference["psnr"], 3)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    meta.update(end=utc(), wall_s=round(time.perf_counter() - start, 1), load_after=list(os.getloadavg()))
    from bench.common import append_meta
    append_meta(args.out, {**meta, "files": ["results.json"]})  # the bench's meta.json: {"runs": [...]}
    return results


if __name__ == "__main__":
    main()
