"""Host tensors that stay on the host in a CUDA run, marked so the host-sync counter skips them.

A CUDA run reads some values without waiting for the device: a pinned buffer that a
non-blocking device-to-host copy filled a step earlier (:mod:`distnerf.engine.late_flag`), or a
count taken from a batch before it is copied to the device (:meth:`distnerf.sampler.base.RayBatch.to`).
On the CPU every tensor is a host tensor, so :class:`distnerf.observe.syncs.SyncCounter`, which
counts what *would* make a CUDA host wait, cannot tell these apart from device values: they carry
a mark instead.
"""
from __future__ import annotations

import torch

HOST_BUFFER = "_distnerf_host_buffer"


def host_buffer(t: torch.Tensor) -> torch.Tensor:
    """Mark ``t`` (a CPU tensor that stays on the host in a CUDA run too) so that reading it is not
    counted as a host sync. Returns ``t``.

    Raises:
        ValueError: ``t`` is not on the CPU.
    """
    if t.device.type != "cpu":
        raise ValueError(f"host_buffer: a {t.device} tensor is not a host buffer")
    setattr(t, HOST_BUFFER, True)
    return t


def is_host_buffer(t) -> bool:
    """Whether ``t`` is a tensor marked by :func:`host_buffer`."""
    return isinstance(t, torch.Tensor) and getattr(t, HOST_BUFFER, False)


# ----------------------------------------------------------------------------- sync-free paths
_SYNC_FREE_ON_CPU = [False]


def sync_free(device: torch.device | str) -> bool:
    """Whether code that has a fixed-size alternative to a data-dependent size takes it: on CUDA,
    where reading a size makes the host wait for the device, and on the CPU inside
    :func:`sync_free_paths` (tests of those paths, and the host-sync counter counting what a CUDA run
    does). On the CPU the data-dependent size is free and usually does less work."""
    return torch.device(device).type == "cuda" or _SYNC_FREE_ON_CPU[0]


class sync_free_paths:
    """Context manager: the CPU takes the sync-free paths too (:func:`sync_free`)."""

    def __init__(self, on: bool = True):
        self.on, self._before = on, None

    def __enter__(self):
        self._before, _SYNC_FREE_ON_CPU[0] = _SYNC_FREE_ON_CPU[0], self.on
        return self

    def __exit__(self, *exc):
        _SYNC_FREE_ON_CPU[0] = self._before
