"""Run profiler: the always-on step breakdown, telemetry, torch.profiler traces and
the environment fingerprint of one rank, written under ``RUN/profile/``::

    RUN/profile/env.json                 environment fingerprint (rank 0; compare refuses on differences)
    RUN/profile/rank_K.json              per-step breakdown + summary + telemetry of rank K
    RUN/profile/traces/rank_K.*.json.gz  profiler=trace: Chrome/Perfetto trace of rank K's active steps
    RUN/profile/ops_rank_K.json          profiler=trace: top operators by self time (torch key_averages)

Built by the trainer after the process group exists, so every trace carries its rank.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import sys
import time
from pathlib import Path

import torch

from ..config_check import section
from ..schema import ProfilerConfig
from .breakdown import PHASES, StepProfiler
from .telemetry import Telemetry

log = logging.getLogger("distnerf")


def environment_fingerprint(device: torch.device, world_size: int) -> dict:
    """Settings of the machine that change speed: processor, accelerator, threads, versions."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    fp = {"processor": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
          "torch_interop_threads": torch.get_num_interop_threads(),
          "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "torch": torch.__version__,
          "cuda": torch.version.cuda, "python": platform.python_version(), "device": device.type,
          "world_size": world_size, "accelerator": None, "nccl": None}
    if device.type == "cuda":
        fp["accelerator"] = torch.cuda.get_device_name(device)
        try:
            fp["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # a build without NCCL
            fp["nccl"] = None
    return fp


def _trace_schedule(cfg):
    """torch.profiler's schedule from the validated ``profiler.trace`` (bounds: :class:`TraceConfig`)."""
    return torch.profiler.schedule(skip_first=0, wait=cfg.wait, warmup=cfg.warmup, active=cfg.active,
                                   repeat=cfg.repeat)


class RunProfiler:
    """Everything profiled for one rank of a training run.

    Args:
        cfg: the ``profiler`` config group (``conf/profiler/*.yaml``).
        device, rank, world_size: this process.
        run_dir: the run directory; files go to ``run_dir/profile``.
        model: the unwrapped model (forward sub-phase hooks).
    Attributes:
        steps: the :class:`StepProfiler` (the trainer's step timer).
    """

    def __init__(self, cfg: dict, device: torch.device, rank: int, world_size: int, run_dir: Path, model=None):
        cfg = section(ProfilerConfig, cfg)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.dir = Path(run_dir) / "profile"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.trace_cfg = cfg.trace
        # torch.compile'd in place (model.compile=true): no sub-phase hooks inside the compiled region
        self.compiled = model is not None and getattr(model, "_compiled_call_impl", None) is not None
        self.steps = StepProfiler(device, None if self.compiled else model, rank, world_size,
                                  skip_steps=cfg.skip_steps, max_records=cfg.max_step_records, nvtx=cfg.nvtx,
                                  annotate=self.trace_cfg is not None, enabled=cfg.breakdown)
        self.env = environment_fingerprint(device, world_size)
        if rank == 0:
            from ..fileio import atomic_write_text

            atomic_write_text(self.dir / "env.json", json.dumps(self.env, indent=1))
        self.telemetry = Telemetry(device, cfg.telemetry_interval_s).start() if cfg.telemetry else None
        self.trace = None
        self.trace_files: list[dict] = []
        if self.trace_cfg is not None:
            self._start_trace(device)

    # ----------------------------------------------------------------- torch.profiler
    def _start_trace(self, device: torch.device) -> None:
        tc = self.trace_cfg
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        (self.dir / "traces").mkdir(exist_ok=True)
        self.trace = torch.profiler.profile(
            activities=activities, schedule=_trace_schedule(tc), on_trace_ready=self._trace_ready,
            record_shapes=tc.record_shapes, profile_memory=tc.profile_memory, with_stack=tc.with_stack)
        self.trace.start()

    def _trace_ready(self, prof) -> None:
        """Export one trace per rank per cycle (rank and step in the name), print its size,
        and keep the top operators by self time (torch's own aggregation)."""
        path = self.dir / "traces" / f"rank_{self.rank}.step_{prof.step_num}.pt.trace.json.gz"
        tmp = path.with_name(path.name.replace(".json.gz", ".tmp.json.gz"))
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, path)
        size = path.stat().st_size
        self.trace_files.append({"path": str(path.relative_to(self.dir)), "bytes": size, "step": prof.step_num})
        print(f"[rank {self.rank}] trace {path} ({size / 2**20:.2f} MB; open in https://ui.perfetto.dev)",
              file=sys.stderr, flush=True)  # every rank prints its own (non-main ranks log warnings only)
        key = "self_device_time_total" if any(e.device_type.name == "CUDA" for e in prof.events()) \
            else "self_cpu_time_total"
        ops = []
        for e in prof.key_averages():
            ops.append({"name": e.key, "calls": e.count, "self_cpu_us": e.self_cpu_time_total,
                        "cpu_total_us": e.cpu_time_total,
                        "self_device_us": getattr(e, "self_device_time_total", 0.0)})
        ops.sort(key=lambda o: o["self_device_us" if key == "self_device_time_total" else "self_cpu_us"],
                 reverse=True)
        from ..fileio import atomic_write_text

        atomic_write_text(self.dir / f"ops_rank_{self.rank}.json",
                          json.dumps({"sort": key, "ops": ops[: self.trace_cfg.top_ops]}, indent=1))

    def compile_stats(self) -> dict | None:
        """torch.compile figures of this process (None when the model is not compiled):
        ``compile_s`` (dynamo + inductor time, torch's own ``compilation_time_metrics``),
        ``graph_breaks`` (count), ``unique_graphs``; start-up steps are the summary's ``startup_s``."""
        if not self.compiled:
            return None
        from torch._dynamo.utils import compilation_time_metrics, counters

        return {"compile_s": float(sum(compilation_time_metrics.get("_compile.compile_inner", []))),
                "graph_breaks": int(sum(counters["graph_break"].values())),
                "graph_break_reasons": sorted(counters["graph_break"])[:20],
                "unique_graphs": int(counters["stats"].get("unique_graphs", 0))}

    # ----------------------------------------------------------------- per step
    def end_step(self, step: int, num_rays: float, num_samples: int, comm: dict | None) -> float:
        """Record the step in the breakdown and advance the trace schedule.

        Returns:
            the host time (``time.perf_counter``) at which the step was done, before the trace
            bookkeeping (exporting a trace is not training time). On CUDA nothing here waits for
            the device (the breakdown resolves a step's events a step later): it is when the host
            finished queuing the step, which the step's own host syncs (the occupancy march's
            sizes) keep at most one step ahead of the device, so summed over steps it is the
            device's pace.
        """
        self.steps.end_step(step, num_rays, num_samples, comm)
        done = time.perf_counter()
        if self.trace is not None:
            self.trace.step()
        return done

    def finish(self) -> dict:
        """Stop traces and telemetry; write ``rank_K.json``; return this rank's summary
        (``{"rank", "summary", "telemetry", "traces"}``) for gathering on rank 0."""
        if self.trace is not None:
            self.trace.stop()
            self.trace = None
        telemetry = self.telemetry.stop() if self.telemetry is not None else None
        self.telemetry = None
        self.steps.close()
        extra = {"env": self.env, "telemetry": telemetry, "traces": self.trace_files, "compile": self.compile_stats(),
                 "written": time.strftime("%Y-%m-%dT%H:%M:%S")}
        data = self.steps.write(self.dir / f"rank_{self.rank}.json", extra)
        return {"rank": self.rank, "summary": data["summary"], "compile": extra["compile"],
                "telemetry": None if telemetry is None else telemetry["summary"], "traces": self.trace_files}


def flat_summary(summaries: list[dict]) -> dict:
    """Numeric ``profile/rank_K/<key>_<stat>`` entries of every rank's summary (W&B, jsonl)."""
    row = {}
    for s in summaries:
        prefix = f"profile/rank_{s['rank']}"
        for key, stats in s["summary"].get("keys", {}).items():
            row[f"{prefix}/{key}_median"] = stats["median"]
            if "share" in stats:
                row[f"{prefix}/{key}_share"] = stats["share"]
        for key, value in (s["summary"].get("unattributed_share") or {}).items():
            row[f"{prefix}/unattributed_share_{key}"] = value
        for key, stats in (s.get("telemetry") or {}).items():
            row[f"{prefix}/telemetry_{key}_mean"] = stats["mean"]
            row[f"{prefix}/telemetry_{key}_max"] = stats["max"]
    return row


def log_profile_summaries(summaries: list[dict], logger, step: int) -> None:
    """Rank 0: one console line per rank and one ``profile_summary`` row (every rank's figures)."""
    for s in summaries:
        keys = s["summary"].get("keys", {})
        step_s = keys.get("step_s", {}).get("median")
        if step_s is None:
            continue
        share = lambda k: 100 * keys.get(k, {}).get("share", 0.0)  # noqa: E731
        log.info("profile rank %d: step median %.1f ms; input %.1f%%, forward %.1f%%, backward %.1f%%, exposed comm "
                 "%.1f%%, step sync %.1f%%, optimizer %.1f%%, unattributed %.1f%% (p95 of per-step share %.1f%%)",
                 s["rank"], 1e3 * step_s, share("input_wait") + share("copy"), share("forward"), share("backward"),
                 share("exposed_comm"), share("step_sync"), share("optimizer"), share("unattributed"),
                 100 * s["summary"]["unattributed_share"]["p95"])
    for s in summaries:
        keys = s["summary"].get("keys", {})
        if "graph" in keys:  # step.cuda_graph: a replay is one opaque phase; the phases come from eager steps
            eager = keys.get("forward", {}).get("steps", 0)
            median = lambda k: 1e3 * keys.get(k, {}).get("median", float("nan"))  # noqa: E731
            log.info("profile rank %d: %d step(s) in phase `graph` (step.cuda_graph: a CUDA graph's replay, on the "
                     "CPU its body uncaptured; median %.1f ms, opaque inside); forward / backward / optimizer medians "
                     "%.1f / %.1f / %.1f ms are those of the %d eager step(s) (warm-up before each capture, a probe "
                     "every step.probe_every steps)", s["rank"], keys["graph"]["steps"], median("graph"),
                     median("forward"), median("backward"), median("optimizer"), eager)
        if s.get("compile"):
            c = s["compile"]
            log.info("torch.compile rank %d: %.1f s compiling, %d graph break(s), %d graph(s); start-up steps %.1f s "
                     "(steady-state figures above exclude them)", s["rank"], c["compile_s"], c["graph_breaks"],
                     c["unique_graphs"], s["summary"].get("startup_s", 0.0))
    logger.log({"step": step, "event": "profile_summary", **flat_summary(summaries)})
    from .logger import WandbLogger

    for sink in getattr(logger, "loggers", [logger]):
        if isinstance(sink, WandbLogger):  # the breakdown as a table: one row per rank and phase
            columns = ["rank", "phase", "mean_ms", "median_ms", "p95_ms", "share"]
            rows = [[s["rank"], key, 1e3 * v["mean"], 1e3 * v["median"], 1e3 * v["p95"], v.get("share")]
                    for s in summaries for key, v in s["summary"].get("keys", {}).items()
                    if key in PHASES or key.startswith("forward.") or key in ("unattributed", "step_s")]
            sink.run.log({"profile/breakdown": sink.wandb.Table(columns=columns, data=rows)}, step=step)
