"""The study's report: ``python -m distnerf.study report STUDY_DIR``.

Writes ``STUDY_DIR/report/``: ``report.json`` (every cell's figures and every table),
``report.md``, PNG figures (matplotlib) and ``report.html`` (one self-contained page: the
same tables, the figures embedded, each linking its PNG). Tables (repeats of a cell are
summarised by their median; ``n`` says how many):

* cells: status, ``contended`` mark, load and free memory at start, wall time;
* training step breakdown (stacked: input wait, copy, forward, backward, exposed
  communication, step sync, optimizer, unattributed, other), world size on the x axis;
* synchronisation: ``ddp`` gradient all-reduce bytes per step and its exposed share, ``ss``
  joint segment exchange bytes and share, against world size;
* inference: fused / single render seconds per view (the ``ddp`` cell with the same other
  axes is the single model) and the fusion stage's routing / exchange + compositing shares,
  against the number of regions;
* input: input-wait share per sampler, and the pipelined speedup over ``sync`` with its
  ideal bound T/(T - S) and capacity bound (S + C)/max(S/W, C) (BENCHMARKS.md section 4:
  S the sync cell's input wait, C = T - S its compute, W workers);
* quality: test PSNR/SSIM at the budget and training PSNR against training time;
* capacity (:mod:`distnerf.study.capacity`): the capacity curve (world-size-1 ``ddp`` test PSNR
  mean and sd over seeds against parameters per rank, dB per doubling, the plateau check, the
  constant-colour level) and PSNR against ranks per strategy with error bars, one test view
  per world size side by side, and the targets met or missed;
* scaling model (:mod:`distnerf.study.scaling`) and its check against the measured points;
* what differs: cells whose config or environment differs from the first cell's in a
  setting that no axis declares (``distnerf.profile compare``'s fingerprint) are flagged.
"""
from __future__ import annotations

import base64
import html
import json
import os
import statistics
from pathlib import Path

from omegaconf import OmegaConf

from ..fileio import atomic_write_text
from ..observe.compare import load_settings, setting_differences
from . import capacity, plan, runner, scaling
from .collect import BREAKDOWN, cell_figures

STUDY_FILE = "study.yaml"  # the config the study ran with, saved by `run`
CHECK_TOLERANCE = 0.15  # relative error allowed of the scaling model at the measured points out of sample
FIT_MAX_WORLD_SIZE = 2  # the model is fitted at world sizes <= this; the check predicts the cells above
HOST_LATENCY_S = 50e-6  # gloo message latency over loopback TCP assumed by the check (stated in the report)


def load_study_dir(study_dir: Path):
    path = Path(study_dir) / STUDY_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: missing ({study_dir} is not a study directory: run "
                                "`python -m distnerf.study run CONFIG STUDY_DIR` first)")
    return plan.load_study(path)


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def collect(study_dir: Path) -> dict:
    """{"study", "cells": [per-cell record + figures], "keys": {key: summary of its repeats}}."""
    study_dir = Path(study_dir)
    cfg = load_study_dir(study_dir)
    cells = []
    for cell in plan.expand(cfg):
        run_dir = runner.cell_dir(study_dir, cell)
        record = runner.read_record(run_dir) or {"status": "not run"}
        row = {"id": cell.id, "key": cell.key, "values": cell.values, "repeat": cell.repeat,
               "status": "done" if runner.finished(run_dir) else record.get("status", "not run"),
               "contended": bool(record.get("contended")), "load1": (record.get("load") or {}).get("load1"),
               "busy": (record.get("load") or {}).get("busy"),
               "mem_available_mb": (record.get("load") or {}).get("mem_available_mb"),
               "waited_s": record.get("waited_s"), "wall_s": record.get("wall_s"), "rc": record.get("rc"),
               "started": record.get("started"), "finished": record.get("finished"),
               "threads_per_rank": record.get("threads_per_rank"), "cpu_count": record.get("cpu_count")}
        if row["status"] == "done":
            row["figures"] = cell_figures(run_dir)
        cells.append(row)
    declared = plan.declared_keys(cfg)
    if cfg.threads is None and "world_size" in cfg.axes:  # threads per rank follow the world size
        declared += ["env.torch_threads", "env.torch_interop_threads", "env.omp_num_threads"]
    _flag_differences(study_dir, cells, declared)
    keys = {}
    for c in cells:
        keys.setdefault(c["key"], []).append(c)
    summary = {k: _summarise(v) for k, v in keys.items()}
    return {"study": OmegaConf.to_container(cfg), "study_dir": str(study_dir), "declared": declared,
            "cells": cells, "keys": summary}


def _flag_differences(study_dir: Path, cells: list[dict], declared: list[str]) -> None:
    done = [c for c in cells if c["status"] == "done"]
    if not done:
        return
    ref = done[0]
    ref_settings = load_settings(Path(study_dir) / "cells" / ref["id"])
    for c in done:
        _, undeclared = setting_differences(ref_settings, load_settings(Path(study_dir) / "cells" / c["id"]), declared)
        c["undeclared"] = [{"key": k, "reference": a, "cell": b} for k, a, b in undeclared]
        c["reference"] = ref["id"]


def _summarise(reps: list[dict]) -> dict:
    done = [r["figures"] for r in reps if r["status"] == "done"]
    out = {"key": reps[0]["key"], "values": reps[0]["values"], "n": len(done), "repeats": len(reps),
           "contended": sum(r["contended"] for r in reps), "threads_per_rank": reps[0].get("threads_per_rank"),
           "cpu_count": reps[0].get("cpu_count"),
           "undeclared": sorted({d["key"] for r in reps
                                                                                for d in r.get("undeclared", [])})}
    if not done:
        return out
    for k in ("step_s_median", "psnr", "ssim", "global_rays_per_s", "input_stall_share", "exposed_comm_share",
              "allreduce_bytes_per_step", "exchange_bytes_per_step", "exchange_s_per_step", "exchange_launch_s_per_step",
              "render_s_per_view_median",
              "parameters_per_rank", "peak_rss_mb", "comm_total_s_median", "comm_hidden_s_median", "train_seconds",
              "comm_bytes_per_step_median", "regions_crossed_mean"):
        out[k] = _median([d.get(k) for d in done])
    psnrs = [d["psnr"] for d in done if d.get("psnr") is not None]  # repeats of other seeds: a sample
    out["psnrs"] = psnrs
    out["psnr_mean"], out["psnr_sd"], _ = capacity.mean_sd(psnrs)
    out["plateau_gains"] = [capacity.plateau_gain([(p["step"], p["val_psnr"]) for p in d["val_curve"]])
                            for d in done]
    out["constant_psnr"] = _median([d.get("constant_psnr") for d in done])
    out["steps"] = _median([d.get("steps") for d in done])
    out["phases_mean_s"] = {p: _median([d["phases_mean_s"].get(p) for d in done]) for p in (*BREAKDOWN, "other")}
    for k in ("world_size", "num_regions", "strategy", "training", "sampler", "num_workers", "global_rays",
              "render_rays_per_view"):
        out[k] = done[0].get(k)
    timings = [d["fusion_timing"] for d in done if d.get("fusion_timing")]
    if timings:
        out["fusion_share"] = {part: _median([t.get(f"{part}_s", 0.0) / t["total_s"] for t in timings
                                              if t.get("total_s")]) for part in ("routing", "exchange_composite")}
    out["curve"], out["val_curve"] = done[0]["curve"], done[0]["val_curve"]
    return out


# ----------------------------------------------------------------------------- tables
def _counterpart(keys: dict, values: dict, **change) -> dict | None:
    want = {**values, **change}
    return next((s for s in keys.values() if s["values"] == want and s["n"]), None)


def breakdown_rows(keys: dict) -> list[dict]:
    rows = []
    for key, s in sorted(keys.items(), key=lambda kv: ((kv[1]["values"].get("world_size") or 1), kv[0])):
        if s["n"]:
            total = sum(v or 0.0 for v in s["phases_mean_s"].values())
            rows.append({"cell": key, "world_size": s["world_size"], "step_ms": 1e3 * s["step_s_median"],
                         **{p: (s["phases_mean_s"][p] or 0.0) / total if total else None for p in s["phases_mean_s"]}})
    return rows


def sync_rows(keys: dict) -> list[dict]:
    rows = []
    for key, s in keys.items():
        if not s["n"] or s["world_size"] < 2:
            continue
        if s["strategy"] == "ddp":
            rows.append({"cell": key, "kind": "ddp all-reduce", "world_size": s["world_size"],
                         "params_per_rank": s["parameters_per_rank"], "bytes_per_step": s["allreduce_bytes_per_step"],
                         "exposed_share": s["exposed_comm_share"],
                         "hidden_share_of_comm": (s["comm_hidden_s_median"] / s["comm_total_s_median"]
                                                  if s.get("comm_total_s_median") else None)})
        elif s["training"] == "joint":
            rows.append({"cell": key, "kind": "ss joint exchange", "world_size": s["world_size"],
                         "params_per_rank": s["parameters_per_rank"], "bytes_per_step": s["exchange_bytes_per_step"],
                         # gloo: the blocking exchange's measured seconds; NCCL runs time only its launch,
                         # so both shares stay None (not measured), never 0
                         "exposed_share": (s["exchange_s_per_step"] / s["step_s_median"]
                                           if s.get("exchange_s_per_step") is not None else None),
                         "hidden_share_of_comm": 0.0 if s.get("exchange_s_per_step") is not None else None})
    return sorted(rows, key=lambda r: (r["kind"], r["world_size"], r["cell"]))


def inference_rows(keys: dict) -> list[dict]:
    rows = []
    for key, s in keys.items():
        if not s["n"] or s["strategy"] != "ss":
            continue
        single = _counterpart(keys, s["values"], strategy="ddp")
        ratio = (s["render_s_per_view_median"] / single["render_s_per_view_median"]
                 if single and single.get("render_s_per_view_median") else None)
        share = s.get("fusion_share") or {}
        rows.append({"cell": key, "regions": s["num_regions"], "world_size": s["world_size"],
                     "fused_s_per_view": s["render_s_per_view_median"],
                     "single_s_per_view": single["render_s_per_view_median"] if single else None,
                     "fused_over_single": ratio, "routing_share": share.get("routing"),
                     "exchange_composite_share": share.get("exchange_composite")})
    return sorted(rows, key=lambda r: (r["regions"], r["cell"]))


def input_rows(keys: dict) -> list[dict]:
    rows = []
    for key, s in keys.items():
        if not s["n"]:
            continue
        row = {"cell": key, "sampler": s["sampler"], "world_size": s["world_size"], "step_ms": 1e3 * s["step_s_median"],
               "input_stall_share": s["input_stall_share"]}
        sync = _counterpart(keys, s["values"], sampler="sync") if s["sampler"] != "sync" else None
        if sync is not None:
            t, stall = sync["step_s_median"], sync["phases_mean_s"]["input_wait"] or 0.0
            c, w = t - stall, s["num_workers"] or 1
            row.update(speedup_over_sync=t / s["step_s_median"], ideal_bound=t / c if c > 0 else None,
                       capacity_bound=(stall + c) / max(stall / w, c) if s["sampler"] == "pipelined" and c > 0 else None)
        rows.append(row)
    return sorted(rows, key=lambda r: (r["world_size"], r["sampler"], r["cell"]))


def quality_rows(keys: dict) -> list[dict]:
    return sorted(({"cell": k, "psnr": s["psnr"], "psnr_mean": s.get("psnr_mean"), "psnr_sd": s.get("psnr_sd"),
                    "ssim": s["ssim"], "steps_s": s["train_seconds"],
                    "params_per_rank": s["parameters_per_rank"], "peak_rss_mb": s["peak_rss_mb"], "n": s["n"]}
                   for k, s in keys.items() if s["n"]), key=lambda r: r["cell"])


def scaling_inputs(keys: dict) -> tuple[scaling.Measured | None, list[dict], dict]:
    """The scaling model's inputs from the study's cells, the check rows, and the fitted host
    collective bandwidth/latency ({} when the study lacks the cells it needs)."""
    one = [s for s in keys.values() if s["n"] and s["strategy"] == "ddp" and s["world_size"] == 1]
    if not one:
        return None, [], {}
    base = sorted(one, key=lambda s: s["sampler"] != "pipelined")[0]  # the first (in cell order) pipelined one
    ph = base["phases_mean_s"]
    compute = sum(ph[p] or 0.0 for p in ("copy", "forward", "backward", "optimizer", "other", "unattributed"))
    m = scaling.Measured(compute_s_per_ray=compute / base["global_rays"], global_rays=base["global_rays"],
                         rays_per_rank=base["global_rays"],
                         device=f"measured: the world-size-1 cell {plan.cell_key(base['values'])} "
                                f"({keys_threads(base):g} cores per rank)",
                         render_s_per_ray=(base["render_s_per_view_median"] or 0.0) / max(base["render_rays_per_view"]
                                                                                           or 1, 1),
                         render_rays=base["render_rays_per_view"] or 0)
    ddp2 = _counterpart(keys, base["values"], world_size=2)
    host = {}
    if ddp2:
        m.grad_bytes = ddp2.get("comm_bytes_per_step_median") or ddp2["allreduce_bytes_per_step"] or 0.0
        total = ddp2.get("comm_total_s_median")
        if total:
            m.exposed_fraction = 1.0 - (ddp2["comm_hidden_s_median"] or 0.0) / total
            # this host's all-reduce at 2 ranks: ring bandwidth from the gradient all-reduce's duration
            # (its latency folded in); latency an assumption (loopback TCP, gloo)
            host = {"bw": m.grad_bytes / total if m.grad_bytes else 1e9, "lat": HOST_LATENCY_S,
                    "note": f"bandwidth fitted to the 2-rank gradient all-reduce ({m.grad_bytes:.3g} B in "
                            f"{total * 1e3:.3g} ms, ring factor 2(N-1)/N = 1); latency {HOST_LATENCY_S * 1e6:.0f} us "
                            "assumed (gloo over loopback)"}
    joint = _counterpart(keys, base["values"], strategy="ss_joint", world_size=2)
    if joint and joint.get("exchange_bytes_per_step"):
        # each rank's all-gather payload: (rays, its regions, C floats)
        held = max(joint["num_regions"] // joint["world_size"], 1)
        m.exchange_bytes_per_ray_region = joint["exchange_bytes_per_step"] / (joint["global_rays"] * held)
    fused = _counterpart(keys, base["values"], strategy="ss_independent", world_size=2) or joint
    if fused and fused.get("fusion_share") and fused.get("render_s_per_view_median"):
        share = fused["fusion_share"]
        per_view = fused["render_s_per_view_median"] * ((share.get("routing") or 0) + (share.get("exchange_composite")
                                                                                          or 0))
        crossed = fused.get("regions_crossed_mean")  # measured: the regions a ray crosses, not every region
        m.measured_regions = fused["num_regions"]
        m.regions_crossed = crossed
        m.fusion_s_per_ray_region = per_view / max(fused["render_rays_per_view"] or 1, 1) / (crossed or
                                                                                           fused["num_regions"])
    check = []
    if host:
        base_threads = keys_threads(base)
        for s in keys.values():
            if s["n"] and s["values"] == {**base["values"], "strategy": s["values"]["strategy"],
                                          "world_size": s["world_size"]} and s["strategy"] in ("ddp", "ss") \
                    and s["world_size"] > FIT_MAX_WORLD_SIZE:  # out of sample: the fit used W <= 2
                name = s["values"]["strategy"]
                check.append({"strategy": name, "world_size": s["world_size"], "step_s": s["step_s_median"],
                              "compute_scale": base_threads / keys_threads(s)})
        check = scaling.check_against(m, check, host["bw"], host["lat"], CHECK_TOLERANCE)
    return m, check, host


def keys_threads(s: dict) -> float:
    """Cores per rank of a cell, the size of its 'device' on a CPU: its threads per rank (study
    record), at most the machine's cores shared by its ranks (4 one-thread ranks on 2 cores get
    half a core each; the record's ``cpu_count``, else this machine's)."""
    threads = s.get("threads_per_rank") or 1.0
    cores = s.get("cpu_count") or os.cpu_count() or 1
    return min(float(threads), cores / max(int(s.get("world_size") or (s.get("values") or {}).get("world_size")
                                                  or 1), 1))


def build(study_dir: Path) -> dict:
    data = collect(study_dir)
    keys = data["keys"]
    tables = {"breakdown": breakdown_rows(keys), "sync": sync_rows(keys), "inference": inference_rows(keys),
              "input": input_rows(keys), "quality": quality_rows(keys),
              "capacity": capacity.capacity_rows(keys), "ranks": capacity.ranks_rows(keys)}
    capacity.annotate_equal_total(tables["ranks"], tables["capacity"])
    tables["verdicts"] = capacity.verdicts(tables["capacity"], tables["ranks"])
    m, check, host = scaling_inputs(keys)
    tables["scaling"] = scaling.scaling_table(m) if m else None
    tables["scaling_check"] = {"rows": check, "host_collectives": host, "tolerance": CHECK_TOLERANCE}
    tables["differs"] = [{"cell": c["id"], "against": c["reference"], "key": d["key"], "there": d["reference"],
                          "here": d["cell"]} for c in data["cells"] for d in c.get("undeclared", [])]
    data["tables"] = tables
    data["status"] = {s: sum(c["status"] == s for c in data["cells"]) for s in sorted({c["status"]
                                                                                         for c in data["cells"]})}
    data["timing"] = study_timing(data["cells"])
    return data


def study_timing(cells: list[dict]) -> dict:
    """The study's own wall time, from its cells' records (local time stamps, seconds): the first
    cell's start, the last one's end, and the sums of the cells' wall and quiet-wait seconds. A
    re-run that finds every cell finished takes seconds; this is the time the cells took."""
    ran = [c for c in cells if c.get("started")]
    ends = [c["finished"] for c in ran if c.get("finished")]
    return {"first_cell_started": min(c["started"] for c in ran) if ran else None,
            "last_cell_finished": max(ends) if ends else None,
            "cells_wall_s": sum(c.get("wall_s") or 0.0 for c in ran),
            "waited_s": sum(c.get("waited_s") or 0.0 for c in ran)}


# ----------------------------------------------------------------------------- figures
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figures(data: dict, out_dir: Path) -> list[Path]:
    """Draw the figures that have data; returns their paths."""
    plt, t, made = _plt(), data["tables"], []

    def save(fig, name):
        path = out_dir / name
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        made.append(path)

    rows = t["breakdown"]
    if rows:
        fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(rows) + 2), 4.5))
        bottom = [0.0] * len(rows)
        for p in (*BREAKDOWN, "other"):
            vals = [r["step_ms"] * (r[p] or 0.0) for r in rows]
            ax.bar(range(len(rows)), vals, bottom=bottom, label=p)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(range(len(rows)), [f"{r['cell']}" for r in rows], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("ms per step (median step, phases by mean share)")
        ax.set_title("training step breakdown (cells ordered by world size)")
        ax.legend(fontsize=7, ncol=2)
        save(fig, "breakdown.png")
    rows = t["sync"]
    if rows:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        for kind in sorted({r["kind"] for r in rows}):
            rs = [r for r in rows if r["kind"] == kind]
            a1.plot([r["world_size"] for r in rs], [r["bytes_per_step"] or 0 for r in rs], "o-", label=kind)
            a2.plot([r["world_size"] for r in rs], [r["exposed_share"] or 0 for r in rs], "o-", label=kind)
        a1.set(xlabel="world size", ylabel="bytes per step per rank", title="synchronisation volume")
        a2.set(xlabel="world size", ylabel="share of the step", title="exposed communication")
        a1.legend(fontsize=8)
        save(fig, "sync.png")
    rows = t["inference"]
    if rows:
        fig, ax = plt.subplots(figsize=(7, 4))
        x = range(len(rows))
        ax.bar(x, [r["fused_over_single"] or 0 for r in rows], color="tab:blue", label="fused / single render time")
        ax.set_xticks(list(x), [f"{r['cell']}\nK={r['regions']}" for r in rows], rotation=30, ha="right", fontsize=7)
        ax.axhline(1.0, color="k", lw=0.8)
        ax2 = ax.twinx()
        ax2.plot(list(x), [r["routing_share"] or 0 for r in rows], "s--", color="tab:orange", label="routing share")
        ax2.plot(list(x), [r["exchange_composite_share"] or 0 for r in rows], "d--", color="tab:green",
                 label="exchange + compositing share")
        ax.set_ylabel("fused / single")
        ax2.set_ylabel("share of the fused render")
        ax.set_title("inference: fusion stage against the number of regions")
        ax.legend(loc="upper left", fontsize=7)
        ax2.legend(loc="upper right", fontsize=7)
        save(fig, "inference.png")
    rows = t["input"]
    if rows:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
        a1.bar(range(len(rows)), [r["input_stall_share"] or 0 for r in rows])
        a1.set_xticks(range(len(rows)), [r["cell"] for r in rows], rotation=60, ha="right", fontsize=7)
        a1.set(ylabel="input_wait share of the step", title="input stall per sampler")
        sp = [r for r in rows if r.get("speedup_over_sync")]
        a2.bar([i - 0.25 for i in range(len(sp))], [r["speedup_over_sync"] for r in sp], 0.25, label="measured")
        a2.bar(range(len(sp)), [r.get("ideal_bound") or 0 for r in sp], 0.25, label="ideal T/(T-S)")
        a2.bar([i + 0.25 for i in range(len(sp))], [r.get("capacity_bound") or 0 for r in sp], 0.25,
               label="capacity (S+C)/max(S/W,C)")
        a2.set_xticks(range(len(sp)), [r["cell"] for r in sp], rotation=60, ha="right", fontsize=7)
        a2.set(ylabel="speedup over sync", title="pipelined sampler")
        a2.legend(fontsize=7)
        save(fig, "input.png")
    use_val = any(s.get("val_curve") for s in data["keys"].values() if s.get("n"))
    field, ylabel = ("val_psnr", "validation PSNR (dB)") if use_val else ("train_psnr", "training-batch PSNR (dB)")
    curves = {k: s["val_curve" if use_val else "curve"] for k, s in data["keys"].items() if s.get("n")}
    curves = {k: c for k, c in curves.items() if c}
    if curves:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for k, c in sorted(curves.items()):
            ax.plot([p["train_seconds"] for p in c], [p[field] for p in c], label=k, lw=1, marker="." if use_val else None)
        ax.set(xlabel="training seconds", ylabel=ylabel, title="PSNR against training time")
        ax.legend(fontsize=6)
        save(fig, "quality.png")
    rows = t.get("capacity") or []
    if rows:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        x = [r["params_per_rank"] for r in rows]
        ax.errorbar(x, [r["psnr_mean"] for r in rows], yerr=[r["psnr_sd"] or 0.0 for r in rows], fmt="o-",
                    capsize=3, label="ddp, W = 1: test PSNR (mean +- sd over seeds)")
        if any(r["constant_psnr"] for r in rows):
            ax.plot(x, [r["constant_psnr"] for r in rows], "k:", label="constant colour (each view's mean)")
        for r in rows:
            ax.annotate(f"{r['steps']:.0f} steps" + ("" if r["plateau"] else ", no plateau"),
                        (r["params_per_rank"], r["psnr_mean"]), fontsize=6, textcoords="offset points", xytext=(4, -10))
        ax.set_xscale("log", base=2)
        ax.set(xlabel="parameters per rank", ylabel="test PSNR (dB)", title="capacity: quality against parameters")
        ax.legend(fontsize=7)
        save(fig, "capacity.png")
    rows = t.get("ranks") or []
    if rows:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for (label, budget, strat) in sorted({(r.get("context", ""), r["budget"], r["strategy"]) for r in rows}, key=str):
            rs = [r for r in rows if r["budget"] == budget and r["strategy"] == strat and r.get("context", "") == label]
            ax.errorbar([r["world_size"] for r in rs], [r["psnr_mean"] for r in rs],
                        yerr=[r["psnr_sd"] or 0.0 for r in rs], fmt="o-", capsize=3,
                        label=f"{strat} ({budget}{', ' + label if label else ''})")
        ref = sorted({(r["world_size"], r["single_equal_total_psnr"]) for r in rows
                      if r.get("single_equal_total_psnr") is not None})
        if ref:
            ax.plot([w for w, _ in ref], [p for _, p in ref], "k--", lw=1,
                    label="ddp at one rank with W x the parameters (capacity curve)")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="world size (ranks; ss: one region per rank)", ylabel="test PSNR (dB), mean +- sd over seeds",
               title="quality against ranks at equal parameters per rank")
        ax.legend(fontsize=7)
        save(fig, "ranks.png")
        views = _views_figure(plt, data, rows)
        if views is not None:
            save(views, "ranks_views.png")
    sc = t["scaling"]
    if sc:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
        styles = {"ddp": "-", "ss_independent": "--", "ss_joint": ":"}
        for name, preds in sc["predictions"].items():
            ns = [p["world_size"] for p in preds]
            for strat, ls in styles.items():
                a1.plot(ns, [1e3 * p[strat]["step_s"] for p in preds], ls, marker=".", label=f"{strat} {name}")
            a2.plot(ns, [p["fused_over_single"] or 0 for p in preds], marker=".", label=name)
        for a in (a1, a2):
            a.set_xscale("log", base=2)
        a1.set_yscale("log")
        a1.set(xlabel="GPUs", ylabel="ms per step (predicted)", title="scaling model: training step")
        a2.set(xlabel="GPUs (= regions)", ylabel="fused / single render", title="scaling model: fused render")
        a1.legend(fontsize=6)
        a2.legend(fontsize=7)
        save(fig, "scaling.png")
    return made


def _views_figure(plt, data: dict, rows: list[dict]):
    """One test view (the cells' first) per world size and strategy, repeat 0, beside the ground
    truth, with a centre crop: the quality-against-ranks table as pictures."""
    import imageio.v3 as iio

    from ..data import load_scene

    study_dir = Path(data["study_dir"])
    by_key = {c["key"]: c for c in data["cells"] if c["repeat"] == 0 and c["status"] == "done"}
    labels = [r.get("context", "") for r in rows]  # one scene's views: the context with the most rows
    shown = max(dict.fromkeys(labels), key=labels.count) if labels else ""
    rows = [r for r in rows if r.get("context", "") == shown]
    strategies = sorted({r["strategy"] for r in rows}, key=str)
    sizes = sorted({r["world_size"] for r in rows})
    grid, stand_in = {}, set()
    for r in rows:
        key = r["source"].split(" ", 1)[0]
        found = sorted((study_dir / "cells" / by_key[key]["id"] / "test").glob("*_rgb.png")) if key in by_key else []
        if found:
            grid[(r["strategy"], r["world_size"])] = iio.imread(found[0])
            if r["strategy"] != "ddp" and key.startswith("ddp"):
                stand_in.add((r["strategy"], r["world_size"]))
    if not grid:
        return None
    truth, note = None, ""
    first = by_key.get(rows[0]["source"].split(" ", 1)[0]) or next(iter(by_key.values()))
    try:
        cfg = OmegaConf.load(study_dir / "cells" / first["id"] / "config.yaml")
        scene = load_scene(cfg.dataset, "test")
        if cfg.eval.downscale > 1:
            scene = scene.downscaled(cfg.eval.downscale)
        truth = (scene.image(0).numpy() * 255).round().astype("uint8")
    except (OSError, ValueError) as err:  # the dataset is not where the cells saw it: said on the figure
        note = f" (ground truth not shown: {err})"
    cols = len(sizes) + (truth is not None)
    fig, axes = plt.subplots(2 * len(strategies), cols, figsize=(2.4 * cols, 2.4 * 2 * len(strategies)), squeeze=False)
    for i, strat in enumerate(strategies):
        for j in range(cols):
            w = sizes[j - (truth is not None)] if j >= (truth is not None) else None
            img = truth if w is None else grid.get((strat, w))
            for k, ax in enumerate((axes[2 * i][j], axes[2 * i + 1][j])):
                ax.axis("off")
                if img is None:
                    continue
                h, wd = img.shape[:2]
                ax.imshow(img if k == 0 else img[h * 3 // 8: h * 5 // 8, wd * 3 // 8: wd * 5 // 8])
                if k == 0:
                    ax.set_title("ground truth" if w is None else f"{strat}, W = {w}"
                                 + (" (the ddp cell)" if (strat, w) in stand_in else ""), fontsize=7)
    fig.suptitle("first test view per world size (repeat 0), full and centre crop" + note, fontsize=8)
    return fig


# ----------------------------------------------------------------------------- markdown / html
def _fmt(v, spec=".3g"):
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def _table(rows: list[dict], cols: list[tuple[str, str, str]]) -> list[str]:
    """Markdown table: cols = (key, header, format spec)."""
    if not rows:
        return ["(no cell of the study gives this table)"]
    out = ["| " + " | ".join(h for _, h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(_fmt(r.get(k), f) for k, _, f in cols) + " |")
    return out


def section_tables(data: dict) -> list[tuple[str, list[str]]]:
    """(title, markdown lines) of every section, shared by the Markdown and the HTML page."""
    t = data["tables"]
    cells = [{**c, "step_ms": 1e3 * c["figures"]["step_s_median"] if c.get("figures") else None,
              "psnr": (c.get("figures") or {}).get("psnr")} for c in data["cells"]]
    out = [("Cells", _table(cells, [("id", "cell", ""), ("status", "status", ""), ("contended", "contended", ""),
                                    ("busy", "busy cores at start", ".2f"), ("load1", "load1 at start", ".2f"), ("mem_available_mb", "free MiB", ".0f"),
                                    ("waited_s", "waited s", ".0f"), ("wall_s", "wall s", ".0f"),
                                    ("step_ms", "step ms", ".1f"), ("psnr", "PSNR", ".2f")]))]
    phase_cols = [(p, p, ".1%") for p in (*BREAKDOWN, "other")]
    out.append(("Training step breakdown (share of the step)",
                _table(t["breakdown"], [("cell", "cell", ""), ("world_size", "W", ""), ("step_ms", "step ms", ".1f"),
                                        *phase_cols])))
    out.append(("Synchronisation cost", _table(t["sync"], [
        ("cell", "cell", ""), ("kind", "kind", ""), ("world_size", "W", ""), ("params_per_rank", "params/rank", ".3g"),
        ("bytes_per_step", "bytes/step/rank", ".3g"), ("exposed_share", "exposed share", ".1%"),
        ("hidden_share_of_comm", "hidden share of comm", ".1%")])))
    out.append(("Inference: fused vs single-model render", _table(t["inference"], [
        ("cell", "cell", ""), ("regions", "K", ""), ("world_size", "W", ""), ("fused_s_per_view", "fused s/view", ".3g"),
        ("single_s_per_view", "single s/view", ".3g"), ("fused_over_single", "fused/single", ".2f"),
        ("routing_share", "routing", ".1%"), ("exchange_composite_share", "exchange+compositing", ".1%")])))
    out.append(("Input: stall share and pipelining", _table(t["input"], [
        ("cell", "cell", ""), ("sampler", "sampler", ""), ("world_size", "W", ""), ("step_ms", "step ms", ".1f"),
        ("input_stall_share", "input_wait share", ".1%"), ("speedup_over_sync", "speedup vs sync", ".2f"),
        ("ideal_bound", "ideal T/(T-S)", ".2f"), ("capacity_bound", "capacity bound", ".2f")])))
    out.append(("Quality at the budget", _table(t["quality"], [
        ("cell", "cell", ""), ("n", "n", ""), ("psnr", "PSNR dB (median)", ".2f"), ("psnr_mean", "mean", ".2f"),
        ("psnr_sd", "sd (seeds)", ".2f"), ("ssim", "SSIM", ".4f"),
        ("steps_s", "training s", ".0f"), ("params_per_rank", "params/rank", ".3g"),
        ("peak_rss_mb", "peak RSS MiB", ".0f")])))
    if t.get("capacity") or t.get("ranks"):
        out.append(("Capacity: test PSNR against parameters per rank (ddp, W = 1)", _table(t["capacity"], [
            ("context", "context", ""), ("budget", "budget", ""), ("params_per_rank", "params/rank", ".3g"), ("n", "n (seeds)", ""),
            ("psnr_mean", "PSNR mean dB", ".2f"), ("psnr_sd", "sd", ".2f"),
            ("db_per_doubling", "dB per doubling (from previous)", "+.2f"),
            ("db_per_doubling_around", "dB per doubling (around)", "+.2f"), ("steps", "steps", ".0f"),
            ("gain_last_max", f"gain over last {capacity.PLATEAU_FRACTION:.0%} of steps (max over seeds, val dB)",
             "+.2f"), ("plateau", f"plateau (< {capacity.PLATEAU_GAIN_DB} dB)", ""),
            ("constant_psnr", "constant-colour PSNR", ".2f")])))
        out.append(("Quality against ranks (equal steps, equal rays per rank per step)", _table(t["ranks"], [
            ("context", "context", ""), ("budget", "budget", ""), ("strategy", "strategy", ""), ("world_size", "W", ""),
            ("n", "n (seeds)", ""),
            ("psnr_mean", "PSNR mean dB", ".2f"), ("psnr_sd", "sd", ".2f"),
            ("db_per_doubling", "dB per doubling of ranks", "+.2f"), ("delta_vs_w1", "vs W = 1 dB", "+.2f"),
            ("single_equal_total_psnr", "one rank, W x the params (dB)", ".2f"),
            ("vs_single_equal_total", "vs that", "+.2f"), ("params_per_rank", "params/rank", ".3g"),
            ("source", "cell", "")])
            + ["", "Targets:", *[f"- {v}" for v in t.get("verdicts", [])]]))
    sc, chk = t["scaling"], t["scaling_check"]
    if sc:
        inp = sc["inputs"]
        mode = sc.get("mode", "strong")  # a report.json written before weak scaling existed was strong-scaled
        device = inp.get("device", "measured: the study's world-size-1 ddp cell on this machine")
        lines = [f"Device speed (an input): {inp['compute_s_per_ray']:.3g} s per training ray per device "
                 f"({device}); {mode} scaling"
                 + (f" at {inp.get('rays_per_rank') or inp['global_rays']} rays per rank." if mode == "weak" else
                    f" of {inp['global_rays']} rays per step."), "",
                 "Inputs (measured): " + ", ".join(f"{k} = {_fmt(v)}" for k, v in inp.items() if k != "device"), "",
                 "Assumptions:", *[f"- {a}" for a in sc["assumptions"]],
                 *[f"- {k}: {ic['note']}" for k, ic in sc["interconnects"].items()], ""]
        rows = [{"interconnect": name, "N": p["world_size"], "ddp": 1e3 * p["ddp"]["step_s"],
                 "ddp_exposed": 1e3 * p["ddp"]["exposed_comm_s"], "ssi": 1e3 * p["ss_independent"]["step_s"],
                 "ssj": 1e3 * p["ss_joint"]["step_s"], "fused": p["fused_over_single"]}
                for name, preds in sc["predictions"].items() for p in preds]
        lines += _table(rows, [("interconnect", "interconnect", ""), ("N", "GPUs", ""), ("ddp", "ddp ms", ".3g"),
                               ("ddp_exposed", "ddp exposed ms", ".3g"), ("ssi", "ss indep. ms", ".3g"),
                               ("ssj", "ss joint ms", ".3g"), ("fused", "fused/single", ".3g")])
        lines += ["", f"Check out of sample: fitted at W <= {FIT_MAX_WORLD_SIZE}, predicting the measured cells above "
                  f"(host collectives: {chk['host_collectives'] or 'not fitted'}; tolerance {chk['tolerance']:.0%}; "
                  "a miss is printed as within = False):", ""]
        checked = [r for r in chk["rows"] if r["world_size"] > FIT_MAX_WORLD_SIZE]  # older reports: in sample too
        if not checked:
            lines.append(f"(not run: the study has no finished cell at W > {FIT_MAX_WORLD_SIZE} beside its "
                         "world-size-1 ddp cell)")
        lines += [] if not checked else _table(checked, [("strategy", "strategy", ""), ("world_size", "W", ""),
                                      ("step_s", "measured s", ".4f"), ("predicted_s", "predicted s", ".4f"),
                                      ("relative_error", "error", "+.1%"), ("within", "within", "")])
        out.append(("Scaling model (past this machine, on paper)", lines))
    else:
        out.append(("Scaling model (past this machine, on paper)",
                    ["(needs a finished ddp cell at world size 1)"]))
    diff = t["differs"]
    out.append(("What differs (undeclared settings)", _table(diff, [
        ("cell", "cell", ""), ("against", "against", ""), ("key", "setting", ""), ("there", "there", ""),
        ("here", "in the cell", "")]) if diff else [
        "every finished cell differs from the first only in declared settings: " + ", ".join(data["declared"])]))
    return out


def to_markdown(data: dict, figure_names: list[str]) -> str:
    s = data["study"]
    lines = [f"# Study `{s['name']}`", "", s.get("description") or "", "",
             f"Cells: {len(data['cells'])} ({', '.join(f'{v} {k}' for k, v in data['status'].items())}); "
             f"repeats {s['repeats']}; timed: {s['timed']}; study directory `{data['study_dir']}`.", "",
             timing_line(data.get("timing")), ""]
    for title, body in section_tables(data):
        lines += [f"## {title}", "", *body, ""]
    for name in figure_names:
        lines.append(f"![{name}]({name})")
    return "\n".join(lines) + "\n"


def timing_line(t: dict | None) -> str:
    if not t or not t.get("first_cell_started"):
        return "Wall time: no cell has run."
    return (f"Wall time: cells from {t['first_cell_started']} to {t['last_cell_finished'] or '(running)'}; "
            f"{t['cells_wall_s'] / 60:.1f} min in the cells, {t['waited_s'] / 60:.1f} min waiting for a quiet machine.")


def _md_table_to_html(lines: list[str]) -> str:
    out, rows = [], [ln for ln in lines if ln.startswith("|") and not ln.startswith("|---")]
    if not rows:
        return "".join(f"<p>{html.escape(ln)}</p>" for ln in lines if ln)
    out.append("<table>")
    for i, r in enumerate(rows):
        tag = "th" if i == 0 else "td"
        out.append("<tr>" + "".join(f"<{tag}>{html.escape(c.strip())}</{tag}>" for c in r.strip("|").split("|"))
                   + "</tr>")
    out.append("</table>")
    rest = [ln for ln in lines if not ln.startswith("|")]
    return "".join(f"<p>{html.escape(ln)}</p>" for ln in rest if ln) + "".join(out)


def to_html(data: dict, figs: list[Path]) -> str:
    s = data["study"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>study {html.escape(s['name'])}</title>",
             "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}table{border-collapse:collapse;"
             "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}</style></head><body>",
             f"<h1>Study {html.escape(s['name'])}</h1><p>{html.escape(s.get('description') or '')}</p>",
             f"<p>{html.escape(timing_line(data.get('timing')))}</p>"]
    for title, body in section_tables(data):
        parts.append(f"<h2>{html.escape(title)}</h2>{_md_table_to_html(body)}")
    parts.append("<h2>Figures</h2>")
    for f in figs:
        data64 = base64.b64encode(f.read_bytes()).decode()
        parts.append(f"<p><a href='{f.name}'><img alt='{f.name}' src='data:image/png;base64,{data64}'></a></p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html_from_json(report_json: Path) -> Path:
    """``report.html`` beside a committed ``report.json`` (a report without its runs): the page
    :func:`write_report` writes, from the JSON and the figures it names beside it.

    Raises:
        FileNotFoundError: a figure the JSON names is missing (each named).
    """
    data = json.loads(Path(report_json).read_text())
    figs = [Path(report_json).parent / name for name in data.get("figures", [])]
    missing = [str(f) for f in figs if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"{report_json}: figures it names are missing: {', '.join(missing)}")
    out = Path(report_json).parent / "report.html"
    atomic_write_text(out, to_html(data, figs))
    return out


def write_report(study_dir: Path) -> dict:
    """Build and write ``STUDY_DIR/report/{report.json,report.md,report.html,*.png}``."""
    study_dir = Path(study_dir)
    data = build(study_dir)
    out = study_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    figs = figures(data, out)
    data["figures"] = [f.name for f in figs]
    atomic_write_text(out / "report.json", json.dumps(data, indent=1, allow_nan=False, default=str))
    atomic_write_text(out / "report.md", to_markdown(data, data["figures"]))
    atomic_write_text(out / "report.html", to_html(data, figs))
    data["files"] = [str(out / n) for n in ("report.json", "report.md", "report.html", *data["figures"])]
    return data
