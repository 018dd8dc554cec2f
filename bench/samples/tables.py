"""The tables of ``bench/samples/README.md``, made from ``bench/*/results`` JSON (run ``python -m bench.tables``)."""
from __future__ import annotations

import statistics

from bench.tablekit import Results, psnr_ssim, row, header


MARCH_CELLS = (("before", "one pass (train_round_steps=0)", "0"), ("rounds", "rounds of 64", "0"),
               ("dist001", "rounds of 64", "0.01"), ("dist01", "rounds of 64", "0.1"),
               ("floor", "one pass, rays end at the floor (min_altitude=-0.5)", "0"),
               ("shellfloor", "one pass, floor, shell steps start at alpha_init (shell_alpha_init)", "0"),
               ("floorrand", "one pass, floor, random background per training ray", "0"),
               ("aerial", "one pass, floor, shell_alpha_init, random background", "0"),
               ("prune", "one pass, final-stage occupancy threshold 0.01", "0"),
               ("floorprune", "one pass, floor, final-stage occupancy threshold 0.01", "0"),
               ("floorprune03", "one pass, floor, final-stage occupancy threshold 0.03", "0"),
               ("footprintprune", "one pass, floor above the box's footprint only, final-stage threshold 0.01", "0"),
               ("opaquefloorprune", "one pass, opaque floor (colour field at the floor), final-stage threshold 0.01",
                "0"),
               ("opaquefloorprune02", "one pass, opaque floor, final-stage threshold 0.02", "0"),
               ("opaquefloorprune03", "one pass, opaque floor, final-stage threshold 0.03", "0"),
               ("floorprune_time", "floorprune for before's training seconds (train.max_minutes=11.18)", "0"))


def march(res: Results, name: str) -> list[str]:
    """bench/samples/march.sh: samples per ray and rays/s on the city at equal steps, per training march."""
    out = header("cell", "training march", "distortion loss weight", "samples per ray (density per ray), last 50 steps",
                 "rays/s, last 50 steps", "steps", "test PSNR / SSIM (views)")
    figures = {}
    for cell, marching, weight in MARCH_CELLS:
        if not res.locate(f"{name}/{cell}/metrics.json").is_file():
            continue  # a cell this invocation did not run
        m = res.json(f"{name}/{cell}/metrics.json")
        log = [r for r in res.jsonl(f"{name}/{cell}/metrics.jsonl") if "samples_per_ray" in r]
        tail = [r for r in log if r["step"] > m["step"] - 50]
        spr = statistics.median(r["samples_per_ray"] for r in tail)
        dpr = statistics.median(r["density_samples_per_ray"] for r in tail)
        rps = statistics.median(r["rays_per_s"] for r in tail)
        figures[cell] = (spr, rps, m["psnr"])
        out.append(row(cell, marching, weight, f"{spr:.0f} ({dpr:.0f})", f"{rps:.0f}", m["step"],
                       f"{psnr_ssim(m)} ({m['protocol']['num_views']})"))
    lines = [""]
    if "before" in figures:
        b = figures["before"]
        for cell, (spr, rps, psnr) in figures.items():
            if cell == "before":
                continue
            lines.append(f"- `{cell}` against `before`: samples per ray {spr:.0f} (target <= 64: "
                         f"**{'met' if spr <= 64 else 'missed'}**), rays/s x{rps / b[1]:.2f} (target >= 5x: "
                         f"**{'met' if rps >= 5 * b[1] else 'missed'}**), test PSNR {psnr - b[2]:+.2f} dB.")
    return out + lines


def march_ss(res: Results, names: dict[str, str], ranks: int = 2) -> list[str]:
    """bench/samples/march.sh under ``strategy=ss`` on ``ranks`` ranks (``names``: training -> results folder):
    per rank, samples per ray and rays/s (medians over the last 50 steps), against ``before`` at equal steps.
    A joint ray's samples are its segments' on all ranks (every rank renders its regions' segments of the same
    rays); an independent rank renders its own rays whole, so a ray costs one rank's figure (their mean)."""
    out = header("training", "cell", "samples per ray (rank 0, rank 1), last 50 steps",
                 "rays/s per rank (rank 0, rank 1)",
                 "steps", "test PSNR / SSIM (views)")
    lines = [""]
    for training, name in names.items():
        figures = {}
        for cell, marching, _ in MARCH_CELLS:
            if not res.locate(f"{name}/{cell}/metrics.json").is_file():
                continue
            m = res.json(f"{name}/{cell}/metrics.json")
            tail = [r for r in res.jsonl(f"{name}/{cell}/metrics.jsonl")
                    if "rank0/samples_per_ray" in r and r["step"] > m["step"] - 50]
            spr = [statistics.median(r[f"rank{k}/samples_per_ray"] for r in tail) for k in range(ranks)]
            rps = [statistics.median(r[f"rank{k}/rays_per_s"] for r in tail) for k in range(ranks)]
            per_ray = sum(spr) if training == "joint" else statistics.mean(spr)
            figures[cell] = (per_ray, statistics.mean(rps), m["psnr"])
            out.append(row(training, f"{cell}: {marching}", f"{per_ray:.0f} ({', '.join(f'{x:.0f}' for x in spr)})",
                           ", ".join(f"{x:.0f}" for x in rps), m["step"],
                           f"{psnr_ssim(m)} ({m['protocol']['num_views']})"))
        if "before" not in figures:
            continue
        b = figures["before"]
        for cell, (spr, rps, psnr) in figures.items():
            if cell != "before":
                lines.append(f"- {training} `{cell}` against `before`: samples per ray {spr:.0f} (target <= 64: "
                             f"**{'met' if spr <= 64 else 'missed'}**), rays/s per rank x{rps / b[1]:.2f}, test PSNR "
                             f"{psnr - b[2]:+.2f} dB (target: not lower: **{'met' if psnr >= b[2] else 'missed'}**).")
    return out + lines


TABLES = {  # marker name -> the function that makes the table
    "march_city_small": lambda res: march(res, "march_city_small"),
    "march_city_small_floor": lambda res: march(res, "march_city_small_floor"),
    "march_city_small_prune": lambda res: march(res, "march_city_small_prune"),
    "march_city_small_footprint": lambda res: march(res, "march_city_small_footprint"),
    "march_city_small_opaque": lambda res: march(res, "march_city_small_opaque"),
    "march_city_small_opaque_threshold": lambda res: march(res, "march_city_small_opaque_threshold"),
    "march_city_opaque": lambda res: march(res, "march_city_opaque"),
    "march_city_small_ss": lambda res: march_ss(res, {"independent": "march_city_small_ss_independent",
                                                      "joint": "march_city_small_ss_joint"}),
}
