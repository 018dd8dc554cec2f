"""Peak memory of evaluating one test view with NeRF at ``experiment=gpu`` settings, with and
without ``eval.point_chunk`` (issue 14, item 6).

    python -m bench.memory.eval_memory [--resolutions 100 256] [--threads 1] [--max-before-gb 20]
        [--out bench/memory/results/eval_memory/eval_memory.json] [-- HYDRA_OVERRIDES...]

``model=nerf experiment=gpu`` sets ``eval.chunk=65536`` rays; NeRF turns a chunk into
``chunk x (num_coarse + num_fine)`` points, and without a point limit the fine pass sends
``rays x 192`` points through the 8 x 256 MLP in one call (~3 kB of fp32 activations each).
For each built-in-scene resolution (``dataset.resolution``; a 256 x 256 view is exactly one
65536-ray chunk), a fresh subprocess renders test view 0 on the CPU with the untrained model
(memory does not depend on the weights) and reports its peak RSS (``VmHWM`` of
``/proc/self/status``; not ``ru_maxrss``, which survives exec) and its RSS before rendering:

* ``after``: ``eval.point_chunk`` as configured (default 262144 points per call);
* ``before``: ``eval.point_chunk=0`` (no limit, the behaviour before the key existed). It is
  skipped, with its estimate, when the estimate exceeds ``--max-before-gb`` (the machine it
  was written on has 24 GiB): estimate = RSS before rendering + fine points x the bytes per
  point measured in the largest ``before`` run that did run (3.7 kB, measured here, when none did).

Writes JSON (``--out``) with a ``meta`` block (command, date, commit, load before/after; see
``bench/common.py``). Run it on a quiet machine: ``/work/shared/tools/quiet -- python tools/...``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


from bench.common import ROOT, default_out, start_meta, status_mb, write_result

def worker(args: dict) -> None:
    """A fresh process (``python -m bench.memory.eval_memory worker JSON``): load the test split, build the
    model, render view 0; prints one ``RESULT`` JSON line with RSS before rendering and the peak (MiB)."""
    import time

    import torch

    from distnerf.data import load_scene
    from distnerf.engine.evaluate import render_image
    from distnerf.model import build_model

    torch.set_num_threads(args["threads"])
    scene = load_scene(args["dataset"], "test")
    torch.manual_seed(args["seed"])
    model = build_model(args["model"], scene.aabb, scene.background)
    out = {"rss_before_mb": status_mb("VmRSS"), "rays": scene.height * scene.width}
    t = time.perf_counter()
    r = render_image(model, scene, 0, args["chunk"], torch.device("cpu"), args["point_chunk"])
    out.update(seconds=time.perf_counter() - t, num_samples=r["num_samples"], peak_rss_mb=status_mb("VmHWM"))
    print("RESULT " + json.dumps(out))


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose, initialize_config_dir

    from distnerf.config_check import validate

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return validate(hydra_compose("train", overrides=overrides))


def run_worker(args: dict) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(args["threads"]), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "bench.memory.eval_memory", "worker", json.dumps(args)], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        raise RuntimeError(f"worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(line[-1][len("RESULT "):])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--resolutions", type=int, nargs="+", default=[100, 256],
                    help="built-in scene image sizes (dataset.resolution), rendered in this order")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-before-gb", type=float, default=20.0,
                    help="skip a 'before' run whose estimated peak RSS exceeds this (GiB)")
    ap.add_argument("--out", type=Path, default=default_out(__file__, "eval_memory/eval_memory.json"))
    ap.add_argument("overrides", nargs="*", help="further Hydra overrides (after --)")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        return worker(json.loads(argv[1]))
    args = ap.parse_args(argv)
    meta = start_meta()
    from omegaconf import OmegaConf

    base = ["model=nerf", "experiment=gpu", *args.overrides]
    report = {"overrides": base, "threads": args.threads, "view": 0, "device": "cpu",
              "max_before_gb": args.max_before_gb, "runs": []}
    bytes_per_point = None  # measured by the largest 'before' run that ran
    for res in args.resolutions:
        cfg = compose([*base, f"dataset.resolution={res}"])
        model = OmegaConf.to_container(cfg.model, resolve=True)
        per_ray = model["num_coarse"] + model["num_fine"]
        job = {"threads": args.threads, "seed": int(cfg.seed), "chunk": int(cfg.eval.chunk),
               "dataset": OmegaConf.to_container(cfg.dataset, resolve=True),
               "model": {k: v for k, v in model.items() if k not in ("compile", "compile_mode")}}
        from distnerf.data import load_scene

        load_scene(job["dataset"], "test")  # a scene generated on first use: here, not inside the measured worker
        rays_per_call = min(res * res, job["chunk"])
        fine_points = rays_per_call * (per_ray if model["num_fine"] > 0 else model["num_coarse"])
        for name, point_chunk in (("after", int(cfg.eval.point_chunk)), ("before", 0)):
            row = {"name": name, "resolution": res, "eval_chunk": job["chunk"], "point_chunk": point_chunk,
                   "rays_per_chunk": rays_per_call, "points_per_chunk_fine": fine_points}
            if name == "before":
                base_mb = report["runs"][-1]["rss_before_mb"]
                per_point = bytes_per_point or 3700.0
                estimate_gb = (base_mb * 2**20 + fine_points * per_point) / 2**30
                row["estimate_gb"] = round(estimate_gb, 2)
                row["estimate_bytes_per_point"] = round(per_point, 1)
                if estimate_gb > args.max_before_gb:
                    row["skipped"] = (f"estimated peak {estimate_gb:.1f} GiB > --max-before-gb "
                                      f"{args.max_before_gb:g} (machine: 24 GiB)")
                    print(f"resolution {res} before: skipped, {row['skipped']}", flush=True)
                    report["runs"].append(row)
                    continue
            res_out = run_worker({**job, "point_chunk": point_chunk})
            row.update(res_out)
            row["peak_rss_gb"] = round(res_out["peak_rss_mb"] / 1024, 3)
            row["added_by_rendering_mb"] = round(res_out["peak_rss_mb"] - res_out["rss_before_mb"], 1)
            if name == "before":
                bytes_per_point = row["added_by_rendering_mb"] * 2**20 / fine_points
                row["measured_bytes_per_point"] = round(bytes_per_point, 1)
            report["runs"].append(row)
            print(f"resolution {res} {name} (point_chunk {point_chunk}): peak RSS {row['peak_rss_gb']:.2f} GiB, "
                  f"{row['added_by_rendering_mb']:.0f} MiB added by rendering, {res_out['seconds']:.1f} s", flush=True)
    write_result(args.out, report, meta)


if __name__ == "__main__":
    main()
