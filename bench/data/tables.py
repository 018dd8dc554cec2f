"""The tables of ``bench/data/README.md``, made from ``bench/*/results`` JSON (run ``python -m bench.tables``)."""
from __future__ import annotations

from bench.tablekit import Results, row, header, quality


def capture_import(res: Results) -> list[str]:
    """bench/data/imports.py: import time and peak memory of each format of the same scene."""
    d = res.json("import/bench_import.json")
    out = header("scene (train split)", "format", "images", "load s (median of %d)" % d["repeats"],
                 "peak memory of the load (MiB)", "vs Blender load")
    for case in d["cases"]:
        ref = case["blender"]
        for fmt in ("blender", "colmap", "nerfstudio"):
            m = case[fmt]
            out.append(row(case["scene"], fmt, m["images"], f"{m['seconds_median']:.3f}", f"{m['peak_mb_median']:.0f}",
                           "-" if fmt == "blender" else f"{m['seconds_median'] / max(ref['seconds_median'], 1e-9):.1f}x"))
    gens = [f"{c['scene']} generated in {c['generation_s']:.1f} s" for c in d["cases"] if "generation_s" in c]
    convs = [f"lego converted to {k[8:-2]} in {v:.1f} s" for c in d["cases"] for k, v in c.items()
             if k.startswith("convert_")]
    return out + ["", "; ".join(gens + convs) + " (each once, in the same invocation)."]


def city_small_quality(res: Results) -> list[str]:
    out = quality(res, "city_small_colmap_1p", "`dataset=colmap` (the city's COLMAP copy), default model")
    return out


TABLES = {  # marker name -> the function that makes the table
    "capture_import": capture_import,
    "city_small_quality": city_small_quality,
}
