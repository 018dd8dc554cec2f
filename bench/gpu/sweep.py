"""The GPU check's ``sweep`` and ``sweep_more`` sections (issue 49 item 8): training throughput at lego's final grid
stage for the eager, hand-graphed, compiled and graphed static step over sample budgets, bf16 in the sweep only.

    python -m bench.gpu.sweep --mode cuda --data LEGO --part first --seconds 140 --runs RUNS   # section sweep
    python -m bench.gpu.sweep --mode cuda --data LEGO --part rest --section sweep_more --seconds 250 --runs RUNS
    python -m bench.gpu.sweep --mode cpu --part all --seconds 60 --runs RUNS   # the built-in scene, eager and graph

Each configuration runs in its own process (``--row``), under its own time limit (:data:`ROW_CAP_S`, at most what
the section has left): a device-side assert, a crash or a hang ends that process and fails that row only; the row
is written either way (``failed: ...`` with the exit status or signal and the tail of its log,
``RUNS/<row>.log``). In that process the real :class:`~distnerf.engine.trainer.Trainer` is built at the final
stage (``model.resolutions=[160] model.upsample_steps=[]``: lego's last grid, no upsampling), ``sampler=device``
on CUDA, ``step.samples_per_step=P`` (the static step's sample budget) and ``train.rays_per_rank`` above what P
holds (4 x P / 64 rays: the budget, not the batch, sets the work), then runs ``--warmup`` steps (compilation and
CUDA-graph recording happen there) and times ``--steps`` steps of ``Trainer.fit``'s step (no logging, evaluation
or checkpoints) between two device synchronisations. Modes: ``eager``; ``graph`` (``step.cuda_graph=true``: the
whole step, forward to optimizer, recorded by hand as one CUDA graph per grid stage and replayed,
:mod:`distnerf.components.graphed_step`; ``--cpu``: its body uncaptured); ``compiled`` (``model.compile=true``:
the render compiled with ``fullgraph=True`` and the optimizer on its own, inductor); ``graphed`` (the same with
``model.compile_mode=reduce-overhead``: both replayed as CUDA graphs by torch.compile). Per configuration: rays/s
and samples/s (the budget's own figures: rays it rendered, samples it marched), samples per ray, step ms, the
warm-up's seconds, the budget's fill and overflow rate, the peak device memory. Configurations run in priority
order (``--part first``: the first :data:`FIRST_ROWS`; ``rest``: the others) until ``--seconds`` are spent (the
rest: ``skipped: time``). Writes the section's JSON after every row through :func:`bench.gpu.check.write`
(``$GC_SECT/<--section>.json``) or to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

CUDA_PLAN = [  # (mode, log2 P, bf16), priority order: the default budget first, then the extremes
    ("eager", 18, False), ("graphed", 18, False), ("graph", 18, False), ("compiled", 18, False),
    ("graph", 20, False), ("eager", 20, False), ("graphed", 20, False), ("eager", 16, False), ("graph", 16, False),
    ("graph", 18, True), ("eager", 18, True), ("compiled", 20, False)]
CPU_PLAN = [("eager", 10, False), ("graphed", 10, False), ("graph", 10, False), ("eager", 12, False),
            ("compiled", 10, False)]
FIRST_ROWS = 3
"""The rows of section ``sweep`` (``--part first``); ``sweep_more`` takes the others."""
ROW_CAP_S = {"eager": 45, "graph": 60, "compiled": 120, "graphed": 120}
"""Seconds one configuration's process may take (start-up, warm-up with any compilation, timed steps)."""
MIN_ROW_S = 15
"""A row is started only with at least this many seconds of the section left."""
COMMON = ["checkpoints.every=-1", "eval.enabled=false", "monitor.progress=false", "logger.wandb.mode=disabled",
          "profiler.telemetry=false", "train.max_steps=100000", "train.global_rays=null", "monitor.log_every=1000000"]


def row_name(mode: str, log2_slots: int, bf16: bool) -> str:
    return f"{mode}_p{log2_slots}{'_bf16' if bf16 else ''}"


def overrides(mode: str, log2_slots: int, bf16: bool, device: str, data: list[str]) -> list[str]:
    """The training config of one configuration (module docstring; the CPU's check: a 32^3 grid)."""
    slots = 1 << log2_slots
    final = 160 if device == "cuda" else 32
    out = [*data, f"device={device}", "model=grid", f"model.resolutions=[{final}]", "model.upsample_steps=[]",
           f"step.samples_per_step={slots}", f"train.rays_per_rank={max(256, 4 * slots // 64)}",
           "sampler=device" if device == "cuda" else "sampler=sync", f"step.bf16={str(bf16).lower()}"]
    if mode == "graph":  # the whole step as one hand-recorded CUDA graph (the CPU: its body uncaptured)
        out.append("step.cuda_graph=true")
    elif mode != "eager":
        out.append("model.compile=true")
    if mode == "graphed":
        out.append("model.compile_mode=reduce-overhead")
    return out


def measure(mode: str, log2_slots: int, bf16: bool, device: str, data: list[str], warmup: int, steps: int,
            tmp: Path) -> dict:
    """One configuration's figures (module docstring)."""
    import torch

    from bench.throughput.syncs import build_trainer, run_step
    from distnerf import distributed as D

    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = overrides(mode, log2_slots, bf16, device, data)
    name = row_name(mode, log2_slots, bf16)
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
        budget = trainer.train_step.budget
        rays = samples = 0
        t0 = time.perf_counter()
        for _ in range(steps):
            run_step(trainer)
            m = trainer.train_step.budget_metrics()  # the previous step's (a host buffer, a step late)
            rays += m.get("budget_counted_rays", 0)  # rendered whole (overflowed rays wait for a later step)
            samples += min(m.get("budget_samples_per_ray", 0) * m.get("budget_active_rays", 0), budget.capacity)
        sync()
        seconds = time.perf_counter() - t0
        metrics = trainer.train_step.budget_metrics()
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


def run_row(command: list[str], cap_s: float, row_file: Path, log_file: Path) -> dict:
    """Run one configuration's process (``command``, which writes its row to ``row_file``) for at most
    ``cap_s`` seconds, its output to ``log_file``. Returns the row it wrote, else a failed row saying how the
    process ended (timed out, a signal, an exit status) with the tail of its log. The process gets its own
    session: at the cap, or when this process is stopped, its whole group (compile workers included) is ended."""
    row_file.unlink(missing_ok=True)
    start = time.monotonic()
    with open(log_file, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=cap_s)
            how = None if rc == 0 else (f"the process died of {signal.Signals(-rc).name}" if rc < 0 else
                                        f"the process exited with {rc}")
        except subprocess.TimeoutExpired:
            rc, how = None, f"timed out after {cap_s:.0f} s (the row's cap)"
        finally:  # the timeout above, or this process stopped (SIGTERM from the script's limit)
            if proc.poll() is None:
                stop_group(proc)
    seconds = round(time.monotonic() - start, 2)
    if row_file.exists():
        row = json.loads(row_file.read_text())
    else:
        tail = log_file.read_text(errors="replace")[-2000:] if log_file.exists() else ""
        row = {"status": f"failed: {how or 'the process wrote no row'}", "rc": rc, "log_tail": tail}
    row.update(process_s=seconds, cap_s=cap_s, log=str(log_file))
    return row


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to ``proc``'s process group, SIGKILL 5 s later if it is still there."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_plan(rows: list[tuple[str, int, bool]], cuda: bool, seconds: float, command_for, root: Path,
             save_rows) -> list[dict]:
    """Each row of ``rows`` in its own process (``command_for(row, row_file)``) until ``seconds`` are spent,
    ``save_rows(results)`` after each; the CPU lists the compiled modes as needing CUDA."""
    deadline = time.monotonic() + seconds
    out = []
    for mode, log2_slots, bf16 in rows:
        name = row_name(mode, log2_slots, bf16)
        row = {"mode": mode, "samples_per_step": 1 << log2_slots, "bf16": bf16}
        left = deadline - time.monotonic()
        if not cuda and mode not in ("eager", "graph"):
            row["status"] = "skipped: needs CUDA (compiled and graphed steps are the GPU's; the CPU compile is " \
                            "tested in tests/unit/test_static_step.py)"
        elif left < MIN_ROW_S:
            row["status"] = f"skipped: time (the section's {seconds:g} s spent)"
        else:
            row_file = root / f"{name}.json"
            row = {**row, **run_row(command_for((mode, log2_slots, bf16), row_file),
                                    min(ROW_CAP_S[mode], left), row_file, root / f"{name}.log")}
            if not row["status"].startswith("ok"):
                print(f"sweep: {name} {row['status']}\n{row.get('log_tail', '')[-1500:]}", flush=True)
        out.append(row)
        print(json.dumps({k: row.get(k) for k in ("mode", "samples_per_step", "bf16", "status", "rays_per_s",
                                                  "samples_per_s", "step_ms", "warmup_s", "process_s")}), flush=True)
        save_rows(out)  # after every configuration: a kill keeps what ran
    return out


def measure_row(args, data: list[str]) -> None:
    """``--row``: measure one configuration in this process and write its row to ``--row-out``."""
    mode, log2_slots, bf16 = args.row.split(":")
    cuda = args.mode == "cuda"
    row = {"mode": mode, "samples_per_step": 1 << int(log2_slots), "bf16": bf16 == "1"}
    try:
        row = measure(mode, int(log2_slots), bf16 == "1", "cuda" if cuda else "cpu", data,
                      args.warmup if args.warmup is not None else (12 if cuda else 2),
                      args.steps if args.steps is not None else (30 if cuda else 3),
                      args.runs or Path(tempfile.mkdtemp(prefix="sweep_")))
    except Exception as err:  # recorded; a device-side assert leaves this process's CUDA context unusable
        row["status"] = f"failed: {type(err).__name__}: {err}"[:500]
        row["traceback"] = traceback.format_exc()[-3000:]
    args.row_out.write_text(json.dumps(row, indent=1, default=str))
    if not row["status"].startswith("ok"):
        sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["cuda", "cpu"], required=True)
    ap.add_argument("--data", default=None, help="lego's folder (cuda); the built-in scene without it")
    ap.add_argument("--part", choices=["first", "rest", "all"], default="all",
                    help=f"the plan's first {FIRST_ROWS} rows (section sweep), the others (sweep_more), or all")
    ap.add_argument("--section", default="sweep", help="the section's name ($GC_SECT/NAME.json)")
    ap.add_argument("--seconds", type=float, default=150.0, help="stop starting configurations after this")
    ap.add_argument("--warmup", type=int, default=None, help="steps before timing (default cuda 12, cpu 2)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default cuda 30, cpu 3)")
    ap.add_argument("--runs", type=Path, default=None, help="run directories and row logs (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=None, help="write here instead of $GC_SECT/SECTION.json")
    ap.add_argument("--row", default=None, help="MODE:LOG2_P:BF16 (0/1): measure this one configuration here")
    ap.add_argument("--row-out", type=Path, default=None, help="with --row: where its row goes")
    args = ap.parse_args()
    data = ["dataset=blender", f"dataset.root={Path(args.data).resolve()}"] if args.data else ["experiment=smoke"]
    if args.row is not None:
        return measure_row(args, data)
    cuda = args.mode == "cuda"
    plan = CUDA_PLAN if cuda else CPU_PLAN
    rows = {"first": plan[:FIRST_ROWS], "rest": plan[FIRST_ROWS:], "all": plan}[args.part]

    def command_for(row, row_file: Path) -> list[str]:
        mode, log2_slots, bf16 = row
        cmd = [sys.executable, "-m", "bench.gpu.sweep", "--mode", args.mode, "--runs", str(row_file.parent),
               "--row", f"{mode}:{log2_slots}:{int(bf16)}", "--row-out", str(row_file)]
        cmd += ["--data", args.data] if args.data else []
        cmd += ["--warmup", str(args.warmup)] if args.warmup is not None else []
        return cmd + (["--steps", str(args.steps)] if args.steps is not None else [])

    # the script's limit stops this process with SIGTERM: raised here, so the running row's group is ended
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("bench.gpu.sweep: stopped (SIGTERM)"))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.runs or tmp)
        root.mkdir(parents=True, exist_ok=True)
        run_plan(rows, cuda, args.seconds, command_for, root,
                 lambda done: save(done, data, len(rows), args.section, args.out))


def save(rows: list[dict], data: list[str], planned: int, section: str, out: Path | None) -> None:
    """The section's JSON so far (``status`` ok once one configuration ran)."""
    ok = [r for r in rows if r["status"] == "ok"]
    failed = [row_name(r["mode"], r["samples_per_step"].bit_length() - 1, r["bf16"]) for r in rows
              if r["status"].startswith("failed")]
    status = "ok" if ok and not failed else "failed: no configuration ran"
    if failed:  # the others' figures stand: each row ran in its own process
        status = f"failed: {', '.join(failed)} ({len(ok)} of {len(rows)} rows ok)"
    body = {"status": status, "data": data, "configs": rows, "planned": planned,
            "best_rays_per_s": max((r["rays_per_s"] or 0 for r in ok), default=None)}
    if out is not None:
        out.write_text(json.dumps(body, indent=1, default=str))
    else:
        from bench.gpu.check import write

        write(section, body)


if __name__ == "__main__":
    main()
