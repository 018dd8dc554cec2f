"""A minimal per-step phase timer (host clock; synchronises CUDA at phase edges).

The profiling layer extends it; here it answers "where did this step go" for the
phases input_wait (time the trainer waited for its ray batch), copy (host to
device), forward, backward, optimizer.
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch


class StepTimer:
    """Accumulates seconds per phase; ``pop()`` returns and clears them; ``run_totals``
    keeps the sums since construction (end-of-run summaries).

    Args:
        device: the training device; on CUDA each phase edge synchronises so that
            host timings include the GPU work of the phase.
    """

    def __init__(self, device: torch.device):
        self.sync = device.type == "cuda"
        self.totals: dict[str, float] = defaultdict(float)
        self.run_totals: dict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: str):
        if self.sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            self.totals[name] += seconds
            self.run_totals[name] += seconds

    def pop(self) -> dict[str, float]:
        out = dict(self.totals)
        self.totals.clear()
        return out
