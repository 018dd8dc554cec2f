"""Version shims: torch APIs chosen by what the installed torch offers (its signatures), never
by its version string; each fallback is exercised on CPU by the unit tests (``test_gpu_compat.py``)."""
from __future__ import annotations

import inspect


def accepts(fn, keyword: str) -> bool:
    """Whether callable ``fn`` takes ``keyword`` (its signature, not the torch version string:
    version-dependent APIs are chosen by what the installed torch offers)."""
    try:
        return keyword in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def ddp_buffer_kwargs(ddp_cls) -> dict:
    """DDP's keyword that turns off the buffer broadcast before every forward (the occupancy grids
    are derived identically on every rank): ``forward_sync_buffers=False`` where the installed
    torch has it (2.13), else the older ``broadcast_buffers=False`` (same effect)."""
    if accepts(ddp_cls.__init__, "forward_sync_buffers"):
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}
