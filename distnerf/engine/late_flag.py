"""A per-step device flag read one step late, so reading it never stalls the device.

The trainer's per-step agreement needs a flag only the device knows: whether the step's loss
is finite. Reading it at once (``bool(t)``) is a host sync on CUDA in the middle of every
step: the host waits for the forward pass before it can queue the backward. :class:`LateFlag`
copies the flag into a host buffer without blocking (pinned memory and ``non_blocking=True``
on CUDA; a plain copy elsewhere) and hands it out at the *next* step's agreement, when the
copy is long done: the next step's own syncs (the occupancy march's sizes) and the ordering of
one CUDA stream put it behind them. Issue 26 item 8.
"""
from __future__ import annotations

import torch

from ..host_buffers import host_buffer


class LateFlag:
    """One flag (a 0-dim tensor on the training device), handed out a step late as a host float.

    Args:
        device: the training device (CUDA: a pinned host buffer and an event per copy).

    ``swap(flag)`` returns the flag pushed by the previous call (0.0 on the first) and keeps
    ``flag`` for the next; ``take()`` returns the kept flag now (waiting for its copy: what a
    checkpoint or the end of training calls before they rely on the parameters) and clears it.
    """

    def __init__(self, device: torch.device | str):
        self.cuda = torch.device(device).type == "cuda"
        buffer = torch.zeros((), dtype=torch.float32)
        self._host = host_buffer(buffer.pin_memory() if self.cuda else buffer)
        self._event = None
        self.pending = False

    def take(self) -> float:
        """The kept flag (0.0 when none) as a host float; nothing is kept afterwards."""
        if not self.pending:
            return 0.0
        if self._event is not None:
            self._event.synchronize()  # the copy, queued a step ago, is done: returns at once
        self.pending, self._event = False, None
        return float(self._host.item())

    def swap(self, flag: torch.Tensor) -> float:
        """The previous step's flag (host float), then keep ``flag`` (this step's, not read now)."""
        previous = self.take()
        self._host.copy_(flag.detach().reshape(()), non_blocking=self.cuda)
        if self.cuda:
            self._event = torch.cuda.Event()
            self._event.record()
        self.pending = True
        return previous
