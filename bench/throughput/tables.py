"""The tables of ``bench/throughput/README.md``, made from ``bench/*/results`` JSON (run ``python -m bench.tables``)."""
from __future__ import annotations

from bench.tablekit import Results, f2, kilo, row, header


def engine_eval(res: Results) -> list[str]:
    """bench/throughput/engine.py eval/exact/old: one checkpoint rendered by both engines."""
    d = res.json("lego_1p/bench_engine.json")
    out = header("renderer", "s / view (median)", "rays/s (median)", f"test PSNR / SSIM ({d['new']['views']} views)",
                 "samples per ray: marched / density / coloured")
    labels = {"new": "packed engine (default termination and colour threshold)",
              "exact": "packed engine, termination and colour threshold 0",
              "old": f"padded engine of `{d['baseline']}`, same checkpoint"}
    for k in ("new", "exact", "old"):
        x = d[k]
        samples = (f"{x['num_samples']:.1f} / {x['num_density_samples']:.1f} / {x['num_colour_samples']:.1f}"
                   if "num_density_samples" in x else f"{x['num_samples']:.1f} evaluated (padded layout)")
        out.append(row(labels[k], f2(x["seconds_median"]), kilo(x["rays_per_s_median"]),
                       f"{x['psnr']:.3f} / {x['ssim']:.4f}", samples))
    new = d["new"]
    out += ["",
            f"- Target one view <= 2 s (>= 80k rays/s): **{'met' if new['seconds_median'] <= 2 else 'missed'}**, "
            f"{f2(new['seconds_median'])} s ({kilo(new['rays_per_s_median'])} rays/s).",
            f"- PSNR with the thresholds minus without: **{d['psnr_new_minus_exact']:+.4f} dB** "
            f"(target: within 0.05 dB: **{'met' if abs(d['psnr_new_minus_exact']) <= 0.05 else 'missed'}**).",
            f"- The padded engine takes **{d['old_over_new_seconds_same_views']:.2f}x** the packed engine's time "
            f"per view on the same views."]
    return out


def engine_train(res: Results) -> list[str]:
    """bench/throughput/engine.py train: rays/s of both engines at each grid stage."""
    d = res.json("lego_1p/bench_engine.json")
    out = header("grid", "packed engine rays/s", f"padded engine (`{d['baseline']}`) rays/s", "packed / padded")
    for n, x in sorted(d["train"].items(), key=lambda kv: int(kv[0])):
        out.append(row(f"{n}^3", kilo(x["new"]["rays_per_s"]), kilo(x["old"]["rays_per_s"]),
                       f"{x['new_over_old']:.2f}x"))
    return out


def engine_step(res: Results) -> list[str]:
    """bench/throughput/engine.py train (+ eval) of this engine against an earlier commit's, medians of repeated worker pairs."""
    d = res.json("engine_step/bench_engine_step.json")
    base = d["baseline"]
    this = d.get("meta", {}).get("git_commit", "this commit")
    out = header("grid", f"`{this}` rays/s (median)", f"`{base}` rays/s (median)", "ratio", f"runs: `{this}` / baseline")
    for n, x in sorted(d["train"].items(), key=lambda kv: int(kv[0])):
        runs = " / ".join(", ".join(kilo(r["rays_per_s"]) for r in x["runs"][k]) for k in ("new", "old"))
        out.append(row(f"{n}^3", kilo(x["rays_per_s_median"]["new"]), kilo(x["rays_per_s_median"]["old"]),
                       f"{x['new_over_old']:.2f}x", runs))
    top = d["train"]["160"]["new_over_old"]
    out += ["", f"- Target >= 1.5x training rays/s at 160^3: **{'met' if top >= 1.5 else 'missed'}** ({top:.2f}x)."]
    if "new" in d and "old" in d:
        out.append(f"- Evaluation of the same checkpoint ({d['new']['views']} test views, 400x400): "
                   f"{f2(d['new']['seconds_median'])} s per view against {f2(d['old']['seconds_median'])} s "
                   f"(`{base}`), {d['old_over_new_seconds_same_views']:.2f}x; PSNR with the thresholds minus "
                   f"without {d['psnr_new_minus_exact']:+.3f} dB.")
    return out


def viewer(res: Results) -> list[str]:
    """bench/throughput/viewer.py: training with the live viewer off / on with one client, and frame time."""
    out = header("engine", "viewer", "runs", "training rays/s (loop wall, median)", "per-step rays/s (median)",
                 "frames pushed", "render share of the loop", "chromium CPU s (reniced)", "slower than off")
    lines = [""]
    for name, label in (("viewer/live_full_frames.json", "full-size live frames (before)"),
                        ("viewer/live.json", "live frames capped at 0.5 s"),
                        ("viewer/live_remote.json", "browser in a cgroup capped at {client_cpu} core (a remote client), "
                                                    "max_render_share {share}"),
                        ("viewer/live_local.json", "browser on this machine (reniced), max_render_share {share}")):
        if not res.locate(name).is_file():
            continue
        d = res.json(name)
        share_used = d["summary"].get("max_render_share") or next(
            (r["max_render_share"] for r in d["rows"] if "max_render_share" in r), None)
        label = label.format(client_cpu=d["summary"].get("client_cpu"), share=share_used)
        for key, cell in (("off", "off"), ("on", "on, one client")):
            sm = d["summary"][key]
            runs = [r for r in d["rows"] if r["viewer"] == (key == "on")]
            frames = " / ".join(str(r["frames"]) for r in runs) if key == "on" else "-"
            share = " / ".join(f"{r['render_share_pct']:.1f}%" for r in runs) if key == "on" else "-"
            cpu = " / ".join(f"{r['chromium_cpu_s']:.0f}" for r in runs) if key == "on" else "-"
            slower = f"**{d['summary']['slowdown_pct']:.1f}%**" if key == "on" else ""
            out.append(row(label, cell, sm["n"], f"{sm['loop_rays_per_s_median']:.0f}",
                           f"{sm['step_rays_per_s_median']:.0f}", frames, share, cpu, slower))
        if name == "viewer/live.json":
            lines.append(f"Browser on this machine, max_render_share 0.15 (the default then): target (training "
                         f"<= 10% slower with one client) **{'met' if d['summary']['slowdown_pct'] <= 10 else 'missed'}** "
                         f"({d['summary']['slowdown_pct']:.1f}%).")
        if name == "viewer/live_local.json":
            lines.append(f"Browser on this machine (sharing the 2 cores with training), max_render_share {share_used}: "
                         f"target (training <= 10% slower with one client) "
                         f"**{'met' if d['summary']['slowdown_pct'] <= 10 else 'missed'}** "
                         f"({d['summary']['slowdown_pct']:.1f}%).")
        if name == "viewer/live_remote.json":
            lines.append(f"Browser standing for a remote one (its CPU capped), max_render_share {share_used}: target "
                         f"(training <= 10% slower with one client) "
                         f"**{'met' if d['summary']['slowdown_pct'] <= 10 else 'missed'}** "
                         f"({d['summary']['slowdown_pct']:.1f}%).")
    if res.locate("viewer/frame.json").is_file():
        f = res.json("viewer/frame.json")
        fm = f.get("meta", {})
        at = f"`{fm.get('git_commit', '?')}`" + (", written on a dirty tree" if fm.get("git_dirty") else "")
        lines.append(f"Still frame {f['size']}x{f['size']} of `{f['run_dir']}` (step {f['step']}), at {at} "
                     f"(history, not re-measured): {f['seconds_median']:.2f} s median of {f['frames']} "
                     f"({f['rays_per_s_median']:,.0f} rays/s).")
    return out + lines


def syncs(res: Results) -> list[str]:
    """bench/throughput/syncs.py: host syncs of one training step, at each label (before and after issue 14,
    then each later label in the file's order)."""
    d = res.json("syncs/syncs.json")
    labels = [k for k in d if k != "meta"]

    def at(k: str) -> str:  # the label's commit, and whether its tree had local changes (history, not re-measured)
        meta = d[k]["meta"]
        return meta.get("git_commit", "?") + (", dirty tree" if meta.get("git_dirty") else "")

    out = header("configuration (smoke, 1 process)", *(f"{k} ({at(k)}): total (model + trainer)" for k in labels),
                 "occupancy-refresh step, " + " -> ".join(labels))
    names = list(dict.fromkeys(n for k in labels for n in d[k]["configs"]))  # every label's, in first-seen order
    for name in names:
        cells, refresh = [], []
        for k in labels:
            c = d[k]["configs"].get(name)
            cells.append(f"{c['count_step']['total']} ({c['count_step']['model']} + {c['count_step']['trainer']})"
                         if c else "-")
            refresh.append(str(c["refresh_step"]["total"]) if c and c.get("refresh_step") else "-")
        out.append(row(name, *cells, " -> ".join(refresh) if any(r != "-" for r in refresh) else "-"))
    return out


def timing_overhead(res: Results) -> list[str]:
    """bench/throughput/profile.py overhead, before (3512202) and after issue 14's timing changes."""
    out = header("tree", "in-process cost of one step's timing (us; on - off)", "end-to-end step, off / default (ms)",
                 "ratio on/off (run-to-run spread is several %)")
    for label, rel in (("before (3512202)", "timing_overhead/before_3512202.json"), ("after", "timing_overhead/after.json")):
        d = res.json(rel)
        out.append(row(label, f"{d['in_process_cost_us']:.1f}",
                       f"{1e3 * d['median_step_s']['off']:.1f} / {1e3 * d['median_step_s']['default']:.1f}",
                       f"{d['ratio_on_off']:.3f}"))
    return out


def colour_head(res: Results) -> list[str]:
    """bench/throughput/colour_head.py: the grid model's colour head alone, forward + backward, per head."""
    d = res.json("colour_head/colour_head.json")
    base = d["rows"][0]
    out = header("head (`model.color`, `model.viewdir_encoding`)", "feature channels C", "colour network parameters",
                 f"ms per {d['points']:,} points (median of {d['repeats']})", "points/s (median)",
                 f"time / {base['config']}'s")
    for r in d["rows"]:
        out.append(row(r["config"], r["feature_channels"], f"{r['colour_net_params']:,}", f"{r['ms_median']:.1f}",
                       kilo(r["points_per_s_median"]), f"{r['ms_median'] / base['ms_median']:.2f}x"))
    return out


def cpu_paths(res: Results) -> list[str]:
    """bench/throughput/cpu_paths.py: the real trainer's step on lego at 160^3 for each step path."""
    d = res.json("cpu_paths/cpu_paths.json")
    paths = d["paths"]
    out = header("step path", "ms / step (median block)", "rays/s (median block)", "/ the CPU default",
                 "samples per ray", "blocks: ms / step", "warm-up s (compilation)")
    for label, r in paths.items():
        if "failed" in r:
            out.append(row(label, f"failed (exit {r['failed']})", "-", "-", "-", "-", "-"))
            continue
        blocks = ", ".join(f"{b['step_ms']:.0f}" for b in r["runs"])
        out.append(row(label, f"{r['step_ms_median']:.1f}", kilo(r["rays_per_s_median"]),
                       f"{r.get('rays_per_s_over_default', 1.0):.2f}x", f"{r['samples_per_ray']:.1f}", blocks,
                       f"{r['warmup_s']:.1f}"))
    ok = {k: r for k, r in paths.items() if "failed" not in r}
    default = next(iter(paths))
    best = max(ok, key=lambda k: ok[k]["rays_per_s_median"])
    compiled = [k for k in ok if "compiled" in k]
    fastest_block = min(b["step_ms"] for b in ok[default]["runs"])  # beyond the default's own spread
    faster = [k for k in compiled if ok[k]["step_ms_median"] < fastest_block]
    ratios = ", ".join(f"{k} {ok[k]['rays_per_s_over_default']:.2f}x" for k in compiled)
    verdict = "yes: " + ", ".join(faster) if faster else "no"
    out += ["", f"- Fastest median: {best}. A compiled path faster than the CPU default's fastest block "
                f"({fastest_block:.1f} ms): **{verdict}** ({ratios})."]
    return out


TABLES = {  # marker name -> the function that makes the table
    "engine_eval": engine_eval,
    "engine_train": engine_train,
    "engine_step": engine_step,
    "viewer": viewer,
    "syncs": syncs,
    "timing_overhead": timing_overhead,
    "colour_head": colour_head,
    "cpu_paths": cpu_paths,
}
