"""Host-device synchronisations counted on any machine, the CPU included.

On CUDA the host runs ahead of the GPU until it needs a value or a size that only the
GPU has computed; it then waits for every queued kernel (a *host sync*). On the CPU
nothing waits, so a training step's syncs are invisible there and creep in unnoticed.
:class:`SyncCounter` is a :class:`~torch.utils._python_dispatch.TorchDispatchMode` (plus
a :class:`~torch.overrides.TorchFunctionMode` for ``Tensor.tolist`` and ``torch.tensor``) that records every
operator that *would* make the host wait on CUDA, whatever the device it runs on:

========================================  ==============================================
operator                                  why the host waits
========================================  ==============================================
``aten._local_scalar_dense``              a tensor value read into Python: ``.item()``,
                                          ``float(t)``, ``int(t)``, ``bool(t)``, ``if t:``
``Tensor.tolist``                         the values copied to Python lists (counted
                                          once; its inner copy is not counted again)
``aten.nonzero``, ``masked_select``       output size depends on the data
``aten.unique*``, ``_unique2``,           output size depends on the data
``unique_consecutive``, ``_coalesce``
``aten.index.Tensor`` (bool mask)         ``t[mask]``: a ``nonzero`` of the mask inside
``aten.index_put(_)`` (bool mask)         ``t[mask] = v`` and the backward of ``t[mask]``
``aten.repeat_interleave.Tensor``         output size ``repeats.sum()``, unless
without ``output_size``                   ``output_size=`` is given
``aten.bincount``                         the CUDA kernel reads ``input.max()`` for the
                                          number of bins, ``minlength`` or not
``aten.equal``, ``aten.allclose``,        return a Python bool
``aten.is_nonzero``
``aten.masked_fill`` (tensor value)       the CUDA kernel reads the value with ``.item()``
``aten._to_copy`` / ``aten.copy_``        device-to-host copies (never on a CPU-only
from a non-CPU device to the CPU          run, counted where they occur)
``aten._to_copy`` / ``aten.copy_``        a blocking copy (``non_blocking=False``) is
from the CPU to a device, blocking        ``cudaMemcpyAsync`` + ``cudaStreamSynchronize``
``torch.tensor`` / ``as_tensor`` /        Python data (numbers, lists, arrays) copied to
``asarray`` with ``device=``              ``device=``: a blocking host-to-device copy on
                                          CUDA (counted on the CPU too, where ``device``
                                          is the CPU: the call cannot tell);
                                          ``torch.full``/``arange`` need no copy
========================================  ==============================================

Not counted: non-blocking host-to-device copies (from pinned memory they do not wait;
from pageable memory they stall on a staging copy, undetected here), ``t.to(device)`` of
a CPU tensor on a CPU-only run (no operator runs there), non-blocking device-to-host copies
into pinned memory, reading a tensor marked by :func:`distnerf.host_buffers.host_buffer` (one such copy's host
side: waiting for the copy is an event, below), ``torch.cuda.synchronize`` and events
(deliberate, named by the profiler), collectives.

Conventions. Every occurrence is one :class:`SyncEvent`. Its ``location`` is the
innermost Python frame inside the ``distnerf`` package (``distnerf/renderer/occupancy.py:230``;
relative to the repository root), ``function`` that frame's function; ``via`` is the
innermost frame outside the package when the operator was called from elsewhere
(``torch/optim/adam.py:...``, the autograd engine: ``backward``), else ``None``. A count
on the CPU is an upper bound of the CUDA count in one way only: a ``.item()`` on a
tensor that stays on the CPU in a CUDA run (e.g. ``torch.optim.Adam``'s ``step``
counters when not ``capturable``/``fused``) is counted here but costs no sync there;
``via`` names such sites. The counter is for tests and benchmarks: it slows every
operator down (one Python call each).

Example::

    with SyncCounter() as syncs:
        out = model(rays)
    syncs.total            # int
    syncs.by_op()          # {"aten.nonzero": 2, ...}
    syncs.summary()        # JSON-ready: total, by_op, by_location, by_section, events
"""
from __future__ import annotations

import contextlib
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..host_buffers import is_host_buffer

PACKAGE = Path(__file__).resolve().parents[1]  # .../distnerf
ROOT = PACKAGE.parent
_TORCH = Path(torch.__file__).resolve().parent
#: frames of the counter itself and of torch's mode / compile plumbing: never a location
_SKIP = (str(Path(__file__).resolve()), str(_TORCH / "_dynamo"), str(_TORCH / "_compile.py"),
         str(_TORCH / "utils" / "_python_dispatch.py"), str(_TORCH / "overrides.py"))

aten = torch.ops.aten
#: operator overload packets that wait for the device whatever their arguments
ALWAYS = {aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten._unique, aten._unique2, aten.unique_dim,
          aten.unique_consecutive, aten.unique_dim_consecutive, aten._coalesce, aten.bincount, aten.equal,
          aten.allclose, aten.is_nonzero}
_BOOL_INDEX = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}
_FROM_DATA = (torch.tensor, torch.as_tensor, torch.asarray)


@dataclass
class SyncEvent:
    """One operator that makes the host wait on CUDA.

    Attributes:
        op: ``aten.nonzero``, ``Tensor.tolist``, ``aten.index (bool mask)``, ...
        location: ``path:line`` of the innermost frame inside ``distnerf`` (relative to the
            repository root), or of the innermost frame at all when none is.
        function: the function of that frame.
        via: ``path:line`` of the innermost frame when it lies outside ``distnerf`` (torch's
            own Python code, e.g. an optimizer), else None.
        device: device type of the operator's first tensor argument (``cpu``, ``cuda``), or
            the destination of ``torch.tensor(..., device=...)``.
        section: the label set by :meth:`SyncCounter.section` (``""`` outside any).
    """

    op: str
    location: str
    function: str
    via: str | None
    device: str
    section: str


def _short(filename: str) -> str:
    """A frame's file relative to torch's parent (``torch/...``) or the repository root."""
    path = Path(filename)
    for base in (_TORCH.parent, ROOT):
        try:
            return str(path.resolve().relative_to(base))
        except ValueError:
            continue
    return str(path)


def _first_tensor(args) -> torch.Tensor | None:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a
        if isinstance(a, (list, tuple)):
            t = _first_tensor(a)
            if t is not None:
                return t
    return None


def _has_bool_index(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


def _is_host_buffer(args) -> bool:
    return bool(args) and is_host_buffer(args[0])


def classify(func, args, kwargs) -> str | None:
    """The name under which ``func(*args, **kwargs)`` is counted, or None (no host sync)."""
    packet = func.overloadpacket
    if packet is aten._local_scalar_dense and _is_host_buffer(args):
        return None  # a host buffer's value (:func:`host_buffer`)
    if packet in ALWAYS:
        return f"aten.{packet.__name__}"
    if packet in _BOOL_INDEX:
        return f"aten.{packet.__name__} (bool mask)" if _has_bool_index(args[1]) else None
    if packet is aten.repeat_interleave and func is aten.repeat_interleave.Tensor:
        return None if kwargs.get("output_size") is not None else "aten.repeat_interleave (no output_size)"
    if packet in (aten.masked_fill, aten.masked_fill_) and len(args) > 2 and isinstance(args[2], torch.Tensor):
        return f"aten.{packet.__name__} (tensor value)"
    if packet is aten._to_copy:
        src, device = args[0], kwargs.get("device")
        if device is None or (torch.device(device).type == "cpu") == (src.device.type == "cpu"):
            return None
        if src.device.type != "cpu":
            return "aten._to_copy (device to host)"
        return None if kwargs.get("non_blocking", False) else "aten._to_copy (host to device, blocking)"
    if packet is aten.copy_:
        dst, src = args[0], args[1]
        if not isinstance(src, torch.Tensor) or (dst.device.type == "cpu") == (src.device.type == "cpu"):
            return None
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        if dst.device.type == "cpu":  # into pinned memory without blocking: the host does not wait
            return None if non_blocking and dst.is_pinned() else "aten.copy_ (device to host)"
        return None if non_blocking else "aten.copy_ (host to device, blocking)"
    return None


class _Dispatch(TorchDispatchMode):
    def __init__(self, counter: "SyncCounter"):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.counter._quiet:
            name = classify(func, args, kwargs)
            if name is not None:
                self.counter._record(name, _first_tensor(args))
        return func(*args, **kwargs)


class _Function(TorchFunctionMode):
    def __init__(self, counter: "SyncCounter"):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = None
        if self.counter._quiet:
            pass
        elif func is torch.Tensor.tolist:
            name = "Tensor.tolist"
        elif func in _FROM_DATA and kwargs.get("device") is not None and args and not isinstance(args[0], torch.Tensor):
            name = f"torch.{func.__name__} (host to device, blocking)"
        if name is None:
            return func(*args, **kwargs)
        device = kwargs.get("device") if name.startswith("torch.") else None
        self.counter._record(name, args[0] if args and isinstance(args[0], torch.Tensor) else None, device)
        self.counter._quiet = True  # the copy inside is the same sync
        try:
            return func(*args, **kwargs)
        finally:
            self.counter._quiet = False


class SyncCounter:
    """Context manager recording the host syncs of the code it encloses (module docstring).

    Args:
        stack: record each event's Python location (the default); False counts only.

    Attributes:
        events: list of :class:`SyncEvent`, in order.
    """

    def __init__(self, stack: bool = True):
        self.stack = stack
        self.events: list[SyncEvent] = []
        self._section = ""
        self._quiet = False
        self._modes: list = []

    def __enter__(self) -> "SyncCounter":
        self._modes = [_Function(self), _Dispatch(self)]
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        self._modes = []

    @contextlib.contextmanager
    def section(self, name: str):
        """Label the events recorded inside (e.g. ``forward``, ``backward``)."""
        previous, self._section = self._section, name
        try:
            yield self
        finally:
            self._section = previous

    def _record(self, op: str, tensor: torch.Tensor | None, device=None) -> None:
        location, function, via = "?", "?", None
        if self.stack:
            frame, innermost = sys._getframe(2), None
            while frame is not None:
                filename = frame.f_code.co_filename
                if not filename.startswith(_SKIP):
                    if innermost is None:
                        innermost = frame
                    if filename.startswith(str(PACKAGE)):
                        location, function = f"{_short(filename)}:{frame.f_lineno}", frame.f_code.co_name
                        break
                frame = frame.f_back
            if innermost is not None and not innermost.f_code.co_filename.startswith(str(PACKAGE)):
                via = f"{_short(innermost.f_code.co_filename)}:{innermost.f_lineno}"
                if location == "?":
                    location, function = via, innermost.f_code.co_name
        if device is not None:  # the destination of a copy from Python data
            device = torch.device(device).type
        else:
            device = tensor.device.type if tensor is not None else "?"
        self.events.append(SyncEvent(op, location, function, via, device, self._section))

    # ------------------------------------------------------------ results
    @property
    def total(self) -> int:
        return len(self.events)

    def by_op(self) -> dict[str, int]:
        """Count per operator name, most frequent first."""
        return dict(Counter(e.op for e in self.events).most_common())

    def by_location(self) -> dict[str, int]:
        """Count per ``"location function: op"``, most frequent first."""
        return dict(Counter(f"{e.location} {e.function}: {e.op}" for e in self.events).most_common())

    def by_section(self) -> dict[str, int]:
        """Count per :meth:`section` label, in first-seen order."""
        return dict(Counter(e.section for e in self.events))

    def summary(self) -> dict:
        """JSON-ready: ``total``, ``by_op``, ``by_location``, ``by_section`` and the ``events``."""
        return {"total": self.total, "by_op": self.by_op(), "by_location": self.by_location(),
                "by_section": self.by_section(), "events": [asdict(e) for e in self.events]}
