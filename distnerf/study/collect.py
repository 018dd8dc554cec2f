"""The figures of one finished cell, read from its run directory (no re-computation).

Sources: ``profile/rank_*.json`` through :func:`distnerf.observe.run_report.build_report` (the
step breakdown, medians after the skipped warm-up steps), ``metrics.jsonl`` (communication
bytes, the model-size and input events, the PSNR-against-time curve), ``metrics.json`` (test
quality, per-view render seconds, the fusion stage's timing) and ``config.yaml``.

Units: seconds, bytes, rays; shares are fractions of the median step (0..1).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import yaml

from ..config_check import global_batch
from ..observe.logger import final_model_size, read_metrics_log
from ..observe.run_report import build_report

BREAKDOWN = ("input_wait", "copy", "forward", "backward", "exposed_comm", "step_sync", "optimizer", "unattributed")
"""The stacked phases of the study's breakdown (the others, e.g. ``model_update``,
``regularizer``, ``checkpoint``, are summed into ``other``)."""


def _rows(run_dir: Path) -> list[dict]:
    return read_metrics_log(run_dir)


def comm_totals(steps: list[dict]) -> dict:
    """Bytes and calls summed over the logged steps, and each seconds key only where the run wrote it:
    ``allreduce_s`` / ``exchange_s`` (gloo: the collective's duration) or ``allreduce_launch_s`` /
    ``exchange_launch_s`` (NCCL: the launch only). A key no row has is absent, never a 0."""
    comm = {k: sum(r.get(k, 0) or 0 for r in steps) for k in ("allreduce_bytes", "exchange_bytes", "allreduce_calls",
                                                              "exchange_calls", "face_bytes", "occupancy_bytes")}
    for k in ("allreduce_s", "exchange_s", "allreduce_launch_s", "exchange_launch_s"):
        if any(k in r for r in steps):
            comm[k] = sum(r.get(k, 0.0) for r in steps)
    return comm


def cell_figures(run_dir: Path) -> dict:
    """Every figure of one cell the report uses (JSON-able).

    Raises:
        FileNotFoundError / ValueError: the run directory lacks a file or holds a bad one (named).
    """
    run_dir = Path(run_dir)
    report = build_report(run_dir)
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    metrics = json.loads((run_dir / "metrics.json").read_text())
    rows = _rows(run_dir)
    keys = report["overall"]["keys"]
    median = lambda k: (keys.get(k) or {}).get("median")  # noqa: E731
    step_s = median("step_s")
    phases = {k: (keys.get(k) or {}).get("mean", 0.0) for k in BREAKDOWN}
    mean_step = (keys.get("step_s") or {}).get("mean") or 0.0
    phases["other"] = max(0.0, mean_step - sum(v or 0.0 for v in phases.values()))
    steps = [r for r in rows if "loss" in r]
    num_steps = steps[-1]["step"] if steps else 0
    comm = comm_totals(steps)
    # the finished model's (a run stopped and resumed logged one at the stop too), the peaks over its sessions
    size = final_model_size(rows) or {}
    inputs = [r for r in rows if r.get("event") == "input_summary"]
    per_view = metrics.get("per_view", [])
    view_s = [v["seconds"] for v in per_view]
    out = {
        "world_size": report["world_size"], "device": report["device"], "steps": num_steps,
        "train_seconds": steps[-1]["train_seconds"] if steps else None,
        "step_s_median": step_s, "step_s_mean": mean_step, "phases_mean_s": phases,
        "shares": report["shares"], "input_stall_share": report["input_stall_share"],
        "exposed_comm_share": report["exposed_comm_share"], "rank_imbalance": report["rank_imbalance"],
        "global_rays_per_s": report["global_rays_per_s"],
        "comm_total_s_median": median("comm_total_s"), "comm_hidden_s_median": median("comm_hidden_s"),
        "comm_bytes_per_step_median": median("comm_bytes"),
        "allreduce_bytes_per_step": comm["allreduce_bytes"] / num_steps if num_steps else None,
        "exchange_bytes_per_step": comm["exchange_bytes"] / num_steps if num_steps else None,
        # the sharded joint model's all-reduces: its face planes' gradients (every step), its occupancy merges
        "face_bytes_per_step": comm["face_bytes"] / num_steps if num_steps else None,
        "occupancy_bytes_per_step": comm["occupancy_bytes"] / num_steps if num_steps else None,
        # measured seconds only: a CUDA run writes the launch time (exchange_launch_s), never a 0 for the wait
        "exchange_s_per_step": comm["exchange_s"] / num_steps if num_steps and "exchange_s" in comm else None,
        "exchange_launch_s_per_step": (comm["exchange_launch_s"] / num_steps if num_steps and "exchange_launch_s"
                                       in comm else None),
        "global_rays": global_batch(cfg["train"], report["world_size"]), "num_workers": cfg["sampler"].get("num_workers"),
        "sampler": cfg["sampler"]["name"], "strategy": cfg["strategy"]["name"],
        "training": cfg["strategy"].get("training"), "num_regions": (cfg["strategy"].get("num_regions")
                                                                    or report["world_size"])
        if cfg["strategy"]["name"] == "ss" else 1,
        "parameters_per_rank": size.get("parameters_per_rank"), "parameters_total": size.get("parameters_total"),
        # ss: regions a training ray crosses (the partition's start-up sample): what fusion composites per ray
        "regions_crossed_mean": next((r["regions_crossed_mean"] for r in size.get("ranks", [])
                                      if r.get("regions_crossed_mean") is not None), None),
        "peak_rss_mb": size.get("peak_rss_mb"), "peak_device_memory_mb": size.get("peak_device_memory_mb"),
        "input_wait_share_run": inputs[-1]["input_wait_share"] if inputs else None,
        "psnr": metrics["psnr"], "ssim": metrics["ssim"], "test_views": len(per_view),
        "constant_psnr": metrics.get("constant_psnr"),  # the trivial level (older runs: None)
        "render_s_per_view_median": statistics.median(view_s) if view_s else None,
        "render_rays_per_view": per_view[0]["num_rays"] if per_view else None,
        "fusion_timing": metrics.get("fusion_timing"),
        "curve": [{"train_seconds": r["train_seconds"], "step": r["step"], "train_psnr": r["psnr"], "lr": r.get("lr")}
                  for r in steps],
        "val_curve": [{"step": r["step"], "val_psnr": r["val_psnr"],
                       "train_seconds": next((x["train_seconds"] for x in steps if x["step"] == r["step"]), None)}
                      for r in rows if "val_psnr" in r],
        "forward_ns_per_sample_median": median("forward_ns_per_sample"),
        "samples_per_ray_median": median("samples_per_ray"),
    }
    return out
