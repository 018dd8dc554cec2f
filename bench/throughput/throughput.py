"""Fixed-batch training throughput per model, and NeRF FLOP efficiency.

    python -m bench.throughput.throughput --models grid ngp nerf --rays 4096 --repeats 5 \
        --root ../shared/data/nerf_synthetic_half/lego [--device cuda] [--flops] [--out PATH]

For each model: forward + backward + Adam step on the same lego ray batches (after
warm-up steps so that occupancy grids have pruned empty space), reporting the median
over ``--repeats`` timed steps of rays/s and samples/s. ``--flops`` measures, for
``model=nerf``, (a) the MLP alone against ``torch.mm`` at the same shapes and (b) the
whole training step against a large square matmul, all in one process. Writes JSON to
``--out`` (default ``bench/throughput/results/throughput.json``) with a ``meta`` block (command, date,
git commit, load before/after).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from bench.common import default_out, start_meta, write_result
from omegaconf import OmegaConf

from distnerf.data import load_scene
from distnerf.model import build_model
from distnerf.sampler import SyncSampler

from distnerf.components.loss import photometric_sse
from distnerf.components.optim import build_optimizer
from distnerf.config_check import section
from distnerf.schema import OptimConfig
from distnerf.components.regularizer import add_regularizer_grads_

NERF_FLOPS_PER_SAMPLE = 3.56e6  # forward+backward, per trained sample (issue figure)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(model, sampler, optimizer, device, warmup: int, repeats: int):
    times, samples = [], []
    for step in range(warmup + repeats):
        model.update_state(step)
        batch = sampler.batch(step).to(device)
        sync(device)
        start = time.perf_counter()
        out = model(batch.rays, torch.Generator(device).manual_seed(batch.jitter_seed))
        loss = photometric_sse(out, batch.rgb, batch.valid) / len(batch.rgb)
        loss.backward()
        add_regularizer_grads_(model)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync(device)
        if step >= warmup:
            times.append(time.perf_counter() - start)
            samples.append(out["num_samples"])
    return times, samples


def matmul_flops(n: int, device, repeats: int = 5, dtype=torch.float32) -> float:
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    ts = []
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        a @ b
        sync(device)
        ts.append(time.perf_counter() - t)
    return 2 * n ** 3 / statistics.median(ts)


def nerf_mlp_efficiency(model, num_points: int, device, repeats: int) -> dict:
    """MLP forward+backward FLOP/s vs. torch.mm on the MLP's own layer shapes."""
    mlp = model.coarse
    pts = torch.rand(num_points, 3, device=device)
    dirs = torch.nn.functional.normalize(torch.randn(num_points, 3, device=device), dim=-1)
    linears = [m for m in mlp.modules() if isinstance(m, torch.nn.Linear)]
    flops = 6 * num_points * sum(l.in_features * l.out_features for l in linears)  # fwd 2, bwd 4
    ts = []
    for _ in range(repeats + 1):
        sync(device)
        t = time.perf_counter()
        sigma, rgb = mlp(pts, dirs)
        (sigma.sum() + rgb.sum()).backward()
        sync(device)
        ts.append(time.perf_counter() - t)
    mlp_rate = flops / statistics.median(ts[1:])
    # the same GEMMs alone: x (P, in) @ W^T (in, out), forward + 2 backward GEMMs
    mats = [(torch.randn(num_points, l.in_features, device=device), torch.randn(l.in_features, l.out_features,
                                                                                device=device)) for l in linears]
    ts = []
    for _ in range(repeats + 1):
        sync(device)
        t = time.perf_counter()
        for x, w in mats:
            y = x @ w
            x @ w  # stand-in for the grad-input GEMM (same FLOPs)
            y.t() @ x  # grad-weight GEMM
        sync(device)
        ts.append(time.perf_counter() - t)
    gemm_rate = flops / statistics.median(ts[1:])
    return {"mlp_flops_per_s": mlp_rate, "gemm_flops_per_s": gemm_rate, "mlp_vs_gemm": mlp_rate / gemm_rate}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["grid", "ngp", "nerf"])
    parser.add_argument("--rays", type=int, default=4096)
    parser.add_argument("--nerf-rays", type=int, default=1024, help="batch for model=nerf (it is ~100x slower)")
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--root", default="../shared/data/nerf_synthetic_half/lego")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--flops", action="store_true")
    parser.add_argument("--out", "--json", dest="out", default=None,
                        help="result JSON (default bench/throughput/results/throughput.json)")
    args = parser.parse_args()
    meta = start_meta()
    device = torch.device(args.device)
    scene = load_scene({"name": "blender", "root": args.root}, "train")
    results = {"device": str(device), "threads": torch.get_num_threads(), "models": {}}
    for name in args.models:
        torch.manual_seed(0)
        cfg = OmegaConf.to_container(OmegaConf.load(f"conf/model/{name}.yaml"))
        model = build_model(cfg, scene.aabb, scene.background).to(device).train()
        rays = args.nerf_rays if name == "nerf" else args.rays
        sampler = SyncSampler(scene, rays, 0, 0)
        optimizer = build_optimizer(model, section(OptimConfig, lr=5e-4 if name == "nerf" else 1e-3))
        warmup = 2 if name == "nerf" else args.warmup
        times, samples = time_steps(model, sampler, optimizer, device, warmup, args.repeats)
        med = statistics.median(times)
        row = {"rays": rays, "step_s": med, "rays_per_s": rays / med,
               "samples_per_s": statistics.median(s / t for s, t in zip(samples, times)),
               "samples_per_ray": statistics.median(samples) / rays,
               "step_s_all": times}
        if name == "nerf":
            row["step_flops_per_s"] = statistics.median(samples) * NERF_FLOPS_PER_SAMPLE / med
            if args.flops:
                row.update(nerf_mlp_efficiency(model, rays * 64, device, args.repeats))
                row["square_matmul_flops_per_s"] = matmul_flops(4096 if device.type == "cpu" else 16384, device)
                row["step_vs_square_matmul"] = row["step_flops_per_s"] / row["square_matmul_flops_per_s"]
        results["models"][name] = row
        print(name, json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
                                if k != "step_s_all"}), flush=True)
    write_result(args.out or default_out(__file__, "throughput.json"), results, meta)


if __name__ == "__main__":
    main()
