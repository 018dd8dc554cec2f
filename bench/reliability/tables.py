"""The tables of ``bench/reliability/README.md``, made from ``bench/*/results`` JSON (run ``python -m bench.tables``)."""
from __future__ import annotations

import statistics

from bench.tablekit import Results, row, header


def exits(res: Results) -> list[str]:
    """bench/reliability/exits.py: consecutive 2-rank torchrun smoke runs, exit status and restarts."""
    d = res.json("exits/exits.json")
    walls = sorted(r["wall_s"] for r in d["runs"])
    out = header("runs", "exit 0, no restart (clean)", "non-zero exits", "restarted by torchrun", "abort text seen",
                 "wall per run (median)")
    out.append(row(d["num_runs"], f"**{d['clean_runs']}**", d["nonzero_exits"], d["restarted_runs"],
                   sum(bool(r["aborts"]) for r in d["runs"]), f"{statistics.median(walls):.0f} s"))
    ok = d["clean_runs"] == d["num_runs"] and d["num_runs"] >= 30
    return out + ["", f"Target (30 consecutive clean runs): **{'met' if ok else 'missed'}**."]


def soak(res: Results) -> list[str]:
    """bench/reliability/soak.py: what could leak over a long 2-rank run, after the warm-up."""
    d = res.json("soak/soak.json")
    summ = d["summary"]
    names = {"rank_rss_mb": ("trainer RSS, both ranks", "MB"), "worker_rss_mb": ("sampler workers' RSS, all", "MB"),
             "agent_rss_mb": ("torchrun agent RSS", "MB"), "rank_fds": ("trainer open fds, both ranks", ""),
             "worker_fds": ("workers' open fds, all", ""), "shm_files": ("/dev/shm files", ""),
             "run_dir_mb": ("run directory", "MB")}
    out = header("series", "first", "last", "range", "change per 1,000 steps")
    for key, (label, unit) in names.items():
        v = summ[key]
        fmt = (lambda x: f"{x:.1f}") if unit else (lambda x: f"{x:.0f}")
        out.append(row(label + (f" ({unit})" if unit else ""), fmt(v["first"]), fmt(v["last"]),
                       f"{fmt(v['min'])}..{fmt(v['max'])}", f"{v['slope_per_1000_steps']:+.3f}"))
    kept = d["checkpoints_kept"]
    return out + ["", f"{d['steps']} steps (rc {d['rc']}, last logged step {d['last_step']}), a checkpoint every "
                      f"{d['ckpt_every']} steps ({len(kept)} kept at the end), sampled every {d['interval_s']:.0f} s; "
                      f"the series above are after step {d['warmup_steps']}, while every rank and worker ran. "
                      f"/dev/shm files before/after the run: {d['shm_files_before']}/{d['shm_files_after']}."]


def shared_cores(res: Results) -> list[str]:
    """bench/reliability/shared_cores.py: the README main job's training rays/s alone and beside one
    CPU-bound process, per thread setting, and the trainer's CPU seconds per step. A result with a
    ``headline`` is the warmed-up, interleaved and repeated runner's (:func:`_shared_cores_repeats`); one
    without, the 8-s phases pooled over two rounds of an earlier runner (:func:`_shared_cores_pooled`)."""
    d = res.json("shared_cores/shared_cores.json")
    out = _shared_cores_repeats(d) if "headline" in d else _shared_cores_pooled(d)
    m = d["meta"]
    return out + ["", f"{m['cpu_count']} cores; `uptime` before: {m['uptime_before']}; after: {m['uptime_after']}."]


def _spread(x: dict) -> str:
    """A median with its spread over the repeats: ``1.32x (1.20-1.41)``."""
    return f"{x['median']:.2f}x ({x['min']:.2f}-{x['max']:.2f})"


def _shared_cores_repeats(d: dict) -> list[str]:
    """Medians over the repeats, each slow-down with its min-max; the headline and the method below."""
    out = header("variant", "threads", "OpenMP wait", "rays/s alone", "beside nice'd", "beside un-niced",
                 "slower beside nice'd", "slower beside un-niced", "trainer CPU s per step", "load (1 min)")
    for s in d["summary"]:
        out.append(row(s["variant"], s["torch_threads"], d["children"][s["variant"]]["omp_wait"],
                       s["rays_per_s_alone"], s["rays_per_s_nice"], s["rays_per_s_plain"], _spread(s["slowdown_nice"]),
                       _spread(s["slowdown_plain"]), f"{s['cpu_s_per_step']:.2f}", f"{s['load_1min']:.1f}"))
    top, warm, cfg = d["headline"], d["warmup"], d["settings"]
    steps = [c["resumed_step"] for c in d["children"].values()]
    final = warm["final_stage_step"]
    short = "" if final is None or warm["steps"] > final else " **(not past the final stage: taken during the climb)**"
    return out + ["", f"Headline: `{top['variant']}` **{top['median']:.2f}x** slower beside the un-niced competitor "
                      f"(median of {top['n']} repeats; {top['min']:.2f}-{top['max']:.2f}), {_spread(top['nice'])} "
                      f"beside the nice'd one. Rays/s: medians over the repeats; a slow-down: each repeat's alone / "
                      f"beside, their median (min-max).",
                  "", f"Method: one warm-up of {warm['steps']} steps from step 0 (grid resolution {warm['resolution']}"
                      f"; the final stage from step {final}){short} in {warm['seconds']:.0f} s, rays/s "
                      f"of its last windows {', '.join(str(w['rays_per_s']) for w in warm['windows'][-3:])}; every "
                      f"variant resumed from its checkpoint (step {min(steps)}), settled {cfg['settle_steps']} steps; "
                      f"then {cfg['repeats']} repeats, the variants interleaved in each, three phases of "
                      f"{cfg['seconds']:g} s a visit (alone, beside nice'd, beside un-niced, rotated)."]


def _shared_cores_pooled(d: dict) -> list[str]:
    """The earlier runner's result: each variant's phases pooled (steps over seconds), trained from step 3."""
    waits = {"passive": "passive", "planned": "passive", "threads1": "none (one thread)", "spin30k": "30,000 spins", "spin3k": "3,000 spins"}
    out = header("variant", "threads", "OpenMP wait", "rays/s alone", "beside nice'd", "beside un-niced",
                 "slower beside nice'd / un-niced", "trainer CPU s per step", "load (1 min)")
    for s in d["summary"]:
        out.append(row(s["variant"], s["torch_threads"], waits.get(s["variant"], "spin (default)"),
                       s["rays_per_s_alone"], s["rays_per_s_nice"], s["rays_per_s_plain"],
                       f"{s['slowdown_nice']:.2f}x / {s['slowdown_plain']:.2f}x", f"{s['cpu_s_per_step']:.2f}",
                       f"{s['load_1min']:.1f}"))
    return out


TABLES = {  # marker name -> the function that makes the table
    "exits": exits,
    "soak": soak,
    "shared_cores": shared_cores,
}
