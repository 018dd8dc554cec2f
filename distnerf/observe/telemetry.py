"""Background telemetry: accelerator (NVML) and process (psutil) samples.

NVML (``nvidia-ml-py``) is used only where it initialises and the training device
is CUDA; on CPU-only machines nothing is sampled there and nothing is raised. The
process side (CPU %, resident memory) uses psutil when it is installed.
"""
from __future__ import annotations

import logging
import os
import threading
import time

import numpy as np
import torch

log = logging.getLogger("distnerf")


def visible_device(index: int, visible: str | None) -> int | str:
    """The NVML identity of CUDA device ``index`` (torch's numbering) under
    ``CUDA_VISIBLE_DEVICES=visible``.

    CUDA numbers only the visible devices, in the order listed: with ``visible="2,3"``
    torch's ``cuda:0`` is physical (NVML) device 2. Entries are physical indices or UUIDs
    (``GPU-...``, ``MIG-...``, or a unique prefix of one); the list ends at the first
    entry that is neither (as CUDA reads it: ``"0,-1,2"`` is ``[0]``). Unset: every
    device, numbered as NVML does; this assumes ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or a
    machine whose fastest-first order is the PCI order (else prefer the UUID lookup).

    Args:
        index: torch CUDA device index (>= 0). visible: the variable's value, or None when unset.
    Returns:
        the physical index (int) or the UUID (prefix) string to look up.
    Raises:
        ValueError: ``index`` is not among the visible devices.
    """
    if visible is None:
        return index
    entries: list[int | str] = []
    for raw in visible.split(","):
        entry = raw.strip()
        if entry.isdigit():
            entries.append(int(entry))
        elif entry.startswith(("GPU-", "MIG-")) and len(entry) > 4:
            entries.append(entry)
        else:
            break  # CUDA ignores an invalid entry and everything after it
    if not 0 <= index < len(entries):
        raise ValueError(f"CUDA device {index} is not visible: CUDA_VISIBLE_DEVICES={visible!r} "
                         f"lists {len(entries)} usable device(s)")
    return entries[index]


def _handle_by_uuid(pynvml, uuid: str):
    """NVML handle of the device whose UUID is ``uuid`` or starts with it (CUDA takes prefixes)."""
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except Exception:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            full = pynvml.nvmlDeviceGetUUID(handle)
            if (full.decode() if isinstance(full, bytes) else full).startswith(uuid):
                return handle
        raise


def _nvml_handle(device: torch.device):
    """(pynvml module, handle) of ``device``, or (None, reason) when NVML is not usable.

    By the device's UUID (torch's properties) when torch reports one; else by
    :func:`visible_device` (torch's index mapped through ``CUDA_VISIBLE_DEVICES``)."""
    if device.type != "cuda":
        return None, "device is not CUDA"
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as err:  # not installed, no driver: telemetry simply has no accelerator part
        return None, f"NVML unavailable: {err}"
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        return pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
    except Exception:
        pass
    try:  # the variable belongs to the CUDA runtime of this process, read where it applies
        entry = visible_device(index, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if isinstance(entry, str):
            return pynvml, _handle_by_uuid(pynvml, entry)
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(entry)
    except Exception as err:
        return None, f"NVML has no handle for {device} (CUDA_VISIBLE_DEVICES=" \
                     f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}): {err}"


class Telemetry:
    """Samples every ``interval_s`` seconds on a daemon thread until :meth:`stop`.

    Each sample: ``t`` (s since start), ``cpu_percent`` (this process, 100 = one core),
    ``rss_mb``; with NVML also ``gpu_util`` (%), ``gpu_mem_mb``, ``sm_clock_mhz``, ``power_w``.

    Args:
        device: the training device. interval_s: seconds between samples (> 0).
    Raises:
        ValueError: ``interval_s`` not positive.
    """

    def __init__(self, device: torch.device, interval_s: float = 1.0):
        if interval_s <= 0:
            raise ValueError(f"profiler.telemetry_interval_s must be > 0, got {interval_s}")
        self.interval_s = float(interval_s)
        self.samples: list[dict] = []
        self.nvml, self.handle = _nvml_handle(device)
        self.nvml_reason = None if self.nvml is not None else self.handle
        try:
            import psutil

            self.process = psutil.Process()
            self.process.cpu_percent(None)  # first call primes the counter
        except ImportError:
            self.process = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="distnerf-telemetry", daemon=True)
        self._start = time.perf_counter()

    def start(self) -> "Telemetry":
        self._thread.start()
        return self

    def sample(self) -> dict:
        row = {"t": time.perf_counter() - self._start}
        if self.process is not None:
            row["cpu_percent"] = self.process.cpu_percent(None)
            row["rss_mb"] = self.process.memory_info().rss / 2**20
        if self.nvml is not None:
            n, h = self.nvml, self.handle
            try:
                row["gpu_util"] = n.nvmlDeviceGetUtilizationRates(h).gpu
                row["gpu_mem_mb"] = n.nvmlDeviceGetMemoryInfo(h).used / 2**20
                row["sm_clock_mhz"] = n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)
                row["power_w"] = n.nvmlDeviceGetPowerUsage(h) / 1000.0
            except Exception as err:  # a query unsupported on this board: keep the rest
                row["nvml_error"] = str(err)
        return row

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append(self.sample())

    def stop(self) -> dict:
        """Stop sampling; return ``{"samples", "summary": {key: {mean, max}}, "nvml"}``."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5 * self.interval_s + 1)
        self.samples.append(self.sample())
        summary = {}
        for key in ("cpu_percent", "rss_mb", "gpu_util", "gpu_mem_mb", "sm_clock_mhz", "power_w"):
            values = [s[key] for s in self.samples if key in s]
            if values:
                summary[key] = {"mean": float(np.mean(values)), "max": float(np.max(values))}
        return {"interval_s": self.interval_s, "nvml": self.nvml_reason or "sampled", "summary": summary,
                "samples": self.samples}
