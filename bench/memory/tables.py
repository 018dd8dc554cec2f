"""The tables of ``bench/memory/README.md``, made from ``bench/*/results`` JSON (run ``python -m bench.tables``)."""
from __future__ import annotations

from bench.tablekit import Results, f2, mega, row, header


def memory(res: Results) -> list[str]:
    """bench/throughput/engine.py --parts memory."""
    d = res.json("lego_1p/bench_engine_memory.json")
    out = header("`eval.chunk`", "peak RSS (VmHWM)", "RSS before rendering (scene + model)", "added by rendering",
                 "render time of the view")
    for chunk, x in sorted(d["memory"].items(), key=lambda kv: int(kv[0])):
        out.append(row(chunk, f"{x['peak_rss_mb']:.0f} MB", f"{x['rss_before_render_mb']:.0f} MB",
                       f"{x['peak_rss_mb'] - x['rss_before_render_mb']:.0f} MB", f"{f2(x['seconds'])} s"))
    return out


def eval_memory(res: Results) -> list[str]:
    """bench/memory/eval_memory.py: peak RSS of one evaluated view, model=nerf experiment=gpu."""
    d = res.json("eval_memory/eval_memory.json")
    out = header("view", "rays per chunk", "points per chunk (fine)", "`eval.point_chunk`", "peak RSS (VmHWM)")
    for r in d["runs"]:
        rss = f"{r['peak_rss_gb']:.2f} GiB" if "peak_rss_gb" in r else f"not run: {r['skipped']}"
        out.append(row(f"{r['resolution']}x{r['resolution']}", r["rays_per_chunk"], mega(r["points_per_chunk_fine"]),
                       r["point_chunk"] or "0 (no limit: before)", rss))
    return out


TABLES = {  # marker name -> the function that makes the table
    "memory": memory,
    "eval_memory": eval_memory,
}
