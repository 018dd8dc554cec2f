"""The GPU check's ``sweep`` section (issue 49 item 8): training throughput at lego's final grid stage for the
eager, compiled and graphed static step over sample budgets, bf16 in the sweep only.

    python -m bench.gpu.sweep --mode cuda --data LEGO --seconds 150 --runs RUNS   # inside tools/gpu_check.sh
    python -m bench.gpu.sweep --mode cpu --seconds 60 --runs RUNS                 # --cpu: the built-in scene, eager and graph

Every configuration builds the real :class:`~distnerf.engine.trainer.Trainer` of one process at the final stage
(``model.resolutions=[160] model.upsample_steps=[]``: lego's last grid, no upsampling), ``sampler=device`` on CUDA,
``train.samples_per_step=P`` (the static step's sample budget) and ``train.rays_per_rank`` above what P holds (4 x
P / 64 rays: the budget, not the batch, sets the work), then runs ``--warmup`` steps (compilation and CUDA-graph
recording happen there) and times ``--steps`` steps of ``Trainer.fit``'s step (no logging, evaluation or
checkpoints) between two device synchronisations. Modes: ``eager``; ``graph`` (``train.cuda_graph=true``: the
whole step, forward to optimizer, recorded by hand as one CUDA graph per grid stage and replayed,
:mod:`distnerf.components.graphed_step`; ``--cpu``: its body uncaptured); ``compiled`` (``model.compile=true``:
the render compiled with ``fullgraph=True`` and the optimizer on its own, inductor); ``graphed`` (the same with
``model.compile_mode=reduce-overhead``: both replayed as CUDA graphs by torch.compile). Per configuration: rays/s and samples/s
(the budget's own figures: rays it rendered, samples it marched), samples per ray, step ms, the warm-up's seconds,
the budget's fill and overflow rate, the peak device memory; ``failed: ...`` with the error where one fails (the
others go on). Configurations run in priority order until ``--seconds`` are spent (the rest: ``skipped: time``).
Writes the section's JSON through :func:`bench.gpu.check.write` (``$GC_SECT/sweep.json``) or ``--out``.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
import traceback
from pathlib import Path

import torch

CUDA_PLAN = [  # (mode, log2 P, bf16), priority order: the default budget first, then the extremes
    ("eager", 18, False), ("graph", 18, False), ("compiled", 18, False), ("graphed", 18, False),
    ("graph", 20, False), ("eager", 20, False), ("graphed", 20, False), ("eager", 16, False), ("graph", 16, False),
    ("graph", 18, True), ("eager", 18, True), ("compiled", 20, False)]
COMMON = ["train.ckpt_every=-1", "eval.enabled=false", "train.progress=false", "logger.wandb.mode=disabled",
          "profiler.telemetry=false", "train.max_steps=100000", "train.global_rays=null"]
CPU_PLAN = [("eager", 10, False), ("eager", 12, False), ("graph", 10, False), ("compiled", 10, False),
            ("graphed", 10, False)]


def overrides(mode: str, log2_slots: int, bf16: bool, device: str, data: list[str]) -> list[str]:
    """The training config of one configuration (module docstring; the CPU's check: a 32^3 grid)."""
    slots = 1 << log2_slots
    final = 160 if device == "cuda" else 32
    out = [*data, f"device={device}", "model=grid", f"model.resolutions=[{final}]", "model.upsample_steps=[]",
           f"train.samples_per_step={slots}", f"train.rays_per_rank={max(256, 4 * slots // 64)}",
           "sampler=device" if device == "cuda" else "sampler=sync", f"train.bf16={str(bf16).lower()}"]
    if mode == "graph":  # the whole step as one hand-recorded CUDA graph (the CPU: its body uncaptured)
        out.append("train.cuda_graph=true")
    elif mode != "eager":
        out.append("model.compile=true")
    if mode == "graphed":
        out.append("model.compile_mode=reduce-overhead")
    return out


def measure(mode: str, log2_slots: int, bf16: bool, device: str, data: list[str], warmup: int, steps: int,
            tmp: Path) -> dict:
    """One configuration's figures (module docstring)."""
    from bench.throughput.syncs import build_trainer, run_step
    from distnerf import dist as D

    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = overrides(mode, log2_slots, bf16, device, data)
    name = f"{mode}_p{log2_slots}{'_bf16' if bf16 else ''}"
    trainer, env = build_trainer(cfg, tmp / name, device=device, common=COMMON)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    try:
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(warmup):
            run_step(trainer)
        sync()
        warm = time.perf_counter() - t0
        budget = trainer.step_fn.budget
        rays = samples = 0
        t0 = time.perf_counter()
        for _ in range(steps):
            run_step(trainer)
            m = trainer.step_fn.budget_metrics()  # the previous step's (a host buffer, a step late)
            rays += m.get("budget_counted_rays", 0)  # rendered whole (overflowed rays wait for a later step)
            samples += min(m.get("budget_samples_per_ray", 0) * m.get("budget_active_rays", 0), budget.capacity)
        sync()
        seconds = time.perf_counter() - t0
        metrics = trainer.step_fn.budget_metrics()
        return {"status": "ok", "mode": mode, "samples_per_step": 1 << log2_slots, "bf16": bf16,
                "overrides": cfg, "warmup_steps": warmup, "warmup_s": round(warm, 2), "steps": steps,
                "step_ms": round(1e3 * seconds / steps, 3), "rays_per_s": rays / seconds if rays else None,
                "samples_per_s": samples / seconds if samples else None,
                "samples_per_ray": samples / rays if rays else None,
                "budget_fill": metrics.get("budget_fill"), "budget_overflow_rate": metrics.get("budget_overflow_rate"),
                "static": budget is not None,
                "peak_memory_mb": torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None}
    finally:
        trainer.close()
        D.shutdown(env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["cuda", "cpu"], required=True)
    ap.add_argument("--data", default=None, help="lego's folder (cuda); the built-in scene without it")
    ap.add_argument("--seconds", type=float, default=150.0, help="stop starting configurations after this")
    ap.add_argument("--warmup", type=int, default=None, help="steps before timing (default cuda 12, cpu 2)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default cuda 30, cpu 3)")
    ap.add_argument("--runs", type=Path, default=None, help="run directories (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=None, help="write here instead of $GC_SECT/sweep.json")
    args = ap.parse_args()
    cuda = args.mode == "cuda"
    plan = CUDA_PLAN if cuda else CPU_PLAN
    data = [f"dataset=blender", f"dataset.root={args.data}"] if args.data else ["experiment=smoke"]
    warmup = args.warmup if args.warmup is not None else (12 if cuda else 2)
    steps = args.steps if args.steps is not None else (30 if cuda else 3)
    deadline = time.monotonic() + args.seconds
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = args.runs or Path(tmp)
        for mode, log2_slots, bf16 in plan:
            row = {"mode": mode, "samples_per_step": 1 << log2_slots, "bf16": bf16}
            if not cuda and mode not in ("eager", "graph"):
                row["status"] = "skipped: needs CUDA (compiled and graphed steps are the GPU's; the CPU compile is " \
                                "tested in tests/unit/test_static_step.py)"
            elif time.monotonic() > deadline:
                row["status"] = f"skipped: time (the section's {args.seconds:g} s spent)"
            else:
                try:
                    row = measure(mode, log2_slots, bf16, "cuda" if cuda else "cpu", data, warmup, steps, root)
                except Exception as err:  # one failure must not hide the other configurations
                    row["status"] = f"failed: {type(err).__name__}: {err}"[:500]
                    row["traceback"] = traceback.format_exc()[-3000:]
            rows.append(row)
            print(json.dumps({k: row.get(k) for k in ("mode", "samples_per_step", "bf16", "status", "rays_per_s",
                                                      "samples_per_s", "step_ms", "warmup_s")}), flush=True)
            save(rows, data, len(plan), args.out)  # after every configuration: a kill keeps what ran


def save(rows: list[dict], data: list[str], planned: int, out: Path | None) -> None:
    """The section's JSON so far (``status`` ok once one configuration ran)."""
    ok = [r for r in rows if r["status"] == "ok"]
    body = {"status": "ok" if ok else "failed: no configuration ran", "data": data, "configs": rows,
            "planned": planned, "best_rays_per_s": max((r["rays_per_s"] or 0 for r in ok), default=None)}
    if out is not None:
        out.write_text(json.dumps(body, indent=1, default=str))
    else:
        from bench.gpu.check import write

        write("sweep", body)


if __name__ == "__main__":
    main()
