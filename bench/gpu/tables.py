"""The tables of ``bench/gpu/README.md``, made from ``bench/*/results`` JSON (run ``python -m bench.tables``)."""
from __future__ import annotations

import re

from bench.tablekit import Results, kilo, pct, row, header


def gpu_check(res: Results) -> list[str]:
    """tools/gpu_check.sh on a lent H200 (issue 26): one full run and two runs of selected sections."""
    full = res.json("gpu_check_h200/run3/summary.json")
    paths4 = res.json("gpu_check_h200/run4/summary.json")["sections"]
    sync5 = res.json("gpu_check_h200/run5/summary.json")["sections"]
    env = full["sections"]["env"]
    out = [f"{env['gpu']} (compute capability {env['capability']}), torch {env['torch']}, CUDA {env['cuda']}, "
           f"NCCL {env['nccl']}, driver {env['nvidia_smi'].split(', ')[1]}; "
           f"`cuda_tests`: {full['sections']['cuda_tests']['passed']} passed, "
           f"{full['sections']['cuda_tests']['failed']} failed, {full['sections']['cuda_tests']['skipped']} skipped.", ""]
    out += header("run (lego, 1 process, torchrun, NCCL)", "status", "step median", "rays/s", "copy to device",
                  "forward", "backward", "PSNR (steps)", "peak device memory", "eval rays/s")
    for name, label in (("ddp_trace", "ddp, 4096 rays, profiler=trace"), ("ss_trace", "ss, 2 regions, profiler=trace")):
        d = full["sections"][name]
        out.append(row(label, d["status"], f"{d['step_ms_median']:.1f} ms", kilo(d["global_rays_per_s"]),
                       pct(d["shares"]["copy"]), pct(d["shares"]["forward"]), pct(d["shares"]["backward"]),
                       f"- ({d['steps']} timed)", "-", "-"))
    runs = {**full["sections"]["paths"]["runs"], **paths4["paths"]["runs"]}
    runs = {k: v for k, v in runs.items() if v["status"] == "ok"}
    for name, d in runs.items():
        mem = f"{d['peak_device_memory_mb']:.0f} MB" if d.get("peak_device_memory_mb") is not None else "-"
        out.append(row(d["what"], d["status"], "-", kilo(d["rays_per_s_median"]), "-", "-", "-",
                       f"{d['psnr']:.2f} ({d['steps']})", mem, kilo(d["eval_rays_per_s"])))
    q = full["sections"]["lego_quality"]
    log = res.path("gpu_check_h200/run3/log.txt").read_text()
    stopped = re.search(r"training stopped at step (\d+) \(time_budget\) after ([\d.]+) s", log)
    reached = (f"training stopped at step {stopped.group(1)} after {stopped.group(2)} s" if stopped
               else "no training line in the log")
    out += ["", "Paths rows: 30 steps, evaluated on 1 test view (an untrained model: PSNR shows it ran, not quality).",
            "", f"`lego_quality` (README lego line, `train.max_minutes=2`, 200 test views): **{q['status']}** after "
            f"{q['seconds']:.0f} s: {reached}; evaluating the 200 views did not end inside the section's 240 s "
            f"(the section now evaluates 25 views).", ""]
    out += header("model (lego, 1 process)", "sync warnings per step (median of steps 3-11)", "where, over 12 steps")
    for model, d in {**paths4["sync_debug"]["models"], **sync5["sync_debug"]["models"]}.items():
        where = ", ".join(f"`{k}` {v}" for k, v in d["by_location"].get("steps", {}).items())
        out.append(row(model, d["per_step_median"], where))
    return out


TABLES = {  # marker name -> the function that makes the table
    "gpu_check": gpu_check,
}
