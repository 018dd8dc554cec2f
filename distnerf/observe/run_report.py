"""Profile report of a run directory: ``python -m distnerf.profile report RUN_DIR``.

Reads ``RUN/profile/rank_K.json`` (always-on breakdown), ``RUN/profile/ops_rank_K.json``
and ``RUN/profile/traces/*`` (``profiler=trace``), ``RUN/metrics.json`` and writes
``RUN/profile/report.md``, ``report.json`` and ``breakdown.png``:

- per-rank and overall breakdown: mean, median, p95 of each phase and its share of
  the step time (unattributed shown; it should stay at most 5%);
- input-stall share, exposed-communication share, gradient bytes and bus bandwidth;
- rank imbalance: per step, the slowest rank's step time over the fastest's, and the
  time each rank waits at the per-step collective (``step_sync``);
- top operators by self time (torch.profiler's own aggregation);
- communication/computation overlap and the collectives of the traces
  (:mod:`distnerf.observe.traces`).

This module loads and aggregates the rank files, writes the Markdown and the plot;
the trace analysis is in :mod:`.traces`.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from .breakdown import FIGURES, PHASES, summarize
# the trace figures lived here before traces.py; re-exported for existing callers
from .traces import cpu_overlap, hta_overlap, read_trace, trace_collectives, trace_files, trace_report

log = logging.getLogger("distnerf")


# ----------------------------------------------------------------------------- loading
def load_rank_files(run_dir: Path) -> list[dict]:
    """Every ``RUN/profile/rank_K.json``, sorted by rank.

    Raises:
        FileNotFoundError: no rank file (the run did not finish or predates profiling).
    """
    prof = Path(run_dir) / "profile"
    files = sorted(prof.glob("rank_*.json"), key=lambda p: int(p.stem.split("_")[1]))
    if not files:
        raise FileNotFoundError(f"{prof}: no rank_K.json (is {run_dir} a finished distnerf run directory?)")
    out = []
    for f in files:
        try:
            out.append(json.loads(f.read_text()))
        except json.JSONDecodeError as err:
            raise ValueError(f"{f}: not valid JSON ({err})") from None
    return out


# ----------------------------------------------------------------------------- aggregation
def rank_imbalance(ranks: list[dict]) -> dict:
    """Per step (present on every rank, start-up steps excluded): slowest / fastest step time."""
    skip = max(r["summary"].get("skipped", 0) for r in ranks)
    by_step: dict[int, list[float]] = {}
    for r in ranks:
        for rec in r["steps"]:
            by_step.setdefault(rec["step"], []).append(rec["step_s"])
    ratios = [max(v) / max(min(v), 1e-12) for s, v in sorted(by_step.items()) if len(v) == len(ranks)][skip:]
    if not ratios:
        return {}
    ratios = np.array(ratios)
    return {"median": float(np.median(ratios)), "p95": float(np.percentile(ratios, 95)), "max": float(ratios.max()),
            "steps": int(ratios.size)}


def global_rays_per_s(ranks: list[dict]) -> float | None:
    """Median over steps of (sum of every rank's rays) / (slowest rank's step time)."""
    skip = max(r["summary"].get("skipped", 0) for r in ranks)
    by_step: dict[int, list[tuple[float, float]]] = {}
    for r in ranks:
        for rec in r["steps"]:
            by_step.setdefault(rec["step"], []).append((rec["rays_per_s"] * rec["step_s"], rec["step_s"]))
    values = [sum(x for x, _ in v) / max(t for _, t in v) for s, v in sorted(by_step.items())
              if len(v) == len(ranks)][skip:]
    return float(np.median(values)) if values else None


# ----------------------------------------------------------------------------- report
def build_report(run_dir: Path) -> dict:
    """All figures of the report as one JSON-able dict (see the module docstring)."""
    run_dir = Path(run_dir)
    ranks = load_rank_files(run_dir)
    overall_records = [rec for r in ranks for rec in r["steps"][r["summary"].get("skipped", 0):]]
    report = {"run_dir": str(run_dir), "world_size": ranks[0]["world_size"], "device": ranks[0]["device"],
              "clock": ranks[0].get("clock"), "env": ranks[0].get("env"),
              "per_rank": {r["rank"]: r["summary"] for r in ranks},
              "overall": summarize(overall_records, 0), "rank_imbalance": rank_imbalance(ranks),
              "global_rays_per_s": global_rays_per_s(ranks),
              "telemetry": {r["rank"]: (r.get("telemetry") or {}).get("summary") for r in ranks},
              "telemetry_nvml": (ranks[0].get("telemetry") or {}).get("nvml")}
    keys = report["overall"]["keys"]
    report["shares"] = {name: keys.get(name, {}).get("share") for name in (*PHASES, "unattributed")}
    report["input_stall_share"] = keys.get("input_wait", {}).get("share")
    report["exposed_comm_share"] = keys.get("exposed_comm", {}).get("share")
    report["compile"] = {r["rank"]: r.get("compile") for r in ranks if r.get("compile")}
    metrics = run_dir / "metrics.json"
    report["test_psnr"] = json.loads(metrics.read_text()).get("psnr") if metrics.exists() else None
    # operators and traces
    report["top_ops"] = {}
    for r in ranks:
        ops = run_dir / "profile" / f"ops_rank_{r['rank']}.json"
        if ops.exists():  # operators only: the phase/step annotations' self time is time outside operators
            data = json.loads(ops.read_text())
            data["ops"] = [o for o in data["ops"] if not o["name"].startswith(("phase:", "ProfilerStep#"))]
            report["top_ops"][r["rank"]] = data
    report.update(trace_report(run_dir))  # traces, cpu_overlap, collectives, hta
    return report


# ----------------------------------------------------------------------------- markdown
def _ms(x) -> str:
    return "-" if x is None else f"{1e3 * x:.2f}"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _breakdown_table(summary: dict) -> list[str]:
    keys = summary.get("keys", {})
    lines = ["| phase | mean ms | median ms | p95 ms | share |", "|---|---:|---:|---:|---:|"]
    names = ["step_s", *PHASES, "unattributed"] + sorted(k for k in keys if k.startswith("forward."))
    for name in names:
        s = keys.get(name)
        if s is None or (name != "step_s" and s["mean"] == 0 and name not in ("exposed_comm", "unattributed")):
            continue
        label = "**step**" if name == "step_s" else name
        lines.append(f"| {label} | {_ms(s['mean'])} | {_ms(s['median'])} | {_ms(s['p95'])} | "
                     f"{_pct(s.get('share')) if name != 'step_s' else '100%'} |")
    return lines


def to_markdown(report: dict) -> str:
    """The report as Markdown."""
    o = report["overall"]
    lines = [f"# Profile report: {report['run_dir']}", "",
             f"World size {report['world_size']}, device {report['device']}, clock: {report['clock']}; "
             f"{o['num_steps']} steady steps over all ranks "
             f"(the first {report['per_rank'][0].get('skipped', 0)} step(s) per rank are start-up, left out).", ""]
    ua = o.get("unattributed_share", {})
    lines += ["## Overall", "", *_breakdown_table(o), "",
              f"- unattributed share of the step: median {_pct(ua.get('median'))}, p95 {_pct(ua.get('p95'))} "
              f"(target at most 5%)",
              f"- input-stall share (input_wait): {_pct(report['input_stall_share'])}",
              f"- exposed-communication share: {_pct(report['exposed_comm_share'])}",
              f"- global rays/s (sum over ranks / slowest rank's step, median): "
              f"{report['global_rays_per_s']:.0f}" if report["global_rays_per_s"] else "- global rays/s: -"]
    keys = o["keys"]
    for name, unit, scale in (("samples_per_ray", "", 1), ("field_evals", "", 1), ("forward_ns_per_sample", " ns", 1),
                              ("comm_bytes", " MB", 1 / 2**20), ("bus_bandwidth_gbps", " GB/s", 1),
                              ("peak_memory_mb", " MB", 1)):
        if name in keys:
            lines.append(f"- {name} (median per rank-step): {keys[name]['median'] * scale:.3g}{unit}")
    imb = report["rank_imbalance"]
    if imb:
        lines.append(f"- rank imbalance (slowest/fastest step time per step): median {imb['median']:.3f}, "
                     f"p95 {imb['p95']:.3f}, max {imb['max']:.3f} over {imb['steps']} steps")
    if report["test_psnr"] is not None:
        lines.append(f"- test PSNR: {report['test_psnr']:.2f} dB")
    for rank, c in report["compile"].items():
        lines.append(f"- torch.compile (rank {rank}): {c['compile_s']:.1f} s compiling, {c['graph_breaks']} graph "
                     f"break(s), {c['unique_graphs']} graph(s); start-up steps "
                     f"{report['per_rank'][rank].get('startup_s', 0.0):.1f} s, excluded from the tables")
    lines += ["", "## Per rank", ""]
    for rank, summary in report["per_rank"].items():
        sync = summary["keys"].get("step_sync", {})
        lines += [f"### rank {rank}", "", *_breakdown_table(summary), "",
                  f"waits at the per-step collective (step_sync): median {_ms(sync.get('median'))} ms", ""]
    lines += ["## Communication / computation overlap", ""]
    if report["cpu_overlap"]:
        lines += ["From host spans of the traces: gloo collective work started inside backward vs backward's "
                  "operator spans on the training thread.", "",
                  "| rank | traced steps | collectives | comm ms | overlapped ms | overlap | backward ms | "
                  "backward compute ms |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for rank, c in report["cpu_overlap"].items():
            lines.append(f"| {rank} | {c['steps']} | {c['collectives']} | {_ms(c['comm_s'])} | "
                         f"{_ms(c['overlapped_s'])} | {_pct(c['overlap_fraction'])} | {_ms(c['backward_s'])} | "
                         f"{_ms(c['backward_compute_s'])} |")
    else:
        lines.append("No traces: run with `profiler=trace` for the trace-based overlap.")
    if report.get("collectives"):
        lines += ["", "Collectives in the traces (work spans; the phase each started in):", "",
                  "| rank | collective | count | ms per traced step | started in |", "|---:|---|---:|---:|---|"]
        for rank, coll in report["collectives"].items():
            for name, c in sorted(coll.items()):
                where = ", ".join(f"{p} x{n}" for p, n in sorted(c["phases"].items()))
                lines.append(f"| {rank} | `{name}` | {c['count']} | {c['per_step_ms']:.2f} | {where} |")
    hidden = keys.get("comm_hidden_s", {}).get("mean")
    total = keys.get("comm_total_s", {}).get("mean")
    if total:
        lines.append(f"\nAlways-on (hook timings): gradient communication {_ms(total)} ms per step, of which "
                     f"{_ms(hidden)} ms hidden behind backward ({_pct(hidden / total)}).")
    hta = report["hta"]
    lines += ["", "HolisticTraceAnalysis: " + (hta["skipped"] if "skipped" in hta else
                                                ", ".join(f"rank {r}: {v:.1f}% overlap"
                                                          for r, v in hta["per_rank"].items())), ""]
    if report["top_ops"]:
        lines += ["## Top operators by self time", ""]
        for rank, ops in report["top_ops"].items():
            key = "self_device_us" if ops["sort"] == "self_device_time_total" else "self_cpu_us"
            lines += [f"rank {rank} (traced steps, sorted by {ops['sort']}):", "",
                      "| operator | calls | self ms |", "|---|---:|---:|"]
            lines += [f"| `{op['name'][:60]}` | {op['calls']} | {op[key] / 1e3:.2f} |" for op in ops["ops"][:10]]
            lines.append("")
    if report["traces"]:
        lines += ["## Traces", ""] + [f"- rank {rank}: {t['path']} ({t['bytes'] / 2**20:.2f} MB)"
                                      for rank, ts in report["traces"].items() for t in ts] + [""]
    tel = {r: t for r, t in report["telemetry"].items() if t}
    if tel:
        lines += ["## Telemetry", "", f"NVML: {report['telemetry_nvml']}", ""]
        for rank, t in tel.items():
            lines.append(f"- rank {rank}: " + ", ".join(f"{k} mean {v['mean']:.1f} max {v['max']:.1f}"
                                                        for k, v in t.items()))
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- plot and files
def plot_breakdown(report: dict, path: Path) -> None:
    """Stacked bars: mean ms of each phase per rank (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = list(report["per_rank"])
    names = [*PHASES, "unattributed"]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.5 * len(ranks)))
    left = np.zeros(len(ranks))
    cmap = plt.get_cmap("tab20")
    for i, name in enumerate(names):
        values = np.array([1e3 * report["per_rank"][r]["keys"].get(name, {}).get("mean", 0.0) for r in ranks])
        if not values.any():
            continue
        ax.barh([f"rank {r}" for r in ranks], values, left=left, label=name, color=cmap(i))
        left += values
    ax.set_xlabel("mean ms per step")
    ax.set_title("step breakdown per rank")
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.35 - 0.05 * len(ranks)))
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)


def write_report(run_dir: Path) -> dict:
    """Build the report and write ``report.md``, ``report.json``, ``breakdown.png`` under
    ``RUN/profile``; returns the report dict (its ``files`` entry lists the paths)."""
    from ..fileio import atomic_write_text

    report = build_report(run_dir)
    out = Path(run_dir) / "profile"
    md, js, png = out / "report.md", out / "report.json", out / "breakdown.png"
    atomic_write_text(md, to_markdown(report))
    plot_breakdown(report, png)
    report["files"] = [str(md), str(js), str(png)]
    atomic_write_text(js, json.dumps(report, indent=1, default=str))
    return report


__all__ = ["build_report", "write_report", "to_markdown", "plot_breakdown", "load_rank_files", "rank_imbalance",
           "global_rays_per_s", "FIGURES", "cpu_overlap", "trace_collectives", "hta_overlap", "read_trace",
           "trace_files"]
