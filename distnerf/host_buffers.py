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


# ----------------------------------------------------------------------------- fixed-size compaction
_STATIC_NONZERO: dict[str, bool] = {}  # device type -> whether torch.nonzero_static runs there


def static_nonzero_available(device: torch.device) -> bool:
    """Whether ``torch.nonzero_static`` has a kernel for ``device``'s type (a probe on a tiny
    tensor, once per process: CUDA has one, with no host sync, since torch 2.6; the CPU since 2.1)."""
    kind = device.type
    if kind not in _STATIC_NONZERO:
        try:
            torch.nonzero_static(torch.zeros(2, device=device), size=1, fill_value=0)
            _STATIC_NONZERO[kind] = True
        except (AttributeError, NotImplementedError, RuntimeError):
            _STATIC_NONZERO[kind] = False
    return _STATIC_NONZERO[kind]


def compact_nonzeros(buffer: torch.Tensor, capacity: int, static: bool | None = None,
                     fill_value: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``capacity`` non-zero positions of the flat ``buffer``, in order, padded with ``fill_value``, and
    the number of non-zeros (a 0-dim int64 tensor on the device): no data-dependent size is read.

    With ``static`` (default: :func:`static_nonzero_available`) one ``torch.nonzero_static``;
    otherwise an inclusive prefix sum of the non-zero mask gives each non-zero its slot
    (``cumsum - 1``), and a scatter writes the positions (zeros and non-zeros past the capacity
    go to a spare slot that is dropped). Both give the same tensor.

    Returns:
        ((capacity,) int64 positions, 0-dim int64 count).
    """
    n = buffer.numel()
    count = torch.count_nonzero(buffer)
    if static is None:
        static = static_nonzero_available(buffer.device)
    if static:
        return torch.nonzero_static(buffer, size=capacity, fill_value=fill_value).view(-1), count
    nonzero = buffer != 0
    slot = torch.cumsum(nonzero, 0) - 1
    slot = torch.where(nonzero & (slot < capacity), slot, capacity)
    index = torch.full((capacity + 1,), fill_value, dtype=torch.int64, device=buffer.device)
    index.scatter_(0, slot, torch.arange(n, device=buffer.device))
    return index[:capacity], count
