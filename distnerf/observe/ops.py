"""Dispatched operators counted on any machine: what a step costs the host.

On a GPU every operator a step dispatches costs the host a few microseconds of Python, dispatcher and
kernel-launch time, whatever the tensors' sizes; when a step dispatches hundreds of small operators, the
host, not the device, sets its pace (the GPU waits between kernels). :class:`OpCounter` is a
:class:`~torch.utils._python_dispatch.TorchDispatchMode` that counts every ATen operator reaching the
dispatcher below autograd (forward, the autograd engine's backward, the optimizer), on any device, the CPU
included, so the count can be held to a ceiling by a test on a machine without a GPU.

Conventions. ATen operators only (``aten.*``: not the profiler's ``record_function`` markers or other
namespaces' bookkeeping). *Views are excluded*: an operator whose schema returns an alias of an input
(``OpOverload.is_view``: ``view``, ``reshape``'s view, ``select``, ``slice``, ``expand``, ``t``,
``unsqueeze``, ``detach``, ...; and ``_unsafe_view``, a view whose schema does not say so) launches no
kernel on CUDA. Everything else counts once per call,
in-place and ``out=`` variants included (``aten.add_`` and ``aten.add`` are separate keys). Operators a
composite op decomposes into below the mode are counted as they are dispatched (what eager CUDA would
launch, up to kernels that fuse on one device and not another). Factory calls (``aten.empty``,
``aten.zeros``, ``aten.full``) count: they allocate and, but for ``empty``, fill.

Example::

    with OpCounter() as ops:
        loss = model(rays).sum(); loss.backward()
    ops.total            # int, views excluded
    ops.by_op()          # {"aten.mul.Tensor": 91, ...}, most frequent first
    ops.by_section()     # {"forward": ..., "backward": ...} with ``ops.section(name)``
"""
from __future__ import annotations

import contextlib
import sys
from collections import Counter
from pathlib import Path

from torch.utils._python_dispatch import TorchDispatchMode

PACKAGE = Path(__file__).resolve().parents[1]  # .../distnerf


#: operators that only relabel metadata although their schema declares no alias (no kernel on CUDA)
METADATA_ONLY = frozenset({"aten._unsafe_view.default"})


def is_view(func) -> bool:
    """Whether ATen operator ``func`` (an ``OpOverload``) returns a view of an input (no kernel on CUDA):
    its schema's alias annotation (``OpOverload.is_view``), or one of :data:`METADATA_ONLY`."""
    return bool(getattr(func, "is_view", False)) or str(func) in METADATA_ONLY


class _Dispatch(TorchDispatchMode):
    def __init__(self, counter: "OpCounter"):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name.startswith("aten.") and not is_view(func):
            self.counter._record(name)
        return func(*args, **(kwargs or {}))


class OpCounter:
    """Context manager counting dispatched, non-view ATen operators (see the module docstring).

    Args:
        locations: also count by the innermost frame inside the ``distnerf`` package
            (``distnerf/model/grid.py:123``; slower: one stack walk per operator).

    Attributes:
        ops: ``collections.Counter`` of ``(section, operator name)`` -> calls.
        locations: ``collections.Counter`` of location -> calls (empty unless ``locations``).
    """

    def __init__(self, locations: bool = False):
        self.ops: Counter = Counter()
        self.locations: Counter = Counter()
        self._want_locations = locations
        self._section = ""
        self._mode = _Dispatch(self)

    def __enter__(self) -> "OpCounter":
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)

    @contextlib.contextmanager
    def section(self, name: str):
        """Label the operators dispatched inside the block with ``name`` (nested: the inner name)."""
        outer, self._section = self._section, name
        try:
            yield
        finally:
            self._section = outer

    def _record(self, op: str) -> None:
        self.ops[(self._section, op)] += 1
        if self._want_locations:
            frame, where = sys._getframe(2), "outside distnerf"
            while frame is not None:
                filename = frame.f_code.co_filename
                if filename.startswith(str(PACKAGE)) and not filename.endswith("observe/ops.py"):
                    where = f"{Path(filename).relative_to(PACKAGE.parent)}:{frame.f_lineno}"
                    break
                frame = frame.f_back
            self.locations[where] += 1

    @property
    def total(self) -> int:
        """Operators dispatched (views excluded)."""
        return sum(self.ops.values())

    def by_op(self) -> dict[str, int]:
        """Operator name -> calls, most frequent first."""
        c: Counter = Counter()
        for (_, op), n in self.ops.items():
            c[op] += n
        return dict(c.most_common())

    def by_section(self) -> dict[str, int]:
        """Section name (``""`` outside any) -> operators."""
        c: Counter = Counter()
        for (sec, _), n in self.ops.items():
            c[sec] += n
        return dict(c)

    def summary(self) -> dict:
        """JSON-ready: ``total``, ``by_section``, ``by_op``."""
        out = {"total": self.total, "by_section": self.by_section(), "by_op": self.by_op()}
        if self._want_locations:
            out["by_location"] = dict(self.locations.most_common())
        return out
