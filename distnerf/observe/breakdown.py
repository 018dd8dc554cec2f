"""Always-on step breakdown: where every training step went, on every rank.

(Just over 500 lines: the phase definitions, their timers and the exposed-communication rule belong together;
most of the length is the phases' documentation below.)

Each step is split into top-level phases (seconds, one host clock on CPU, CUDA
events on GPU)::

    input_wait    the trainer waited for its ray batch (sampler)
    copy          host-to-device copy of the batch
    model_update  non-gradient model state (occupancy grid, resolution changes), lr
    forward       the whole render + loss; split further into ``forward.<child>``
                  (time inside each parameterised child module, e.g. ``coarse`` and
                  ``fine`` MLPs of ``model=nerf``) and ``forward.other`` (ray
                  sampling / marching, interpolation, compositing)
    step_sync     the one small all-reduce per step (valid rays, stop flags); it also
                  absorbs the time a fast rank waits for a slow one
    checkpoint    a checkpoint taken inside the step (time marks)
    backward      backward's own computation
    exposed_comm  gradient all-reduce time not hidden behind backward (see below)
    regularizer   parameter-only regulariser gradients (added after the all-reduce)
    optimizer     optimizer step and zero_grad

``unattributed`` = step time - sum of the phases (bookkeeping between phases); it is
reported so that the breakdown can be trusted (at most a few percent).

Exposed communication (CPU/gloo, host clock): DDP calls the communication hook on
the autograd thread when a bucket is ready; the hook launches an asynchronous
all-reduce and returns, and ``backward()`` returns only after DDP has waited for
every bucket. So the time backward spent *inside* hooks plus the time between the
last hook's return and backward's return is communication backward had to wait
for; the rest of each bucket's (launch, completion) span ran hidden behind
backward's computation. On CUDA the host does not wait for NCCL inside backward; the
hook's CUDA events give each bucket's all-reduce span on the GPU timeline instead
(:func:`gpu_comm_figures`): backward's computation has ended when the last bucket is
launched (every gradient is then reduced-ready), so the communication after that
launch is exposed and is moved from ``backward`` (whose GPU span waited for it) to
``exposed_comm``. Without those events (a strategy that records none) ``exposed_comm`` is
None on CUDA; the traces (HolisticTraceAnalysis) give kernel-level overlap either way.

NeRF figures per step: rays/s (this rank's valid rays over its step time),
samples per ray after empty-space skipping, field evaluations (samples the model
evaluated) and forward time per sample (ns).

At the end :meth:`StepProfiler.finish` writes ``RUN/profile/rank_K.json``: every
step's record and a summary (mean, median, p95 and share of each phase).
"""
from __future__ import annotations

import json
import logging
import time
from collections import defaultdict, deque
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..distributed import device_timed

log = logging.getLogger("distnerf")

PHASES = ("input_wait", "copy", "model_update", "graph", "forward", "backward", "exposed_comm", "regularizer",
          "optimizer", "step_sync", "checkpoint")  # the order a step passes them: the agreement is read after the
# update; `graph`: a replayed CUDA graph of the whole step (step.cuda_graph), opaque inside
MODEL_PHASES = ("forward", "backward", "regularizer", "optimizer")  # inside a `graph` replay: None (not measured)
FIGURES = ("rays_per_s", "samples_per_ray", "field_evals", "forward_ns_per_sample", "comm_bytes", "comm_total_s",
           "comm_hidden_s", "bus_bandwidth_gbps", "peak_memory_mb")


def interval_union(spans) -> float:
    """Total length of the union of ``(start, end)`` intervals (seconds)."""
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(spans):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def exposed_after_last_launch(spans) -> tuple[float, float]:
    """GPU-timeline communication figures of one step's buckets.

    Args:
        spans: ``(launch, end)`` seconds of each bucket's all-reduce on one timeline (the
            launch: when its gradients were ready; the end: the collective's completion).
    Returns:
        (exposed_s, total_s): ``total`` = the union of the spans; ``exposed`` = the part of that
        union after the last launch (when the last bucket is ready, backward's computation is
        done, so later communication is waited for, not hidden).
    """
    if not spans:
        return 0.0, 0.0
    compute_end = max(a for a, _ in spans)
    tail = [(max(a, compute_end), b) for a, b in spans if b > compute_end]
    return interval_union(tail), interval_union(spans)


def gpu_comm_figures(comm: dict | None, step_mark, seconds) -> dict | None:
    """Resolve a CUDA step's bucket events (:meth:`CommStats.take_step` ``events``) after the
    step's synchronisation.

    Args:
        comm: the strategy's step_comm, or None. step_mark: the step's start event.
        seconds: ``seconds(a, b)`` between two events (``_CudaClock.seconds``).
    Returns:
        None without events; else ``spans`` (seconds from the step start), ``bucket_s`` (each
        bucket's duration), ``exposed_s`` and ``total_s`` (:func:`exposed_after_last_launch`).
    """
    events = (comm or {}).get("events") or []
    if not events:
        return None
    spans = [(seconds(step_mark, a), seconds(step_mark, b)) for a, b, _ in events]
    exposed, total = exposed_after_last_launch(spans)
    return {"spans": spans, "bucket_s": [b - a for a, b in spans], "exposed_s": exposed, "total_s": total}


def exposed_communication(comm: dict | None, backward_end: float) -> tuple[float, float, float]:
    """Split this step's gradient communication into exposed and hidden time.

    Args:
        comm: :meth:`Strategy.step_comm` of the step: ``in_hook_s`` (s the hooks ran on
            the autograd thread), ``last_return`` (perf_counter s), ``spans`` [(launch, done)].
        backward_end: perf_counter s at which ``backward()`` returned.
    Returns:
        (exposed_s, total_s, hidden_s): exposed = in-hook time + (backward_end - last hook
        return), clipped to [0, total]; total = union of the bucket spans; hidden = total - exposed.
    """
    if not comm or comm.get("last_return") is None:
        return 0.0, 0.0, 0.0
    total = interval_union(comm["spans"])
    tail = max(0.0, backward_end - comm["last_return"])
    exposed = comm["in_hook_s"] + tail
    total = max(total, exposed)
    return exposed, total, total - exposed


def summarize(records: list[dict], skip_steps: int = 0) -> dict:
    """Per-key statistics of step records.

    Args:
        records: per-step dicts (``step_s``, phase seconds, figures).
        skip_steps: leading records left out (start-up, compilation); reported apart.
    Returns:
        ``{"num_steps", "skipped", "startup_s", "keys": {key: {mean, median, p95, steps, share}},
        "unattributed_share": {median, p95, max}}``; ``share`` is the phase's sum over
        the step time's sum.
    """
    steady = records[skip_steps:] if len(records) > skip_steps else records
    out = {"num_steps": len(steady), "skipped": len(records) - len(steady),
           "startup_s": float(sum(r["step_s"] for r in records[: len(records) - len(steady)])), "keys": {}}
    if not steady:
        return out
    step_sum = sum(r["step_s"] for r in steady)
    keys = ["step_s", *PHASES, "unattributed"]
    keys += sorted({k for r in steady for k in r if k.startswith("forward.")})
    keys += list(FIGURES)
    for key in keys:
        values = np.array([r[key] for r in steady if r.get(key) is not None], dtype=np.float64)
        if values.size == 0:
            continue
        stats = {"mean": float(values.mean()), "median": float(np.median(values)),
                 "p95": float(np.percentile(values, 95)), "steps": int(values.size)}  # steps that had it
        if key in PHASES or key == "unattributed" or key.startswith("forward."):
            stats["share"] = float(values.sum() / max(step_sum, 1e-12))
        out["keys"][key] = stats
    shares = np.array([r["unattributed"] / max(r["step_s"], 1e-12) for r in steady])
    out["unattributed_share"] = {"median": float(np.median(shares)), "p95": float(np.percentile(shares, 95)),
                                 "max": float(shares.max())}
    return out


class _HostClock:
    """Timestamps from ``time.perf_counter`` (CPU)."""

    def mark(self):
        return time.perf_counter()

    def seconds(self, a, b) -> float:
        return b - a

    def wait(self, mark) -> None:
        pass


class _CudaClock:
    """CUDA events recorded on the current stream; a step's are resolved a step later, when they
    are done (no synchronisation of the device: :meth:`StepProfiler.end_step`)."""

    def mark(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1000.0

    def wait(self, event) -> None:
        event.synchronize()  # this event only (a step old: done, returns at once)


@dataclass
class _ClosedStep:
    """A step closed by :meth:`StepProfiler.end_step`, not yet recorded (its clock marks)."""

    step: int
    host_start: float
    host_end: float
    marks: list
    host_edges: dict
    step_mark: object
    end_mark: object
    num_rays: float
    num_samples: int
    comm: dict | None


class StepProfiler:
    """Per-step phase timer and NeRF figures for one rank (the trainer's ``timer``).

    Args:
        device: training device (:func:`distnerf.distributed.device_timed`, CUDA: events; otherwise host clock).
        model: the unwrapped model; its direct children holding parameters get forward
            hooks (``forward.<name>`` sub-phases); ``None``: no sub-phases.
        rank, world_size: this process (file names, bus bandwidth).
        skip_steps: leading steps excluded from the steady-state summary (``profiler.skip_steps``).
        nvtx: push NVTX ranges named after the phases (CUDA only; no-op elsewhere).
        annotate: wrap phases in ``torch.profiler.record_function`` (trace runs).
        enabled: False turns every call into a no-op (``profiler=off``: the baseline of the
            overhead benchmark); no records are kept.
        max_records: memory bound of the per-step records (a record is about 1.5 kB): past it,
            every other steady record is dropped and from then on only every ``stride``-th step
            is kept (``stride`` doubles each time), so a run of any length holds at most
            ``max_records`` records, a systematic sample in step order, the same steps on every
            rank. Phase totals and :meth:`recent_figures` stay exact; the summary's statistics
            come from the sample (``num_steps`` still counts every steady step, ``sampled_every``
            gives the stride) (``profiler.max_step_records``).
    """

    def __init__(self, device: torch.device, model: nn.Module | None = None, rank: int = 0, world_size: int = 1, *,
                 skip_steps: int, max_records: int, nvtx: bool = False, annotate: bool = False, enabled: bool = True,
                 late: bool | None = None):
        self.enabled = enabled
        self._null = nullcontext()
        self.cuda = device_timed(device)  # the timing method: CUDA events resolved later, or the host clock
        self.late = self.cuda if late is None else late
        self._pending: _ClosedStep | None = None
        self.clock = _CudaClock() if self.cuda else _HostClock()
        self.rank, self.world_size, self.skip_steps = rank, world_size, skip_steps
        self.nvtx = nvtx and self.cuda
        self.annotate = annotate
        self.totals: dict[str, float] = defaultdict(float)  # since the last pop() (log rows)
        self.run_totals: dict[str, float] = defaultdict(float)  # since construction
        self.records: list[dict] = []
        self.max_records, self.stride, self.steady_steps = max(int(max_records), skip_steps + 2), 1, 0
        self._recent: deque = deque(maxlen=1000)  # the last steps, every one (recent_figures)
        self._marks: list[tuple[str, object, object]] = []
        self._host_edges: dict[str, tuple[float, float]] = {}
        self._step_start: float | None = None
        self._step_mark = None
        self._in_forward = False
        self._hooks = []
        self.created = time.perf_counter()
        self.current, self.current_since = "setup", time.time()
        if model is not None and enabled:
            self.attach(model)

    # ----------------------------------------------------------------- hooks
    def attach(self, model: nn.Module) -> None:
        """Time the forward of ``model``'s direct children that hold parameters."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        for name, child in model.named_children():
            if not any(True for _ in child.parameters()):
                continue
            state: dict = {}

            def pre(module, args, _name=name, _state=state):
                if self._in_forward:
                    _state["start"] = self.clock.mark()

            def post(module, args, output, _name=name, _state=state):
                start = _state.pop("start", None)
                if start is not None:
                    self._marks.append((f"forward.{_name}", start, self.clock.mark()))

            self._hooks += [child.register_forward_pre_hook(pre), child.register_forward_hook(post)]

    # ----------------------------------------------------------------- phases
    def begin_step(self) -> None:
        """Start timing a step (host clock; on CUDA also an event)."""
        if not self.enabled:
            return
        self._marks.clear()
        self._host_edges.clear()
        self._step_start = time.perf_counter()
        self._step_mark = self.clock.mark() if self.cuda else None

    def phase(self, name: str):
        """Context manager timing ``name`` (one of :data:`PHASES`); NVTX/record_function ranges when enabled.
        Enabled or not, :attr:`current` becomes ``name`` (what this rank is doing, for hang reports)."""
        self.mark(name)
        return self._timed(name) if self.enabled else self._null

    def mark(self, name: str) -> None:
        """Set :attr:`current` (the phase last entered, or ``setup``/``evaluate``) and
        :attr:`current_since` (its wall-clock start, seconds since the epoch) without timing."""
        self.current, self.current_since = name, time.time()

    @contextmanager
    def _timed(self, name: str):
        ranges = []
        if self.nvtx:
            torch.cuda.nvtx.range_push(name)
        if self.annotate:
            ranges.append(torch.profiler.record_function(f"phase:{name}"))
            ranges[-1].__enter__()
        host_start = time.perf_counter()
        start = self.clock.mark() if self.cuda else host_start
        self._in_forward = name == "forward"
        try:
            yield
        finally:
            self._in_forward = False
            host_end = time.perf_counter()
            end = self.clock.mark() if self.cuda else host_end
            self._marks.append((name, start, end))
            self._host_edges[name] = (host_start, host_end)
            for r in reversed(ranges):
                r.__exit__(None, None, None)
            if self.nvtx:
                torch.cuda.nvtx.range_pop()

    def end_step(self, step: int, num_rays: float, num_samples: int, comm: dict | None) -> dict | None:
        """Close the step opened by :meth:`begin_step`; record it, or (``late``, the default on
        CUDA) keep it and record the step before it.

        On CUDA a step's events are resolved a step late: reading them at once would make the
        host wait for the step's last kernel (a synchronisation per step, which also keeps the
        host from queuing the next step's copy and kernels behind this step's backward). By the
        next ``end_step`` that step's events are done (the next step's own host syncs, the
        occupancy march's sizes, come after them on the stream), so waiting for them returns at
        once. :meth:`flush` records the last one (:meth:`summary` and :meth:`write` call it).

        Args:
            step: index of the step just taken. num_rays: this rank's valid rays.
            num_samples: samples the model evaluated (``RenderOutput.num_samples``).
            comm: the strategy's :meth:`step_comm` (None: no gradient exchange).
        Returns:
            the record (seconds per phase, figures) of the step recorded now (this one, or the one
            before it when ``late``), or None (no begun step; the first step when ``late``).
        """
        if self._step_start is None:
            return None
        closed = _ClosedStep(step, self._step_start, time.perf_counter(), list(self._marks), dict(self._host_edges),
                             self._step_mark, self.clock.mark() if self.cuda else None, num_rays, num_samples, comm)
        self._step_start = None
        if not self.late:
            return self._record(closed)
        previous, self._pending = self._pending, closed
        return self._record(previous) if previous is not None else None

    def flush(self) -> dict | None:
        """Record the step kept by a late :meth:`end_step` (waiting for its events), if any."""
        closed, self._pending = self._pending, None
        return self._record(closed) if closed is not None else None

    def _record(self, c: "_ClosedStep") -> dict:
        if self.cuda:
            self.clock.wait(c.end_mark)  # the step's last event: every event before it on the stream is done
        step_s = c.host_end - c.host_start
        rec: dict = {"step": c.step, "t": c.host_start - self.created, "step_s": step_s}
        for name, a, b in c.marks:
            rec[name] = rec.get(name, 0.0) + self.clock.seconds(a, b)
        if self.cuda:  # GPU timeline of the step, host wall if longer (input waits)
            step_s = rec["step_s"] = max(step_s, self.clock.seconds(c.step_mark, c.end_mark))
        replay = "graph" in c.host_edges  # a replayed CUDA graph: the model's phases were not measured
        for name in PHASES:  # None: not measured (the model's phases in a replay; `graph` in any other step)
            rec.setdefault(name, None if (name in MODEL_PHASES if replay else name == "graph") else 0.0)
        if "forward" in c.host_edges:
            children = sum(v for k, v in rec.items() if k.startswith("forward."))
            if children > 0:
                rec["forward.other"] = max(0.0, rec["forward"] - children)
        comm = c.comm
        gpu = gpu_comm_figures(comm, c.step_mark, self.clock.seconds) if self.cuda else None
        if gpu is not None:  # the hook's CUDA events (module docstring)
            exposed = min(gpu["exposed_s"], rec["backward"])
            rec["backward"] -= exposed
            rec["exposed_comm"] = exposed
            rec["comm_total_s"], rec["comm_hidden_s"] = gpu["total_s"], max(0.0, gpu["total_s"] - exposed)
            rec["comm_bucket_ms"] = [round(1e3 * s, 4) for s in gpu["bucket_s"]]
            comm = {**comm, "spans": gpu["spans"], "timing": "duration"}
        elif self.cuda:
            rec["exposed_comm"] = None if comm is not None else 0.0  # no events: not measurable from the host
        elif comm is not None and "backward" in c.host_edges:
            exposed, total, hidden = exposed_communication(comm, c.host_edges["backward"][1])
            exposed = min(exposed, rec["backward"])
            rec["backward"] -= exposed
            rec["exposed_comm"] = exposed
            rec["comm_total_s"], rec["comm_hidden_s"] = total, max(0.0, total - exposed)
        if comm is not None:
            rec["comm_bytes"] = comm["bytes"]
            busy = sum(b - a for a, b in comm["spans"])
            # bus bandwidth (nccl-tests convention: each bucket's bus bytes from its own collective, or a
            # ring all-reduce's without them), only from measured durations
            if busy > 0 and self.world_size > 1 and comm.get("timing", "duration") == "duration":
                bus = comm.get("bus_bytes")
                if bus is None:
                    bus = comm["bytes"] * 2 * (self.world_size - 1) / self.world_size
                rec["bus_bandwidth_gbps"] = bus / busy / 1e9
        attributed = sum(rec[p] or 0.0 for p in PHASES)
        rec["unattributed"] = step_s - attributed
        rec["rays_per_s"] = c.num_rays / max(step_s, 1e-12)
        rec["samples_per_ray"] = c.num_samples / max(c.num_rays, 1.0)
        rec["field_evals"] = int(c.num_samples)
        if rec["forward"] is not None:
            rec["forward_ns_per_sample"] = rec["forward"] / max(c.num_samples, 1) * 1e9
        if self.cuda:
            rec["peak_memory_mb"] = torch.cuda.max_memory_allocated() / 2**20
            torch.cuda.reset_peak_memory_stats()
        for key in (*PHASES, "unattributed", "step_s"):
            value = rec.get(key) or 0.0
            self.totals[key] += value
            self.run_totals[key] += value
        self._keep(rec)
        return rec

    def _keep(self, rec: dict) -> None:
        """Record ``rec`` within :attr:`max_records` (see the class docstring)."""
        self._recent.append(rec)
        if len(self.records) < self.skip_steps:
            self.records.append(rec)
            return
        index, self.steady_steps = self.steady_steps, self.steady_steps + 1
        if index % self.stride:
            return
        self.records.append(rec)
        if len(self.records) > self.max_records:  # thin the steady records to every (2 * stride)-th
            head, steady = self.records[:self.skip_steps], self.records[self.skip_steps:]
            self.records = head + steady[::2]
            self.stride *= 2

    def pop(self) -> dict[str, float]:
        """Sums of every phase since the last call (seconds; log rows)."""
        out = dict(self.totals)
        out.pop("step_s", None)
        self.totals.clear()
        return out

    def recent_figures(self, n: int) -> dict:
        """Medians of the NeRF/communication figures over the last ``n`` steps."""
        recent = list(self._recent)[-max(n, 1):]
        out = {}
        for key in ("field_evals", "forward_ns_per_sample", "comm_bytes", "bus_bandwidth_gbps", "peak_memory_mb"):
            values = [r[key] for r in recent if r.get(key) is not None]
            if values:
                out[key] = float(np.median(values))
        return out

    def rank_figures(self, n: int) -> dict:
        """This rank's medians over its last ``n`` steps, in milliseconds (W&B's per-rank panels):
        ``step_ms``, ``input_wait_ms``, ``forward_ms``, ``backward_ms``, ``exposed_comm_ms``,
        ``optimizer_ms``, and ``peak_memory_mb`` where recorded."""
        recent = list(self._recent)[-max(n, 1):]
        out = {}
        for key in ("step_s", "input_wait", "forward", "backward", "exposed_comm", "optimizer"):
            values = [r[key] for r in recent if r.get(key) is not None]
            if values:
                out[f"{key.removesuffix('_s')}_ms"] = 1e3 * float(np.median(values))
        peaks = [r["peak_memory_mb"] for r in recent if r.get("peak_memory_mb") is not None]
        if peaks:
            out["peak_memory_mb"] = float(max(peaks))
        return out

    # ----------------------------------------------------------------- output
    def summary(self) -> dict:
        self.flush()
        out = summarize(self.records, self.skip_steps)
        if self.stride > 1:  # a systematic sample of the steady steps
            out.update(num_steps=self.steady_steps, sampled_every=self.stride)
        return out

    def write(self, path: Path, extra: dict | None = None) -> dict:
        """Write ``{"rank", "world_size", "device", "summary", "steps", **extra}`` atomically."""
        from ..fileio import atomic_write_text

        data = {"rank": self.rank, "world_size": self.world_size, "device": "cuda" if self.cuda else "cpu",
                "clock": "cuda events" if self.cuda else "host perf_counter", "phases": list(PHASES),
                "summary": self.summary(), **(extra or {}), "steps": self.records}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(data))
        return data

    def close(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
