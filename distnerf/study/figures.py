"""The study report's figures (matplotlib, PNG): one function per page of figures, drawn from
the tables of :func:`distnerf.study.report.build` (only those with data).
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from .collect import BREAKDOWN


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


