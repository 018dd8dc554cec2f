"""The packed-sample engine against the engine of an earlier commit, side by side (BENCHMARKS.md, "Engine").

    python -m bench.throughput.engine RUN_DIR [--baseline bb24e52] [--views 25] [--old-views 25] [--threads 2]
        [--parts eval,exact,old,alternate,memory,train] [--set KEY=VALUE ...] [--out bench/throughput/results/RUN_NAME/bench_engine.json]

RUN_DIR is a trained ``model=grid`` run (e.g. ``bench/quality/quality.sh``'s). In one invocation:

* ``eval``: its checkpoint rendered on ``--views`` evenly spaced test views by this engine at
  its settings: seconds and rays/s per view, PSNR/SSIM, samples per ray marched, evaluated
  for density and coloured;
* ``exact``: the same views with early termination and the colour threshold off
  (``termination=0``, ``color_threshold=0``): the PSNR the thresholds must stay within;
* ``old``: the same checkpoint rendered by the engine of ``--baseline`` (a ``git worktree`` of
  that commit, in a subprocess with the same thread count) on ``--old-views`` views;
* ``alternate``: both engines rendering ``--old-views`` views in fresh workers that take turns
  (new, old, then old, new, ...; ``--repeats`` turns each): the median of each engine's per-turn
  medians and their ratio, which a machine whose speed drifts within minutes leaves standing where
  ``old`` after ``eval`` does not;
* ``memory``: peak RSS (``VmHWM``) of a fresh process rendering one view at ``eval.chunk`` 8192
  and 65536, with the test split's images decoded in it, and the same process's RSS before
  rendering (scene and model loaded) for the share rendering adds;
* ``train``: training rays/s of both engines at each grid stage (the checkpoint's tables
  resampled to 64^3, 128^3, 160^3, the same ray batches; forward, backward, regulariser,
  optimizer), median of 16 steps after 6 of warm-up (the first steps fault in the optimizer's
  moments and the gradient buffers); ``--repeats`` fresh worker pairs per grid, the two engines
  alternating, and the median of their rays/s (the ratio from the medians).

Views are rendered in this order: new and exact interleaved per view, then old. Writes JSON
(``--out``, default ``bench/throughput/results/RUN_NAME/bench_engine.json``, RUN_NAME the run directory's
name) with a ``meta`` block (command, date, git commit, load before/after) and prints a summary.
Run it on a quiet machine (``../shared/tools/quiet``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


from bench.common import ROOT, default_out, start_meta, status_mb, write_result

def worker(args: dict) -> None:
    """One engine's measurement in a fresh process (``python -m bench.throughput.engine worker JSON``), with
    the ``distnerf`` of the checkout it runs for first on the path (see :func:`run_worker`): renders
    views or times training steps of one model state and prints one ``RESULT`` JSON line."""
    import resource

    import torch

    from distnerf.data import load_scene
    from distnerf.data.rays import generate_rays
    from distnerf.engine.evaluate import render_image
    from distnerf.model import build_model
    from distnerf.observe.metrics import psnr, ssim

    torch.set_num_threads(args["threads"])
    cfg = dict(args["model_cfg"])
    for k in ("compile", "compile_mode"):
        cfg.pop(k, None)
    if args.get("legacy"):  # keys the baseline's engine does not know (its schema's, else bb24e52's list)
        try:
            import dataclasses

            from distnerf.schema import GridModelConfig
            known = {f.name for f in dataclasses.fields(GridModelConfig)} | {"name"}
            cfg = {k: v for k, v in cfg.items() if k in known}
        except ImportError:
            for k in ("termination", "eval_round_steps", "sparse_grad"):
                cfg.pop(k, None)
    split = "test" if args["mode"] == "render" else "train"
    scene = load_scene(args["dataset"], split)
    model = build_model(cfg, scene.aabb, scene.background)
    model.load_state_dict(torch.load(args["state"], map_location="cpu", weights_only=False))
    out = {"rss_before_mb": status_mb("VmRSS")}
    if args["mode"] == "render":
        model.eval()
        rows = []
        for v in args["views"]:
            t = time.perf_counter()
            r = render_image(model, scene, v, args["chunk"], torch.device("cpu"))
            dt = time.perf_counter() - t
            rows.append({"view": v, "seconds": dt, "psnr": psnr(r["rgb"], scene.images[v]),
                         "ssim": ssim(r["rgb"], scene.images[v]), "num_samples": r["num_samples"]})
        out["rows"] = rows
    else:
        try:
            from distnerf.components.optim import build_optimizer
        except ImportError:  # the baseline's checkout (bb24e52) has it in engine/
            from distnerf.engine.optim import build_optimizer
        model.train()
        optim_cfg = {"lr": 1e-3, "fused": True, "eps": 1e-15}
        try:  # the optim section, a typed node (the baseline's checkout took the dict)
            from distnerf.config_check import section
            from distnerf.schema import OptimConfig

            optim_cfg = section(OptimConfig, optim_cfg)
        except ImportError:
            pass
        opt = build_optimizer(model, optim_cfg)
        g = torch.Generator().manual_seed(0)
        times = []
        warmup = args.get("warmup", 2)
        try:  # the engine of this checkout: the regulariser in components/ (since the grid split), else the model's
            from distnerf.components.regularizer import add_regularizer_grads_ as regularize
        except ImportError:
            def regularize(m):
                m.add_regularizer_grads_()
        for it in range(args["steps"] + warmup):
            n = args["rays"]
            idx = torch.randint(0, len(scene.images), (n,), generator=g)
            u = torch.randint(0, scene.width, (n,), generator=g)
            v = torch.randint(0, scene.height, (n,), generator=g)
            rays = generate_rays(scene.cameras, idx, u, v, scene.near, scene.far, scene.ndc)
            target = scene.images[idx, v, u]
            jitter = torch.Generator().manual_seed(it)
            t = time.perf_counter()
            o = model(rays, jitter)
            ((o["rgb"] - target) ** 2).mean(dim=-1).sum().div(n).backward()
            regularize(model)
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t)
        out["rays_per_s"] = args["rays"] / statistics.median(times[warmup:])
        out["steps_s"] = times
        out["samples_per_ray"] = o["num_samples"] / args["rays"]
    try:
        out["peak_rss_mb"] = status_mb("VmHWM")
    except IndexError:  # no VmHWM line: ru_maxrss (which survives exec)
        out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(out))


def run_worker(cwd: Path, args: dict) -> dict:
    """:func:`worker` in a fresh process for the checkout ``cwd`` (this one or the baseline's worktree).
    ``python -P`` leaves the cwd off ``sys.path``; ``PYTHONPATH`` puts the checkout's ``distnerf`` first and
    this checkout's ``bench`` after it (an older checkout's ``bench/`` has no ``__init__.py``: a namespace
    folder, which a regular package later on the path wins over)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args["threads"]), "PYTHONPATH": os.pathsep.join([str(cwd), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-P", "-m", "bench.throughput.engine", "worker", json.dumps(args)],
                          cwd=cwd, env=env, capture_output=True, text=True)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        raise RuntimeError(f"worker in {cwd} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(line[-1][len("RESULT "):])


def baseline_checkout(rev: str) -> Path:
    """A git worktree of ``rev`` (re-used if present) under the system temp dir."""
    path = Path(tempfile.gettempdir()) / f"distnerf-engine-{rev}"
    if not (path / "distnerf").exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(path), rev],
                       check=True, capture_output=True)
    return path


def summarise(rows: list[dict], pixels: int) -> dict:
    secs = [r["seconds"] for r in rows]
    return {"views": len(rows), "seconds_median": statistics.median(secs), "seconds_all": secs,
            "rays_per_s_median": pixels / statistics.median(secs),
            "psnr": statistics.mean(r["psnr"] for r in rows), "ssim": statistics.mean(r["ssim"] for r in rows),
            **{k: statistics.mean(r[k] for r in rows) / pixels for k in
               ("num_samples", "num_density_samples", "num_colour_samples") if k in rows[0]}}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--baseline", default="bb24e52")
    ap.add_argument("--views", type=int, default=25)
    ap.add_argument("--old-views", type=int, default=25)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parts", default="eval,exact,old,memory,train")
    ap.add_argument("--repeats", type=int, default=3,
                    help="worker pairs per grid stage in the train part; turns of each engine in the alternate part")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="overrides of the run's config (e.g. eval.chunk=16384 model.eval_round_steps=96): "
                         "settings measured against the run's own")
    ap.add_argument("--out", type=Path, default=None,
                    help="result JSON (default bench/throughput/results/RUN_NAME/bench_engine.json)")
    if argv[:1] == ["worker"]:
        return worker(json.loads(argv[1]))
    args = ap.parse_args(argv)
    meta = start_meta()
    parts = set(args.parts.split(","))

    import torch
    from omegaconf import OmegaConf

    from distnerf.config_check import global_batch
    from distnerf.data import load_scene
    from distnerf.engine.evaluate import render_image, select_views
    from distnerf.model import build_model
    from distnerf.observe.metrics import psnr, ssim
    from distnerf.engine.runs import load_run_config, load_weights

    torch.set_num_threads(args.threads)
    cfg, run_dir = load_run_config([f"run_dir={args.run_dir}", *args.set])
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    dataset = OmegaConf.to_container(cfg.dataset, resolve=True)
    for key in ("root", "cache_dir"):  # workers run in other checkouts: absolute paths
        if dataset.get(key):
            dataset[key] = str(Path(dataset[key]).resolve())
    state, step = load_weights(cfg, run_dir)
    scene = load_scene(dataset, "test")
    pixels = scene.height * scene.width
    report = {"run_dir": str(run_dir), "step": step, "baseline": args.baseline, "threads": args.threads,
              "overrides": list(args.set), "chunk": int(cfg.eval.chunk),
              "resolution": [scene.height, scene.width], "load_before": os.getloadavg()}
    runtime = {k: v for k, v in model_cfg.items() if k not in ("compile", "compile_mode")}
    tmp = Path(tempfile.mkdtemp(prefix="bench_engine_"))
    state_file = tmp / "state.pt"
    torch.save(state, state_file)

    views = select_views(len(scene), args.views)
    if parts & {"eval", "exact"}:
        new = build_model(runtime, scene.aabb, scene.background)
        new.load_state_dict(state)
        exact = build_model({**runtime, "termination": 0.0, "color_threshold": 0.0}, scene.aabb, scene.background)
        exact.load_state_dict(state)
        rows = {"new": [], "exact": []}
        for v in views:
            for name, model in (("new", new), ("exact", exact)):
                if name == "new" and "eval" not in parts or name == "exact" and "exact" not in parts:
                    continue
                start = time.perf_counter()
                out = render_image(model, scene, v, int(cfg.eval.chunk), torch.device("cpu"))
                rows[name].append({"view": v, "seconds": time.perf_counter() - start,
                                   "psnr": psnr(out["rgb"], scene.images[v]), "ssim": ssim(out["rgb"], scene.images[v]),
                                   **{k: out[k] for k in ("num_samples", "num_density_samples",
                                                          "num_colour_samples") if k in out}})
            print(f"view {v}: " + ", ".join(f"{k} {r[-1]['seconds']:.2f} s {r[-1]['psnr']:.2f} dB"
                                            for k, r in rows.items() if r), flush=True)
        report.update({k: summarise(r, pixels) for k, r in rows.items() if r})
        if rows["new"] and rows["exact"]:
            report["psnr_new_minus_exact"] = report["new"]["psnr"] - report["exact"]["psnr"]
    if "old" in parts:
        old_views = select_views(len(scene), args.old_views)
        res = run_worker(baseline_checkout(args.baseline),
                         {"mode": "render", "legacy": True, "threads": args.threads, "model_cfg": model_cfg,
                          "dataset": dataset, "state": str(state_file), "views": old_views,
                          "chunk": int(cfg.eval.chunk)})
        report["old"] = summarise(res["rows"], pixels)
        if "new" in report:
            same = [r for r in rows["new"] if r["view"] in set(old_views)]
            if same:
                report["old_over_new_seconds_same_views"] = (statistics.median(r["seconds"] for r in res["rows"])
                                                            / statistics.median(r["seconds"] for r in same))
        print(f"old engine: {report['old']['seconds_median']:.2f} s/view, {report['old']['psnr']:.2f} dB", flush=True)
    if "alternate" in parts:  # both engines in fresh workers, taking turns: the ratio survives drift of the machine
        alt_views = select_views(len(scene), args.old_views)
        turns = {"new": [], "old": []}
        for rep in range(args.repeats):
            for name in (("new", "old") if rep % 2 == 0 else ("old", "new")):
                res = run_worker(ROOT if name == "new" else baseline_checkout(args.baseline),
                                 {"mode": "render", "legacy": name == "old", "threads": args.threads,
                                  "model_cfg": model_cfg, "dataset": dataset, "state": str(state_file),
                                  "views": alt_views, "chunk": int(cfg.eval.chunk)})
                turns[name].append(summarise(res["rows"], pixels))
                print(f"turn {rep} {name}: {turns[name][-1]['seconds_median']:.3f} s/view, "
                      f"{turns[name][-1]['psnr']:.5f} dB", flush=True)
        med = {k: statistics.median(t["seconds_median"] for t in v) for k, v in turns.items()}
        report["alternate"] = {"views": len(alt_views), "repeats": args.repeats, "turns": turns,
                               "new_seconds_median": med["new"], "old_seconds_median": med["old"],
                               "old_over_new": med["old"] / med["new"],
                               "psnr_new_minus_old": turns["new"][0]["psnr"] - turns["old"][0]["psnr"]}
        print(f"alternating: old/new {med['old'] / med['new']:.3f} ({med['old']:.3f} / {med['new']:.3f} s/view)",
              flush=True)
    if "memory" in parts:
        report["memory"] = {}
        for chunk in (8192, 65536):
            res = run_worker(ROOT, {"mode": "render", "threads": args.threads, "model_cfg": model_cfg,
                                    "dataset": dataset, "state": str(state_file), "views": [views[0]],
                                    "chunk": chunk})
            report["memory"][str(chunk)] = {"peak_rss_mb": res["peak_rss_mb"], "rss_before_render_mb": res["rss_before_mb"],
                                            "seconds": res["rows"][0]["seconds"]}
            print(f"chunk {chunk}: peak RSS {res['peak_rss_mb']:.0f} MB", flush=True)
    if "train" in parts:
        report["train"] = {}
        for res_n in (64, 128, 160):
            model = build_model(runtime, scene.aabb, scene.background)
            model.load_state_dict(state)
            model.tighten_aabb = False
            with torch.no_grad():
                model.upsample(res_n)
            stage_file = tmp / f"state_{res_n}.pt"
            torch.save(model.state_dict(), stage_file)
            job = {"mode": "train", "threads": args.threads, "model_cfg": {**model_cfg, "resolutions": [res_n],
                                                                           "upsample_steps": []},
                   "dataset": dataset, "state": str(stage_file), "steps": 16, "warmup": 6,
                   "rays": global_batch(cfg.train, 1)}  # one process's batch
            runs = {"new": [], "old": []}
            for _ in range(args.repeats):  # alternating, so that a drift of the machine hits both
                runs["new"].append(run_worker(ROOT, job))
                runs["old"].append(run_worker(baseline_checkout(args.baseline), {**job, "legacy": True}))
            med = {k: statistics.median(r["rays_per_s"] for r in v) for k, v in runs.items()}
            report["train"][str(res_n)] = {"new": runs["new"][0], "old": runs["old"][0], "runs": runs,
                                           "rays_per_s_median": med, "repeats": args.repeats,
                                           "new_over_old": med["new"] / med["old"]}
            print(f"train {res_n}^3: new {med['new']:.0f} rays/s, old {med['old']:.0f} rays/s "
                  f"(medians of {args.repeats})", flush=True)
    report["load_after"] = os.getloadavg()
    out = args.out or default_out(__file__, f"{Path(run_dir).name}/bench_engine.json")
    write_result(out, report, meta)
    print(json.dumps({k: v for k, v in report.items() if k in ("new", "exact", "old", "psnr_new_minus_exact",
                                                                "old_over_new_seconds_same_views", "memory")},
                     indent=1, default=str))


if __name__ == "__main__":
    main()
