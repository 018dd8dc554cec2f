"""Measure an ``ss`` run against a ``ddp`` run of the same data (bench/scaling/characterisation.md, "`ss` fused render").

    python -m bench.scaling.ss runs/bench/wide_ss runs/bench/wide_ddp [--views 5] [--threads 1] [--out PATH]

Reports, on one process with ``--threads`` compute threads:

* render time per image of the fused ``ss`` model (``segment`` and ``blend``) and of the
  single ``ddp`` model on the same views, renderers interleaved per view, medians; the
  share of the fused render spent in what fusion adds (routing samples to regions,
  exchange and compositing);
* test PSNR/SSIM: the runs' own ``metrics.json`` (every test view; ``ss`` through
  distributed ``segment`` fusion) and ``blend`` / ``segment`` on the timed views;
* training rays/s per rank (median of the per-step figures after warm-up);
* the share of each sub-model's samples (its own marching, on training rays routed
  to it) that lie outside its own region: the work independent training wastes;
* parameter counts.
Writes JSON to ``--out`` (default ``bench/scaling/results/NAME/bench_ss.json``, NAME the ``ss`` run's
directory name without its ``_ss`` suffix), with a ``meta`` block (command, date, git commit,
load before/after), and prints a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf


from bench.common import default_out, start_meta, write_result

from distnerf import checkpoint as ckpt
from distnerf import distributed as D
from distnerf.data import load_scene
from distnerf.engine.evaluate import render_image, select_views
from distnerf.observe.metrics import psnr, ssim
from distnerf.engine.runs import load_renderer, load_run_config
from distnerf.sampler import SyncSampler
from distnerf.strategy.fusion import FusedRenderer
from distnerf.strategy.partition import Partition
from distnerf.strategy.regions import RegionRayFilter, context_memory_share


def rank_rays_per_s(run: Path, warmup: int = 5) -> list[float]:
    out = []
    for f in sorted((run / "profile").glob("rank_*.json")):
        steps = json.loads(f.read_text())["steps"][warmup:]
        out.append(statistics.median(s["rays_per_s"] for s in steps) if steps else float("nan"))
    return out


@torch.no_grad()
def outside_share(fused: FusedRenderer, scene, num_rays: int = 8192) -> list[float]:
    """Per region: share of its sub-model's occupied marching samples outside its own region."""
    shares = []
    for k, model in zip(fused.regions, fused.models):
        if model.step_size() is None:
            shares.append(float("nan"))
            continue
        keep = RegionRayFilter(fused.partition.enlarged()[[k]])
        batch = SyncSampler(scene, num_rays, 0, 1 << 22).host_batch(0)
        rays = batch.rays.map(lambda t: t[keep(batch.rays)])
        samples = model.marcher()(rays.origins, rays.directions, rays.near, rays.near, rays.far)
        pts = samples.points(rays.origins, rays.directions)
        inside = fused.partition.contains(pts.double())[:, k]
        shares.append(float(1.0 - inside.float().mean()) if len(pts) else float("nan"))
    return shares


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ss_run", type=Path)
    ap.add_argument("ddp_run", type=Path)
    ap.add_argument("--views", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                    help="where the renderers run (auto: CUDA when available)")
    ap.add_argument("--out", type=Path, default=None,
                    help="result JSON (default bench/scaling/results/NAME/bench_ss.json, NAME = SS_RUN's name without _ss)")
    args = ap.parse_args()
    meta = start_meta()
    torch.set_num_threads(args.threads)
    cfg_ss, run_ss = load_run_config([f"run_dir={args.ss_run}"])
    env = D.init_distributed(args.device, timeout_s=cfg_ss.dist_timeout_s, setup_timeout_s=cfg_ss.dist_setup_timeout_s)
    cfg_ddp, run_ddp = load_run_config([f"run_dir={args.ddp_run}"])
    scene = load_scene(OmegaConf.to_container(cfg_ss.dataset, resolve=True), "test")
    factor = cfg_ss.eval.downscale
    scene_eval = scene.downscaled(factor) if factor > 1 else scene
    segment, _ = load_renderer(cfg_ss, run_ss, scene, env)
    blend, _ = load_renderer(OmegaConf.merge(cfg_ss, {"fusion": "blend"}), run_ss, scene, env)
    single, _ = load_renderer(cfg_ddp, run_ddp, scene, env)
    renderers = {"ss_segment": segment, "ss_blend": blend, "ddp": single}
    views = select_views(len(scene_eval), args.views)
    chunk = int(cfg_ss.eval.chunk)
    times = {k: [] for k in renderers}
    quality = {k: {"psnr": [], "ssim": []} for k in renderers}
    samples = {k: [] for k in renderers}
    for r in renderers.values():  # warm-up
        render_image(r, scene_eval, views[0], chunk, env.device)
    for fused in (segment, blend):
        fused.timing.clear()
    for i, v in enumerate(views):
        order = list(renderers) if i % 2 == 0 else list(reversed(list(renderers)))
        for name in order:
            start = time.perf_counter()
            out = render_image(renderers[name], scene_eval, v, chunk, env.device)
            times[name].append(time.perf_counter() - start)
            samples[name].append(out["num_samples"])
            quality[name]["psnr"].append(psnr(out["rgb"], scene_eval.images[v]))
            quality[name]["ssim"].append(ssim(out["rgb"], scene_eval.images[v]))
    train_scene = load_scene(OmegaConf.to_container(cfg_ss.dataset, resolve=True), "train")
    manifest = ckpt.read_manifest(ckpt.latest(run_ss / "checkpoints"))
    partition = Partition.from_dict(manifest["partition"])
    report = {
        "views": views, "resolution": [scene_eval.height, scene_eval.width], "threads": args.threads,
        "render_s_median": {k: statistics.median(v) for k, v in times.items()},
        "render_s_all": times,
        "samples_per_image_median": {k: statistics.median(v) for k, v in samples.items()},
        "fusion_share": {k: {"routing": r.timing["routing_s"] / r.timing["total_s"],
                             "exchange_composite": r.timing["exchange_composite_s"] / r.timing["total_s"]}
                         for k, r in (("ss_segment", segment), ("ss_blend", blend))},
        "psnr_timed_views": {k: statistics.mean(q["psnr"]) for k, q in quality.items()},
        "ssim_timed_views": {k: statistics.mean(q["ssim"]) for k, q in quality.items()},
        "metrics_json": {k: {m: json.loads((run / "metrics.json").read_text())[m] for m in ("psnr", "ssim", "step")}
                         for k, run in (("ss", run_ss), ("ddp", run_ddp))},
        "train_rays_per_s_per_rank": {"ss": rank_rays_per_s(run_ss), "ddp": rank_rays_per_s(run_ddp)},
        "outside_own_region_share": outside_share(segment, train_scene),
        "params": {"ss_total": sum(p.numel() for p in segment.parameters()),
                   "ddp": sum(p.numel() for p in single.parameters())},
        "context_memory_share": [context_memory_share(m) for m in segment.models],
        "partition": {"kind": partition.kind, "regions": len(partition), "overlap": partition.overlap},
    }
    report["render_ratio_segment_over_ddp"] = (report["render_s_median"]["ss_segment"]
                                               / report["render_s_median"]["ddp"])
    name = args.ss_run.resolve().name
    out_path = args.out or default_out(__file__, f"{name[:-3] if name.endswith('_ss') else name}/bench_ss.json")
    write_result(out_path, report, meta)
    m = report["metrics_json"]
    print("| | ss segment | ss blend | ddp |\n|---|---|---|---|")
    print(f"| test PSNR, all views (training eval) | {m['ss']['psnr']:.2f} | | {m['ddp']['psnr']:.2f} |")
    print("| PSNR, timed views | " + " | ".join(f"{report['psnr_timed_views'][k]:.2f}" for k in renderers) + " |")
    print("| SSIM, timed views | " + " | ".join(f"{report['ssim_timed_views'][k]:.4f}" for k in renderers) + " |")
    print("| render s/image (median) | " + " | ".join(f"{report['render_s_median'][k]:.2f}" for k in renderers)
          + " |")
    print("| samples per image (median) | " + " | ".join(f"{report['samples_per_image_median'][k]:.0f}"
                                                       for k in renderers) + " |")
    print(f"| steps trained | {m['ss']['step']} | | {m['ddp']['step']} |")
    print(json.dumps({k: report[k] for k in ("fusion_share", "train_rays_per_s_per_rank", "outside_own_region_share",
                                             "params", "context_memory_share", "render_ratio_segment_over_ddp")},
                     indent=1))


if __name__ == "__main__":
    main()
