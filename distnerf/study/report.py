"""The study's report: ``python -m distnerf.study report STUDY_DIR``.

Writes ``STUDY_DIR/report/``: ``report.json`` (every cell's figures and every table),
``report.md``, PNG figures (matplotlib, :mod:`.figures`) and ``report.html`` (one
self-contained page: the same tables, the figures embedded, each linking its PNG;
:mod:`.document`). This module collects the cells and builds the tables. Tables (repeats of a cell are
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
  ideal bound T/(T - S) and capacity bound (S + C)/max(S/W, C) (bench/scaling/characterisation.md:
  S the sync cell's input wait, C = T - S its compute, W workers);
* quality: test PSNR/SSIM at the budget and training PSNR against training time;
* capacity (:mod:`distnerf.study.capacity`): the capacity curve (world-size-1 ``ddp`` test PSNR
  mean and sd over seeds against parameters per rank, dB per doubling, the plateau check, the
  constant-colour level) and PSNR against ranks per strategy with error bars, one test view
  per world size side by side, and the targets met or missed;
* scaling model (:mod:`distnerf.study.scaling`) and its check against the measured points;
* what differs: cells whose config or environment differs from the first cell's in a
  setting that no axis on which the two differ declares (``distnerf.profile compare``'s
  fingerprint; :func:`distnerf.study.plan.declared_between`) are flagged.
"""
from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from omegaconf import OmegaConf

from ..fileio import atomic_write_text
from ..observe.compare import load_settings, setting_differences
from . import capacity, plan, runner, scaling
from .scaling import CHECK_TOLERANCE, FIT_MAX_WORLD_SIZE, HOST_LATENCY_S
from .collect import BREAKDOWN, cell_figures
from .document import to_html, to_markdown
from .figures import figures

STUDY_FILE = "study.yaml"  # the config the study ran with, saved by `run`


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
        declared += list(plan.THREAD_KEYS)
    _flag_differences(study_dir, cells, cfg)
    keys = {}
    for c in cells:
        keys.setdefault(c["key"], []).append(c)
    summary = {k: _summarise(v) for k, v in keys.items()}
    return {"study": OmegaConf.to_container(cfg), "study_dir": str(study_dir), "declared": declared,
            "cells": cells, "keys": summary}


def _flag_differences(study_dir: Path, cells: list[dict], cfg) -> None:
    """Each finished cell's ``undeclared`` settings against the first finished one (``reference``):
    keys of ``config.yaml`` or ``profile/env.json`` that differ although no axis on which the two
    cells differ declares them (:func:`distnerf.study.plan.declared_between`)."""
    done = [c for c in cells if c["status"] == "done"]
    if not done:
        return
    ref = done[0]
    ref_settings = load_settings(Path(study_dir) / "cells" / ref["id"])
    for c in done:
        _, undeclared = setting_differences(ref_settings, load_settings(Path(study_dir) / "cells" / c["id"]),
                                            plan.declared_between(cfg, ref, c))
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
    out["plateau_lr_shares"] = [capacity.lr_share([(p["step"], p.get("lr")) for p in d["curve"]]) for d in done]
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
    m = scaling.Measured(compute_s_per_ray=_compute_s(base) / base["global_rays"], global_rays=base["global_rays"],
                         rays_per_rank=base["global_rays"],
                         device=f"measured: the world-size-1 cell {plan.cell_key(base['values'])} "
                                f"({keys_threads(base):g} cores per rank)",
                         render_s_per_ray=(base["render_s_per_view_median"] or 0.0) / max(base["render_rays_per_view"]
                                                                                           or 1, 1),
                         render_rays=base["render_rays_per_view"] or 0)
    ddp2 = _counterpart(keys, base["values"], world_size=2)
    host = {}
    ddp2_rays = ddp2["global_rays"] / ddp2["world_size"] if ddp2 else None
    if ddp2 and keys_threads(ddp2) == keys_threads(base) and ddp2_rays != base["global_rays"]:
        # the same device at another batch per rank: a fixed time per step and a time per ray (in sample)
        m.fixed_s_per_step, m.compute_s_per_ray = scaling.fit_compute(
            [base["global_rays"], ddp2_rays], [_compute_s(base), _compute_s(ddp2)])
        if m.fixed_s_per_step:
            m.device += f"; fixed time per step and time per ray fitted with {plan.cell_key(ddp2['values'])}"
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
                              "global_rays": s["global_rays"], "compute_scale": base_threads / keys_threads(s)})
        check = scaling.check_against(m, check, host["bw"], host["lat"], CHECK_TOLERANCE)
    return m, check, host


def _compute_s(s: dict) -> float:
    """A cell's compute seconds per step: its mean phases but input, communication and step agreement."""
    ph = s["phases_mean_s"]
    return sum(ph.get(p) or 0.0 for p in ("copy", "forward", "backward", "optimizer", "other", "unattributed"))


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
    data["tables"] = derive_tables(data)
    data["status"] = {s: sum(c["status"] == s for c in data["cells"]) for s in sorted({c["status"]
                                                                                         for c in data["cells"]})}
    data["timing"] = study_timing(data["cells"])
    return data


def derive_tables(data: dict) -> dict:
    """Every table of the report from the collected cells (``data["keys"]``, ``data["cells"]``)."""
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
    return tables


def rederive(report_json: Path) -> dict:
    """Recompute a committed ``report.json``'s tables (the scaling model and its check, the verdicts, ...)
    from the cells' figures it holds, with this version of the code, and rewrite it in place: a report
    whose runs are not kept follows a change of the model without training again. The cells' figures,
    status and timing are kept as they are; the figures (PNGs) are not redrawn (``--html`` re-writes
    the page from the JSON).

    Raises:
        ValueError: the file is not a study report (no ``keys`` or ``cells``), naming it.
    """
    report_json = Path(report_json)
    data = json.loads(report_json.read_text())
    if not isinstance(data, dict) or "keys" not in data or "cells" not in data:
        raise ValueError(f"{report_json}: not a study report.json (no 'keys' and 'cells')")
    data["tables"] = derive_tables(data)
    atomic_write_text(report_json, json.dumps(data, indent=1, allow_nan=False, default=str))
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
