"""The tables of the scaling pages (``bench/scaling/*.md``), made from ``bench/*/results`` JSON (run
``python -m bench.tables``)."""
from __future__ import annotations

import statistics

from bench.tablekit import ResultError, Results, f2, kilo, mega, pct, psnr_ssim, row, header


SS_EQ = (("lego_eq", "lego"),)  # the wide scene's pairs (wide_eq, wide_eq2) went with the scene (issue 15)


def ss_eq(res: Results) -> list[str]:
    """bench/scaling/ss.py on ss / ddp pairs of (nearly) equal parameter counts."""
    out = header("scene (timed views, resolution; steps in 3 min)", "ss segment s / image", "ss blend s / image",
                 "ddp s / image", "**segment / ddp**", "samples per image, segment / ddp", "parameters ss / ddp",
                 "PSNR timed views: segment / blend / ddp", "PSNR all test views: ss / ddp (views)")
    verdicts = []
    for name, label in SS_EQ:
        d = res.json(f"{name}/bench_ss.json")
        ss_m, ddp_m = res.json(f"{name}/ss/metrics.json"), res.json(f"{name}/ddp/metrics.json")
        t, s, p, q = d["render_s_median"], d["samples_per_image_median"], d["params"], d["psnr_timed_views"]
        h, w = d["resolution"]
        ratio = d["render_ratio_segment_over_ddp"]
        out.append(row(f"{label} ({len(d['views'])}, {w}x{h}; ss {d['metrics_json']['ss']['step']}, "
                       f"ddp {d['metrics_json']['ddp']['step']})",
                       f2(t["ss_segment"]), f2(t["ss_blend"]), f2(t["ddp"]), f"**{ratio:.2f}x**",
                       f"{mega(s['ss_segment'])} / {mega(s['ddp'])}",
                       f"{p['ss_total'] / 1e6:.1f} M / {p['ddp'] / 1e6:.1f} M",
                       f"{q['ss_segment']:.2f} / {q['ss_blend']:.2f} / {q['ddp']:.2f}",
                       f"{ss_m['psnr']:.2f} / {ddp_m['psnr']:.2f} ({ss_m['protocol']['num_views']})"))
        if abs(p["ss_total"] / p["ddp"] - 1) < 0.01:
            verdicts.append(f"{name.split('_')[0]} {'met' if ratio <= 1.2 else 'missed'} ({ratio:.2f}x)")
    out += ["", "Target (fused render <= 1.2x the single model at equal total parameters, rows with parameter "
                f"counts within 1%): {'; '.join(verdicts)}."]
    return out


def ss_eq_detail(res: Results) -> list[str]:
    """bench/scaling/ss.py: where the fused render's time goes, and the training side."""
    out = header("scene", "render time per sample, segment / ddp", "samples, segment / ddp",
                 "segment: exchange + compositing share", "segment: routing share", "blend: routing share",
                 "blend / segment time", "samples outside the sub-model's own region, rank 0 / 1",
                 "training rays/s per rank, ss / ddp")
    for name, label in SS_EQ:
        d = res.json(f"{name}/bench_ss.json")
        t, s, fs = d["render_s_median"], d["samples_per_image_median"], d["fusion_share"]
        rps = d["train_rays_per_s_per_rank"]
        out.append(row(label, f"{1e6 * t['ss_segment'] / s['ss_segment']:.2f} / {1e6 * t['ddp'] / s['ddp']:.2f} us",
                       f"{s['ss_segment'] / s['ddp']:.2f}x", pct(fs["ss_segment"]["exchange_composite"]),
                       pct(fs["ss_segment"]["routing"]), pct(fs["ss_blend"]["routing"]),
                       f"{t['ss_blend'] / t['ss_segment']:.2f}x",
                       " / ".join(pct(x) for x in d["outside_own_region_share"]),
                       f"ss {' / '.join(f'{x:.0f}' for x in rps['ss'])}; ddp {' / '.join(f'{x:.0f}' for x in rps['ddp'])}"))
    return out


def ddp_sparse_decision(res: Results) -> list[str]:
    """bench/scaling/ddp.py allreduce: the grid at 160^3 on 2 ranks, sparse rule on (falls back) and off."""
    out = header("tree", "variant", "all-reduce hook s / step (median)", "bytes / step", "step s (median)")
    for label, rel in (("before (3512202)", "ddp_sparse_decision/before_3512202.json"),
                       ("after", "ddp_sparse_decision/after.json")):
        d = res.json(rel)
        for variant, m in d["models"].items():
            out.append(row(label, variant, f"{m['allreduce_s_per_step']:.4f}", mega(m["allreduce_bytes_per_step"]) + "B",
                           f"{m['step_s']:.3f}"))
    return out


def ddp_sparse_bounded(res: Results) -> list[str]:
    """bench/scaling/ddp.py allreduce: the grid at 160^3 on 2 ranks, dense, counted and bounded sparse exchange."""
    d = res.json("ddp_sparse_bounded/after.json")
    out = header("variant (`strategy.sparse_mode`)", "all-reduce hook s / step (median)", "bytes / step",
                 "vs dense bytes", "step s (median)")
    dense = d["models"]["grid160_dense"]["allreduce_bytes_per_step"]
    for variant, m in d["models"].items():
        out.append(row(variant, f"{m['allreduce_s_per_step']:.4f}", mega(m["allreduce_bytes_per_step"]) + "B",
                       f"{m['allreduce_bytes_per_step'] / dense:.2f}", f"{m['step_s']:.3f}"))
    return out


def city_capacity(res: Results) -> list[str]:
    """bench/scaling/capacity.sh: ddp test PSNR at a fixed step count for 0.5x, 1x and 2x the parameters."""
    from distnerf.observe.logger import final_model_size

    out = header("parameters (vs default)", "`model.resolutions`", "parameters per rank", "steps",
                 "test PSNR / SSIM (views)", "peak RSS of rank 0 (MiB)", "samples per ray at the end")
    rows = {}
    for scale in ("x0.5", "x1", "x2"):
        m = res.json(f"city_capacity/{scale}/metrics.json")
        log = res.jsonl(f"city_capacity/{scale}/metrics.jsonl")
        size = final_model_size(log)  # the finished model's, the peaks over a resumed run's sessions
        last = [r for r in log if "train_seconds" in r][-1]
        cfg = res.meta(f"city_capacity/{scale}/metrics.json")["command"]
        resolutions = cfg.split("model.resolutions=")[1].split()[0].strip("'\"")
        rows[scale] = m
        out.append(row(scale[1:] + "x", f"`{resolutions}`", mega(size["parameters_per_rank"]), m["step"],
                       f"{psnr_ssim(m)} ({m['protocol']['num_views']})", f"{size['peak_rss_mb']:.0f}",
                       f"{last['train_seconds']:.0f}"))
    gain = rows["x2"]["psnr"] - rows["x0.5"]["psnr"]
    return out + ["", f"Target (test PSNR rises >= 1.5 dB from 0.5x to 2x the default parameters): "
                      f"**{'met' if gain >= 1.5 else 'missed'}** ({gain:+.2f} dB)."]


UNBOUNDED_CELLS = (  # bench/scaling/unbounded.sh: cell, strategy (training), contraction, appearance
    ("ddp", "ddp", "mipnerf360", "affine"), ("ss_independent", "ss (independent)", "mipnerf360", "affine"),
    ("ss_joint", "ss (joint)", "mipnerf360", "affine"), ("ddp_no_contraction", "ddp", "none", "affine"),
    ("ddp_no_appearance", "ddp", "mipnerf360", "none"), ("ddp_neither", "ddp", "none", "none"))


def city_unbounded(res: Results) -> list[str]:
    """bench/scaling/unbounded.sh: quality at one time and per-rank parameter budget on the city."""
    from distnerf.observe.logger import final_model_size

    out = header("cell", "strategy", "contraction", "appearance", "parameters per rank (distinct in all)",
                 "peak RSS per rank (MiB)", "steps", "test PSNR / SSIM (views)")
    psnr = {}
    for cell, strategy, contraction, appearance in UNBOUNDED_CELLS:
        if not res.locate(f"city_unbounded/{cell}/metrics.json").is_file():
            out.append(row(cell, strategy, contraction, appearance, "not run", "", "", ""))
            continue
        m = res.json(f"city_unbounded/{cell}/metrics.json")
        log = res.jsonl(f"city_unbounded/{cell}/metrics.jsonl")
        size = final_model_size(log)  # the finished model's, the peaks over a resumed run's sessions
        rss = [r["peak_rss_mb"] for r in size["ranks"]]
        # distinct parameters: the regions' under ss, one replica's under ddp
        total = sum(v["parameters"] for v in size.get("parameters_per_region", {}).values()) or size["parameters_per_rank"]
        psnr[cell] = m["psnr"]
        out.append(row(cell, strategy, contraction, appearance,
                       f"{mega(size['parameters_per_rank'])} ({mega(total)})",
                       " / ".join(f"{x:.0f}" for x in rss), m["step"],
                       f"{psnr_ssim(m)} ({m['protocol']['num_views']})"))
    lines = [""]
    ss = [psnr[c] for c in ("ss_independent", "ss_joint") if c in psnr]
    if ss and "ddp" in psnr:
        gap = max(ss) - psnr["ddp"]
        lines.append(f"Target (the better ss mode >= ddp + 1 dB): **{'met' if gap >= 1.0 else 'missed'}** "
                     f"({gap:+.2f} dB).")
    if "ddp" in psnr and "ddp_neither" in psnr:
        gain = psnr["ddp"] - psnr["ddp_neither"]
        lines.append(f"Target (contraction + appearance >= +2 dB over neither, ddp): "
                     f"**{'met' if gain >= 2.0 else 'missed'}** ({gain:+.2f} dB).")
    return out + lines


def city_balance(res: Results) -> list[str]:
    """bench/scaling/balance.py on the ss runs of bench/scaling/unbounded.sh (grid and balanced partitions)."""
    d = res.json("city_balance/bench_balance.json")
    out = header("run", "partition (training)", "training rays per region (of 65,536)", "owner of each region",
                 "work per rank (ms/step)", "field evaluations per rank and step", "imbalance (slowest / fastest)")
    worst = 0.0
    for name, r in d["runs"].items():
        worst = max(worst, r["imbalance"])
        out.append(row(name, f"{r['partition']} ({r['training']})", " / ".join(str(x) for x in r["rays"]),
                       " / ".join(str(x) for x in r["owners"]),
                       " / ".join(f"{1000 * x['work_s']:.0f}" for x in r["ranks"]),
                       " / ".join(kilo(x["field_evals"]) for x in r["ranks"]), f"{r['imbalance']:.3f}"))
    return out + ["", f"Target (imbalance <= 1.10 with both partitions): **{'met' if worst <= 1.10 else 'missed'}** "
                      f"(worst {worst:.3f})."]


def regions_series(res: Results, name: str = "city_small_regions") -> list[str]:
    """bench/scaling/regions.sh: ss with K regions of a fixed size on one process, fixed training time."""
    from distnerf.observe.logger import final_model_size

    out = header("regions K", "parameters (all regions)", "steps", "test PSNR / SSIM (views)",
                 "render time per image (s, median)", "fused / single render time")
    ks = sorted(int(p.name[1:]) for p in res.locate(name).glob("k*") if (p / "metrics.json").is_file())
    single = None
    for k in ks:
        m = res.json(f"{name}/k{k}/metrics.json")
        size = final_model_size(res.jsonl(f"{name}/k{k}/metrics.jsonl"))
        seconds = sorted(v["seconds"] for v in m["per_view"])
        median = seconds[len(seconds) // 2]
        single = median if k == 1 else single
        ratio = f"{median / single:.2f}" if single else "n/a (no K = 1 run)"
        out.append(row(k, mega(size["parameters_total"]), m["step"], f"{psnr_ssim(m)} ({m['protocol']['num_views']})",
                       f"{median:.2f}", ratio))
    return out


def study_characterization(res: Results) -> list[str]:
    """python -m distnerf.study report bench/scaling/results/study_characterization/report.json --markdown: the
    sections of the study's report (the committed JSON of conf/study/characterization.yaml's run)."""
    from distnerf.study.document import section_tables

    data = res.json("study_characterization/report.json")
    out = []
    for title, body in section_tables(data):
        out += [f"#### {title}", "", *body, ""]
    return out[:-1]


def study_capacity(res: Results, name: str = "study_capacity",
                   sections: tuple[str, ...] = ("Capacity", "Quality against ranks"), timing: bool = True) -> list[str]:
    """The capacity study's report (conf/study/capacity.yaml; its committed report.json): wall time, the
    capacity curve, quality against ranks and the targets (``sections``: the report's sections shown,
    by the start of their titles; ``timing``: the wall-time line first)."""
    from distnerf.study.document import section_tables, timing_line

    data = res.json(f"{name}/report.json")
    out = [timing_line(data.get("timing")), ""] if timing else []
    for title, body in section_tables(data):
        if title.startswith(sections):
            out += [f"#### {title}", "", *body, ""]
    return out[:-1]


def study_capacity_stretch(res: Results) -> list[str]:
    """bench/scaling/stretch.py beside the capacity study: each budget at the study's 3000 steps (the study's
    cells, mean over their seeds) and at k x the steps with the schedule stretched k times (seed 0)."""
    from math import log2

    study = res.json("study_capacity_decay1500/report.json")["tables"]["capacity"]
    at_study = {r["budget"]: r for r in study}
    rows = res.json("study_capacity/stretch.json")["rows"]
    steps = sorted({r["steps"] for r in rows})
    out = header("budget", "params/rank", "3000 steps (the first study, default decay; n)", *[f"{n} steps (k = {n // 3000})" for n in steps],
                 "val gain, last 20% of the longest run", "lr at 80% of the steps (x first)")
    for budget in sorted({r["max_params"] for r in rows}):
        mine = {r["steps"]: r for r in rows if r["max_params"] == budget}
        ref = next((v for k, v in at_study.items() if int(float(k.lstrip("p").rstrip("k")) * 1000) in (budget, budget + 250)
                    or abs(v["params_per_rank"] - next(iter(mine.values()))["parameters_per_rank"]) < 1), None)
        longest = mine[max(mine)]
        out.append(row(f"{budget / 1e3:g} k", f"{longest['parameters_per_rank']:.3g}",
                       f"{ref['psnr_mean']:.2f} ({ref['n']})" if ref else "–",
                       *[f2(mine[n]["psnr"]) if n in mine else "–" for n in steps],
                       f"{longest['val_gain_last_20pct']:+.3f} dB", f"{longest['lr_at_80pct_over_first']:.3f}"))
    for n in steps:
        at = sorted((r["parameters_per_rank"], r["psnr"]) for r in rows if r["steps"] == n)
        if len(at) >= 3:
            out += ["", f"dB per doubling of parameters at {n // 3000}x the steps (around each inner budget): " + ", ".join(
                f"{p1 / 1e3:.0f} k: {(y2 - y0) / log2(p2 / p0):+.2f}" for (p0, y0), (p1, _), (p2, y2) in zip(at, at[1:], at[2:]))]
    return out


def _schedule_rule(r: dict) -> str:
    """A bench/scaling/stretch.py row's learning-rate rule in words."""
    if r["decay"] == 1.0:
        return "constant"
    if r["decay_steps"] is None:
        return f"constant to {r['decay_start']:.0%} of the steps, then x {r['decay']:g} over the rest"
    return f"x {r['decay']:g} per {r['decay_steps']:.0f} steps (x {r['decay'] ** (r['steps'] / r['decay_steps']):.2f} at the end)"


def study_capacity_batch(res: Results) -> list[str]:
    """bench/scaling/stretch.py probes of ddp's batch effect at the plateau (one process, seed 0): one 125 k model at
    2048 rays per step (ddp at W = 1), 4096 and 8192 (the gradient of ddp at W = 2 and 4: the mean over W x 2048
    rays), and two joint sub-models of 125 k at 4096 (joint ss at W = 2 in one process), under a constant rate
    and under a warmup-stable-decay schedule."""
    rows = res.json("study_capacity_plateau/batch.json")["rows"]

    def model(r: dict) -> str:
        if r["strategy"] == "ss":
            k = r["num_regions"]
            return f"{k} {r['training']} sub-models, {k} x {r['max_params'] / k / 1e3:g} k" + (
                " (cubic voxels)" if r["cubic_voxels"] else "")
        return f"one model, {r['max_params'] / 1e3:g} k"

    out = header("model", "rays per step", "as", "steps", "learning rate", "test PSNR dB (25 views)", "SSIM",
                 "val gain, last 20% of the steps", "val gain, last 20% of the constant phase", "run")
    for r in sorted(rows, key=lambda r: (r["decay"] < 1.0, r["strategy"] == "ss", r["global_rays"], r["steps"])):
        before = r.get("val_gain_before_decay")
        as_ = f"{'joint ss' if r['strategy'] == 'ss' else 'ddp'} at W = {r['global_rays'] // 2048}"
        out.append(row(model(r), r["global_rays"], as_, r["steps"], _schedule_rule(r), f2(r["psnr"]), f"{r['ssim']:.4f}",
                       f"{r['val_gain_last_20pct']:+.3f} dB", "–" if before is None else f"{before:+.3f} dB", r["run"]))
    return out


def study_capacity_schedule(res: Results) -> list[str]:
    """bench/scaling/stretch.py probes of the capacity study's learning-rate schedule (one rank, seed 0)."""
    from distnerf.study.capacity import PLATEAU_GAIN_DB, PLATEAU_MIN_LR_SHARE

    rows = res.json("study_capacity/schedule.json")["rows"]

    out = header("budget", "params/rank", "steps", "learning rate", "test PSNR dB (25 views)",
                 "val gain, last 20% of the steps", "lr at 80% of the steps (x first)", "plateau (< 0.2 dB, lr >= 0.1 x)")
    for r in sorted(rows, key=lambda r: (r["max_params"], r["steps"], -r["decay"], r["decay_steps"] or 0)):
        plateau = r["val_gain_last_20pct"] < PLATEAU_GAIN_DB and r["lr_at_80pct_over_first"] >= PLATEAU_MIN_LR_SHARE
        out.append(row(f"{r['max_params'] / 1e3:g} k", f"{r['parameters_per_rank']:.3g}", r["steps"], _schedule_rule(r), f2(r["psnr"]),
                       f"{r['val_gain_last_20pct']:+.3f} dB", f"{r['lr_at_80pct_over_first']:.3f}", "yes" if plateau else "no"))
    return out


def study_capacity_seams(res: Results, name: str = "study_capacity") -> list[str]:
    """bench/scaling/seam_psnr.py over a capacity study (``name``: its results directory): PSNR at the partition's
    seams against the rest."""
    import statistics

    data = res.json(f"{name}/seams.json")
    ranked = {r["budget"] for r in data["rows"] if r["world_size"] > 1}  # the budgets the ranks were run at
    groups: dict[tuple, list[dict]] = {}
    for r in data["rows"]:
        if r["budget"] in ranked:
            groups.setdefault((r["partition_world_size"], r["strategy"], r["world_size"]), []).append(r)

    def mean(rows, k):
        return statistics.mean(r[k] for r in rows)

    out = header("partition (W regions)", "strategy", "W", "n (seeds)", "seam PSNR dB", "rest PSNR dB",
                 "gap (seam - rest) dB", "sd", "gap minus the one-rank model's", "seam pixels (share)")
    for (pw, strategy, w), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1])):
        ref = groups.get((pw, "ddp", 1))
        gaps = [r["gap_db"] for r in rows]
        share = rows[0]["seam_pixels"] / (rows[0]["seam_pixels"] + rows[0]["rest_pixels"])
        out.append(row(pw, strategy, w, len(rows), f2(mean(rows, "seam_psnr")), f2(mean(rows, "rest_psnr")),
                       f"{statistics.mean(gaps):+.2f}", f2(statistics.stdev(gaps)) if len(gaps) > 1 else "–",
                       "–" if (strategy, w) == ("ddp", 1) or not ref else f"{statistics.mean(gaps) - mean(ref, 'gap_db'):+.2f}",
                       f"{share:.1%}"))
    out += ["", f"Seam band: surface points within {data['band']:g} world units of a face shared by two regions "
                "(the unit sphere's radius is 1)."]
    return out


def study_capacity_tv_probe(res: Results) -> list[str]:
    """bench/scaling/stretch.py probes of the total-variation regulariser: one model against two joint sub-models
    holding the same budget on one process (seed 0, 1500 steps, constant learning rate)."""
    rows = res.json("study_capacity/tv_probe.json")["rows"]

    def model(r: dict) -> str:
        if r["strategy"] == "ddp":
            return "one model"
        return f"{r['num_regions']} joint sub-models" + (" (cubic voxels)" if r["cubic_voxels"] else "")

    def weight(r: dict) -> str:
        if r["tv_weight"] == 0:
            return "0 (none)"
        if r["strategy"] == "ddp":
            return f"{r['tv_weight']:g}"
        k = r["num_regions"]  # ss joint: each sub-model takes tv_weight / K
        return f"{r['tv_weight']:g} / {k} = {r['tv_weight'] / k:g} each"

    out = header("model", "params (all)", "tv_weight (each model's)", "steps", "test PSNR dB (25 views)")
    for r in sorted(rows, key=lambda r: (r["strategy"] != "ddp", -r["tv_weight"], r["run"])):
        out.append(row(model(r), f"{r['parameters_per_rank']:.3g}", weight(r), r["steps"], f2(r["psnr"])))
    return out


def study_capacity_cubic_tv(res: Results) -> list[str]:
    """Seed 0 of the ss cells with cubic voxels, the regulariser still at the grid's default (the ddp cells the
    earlier study's): quality against ranks only (its wall time counts the copied cells: not shown)."""
    return study_capacity(res, "study_capacity_cubic_tv", sections=("Quality against ranks",), timing=False)


def study_capacity_tv(res: Results) -> list[str]:
    """The capacity study before cubic voxels and without the regulariser's removal (conf/study/capacity.yaml at f57c29d)."""
    return study_capacity(res, "study_capacity_tv")


def study_capacity_decay1500(res: Results) -> list[str]:
    """The first detail study (16 of its 33 cells), under the schema's default decay (10x per 1500 steps)."""
    return study_capacity(res, "study_capacity_decay1500")


def study_capacity_lego(res: Results) -> list[str]:
    """The capacity study on lego at 31 k-500 k parameters per rank (conf/study/capacity_lego.yaml)."""
    return study_capacity(res, "study_capacity_lego")


def study_capacity_plateau(res: Results) -> list[str]:
    """conf/study/capacity_plateau.yaml: the capacity curve at its plateau, with its targets."""
    return study_capacity(res, "study_capacity_plateau", sections=("Capacity",))


def study_capacity_cooled(res: Results) -> list[str]:
    """conf/study/capacity_cooled.yaml: quality against ranks at 125 k, each cell cooled at its end, with its targets."""
    return study_capacity(res, "study_capacity_cooled", sections=("Quality against ranks",))


def study_capacity_cooled_p62k(res: Results) -> list[str]:
    """conf/study/capacity_cooled_p62k.yaml: the cooled ranks study at 62.5 k parameters per rank, with its targets."""
    return study_capacity(res, "study_capacity_cooled_p62k", sections=("Quality against ranks",))


def ranks_with_control(res: Results, studies: tuple[str, ...], control: str) -> list[str]:
    """A ranks study's rows (distnerf.study.capacity.ranks_rows over the committed cell summaries of ``studies``,
    results folders), each with the one-rank ddp cell of W times its parameters from ``control``'s capacity table
    (annotate_equal_total, the study's own rule), so that an ss row's gain over ddp at W = 1 splits into what more
    parameters on one rank give (the control minus W = 1) and what ss gives beyond them (the row minus the
    control); with each row's ray segments per ray and median step time."""
    from distnerf.study.capacity import annotate_equal_total, ranks_rows

    keys = {}
    for name in studies:
        keys.update(res.json(f"{name}/report.json")["keys"])
    ranks = ranks_rows(keys)
    curve = res.json(f"{control}/report.json")["tables"]["capacity"]
    annotate_equal_total(ranks, curve)
    base = next(r["psnr_mean"] for r in ranks if r["strategy"] == "ddp" and r["world_size"] == 1)
    out = header("strategy", "W", "parameters per rank", "distinct in all", "test PSNR dB (3 seeds)", "vs ddp at W = 1",
                 "control: one rank at the same distinct total", "its PSNR dB (3 seeds, sd)", "control vs ddp at W = 1",
                 "row vs control", "segments per ray", "step ms (untimed)")
    for r in ranks:
        if r["strategy"] != "ddp" and r["world_size"] == 1:
            continue  # one region is one model: the ddp row
        split = r["strategy"] != "ddp"  # ddp's ranks hold replicas: one model's parameters, W copies
        ctrl = r["single_equal_total_psnr"] if split and r["world_size"] > 1 else None
        cells = ("–",) * 4 if ctrl is None else (
            kilo(r["single_equal_total_params"]), f"{ctrl:.2f} ({r['single_equal_total_sd']:.2f})",
            f"{ctrl - base:+.2f}", f"{r['vs_single_equal_total']:+.2f}")
        out.append(row(r["strategy"], r["world_size"], kilo(r["params_per_rank"]),
                       kilo(r["params_per_rank"] * (r["world_size"] if split else 1)), f2(r["psnr_mean"]),
                       "–" if r["world_size"] == 1 else f"{r['psnr_mean'] - base:+.2f}", *cells,
                       f2(r["segments_per_ray"]), f"{r['step_ms']:.1f}"))
    return out


def study_capacity_cooled_p62k_control(res: Results) -> list[str]:
    """The cooled 62.5 k ranks study beside its control (conf/study/capacity_cooled_p62k_control.yaml): the study's
    ranks rows and those of conf/study/capacity_cooled_p62k_independent.yaml (independent ss at W = 2), each
    beside the one-rank cell of W times its parameters (:func:`ranks_with_control`)."""
    return ranks_with_control(res, ("study_capacity_cooled_p62k", "study_capacity_cooled_p62k_independent"),
                              "study_capacity_cooled_p62k_control")


def study_aerial(res: Results) -> list[str]:
    """conf/study/aerial.yaml: ddp, joint and independent ss at W = 1, 2, 4 on city_small at 62.5 k per rank, each
    ss row beside the study's own one-rank cells at 125 k and 250 k (:func:`ranks_with_control`)."""
    return ranks_with_control(res, ("study_aerial",), "study_aerial")


def study_aerial_curve(res: Results) -> list[str]:
    """conf/study/aerial_curve.yaml: the capacity curve of one rank on city_small with the cheap march."""
    return study_capacity(res, "study_aerial_curve", sections=("Capacity",))


ARMS = {"one_model": "A one model", "sharded": "B joint, sharded", "per_region": "E joint, per region",
        "ddp": "G ddp, A's model on W ranks"}  # the arms of conf/study/aerial_sharded*.yaml
ADAM_BYTES = 16  # counted bytes per parameter under dense Adam: value, gradient, two moments (fp32)


def _aerial_arm_rows(report: dict, comparison_w) -> dict:
    """{(arm, comparison W): summary} of a study report's cells (the comparison's W: the budget level ``wW``)."""
    out: dict = {}
    for c in report["cells"]:
        if c.get("status") != "done":
            continue
        v = c["values"]
        key = (v["strategy"], comparison_w(v))
        out.setdefault(key, []).append(c["figures"])
    return out


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def study_aerial_sharded(res: Results) -> list[str]:
    """conf/study/aerial_sharded.yaml (A, B, E at W = 2 and 4, equal batch) with bench/scaling/inside_beyond.py's
    split of each cell's test pixels, and conf/study/aerial_sharded_price.yaml (G beside B, 400 steps): per arm and
    W, PSNR mean and sd over seeds, SSIM, PSNR inside the scene box and beyond it, samples per ray, parameters per
    rank, counted bytes per rank (parameters x 16: value, gradient and dense Adam's two moments), peak RSS; then
    B - A with the standard error of the difference; then the price rows (bytes exchanged a step, step time)."""
    report = res.json("study_aerial_sharded/report.json")
    split = res.json("study_aerial_sharded/inside_beyond.json")
    w_of = lambda v: int(str(v["budget"])[1:])  # noqa: E731 (budget level wW: the comparison's W)
    arms = _aerial_arm_rows(report, w_of)
    pix: dict = {}
    for r in split["rows"]:
        pix.setdefault((r["values"]["strategy"], w_of(r["values"])), []).append(r)
    out = header("arm", "W", "seeds", "test PSNR dB (mean, sd)", "SSIM", "inside the box dB", "beyond it dB",
                 "samples per ray", "parameters per rank", "counted MB per rank", "peak RSS MiB per rank")
    psnrs = {}
    for (arm, w) in sorted(arms, key=lambda k: (k[1], list(ARMS).index(k[0]))):
        figs = arms[arm, w]
        ps = [f["psnr"] for f in figs]
        psnrs[arm, w] = ps
        m, sd = _mean_sd(ps)
        ins = [r["inside_psnr"] for r in pix.get((arm, w), [])]
        bey = [r["beyond_psnr"] for r in pix.get((arm, w), [])]
        params = statistics.median([f["parameters_per_rank"] for f in figs])
        out.append(row(ARMS[arm], w, len(figs), f"{m:.2f} ({sd:.2f})", f"{_mean_sd([f['ssim'] for f in figs])[0]:.3f}",
                       f"{_mean_sd(ins)[0]:.2f}" if ins else "–", f"{_mean_sd(bey)[0]:.2f}" if bey else "–",
                       f2(statistics.median([f["samples_per_ray_median"] for f in figs])), kilo(params),
                       f"{params * ADAM_BYTES / 1e6:.2f}", f"{max(f['peak_rss_mb'] for f in figs):.0f}"))
    out.append("")
    out += header("W", "B - A dB", "standard error of the difference", "within 0.1 dB or two standard errors",
                  "B's counted bytes per rank / (A's / W)")
    for w in sorted({w for _, w in arms}):
        if ("sharded", w) not in psnrs or ("one_model", w) not in psnrs:
            continue
        a, b = psnrs["one_model", w], psnrs["sharded", w]
        (ma, sa), (mb, sb) = _mean_sd(a), _mean_sd(b)
        se = (sa ** 2 / len(a) + sb ** 2 / len(b)) ** 0.5
        pa = statistics.median([f["parameters_per_rank"] for f in arms["one_model", w]])
        pb = statistics.median([f["parameters_per_rank"] for f in arms["sharded", w]])
        met = abs(mb - ma) <= 0.1 or abs(mb - ma) <= 2 * se
        out.append(row(w, f"{mb - ma:+.2f}", f"{se:.2f}", "yes" if met else "no", f"{pb / (pa / w):.3f}"))
    try:
        price = res.json("study_aerial_sharded_price/report.json")
    except (FileNotFoundError, ResultError):
        return out
    out.append("")
    out += header("arm (400 steps)", "W", "gradient all-reduce bytes a step", "segment all-gather bytes a step",
                  "face planes' all-reduce bytes a step", "occupancy merges' bytes a step", "step ms (median)",
                  "parameters per rank", "peak RSS MiB per rank")
    for c in sorted((c for c in price["cells"] if c.get("status") == "done"),
                    key=lambda c: (c["values"]["world_size"], c["values"]["strategy"])):
        f, v = c["figures"], c["values"]
        out.append(row(ARMS[v["strategy"]], v["world_size"], kilo(f["allreduce_bytes_per_step"] or 0),
                       kilo(f["exchange_bytes_per_step"] or 0), kilo(f.get("face_bytes_per_step") or 0),
                       kilo(f.get("occupancy_bytes_per_step") or 0), f"{1e3 * f['step_s_median']:.1f}",
                       kilo(f["parameters_per_rank"]), f"{f['peak_rss_mb']:.0f}"))
    return out


def _touched_rows(res: Results, name: str, arm_w) -> list[str]:
    """The touched-vertex share of ``name``'s re-run cells (``name/touched.json``, bench/scaling/touched.py: one
    row per cell, the cells' final checkpoints), keyed by ``arm_w(values) -> (arm label, W)``; [] when absent."""
    try:
        data = res.json(f"{name}/touched.json")
    except (FileNotFoundError, ResultError):
        return []
    out = header("arm", "W", "seed", "vertices touched by a sample of weight > 1e-4", "rows held, every model",
                 "rows per model", "the cell's test PSNR dB")
    for r in sorted(data["rows"], key=lambda r: (arm_w(r["values"])[1], arm_w(r["values"])[0])):
        arm, w = arm_w(r["values"])
        out.append(row(arm, w, r["repeat"], f"{100 * r['share']:.1f}%", kilo(r["vertices"]),
                       " / ".join(f"{100 * t / v:.0f}% of {kilo(v)}" for t, v in r["per_model"]),
                       f2(r["psnr"]) if r.get("psnr") is not None else "–"))
    return out


def study_aerial_sharded_touched(res: Results) -> list[str]:
    """The aerial arms' first seed trained again to keep its checkpoints (``study run --repeats 1``), each cell's
    share of vertices touched by a sample of weight > 1e-4 (bench/scaling/touched.py, 100 batches of the run's
    global batch of training rays on its final model)."""
    w_of = lambda v: int(str(v["budget"])[1:])  # noqa: E731 (budget level wW: the comparison's W)
    return _touched_rows(res, "study_aerial_sharded_touched", lambda v: (ARMS[v["strategy"]], w_of(v)))


def study_capacity_cooled_p62k_control_batch(res: Results) -> list[str]:
    """``detail``: the joint ss cells of conf/study/capacity_cooled_p62k.yaml (W = 2, 4; 2048 rays per rank, so 4096
    and 8192 a step) against the one-rank control at the same global batch and about their total parameters
    (conf/study/capacity_cooled_p62k_control_batch.yaml), 3 seeds each: PSNR mean and sd, SSIM, the difference
    with its standard error, parameters; then the control's touched-vertex share where measured."""
    joint = [c for c in res.json("study_capacity_cooled_p62k/report.json")["cells"]
             if c.get("status") == "done" and c["values"]["strategy"] == "ss_joint"]
    ctrl = [c for c in res.json("study_capacity_cooled_p62k_control_batch/report.json")["cells"]
            if c.get("status") == "done"]
    out = header("W", "global rays a step", "joint ss dB (mean, sd; n)", "parameters in all", "control dB (mean, sd; n)",
                 "its parameters", "joint - control dB", "standard error", "SSIM joint / control")
    for w, rays in ((2, 4096), (4, 8192)):
        j = [c["figures"] for c in joint if c["values"]["world_size"] == w]
        a = [c["figures"] for c in ctrl if c["figures"]["global_rays"] == rays]
        if not j or not a:
            continue
        (mj, sj), (ma, sa) = _mean_sd([f["psnr"] for f in j]), _mean_sd([f["psnr"] for f in a])
        se = (sj ** 2 / len(j) + sa ** 2 / len(a)) ** 0.5
        out.append(row(w, rays, f"{mj:.2f} ({sj:.3f}; {len(j)})", kilo(j[0]["parameters_total"]),
                       f"{ma:.2f} ({sa:.3f}; {len(a)})", kilo(a[0]["parameters_total"]), f"{mj - ma:+.2f}",
                       f"{se:.3f}", f"{_mean_sd([f['ssim'] for f in j])[0]:.4f} / {_mean_sd([f['ssim'] for f in a])[0]:.4f}"))
    touched = _touched_rows(res, "study_capacity_cooled_p62k_control_batch",
                            lambda v: ("A one model (control)", {"p104k_r4096": 2, "p220k_r8192": 4}[v["budget"]]))
    joint_touched = _touched_rows(res, "study_capacity_cooled_p62k_joint_touched",
                                  lambda v: ("joint ss (seed 0 trained again)", v["world_size"]))
    return out + ([""] + touched if touched else []) + ([""] + joint_touched if joint_touched else [])


OLD_SPARSE_BOUND = 0.25  # strategy.sparse_max_density's default before the crossover was measured (2026-12-07)


def exchange_crossover(res: Results) -> list[str]:
    """bench/scaling/exchange.py: one bucket's dense all-reduce against the counted and bounded sparse exchange,
    rank 0's median seconds at each world size and density, the fastest, and what the byte rule
    (sparse_exchange.sparse_pays) chooses under the old and the current default density bound."""
    from distnerf.schema import DDPStrategyConfig

    d = res.json("exchange_crossover/result.json")
    bound = DDPStrategyConfig().sparse_max_density

    def choice(r: dict, limit: float) -> str:
        chosen = "sparse" if r["rule_chooses"] == "sparse" and r["density"] <= limit else "dense"
        return chosen + (" (right)" if (chosen == "dense") == (r["fastest"] == "dense") else " (wrong)")

    out = header("W", "density", "dense ms", "counted ms", "bounded ms", "fastest", "sparse / dense time (best sparse)",
                 "sparse / dense bytes (bounded)", f"byte rule, bound {OLD_SPARSE_BOUND:g} (old default)",
                 f"byte rule, bound {bound:g} (default)")
    for r in d["rows"]:
        sec = r["seconds"]
        out.append(row(r["world_size"], f"{r['density']:g}", *(f"{1e3 * sec[k]:.1f}" for k in ("dense", "counted", "bounded")),
                       r["fastest"], f"{r['sparse_over_dense_time']:.2f}", f"{r['sparse_over_dense_bytes']:.3f}",
                       choice(r, OLD_SPARSE_BOUND), choice(r, bound)))
    s = d["settings"]
    out += ["", f"A bucket of {s['numel']:,} float32 entries, gloo on this machine's loopback, one thread a rank, "
                f"median of {s['repeats']} alternating repeats; at W = 4 four ranks share 2 cores."]
    return out


def joint_exchange(res: Results) -> list[str]:
    """bench/scaling/joint_exchange.py: joint ss's gathered and routed exchange at W = 2 and 4, rank 0's bytes per
    step (what it contributes and what leaves it), their growth from the smallest W, the regions a ray crosses,
    the untimed step median and the PSNR of the few steps."""
    d = res.json("joint_exchange/result.json")
    out = header("exchange", "W = K", "regions a ray crosses (mean)", "rank 0 contributes, kB/step",
                 "leaves rank 0, kB/step", "x smallest W (leaves)", "step ms (rank 0 median, quiet)", "test PSNR dB")
    for r in d["runs"]:
        out.append(row(r["exchange"], r["world_size"], f2(r["regions_crossed_mean"]),
                       f"{r['bytes_per_step_rank0'] / 1e3:.1f}", f"{r['moved_bytes_per_step_rank0'] / 1e3:.1f}",
                       f"{r['moved_bytes_vs_smallest_w']:.2f}", f"{r['step_ms_median']:.1f}", f2(r["psnr"])))
    s = d["settings"]
    out += ["", f"{s['rays_per_rank']} rays per rank per step, {s['steps']} steps, `city_small` with the aerial study's "
                f"cheap march, K = W regions, gloo on this machine's loopback, one thread a rank."]
    return out


def occupancy_merge(res: Results) -> list[str]:
    """bench/scaling/occupancy_merge.py: the sharded joint model's occupancy merge, the bit-packed OR against the
    all-reduce (max) it replaced: exact bytes per merge and rank (the merge's recorded count, the bus bytes), rank
    0's median ms, the ratios and whether the two merged grids are identical."""
    d = res.json("occupancy_merge/result.json")
    out = header("cells", "all-reduce (max) B recorded / bus", "bit-packed OR B recorded / bus", "OR / max bytes",
                 "all-reduce (max) ms", "bit-packed OR ms", "OR / max time", "identical")
    for r in d["rows"]:
        b, sec = r["bytes"], r["seconds"]
        out.append(row(f"{r['resolution']}^3", f"{b['max']['recorded']:,} / {b['max']['bus']:,.0f}",
                       f"{b['or_bits']['recorded']:,} / {b['or_bits']['bus']:,.0f}", f"{r['or_bits_over_max_bytes']:.3f}",
                       f"{1e3 * sec['max']:.2f}", f"{1e3 * sec['or_bits']:.2f}", f"{r['or_bits_over_max_time']:.2f}",
                       "yes" if r["identical"] else "NO"))
    s = d["settings"]
    out += ["", f"W = {s['world_size']} gloo ranks on this machine's loopback, one thread a rank, each rank's slab of the "
                f"grid {s['occupied']:g} occupied; rank 0's median of {s['repeats']} alternating repeats."]
    return out


def exposed_comm(res: Results) -> list[str]:
    """bench/scaling/exposed_comm.py: 2-rank ddp on lego, each run's exposed communication share per rank, the
    median step and the test PSNR, by the dense buckets' wire dtype."""
    d = res.json("exposed_comm/result.json")
    out = header("wire dtype", "repeat", "exposed share, rank 0 / rank 1", "step ms (median, mean of ranks)",
                 "test PSNR dB")
    for r in d["runs"]:
        out.append(row(r["compression"], r["repeat"], " / ".join(pct(x["exposed_share"]) for x in r["ranks"]),
                       f"{r['step_ms_median_mean']:.1f}", f2(r["psnr"])))
    s = d["settings"]
    out += ["", f"lego, W = {s['world_size']}, {s['global_rays']} rays a step in all, {s['steps']} steps (the grid at "
                f"128^3 from step 200), {s['eval_views']} test views, gloo on loopback, one thread a rank."]
    return out


def exposed_comm_rows(res: Results) -> list[str]:
    """bench/scaling/exposed_comm.py with ``strategy.sparse_tables`` beside the dense default, two versions of the
    rows' exchange: after the backward, and launched in it (the table's hook, on a group of its own)."""
    files = [("colour tables, after the backward (the option, `dbf75f0`)", "exposed_comm_rows_after_backward/result.json"),
             ("colour tables, launched in the backward (`04c3fb9`, reverted)", "exposed_comm_rows_in_backward/result.json"),
             ("colour and density tables, after the backward (`cb04df2`, reverted)",
              "exposed_comm_rows_density/result.json")]
    out = header("rows exchanged", "variant", "repeat", "exposed share, rank 0 / rank 1", "step ms (median, mean of ranks)",
                 "test PSNR dB")
    medians = {}
    for label, path in files:
        d = res.json(path)
        for r in d["runs"]:
            out.append(row(label, r["compression"], r["repeat"], " / ".join(pct(x["exposed_share"]) for x in r["ranks"]),
                           f"{r['step_ms_median_mean']:.1f}", f2(r["psnr"])))
        medians[label] = d["medians"]
    out += [""]
    for label, m in medians.items():
        dense, rows = m["none"], m["sparse_tables"]
        out.append(f"- Rows exchanged {label}: exposed **{pct(dense['exposed_share_mean'])} -> "
                   f"{pct(rows['exposed_share_mean'])}** (target <= 10%: "
                   f"**{'met' if rows['exposed_share_mean'] <= 0.10 else 'missed'}**), step "
                   f"{dense['step_ms_median_mean']:.1f} -> {rows['step_ms_median_mean']:.1f} ms, test PSNR "
                   f"{f2(dense['psnr'])} -> {f2(rows['psnr'])} dB (medians of the repeats).")
    return out


def study_capacity_1m(res: Results) -> list[str]:
    """The earlier capacity study at 1 M parameters per rank (conf/study/capacity_1m.yaml)."""
    return study_capacity(res, "study_capacity_1m")


def per_rank_batch(res: Results) -> list[str]:
    """bench/scaling/per_rank_batch.py: lego under ``ddp`` at W ranks with the per-rank batch default (the global
    batch W x ``train.rays_per_rank``), equal steps; the learning rate unchanged ("same"), x sqrt(W) ("sqrt"), or at
    W = 1 x a scale ("x<scale>": the control telling a larger rate's gain from the larger batch's)."""
    data = res.json("per_rank_batch/result.json")
    runs = data["runs"] + res.json("per_rank_batch/controls.json")["runs"]
    base = next(r["psnr"] for r in runs if r["world_size"] == 1 and r["rule"] == "same")
    views = data["settings"]["eval_views"]
    out = header("W", "lr rule", "lr", "rays per rank", "global batch", "steps", f"test PSNR dB ({views} views)", "SSIM",
                 "vs W = 1", "within 0.3 dB of W = 1 or better", "last training loss")
    order = {"same": 0, "sqrt": 1}
    for r in sorted(runs, key=lambda r: (order.get(r["rule"], 2), r["world_size"], r["lr"])):
        diff = r["psnr"] - base
        rule = {"same": "same as W = 1", "sqrt": "x sqrt(W)"}.get(r["rule"], f"x {r['rule'][1:]} (control)")
        target = "–" if r["world_size"] == 1 else ("met" if diff >= -0.3 else "missed")
        out.append(row(r["world_size"], rule, f"{r['lr']:.3g}", r["rays_per_rank"], r["global_rays"], r["steps"],
                       f2(r["psnr"]), f"{r['ssim']:.4f}", f"{diff:+.2f} dB", target, f"{r['final_train_loss']:.5f}"))
    return out


TABLES = {  # marker name -> the function that makes the table
    "study_capacity": study_capacity,
    "study_capacity_decay1500": study_capacity_decay1500,
    "study_capacity_tv": study_capacity_tv,
    "study_capacity_cubic_tv": study_capacity_cubic_tv,
    "study_capacity_tv_probe": study_capacity_tv_probe,
    "study_capacity_stretch": study_capacity_stretch,
    "study_capacity_schedule": study_capacity_schedule,
    "study_capacity_seams": study_capacity_seams,
    "study_capacity_lego": study_capacity_lego,
    "study_capacity_1m": study_capacity_1m,
    "study_capacity_plateau": study_capacity_plateau,
    "study_capacity_batch": study_capacity_batch,
    "study_capacity_cooled": study_capacity_cooled,
    "study_capacity_cooled_seams": lambda res: study_capacity_seams(res, "study_capacity_cooled"),
    "study_capacity_cooled_p62k": study_capacity_cooled_p62k,
    "study_capacity_cooled_p62k_seams": lambda res: study_capacity_seams(res, "study_capacity_cooled_p62k"),
    "study_capacity_cooled_p62k_control": study_capacity_cooled_p62k_control,
    "study_capacity_cooled_p62k_control_batch": study_capacity_cooled_p62k_control_batch,
    "study_aerial_sharded_touched": study_aerial_sharded_touched,
    "study_aerial": study_aerial,
    "study_aerial_curve": study_aerial_curve,
    "study_aerial_sharded": study_aerial_sharded,
    "exchange_crossover": exchange_crossover,
    "joint_exchange": joint_exchange,
    "occupancy_merge": occupancy_merge,
    "exposed_comm": exposed_comm,
    "exposed_comm_rows": exposed_comm_rows,
    "study_characterization": study_characterization,
    "per_rank_batch": per_rank_batch,
    "ss_eq": ss_eq,
    "ss_eq_detail": ss_eq_detail,
    "ddp_sparse_decision": ddp_sparse_decision,
    "ddp_sparse_bounded": ddp_sparse_bounded,
    "city_capacity": city_capacity,
    "city_unbounded": city_unbounded,
    "city_balance": city_balance,
    "city_small_regions": regions_series,
}
