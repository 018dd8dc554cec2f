"""Input-pipeline benchmark: sync vs pipelined vs device samplers, side by side.

    # lego and fern, 2 ranks (the issue's comparison), medians over steps after warm-up
    python -m bench.throughput.sampler compare alone --dataset lego fern --nproc 2 --num-workers 1 --steps 40 \
        --warmup 8 --repeats 2
    # stall-bound regime on a 2-core machine: one rank, one compute thread, one worker; every
    # batch decodes the images it draws from (sampler.source=files, 4 images per step), a cheap
    # model step (16^3 grid, few samples)
    python -m bench.throughput.sampler compare alone --dataset lego --samplers sync pipelined --nproc 1 \
        --threads 1 --num-workers 1 --global-rays 16384 --steps 30 --warmup 6 --repeats 3 \
        --extra "model.resolutions=[16]" "model.upsample_steps=[]" model.step_ratio=4 model.tv_weight=0 \
        sampler.source=files sampler.policy=per_image sampler.images_per_step=4
    # memory over 10,000 batches; the pixel cache's build and reuse
    python -m bench.throughput.sampler memory --dataset lego --memory-batches 10000
    python -m bench.throughput.sampler cache --dataset lego
    # smoke (seconds)
    python -m bench.throughput.sampler all --dataset synthetic --steps 6 --warmup 2 --memory-batches 50

Parts (any subset, in this order, in one process):

``compare``: the real trainer (``python -m distnerf.train``, or torchrun with
``--nproc`` > 1) once per sampler and repeat, runs interleaved (sync, pipelined,
device, sync, ...) so that drift of the machine hits all alike; ``log_every=1``.
Per sampler: median step time, ``input_wait`` and ``copy`` (trainer timer), their
shares of the step, rays/s, all over steps after ``--warmup``. Then the speedup of
``pipelined`` over ``sync`` against the ideal ``T / (T - S)`` (``T`` sync step time,
``S`` its sampling time = sync ``input_wait``) and against the capacity bound of W
workers ``(S + C) / max(S / W, C)`` with ``C = T - S`` (at most W free cores).

``alone``: each sampler with no trainer: batches/s and rays/s (``to_device``
included), against the trainer's consumption rate from ``compare`` when run.

``cache``: the train split loaded in fresh processes into RAM, then through
``sampler.cache_dir`` (building the memory-mapped cache), then again (reusing it): time
and peak resident memory above the imports.

``memory``: a pipelined sampler drawing ``--memory-batches`` batches; resident and
shared memory (``/proc/PID/status`` VmRSS, RssShmem) of the trainer process and the
workers, sampled ten times.

Results print as JSON lines and go to ``--out`` (default
``bench/throughput/results/sampler_PARTS_DATASETS.json``) as ``{"meta": ..., "rows": [...]}``, the meta block
holding the command, date, git commit and load before/after.

Cores limit every figure: the pipelined sampler only hides sampling time S when its
workers run on cores the trainer's compute does not use. With one worker the step
can at best shrink from S + C to max(S, C) (capacity bound above); W workers need W
spare cores. On a 2-core machine measure with one rank, ``--threads 1`` and
``--num-workers 1`` (one core each); with 2 ranks there is no spare core and
``pipelined`` cannot beat ``sync`` by much. On a 16-core GPU machine use several
workers per rank. A stall-bound regime needs S comparable to C. Building a batch from
decoded pixels costs ~0.2 us per ray here, the cheapest model step ~5-10 us per ray, so
large batches and a cheap model alone give S ~ 3% of the step; per-step image work
(``sampler.source=files``: each batch decodes its ``images_per_step`` images, ~20 ms
each for lego) brings S to C. Check the sync ``input_wait_share`` of a short
``compare --samplers sync`` first. Every row records the 1-minute load average
(``load_before``/``load_after``): other work on the machine takes the spare core.
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

import torch
from bench.common import ROOT, default_out, start_meta, write_result
from distnerf.observe.logger import read_metrics_log

DATASETS = {
    "lego": ["dataset=blender", "dataset.root=../shared/data/nerf_synthetic_half/lego"],
    "fern": ["dataset=llff", "dataset.root=../shared/data/nerf_llff_data/fern"],
    "synthetic": ["dataset=synthetic"],
}
KINDS = ("sync", "pipelined", "device")


def dataset_overrides(name: str) -> list[str]:
    if name in DATASETS:
        return DATASETS[name]
    raise SystemExit(f"--dataset must be one of {sorted(DATASETS)}, got {name!r}")


# ----------------------------------------------------------------------------- compare
def train_run(args, kind: str, run_dir: Path) -> list[dict]:
    base = [sys.executable, "-m", "distnerf.train"] if args.nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
        "-m", "distnerf.train"]
    workers = [] if kind == "sync" else [f"sampler.num_workers={args.num_workers}", f"sampler.prefetch={args.prefetch}"]
    cmd = base + [f"run_dir={run_dir}", *dataset_overrides(args.dataset), f"sampler={kind}", *workers,
                  f"train.global_rays={args.global_rays}", f"train.max_steps={args.steps}", "monitor.log_every=1",
                  "checkpoints.every=-1", "monitor.progress=false", "eval.enabled=false", "logger.wandb.mode=disabled",
                  f"device={args.device}", *args.extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    return read_metrics_log(run_dir)


def load_average() -> float:
    """1-minute load average of the machine (``uptime``): other work competing for the cores."""
    return round(os.getloadavg()[0], 2)


def step_stats(rows: list[dict], warmup: int) -> dict:
    """Medians over steps after ``warmup`` of one run's per-step rows (``log_every=1``)."""
    steps = [r for r in rows if "loss" in r]
    prev, per_step = 0.0, []
    for r in steps:
        per_step.append((r["step"], r["train_seconds"] - prev, r))
        prev = r["train_seconds"]
    kept = [(t, r) for step, t, r in per_step if step > warmup]
    if not kept:
        raise SystemExit(f"no steps after --warmup {warmup}")
    step_s = statistics.median(t for t, _ in kept)
    wait = statistics.median(r.get("time_input_wait", 0.0) for _, r in kept)
    copy = statistics.median(r.get("time_copy", 0.0) for _, r in kept)
    total = sum(t for t, _ in kept)
    return {"step_s": step_s, "input_wait_s": wait, "copy_s": copy,
            "input_wait_share": sum(r.get("time_input_wait", 0.0) for _, r in kept) / total,
            "copy_share": sum(r.get("time_copy", 0.0) for _, r in kept) / total,
            "rays_per_s": statistics.median(r["rays_per_s"] for _, r in kept), "steps": len(kept)}


def compare(args) -> dict:
    runs = {k: [] for k in args.samplers}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for kind in args.samplers:
                load_before = load_average()
                stats = step_stats(train_run(args, kind, Path(tmp) / f"{kind}_{rep}"), args.warmup)
                stats.update(load_before=load_before, load_after=load_average())
                runs[kind].append(stats)
                emit({"part": "compare", "sampler": kind, "repeat": rep, **stats})
                if kind == "pipelined" and runs.get("sync"):  # the ratio of this repeat, side by side
                    emit({"part": "compare_pair", "repeat": rep,
                          **speedup(runs["sync"][-1], stats, args.num_workers)})
    out = {k: {key: statistics.median(s[key] for s in v) for key in v[0]} for k, v in runs.items()}
    if "sync" in out and "pipelined" in out:
        out["speedup"] = speedup(out["sync"], out["pipelined"], args.num_workers)
        pairs = [speedup(a, b, args.num_workers) for a, b in zip(runs["sync"], runs["pipelined"])]
        out["speedup"]["median_of_pairs"] = statistics.median(p["pipelined_over_sync"] for p in pairs)
        out["speedup"]["median_share_of_pairs"] = statistics.median(p["share_of_min_ideal_bound"] for p in pairs)
    emit({"part": "compare_summary", **out})
    return out


def speedup(sync: dict, pipelined: dict, num_workers: int) -> dict:
    """Speedup of ``pipelined`` over ``sync`` against the ideal and the capacity bound.

    ``T`` sync step, ``S`` its sampling time (its ``input_wait``), ``C = T - S``: ideal
    ``T / C`` (sampling fully hidden), capacity bound of W workers ``(S + C) / max(S / W, C)``.
    """
    t, s = sync["step_s"], sync["input_wait_s"]
    c = max(t - s, 1e-12)
    ideal, bound = t / c, (s + c) / max(s / num_workers, c)
    value = t / pipelined["step_s"]
    return {"pipelined_over_sync": value, "ideal": ideal, "capacity_bound": bound,
            "share_of_min_ideal_bound": value / min(ideal, bound), "sync_sampling_s": s, "sync_compute_s": c,
            "pipelined_input_wait_share": pipelined["input_wait_share"]}


# ----------------------------------------------------------------------------- alone
def sampler_options(args) -> dict:
    """``sampler.*`` entries of ``--extra`` (e.g. source, policy, images_per_step) as a dict."""
    import yaml

    return {ov.split("=", 1)[0][len("sampler."):]: yaml.safe_load(ov.split("=", 1)[1])
            for ov in args.extra if ov.startswith("sampler.")}


def load(args):
    from omegaconf import OmegaConf

    from distnerf.data import load_scene
    from distnerf.sampler import pixel_source

    cfg = OmegaConf.load("conf/train.yaml")
    for ov in dataset_overrides(args.dataset) + [e for e in args.extra if e.startswith("dataset.")]:
        key, value = ov.split("=", 1)
        if key == "dataset":
            cfg.dataset = OmegaConf.load(f"conf/dataset/{value}.yaml")
        else:
            OmegaConf.update(cfg, key, value)
    return load_scene(OmegaConf.to_container(cfg.dataset, resolve=True), "train",
                      pixels=pixel_source(sampler_options(args)))


def make_sampler(args, kind: str, scene, rays: int):
    from distnerf.sampler import build_sampler

    cfg = {**sampler_options(args), "name": kind, "num_workers": args.num_workers, "prefetch": args.prefetch}
    return build_sampler(cfg, scene, rays, 0, 0, torch.device(args.device))


def alone(args, consumption: dict | None = None) -> dict:
    scene = load(args)
    rays = args.global_rays // args.nproc
    out = {}
    for kind in args.samplers:
        sampler = make_sampler(args, kind, scene, rays)
        try:
            sampler.start(0)
            for k in range(args.warmup):
                sampler.batch(k)
            sync_device(args.device)
            start = time.perf_counter()
            for k in range(args.warmup, args.warmup + args.alone_batches):
                sampler.batch(k)
            sync_device(args.device)
            seconds = time.perf_counter() - start
        finally:
            sampler.close()
        row = {"batches_per_s": args.alone_batches / seconds, "rays_per_s": args.alone_batches * rays / seconds,
               "load": load_average()}
        if consumption and kind in consumption:
            row["trainer_steps_per_s"] = 1.0 / consumption[kind]["step_s"]
            row["capacity_over_consumption"] = row["batches_per_s"] / row["trainer_steps_per_s"]
        out[kind] = row
        emit({"part": "alone", "sampler": kind, "rays_per_batch": rays, **row})
    return out


def sync_device(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- memory
def proc_memory(pid: int) -> dict:
    """VmRSS and RssShmem of ``pid`` in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssShmem"):
            out[key] = int(value.split()[0]) / 1024
    return out


def memory(args) -> dict:
    scene = load(args)
    rays = args.global_rays // args.nproc
    sampler = make_sampler(args, "pipelined", scene, rays)
    samples = []
    try:
        sampler.start(0)
        every = max(args.memory_batches // 10, 1)
        for k in range(args.memory_batches):
            sampler.batch(k)
            if k % every == 0 or k == args.memory_batches - 1:
                row = {"batch": k, "trainer": proc_memory(os.getpid()),
                       "workers": [proc_memory(p) for p in sampler.worker_pids]}
                samples.append(row)
                emit({"part": "memory", **row})
    finally:
        sampler.close()
    first, last = samples[0], samples[-1]
    summary = {"batches": args.memory_batches,
               "trainer_rss_growth_mib": last["trainer"]["VmRSS"] - first["trainer"]["VmRSS"],
               "workers_rss_growth_mib": sum(w["VmRSS"] for w in last["workers"])
               - sum(w["VmRSS"] for w in first["workers"]),
               "shmem_growth_mib": last["trainer"].get("RssShmem", 0) - first["trainer"].get("RssShmem", 0)}
    emit({"part": "memory_summary", **summary})
    return {"samples": samples, **summary}


# ----------------------------------------------------------------------------- cache
def cache_probe(dataset: str, extra: list[str]) -> None:
    """A fresh process (``python -m bench.throughput.sampler cache-probe DATASET [OVERRIDE...]``): load the
    train split as :func:`load` does; prints one JSON line: seconds and peak RSS above the imports (MiB)."""
    import resource

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    scene = load(argparse.Namespace(dataset=dataset, extra=extra))
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "peak_rss_above_imports_mib": peak - base,
                      "pixels_mib": scene.images.numel() * 4 / 2**20}))


def cache(args) -> dict:
    """Load the train split in fresh processes: into RAM, building the pixel cache, reusing it.

    Time and peak resident memory (``ru_maxrss``) above the imports of each.
    """
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for how, extra in (("ram", []), ("build", [f"sampler.cache_dir={tmp}"]), ("reuse", [f"sampler.cache_dir={tmp}"])):
            proc = subprocess.run([sys.executable, "-m", "bench.throughput.sampler", "cache-probe", args.dataset, *extra],
                                  capture_output=True, text=True, cwd=ROOT,
                                  env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
            if proc.returncode:
                raise SystemExit(f"cache probe ({how}) failed:\n{proc.stderr[-4000:]}")
            out[how] = {**json.loads(proc.stdout.splitlines()[-1]), "load": load_average()}
            emit({"part": "cache", "pixels": how, **out[how]})
    return out


# ----------------------------------------------------------------------------- main
RESULTS: list[dict] = []


def emit(row: dict) -> None:
    RESULTS.append(row)
    print(json.dumps(row, default=str), flush=True)


def main(argv: list[str] | None = None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["cache-probe"]:
        return cache_probe(argv[1], argv[2:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", nargs="+", choices=["compare", "alone", "memory", "cache", "all"])
    parser.add_argument("--dataset", nargs="+", default=["lego"], help=f"one or more of {sorted(DATASETS)}, in turn")
    parser.add_argument("--samplers", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--nproc", type=int, default=1, help="ranks (torchrun when > 1)")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each rank")
    parser.add_argument("--num-workers", type=int, default=1, help="pipelined workers per rank")
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument("--global-rays", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--alone-batches", type=int, default=50)
    parser.add_argument("--memory-batches", type=int, default=10000)
    parser.add_argument("--device", default="cpu", help="cpu | cuda | auto (the trainer's device=)")
    parser.add_argument("--extra", nargs="*", default=[], help="more Hydra overrides for the trainer runs")
    parser.add_argument("--out", "--json", dest="out", default=None,
                        help="result JSON (default bench/throughput/results/sampler_PARTS_DATASETS.json)")
    args = parser.parse_args(argv)
    meta = start_meta()
    out = args.out or default_out(__file__, f"sampler_{'-'.join(args.parts)}_{'-'.join(args.dataset)}.json")
    parts = ["compare", "alone", "memory", "cache"] if "all" in args.parts else args.parts
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(args.threads)
    for dataset in list(args.dataset):
        args.dataset = dataset
        emit({"part": "setup", "dataset": args.dataset, "nproc": args.nproc, "threads": args.threads,
              "num_workers": args.num_workers, "global_rays": args.global_rays, "device": args.device,
              "cpu_cores": os.cpu_count(), "load": load_average(), "extra": args.extra})
        consumption = compare(args) if "compare" in parts else None
        if "alone" in parts:
            alone(args, consumption)
        if "memory" in parts:
            memory(args)
        if "cache" in parts:
            cache(args)
    write_result(out, RESULTS, meta)


if __name__ == "__main__":
    main()
