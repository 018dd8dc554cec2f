"""End-of-run summaries: a rank's model size and peak memory, every rank's gathered into the
``model_size`` event, and the ``input_summary`` event (the share of the steps' wall time spent
waiting for input and copying it). The trainer gathers the ranks' figures and logs these rows
(``metrics.jsonl``; read back by :func:`distnerf.observe.logger.final_model_size`)."""
from __future__ import annotations

import logging

import torch

log = logging.getLogger("distnerf")


def peak_rss_mb() -> float | None:
    """This process's peak resident memory (``VmHWM``, MiB), None where /proc is not there."""
    try:
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) / 1024 for ln in f if ln.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None


def rank_model_size(model: torch.nn.Module, parameter_report: dict, device: torch.device) -> dict:
    """This rank's figures: ``parameters`` (of ``model``, the one it holds and trains: ``ss``, its
    own regions with their context tables), the strategy's ``parameter_report`` keys, the process's
    ``peak_rss_mb`` (``VmHWM``, MiB) and, on CUDA, ``peak_device_memory_mb`` (MiB)."""
    row = {"parameters": sum(p.numel() for p in model.parameters()), **parameter_report}
    peak = peak_rss_mb()
    if peak is not None:
        row["peak_rss_mb"] = peak
    if device.type == "cuda":
        row["peak_device_memory_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return row


def model_size_event(sizes: list[dict], step: int) -> dict:
    """The ``model_size`` event of every rank's :func:`rank_model_size` (``sizes``, by rank): the
    largest rank's figures (``parameters_per_rank``, ``peak_rss_mb``, ``peak_device_memory_mb``),
    ``parameters_total``, each rank's (``ranks``) and, under ``ss``, the parameters of every region
    (``parameters_per_region``). Logs a one-line summary."""
    row = {"step": step, "event": "model_size", "parameters_per_rank": max(s["parameters"] for s in sizes),
           "parameters_total": sum(s["parameters"] for s in sizes),
           "ranks": [{k: v for k, v in s.items() if k != "regions"} for s in sizes]}
    for key in ("peak_rss_mb", "peak_device_memory_mb"):
        if all(key in s for s in sizes):
            row[key] = max(s[key] for s in sizes)
    regions = {k: v for s in sizes for k, v in s.get("regions", {}).items()}
    if regions:
        row["parameters_per_region"] = {k: regions[k] for k in sorted(regions, key=int)}
    log.info("model: %s parameters per rank (%d in all); peak RSS per rank %s MiB",
             [s["parameters"] for s in sizes], row["parameters_total"],
             [round(s.get("peak_rss_mb", float("nan"))) for s in sizes])
    return row


def input_summary_event(phase_totals: dict, wall: float, sampler_name: str, step: int) -> dict:
    """The ``input_summary`` event: seconds and share of ``wall`` (s, the steps' wall time of this
    run segment) spent in the ``input_wait`` and ``copy`` phases (``phase_totals``: seconds by
    phase, :attr:`StepProfiler.run_totals`). Logs a one-line summary."""
    wall = max(wall, 1e-9)
    wait, copy = phase_totals.get("input_wait", 0.0), phase_totals.get("copy", 0.0)
    log.info("input (sampler=%s): waited %.2f s (%.1f%% of %.1f s of steps), copied %.2f s (%.1f%%)",
             sampler_name, wait, 100 * wait / wall, wall, copy, 100 * copy / wall)
    return {"step": step, "event": "input_summary", "sampler": sampler_name, "input_wait_s": wait, "copy_s": copy,
            "steps_s": wall, "input_wait_share": wait / wall, "copy_share": copy / wall}
