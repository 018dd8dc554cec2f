"""The fake-CUDA lane: the CUDA paths of distnerf run on the CPU with tensors on device ``cuda`` that hold no data.

Imported only in a process that loaded the fake-CUDA library (``fake_cuda.cpp``, :mod:`.build`) before torch:
``scenarios.py`` does. Three parts:

* :class:`FakeCuda`, a dispatch mode: an operator that touches a CUDA tensor (or makes one: ``device=cuda``) runs
  in a :class:`~torch._subclasses.fake_tensor.FakeTensorMode` (shapes, dtypes and devices only: a CPU tensor meeting
  a CUDA tensor raises, as on a GPU), every other operator runs for real on the CPU (the dataset, the host buffers,
  the sampler's indices keep their values). It records every **host read** of a device value (an operator the host
  waits for on CUDA: :func:`distnerf.observe.syncs.classify`, ``Tensor.tolist``, ``numpy``) and every **host wait**
  (``torch.cuda.synchronize``, an event's or a stream's ``synchronize``) at the innermost ``distnerf`` frame, and
  answers a read with the stand-in value its :data:`ALLOWED` entry gives (a fake tensor has no value).
* stand-ins for ``torch.cuda`` (:func:`install_cuda_stand_ins`): one device, streams and events that only count,
  ``torch.cuda.graph`` whose capture runs the body once under the mode with :attr:`FakeCuda.capturing` set (a
  replay does nothing: the captured outputs are the fakes the body made).
* :data:`ALLOWED`, the documented host reads of the CUDA paths (``docs/cuda_nccl.md``, "Host reads on the CUDA
  paths", is generated from it: :func:`allowed_table`), each with how often it may happen (:func:`problems` checks
  the counts against a scenario's steps, stages, captures and chunks).

Inside a capture every host read, host wait, host-to-device copy (blocking or not) and CPU tensor operand is a
problem: a CUDA graph cannot wait for the host, and a copy or a CPU value is baked into the graph at capture.
Limits: fakes carry no values (a stand-in answers each read), no addresses (0), and dtypes are not checked against
kernels (a bf16 tensor meeting a float32 one passes where a kernel may refuse: ``tests/unit/test_bf16_cpu.py``
runs bf16 for real on the CPU); DDP and NCCL cannot run on fakes.
"""
from __future__ import annotations

import contextlib
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from distnerf.observe.syncs import classify

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "distnerf"
aten = torch.ops.aten


# ----------------------------------------------------------------------------- the documented host reads
@dataclass(frozen=True)
class Allowed:
    """A documented host read (or wait) of the CUDA paths.

    Attributes:
        site: ``path::qualified function`` of the innermost ``distnerf`` frame that reads.
        op: what reads (``Tensor.tolist``, ``aten._local_scalar_dense``, ``Event.synchronize``, ...).
        often: when it may happen (:data:`OFTEN`): ``at start`` (building the trainer, before the first step),
            ``once per stage`` (at most once per grid stage or occupancy refresh), ``once per step`` (at most once in
            any step), ``once per capture``, ``once per chunk`` (of an evaluation view).
        why: why it is there and why it costs nothing (or little) on a GPU.
        value: the answer where the tensor has no shadow (:meth:`FakeCuda.shadow_of`): ``value(tensor, lane)``
            (the lane's ``model``, the model being trained, at hand); None: zeros.
    """

    site: str
    op: str
    often: str
    why: str
    value: Callable | None = field(default=None, compare=False)
    per: int = 1  # events one occurrence makes (two 0-dim copies: 2)


SHADOW_NUMEL = 1 << 12  # fakes with at most this many elements carry their real values (FakeCuda.shadow_of)
_SHADOW = "_fake_cuda_shadow"
OFTEN = ("at start", "once per stage", "once per step", "once per capture", "once per chunk")


def _whole_box(tensor, lane) -> list:
    """The grid's whole box (``grid_aabb``): the tightened box of an upsampling when every cell is occupied."""
    return lane.shadow_of(lane.model.grid_aabb).tolist()


def _kept_samples(tensor, lane) -> list:
    """A chunk's kept and marched samples (4096 each: some samples to shade) and no overflowed round."""
    return [4096, 4096, 0]


_H2D = "aten._to_copy (host to device, blocking)"
ALLOWED: tuple[Allowed, ...] = (
    Allowed("distnerf/strategy/ddp.py::DDPStrategy.wrap", _H2D, "at start",
            "the model built on the CPU, moved to its device"),
    Allowed("distnerf/sampler/device.py::DeviceSampler.__init__.<locals>.<lambda>", _H2D, "at start",
            "the device sampler's cameras copied to the device"),
    Allowed("distnerf/sampler/device.py::DeviceSampler.__init__", _H2D, "at start",
            "the device sampler's pixels copied to the device"),
    Allowed("distnerf/model/grid.py::GridModel._geometry", "aten._local_scalar_dense", "once per stage",
            "the grid's resolution, read when the grid changes (the hot path reads its cached numbers)"),
    Allowed("distnerf/model/grid.py::GridModel._geometry", "Tensor.tolist", "once per stage",
            "the box's extent for the marching step, read when the grid changes"),
    Allowed("distnerf/model/grid_schedule.py::GridSchedule.upsample", "Tensor.tolist", "once per stage",
            "the tightened box's bounds at an upsampling", _whole_box),
    Allowed("distnerf/components/sample_budget.py::SampleBudget._num_slots", "Tensor.tolist", "once per stage",
            "the marching box's diagonal for the slots per ray K, when the box or the step changes"),
    Allowed("distnerf/renderer/occupancy.py::_strides", _H2D, "once per stage",
            "the occupancy grid's three strides (`torch.tensor`), made once per grid size and kept"),
    Allowed("distnerf/components/optim.py::build_optimizer", _H2D, "once per stage",
            "a group's learning rate made a 0-dim device tensor (`step.cuda_graph`), when the optimizer is (re)built"),
    Allowed("distnerf/components/optim.py::rebuild_optimizer", "aten._local_scalar_dense", "once per stage",
            "the old optimizer's device learning rate carried into the new one at a grid stage"),
    Allowed("distnerf/components/graphed_step.py::GraphedStep._capture", "torch.cuda.synchronize", "once per capture",
            "before recording the step (PyTorch's recipe), once per grid stage or occupancy change"),
    Allowed("distnerf/components/sample_budget.py::SampleBudget._take", "Event.synchronize", "once per step",
            "the event after the previous step's budget figures were copied to pinned memory: done, returns at once"),
    Allowed("distnerf/engine/late_flag.py::LateFlag.take", "Event.synchronize", "once per step",
            "the event after the previous step's non-finite-loss flag was copied: done, returns at once"),
    Allowed("distnerf/observe/breakdown.py::_CudaClock.wait", "Event.synchronize", "once per step",
            "the step breakdown's events of the previous step: done, returns at once"),
    Allowed("distnerf/engine/evaluate.py::render_image.<locals>.<lambda>", _H2D, "once per chunk",
            "a chunk's rays (five tensors) copied to the device", per=5),
    Allowed("distnerf/renderer/occupancy.py::OccupancyGrid.coarse", "Tensor.tolist", "once per stage",
            "the march's group length, padded group count and whether any cell is occupied, once per grid change"),
    Allowed("distnerf/renderer/rounds.py::march_rounds_fixed", "Tensor.tolist", "once per chunk",
            "the kept and marched samples and whether a round overflowed: the chunk's one size read", _kept_samples),
    Allowed("distnerf/renderer/marching.py::shade", "aten.nonzero", "once per chunk",
            "the coloured samples (only they run the colour field)"),
    Allowed("distnerf/engine/evaluate.py::render_image", "aten._to_copy (device to host)", "once per chunk",
            "the chunk's colour, depth and opacity copied back to the host", per=3),
)


def _stand_in(tensor: torch.Tensor, value: Callable | None, lane: "FakeCuda"):
    """The answer to a read of ``tensor``: ``value(tensor, lane)``, else zeros of its shape (a Python scalar for
    0-dim)."""
    if value is not None:
        return value(tensor, lane)
    zero = False if tensor.dtype == torch.bool else (0 if not tensor.dtype.is_floating_point else 0.0)

    def nest(shape):
        return zero if not shape else [nest(shape[1:]) for _ in range(shape[0])]

    return nest(tuple(tensor.shape))


# ----------------------------------------------------------------------------- events
@dataclass
class Event:
    """One host read, host wait or capture problem."""

    kind: str  # "read" (a host read or wait), "capture" (a problem inside a capture)
    op: str
    site: str  # path::function of the innermost distnerf frame ("?" when none)
    line: int
    via: str | None  # the innermost frame outside distnerf (torch's code, the lane's), or None
    capturing: bool
    scenario: str
    step: int | None = None  # the training step running (-1: building the trainer; None: outside training)
    answer: str = ""  # a read's answer: "shadow" (its real value), "stand-in", "zeros"; "" for a wait


_PLUMBING = ("/torch/utils/_python_dispatch", "/torch/overrides", "/torch/_subclasses/", "/torch/_dynamo/",
             "/torch/_compile.py", "/torch/utils/_stats", "/torch/_ops.py")  # torch's mode machinery: never a via


def _locate() -> tuple[str, int, str | None]:
    """(``path::qualname`` of the innermost ``distnerf`` frame, its line, the innermost frame outside ``distnerf``
    and outside this file and torch's dispatch plumbing as ``path:line`` or None)."""
    frame, via = sys._getframe(2), None
    here = str(Path(__file__).resolve())
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(str(PACKAGE)):
            rel = Path(name).resolve().relative_to(REPO)
            return f"{rel}::{frame.f_code.co_qualname}", frame.f_lineno, via
        if via is None and name != here and not any(part in name for part in _PLUMBING):
            via = f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "?", 0, via


# ----------------------------------------------------------------------------- the mode
def _is_cuda(device) -> bool:
    return device is not None and torch.device(device).type == "cuda"


class _Dispatch(TorchDispatchMode):
    def __init__(self, lane: "FakeCuda"):
        super().__init__()
        self.lane = lane

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        fakes = [t for t in leaves if isinstance(t, FakeTensor)]
        if not fakes and not _is_cuda(kwargs.get("device")):
            return func(*args, **kwargs)  # host work: for real
        return self.lane.on_device_op(func, args, kwargs, leaves, fakes)


class FakeCuda:
    """The lane's mode (module docstring): ``with lane:`` runs the enclosed code on fake CUDA tensors.

    Attributes:
        events: every :class:`Event`, in order.
        capturing: inside ``torch.cuda.graph`` (the stand-in's capture).
        scenario: the label of the events recorded now.
        matmul_dtypes: Counter of the dtypes of matrix products inside captures (bf16 autocast seen there).
    """

    def __init__(self, allowed: tuple[Allowed, ...] | None = None):
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        self.allowed = {(a.site, a.op): a for a in (ALLOWED if allowed is None else allowed)}
        self.events: list[Event] = []
        self.capturing = False
        self.scenario = ""
        self.matmul_dtypes: Counter = Counter()
        self.model = None  # the model being trained (stand-ins read its host-side facts)
        self.step: int | None = None  # the training step running (-1: building the trainer), for the events
        self.replay_steps: list = []  # the step of each graph replay
        self._mode = None

    def __enter__(self) -> "FakeCuda":
        # torch.tensor(data, device="cuda"): made on the CPU, then copied through the mode (as under FakeTensorMode)
        self._lift = torch._C._only_lift_cpu_tensors()
        torch._C._set_only_lift_cpu_tensors(True)
        self._mode = _Dispatch(self).__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        self._mode = None
        torch._C._set_only_lift_cpu_tensors(self._lift)

    @contextlib.contextmanager
    def labelled(self, scenario: str):
        """Label the events recorded inside with ``scenario``."""
        before, self.scenario = self.scenario, scenario
        try:
            yield self
        finally:
            self.scenario = before

    # -------------------------------------------------------------- recording
    def _event(self, kind: str, op: str) -> tuple[str, int]:
        site, line, via = _locate()
        self.events.append(Event(kind, op, site, line, via, self.capturing, self.scenario, self.step))
        return site, line

    def read(self, op: str, tensor: torch.Tensor | None):
        """Record a host read of ``tensor`` (or a host wait: ``tensor`` None); returns its values as Python data:
        its shadow's (:meth:`shadow_of`), else the stand-in of its :data:`ALLOWED` entry, else zeros."""
        site, _ = self._event("read", op)
        if tensor is None:
            return None
        shadow = self.shadow_of(tensor)
        if shadow is not None:
            self.events[-1].answer = "shadow"
            return shadow.tolist()
        entry = self.allowed.get((site, op))
        self.events[-1].answer = "stand-in" if entry is not None and entry.value is not None else "zeros"
        return _stand_in(tensor, entry.value if entry is not None else None, self)

    def capture_problem(self, what: str) -> None:
        if self.capturing:
            self._event("capture", what)

    # -------------------------------------------------------------- values of small tensors
    def shadow_of(self, t) -> torch.Tensor | None:
        """The real CPU values of the fake ``t`` (a real tensor: itself), or None: a fake made from host data or
        computed from such fakes alone, with at most :data:`SHADOW_NUMEL` elements (a box, a resolution, a learning
        rate: the values that shapes and host logic depend on). A write from a fake without a shadow leaves the values
        as they were before it (a plausible answer, as a stand-in's)."""
        if not isinstance(t, FakeTensor):
            return t
        return getattr(t, _SHADOW, None)

    def _shadow(self, func, args, kwargs, out) -> None:
        """Run ``func`` on the shadows of its inputs where all have one and its outputs are small; else drop the
        shadow of a tensor it writes into."""
        outputs = [t for t in tree_leaves(out) if isinstance(t, FakeTensor)]
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        shadows = [self.shadow_of(t) for t in inputs]
        small = all(t.numel() <= SHADOW_NUMEL for t in outputs) and all(t.numel() <= SHADOW_NUMEL for t in inputs)
        if not small or any(s is None for s in shadows) or not outputs:
            return  # a tensor written from a fake without a shadow keeps its shadow: the values before the write
        table = {id(t): s for t, s in zip(inputs, shadows)}
        real_args, real_kwargs = tree_map(lambda a: table.get(id(a), a) if isinstance(a, torch.Tensor) else a,
                                          (args, kwargs))
        if _is_cuda(real_kwargs.get("device")):
            real_kwargs = {**real_kwargs, "device": torch.device("cpu")}
        try:
            real = func(*real_args, **real_kwargs)
        except Exception:  # noqa: BLE001  (no shadow: the read answers with a stand-in)
            return
        for fake, value in zip(tree_leaves(out), tree_leaves(real)):
            if isinstance(fake, FakeTensor) and isinstance(value, torch.Tensor):
                setattr(fake, _SHADOW, value)

    # -------------------------------------------------------------- operators
    def on_device_op(self, func, args, kwargs, leaves, fakes):
        """An operator on (or making) CUDA tensors: recorded where the host would wait, then run on fakes."""
        name = classify(func, args, kwargs)
        if self.capturing:
            self._check_capture(func, args, kwargs, leaves)
            if func.overloadpacket in (aten.mm, aten.addmm, aten.bmm, aten.linear, aten.matmul):
                self.matmul_dtypes[str(fakes[0].dtype) if fakes else "?"] += 1
        if func.overloadpacket is aten._local_scalar_dense:
            return self.read("aten._local_scalar_dense", args[0])
        if name is not None:
            self.read(name, None)
        if func.overloadpacket is aten.nonzero and fakes:  # a fake has no values: every element non-zero
            with self.fake_mode:
                return torch.empty((args[0].numel(), args[0].dim()), dtype=torch.int64, device=args[0].device)
        convert = self.fake_mode.from_tensor
        fake_args, fake_kwargs = tree_map(lambda t: convert(t) if isinstance(t, torch.Tensor)
                                          and not isinstance(t, FakeTensor) else t, (args, kwargs))
        with self.fake_mode:
            out = func(*fake_args, **fake_kwargs)
        self._shadow(func, args, kwargs, out)
        return out

    def _check_capture(self, func, args, kwargs, leaves) -> None:
        packet = func.overloadpacket
        if packet is aten._to_copy and _is_cuda(kwargs.get("device")) and args[0].device.type == "cpu":
            self.capture_problem("host-to-device copy (aten._to_copy)")
        elif packet is aten.copy_ and args[0].device.type == "cuda" and args[1].device.type == "cpu":
            self.capture_problem("host-to-device copy (aten.copy_)")
        elif any(t.device.type == "cpu" and not isinstance(t, FakeTensor) for t in leaves):
            self.capture_problem(f"a CPU tensor operand of aten.{packet.__name__} (its value baked into the graph)")

    # -------------------------------------------------------------- results
    def summary(self) -> dict:
        return {"events": [asdict(e) for e in self.events], "matmul_dtypes": dict(self.matmul_dtypes)}


# ----------------------------------------------------------------------------- torch.cuda stand-ins
class _Stream:
    def __init__(self, device=None, priority: int = 0, **_):
        self.device = torch.device("cuda", 0)

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        event = event if event is not None else _Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        _LANE[0].read("Stream.synchronize", None)
        _LANE[0].capture_problem("Stream.synchronize")


_DEFAULT_STREAM = _Stream()
_CURRENT = [_DEFAULT_STREAM]


class _Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.recorded = False

    def record(self, stream=None) -> None:
        self.recorded = True

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        _LANE[0].read("Event.synchronize", None)
        _LANE[0].capture_problem("Event.synchronize")

    def elapsed_time(self, end) -> float:
        return 0.0


class _Graph:
    """``torch.cuda.CUDAGraph``: a replay does nothing (the body ran once, at capture, on fakes)."""

    def __init__(self, *args, **kwargs):
        self.replays = 0

    def replay(self) -> None:
        _LANE[0].capture_problem("a replay inside a capture")
        _LANE[0].replay_steps.append(_LANE[0].step)
        self.replays += 1

    def reset(self) -> None:
        pass

    def pool(self):
        return (0, 0)


@contextlib.contextmanager
def _graph(cuda_graph, pool=None, stream=None, capture_error_mode: str = "global"):
    """``torch.cuda.graph``: the body runs once with the lane's ``capturing`` set (checks: :class:`FakeCuda`)."""
    lane = _LANE[0]
    if lane.capturing:
        raise RuntimeError("fake_cuda: a capture inside a capture")
    lane.capturing = True
    previous = _CURRENT[0]
    _CURRENT[0] = stream if stream is not None else _Stream()
    try:
        yield cuda_graph
    finally:
        lane.capturing, _CURRENT[0] = False, previous


@contextlib.contextmanager
def _stream(stream):
    previous = _CURRENT[0]
    _CURRENT[0] = stream if stream is not None else previous
    try:
        yield
    finally:
        _CURRENT[0] = previous


def _synchronize(device=None) -> None:
    _LANE[0].read("torch.cuda.synchronize", None)
    _LANE[0].capture_problem("torch.cuda.synchronize")


class _Properties:
    name, total_memory, major, minor, multi_processor_count = "fake CUDA (distnerf lane)", 80 * 2 ** 30, 9, 0, 132


_LANE: list[FakeCuda] = []


def _module_to(method):
    """``Module.to``: a module already on the (fake) device is returned as is, as ``to`` leaves a real one (torch's
    ``_apply`` would swap each FakeTensor parameter for a copy, which fails once something holds a weak reference)."""
    def to(self, *args, **kwargs):
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        tensors = [*self.parameters(), *self.buffers()]
        if device is not None and dtype is None and tensors and all(
                isinstance(t, FakeTensor) and t.device.type == device.type and t.device.index == (device.index or 0)
                for t in tensors):
            return self
        return method(self, *args, **kwargs)

    return to


def _host_copy(method, lane: FakeCuda):
    """``Tensor.tolist`` / ``Tensor.numpy``: of a fake, one host read answered by the lane (not a read per
    element); of a real tensor, the method."""
    def read(self, *args, **kwargs):
        if not isinstance(self, FakeTensor):
            return method(self, *args, **kwargs)
        value = lane.read(f"Tensor.{method.__name__}", self)
        return value if method.__name__ == "tolist" else np.asarray(value)

    return read


def install_cuda_stand_ins(lane: FakeCuda) -> None:
    """Replace ``torch.cuda``'s device calls by stand-ins that answer for one device and report to ``lane``."""
    _LANE[:] = [lane]
    cuda = torch.cuda
    patches = {
        "_lazy_init": lambda: None, "is_available": lambda: True, "is_initialized": lambda: True,
        "device_count": lambda: 1, "current_device": lambda: 0, "set_device": lambda device: None,
        "synchronize": _synchronize, "Stream": _Stream, "Event": _Event, "CUDAGraph": _Graph, "graph": _graph,
        "stream": _stream, "current_stream": lambda device=None: _CURRENT[0],
        "default_stream": lambda device=None: _DEFAULT_STREAM,
        "is_current_stream_capturing": lambda: lane.capturing,
        "get_device_name": lambda device=None: _Properties.name,
        "get_device_properties": lambda device=None: _Properties(),
        "get_device_capability": lambda device=None: (9, 0), "is_bf16_supported": lambda *a, **k: True,
        "mem_get_info": lambda device=None: (64 * 2 ** 30, 80 * 2 ** 30),
        "max_memory_allocated": lambda device=None: 0, "memory_allocated": lambda device=None: 0,
        "reset_peak_memory_stats": lambda device=None: None, "empty_cache": lambda: None,
        "get_rng_state": lambda device="cuda": torch.zeros(16, dtype=torch.uint8),
        "set_rng_state": lambda state, device="cuda": None, "manual_seed": lambda seed: None,
        "manual_seed_all": lambda seed: None,
    }
    for name, value in patches.items():
        setattr(cuda, name, value)
    torch.nn.Module.to = _module_to(torch.nn.Module.to)
    FakeTensor.tolist = _host_copy(FakeTensor.tolist, lane)  # FakeTensor has its own (one read per element)
    torch.Tensor.numpy = _host_copy(torch.Tensor.numpy, lane)
    cuda.nvtx.range_push = lambda msg: 0
    cuda.nvtx.range_pop = lambda: 0
    cuda.nvtx.range = contextlib.nullcontext


# ----------------------------------------------------------------------------- checks
def bounds(facts: dict) -> dict[str, int]:
    """How many times the counted :data:`OFTEN` may happen in a scenario of ``facts`` (its grid stages, occupancy
    refreshes, captures, evaluation chunks)."""
    graph = facts.get("graph") or {}
    return {"once per stage": facts.get("stages", 0) + facts.get("refreshes", 0),
            "once per capture": graph.get("captures", 0), "once per chunk": facts.get("chunks", 0)}


def problems(events: list[Event], limits: dict[str, int], allowed: tuple[Allowed, ...] | None = None) -> list[str]:
    """What the lane reports for one scenario's ``events``: every problem inside a capture, every host read not on
    ``allowed`` (default :data:`ALLOWED`), every documented read that happened more often than its entry allows
    (``at start`` after the first step, ``once per step`` twice in a step, the others more times than ``limits``
    says: :func:`bounds`). Empty: the scenario is clean."""
    table = {(a.site, a.op): a for a in (ALLOWED if allowed is None else allowed)}
    found, counts, per_step = [], Counter(), Counter()
    for e in events:
        where = f"{e.site} (line {e.line}{', via ' + e.via if e.via else ''}; step {e.step})"
        entry = table.get((e.site, e.op))
        if e.kind == "capture":
            found.append(f"inside a capture: {e.op} at {where}")
        elif entry is None:
            found.append(f"undocumented host read: {e.op} at {where}{' inside a capture' if e.capturing else ''}")
        elif entry.often == "at start" and e.step != -1:
            found.append(f"{e.op} at {where}: documented at start only")
        elif entry.often == "once per step":
            per_step[e.site, e.op, e.step] += 1
        elif entry.often != "at start":
            counts[e.site, e.op] += 1
    for (site, op, step), n in per_step.items():
        if n > 1:
            found.append(f"{site}: {op} {n} times in step {step}, documented once per step")
    for key, n in counts.items():
        entry = table[key]
        if n > entry.per * limits[entry.often]:
            found.append(f"{entry.site}: {entry.op} {n} times, more than {entry.per} x {entry.often} "
                         f"({limits[entry.often]})")
    return found


def allowed_table(allowed: tuple[Allowed, ...] | None = None) -> str:
    """:data:`ALLOWED` as the Markdown table of ``docs/cuda_nccl.md`` ("Host reads on the CUDA paths")."""
    rows = ["| Where | Read | How often | Why |", "|---|---|---|---|"]
    for a in (ALLOWED if allowed is None else allowed):
        rows.append(f"| `{a.site}` | `{a.op}` | {a.often} | {a.why} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # python -m tests.fake_cuda.lane: the table for docs/cuda_nccl.md
    print(allowed_table(), end="")
