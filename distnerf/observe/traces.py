"""Trace analysis of ``profiler=trace`` runs: torch.profiler Chrome traces under ``RUN/profile/traces``.

- communication/computation overlap. CPU (gloo) traces: host spans of the
  ``gloo:all_reduce`` work (gloo's worker threads) against the union of the operator
  spans of backward on the training thread (:func:`cpu_overlap`). GPU traces with NCCL
  kernels: HolisticTraceAnalysis ``get_comm_comp_overlap`` (:func:`hta_overlap`; HTA
  finds no GPU kernel in a CPU trace, so it is not used there);
- every collective by name and the phase it started in (:func:`trace_collectives`).

Times in a trace are microseconds (``ts``, ``dur`` of complete ``"ph": "X"`` events);
the figures returned here are seconds or milliseconds, as named.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from .breakdown import interval_union


# ----------------------------------------------------------------------------- files
def trace_files(run_dir: Path) -> dict[int, list[Path]]:
    """``{rank: [trace paths]}`` under ``RUN/profile/traces`` (rank from the file name)."""
    out: dict[int, list[Path]] = {}
    for p in sorted((Path(run_dir) / "profile" / "traces").glob("rank_*.pt.trace.json*")):
        rank = int(p.name.split(".")[0].split("_")[1])
        out.setdefault(rank, []).append(p)
    return out


def read_trace(path: Path) -> dict:
    """A Chrome trace (``.json`` or ``.json.gz``). Raises ValueError naming the file if unreadable."""
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError, EOFError) as err:
        raise ValueError(f"{path}: not a readable Chrome trace ({err})") from None


# ----------------------------------------------------------------------------- intervals
def _merged(spans) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def _subtract(spans, holes) -> list[tuple[float, float]]:
    """The parts of ``spans`` outside every interval of ``holes``."""
    out = []
    holes = _merged(holes)
    for start, end in _merged(spans):
        cur = start
        for h0, h1 in holes:
            if h1 <= cur or h0 >= end:
                continue
            if h0 > cur:
                out.append((cur, h0))
            cur = max(cur, h1)
        if cur < end:
            out.append((cur, end))
    return out


def _intersection(spans_a, spans_b) -> float:
    """Length of (union of spans_a) intersected with (union of spans_b)."""
    return interval_union(spans_a) + interval_union(spans_b) - interval_union(list(spans_a) + list(spans_b))


# ----------------------------------------------------------------------------- figures
def cpu_overlap(trace: dict) -> dict:
    """Gradient all-reduce vs backward computation on the host, from one CPU trace.

    Collective work: ``gloo:*`` spans (gloo's worker threads) that start inside a
    ``phase:backward`` span. Computation: the union of the operator (``cpu_op``) spans on
    the thread of ``phase:backward``, inside it, except the c10d launches and the
    operators run by the DDP communication hook (``distnerf:comm_hook`` spans).

    Returns:
        ``{"steps", "comm_s", "overlapped_s", "overlap_fraction", "backward_s",
        "backward_compute_s", "collectives"}`` (seconds summed over the traced steps;
        fraction None when there is no collective inside backward).
    """
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    backward = [e for e in events if e.get("name") == "phase:backward"]
    hooks = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "distnerf:comm_hook"]
    comm, compute = [], []
    for b in backward:
        start, end = b["ts"], b["ts"] + b["dur"]
        for e in events:
            if not start <= e["ts"] <= end:
                continue
            name = e.get("name", "")
            if name.startswith("gloo:"):
                comm.append((e["ts"], e["ts"] + e["dur"]))
            elif e.get("cat") == "cpu_op" and e.get("tid") == b.get("tid") and not name.startswith("c10d::"):
                compute.append((e["ts"], min(e["ts"] + e["dur"], end)))
    compute = _subtract(compute, hooks)  # the hook's own time (and its callers' share of it) is communication
    comm_s, compute_s = interval_union(comm) / 1e6, interval_union(compute) / 1e6
    overlapped = _intersection(comm, compute) / 1e6
    return {"steps": len(backward), "collectives": len(comm), "comm_s": comm_s, "overlapped_s": overlapped,
            "overlap_fraction": overlapped / comm_s if comm_s > 0 else None,
            "backward_s": sum(b["dur"] for b in backward) / 1e6, "backward_compute_s": compute_s}


def trace_collectives(trace: dict) -> dict:
    """Every collective in one trace, by name (``gloo:*`` work spans on CPU, NCCL kernels on GPU),
    and the phase it was launched in: ``{name: {"count", "total_ms", "per_step_ms", "phases"}}``.

    Covers what the always-on breakdown does not split out, e.g. the collectives a
    strategy runs inside its forward (``ss`` joint training's all-gather).
    """
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    steps = max(1, sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep#")))
    phases = sorted(((e["ts"], e["ts"] + e["dur"], e["name"][6:]) for e in events
                     if str(e.get("name", "")).startswith("phase:")))
    out: dict[str, dict] = {}
    for e in events:
        name = str(e.get("name", ""))
        is_comm = name.startswith("gloo:") or (e.get("cat") == "kernel" and "nccl" in name.lower())
        if not is_comm:
            continue
        key = name if name.startswith("gloo:") else name.split("(")[0][:60]
        row = out.setdefault(key, {"count": 0, "total_ms": 0.0, "phases": {}})
        row["count"] += 1
        row["total_ms"] += e["dur"] / 1e3
        phase = next((p for a, b, p in phases if a <= e["ts"] <= b), "other")
        row["phases"][phase] = row["phases"].get(phase, 0) + 1
    for row in out.values():
        row["per_step_ms"] = row["total_ms"] / steps
    return out


def has_gpu_kernels(trace: dict) -> bool:
    return any(e.get("cat") == "kernel" for e in trace.get("traceEvents", []))


def hta_overlap(traces: dict[int, Path]) -> dict:
    """HolisticTraceAnalysis communication/computation overlap of GPU traces (one per rank).

    Returns ``{"per_rank": {rank: overlap %}}`` or ``{"skipped": reason}``.
    """
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError as err:
        return {"skipped": f"HolisticTraceAnalysis not installed ({err})"}
    analysis = TraceAnalysis(trace_files={r: str(p) for r, p in traces.items()},
                             trace_dir=str(next(iter(traces.values())).parent))
    df = analysis.get_comm_comp_overlap(visualize=False)
    return {"per_rank": {int(row["rank"]): float(row["comp_comm_overlap_pctg"]) for _, row in df.iterrows()}}


def trace_report(run_dir: Path) -> dict:
    """The trace figures of a run: ``{"traces", "cpu_overlap", "collectives", "hta"}``.

    ``traces``: ``{rank: [{"path" (relative to the run), "bytes"}]}``; ``cpu_overlap`` and
    ``collectives``: ``{rank: ...}`` of each rank's last trace; ``hta``:
    :func:`hta_overlap` of the ranks whose last trace has GPU kernels, else ``{"skipped": reason}``.
    """
    run_dir = Path(run_dir)
    traces = trace_files(run_dir)
    out = {"traces": {rank: [{"path": str(p.relative_to(run_dir)), "bytes": p.stat().st_size} for p in paths]
                      for rank, paths in traces.items()},
           "cpu_overlap": {}, "collectives": {}}
    gpu = {}
    for rank, paths in traces.items():
        trace = read_trace(paths[-1])
        out["cpu_overlap"][rank] = cpu_overlap(trace)
        out["collectives"][rank] = trace_collectives(trace)
        if has_gpu_kernels(trace):
            gpu[rank] = paths[-1]
    if not traces:
        out["hta"] = {"skipped": "no traces (run with profiler=trace)"}
    elif not gpu:
        out["hta"] = {"skipped": "CPU traces: no GPU kernels for HolisticTraceAnalysis (overlap from host spans)"}
    else:
        out["hta"] = hta_overlap(gpu)
    return out


__all__ = ["trace_files", "read_trace", "cpu_overlap", "trace_collectives", "has_gpu_kernels", "hta_overlap",
           "trace_report"]
